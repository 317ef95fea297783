"""The language server's exception tree.

    LangServerError
    ├── ConfigError          a bad environment value or flag (exit code 3); also a ValueError
    ├── InvalidRequest       a request field is missing or out of bounds (INVALID_ARGUMENT)
    ├── Overloaded           no execution slot within the queue deadline (RESOURCE_EXHAUSTED)
    └── SandboxUnavailable   the fork server is down or restarting (UNAVAILABLE)
        └── SandboxStartError  the fork server could not start at all

Anything *user code* does is not an exception here: it is an
`ExecutionResult` carrying an `ExecutionError` (see `protocol`). These
exceptions are for broken requests and broken infrastructure only; the gRPC
servicer maps them to status codes in one table (`grpc_service.STATUS_CODES`).
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "InvalidRequest",
    "LangServerError",
    "Overloaded",
    "SandboxStartError",
    "SandboxUnavailable",
]


class LangServerError(Exception):
    """Root of the language server's exceptions."""


class ConfigError(LangServerError, ValueError):
    """A configuration value is invalid; `variable` names it."""

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable


class InvalidRequest(LangServerError):
    """A request field is invalid; `field` names it as in the proto."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class Overloaded(LangServerError):
    """The queue for execution slots is full or its deadline passed."""


class SandboxUnavailable(LangServerError):
    """The fork server cannot take executions right now."""


class SandboxStartError(SandboxUnavailable):
    """The fork server failed during start-up.

    `config_error` is true when the cause is the configuration (for example an
    allowlisted module that does not import), so the process exits with 3.
    """

    def __init__(self, message: str, *, config_error: bool) -> None:
        super().__init__(message)
        self.config_error = config_error
