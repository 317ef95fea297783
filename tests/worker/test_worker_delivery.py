"""Delivery rules against the real coordinator, Redis and a local HTTP server.

Bounded prefetch, invalid messages, duplicate deliveries, dead letters, output limits.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import redis.asyncio as aioredis

from protos import workflow_pb2 as pb
from protos.taskstream import CONSUMER_GROUP, TaskMessage, queue_streams, shard_for, stream_name
from tests.coordinator_harness import CoordinatorHandle, running_coordinator
from tests.helpers import eventually
from tests.worker.conftest import http_workflow
from tests.worker.support import Gate, RecordingServer, in_process_worker, pending_per_consumer, worker_config
from worker.metrics import Outcome


async def stream_entries(redis_client: aioredis.Redis, stream: str) -> list[tuple[str, dict[Any, Any]]]:
    entries: Any = await redis_client.xrange(stream)
    return [(entry_id, fields) for entry_id, fields in entries]


async def test_bounded_prefetch_over_8_shards_with_concurrency_2(
    database_url: str, redis_url: str, redis_client: aioredis.Redis, http_server: RecordingServer
) -> None:
    """However many streams it reads, a worker holds at most Concurrency messages (counted in Redis)."""
    gate = Gate()
    http_server.on("/hold", gate)
    async with running_coordinator(database_url, redis_url, stream_shards=8) as (_, coordinator):
        await coordinator.register(http_workflow("prefetch", http_server.url("/hold")))
        runs: list[str] = []
        # Enough runs that every one of the 8 shards has several messages waiting.
        while len(runs) < 24 or len({shard_for(r, 8) for r in runs}) < 8:
            runs.append(await coordinator.start_run("prefetch", {"n": len(runs)}))
        streams = queue_streams(["http"], 8)

        async def published() -> bool:
            lengths = [await redis_client.xlen(s) for s in streams]
            return sum(lengths) == len(runs)

        await eventually(published, timeout_s=15, what="every dispatch published")
        config = worker_config(coordinator.addr, redis_url, concurrency=2)
        async with in_process_worker(config) as worker:
            assert len(worker.worker.streams or await eventually(lambda: _streams(worker))) == 8
            await eventually(lambda: _at_least(gate, 2), what="two requests in flight")
            # Both slots busy, 22+ messages waiting on 8 streams: the worker holds exactly two.
            samples = []
            for _ in range(20):
                samples.append((await pending_per_consumer(redis_client, streams)).get(worker.id, 0))
                await asyncio.sleep(0.05)
            assert max(samples) == 2, samples
            assert worker.worker.metrics.sample("worker_slots_used") == 2
            assert worker.worker.metrics.sample("worker_slots_available") == 0

            # Let everything through, sampling the bound while the backlog drains.
            gate.release()
            highest = 0

            async def drained() -> bool:
                nonlocal highest
                highest = max(highest, (await pending_per_consumer(redis_client, streams)).get(worker.id, 0))
                states = [(await coordinator.get_run(r)).state for r in runs]
                return all(s == pb.RUN_STATE_COMPLETED for s in states)

            await eventually(drained, timeout_s=60, interval_s=0.01, what="all runs completed")
        assert highest <= 2
        assert gate.max_in_flight == 2
        assert len(http_server.to("/hold")) == len(runs)


async def _streams(worker: Any) -> tuple[str, ...]:
    streams: tuple[str, ...] = worker.worker.streams
    return streams


async def _at_least(gate: Gate, n: int) -> bool:
    return gate.in_flight >= n


async def test_invalid_messages_are_acked_and_discarded(
    coordinator: CoordinatorHandle, redis_client: aioredis.Redis, http_server: RecordingServer
) -> None:
    await coordinator.register(http_workflow("valid", http_server.url("/ok")))
    stream = stream_name("http", 0)
    await redis_client.xgroup_create(stream, CONSUMER_GROUP, id="0", mkstream=True)
    await redis_client.xadd(stream, {"task": "this is not json"})
    await redis_client.xadd(stream, {"unexpected": "field"})
    await redis_client.xadd(stream, {"task": json.dumps({"task_id": "t", "attempt": "one"})})
    async with in_process_worker(worker_config(coordinator.addr, coordinator.redis_url)) as worker:
        metrics = worker.worker.metrics
        await eventually(lambda: _value(metrics.count(Outcome.INVALID) == 3), what="three invalid messages discarded")
        # The worker goes on: a valid task after them runs normally.
        run = await coordinator.wait_for_run(await coordinator.start_run("valid", {"n": 1}), timeout_s=20)
        assert run.state == pb.RUN_STATE_COMPLETED
        streams = queue_streams(["http"], 2)
        assert await pending_per_consumer(redis_client, streams) in ({}, {worker.id: 0})
    assert await redis_client.xlen(stream) >= 3  # acked, not deleted: the entries are still there to inspect


async def _value(flag: bool) -> bool:
    return flag


async def test_redelivery_to_the_worker_running_it_is_dropped(
    coordinator: CoordinatorHandle, redis_client: aioredis.Redis, http_server: RecordingServer
) -> None:
    """The same owner is refused a lease it holds: the duplicate is dropped and acked, one execution."""
    gate = Gate({"done": 1})
    http_server.on("/once", gate)
    await coordinator.register(http_workflow("dup", http_server.url("/once")))
    async with in_process_worker(worker_config(coordinator.addr, coordinator.redis_url)) as worker:
        run_id = await coordinator.start_run("dup", {"n": 1})
        await asyncio.wait_for(gate.arrived.wait(), 20)
        stream = stream_name("http", shard_for(run_id, 2))
        [(original_id, fields)] = await stream_entries(redis_client, stream)
        duplicate_id = await redis_client.xadd(stream, fields)  # e.g. a relay that published twice
        metrics = worker.worker.metrics
        await eventually(lambda: _value(metrics.count(Outcome.DROPPED) == 1), what="duplicate dropped")
        # The duplicate is acked; the original stays pending while it runs.
        pending: Any = await redis_client.xpending_range(stream, CONSUMER_GROUP, "-", "+", 10)
        assert [p["message_id"] for p in pending] == [original_id]
        assert duplicate_id != original_id
        gate.release()
        run = await coordinator.wait_for_run(run_id, timeout_s=20)
    assert run.state == pb.RUN_STATE_COMPLETED
    assert len(http_server.to("/once")) == 1
    assert gate.arrivals == 1
    assert metrics.count(Outcome.COMPLETED) == 1


async def test_poison_message_is_dead_lettered_and_fails_the_run(
    coordinator: CoordinatorHandle, redis_client: aioredis.Redis, http_server: RecordingServer
) -> None:
    """A message delivered more than MaxDeliveries times is reported failed, not run again."""
    definition = http_workflow("poison", http_server.url("/poison"), retry={"max_attempts": 1})
    await coordinator.register(definition)
    poison = await coordinator.start_run("poison", {"n": 1})
    survivor = await coordinator.start_run("poison", {"n": 2})
    entries: dict[str, str] = {}

    async def published() -> bool:
        for shard in range(2):
            for entry_id, fields in await stream_entries(redis_client, stream_name("http", shard)):
                entries[TaskMessage.parse(fields).run_id] = entry_id
        return len(entries) == 2

    await eventually(published, what="both dispatches published")
    # Earlier deliveries to workers that crashed on it: read by a consumer that
    # never acked, then (as reclaim by crashed workers would) counted up.
    for stream in {stream_name("http", shard_for(run_id, 2)) for run_id in (poison, survivor)}:
        await redis_client.xreadgroup(CONSUMER_GROUP, "crashed-worker", {stream: ">"})
    for run_id, deliveries in ((poison, 5), (survivor, 4)):
        stream = stream_name("http", shard_for(run_id, 2))
        await redis_client.xclaim(
            stream, CONSUMER_GROUP, "crashed-worker", 0, [entries[run_id]], idle=60_000, retrycount=deliveries
        )
    config = worker_config(coordinator.addr, coordinator.redis_url, max_deliveries=5)
    async with in_process_worker(config) as worker:
        failed = await coordinator.wait_for_run(poison, timeout_s=20)
        survived = await coordinator.wait_for_run(survivor, timeout_s=20)
        metrics = worker.worker.metrics
    assert failed.state == pb.RUN_STATE_FAILED
    assert failed.tasks[0].error == "task exceeded max delivery attempts (5)"
    assert "task exceeded max delivery attempts (5)" in failed.error
    # The sixth delivery was dead-lettered; the fifth (at the limit) was still executed.
    assert survived.state == pb.RUN_STATE_COMPLETED
    assert [r.json() for r in http_server.to("/poison")] == [{"run": 2}]
    assert metrics.sample("worker_dead_lettered_total") == 1
    assert metrics.sample("worker_messages_reclaimed_total") == 2
    letters = await coordinator.stub.ListDeadLetters(pb.ListDeadLettersRequest(run_id=poison))
    [letter] = letters.dead_letters
    assert (letter.delivery_count, letter.reported_by) == (6, worker.id)
    assert await pending_per_consumer(redis_client, queue_streams(["http"], 2)) in ({}, {worker.id: 0})


async def test_output_over_the_limit_fails_the_task_loudly(
    coordinator: CoordinatorHandle, http_server: RecordingServer
) -> None:
    big = {"data": "x" * 3000}
    from aiohttp import web

    async def large(_: Any, __: Any) -> web.StreamResponse:
        return web.json_response(big)

    http_server.on("/large", large)
    await coordinator.register(http_workflow("large", http_server.url("/large"), retry={"max_attempts": 1}))
    config = worker_config(coordinator.addr, coordinator.redis_url, max_output_bytes=2048)
    async with in_process_worker(config):
        run = await coordinator.wait_for_run(await coordinator.start_run("large", {"n": 1}), timeout_s=20)
    assert run.state == pb.RUN_STATE_FAILED
    assert "exceeds the limit of 2048 bytes" in run.tasks[0].error
    assert "WORKER_MAX_OUTPUT_BYTES" in run.tasks[0].error
    assert run.tasks[0].output == b""  # nothing truncated or substituted
