"""The sweeper: makes "nothing gets stuck" true when a message is lost.

Workers recover each other's orphaned messages (XAUTOCLAIM), but that needs
the message. If Redis lost it (restarted without its AOF, flushed) or it was
acknowledged without a report, a non-terminal task would wait forever. The
sweeper finds tasks with no progress for `stall_after` — QUEUED since then, or
RUNNING under a lease expired that long ago — and asks Redis whether the
current attempt's message still exists and is unacknowledged. If it does not,
and no dispatch is waiting in the outbox, the task's current attempt is
dispatched again (the lease makes a duplicate harmless).

Bound: a task whose message is lost is re-dispatched within
`stall_after + sweep_interval` of its last progress (lease expiry for a task
that was running).

The candidate scan is the one statement that does not name a run: it reads
the partial indexes on stalled states across all partitions, in batches, and
stamps `swept_at` so a large backlog of healthy queued tasks is checked once
per `stall_after`, not on every sweep.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from coordinator.metrics import REDISPATCHED
from coordinator.runs import RunEngine
from protos.taskstream import CONSUMER_GROUP

__all__ = ["Sweeper"]

log = logging.getLogger(__name__)

_CANDIDATES = """
SELECT t.run_id, t.id, t.attempt, t.state, t.dispatch_stream, t.dispatch_id, r.workflow, r.version,
       EXISTS (SELECT 1 FROM outbox o
                WHERE o.run_id = t.run_id AND o.task_id = t.id AND o.attempt = t.attempt
                  AND o.published_at IS NULL) AS awaiting_relay
  FROM task_instances t JOIN runs r ON r.id = t.run_id
 WHERE ((t.state = 'QUEUED' AND t.updated_at < now() - make_interval(secs => $1))
        OR (t.state = 'RUNNING' AND t.lease_expires_at < now() - make_interval(secs => $1)))
   AND (t.swept_at IS NULL OR t.swept_at < now() - make_interval(secs => $1))
 ORDER BY t.swept_at NULLS FIRST
 LIMIT $2
"""
_MARK_SWEPT = """
UPDATE task_instances t SET swept_at = now()
  FROM unnest($1::uuid[], $2::uuid[]) AS x(run_id, id)
 WHERE t.run_id = x.run_id AND t.id = x.id
"""
_BATCH = 500


class Sweeper:
    def __init__(
        self,
        *,
        pool: asyncpg.Pool,
        redis: aioredis.Redis,
        engine: RunEngine,
        interval_s: float,
        stall_after_s: float,
        shards: int,
    ) -> None:
        self._shards = shards
        self._pool = pool
        self._redis = redis
        self._engine = engine
        self._interval_s = interval_s
        self._stall_after_s = stall_after_s

    async def run(self) -> None:
        """Sweeps every interval until cancelled; failures are logged and retried next time."""
        while True:
            try:
                await self.sweep_once()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, RedisError) as exc:
                log.warning("sweep failed: %s", exc)
            await asyncio.sleep(self._interval_s)

    async def sweep_once(self) -> int:
        """Checks one batch of stalled candidates; returns how many were re-dispatched."""
        rows = await self._pool.fetch(_CANDIDATES, self._stall_after_s, _BATCH)
        healthy: list[asyncpg.Record] = []
        redispatched = 0
        for row in rows:
            if row["awaiting_relay"] or (
                row["dispatch_id"]
                and self._shard_served(row["dispatch_stream"])
                and await self._message_alive(row["dispatch_stream"], row["dispatch_id"])
            ):
                healthy.append(row)
                continue
            if await self._engine.redispatch(row["run_id"], row["id"], row["attempt"], row["workflow"], row["version"]):
                redispatched += 1
                log.warning(
                    "re-dispatched a stalled task whose message is gone",
                    extra={
                        "run_id": str(row["run_id"]),
                        "task_id": str(row["id"]),
                        "attempt": row["attempt"],
                        "state": row["state"],
                    },
                )
        if healthy:
            await self._pool.execute(_MARK_SWEPT, [r["run_id"] for r in healthy], [r["id"] for r in healthy])
        REDISPATCHED.inc(redispatched)
        return redispatched

    def _shard_served(self, stream: str) -> bool:
        """False for a stream of a shard beyond STREAM_SHARDS (the count was lowered): workers no longer read it."""
        shard = stream.rpartition(":")[2]
        return shard.isdigit() and int(shard) < self._shards

    async def _message_alive(self, stream: str, entry_id: str) -> bool:
        """True while the entry exists and is not acknowledged (pending, or not yet delivered)."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.xrange(stream, min=entry_id, max=entry_id, count=1)
        pipe.xpending_range(stream, CONSUMER_GROUP, min=entry_id, max=entry_id, count=1)
        pipe.xinfo_groups(stream)
        exists, pending, groups = await pipe.execute(raise_on_error=False)
        if isinstance(exists, ResponseError) or not exists:
            return False
        if not isinstance(pending, ResponseError) and pending:
            return True
        if isinstance(groups, ResponseError):
            return True  # no group yet: nobody has read it, so it is still waiting
        group = next((g for g in groups if _text(g["name"]) == CONSUMER_GROUP), None)
        if group is None:
            return True
        return _entry_key(entry_id) > _entry_key(_text(group["last-delivered-id"]))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _entry_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
