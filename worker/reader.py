"""The read loop of one stream (seed step 5, with a strict bound).

A reader alternates between two states:

1. *Waiting for work* — it blocks on ``wait_for_new`` (a plain ``XREAD`` that
   takes nothing) holding **no** execution slot, so an idle stream costs no
   capacity and a busy stream's messages are never stuck behind it.
2. *Reading* — it reserves up to all free slots (waiting for at least one),
   asks Redis for exactly that many new messages, hands each to the executors
   with its slot, and gives the unused slots back. If the read filled every
   reserved slot there may be more, so it reads again; otherwise it goes back
   to waiting.

Because slots are reserved before a read and released only when a message is
done with, the worker never holds more than ``Concurrency`` messages however
many streams it reads — the seed's reader computed free room and then read,
which lets several readers over-fetch at once.

On stop the reader leaves its wait at once; a read that was in flight is
finished and handed over (the executors decide, see ``ExecutorPool.drain``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from worker.errors import StreamUnavailable
from worker.executor_pool import Delivery, ExecutorPool
from worker.metrics import WorkerMetrics
from worker.slots import SlotPool
from worker.stream import StreamConsumer

__all__ = ["StreamReader"]

logger = logging.getLogger(__name__)

ERROR_BACKOFF_S: Final = 0.5
MAX_ERROR_BACKOFF_S: Final = 5.0


class StreamReader:
    """Reads one stream for the executors."""

    def __init__(
        self, consumer: StreamConsumer, *, slots: SlotPool, pool: ExecutorPool, metrics: WorkerMetrics
    ) -> None:
        self._consumer = consumer
        self._slots = slots
        self._pool = pool
        self._metrics = metrics

    async def run(self, stop: asyncio.Event) -> None:
        """Reads until `stop` is set; Redis errors are logged and retried with backoff."""
        backoff = ERROR_BACKOFF_S
        may_have_more = True
        while not stop.is_set():
            try:
                if not may_have_more and not await self._wait_for_new(stop):
                    return
                may_have_more = await self._read_batch()
                backoff = ERROR_BACKOFF_S
            except StreamUnavailable as exc:
                logger.warning("reading %s failed; retrying in %.1f s: %s", self._consumer.stream, backoff, exc)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(backoff):
                        await stop.wait()
                backoff = min(backoff * 2, MAX_ERROR_BACKOFF_S)
                may_have_more = True

    async def _wait_for_new(self, stop: asyncio.Event) -> bool:
        """Waits for new entries or for `stop`; returns False when stopping."""
        stopped = asyncio.ensure_future(stop.wait())
        hint = asyncio.ensure_future(self._consumer.wait_for_new())
        try:
            await asyncio.wait({stopped, hint}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Cancelling the wait is harmless: XREAD only looks, it takes nothing.
            for waiter in (stopped, hint):
                waiter.cancel()
            await asyncio.gather(stopped, hint, return_exceptions=True)
        if stop.is_set():
            return False
        if not hint.cancelled() and (exc := hint.exception()) is not None:
            raise exc
        return True

    async def _read_batch(self) -> bool:
        """Reserves slots, reads that many entries and hands them over; True when the read filled them all."""
        reserved = await self._slots.reserve(self._slots.capacity)
        if reserved == 0:
            return False  # the pool is closed: stopping
        handed = 0
        try:
            entries = await self._consumer.read_new(reserved)
            for entry in entries:
                self._pool.hand(Delivery(self._consumer, entry))
                handed += 1
        finally:
            self._slots.release(reserved - handed)
        if entries:
            self._metrics.messages_read.inc(len(entries))
        return len(entries) == reserved
