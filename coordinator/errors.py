"""The coordinator's exceptions.

    CoordinatorError
    ├── InvalidRequest        a request field is missing or malformed (→ INVALID_ARGUMENT)
    ├── InvalidDefinition     a workflow definition does not validate (→ INVALID_ARGUMENT)
    ├── NotFound              a workflow, version or run does not exist (→ NOT_FOUND)
    ├── ConfigError           an environment variable is invalid (→ exit code 3)
    └── StartupError          PostgreSQL or Redis stayed unreachable at start (→ exit code 1)

Expected outcomes (a lease not acquired, a stale report ignored) are return
values, not exceptions.
"""

from __future__ import annotations

__all__ = ["ConfigError", "CoordinatorError", "InvalidDefinition", "InvalidRequest", "NotFound", "StartupError"]


class CoordinatorError(Exception):
    """Root of the coordinator's exceptions."""


class InvalidRequest(CoordinatorError):
    """A request field is missing or malformed; the message names the field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class InvalidDefinition(CoordinatorError):
    """A workflow definition does not validate; names the node (if any) and field."""

    def __init__(self, problem: str, *, node: str | None = None, field: str | None = None) -> None:
        where = " ".join(
            part for part in (f"node {node!r}" if node else "", f"field {field!r}" if field else "") if part
        )
        super().__init__(f"{where}: {problem}" if where else problem)
        self.node = node
        self.field = field


class NotFound(CoordinatorError):
    """The workflow, version or run named in a request does not exist."""


class ConfigError(CoordinatorError):
    """An environment variable has an invalid value; the message names it."""


class StartupError(CoordinatorError):
    """A backing service stayed unreachable while starting; the message names it."""
