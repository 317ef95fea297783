"""The supervisor's exceptions.

    SupervisorError
    ├── ConfigError        an environment variable or option is invalid (exit code 3)
    ├── ChildConfigError   a child exited with code 3: its configuration is invalid,
    │                      and restarting it cannot help (exit code 3)
    ├── CrashLoop          a child exited too often within the crash-loop window (exit code 4)
    └── StartFailed        a one-shot step of `--dev` failed (embedded server, example run) (exit code 1)

A child that exits is an expected outcome (it is restarted), not an
exception; these are raised only when the node has to stop.
"""

from __future__ import annotations

__all__ = ["ChildConfigError", "ConfigError", "CrashLoop", "StartFailed", "SupervisorError"]


class SupervisorError(Exception):
    """Root of the supervisor's exceptions."""


class ConfigError(SupervisorError, ValueError):
    """A configuration value is invalid; the message names the variable."""

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable


class ChildConfigError(SupervisorError):
    """A child process reported a configuration error (exit code 3)."""


class CrashLoop(SupervisorError):
    """A child exited more often than the crash-loop limit allows."""


class StartFailed(SupervisorError):
    """Something the node needs could not be started."""
