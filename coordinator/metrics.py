"""The coordinator's Prometheus metrics (served when COORDINATOR_METRICS_PORT is set)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

__all__ = ["LEASES", "OUTBOX_PUBLISHED", "REDISPATCHED", "REPORTS", "RPC_SECONDS"]

LEASES = Counter("coordinator_lease_requests_total", "Lease requests by operation and outcome", ["op", "outcome"])
REPORTS = Counter(
    "coordinator_reports_total", "Task reports by status and outcome (applied or ignored)", ["status", "outcome"]
)
OUTBOX_PUBLISHED = Counter("coordinator_outbox_published_total", "Outbox rows published to Redis Streams")
REDISPATCHED = Counter("coordinator_sweeper_redispatched_total", "Stalled tasks re-dispatched by the sweeper")
RPC_SECONDS = Histogram(
    "coordinator_rpc_seconds",
    "gRPC handler latency by method",
    ["method"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
