"""Intake: a reader and a reclaimer for every shard stream of every queue the worker serves.

The shard count is discovered from Redis (``wf:shards``, written by the
coordinator at start and on every relay cycle). Intake waits for it at start,
then re-reads it every ``SHARD_RECHECK_S``: when an operator restarts the
coordinator with more shards, the worker starts reading the new streams
without a restart. When the count goes down it keeps reading the streams it
has (the coordinator moves waiting dispatches off removed shards, and the
worker's pending entries there still get reclaimed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

import redis.asyncio as aioredis
import redis.exceptions

from protos.taskstream import SHARD_COUNT_KEY, queue_streams
from worker.config import WorkerConfig
from worker.coordinator_client import CoordinatorClient
from worker.errors import StreamUnavailable
from worker.executor_pool import ExecutorPool
from worker.metrics import WorkerMetrics
from worker.reader import StreamReader
from worker.reclaim import Reclaimer
from worker.slots import SlotPool
from worker.stream import StreamConsumer, StreamScripts

__all__ = ["Intake"]

logger = logging.getLogger(__name__)

SHARD_POLL_S: Final = 1.0
SHARD_RECHECK_S: Final = 10.0
SHARD_LOG_EVERY_S: Final = 30.0


class Intake:
    """Owns the per-stream loops; :meth:`run` returns once they all stopped."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        redis_client: aioredis.Redis,
        scripts: StreamScripts,
        slots: SlotPool,
        pool: ExecutorPool,
        coordinator: CoordinatorClient,
        metrics: WorkerMetrics,
    ) -> None:
        self._config = config
        self._redis = redis_client
        self._scripts = scripts
        self._slots = slots
        self._pool = pool
        self._coordinator = coordinator
        self._metrics = metrics
        self._streams: list[str] = []

    @property
    def streams(self) -> tuple[str, ...]:
        """The streams being read (empty until the shard count is known)."""
        return tuple(self._streams)

    async def run(self, stop: asyncio.Event) -> None:
        """Reads until `stop` is set; returns when every reader and reclaimer has stopped."""
        shards = await self._wait_for_shards(stop)
        if shards is None:
            return
        async with asyncio.TaskGroup() as tg:
            await self._serve(tg, stop, shards)
            while not await _wait(stop, SHARD_RECHECK_S):
                latest = await self._read_shards()
                if isinstance(latest, int) and latest > shards:
                    logger.info("shard count raised from %d to %d", shards, latest, extra=self._log_fields())
                    await self._serve(tg, stop, latest)
                    shards = latest
                elif isinstance(latest, int) and latest < shards:
                    logger.info(
                        "shard count lowered to %d; still reading the %d shard(s) already served",
                        latest,
                        shards,
                        extra=self._log_fields(),
                    )

    async def _serve(self, tg: asyncio.TaskGroup, stop: asyncio.Event, shards: int) -> None:
        """Starts a reader and a reclaimer for each stream of `shards` not read yet."""
        config = self._config
        new = [s for s in queue_streams(list(config.served_queues), shards) if s not in self._streams]
        for name in new:
            consumer = StreamConsumer(self._redis, self._scripts, name, consumer=config.worker_id)
            with contextlib.suppress(StreamUnavailable):  # the reader re-creates the group on NOGROUP
                await consumer.ensure_group()
            reader = StreamReader(consumer, slots=self._slots, pool=self._pool, metrics=self._metrics)
            reclaimer = Reclaimer(
                consumer,
                slots=self._slots,
                pool=self._pool,
                coordinator=self._coordinator,
                metrics=self._metrics,
                interval_s=config.reclaim_interval_s,
                min_idle_s=config.reclaim_min_idle_s,
                max_deliveries=config.max_deliveries,
                worker_id=config.worker_id,
            )
            tg.create_task(reader.run(stop), name=f"read {name}")
            tg.create_task(reclaimer.run(stop), name=f"reclaim {name}")
            self._streams.append(name)
        logger.info(
            "reading %d stream(s)",
            len(self._streams),
            extra={**self._log_fields(), "streams": self._streams, "shards": shards},
        )

    async def _read_shards(self) -> int | str:
        """The published shard count, or why there is none."""
        try:
            raw = await self._redis.get(SHARD_COUNT_KEY)
        except redis.exceptions.RedisError as exc:
            return f"redis unavailable: {exc}"
        if raw is None:
            return f"{SHARD_COUNT_KEY!r} not set yet (has the coordinator started?)"
        try:
            shards = int(raw)
        except ValueError:
            shards = 0
        if shards < 1:
            return f"{SHARD_COUNT_KEY!r} holds {raw!r}, not a positive integer"
        return shards

    async def _wait_for_shards(self, stop: asyncio.Event) -> int | None:
        """Waits until the coordinator has published the shard count; None if stopped first."""
        loop = asyncio.get_running_loop()
        last_log = -SHARD_LOG_EVERY_S
        while True:
            found = await self._read_shards()
            if isinstance(found, int):
                return found
            if loop.time() - last_log >= SHARD_LOG_EVERY_S:
                logger.warning("waiting for the shard count: %s", found, extra=self._log_fields())
                last_log = loop.time()
            if await _wait(stop, SHARD_POLL_S):
                return None

    def _log_fields(self) -> dict[str, str]:
        return {"worker_id": self._config.worker_id}


async def _wait(stop: asyncio.Event, timeout_s: float) -> bool:
    """Waits up to `timeout_s` for `stop`; returns whether it is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await stop.wait()
    return stop.is_set()
