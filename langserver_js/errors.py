"""The exceptions of the JavaScript language server.

What user code does is never an exception here: it is an `ExecutionResult` with a
status (see `langserver_js.protocol`). These are for bad requests, bad configuration
and broken infrastructure::

    LangServerJsError
    ├── ConfigError            an environment variable is invalid (exit code 3)
    ├── InvalidRequest         a request field is invalid (gRPC INVALID_ARGUMENT)
    ├── PoolClosed             the server is shutting down (gRPC UNAVAILABLE)
    ├── PoolStartError         sandbox processes could not be started at boot
    ├── BindError              the listen address could not be bound
    └── WorkerError            one sandbox process misbehaved (the pool replaces it)
        ├── WorkerDied         it exited or closed its pipes
        ├── WorkerUnresponsive it did not report ready in time
        └── ProtocolError      it sent a frame that is too large or malformed
"""

from __future__ import annotations

__all__ = [
    "BindError",
    "ConfigError",
    "InvalidRequest",
    "LangServerJsError",
    "PoolClosed",
    "PoolStartError",
    "ProtocolError",
    "WorkerDied",
    "WorkerError",
    "WorkerUnresponsive",
]


class LangServerJsError(Exception):
    """Root of this package's exceptions."""


class ConfigError(LangServerJsError):
    """An environment variable has an invalid value."""

    def __init__(self, variable: str, reason: str) -> None:
        super().__init__(f"{variable}: {reason}")
        self.variable = variable
        self.reason = reason


class InvalidRequest(LangServerJsError):
    """A request field is invalid; `field` is its path in the request message."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class PoolClosed(LangServerJsError):
    """The worker pool is stopping or stopped and takes no more executions."""


class PoolStartError(LangServerJsError):
    """The first sandbox processes could not be started."""


class BindError(LangServerJsError):
    """The gRPC server could not listen on the configured address."""


class WorkerError(LangServerJsError):
    """A sandbox process failed; the pool kills and replaces it."""


class WorkerDied(WorkerError):
    """The sandbox process exited or closed its pipes."""


class WorkerUnresponsive(WorkerError):
    """The sandbox process did not answer within its deadline."""


class ProtocolError(WorkerError):
    """The sandbox process sent a frame that is oversized or not a valid message."""
