"""Prometheus metrics of one worker, on a registry of its own.

A registry per worker (rather than the process-global default) lets tests run
several workers in one process and read each one's counters.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["Outcome", "WorkerMetrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)


class Outcome(enum.Enum):
    """What became of one delivered message (the ``outcome`` label of worker_tasks_total)."""

    #: Reported completed and acked.
    COMPLETED = "completed"
    #: Reported failed (executor failure, timeout, output too large) and acked.
    FAILED = "failed"
    #: Lease not acquired (running elsewhere, finished, stale attempt): dropped and acked.
    DROPPED = "dropped"
    #: The renewal said the lease is lost: result discarded.
    LEASE_LOST = "lease_lost"
    #: Cancelled by shutdown after the grace period: lease released, no report.
    INTERRUPTED = "interrupted"
    #: Not a task message: acked and discarded.
    INVALID = "invalid"
    #: Delivered more than MaxDeliveries times: reported failed and acked.
    DEAD_LETTERED = "dead_lettered"
    #: The coordinator could not be reached to acquire or report: left pending for reclaim.
    COORDINATOR_ERROR = "coordinator_error"


class WorkerMetrics:
    """The worker's counters, gauges and histograms (names start with ``worker_``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.slots_used = Gauge("worker_slots_used", "Execution slots holding a message", registry=r)
        self.slots_available = Gauge("worker_slots_available", "Free execution slots", registry=r)
        self.tasks = Counter("worker_tasks", "Delivered messages by outcome", ["outcome"], registry=r)
        for outcome in Outcome:
            self.tasks.labels(outcome.value)
        self.schedule_to_start = Histogram(
            "worker_schedule_to_start_seconds",
            "From publish to the stream until execution starts",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.execution = Histogram(
            "worker_task_execution_seconds",
            "Executor time per task",
            ["node_type", "result"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.end_to_end = Histogram(
            "worker_task_end_to_end_seconds",
            "From publish to the stream until the coordinator acknowledged the report",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.leases_lost = Counter("worker_leases_lost", "Executions abandoned because the lease was lost", registry=r)
        self.messages_read = Counter("worker_messages_read", "Messages read from the streams", registry=r)
        self.messages_reclaimed = Counter(
            "worker_messages_reclaimed", "Idle pending messages taken over from other consumers", registry=r
        )
        self.dead_lettered = Counter(
            "worker_dead_lettered", "Messages dead-lettered after MaxDeliveries deliveries", registry=r
        )
        self.renewals = Counter("worker_lease_renewals", "Leases renewed", registry=r)
        self.renewal_errors = Counter(
            "worker_lease_renewal_errors", "Renewal calls that failed in transport (retried)", registry=r
        )
        self.loop_lag = Gauge("worker_event_loop_lag_seconds", "Lateness of the event loop heartbeat", registry=r)
        self.stalled = Gauge("worker_stalled", "1 when the progress watchdog flags the worker", registry=r)
        self.ready = Gauge(
            "worker_ready", "1 when the coordinator, Redis and language servers are reachable", registry=r
        )

    def track_slots(self, used: Callable[[], int], free: Callable[[], int]) -> None:
        """Makes the slot gauges read the pool at scrape time."""
        self.slots_used.set_function(lambda: float(used()))
        self.slots_available.set_function(lambda: float(free()))

    def outcome(self, outcome: Outcome) -> None:
        self.tasks.labels(outcome.value).inc()

    def count(self, outcome: Outcome) -> float:
        """The current value of one outcome counter (for tests and the benchmark)."""
        return self.sample("worker_tasks_total", outcome=outcome.value)

    def sample(self, name: str, **labels: str) -> float:
        """The current value of one sample by its exposition name (0 when absent)."""
        return self.registry.get_sample_value(name, labels) or 0.0

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
