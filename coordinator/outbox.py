"""The outbox relay: publishes committed dispatches to Redis Streams.

State changes write their messages to the `outbox` table in the same
transaction; this relay moves due rows to Redis with pipelined XADDs and then
marks them published. A crash between the XADD and the commit publishes a row
twice: allowed, because the lease makes execution single-flight.

Several relays (one per coordinator replica) share the work by claiming rows
with `FOR UPDATE SKIP LOCKED`. A relay wakes on NOTIFY `wf_outbox` (sent by the
inserting transaction at commit), on a local wake-up from this process, when
the next delayed row becomes due, or at the polling interval at the latest.

It also keeps the stream side tidy: it (re)publishes the shard count for
workers, trims stream entries every consumer has acknowledged, and deletes
published rows past their retention.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import asyncpg
import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from coordinator.metrics import OUTBOX_PUBLISHED
from protos.taskstream import CONSUMER_GROUP, MESSAGE_FIELD, SHARD_COUNT_KEY

__all__ = ["OutboxRelay", "RelaySettings"]

log = logging.getLogger(__name__)

_CLAIM = """
SELECT id, stream, payload, run_id, task_id, attempt
  FROM outbox
 WHERE published_at IS NULL AND available_at <= now()
 ORDER BY available_at, id
 LIMIT $1
 FOR UPDATE SKIP LOCKED
"""
_MARK_PUBLISHED = """
UPDATE outbox o SET published_at = now(), stream_id = x.stream_id
  FROM unnest($1::bigint[], $2::text[]) AS x(id, stream_id)
 WHERE o.id = x.id
"""
# Remember where each task's current attempt was last sent, so the sweeper can
# tell a lost message from one still waiting in its stream.
_TRACK_DISPATCH = """
UPDATE task_instances t
   SET dispatch_stream = x.stream, dispatch_id = x.stream_id, dispatched_at = now()
  FROM unnest($1::uuid[], $2::uuid[], $3::int[], $4::text[], $5::text[]) AS x(run_id, task_id, attempt, stream, stream_id)
 WHERE t.run_id = x.run_id AND t.id = x.task_id AND t.attempt = x.attempt
"""
_NEXT_DUE = """
SELECT extract(epoch FROM min(available_at) - now()) FROM outbox WHERE published_at IS NULL
"""
_DELETE_OLD = """
DELETE FROM outbox WHERE id IN (
    SELECT id FROM outbox WHERE published_at < now() - make_interval(secs => $1) LIMIT 10000)
