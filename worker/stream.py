"""The Redis side of the worker: one consumer of the workers' group on one stream.

Every stream command the worker issues lives here, so the delivery rules can be
read in one place:

* ``read_new(count)`` — ``XREADGROUP ... COUNT count`` without ``BLOCK``: the
  caller has already reserved ``count`` execution slots, so a read never takes
  more messages than the worker can run.
* ``wait_for_new(timeout)`` — waits for undelivered entries *without* taking
  them (plain ``XREAD BLOCK`` from the group's last-delivered id), so a reader
  waiting on an idle stream holds no execution slot.
* ``touch(id)`` — resets a pending entry's idle time if this consumer still owns
  it (``XCLAIM ... JUSTID``), called on every lease renewal, so a task running
  longer than the TTL is not reclaimed while it runs.
* ``reclaim(...)`` — takes over entries idle longer than the TTL, with their
  delivery counts (see ``_RECLAIM_LUA`` for why this is a script and not
  ``XAUTOCLAIM``).
* NOGROUP (after a ``FLUSHALL``, or before the coordinator's first publish):
  the group is re-created with id ``0`` and the command retried once.

Entries are read as bytes (``decode_responses=False``) so that a malformed
entry is a parse error on one message, never a decoding failure of a whole read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import redis.asyncio as aioredis
import redis.exceptions

from protos.taskstream import CONSUMER_GROUP
from worker.errors import StreamUnavailable

__all__ = ["StreamConsumer", "StreamEntry", "StreamScripts", "connect_redis"]

T = TypeVar("T")

#: Socket timeout of Redis commands; must exceed WAIT_BLOCK_MS.
REDIS_SOCKET_TIMEOUT_S: Final = 15.0
REDIS_CONNECT_TIMEOUT_S: Final = 5.0

# The Lua scripts run atomically, so the ownership check and the claim cannot
# be separated by another worker's command.

_TOUCH_LUA: Final = """
-- KEYS[1]: the stream
-- ARGV[1]: consumer group; ARGV[2]: this consumer; ARGV[3]: entry id
-- Resets the entry's idle time (without counting a delivery) if this consumer
-- still owns it. Returns 1 when it did, 0 when the entry is not ours (acked,
-- or claimed by another worker meanwhile): we must not steal it back.
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then
  return 0
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
return 1
"""

_ACK_IF_OWNED_LUA: Final = """
-- KEYS[1]: the stream
-- ARGV[1]: consumer group; ARGV[2]: this consumer; ARGV[3]: entry id
-- Acks the entry only if this consumer owns it. XACK ignores the consumer, so
-- a worker that lost its lease could otherwise ack the entry another worker
-- reclaimed and is running: a crash there would leave no message to reclaim.
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then
  return 0
end
return redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
"""

_RECLAIM_LUA: Final = """
-- KEYS[1]: the stream
-- ARGV[1]: consumer group; ARGV[2]: this consumer; ARGV[3]: min idle time (ms);
-- ARGV[4]: where the PEL scan starts ('-' or '(<id>'); ARGV[5]: max entries;
-- ARGV[6..]: ids this consumer is processing right now, left untouched.
-- Returns {next_start, {{id, delivery_count, fields or 0}, ...}}.
--
-- This is XAUTOCLAIM spelled out as XPENDING + XCLAIM, because XAUTOCLAIM
-- returns no delivery counts and, before Redis 7, replies nil for an entry
-- deleted from the stream without saying which id it was (so it could never be
-- acked). XCLAIM counts the delivery, like XAUTOCLAIM does.
--
-- Held ids are skipped because claiming resets the idle time: a worker cut off
-- from the coordinator would otherwise keep its own message from ever going
-- idle, and nobody could take its task over once the lease expired.
local held = {}
for i = 6, #ARGV do
  held[ARGV[i]] = true
end
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[3], ARGV[4], '+', ARGV[5])
local out = {}
local last = nil
for _, p in ipairs(pending) do
  last = p[1]
  if not (held[p[1]] and p[2] == ARGV[2]) then
    local claimed = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], p[1])
    local entry = claimed[1]
    if entry then
      table.insert(out, {p[1], p[4] + 1, entry[2]})
    else
      -- Deleted from the stream (Redis 6 replies nil; Redis 7 drops the PEL entry).
      table.insert(out, {p[1], p[4] + 1, 0})
    end
  end
