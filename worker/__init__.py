"""The worker: reads task messages from Redis Streams, claims, executes and reports them.

Entry points: ``python -m worker`` (environment -> :class:`WorkerConfig`), and
:func:`run_worker` for a process that builds the config itself (the supervisor).
"""

from worker.config import WorkerConfig
from worker.errors import ConfigError, CoordinatorRejected, CoordinatorUnavailable, StreamUnavailable, WorkerError
from worker.worker import Worker, run_worker

__all__ = [
    "ConfigError",
    "CoordinatorRejected",
    "CoordinatorUnavailable",
    "StreamUnavailable",
    "Worker",
    "WorkerConfig",
    "WorkerError",
    "run_worker",
]