"""

_MAINTENANCE_INTERVAL_S = 10.0
_ERROR_BACKOFF_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)


@dataclass(frozen=True, kw_only=True)
class RelaySettings:
    shards: int
    batch_size: int = 500
    poll_interval_s: float = 1.0
    retention_s: float = 3600.0


class OutboxRelay:
    def __init__(
        self, *, pool: asyncpg.Pool, redis: aioredis.Redis, database_url: str, settings: RelaySettings
    ) -> None:
        self._pool = pool
        self._redis = redis
        self._database_url = database_url
        self._settings = settings
        self._wake = asyncio.Event()
        self._streams_with_group: set[str] = set()

    def wake(self) -> None:
        """Asks the relay to look for due rows now (cheap; safe to call often)."""
        self._wake.set()

    async def run(self) -> None:
        """Publishes until cancelled. Survives PostgreSQL and Redis outages by retrying."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._listen())
            tg.create_task(self._maintain())
            tg.create_task(self._publish_loop())

    async def publish_once(self) -> int:
        """Publishes one batch of due rows; returns how many."""
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(_CLAIM, self._settings.batch_size)
            if not rows:
                return 0
            await self._ensure_groups({r["stream"] for r in rows})
            pipe = self._redis.pipeline(transaction=False)
            pipe.set(SHARD_COUNT_KEY, self._settings.shards)
            for row in rows:
                pipe.xadd(row["stream"], {MESSAGE_FIELD: row["payload"]})
            results = await pipe.execute()
            stream_ids = [_text(sid) for sid in results[1:]]
            await conn.execute(_MARK_PUBLISHED, [r["id"] for r in rows], stream_ids)
            await conn.execute(
                _TRACK_DISPATCH,
                [r["run_id"] for r in rows],
                [r["task_id"] for r in rows],
                [r["attempt"] for r in rows],
                [r["stream"] for r in rows],
                stream_ids,
            )
        OUTBOX_PUBLISHED.inc(len(rows))
        return len(rows)

    async def _publish_loop(self) -> None:
        failures = 0
        while True:
            self._wake.clear()
            try:
                published = await self.publish_once()
                if published >= self._settings.batch_size:
                    continue  # more are probably due
                delay = await self._pool.fetchval(_NEXT_DUE)
                failures = 0
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, RedisError) as exc:
                pause = _ERROR_BACKOFF_S[min(failures, len(_ERROR_BACKOFF_S) - 1)]
                failures += 1
                log.warning("outbox publish failed (%s: %s); retrying in %.2fs", type(exc).__name__, exc, pause)
                await asyncio.sleep(pause)
                continue
            timeout = (
                self._settings.poll_interval_s
                if delay is None
                else min(self._settings.poll_interval_s, max(float(delay), 0.0))
            )
            if timeout <= 0:
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()

    async def _listen(self) -> None:
        """Holds a LISTEN connection, reconnecting after failures; polling covers the gaps."""
        failures = 0
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(self._database_url)
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
                await conn.add_listener("wf_outbox", lambda *_args: self._wake.set())
                failures = 0
                self._wake.set()  # anything committed while we were not listening
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(5.0):
                            await lost.wait()
                    if conn.is_closed():
                        break
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                failures += 1
                log.warning("outbox LISTEN connection failed (%s); polling until it is back", exc)
            finally:
                if conn is not None and not conn.is_closed():
                    await conn.close(timeout=1.0)
            await asyncio.sleep(_ERROR_BACKOFF_S[min(failures, len(_ERROR_BACKOFF_S) - 1)])

    async def _ensure_groups(self, streams: set[str]) -> None:
        """Creates the consumer group (from the stream's start) on streams first seen here."""
        for stream in streams - self._streams_with_group:
            try:
                await self._redis.xgroup_create(stream, CONSUMER_GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._streams_with_group.add(stream)

    async def _maintain(self) -> None:
        while True:
            try:
                await self._redis.set(SHARD_COUNT_KEY, self._settings.shards)
                await self.trim_streams()
                await self._pool.execute(_DELETE_OLD, self._settings.retention_s)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, RedisError) as exc:
                log.warning("outbox maintenance failed: %s", exc)
            await asyncio.sleep(_MAINTENANCE_INTERVAL_S)

    async def trim_streams(self) -> int:
        """Drops stream entries that every reader has acknowledged; returns entries removed.

        An entry is safe to drop when it was delivered (its id is at or below
        the group's last-delivered id) and is not pending (acknowledged): i.e.
        everything below the oldest pending entry, or below the last delivered
        one when nothing is pending.
        """
        removed = 0
        async for key in self._redis.scan_iter(match="wf:tasks:*", count=500, _type="stream"):
            stream = _text(key)
            try:
                groups = await self._redis.xinfo_groups(stream)
            except ResponseError:
                continue
            group = next((g for g in groups if _text(g["name"]) == CONSUMER_GROUP), None)
            if group is None:
                continue
            last = _text(group["last-delivered-id"])
            if last == "0-0":
                continue
            summary = await self._redis.xpending(stream, CONSUMER_GROUP)
            floor = _text(summary["min"]) if summary["pending"] else last
            removed += await self._redis.xtrim(stream, minid=floor, approximate=False)
        return removed


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
