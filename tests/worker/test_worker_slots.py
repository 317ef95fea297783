"""The slot pool and the executor pool's hand-off, on their own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.helpers import eventually
from worker.executor_pool import Delivery, ExecutorPool
from worker.slots import SlotPool
from worker.stream import StreamConsumer, StreamEntry, StreamScripts, connect_redis


async def test_reserve_takes_what_is_free_and_waits_when_nothing_is() -> None:
    slots = SlotPool(3)
    assert await slots.reserve(2) == 2
    assert await slots.reserve(5) == 1  # only one left
    assert slots.try_reserve(1) == 0
    waiter = asyncio.create_task(slots.reserve(4))
    await asyncio.sleep(0)
    assert not waiter.done()
    slots.release(2)
    assert await asyncio.wait_for(waiter, 1) == 2
    assert (slots.used, slots.free) == (3, 0)


async def test_close_wakes_waiters_with_nothing() -> None:
    slots = SlotPool(1)
    assert slots.try_reserve(1) == 1
    waiter = asyncio.create_task(slots.reserve(1))
    await asyncio.sleep(0)
    slots.close()
    assert await asyncio.wait_for(waiter, 1) == 0
    slots.release(1)  # executors still give slots back while stopping
    assert slots.free == 1
    assert slots.try_reserve(1) == 0  # but nothing new is handed out
    assert await slots.reserve(1) == 0


def test_releasing_more_than_reserved_is_a_bug() -> None:
    slots = SlotPool(2)
    with pytest.raises(RuntimeError, match="released more slots than reserved"):
        slots.release(1)


@pytest.fixture
async def consumer() -> AsyncIterator[StreamConsumer]:
    client = connect_redis("redis://127.0.0.1:1/0")  # never contacted by these tests
    yield StreamConsumer(client, StreamScripts(client), "wf:tasks:http:0", consumer="w")
    await client.aclose()


async def count(items: list[str], n: int) -> bool:
    return len(items) >= n


def delivery(consumer: StreamConsumer, n: int) -> Delivery:
    return Delivery(consumer, StreamEntry(consumer.stream, f"{n}-0", {b"task": b"{}"}, 1))


async def test_pool_processes_handed_messages_and_frees_their_slots(consumer: StreamConsumer) -> None:
    slots = SlotPool(2)
    handled: list[str] = []
    release = asyncio.Event()

    async def handle(d: Delivery) -> None:
        assert pool.holds(d.entry.stream, d.entry.entry_id)
        handled.append(d.entry.entry_id)
        await release.wait()

    pool = ExecutorPool(concurrency=2, slots=slots, handle=handle)
    runner = asyncio.create_task(pool.run())
    assert slots.try_reserve(2) == 2
    pool.hand(delivery(consumer, 1))
    pool.hand(delivery(consumer, 2))
    await eventually(lambda: count(handled, 2), what="both handled")
    assert pool.busy == 2
    assert sorted(pool.held_ids(consumer.stream)) == ["1-0", "2-0"]
    release.set()
    assert await pool.drain(1.0)
    assert (slots.free, pool.held_ids(consumer.stream)) == (2, [])
    pool.close()
    await runner


async def test_drain_leaves_queued_messages_unstarted_and_times_out_on_running_ones(
    consumer: StreamConsumer,
) -> None:
    slots = SlotPool(2)
    started: list[str] = []
    release = asyncio.Event()

    async def handle(d: Delivery) -> None:
        started.append(d.entry.entry_id)
        await release.wait()

    pool = ExecutorPool(concurrency=2, slots=slots, handle=handle)
    runner = asyncio.create_task(pool.run())
    await asyncio.sleep(0)  # the executors are waiting on the hand-off
    assert slots.try_reserve(1) == 1
    pool.hand(delivery(consumer, 1))
    await eventually(lambda: count(started, 1), what="first started")
    assert slots.try_reserve(1) == 1
    pool.hand(delivery(consumer, 2))  # handed, not yet picked up...
    assert not await pool.drain(0.05)  # ...when the drain starts: never started; the running one times out
    assert started == ["1-0"]
    assert slots.free == 1  # the unstarted message's slot came back (it stays pending in Redis)
    release.set()
    assert await pool.drain(1.0)
    assert slots.free == 2
    pool.close()
    await runner


async def test_a_failing_handler_does_not_stop_its_executor(consumer: StreamConsumer) -> None:
    slots = SlotPool(1)
    seen: list[str] = []

    async def handle(d: Delivery) -> None:
        seen.append(d.entry.entry_id)
        if d.entry.entry_id == "1-0":
            raise ValueError("bug")

    pool = ExecutorPool(concurrency=1, slots=slots, handle=handle)
    runner = asyncio.create_task(pool.run())
    for n in (1, 2):
        assert await slots.reserve(1) == 1
        pool.hand(delivery(consumer, n))
    await eventually(lambda: count(seen, 2), what="both seen")
    assert await pool.drain(1.0)
    assert slots.free == 1
    pool.close()
    await runner


async def test_a_priority_reservation_gets_the_next_free_slot_before_waiting_readers() -> None:
    """Reclaim goes first: orphans of a dead worker must not wait behind a backlog of new messages."""
    slots = SlotPool(1)
    assert await slots.reserve(1) == 1  # the only slot is busy
    order: list[str] = []

    async def take(name: str, priority: bool) -> None:
        got = await slots.reserve(1, priority=priority)
        order.append(name)
        await asyncio.sleep(0)
        slots.release(got)

    reader = asyncio.create_task(take("reader", False))
    await asyncio.sleep(0)  # the reader is waiting first...
    reclaim = asyncio.create_task(take("reclaim", True))
    await asyncio.sleep(0)
    slots.release(1)  # ...but the freed slot goes to the reclaimer
    await asyncio.gather(reader, reclaim)
    assert order == ["reclaim", "reader"]
    assert slots.free == 1