end
local next_start = '-'
if last and #pending == tonumber(ARGV[5]) then
  next_start = '(' .. last
end
return {next_start, out}
"""

#: How long one wait_for_new blocks before the reader re-checks (also bounds
#: how late a missed wake-up could be noticed).
WAIT_BLOCK_MS: Final = 5000


def connect_redis(url: str) -> aioredis.Redis:
    """Returns a pooled client for `url`, reading replies as bytes."""
    client: aioredis.Redis = aioredis.Redis.from_url(
        url,
        decode_responses=False,
        socket_timeout=REDIS_SOCKET_TIMEOUT_S,
        socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S,
        health_check_interval=30,
    )
    return client


class StreamScripts:
    """The worker's Lua scripts, registered once per Redis client."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.touch = client.register_script(_TOUCH_LUA)
        self.ack_if_owned = client.register_script(_ACK_IF_OWNED_LUA)
        self.reclaim = client.register_script(_RECLAIM_LUA)


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """One stream entry delivered to this worker."""

    stream: str
    entry_id: str
    #: The entry's fields; None when the entry was deleted from the stream
    #: while pending (only reclaim can see that).
    fields: Mapping[bytes, bytes] | None
    #: How many times the group delivered it (1 for a first read).
    delivery_count: int

    @property
    def published_at(self) -> float:
        """When the coordinator published it (epoch seconds, from the id's Redis-clock milliseconds)."""
        return int(self.entry_id.split("-", 1)[0]) / 1000.0


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _pairs(raw: Any) -> dict[bytes, bytes]:
    items = list(raw)
    return {items[i]: items[i + 1] for i in range(0, len(items) - 1, 2)}


def _is_nogroup(exc: redis.exceptions.ResponseError) -> bool:
    # The first word of a Redis error reply is its error code.
    return str(exc).startswith("NOGROUP")


