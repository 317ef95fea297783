"""One running execution, and the cause it was cancelled with.

Cancellation carries a cause. Whoever cancels records the reason first
(`Execution.cancel(CancelReason.LEASE_LOST)`), then cancels the task; the
processor afterwards branches on the recorded reason: lease lost -> discard the
result; lease expired unrenewed -> discard the result and leave the message for
reclaim; shutdown -> hand the lease back, neither report nor ack. (A timeout is
not a cancellation here: it is a failed result.)
"""

from __future__ import annotations

import asyncio
import enum

from worker.executors import ExecutionResult

__all__ = ["ActiveExecutions", "CancelReason", "Execution"]


class CancelReason(enum.Enum):
    """Why an execution was cancelled before it returned."""

    LEASE_LOST = "task lease lost"
    #: No renewal got through before the lease's TTL ran out: another worker
    #: may take the task over, so this one must stop first (self-fencing).
    LEASE_EXPIRED = "task lease expired without a renewal"
    SHUTDOWN = "worker shutting down"


class Execution:
    """Wraps the task running one executor call."""

    def __init__(self, task: asyncio.Task[ExecutionResult], *, task_id: str) -> None:
        self.task = task
        self.task_id = task_id
        self.reason: CancelReason | None = None

    def cancel(self, reason: CancelReason) -> None:
        """Records `reason` (the first one wins) and cancels the execution. Idempotent."""
        if self.reason is None:
            self.reason = reason
        self.task.cancel(reason.value)

    def outcome(self) -> ExecutionResult | CancelReason:
        """The result, or why there is none. Call once the task is done.

        A lost lease discards even a result that arrived just before the
        renewal said so: another worker owns the task now. A shutdown that
        came after the task returned keeps the result (it finished).
        """
        if self.reason in (CancelReason.LEASE_LOST, CancelReason.LEASE_EXPIRED):
            return self.reason
        if self.task.cancelled():
            if self.reason is None:
                raise asyncio.CancelledError("execution cancelled without a recorded reason")
            return self.reason
        return self.task.result()


class ActiveExecutions:
    """The executions running now, so shutdown can cancel them with a reason."""

    def __init__(self) -> None:
        self._running: set[Execution] = set()

    def __len__(self) -> int:
        return len(self._running)

    def add(self, execution: Execution) -> None:
        self._running.add(execution)

    def discard(self, execution: Execution) -> None:
        self._running.discard(execution)

    def cancel_all(self, reason: CancelReason) -> int:
        """Cancels every running execution with `reason`; returns how many."""
        running = list(self._running)
        for execution in running:
            execution.cancel(reason)
        return len(running)
