"""The worker's exception tree.

Only broken infrastructure and programmer errors raise; a task that fails (an
HTTP 500, user code that raised, an unknown node type) is an expected outcome
and travels as an :class:`~worker.executors.ExecutionResult`, not as an
exception. ::

    WorkerError
    ├── ConfigError            bad environment/configuration; `python -m worker` exits 3
    ├── CoordinatorUnavailable the coordinator could not be reached or did not answer in
    │                          time; retryable, and never read as "lease lost"
    ├── CoordinatorRejected    the coordinator answered with an error status (a contract
    │                          mismatch, e.g. INVALID_ARGUMENT); retrying will not help
    └── StreamUnavailable      Redis could not be reached or failed a stream command

Foreign errors (``grpc.aio.AioRpcError``, ``redis.exceptions.*``,
``aiohttp.ClientError``) are translated where they arise, with
``raise ... from exc``. ``protos.taskstream.InvalidTaskMessage`` (a stream entry
that is not a task message) belongs to the shared stream contract, not here.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "CoordinatorRejected",
    "CoordinatorUnavailable",
    "StreamUnavailable",
    "WorkerError",
]


class WorkerError(Exception):
    """Root of every error the worker raises on purpose."""


class ConfigError(WorkerError, ValueError):
    """A configuration value is invalid; the message names the variable.

    Attributes:
        variable: the environment variable (or config field) at fault.
    """

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable


class CoordinatorUnavailable(WorkerError):
    """A coordinator call failed in transport (unreachable, deadline exceeded).

    The call's outcome is unknown: the coordinator may or may not have applied
    it. Callers retry idempotent calls and never treat this as a refusal.
    """


class CoordinatorRejected(WorkerError):
    """The coordinator answered a call with an error status other than a transport failure."""


class StreamUnavailable(WorkerError):
    """A Redis stream command failed (connection lost, timeout, server error)."""
