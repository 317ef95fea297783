"""Execution slots: the one bound on how many messages a worker holds.

A worker with ``Concurrency = N`` has N slots. A reader reserves slots *before*
it reads and asks Redis for exactly that many messages; reclaim does the same;
an executor gives the slot back once the message is acked or left for reclaim.
So the messages a worker holds — read but not yet handed to an executor, queued
in the hand-off, or executing — never exceed N, however many streams it reads.

Reclaim reserves with priority: while it waits, readers do not take freed
slots, so the orphaned messages of a dead worker are run before new ones even
when every worker of the fleet is busy (otherwise they would wait until the
backlog drained, far beyond the TTL + reclaim interval the design promises).
"""

from __future__ import annotations

import asyncio

__all__ = ["SlotPool"]


class SlotPool:
    """A counter of free execution slots that readers wait on."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._free = capacity
        self._changed = asyncio.Event()
        self._closed = False
        self._priority_waiters = 0

    @property
    def free(self) -> int:
        return self._free

    @property
    def used(self) -> int:
        return self.capacity - self._free

    @property
    def closed(self) -> bool:
        return self._closed

    async def reserve(self, want: int, *, priority: bool = False) -> int:
        """Waits for at least one free slot, then takes up to `want`.

        Args:
            priority: take precedence over non-priority callers: while a
                priority caller waits, they do not get freed slots.

        Returns:
            How many slots were taken, or 0 once the pool is closed (the worker
            is stopping). Cancel-safe: nothing is taken until it returns.
        """
        if priority:
            self._priority_waiters += 1
        try:
            while not self._closed:
                if self._free > 0 and (priority or self._priority_waiters == 0):
                    return self.try_reserve(want)
                self._changed.clear()
                await self._changed.wait()
            return 0
        finally:
            if priority:
                self._priority_waiters -= 1
                self._changed.set()  # readers that deferred to this caller look again

    def try_reserve(self, want: int) -> int:
        """Takes up to `want` free slots without waiting; 0 when none is free or the pool is closed."""
        if self._closed:
            return 0
        taken = min(self._free, max(want, 0))
        self._free -= taken
        return taken

    def release(self, count: int = 1) -> None:
        """Gives `count` slots back and wakes waiting readers."""
        if count <= 0:
            return
        if self._free + count > self.capacity:
            raise RuntimeError(f"released more slots than reserved ({self._free} + {count} > {self.capacity})")
        self._free += count
        self._changed.set()

    def close(self) -> None:
        """Stops handing out slots (waiters get 0). Idempotent; releases still count."""
        self._closed = True
        self._changed.set()
