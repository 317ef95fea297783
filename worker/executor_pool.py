"""The hand-off between readers and executors, and the executors themselves (seed step 5).

Readers (and reclaim) reserve a slot in the :class:`~worker.slots.SlotPool`
for every message *before* they take it from Redis, then :meth:`ExecutorPool.hand`
it over; ``Concurrency`` executor loops take messages from the hand-off queue
and process them one at a time. An executor gives the slot back when the
message is done with (acked, or left pending for reclaim). So the hand-off
never holds more than ``Concurrency`` messages and never blocks a reader.

Shutdown (see ``worker.worker``): :meth:`drain` stops executors from starting
queued messages — those stay pending in their stream's PEL for reclaim — and
waits for the running ones to finish; what still runs after the grace period
is cancelled by the caller through ``ActiveExecutions``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from worker.slots import SlotPool
from worker.stream import StreamConsumer, StreamEntry

__all__ = ["Delivery", "ExecutorPool"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Delivery:
    """A stream entry together with the consumer it must be acked on."""

    consumer: StreamConsumer
    entry: StreamEntry
    #: True when it came from reclaim (taken over from an idle consumer).
    reclaimed: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.entry.stream, self.entry.entry_id)


class ExecutorPool:
    """``concurrency`` executor loops fed by a bounded hand-off."""

    def __init__(
        self,
        *,
        concurrency: int,
        slots: SlotPool,
        handle: Callable[[Delivery], Awaitable[None]],
    ) -> None:
        self._concurrency = concurrency
        self._slots = slots
        self._handle = handle
        self._queue: asyncio.Queue[Delivery] = asyncio.Queue(maxsize=concurrency)
        self._held: set[tuple[str, str]] = set()
        self._busy = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._draining = False
        self._closed = asyncio.Event()

    @property
    def busy(self) -> int:
        """Messages being processed now."""
        return self._busy

    def holds(self, stream: str, entry_id: str) -> bool:
        """True while this worker holds the entry (queued or being processed)."""
        return (stream, entry_id) in self._held

    def held_ids(self, stream: str) -> list[str]:
        """The entries of `stream` this worker holds now."""
        return [entry_id for held_stream, entry_id in self._held if held_stream == stream]

    def hand(self, delivery: Delivery) -> None:
        """Passes a message to the executors. The caller has reserved a slot for it.

        Never blocks: the queue has room for every slot. A message handed
        while draining is not started (it stays pending for reclaim).
        """
        self._held.add(delivery.key)
        self._queue.put_nowait(delivery)

    async def run(self) -> None:
        """Runs the executor loops until :meth:`close`."""
        async with asyncio.TaskGroup() as tg:
            loops = [tg.create_task(self._executor_loop(), name=f"executor-{i}") for i in range(self._concurrency)]
            await self._closed.wait()
            for loop in loops:
                loop.cancel()

    async def _executor_loop(self) -> None:
        while True:
            delivery = await self._queue.get()
            if self._draining:
                self._done(delivery)
                continue
            self._busy += 1
            self._idle.clear()
            try:
                await self._handle(delivery)
            except Exception:
                # A bug while processing one message must not stop this executor;
                # the message was not acked, so it stays pending for reclaim.
                logger.exception(
                    "unexpected error processing stream entry %s of %s", delivery.entry.entry_id, delivery.entry.stream
                )
            finally:
                self._busy -= 1
                if self._busy == 0:
                    self._idle.set()
                self._done(delivery)

    def _done(self, delivery: Delivery) -> None:
        self._held.discard(delivery.key)
        self._slots.release(1)

    async def drain(self, timeout_s: float) -> bool:
        """Stops starting queued messages and waits up to `timeout_s` for the running ones.

        Returns:
            True when nothing runs any more; False when the timeout passed first.
        """
        self._draining = True
        while not self._queue.empty():
            self._done(self._queue.get_nowait())
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        """Ends :meth:`run` (idle executor loops are cancelled). Idempotent."""
        self._closed.set()
