"""The supervisor's Prometheus metrics (served when SUPERVISOR_METRICS_PORT is set)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

__all__ = ["CHILD_CPU", "CHILD_RSS", "CHILD_RUNNING", "CHILD_STARTS"]

CHILD_RSS = Gauge("supervisor_child_rss_bytes", "Resident memory of a child's process tree", ["process"])
CHILD_CPU = Gauge("supervisor_child_cpu_percent", "CPU of a child's process tree (100 = one core)", ["process"])
CHILD_RUNNING = Gauge("supervisor_child_running", "1 while the child runs", ["process"])
CHILD_STARTS = Counter(
    "supervisor_child_restarts",
    "Child restarts by reason (exited, memory, unhealthy, not_ready)",
    ["process", "reason"],
)
