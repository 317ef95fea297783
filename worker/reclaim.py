"""Reclaiming orphaned messages, and dead-lettering poison ones (seed step 8).

When a worker dies, the messages it took stay in its PEL (the stream's
pending-entries list). Every worker runs one reclaimer per stream: every
``max(TTL/2, 10 s)`` it takes over entries idle longer than the TTL — a live
worker resets its entries' idle time on every lease renewal, so only a
stopped or cut-off worker's entries qualify — and hands them to its executors
like fresh ones. Reclaimed entries take execution slots like any other, so
reclaim too respects the ``Concurrency`` bound; when there is something to
reclaim and no slot is free, the reclaimer waits for the next free slot with
priority over new reads (see ``SlotPool``), so orphans are not starved by a
backlog.

A message delivered more than ``MaxDeliveries`` times is probably crashing
workers (an out-of-memory on a huge input, say). Instead of letting it take
the fleet down one worker at a time it is dead-lettered: reported failed with
"task exceeded max delivery attempts (N)" through the normal state machine, then
acked. If that report fails the entry stays pending for the next cycle.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Final

from protos.taskstream import InvalidTaskMessage, TaskMessage
from worker.coordinator_client import CoordinatorClient
from worker.errors import CoordinatorRejected, CoordinatorUnavailable, StreamUnavailable
from worker.executor_pool import Delivery, ExecutorPool
from worker.metrics import Outcome, WorkerMetrics
from worker.slots import SlotPool
from worker.stream import StreamConsumer, StreamEntry
from worker.tasklog import task_logger

__all__ = ["Reclaimer", "dead_letter_reason"]

logger = logging.getLogger(__name__)

#: The most entries one reclaim call claims.
MAX_BATCH: Final = 100


def dead_letter_reason(max_deliveries: int) -> str:
    """The error a dead-lettered task is failed with."""
    return f"task exceeded max delivery attempts ({max_deliveries})"


class Reclaimer:
    """The reclaim loop of one stream."""

    def __init__(
        self,
        consumer: StreamConsumer,
        *,
        slots: SlotPool,
        pool: ExecutorPool,
        coordinator: CoordinatorClient,
        metrics: WorkerMetrics,
        interval_s: float,
        min_idle_s: float,
        max_deliveries: int,
        worker_id: str,
    ) -> None:
        self._consumer = consumer
        self._slots = slots
        self._pool = pool
        self._coordinator = coordinator
        self._metrics = metrics
        self._interval_s = interval_s
        self._min_idle_ms = int(min_idle_s * 1000)
        self._max_deliveries = max_deliveries
        self._worker_id = worker_id
        self._cursor = "-"

    async def run(self, stop: asyncio.Event) -> None:
        """Reclaims every interval until `stop` is set.

        The first cycle comes after a random fraction of the interval, so the
        workers of a fleet started together do not all scan at the same moment.
        """
        delay = random.uniform(0, self._interval_s)
        while not stop.is_set():
            try:
                async with asyncio.timeout(delay):
                    await stop.wait()
                return
            except TimeoutError:
                pass
            try:
                await self.reclaim_once()
            except StreamUnavailable as exc:
                logger.warning("reclaim of %s failed: %s", self._consumer.stream, exc)
            delay = self._interval_s

    async def reclaim_once(self) -> int:
        """Runs one reclaim cycle over the stream's PEL; returns how many entries were claimed."""
        claimed = 0
        while True:
            waiting = await self._consumer.count_idle(
                min_idle_ms=self._min_idle_ms, held=self._pool.held_ids(self._consumer.stream), limit=MAX_BATCH
            )
            if waiting == 0:
                return claimed
            reserved = await self._slots.reserve(waiting, priority=True)
            if reserved == 0:
                return claimed  # the pool is closed: stopping
            handed = 0
            try:
                self._cursor, entries = await self._consumer.reclaim(
                    min_idle_ms=self._min_idle_ms,
                    count=reserved,
                    start=self._cursor,
                    held=self._pool.held_ids(self._consumer.stream),
                )
                for entry in entries:
                    if await self._take(entry):
                        handed += 1
            finally:
                self._slots.release(reserved - handed)
            claimed += len(entries)
            if entries:
                self._metrics.messages_reclaimed.inc(len(entries))
                logger.info(
                    "reclaimed %d idle pending message(s) of %s",
                    len(entries),
                    self._consumer.stream,
                    extra={"worker_id": self._worker_id},
                )
            if self._cursor == "-":  # the scan reached the end of the PEL
                return claimed

    async def _take(self, entry: StreamEntry) -> bool:
        """Deals with one claimed entry; returns True when it was handed to the executors (keeping its slot)."""
        if self._pool.holds(entry.stream, entry.entry_id):
            return False  # ours and still being processed: nothing to take over
        delivery = Delivery(self._consumer, entry, reclaimed=True)
        if entry.fields is None:
            await self._ack(entry)
            return False
        if entry.delivery_count > self._max_deliveries:
            await self._dead_letter(entry)
            return False
        self._pool.hand(delivery)
        return True

    async def _dead_letter(self, entry: StreamEntry) -> None:
        assert entry.fields is not None
        try:
            message = TaskMessage.parse(entry.fields)
        except InvalidTaskMessage as exc:
            logger.error("dead-letter: unparseable message %s of %s, discarding: %s", entry.entry_id, entry.stream, exc)
            self._metrics.outcome(Outcome.INVALID)
            await self._ack(entry)
            return
        log = task_logger(logger, message, self._worker_id)
        reason = dead_letter_reason(self._max_deliveries)
        log.error(
            "dead-lettering task: delivered %d times (max %d)",
            entry.delivery_count,
            self._max_deliveries,
            extra={"entry_id": entry.entry_id, "delivery_count": entry.delivery_count},
        )
        try:
            ack = await self._coordinator.report_dead_letter(message, delivery_count=entry.delivery_count, error=reason)
        except (CoordinatorUnavailable, CoordinatorRejected) as exc:
            log.error("could not report the dead-lettered task; will retry on a later reclaim cycle: %s", exc)
            return
        if ack.applied:
            self._metrics.dead_lettered.inc()
            self._metrics.outcome(Outcome.DEAD_LETTERED)
        else:
            # E.g. the task finished meanwhile, or another worker holds a live lease on it.
            log.info("coordinator ignored the dead-letter report: %s", ack.ignored_reason or "no reason given")
            self._metrics.outcome(Outcome.DROPPED)
        await self._ack(entry)

    async def _ack(self, entry: StreamEntry) -> None:
        try:
            await self._consumer.ack(entry.entry_id)
        except StreamUnavailable as exc:
            logger.warning("could not ack stream entry %s of %s: %s", entry.entry_id, entry.stream, exc)
