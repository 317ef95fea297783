"""The executor contract: what every way of running a task (HTTP, a language server) provides.

An executor turns a task's input into an :class:`ExecutionResult`. A task that
fails — an HTTP 500, user code that raised, a bad node configuration — is an
*expected* outcome and comes back as ``ExecutionResult.failed(...)`` with a
message for the operator; executors raise only for programmer errors, and they
let ``asyncio.CancelledError`` through (a cancelled task is the caller's
business: lease lost, shutdown or timeout).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["ExecutionResult", "Executor", "TaskContext"]


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What an executor may know about the task it runs.

    ``task_id`` is the task instance id: the same across every attempt and
    every redelivery of a task, which makes it the idempotency key handed to
    the outside world (HTTP ``Idempotency-Key``).
    """

    task_id: str
    run_id: str
    node_id: str
    attempt: int
    #: The node's own timeout (or the 90 s default).
    timeout_s: float
    #: `time.monotonic()` by which the execution must end.
    deadline: float

    def remaining_s(self) -> float:
        """Seconds left before the deadline (never negative)."""
        return max(0.0, self.deadline - time.monotonic())


@dataclass(frozen=True, slots=True)
class ExecutionResult:
    """The outcome of one execution: JSON output bytes, or an error message."""

    output: bytes | None
    error: str | None

    @classmethod
    def ok(cls, output: bytes) -> ExecutionResult:
        """A successful execution; `output` is a JSON document."""
        return cls(output=output, error=None)

    @classmethod
    def failed(cls, error: str) -> ExecutionResult:
        """A failed execution; `error` says why, for the run's operator."""
        return cls(output=None, error=error)

    @property
    def succeeded(self) -> bool:
        return self.error is None


class Executor(Protocol):
    """Runs tasks of one node type."""

    @property
    def node_type(self) -> str:
        """The node type this executor serves (e.g. "http")."""
        ...

    async def execute(self, task: TaskContext, task_input: Any) -> ExecutionResult:
        """Runs one task with its already-resolved input.

        Returns:
            The outcome; a failed task is a result, not an exception.

        Cancel-safe: cancellation aborts the work (closing connections) and
        propagates ``CancelledError``.
        """
        ...