class StreamConsumer:
    """This worker (consumer ``consumer``) in the workers' group on one stream.

    Every method raises :class:`StreamUnavailable` when Redis fails.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        scripts: StreamScripts,
        stream: str,
        *,
        consumer: str,
        group: str = CONSUMER_GROUP,
    ) -> None:
        self._redis = client
        self._scripts = scripts
        self.stream = stream
        self.consumer = consumer
        self.group = group

    def __repr__(self) -> str:
        return f"StreamConsumer({self.stream!r}, consumer={self.consumer!r})"

    async def ensure_group(self) -> None:
        """Creates the group (from id 0, creating the stream if needed). Idempotent."""
        try:
            await self._redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.exceptions.ResponseError as exc:
            if not str(exc).startswith("BUSYGROUP"):
                raise StreamUnavailable(f"{self.stream}: cannot create group {self.group!r}: {exc}") from exc
        except redis.exceptions.RedisError as exc:
            raise StreamUnavailable(f"{self.stream}: cannot create group {self.group!r}: {exc}") from exc

    async def _call(self, what: str, op: Callable[[], Awaitable[T]]) -> T:
        """Runs one command, re-creating the group once on NOGROUP, translating Redis errors."""
        try:
            try:
                return await op()
            except redis.exceptions.ResponseError as exc:
                if not _is_nogroup(exc):
                    raise
            await self.ensure_group()
            return await op()
        except redis.exceptions.RedisError as exc:
            raise StreamUnavailable(f"{self.stream}: {what} failed: {exc}") from exc

    async def read_new(self, count: int) -> list[StreamEntry]:
        """Takes up to `count` never-delivered entries (no blocking).

        The entries enter this consumer's PEL: the caller must hand each to an
        executor (which acks it or leaves it for reclaim).
        """
        reply: Any = await self._call(
            "XREADGROUP",
            lambda: self._redis.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=count),
        )
        entries: list[StreamEntry] = []
        for _stream, items in reply or []:
            for entry_id, fields in items:
                entries.append(StreamEntry(self.stream, _text(entry_id), fields or {}, 1))
        return entries

    async def _last_delivered_id(self) -> str:
        async def info() -> list[dict[str, Any]]:
            groups: list[dict[str, Any]] = await self._redis.xinfo_groups(self.stream)
            return groups

        try:
            groups = await info()
        except redis.exceptions.ResponseError:
            # No such key (flushed, or never published): create stream and group.
            await self.ensure_group()
            return "0-0"
        except redis.exceptions.RedisError as exc:
            raise StreamUnavailable(f"{self.stream}: XINFO GROUPS failed: {exc}") from exc
        for group in groups:
            if _text(group["name"]) == self.group:
                return _text(group["last-delivered-id"])
        await self.ensure_group()
        return "0-0"

    async def wait_for_new(self, timeout_ms: int = WAIT_BLOCK_MS) -> bool:
        """Waits until the stream has entries the group has not delivered yet, without taking them.

        Returns:
            True when there may be undelivered entries (or the wait timed out,
            which the caller treats as "check again"); the reader then reserves
            slots and reads. Cancel-safe: the blocking command is read-only.
        """
        last = await self._last_delivered_id()
        try:
            reply = await self._redis.xread({self.stream: last}, count=1, block=timeout_ms)
        except redis.exceptions.RedisError as exc:
            raise StreamUnavailable(f"{self.stream}: XREAD failed: {exc}") from exc
        return bool(reply)

    async def ack(self, entry_id: str) -> None:
        """Acks an entry (removes it from the group's PEL). Idempotent."""
        await self._call("XACK", lambda: self._redis.xack(self.stream, self.group, entry_id))

    async def ack_if_owned(self, entry_id: str) -> bool:
        """Acks an entry only if this consumer still owns it; returns whether it did."""
        result = await self._call(
            "XACK (owned)",
            lambda: self._scripts.ack_if_owned(keys=[self.stream], args=[self.group, self.consumer, entry_id]),
        )
        return bool(result)

    async def touch(self, entry_id: str) -> bool:
        """Resets the idle time of an entry this consumer owns; False if it is no longer ours."""
        result = await self._call(
            "XCLAIM (touch)",
            lambda: self._scripts.touch(keys=[self.stream], args=[self.group, self.consumer, entry_id]),
        )
        return bool(result)

    async def reclaim(
        self, *, min_idle_ms: int, count: int, start: str = "-", held: Sequence[str] = ()
    ) -> tuple[str, list[StreamEntry]]:
        """Claims up to `count` entries idle at least `min_idle_ms`, scanning the PEL from `start`.

        Entries of this consumer listed in `held` (being processed now) are
        skipped, so their idle time is not reset by the claim.

        Returns:
            The scan position for the next call ("-" once the end was reached)
            and the claimed entries with their delivery counts (this claim
            included); an entry deleted from the stream has ``fields=None``.
        """
        reply: Any = await self._call(
            "reclaim",
            lambda: self._scripts.reclaim(
                keys=[self.stream], args=[self.group, self.consumer, min_idle_ms, start, count, *held]
            ),
        )
        next_start = _text(reply[0])
        entries = [
            StreamEntry(
                self.stream,
                _text(entry_id),
                _pairs(fields) if isinstance(fields, list) else None,
                int(deliveries),
            )
            for entry_id, deliveries, fields in reply[1]
        ]
        return next_start, entries

    async def count_idle(self, *, min_idle_ms: int, held: Sequence[str] = (), limit: int = 100) -> int:
        """How many entries (up to `limit`) are idle at least `min_idle_ms` and not held by this consumer.

        A look without a claim, so the reclaimer can wait for execution slots
        before it takes anything.
        """
        pending: Any = await self._call(
            "XPENDING (idle)",
            lambda: self._redis.xpending_range(
                self.stream, self.group, min="-", max="+", count=limit, idle=min_idle_ms
            ),
        )
        held_ids = set(held)
        return sum(
            1 for p in pending if not (_text(p["message_id"]) in held_ids and _text(p["consumer"]) == self.consumer)
        )

    async def ping(self) -> None:
        """Raises StreamUnavailable unless Redis answers."""
        try:
            await self._redis.ping()
        except redis.exceptions.RedisError as exc:
            raise StreamUnavailable(f"redis ping failed: {exc}") from exc
