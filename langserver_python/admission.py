"""Admission: at most N executions at once, a bounded queue, a deadline to wait.

A request either gets one of `limit` slots, or waits in a queue of at most
`max_queue` requests for at most `queue_timeout_s`; past either bound it is
refused with `Overloaded` (gRPC `RESOURCE_EXHAUSTED`), which a worker treats as
"try again later" rather than as a failure of the user's code.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from langserver_python.errors import Overloaded

__all__ = ["Admission"]


class Admission:
    """A semaphore with a bounded, deadlined queue.

    Args:
        limit: executions admitted at once.
        max_queue: requests allowed to wait for a slot.
        queue_timeout_s: longest wait for a slot.
    """

    def __init__(self, *, limit: int, max_queue: int, queue_timeout_s: float) -> None:
        self._slots = asyncio.Semaphore(limit)
        self._limit = limit
        self._max_queue = max_queue
        self._queue_timeout_s = queue_timeout_s
        self._waiting = 0
        self._running = 0

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return self._waiting

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Holds one slot for the body of the `async with`.

        Raises:
            Overloaded: the queue is full, or no slot freed within the deadline.

        Safe to cancel: a cancelled waiter leaves the queue and holds nothing.
        """
        if self._slots.locked() and self._waiting >= self._max_queue:
            raise Overloaded(f"{self._waiting} requests already wait for one of {self._limit} execution slots")
        self._waiting += 1
        try:
            async with asyncio.timeout(self._queue_timeout_s):
                await self._slots.acquire()
        except TimeoutError:
            raise Overloaded(f"no execution slot freed within {self._queue_timeout_s:g} s") from None
        finally:
            self._waiting -= 1
        self._running += 1
        try:
            yield
        finally:
            self._running -= 1
            self._slots.release()
