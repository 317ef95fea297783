"""Nothing gets lost: the outbox survives a relay outage, the sweeper survives a Redis wipe."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from coordinator.db import create_pool
from coordinator.runs import RunEngine
from coordinator.schema import apply_migrations
from coordinator.workflows import WorkflowRegistry
from protos import workflow_pb2 as pb
from protos.taskstream import TaskMessage
from tests.coordinator_harness import CoordinatorHandle, running_coordinator
from tests.helpers import eventually
from tests.test_coordinator_runs import states, worker_running

TWO_STEPS = {
    "name": "two-steps",
    "nodes": [
        {"id": "a", "type": "HTTP", "request": {"url": "http://svc.local/a"}},
        {"id": "b", "type": "CODE", "runtime": "python", "depends_on": ["a"], "code": "def main(i): return i"},
    ],
}


async def _count(database_url: str, query: str, *args: Any) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        value: int = await conn.fetchval(query, *args)
        return value
    finally:
        await conn.close()


async def _stream_entries(redis: aioredis.Redis, queue: str) -> int:
    total = 0
    for key in await redis.keys(f"wf:tasks:{queue}:*"):
        total += await redis.xlen(key)
    return total


async def test_outbox_rows_committed_while_no_relay_runs_are_published_when_one_starts(
    database_url: str, redis_url: str, redis_client: aioredis.Redis
) -> None:
    pool = await create_pool(database_url, max_size=4)
    try:
        async with pool.acquire() as conn:
            await apply_migrations(conn)
        registry = WorkflowRegistry(pool)
        await registry.register(TWO_STEPS)
        engine = RunEngine(pool=pool, workflows=registry, shards=2, max_output_bytes=1 << 20)
        started = await engine.start_run("two-steps", 0, {"k": 1}, None)
    finally:
        await pool.close()
    assert await _count(database_url, "SELECT count(*) FROM outbox WHERE published_at IS NULL") == 1
    assert await _stream_entries(redis_client, "http") == 0, "nothing reaches Redis inside the transaction"

    async with running_coordinator(database_url, redis_url):
        await eventually(lambda: _stream_entries(redis_client, "http"), what="the committed dispatch published")
        await eventually(
            lambda: _count(database_url, "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL"),
            what="the outbox row marked published",
        )
    key = (await redis_client.keys("wf:tasks:http:*"))[0]
    entries: Any = await redis_client.xrange(key)
    ((_, fields),) = entries
    message = TaskMessage.parse(fields)
    assert (message.run_id, message.node_id, message.attempt) == (str(started.run_id), "a", 1)


async def test_a_run_survives_flushall_mid_run(coordinator: CoordinatorHandle, redis_client: aioredis.Redis) -> None:
    await coordinator.register(TWO_STEPS)
    async with worker_running(coordinator, _ok, queues=("http",)) as http_worker:
        run_id = await coordinator.start_run("two-steps", {"k": 1})

        async def b_dispatched() -> bool:
            return (
                await _count(
                    coordinator.database_url,
                    "SELECT count(*) FROM task_instances WHERE node_id = 'b' AND dispatch_id IS NOT NULL",
                )
                == 1
            )

        await eventually(b_dispatched, what="b queued and published")
    assert [m.node_id for m in http_worker.executions] == ["a"]
    await redis_client.flushall()  # b's message, the consumer group and the shard count are gone

    async with worker_running(coordinator, _ok, queues=("python",)) as python_worker:
        run = await coordinator.wait_for_run(run_id, timeout_s=20)
    assert pb.RunState.Name(run.state) == "RUN_STATE_COMPLETED"
    assert states(run) == {"a": "COMPLETED", "b": "COMPLETED"}
    assert [m.node_id for m in python_worker.executions] == ["b"]
    dispatches = await _count(
        coordinator.database_url,
        "SELECT count(*) FROM outbox o JOIN task_instances t ON t.id = o.task_id WHERE t.node_id = 'b'",
    )
    assert dispatches == 2, "the sweeper re-dispatched the lost message exactly once"


async def test_the_sweeper_does_not_duplicate_a_message_still_waiting_in_its_stream(
    coordinator: CoordinatorHandle, redis_client: aioredis.Redis
) -> None:
    await coordinator.register(TWO_STEPS)
    await coordinator.start_run("two-steps", {"k": 1})
    await eventually(lambda: _stream_entries(redis_client, "http"), what="a published")
    stalled = "SELECT count(*) FROM task_instances WHERE state = 'QUEUED' AND swept_at IS NOT NULL"
    await eventually(
        lambda: _count(coordinator.database_url, stalled), timeout_s=10, what="the sweeper checked the queued task"
    )
    assert await _stream_entries(redis_client, "http") == 1
    assert await _count(coordinator.database_url, "SELECT count(*) FROM outbox") == 1


async def test_a_running_task_whose_worker_died_and_whose_message_is_gone_is_redispatched(
    coordinator: CoordinatorHandle, redis_client: aioredis.Redis
) -> None:
    await coordinator.register(TWO_STEPS)
    run_id = await coordinator.start_run("two-steps", {"k": 1})
    task_id = (await coordinator.get_run(run_id)).tasks[0].id
    lease = await coordinator.stub.AcquireTaskLease(
        pb.AcquireTaskLeaseRequest(task_id=task_id, run_id=run_id, owner="dead", ttl_seconds=1, attempt=1)
    )
    assert lease.acquired
    await redis_client.flushall()  # the dead worker's pending message is lost with it
    async with worker_running(coordinator, _ok, queues=("http", "python")) as worker:
        run = await coordinator.wait_for_run(run_id, timeout_s=20)
    assert pb.RunState.Name(run.state) == "RUN_STATE_COMPLETED"
    assert [m.node_id for m in worker.executions] == ["a", "b"]


async def test_acknowledged_entries_are_trimmed_and_pending_ones_kept(
    database_url: str, redis_url: str, redis_client: aioredis.Redis
) -> None:
    async with running_coordinator(database_url, redis_url, stream_shards=1) as (coordinator, handle):
        await handle.register(TWO_STEPS)
        async with worker_running(handle, _ok):
            for _ in range(5):
                await handle.wait_for_run(await handle.start_run("two-steps", {}))
        # One message delivered and left pending (its worker "died").
        await handle.start_run("two-steps", {})
        # The relay may trim on its own schedule meanwhile; the explicit call below settles it.
        await eventually(
            lambda: redis_client.xreadgroup("workers", "ghost", {"wf:tasks:http:0": ">"}, count=1),
            what="the last dispatch published and delivered to a worker that then dies",
        )
        assert coordinator.relay is not None
        await coordinator.relay.trim_streams()
    entries: Any = await redis_client.xrange("wf:tasks:http:0")
    pending = await redis_client.xpending("wf:tasks:http:0", "workers")
    assert pending["pending"] == 1
    assert len(entries) == 1, "only the pending entry is left"
    assert entries[0][0] == pending["min"]


async def _ok(message: TaskMessage) -> tuple[bool, Any]:
    await asyncio.sleep(0)
    return True, {"node": message.node_id}


async def test_a_run_continues_after_the_coordinator_is_sigkilled_and_restarted(
    coordinator_process: Any, redis_client: aioredis.Redis
) -> None:
    import grpc

    from tests.coordinator_harness import CoordinatorHandle

    process = await coordinator_process()
    async with grpc.aio.insecure_channel(process.addr) as channel:
        handle = CoordinatorHandle(
            addr=process.addr,
            database_url=process.env["DATABASE_URL"],
            redis_url=process.env["REDIS_ADDR"],
            channel=channel,
        )
        await handle.register(TWO_STEPS)
        run_ids = [await handle.start_run("two-steps", {"i": i}) for i in range(20)]
        process.kill()  # some dispatches committed but perhaps not yet published
        process.spawn()
        await process.wait_serving()
        async with worker_running(handle, _ok):
            runs = [await handle.wait_for_run(run_id, timeout_s=30) for run_id in run_ids]
    assert {pb.RunState.Name(r.state) for r in runs} == {"RUN_STATE_COMPLETED"}


async def test_dispatches_left_in_a_shard_beyond_a_lowered_shard_count_are_moved(
    database_url: str, redis_url: str, redis_client: aioredis.Redis
) -> None:
    async with running_coordinator(database_url, redis_url, stream_shards=8) as (_, handle):
        await handle.register(TWO_STEPS)
        run_ids = [await handle.start_run("two-steps", {"i": i}) for i in range(8)]
        await eventually(lambda: _stream_entries(redis_client, "http"), what="published")
    # The operator restarts with fewer shards: workers only read shards 0 and 1 now.
    async with (
        running_coordinator(database_url, redis_url, stream_shards=2) as (_, handle),
        worker_running(handle, _ok),
    ):
        runs = [await handle.wait_for_run(run_id, timeout_s=20) for run_id in run_ids]
    assert {pb.RunState.Name(r.state) for r in runs} == {"RUN_STATE_COMPLETED"}
