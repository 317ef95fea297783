"""Runs end to end through the real coordinator, PostgreSQL and Redis streams.

A scripted worker (tests/stream_worker.py) plays the worker's part of the loop
with real streams and real leases; only the execution is a Python function.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import grpc
import redis.asyncio as aioredis

from protos import workflow_pb2 as pb
from protos.taskstream import TaskMessage
from tests.coordinator_harness import CoordinatorHandle
from tests.helpers import eventually
from tests.stream_worker import Handler, ScriptedWorker

PIPELINE = {
    "name": "pipeline",
    "nodes": [
        {
            "id": "fetch",
            "type": "HTTP",
            "request": {"url": "http://svc.local/items?n=${input.n}", "headers": {"X-Run": "${input.label}"}},
        },
        {
            "id": "double",
            "type": "CODE",
            "runtime": "python",
            "depends_on": ["fetch"],
            "code": "def main(i): ...",
            "input": {"items": "${steps.fetch.items}"},
        },
        {
            "id": "square",
            "type": "CODE",
            "runtime": "node",
            "depends_on": ["fetch"],
            "code": "function main(i) {}",
            "input": "${steps.fetch.items}",
        },
        {
            "id": "sum",
            "type": "CODE",
            "runtime": "python",
            "depends_on": ["double", "square"],
            "code": "def main(i): ...",
        },
        {
            "id": "route",
            "type": "SWITCH",
            "depends_on": ["sum"],
            "cases": [{"when": "steps.sum.total > 20", "then": ["big"]}],
            "default": ["small"],
        },
        {
            "id": "big",
            "type": "HTTP",
            "depends_on": ["route"],
            "request": {"url": "http://svc.local/big", "method": "POST", "body": {"t": "${steps.sum.total}"}},
        },
        {"id": "small", "type": "HTTP", "depends_on": ["route"], "request": {"url": "http://svc.local/small"}},
        {
            "id": "report",
            "type": "CODE",
            "runtime": "js",
            "depends_on": ["big", "small"],
            "join": "any",
            "code": "function main(i) {}",
            "input": {"total": "${steps.sum.total}", "route": "${steps.route.branch[0]}"},
        },
    ],
}


def pipeline_handler(n: int) -> Handler:
    items = list(range(1, n + 1))

    async def handle(message: TaskMessage) -> tuple[bool, Any]:
        body = message.input
        code_input: Any = body.get("input") if isinstance(body, dict) and "code" in body else None
        match message.node_id:
            case "fetch":
                return True, {"items": items}
            case "double":
                return True, {"items": [2 * x for x in code_input["items"]]}
            case "square":
                return True, {"items": [x * x for x in code_input]}
            case "sum":
                steps = code_input["steps"]
                return True, {"total": sum(steps["double"]["items"]) + sum(steps["square"]["items"])}
            case "report":
                return True, code_input
        return True, {"node": message.node_id}

    return handle


@asynccontextmanager
async def worker_running(handle: CoordinatorHandle, handler: Handler, **options: Any) -> AsyncIterator[ScriptedWorker]:
    redis = aioredis.Redis.from_url(handle.redis_url)
    worker = ScriptedWorker(redis=redis, stub=handle.stub, handler=handler, **options)
    await eventually(lambda: redis.exists("wf:shards"), what="shard count published")
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await redis.aclose()


def states(run: pb.Run) -> dict[str, str]:
    return {t.node_id: pb.TaskState.Name(t.state).removeprefix("TASK_STATE_") for t in run.tasks}


async def sql(handle: CoordinatorHandle, query: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(handle.database_url)
    try:
        return list(await conn.fetch(query, *args))
    finally:
        await conn.close()


async def test_dag_with_fan_out_fan_in_and_switch_runs_with_the_right_inputs(coordinator: CoordinatorHandle) -> None:
    await coordinator.register(PIPELINE)
    async with worker_running(coordinator, pipeline_handler(3)) as worker:
        run_id = await coordinator.start_run("pipeline", {"n": 3, "label": "three"})
        run = await coordinator.wait_for_run(run_id)
    assert pb.RunState.Name(run.state) == "RUN_STATE_COMPLETED", run.error
    assert states(run) == {
        "fetch": "COMPLETED",
        "double": "COMPLETED",
        "square": "COMPLETED",
        "sum": "COMPLETED",
        "route": "COMPLETED",
        "big": "COMPLETED",
        "small": "SKIPPED",
        "report": "COMPLETED",
    }
    by_node = {m.node_id: m for m in worker.executions}
    assert by_node["fetch"].input == {
        "method": "GET",
        "url": "http://svc.local/items?n=3",
        "headers": {"X-Run": "three"},
        "body": None,
    }
    assert by_node["double"].input["input"] == {"items": [1, 2, 3]}
    assert by_node["double"].node_type == "python"
    assert by_node["square"].node_type == "js", "the node alias maps to the js runtime"
    assert by_node["sum"].input["input"]["steps"] == {"double": {"items": [2, 4, 6]}, "square": {"items": [1, 4, 9]}}
    assert by_node["big"].input["body"] == {"t": 26}
    assert "small" not in by_node
    assert json.loads(run.output) == {"report": {"total": 26, "route": "big"}}
    route = next(t for t in run.tasks if t.node_id == "route")
    assert json.loads(route.output) == {"branch": ["big"]}
    assert all(m.attempt == 1 for m in worker.executions)


async def test_switch_default_branch_and_join_any(coordinator: CoordinatorHandle) -> None:
    await coordinator.register(PIPELINE)
    async with worker_running(coordinator, pipeline_handler(2)):
        run_id = await coordinator.start_run("pipeline", {"n": 2, "label": "two"})
        run = await coordinator.wait_for_run(run_id)
    assert states(run)["big"] == "SKIPPED"
    assert states(run)["small"] == "COMPLETED"
    assert json.loads(run.output) == {"report": {"total": 11, "route": "small"}}


def _always_fails() -> tuple[Handler, list[float]]:
    times: list[float] = []

    async def handle(message: TaskMessage) -> tuple[bool, Any]:
        times.append(time.monotonic())
        return False, f"boom on attempt {message.attempt}"

    return handle, times


async def test_retry_honours_backoff_and_max_attempts(coordinator: CoordinatorHandle) -> None:
    await coordinator.register(
        {
            "name": "flaky",
            "nodes": [
                {
                    "id": "a",
                    "type": "HTTP",
                    "request": {"url": "http://svc.local/a"},
                    "retry": {"max_attempts": 3, "initial_backoff_seconds": 0.4, "multiplier": 2},
                },
                {"id": "b", "type": "HTTP", "depends_on": ["a"], "request": {"url": "http://svc.local/b"}},
            ],
        }
    )
    handler, times = _always_fails()
    async with worker_running(coordinator, handler) as worker:
        run = await coordinator.wait_for_run(await coordinator.start_run("flaky"), timeout_s=20)
    assert [m.attempt for m in worker.executions] == [1, 2, 3]
    assert times[1] - times[0] >= 0.4, "first retry waits the initial backoff"
    assert times[2] - times[1] >= 0.8, "second retry waits backoff x multiplier"
    assert pb.RunState.Name(run.state) == "RUN_STATE_FAILED"
    assert run.error == "node 'a' failed after 3 attempts: boom on attempt 3"
    assert states(run) == {"a": "FAILED", "b": "SKIPPED"}
    a = next(t for t in run.tasks if t.node_id == "a")
    assert (a.attempt, a.error) == (3, "boom on attempt 3")
    assert len({m.task_id for m in worker.executions}) == 1, "retries keep the task id (the idempotency key)"


async def test_a_retry_that_succeeds_completes_the_run(coordinator: CoordinatorHandle) -> None:
    await coordinator.register(
        {
            "name": "once",
            "nodes": [
                {
                    "id": "a",
                    "type": "HTTP",
                    "request": {"url": "http://svc.local/a"},
                    "retry": {"max_attempts": 2, "initial_backoff_seconds": 0},
                }
            ],
        }
    )

    async def fail_once(message: TaskMessage) -> tuple[bool, Any]:
        return (message.attempt > 1), ({"ok": True} if message.attempt > 1 else "transient")

    async with worker_running(coordinator, fail_once):
        run = await coordinator.wait_for_run(await coordinator.start_run("once"))
    assert pb.RunState.Name(run.state) == "RUN_STATE_COMPLETED"
    assert run.tasks[0].attempt == 2
    assert json.loads(run.output) == {"a": {"ok": True}}


async def _leased_task(handle: CoordinatorHandle, owner: str = "w1", *, max_attempts: int = 3) -> tuple[str, str]:
    await handle.register(
        {
            "name": "single",
            "nodes": [
                {
                    "id": "a",
                    "type": "HTTP",
                    "request": {"url": "http://svc.local/a"},
                    "retry": {"max_attempts": max_attempts, "initial_backoff_seconds": 0},
                }
            ],
        }
    )
    run_id = await handle.start_run("single")
    task_id = (await handle.get_run(run_id)).tasks[0].id
    lease = await handle.stub.AcquireTaskLease(
        pb.AcquireTaskLeaseRequest(task_id=task_id, run_id=run_id, owner=owner, ttl_seconds=30, attempt=1)
    )
    assert lease.acquired
    return run_id, task_id


def _report(run_id: str, task_id: str, **fields: Any) -> pb.ReportTaskResultRequest:
    base: dict[str, Any] = {
        "task_id": task_id,
        "run_id": run_id,
        "node_id": "a",
        "attempt": 1,
        "owner": "w1",
        "status": "completed",
        "output": b'{"v": 1}',
    }
    base.update(fields)
    return pb.ReportTaskResultRequest(**base)


async def test_stale_non_owner_and_duplicate_reports_are_acknowledged_and_ignored(
    coordinator: CoordinatorHandle,
) -> None:
    run_id, task_id = await _leased_task(coordinator)
    not_owner = await coordinator.stub.ReportTaskResult(
        _report(run_id, task_id, owner="w2", status="failed", error="x", output=b"")
    )
    stale = await coordinator.stub.ReportTaskResult(_report(run_id, task_id, attempt=2))
    assert (not_owner.acknowledged, not_owner.applied) == (True, False)
    assert not_owner.ignored_reason == "lease is held by w1, not w2"
    assert (stale.acknowledged, stale.applied) == (True, False)
    assert stale.ignored_reason == "stale attempt 2 (the task is on attempt 1)"
    assert pb.RunState.Name((await coordinator.get_run(run_id)).state) == "RUN_STATE_RUNNING", (
        "a rejected report never fails the run"
    )
    first = await coordinator.stub.ReportTaskResult(_report(run_id, task_id))
    duplicate = await coordinator.stub.ReportTaskResult(_report(run_id, task_id, output=b'{"v": 2}'))
    assert first.applied and not duplicate.applied and duplicate.acknowledged
    run = await coordinator.get_run(run_id)
    assert json.loads(run.output) == {"a": {"v": 1}}, "the duplicate changed nothing"
    ignored = (await coordinator.stub.GetRun(pb.GetRunRequest(run_id=run_id))).ignored_reports
    assert [(r.owner, r.attempt, r.reason) for r in ignored] == [
        ("w2", 1, "lease is held by w1, not w2"),
        ("w1", 2, "stale attempt 2 (the task is on attempt 1)"),
        ("w1", 1, "task is already COMPLETED"),
    ]


async def test_old_owner_report_after_takeover_is_ignored(coordinator: CoordinatorHandle) -> None:
    run_id, task_id = await _leased_task(coordinator)
    await sql(
        coordinator, "UPDATE task_instances SET lease_expires_at = now() - interval '1 second' WHERE id = $1", task_id
    )
    lease = await coordinator.stub.AcquireTaskLease(
        pb.AcquireTaskLeaseRequest(task_id=task_id, run_id=run_id, owner="w2", ttl_seconds=30, attempt=1)
    )
    assert lease.acquired
    late = await coordinator.stub.ReportTaskResult(_report(run_id, task_id, output=b'{"from": "w1"}'))
    assert not late.applied
    assert (
        await coordinator.stub.ReportTaskResult(_report(run_id, task_id, owner="w2", output=b'{"from": "w2"}'))
    ).applied
    assert json.loads((await coordinator.get_run(run_id)).output) == {"a": {"from": "w2"}}


async def test_dead_letter_report_fails_the_task_when_nobody_holds_a_live_lease(coordinator: CoordinatorHandle) -> None:
    run_id, task_id = await _leased_task(coordinator, max_attempts=1)
    reason = "task exceeded max delivery attempts (5)"
    refused = await coordinator.stub.ReportTaskResult(
        _report(
            run_id,
            task_id,
            owner="reclaimer",
            status="failed",
            output=b"",
            error=reason,
            dead_letter=True,
            delivery_count=6,
        )
    )
    assert not refused.applied and refused.ignored_reason == "dead-letter report while w1 holds a live lease"
    await sql(
        coordinator, "UPDATE task_instances SET lease_expires_at = now() - interval '1 second' WHERE id = $1", task_id
    )
    accepted = await coordinator.stub.ReportTaskResult(
        _report(
            run_id,
            task_id,
            owner="reclaimer",
            status="failed",
            output=b"",
            error=reason,
            dead_letter=True,
            delivery_count=6,
        )
    )
    assert accepted.applied
    run = await coordinator.get_run(run_id)
    assert pb.RunState.Name(run.state) == "RUN_STATE_FAILED"
    assert run.error == f"node 'a' failed after 1 attempt: {reason}"
    letters = (await coordinator.stub.ListDeadLetters(pb.ListDeadLettersRequest(run_id=run_id))).dead_letters
    assert [(d.task_id, d.delivery_count, d.reported_by, d.reason) for d in letters] == [
        (task_id, 6, "reclaimer", reason)
    ]


async def test_release_requeues_the_same_attempt_at_once(
    coordinator: CoordinatorHandle, redis_client: aioredis.Redis
) -> None:
    run_id, task_id = await _leased_task(coordinator)
    assert not (
        await coordinator.stub.ReleaseTaskLease(
            pb.ReleaseTaskLeaseRequest(task_id=task_id, run_id=run_id, owner="w2", attempt=1)
        )
    ).released
    reply = await coordinator.stub.ReleaseTaskLease(
        pb.ReleaseTaskLeaseRequest(task_id=task_id, run_id=run_id, owner="w1", attempt=1, reason="draining")
    )
    assert reply.released
    task = (await coordinator.get_run(run_id)).tasks[0]
    assert (pb.TaskState.Name(task.state), task.attempt, task.lease_owner) == ("TASK_STATE_QUEUED", 1, "")

    async def two_dispatches() -> bool:
        total = 0
        for key in await redis_client.keys("wf:tasks:http:*"):
            entries: Any = await redis_client.xrange(key)
            total += sum(1 for _, f in entries if TaskMessage.parse(f).task_id == task_id)
        return total == 2

    await eventually(two_dispatches, timeout_s=5, what="the released task dispatched again")
    lease = await coordinator.stub.AcquireTaskLease(
        pb.AcquireTaskLeaseRequest(task_id=task_id, run_id=run_id, owner="w2", ttl_seconds=30, attempt=1)
    )
    assert lease.acquired


async def test_cancel_skips_what_is_left(coordinator: CoordinatorHandle) -> None:
    run_id, task_id = await _leased_task(coordinator)
    reply = await coordinator.stub.CancelRun(pb.CancelRunRequest(run_id=run_id, reason="operator said so"))
    assert reply.cancelled and reply.state == pb.RUN_STATE_CANCELLED
    run = await coordinator.get_run(run_id)
    assert (run.error, states(run)) == ("operator said so", {"a": "SKIPPED"})
    renew = await coordinator.stub.RenewTaskLease(
        pb.AcquireTaskLeaseRequest(task_id=task_id, run_id=run_id, owner="w1", ttl_seconds=30)
    )
    assert not renew.acquired, "the worker learns at its next renewal that the task is gone"
    again = await coordinator.stub.CancelRun(pb.CancelRunRequest(run_id=run_id))
    assert not again.cancelled and again.state == pb.RUN_STATE_CANCELLED


async def test_idempotency_key_returns_the_same_run(coordinator: CoordinatorHandle) -> None:
    await coordinator.register(PIPELINE)
    first = await coordinator.stub.StartRun(
        pb.StartRunRequest(workflow="pipeline", input=b'{"n": 1, "label": "x"}', idempotency_key="order-17")
    )
    second = await coordinator.stub.StartRun(
        pb.StartRunRequest(workflow="pipeline", input=b'{"n": 9, "label": "y"}', idempotency_key="order-17")
    )
    other = await coordinator.stub.StartRun(
        pb.StartRunRequest(workflow="pipeline", input=b'{"n": 1, "label": "x"}', idempotency_key="order-18")
    )
    assert (first.created, second.created, other.created) == (True, False, True)
    assert first.run_id == second.run_id != other.run_id
    assert json.loads((await coordinator.get_run(first.run_id)).input) == {"n": 1, "label": "x"}
    rows = await sql(coordinator, "SELECT count(*) AS n FROM runs")
    assert rows[0]["n"] == 2


async def test_watch_streams_changes_until_the_run_ends(coordinator_process: Any) -> None:
    # A coordinator in its own process: a server stream and its client in one
    # event loop occasionally wedged the in-process fixture's teardown.
    process = await coordinator_process()
    async with grpc.aio.insecure_channel(process.addr) as channel:
        handle = CoordinatorHandle(
            addr=process.addr,
            database_url=process.env["DATABASE_URL"],
            redis_url=process.env["REDIS_ADDR"],
            channel=channel,
        )
        await _watch_a_pipeline(handle)


async def _watch_a_pipeline(coordinator: CoordinatorHandle) -> None:
    await coordinator.register(PIPELINE)
    run_id = await coordinator.start_run("pipeline", {"n": 3, "label": "w"})
    events: list[pb.RunEvent] = []
    first_snapshot = asyncio.Event()

    async def watch() -> None:
        async for event in coordinator.stub.WatchRun(pb.WatchRunRequest(run_id=run_id)):
            events.append(event)
            first_snapshot.set()

    watcher = asyncio.create_task(watch())
    await asyncio.wait_for(first_snapshot.wait(), timeout=10)
    async with worker_running(coordinator, pipeline_handler(3)):
        await asyncio.wait_for(watcher, timeout=20)
    assert events[-1].HasField("run") and events[-1].run_state == pb.RUN_STATE_COMPLETED
    assert len(events[-1].run.tasks) == 8
    seen = [(e.task.node_id, pb.TaskState.Name(e.task.state)) for e in events if e.HasField("task")]
    assert ("fetch", "TASK_STATE_QUEUED") in seen
    assert ("fetch", "TASK_STATE_COMPLETED") in seen
    assert ("small", "TASK_STATE_SKIPPED") in seen
    assert seen.index(("fetch", "TASK_STATE_QUEUED")) < seen.index(("fetch", "TASK_STATE_COMPLETED"))


async def test_an_input_expression_that_fails_fails_the_run_naming_the_node(coordinator: CoordinatorHandle) -> None:
    await coordinator.register(
        {
            "name": "badinput",
            "nodes": [{"id": "a", "type": "HTTP", "request": {"url": "http://svc.local/${input.missing}"}}],
        }
    )
    run = await coordinator.wait_for_run(await coordinator.start_run("badinput", {}))
    assert pb.RunState.Name(run.state) == "RUN_STATE_FAILED"
    assert run.error.startswith("node 'a' failed: could not build the input: expression 'input.missing' failed")
    assert states(run) == {"a": "FAILED"}


async def test_output_over_the_limit_fails_the_task_loudly(database_url: str, redis_url: str) -> None:
    from tests.coordinator_harness import running_coordinator

    async with running_coordinator(database_url, redis_url, max_output_bytes=100) as (_, handle):
        run_id, task_id = await _leased_task(handle, max_attempts=1)
        reply = await handle.stub.ReportTaskResult(
            _report(run_id, task_id, output=json.dumps({"blob": "x" * 200}).encode())
        )
        assert reply.applied
        run = await handle.get_run(run_id)
    assert pb.RunState.Name(run.state) == "RUN_STATE_FAILED"
    assert "over the limit of 100 (MAX_OUTPUT_BYTES)" in run.error


async def test_run_input_and_timings_are_reported(coordinator: CoordinatorHandle) -> None:
    run_id, task_id = await _leased_task(coordinator)
    await coordinator.stub.ReportTaskResult(_report(run_id, task_id))
    run = await coordinator.get_run(run_id)
    task = run.tasks[0]
    assert task.HasField("started_at") and task.HasField("finished_at")
    assert task.finished_at.ToDatetime() >= task.started_at.ToDatetime()
    assert (task.lease_owner, task.max_attempts, task.queue, task.node_type) == ("w1", 3, "http", "HTTP")


async def test_concurrent_reports_of_a_fan_in_never_strand_the_join(coordinator: CoordinatorHandle) -> None:
    """Regression (found by the fault storm): the second of two concurrent reports must see the first's commit.

    Under READ COMMITTED, a statement that waits for the run lock still reads
    the other rows from the snapshot it started with; the task rows must be
    read by a statement that starts after the lock is held, or the join of a
    fan-in that both reports complete is never queued.
    """
    await coordinator.register(
        {
            "name": "fanin",
            "nodes": [
                {"id": "a", "type": "HTTP", "request": {"url": "http://svc.local/a"}},
                {"id": "b", "type": "HTTP", "request": {"url": "http://svc.local/b"}},
                {"id": "c", "type": "HTTP", "depends_on": ["a", "b"], "request": {"url": "http://svc.local/c"}},
            ],
        }
    )
    run_ids = [await coordinator.start_run("fanin", {}) for _ in range(30)]

    async def lease_and_report(run_id: str, task: pb.TaskInstance) -> None:
        lease = await coordinator.stub.AcquireTaskLease(
            pb.AcquireTaskLeaseRequest(
                task_id=task.id, run_id=run_id, owner=f"w-{task.node_id}", ttl_seconds=30, attempt=1
            )
        )
        assert lease.acquired
        reply = await coordinator.stub.ReportTaskResult(
            pb.ReportTaskResultRequest(
                task_id=task.id,
                run_id=run_id,
                node_id=task.node_id,
                attempt=1,
                owner=f"w-{task.node_id}",
                status="completed",
                output=b"{}",
            )
        )
        assert reply.applied

    for run_id in run_ids:
        tasks = {t.node_id: t for t in (await coordinator.get_run(run_id)).tasks}
        await asyncio.gather(lease_and_report(run_id, tasks["a"]), lease_and_report(run_id, tasks["b"]))
    joins = [next(t for t in (await coordinator.get_run(r)).tasks if t.node_id == "c") for r in run_ids]
    assert [pb.TaskState.Name(t.state) for t in joins] == ["TASK_STATE_QUEUED"] * len(run_ids)
