"""Execution slots: the one bound on how many messages a worker holds.

A worker with ``Concurrency = N`` has N slots. A reader reserves slots *before*
it reads and asks Redis for exactly that many messages; reclaim does the same;
an executor gives the slot back once the message is acked or left for reclaim.
So the messages a worker holds — read but not yet handed to an executor, queued
in the hand-off, or executing — never exceed N, however many streams it reads.
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

    @property
    def free(self) -> int:
        return self._free

    @property
    def used(self) -> int:
        return self.capacity - self._free

    @property
    def closed(self) -> bool:
        return self._closed

    async def reserve(self, want: int) -> int:
        """Waits for at least one free slot, then takes up to `want`.

        Returns:
            How many slots were taken, or 0 once the pool is closed (the worker
            is stopping). Cancel-safe: nothing is taken until it returns.
        """
        while not self._closed:
            if self._free > 0:
                return self.try_reserve(want)
            self._changed.clear()
            await self._changed.wait()
        return 0

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
