"""The stream consumer against a real Redis: reads, waits, acks, idle refresh, reclaim, NOGROUP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from protos.taskstream import CONSUMER_GROUP
from worker.stream import StreamConsumer, StreamScripts, connect_redis

STREAM = "wf:tasks:http:0"


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = connect_redis(redis_url)
    yield client
    await client.aclose()


def consumer(raw: aioredis.Redis, name: str = "w1") -> StreamConsumer:
    return StreamConsumer(raw, StreamScripts(raw), STREAM, consumer=name)


async def add(raw: aioredis.Redis, n: int) -> list[str]:
    ids: list[str] = []
    for i in range(n):
        entry_id: Any = await raw.xadd(STREAM, {"task": f"m{i}"})
        ids.append(entry_id.decode())
    return ids


async def pending_of(raw: aioredis.Redis, name: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = await raw.xpending_range(STREAM, CONSUMER_GROUP, "-", "+", 100, consumername=name)
    return result


async def pending_ids(raw: aioredis.Redis, name: str) -> list[str]:
    return [p["message_id"].decode() for p in await pending_of(raw, name)]


async def test_read_new_takes_exactly_count(raw: aioredis.Redis) -> None:
    c = consumer(raw)
    await c.ensure_group()
    await add(raw, 5)
    entries = await c.read_new(2)
    assert [e.fields for e in entries] == [{b"task": b"m0"}, {b"task": b"m1"}]
    assert all(e.delivery_count == 1 and e.stream == STREAM for e in entries)
    assert len(await pending_of(raw, "w1")) == 2
    assert len(await c.read_new(10)) == 3
    assert await c.read_new(10) == []


async def test_published_at_comes_from_the_entry_id(raw: aioredis.Redis) -> None:
    c = consumer(raw)
    await c.ensure_group()
    await add(raw, 1)
    [entry] = await c.read_new(1)
    assert abs(entry.published_at - time.time()) < 5


async def test_nogroup_is_recovered_after_flushall(raw: aioredis.Redis) -> None:
    c = consumer(raw)
    await c.ensure_group()
    await raw.flushall()
    await add(raw, 1)  # the stream exists again, without the group
    [entry] = await c.read_new(5)  # NOGROUP -> group re-created from id 0 -> read
    assert entry.fields == {b"task": b"m0"}


async def test_wait_for_new_wakes_on_undelivered_entries_and_takes_nothing(raw: aioredis.Redis) -> None:
    c = consumer(raw)
    await c.ensure_group()
    await add(raw, 1)
    started = time.monotonic()
    assert await c.wait_for_new(timeout_ms=5000)  # an undelivered entry exists: at once
    assert time.monotonic() - started < 1
    assert await pending_of(raw, "w1") == []  # waiting delivered nothing
    await c.read_new(1)
    # Everything delivered: the wait blocks until a new entry arrives.
    waiter = asyncio.create_task(c.wait_for_new(timeout_ms=5000))
    await asyncio.sleep(0.2)
    assert not waiter.done()
    await add(raw, 1)
    assert await asyncio.wait_for(waiter, 2)


async def test_wait_for_new_times_out_quietly(raw: aioredis.Redis) -> None:
    c = consumer(raw)
    assert await c.wait_for_new(timeout_ms=100) is False  # creates the missing stream and group too
    assert await c.read_new(1) == []


async def test_touch_resets_idle_without_counting_a_delivery(raw: aioredis.Redis) -> None:
    c = consumer(raw)
    await c.ensure_group()
    await add(raw, 1)
    [entry] = await c.read_new(1)
    await asyncio.sleep(0.3)
    [before] = await pending_of(raw, "w1")
    assert int(str(before["time_since_delivered"])) >= 300
    assert await c.touch(entry.entry_id)
    [after] = await pending_of(raw, "w1")
    assert int(str(after["time_since_delivered"])) < 100
    assert after["times_delivered"] == 1


async def test_touch_and_owned_ack_leave_another_consumers_entry_alone(raw: aioredis.Redis) -> None:
    mine, theirs = consumer(raw, "w1"), consumer(raw, "w2")
    await mine.ensure_group()
    await add(raw, 1)
    [entry] = await mine.read_new(1)
    await asyncio.sleep(0.05)
    _, [taken] = await theirs.reclaim(min_idle_ms=10, count=10)  # w2 took it over
    assert taken.entry_id == entry.entry_id
    assert not await mine.touch(entry.entry_id)  # not stolen back
    assert not await mine.ack_if_owned(entry.entry_id)  # not acked from under w2
    assert [p["consumer"] for p in await pending_of(raw, "w2")] == [b"w2"]
    assert await theirs.ack_if_owned(entry.entry_id)
    assert await pending_of(raw, "w2") == []


async def test_reclaim_takes_idle_entries_with_delivery_counts(raw: aioredis.Redis) -> None:
    dead, rescuer = consumer(raw, "dead"), consumer(raw, "rescuer")
    await dead.ensure_group()
    ids = await add(raw, 3)
    await dead.read_new(3)
    await asyncio.sleep(0.25)
    await dead.touch(ids[2])  # still "alive": not idle long enough
    cursor, entries = await rescuer.reclaim(min_idle_ms=200, count=10)
    assert cursor == "-"
    assert [e.entry_id for e in entries] == ids[:2]
    assert [e.delivery_count for e in entries] == [2, 2]
    assert [e.fields for e in entries] == [{b"task": b"m0"}, {b"task": b"m1"}]
    assert [p["message_id"].decode() for p in await pending_of(raw, "rescuer")] == ids[:2]
    assert [p["message_id"].decode() for p in await pending_of(raw, "dead")] == ids[2:]


async def test_reclaim_pages_through_the_pel(raw: aioredis.Redis) -> None:
    dead, rescuer = consumer(raw, "dead"), consumer(raw, "rescuer")
    await dead.ensure_group()
    ids = await add(raw, 5)
    await dead.read_new(5)
    await asyncio.sleep(0.05)
    cursor, first = await rescuer.reclaim(min_idle_ms=10, count=2)
    assert cursor == f"({ids[1]}"
    cursor, second = await rescuer.reclaim(min_idle_ms=10, count=2, start=cursor)
    cursor, third = await rescuer.reclaim(min_idle_ms=10, count=2, start=cursor)
    assert [e.entry_id for e in first + second + third] == ids
    assert cursor == "-"


async def test_reclaim_reports_entries_deleted_while_pending(raw: aioredis.Redis) -> None:
    dead, rescuer = consumer(raw, "dead"), consumer(raw, "rescuer")
    await dead.ensure_group()
    ids = await add(raw, 2)
    await dead.read_new(2)
    await raw.xdel(STREAM, ids[0])
    await asyncio.sleep(0.05)
    _, entries = await rescuer.reclaim(min_idle_ms=10, count=10)
    assert [(e.entry_id, e.fields is None) for e in entries] == [(ids[0], True), (ids[1], False)]
    await rescuer.ack(ids[0])  # what the reclaimer does with a deleted entry: the PEL is clean again
    assert [p["message_id"].decode() for p in await pending_of(raw, "rescuer")] == [ids[1]]


async def test_reclaim_leaves_entries_the_worker_holds_alone(raw: aioredis.Redis) -> None:
    """Claiming resets idle time: a worker must not refresh its own held entries by reclaiming them."""
    me = consumer(raw, "me")
    await me.ensure_group()
    ids = await add(raw, 2)
    await me.read_new(2)
    await asyncio.sleep(0.05)
    _, entries = await me.reclaim(min_idle_ms=10, count=10, held=[ids[0]])
    assert [e.entry_id for e in entries] == [ids[1]]  # an orphan of its own (e.g. before a restart)
    [held] = [p for p in await pending_of(raw, "me") if p["message_id"].decode() == ids[0]]
    assert int(held["time_since_delivered"]) >= 50  # still idle: not claimed
    assert held["times_delivered"] == 1
