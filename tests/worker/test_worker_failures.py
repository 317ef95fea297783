"""Failures, against the real coordinator, Redis and HTTP server, with real worker processes.

Lease lost mid-execution, renewal through a network blip, SIGTERM (release and
drain), SIGKILL, a task longer than the TTL, and the idempotency key across
retries and redeliveries. Short TTLs go through the documented test-only path
(``WORKER_ALLOW_SHORT_LEASE_TTL``), which keeps renewal at TTL/3.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import asyncpg
from aiohttp import web

from protos import workflow_pb2 as pb
from tests.coordinator_harness import CoordinatorHandle
from tests.helpers import eventually
from tests.worker.conftest import http_workflow
from tests.worker.support import (
    TEST_TTL_S,
    Gate,
    InProcessWorker,
    Recorded,
    RecordingServer,
    TcpProxy,
    WorkerProcess,
    in_process_worker,
    worker_config,
)
from worker.metrics import Outcome

StartProcess = Callable[[dict[str, str]], WorkerProcess]


def process_env(coordinator: CoordinatorHandle, **extra: str) -> dict[str, str]:
    return {
        "COORDINATOR_ADDR": coordinator.addr,
        "REDIS_ADDR": coordinator.redis_url,
        "WORKER_QUEUES": "http",
        "WORKER_CONCURRENCY": "2",
        "LEASE_TTL_SECONDS": str(TEST_TTL_S),
        "WORKER_ALLOW_SHORT_LEASE_TTL": "1",
        "WORKER_SHUTDOWN_GRACE_SECONDS": "1",
        **extra,
    }


class FirstHeld:
    """Holds the first request until released (or the client goes away); answers the others at once."""

    def __init__(self) -> None:
        self.first = Gate({"who": "first"})
        self.requests: list[Recorded] = []

    async def __call__(self, request: web.Request, record: Recorded) -> web.StreamResponse:
        self.requests.append(record)
        if len(self.requests) == 1:
            return await self.first(request, record)
        return web.json_response({"who": f"request {len(self.requests)}"})


async def get_json(port: int, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}{path}") as response:
        return response.status, await response.json()


async def flag(value: bool) -> bool:
    return value


async def ignored_reports(coordinator: CoordinatorHandle, run_id: str) -> list[pb.IgnoredReport]:
    reply = await coordinator.stub.GetRun(pb.GetRunRequest(run_id=run_id))
    return list(reply.ignored_reports)


async def test_lease_lost_mid_execution_discards_the_result(
    coordinator: CoordinatorHandle, http_server: RecordingServer
) -> None:
    """The coordinator says the lease is gone (it was taken over): the execution stops, the new owner's result counts."""
    work = FirstHeld()
    http_server.on("/work", work)
    await coordinator.register(http_workflow("lost", http_server.url("/work"), retry={"max_attempts": 1}))
    async with in_process_worker(worker_config(coordinator.addr, coordinator.redis_url, worker_id="worker-a")) as a:
        run_id = await coordinator.start_run("lost", {"n": 1})
        await asyncio.wait_for(work.first.arrived.wait(), 20)
        task = (await coordinator.get_run(run_id)).tasks[0]
        # Another worker takes the task over (as after a pause longer than the TTL).
        conn = await asyncpg.connect(coordinator.database_url)
        try:
            await conn.execute(
                "UPDATE task_instances SET lease_expires_at = now() - interval '1 second' WHERE id = $1::uuid", task.id
            )
        finally:
            await conn.close()
        lease = await coordinator.stub.AcquireTaskLease(
            pb.AcquireTaskLeaseRequest(task_id=task.id, run_id=run_id, owner="worker-b", ttl_seconds=30, attempt=1)
        )
        assert lease.acquired
        # A's next renewal hears "no": its execution is cancelled and its result discarded.
        await asyncio.wait_for(work.requests[0].disconnected.wait(), 10)
        metrics_a = a.worker.metrics
        await eventually(lambda: flag(metrics_a.count(Outcome.LEASE_LOST) == 1), timeout_s=10, what="A lost the lease")
        reply = await coordinator.stub.ReportTaskResult(
            pb.ReportTaskResultRequest(
                task_id=task.id,
                run_id=run_id,
                node_id=task.node_id,
                attempt=1,
                owner="worker-b",
                status="completed",
                output=b'{"who": "worker-b"}',
            )
        )
        assert reply.applied
    assert metrics_a.sample("worker_leases_lost_total") == 1
    assert metrics_a.count(Outcome.COMPLETED) == metrics_a.count(Outcome.FAILED) == 0
    assert await ignored_reports(coordinator, run_id) == []  # A never reported
    run = await coordinator.get_run(run_id)
    assert run.state == pb.RUN_STATE_COMPLETED
    assert json.loads(run.tasks[0].output) == {"who": "worker-b"}


async def test_a_worker_cut_off_from_the_coordinator_stops_before_its_lease_can_expire(
    coordinator: CoordinatorHandle, http_server: RecordingServer
) -> None:
    """Self-fencing: the cut-off worker's execution ends before the worker taking over starts its own."""
    work = FirstHeld()
    http_server.on("/work", work)
    await coordinator.register(http_workflow("fenced", http_server.url("/work"), retry={"max_attempts": 1}))
    host, port = coordinator.addr.rsplit(":", 1)
    proxy = TcpProxy(host, int(port))
    await proxy.start()
    try:
        config_a = worker_config(proxy.addr, coordinator.redis_url, worker_id="worker-a", stall_after_s=2.0)
        async with in_process_worker(config_a) as a:
            run_id = await coordinator.start_run("fenced", {"n": 1})
            await asyncio.wait_for(work.first.arrived.wait(), 20)
            proxy.cut()  # A keeps Redis and the HTTP server, loses the coordinator
            config_b = worker_config(coordinator.addr, coordinator.redis_url, worker_id="worker-b")
            async with in_process_worker(config_b) as b:
                # A stops its execution on its own, within the TTL, without any answer from the coordinator.
                await asyncio.wait_for(work.requests[0].disconnected.wait(), TEST_TTL_S)
                # B reclaims A's idle message once the lease expired, and runs the task.
                run = await coordinator.wait_for_run(run_id, timeout_s=20)
                assert run.state == pb.RUN_STATE_COMPLETED
                assert json.loads(run.tasks[0].output) == {"who": "request 2"}
                assert run.tasks[0].lease_owner == "worker-b"
                assert b.worker.metrics.sample("worker_messages_reclaimed_total") == 1
                metrics_a = a.worker.metrics
            proxy.restore()
        first, second = work.requests[0], work.requests[1]
        assert first.disconnected_at is not None
        assert first.disconnected_at < second.at, "A's execution ended before B's began: never two at once"
        assert metrics_a.sample("worker_leases_lost_total") == 1
        assert metrics_a.sample("worker_lease_renewal_errors_total") >= 1
        assert metrics_a.count(Outcome.COMPLETED) == metrics_a.count(Outcome.FAILED) == 0
        assert await ignored_reports(coordinator, run_id) == []  # A never reported
    finally:
        await proxy.stop()


async def test_a_worker_that_cannot_report_is_flagged_stalled_and_reports_once_back(
    coordinator: CoordinatorHandle, http_server: RecordingServer
) -> None:
    """The progress watchdog: a worker holding a finished task it cannot report fails liveness until it can."""
    gate = Gate({"done": True})
    http_server.on("/stuck", gate)
    await coordinator.register(http_workflow("stuck", http_server.url("/stuck"), retry={"max_attempts": 1}))
    host, port = coordinator.addr.rsplit(":", 1)
    proxy = TcpProxy(host, int(port))
    await proxy.start()
    try:
        config = worker_config(proxy.addr, coordinator.redis_url, worker_id="worker-s", stall_after_s=1.5)
        async with in_process_worker(config) as worker:
            run_id = await coordinator.start_run("stuck", {"n": 1})
            await asyncio.wait_for(gate.arrived.wait(), 20)
            proxy.cut()
            gate.release()  # the execution finishes; its report cannot get through

            async def stalled() -> bool:
                status, body = await get_json(worker.worker.metrics_port, "/livez")
                return status == 503 and any("stalled" in p for p in body.get("problems", []))

            await eventually(stalled, timeout_s=10, what="the worker flagged as stalled")
            proxy.restore()
            run = await coordinator.wait_for_run(run_id, timeout_s=30)
            assert run.state == pb.RUN_STATE_COMPLETED
            assert json.loads(run.tasks[0].output) == {"done": True}

            async def live() -> bool:
                status, _ = await get_json(worker.worker.metrics_port, "/livez")
                return status == 200

            await eventually(live, timeout_s=10, what="live again once the report went through")
    finally:
        await proxy.stop()


async def test_renewal_transport_errors_are_not_a_lost_lease(
    coordinator: CoordinatorHandle, http_server: RecordingServer
) -> None:
    """A network blip shorter than the TTL: renewals fail, are retried, and the task finishes where it runs."""
    gate = Gate({"done": True})
    http_server.on("/blip", gate)
    await coordinator.register(http_workflow("blip", http_server.url("/blip")))
    host, port = coordinator.addr.rsplit(":", 1)
    proxy = TcpProxy(host, int(port))
    await proxy.start()
    try:
        # TTL 10 s: the blip (two failed renewals) plus gRPC's reconnect backoff
        # stays well inside the 9 s after which the worker would fence itself.
        config = worker_config(proxy.addr, coordinator.redis_url, lease_ttl_s=10)
        async with in_process_worker(config) as worker:
            metrics = worker.worker.metrics
            run_id = await coordinator.start_run("blip", {"n": 1})
            await asyncio.wait_for(gate.arrived.wait(), 20)
            proxy.cut()
            await eventually(
                lambda: flag(metrics.sample("worker_lease_renewal_errors_total") >= 2), timeout_s=15, what="errors"
            )
            proxy.restore()
            renewed = metrics.sample("worker_lease_renewals_total")
            await eventually(
                lambda: flag(metrics.sample("worker_lease_renewals_total") > renewed), timeout_s=15, what="renewal"
            )
            gate.release()
            run = await coordinator.wait_for_run(run_id, timeout_s=20)
        assert run.state == pb.RUN_STATE_COMPLETED
        assert run.tasks[0].attempt == 1
        assert metrics.sample("worker_leases_lost_total") == 0
        assert metrics.count(Outcome.COMPLETED) == 1
        assert gate.arrivals == 1
        assert not http_server.to("/blip")[0].disconnected.is_set()
    finally:
        await proxy.stop()


async def test_sigterm_mid_task_releases_and_another_worker_completes_it(
    coordinator: CoordinatorHandle, http_server: RecordingServer, worker_process: StartProcess
) -> None:
    """Graceful drain: after the grace period the task is cancelled, its lease released, nothing reported."""
    work = FirstHeld()
    http_server.on("/work", work)
    await coordinator.register(http_workflow("drain", http_server.url("/work")))
    # A long TTL: only the release (not lease expiry + reclaim) can explain a quick takeover.
    ttl = "20"
    a = worker_process(process_env(coordinator, LEASE_TTL_SECONDS=ttl, WORKER_SHUTDOWN_GRACE_SECONDS="0.5"))
    run_id = await coordinator.start_run("drain", {"n": 1})
    await asyncio.wait_for(work.first.arrived.wait(), 30)
    config_b = worker_config(coordinator.addr, coordinator.redis_url, lease_ttl_s=int(ttl))
    async with in_process_worker(config_b) as b:
        sent = time.monotonic()
        a.signal(signal.SIGTERM)
        assert await a.wait(timeout_s=10) == 0
        assert time.monotonic() - sent < 5  # grace 0.5 s + release + close
        run = await coordinator.wait_for_run(run_id, timeout_s=10)
        assert time.monotonic() - sent < 10  # well under the 20 s TTL: re-dispatched at once
        assert b.worker.metrics.count(Outcome.COMPLETED) == 1
    assert run.state == pb.RUN_STATE_COMPLETED
    assert json.loads(run.tasks[0].output) == {"who": "request 2"}
    assert run.tasks[0].attempt == 1  # the interruption was not reported as a failure
    assert run.tasks[0].error == ""
    assert await ignored_reports(coordinator, run_id) == []
    assert work.requests[0].disconnected.is_set()
    [interrupted] = [line for line in a.log_lines() if "interrupted by shutdown" in line.get("event", "")]
    assert "lease released=True" in interrupted["event"]
    # Per-task log lines carry the task's identity (JSON, from telemetry.configure_logging).
    task = run.tasks[0]
    assert (interrupted["task_id"], interrupted["run_id"], interrupted["node_id"]) == (task.id, run_id, "call")
    assert (interrupted["attempt"], interrupted["worker_id"], interrupted["service"]) == (1, a.worker_id, "worker")


async def test_sigterm_lets_in_flight_tasks_finish_within_the_grace_period(
    coordinator: CoordinatorHandle, http_server: RecordingServer, worker_process: StartProcess
) -> None:
    gate = Gate({"finished": "during drain"})
    http_server.on("/drain", gate)
    await coordinator.register(http_workflow("graceful", http_server.url("/drain")))
    a = worker_process(process_env(coordinator, WORKER_SHUTDOWN_GRACE_SECONDS="20"))
    run_id = await coordinator.start_run("graceful", {"n": 1})
    await asyncio.wait_for(gate.arrived.wait(), 30)
    a.signal(signal.SIGTERM)

    async def draining() -> bool:
        status, body = await get_json(a.metrics_port, "/readyz")
        return status == 503 and any("draining" in p for p in body["problems"])

    await eventually(draining, timeout_s=10, what="worker draining")
    gate.release()
    assert await a.wait(timeout_s=10) == 0  # exits once drained, long before the 20 s grace
    run = await coordinator.wait_for_run(run_id, timeout_s=10)
    assert run.state == pb.RUN_STATE_COMPLETED
    assert json.loads(run.tasks[0].output) == {"finished": "during drain"}
    assert run.tasks[0].lease_owner == a.worker_id
    assert gate.arrivals == 1


async def test_sigkill_mid_task_is_taken_over_within_ttl_plus_reclaim(
    coordinator: CoordinatorHandle, http_server: RecordingServer, worker_process: StartProcess
) -> None:
    work = FirstHeld()
    http_server.on("/work", work)
    await coordinator.register(http_workflow("killed", http_server.url("/work")))
    a = worker_process(process_env(coordinator))
    run_id = await coordinator.start_run("killed", {"n": 1})
    await asyncio.wait_for(work.first.arrived.wait(), 30)
    config_b = worker_config(coordinator.addr, coordinator.redis_url)
    async with in_process_worker(config_b) as b:
        killed = time.monotonic()
        a.signal(signal.SIGKILL)
        await a.wait(timeout_s=5)
        run = await coordinator.wait_for_run(run_id, timeout_s=20)
        elapsed = time.monotonic() - killed
        reclaimed = b.worker.metrics.sample("worker_messages_reclaimed_total")
    bound = config_b.lease_ttl_s + config_b.reclaim_interval_s
    assert elapsed <= bound + 2.0, f"took {elapsed:.1f}s, bound {bound}s (+2 s to run and report)"
    assert run.state == pb.RUN_STATE_COMPLETED
    assert json.loads(run.tasks[0].output) == {"who": "request 2"}
    assert run.tasks[0].attempt == 1
    assert reclaimed == 1
    # The same idempotency key on both executions: the task id.
    assert [r.headers["Idempotency-Key"] for r in work.requests] == [run.tasks[0].id] * 2


async def test_task_longer_than_the_ttl_completes_exactly_once(
    coordinator: CoordinatorHandle, http_server: RecordingServer
) -> None:
    duration_s = 2.5 * TEST_TTL_S

    async def slow(_: web.Request, __: Recorded) -> web.StreamResponse:
        await asyncio.sleep(duration_s)  # the task's own work, longer than the lease TTL
        return web.json_response({"slow": True})

    http_server.on("/slow", slow)
    await coordinator.register(http_workflow("long", http_server.url("/slow"), timeout_seconds=30))
    workers: list[InProcessWorker] = []
    async with (
        in_process_worker(worker_config(coordinator.addr, coordinator.redis_url)) as a,
        in_process_worker(worker_config(coordinator.addr, coordinator.redis_url)) as b,
    ):
        workers = [a, b]
        run = await coordinator.wait_for_run(await coordinator.start_run("long", {"n": 1}), timeout_s=30)
    assert run.state == pb.RUN_STATE_COMPLETED
    assert len(http_server.to("/slow")) == 1
    metrics = [w.worker.metrics for w in workers]
    assert sum(m.count(Outcome.COMPLETED) for m in metrics) == 1
    assert sum(m.sample("worker_messages_reclaimed_total") for m in metrics) == 0
    assert sum(m.count(Outcome.DROPPED) for m in metrics) == 0
    assert sum(m.sample("worker_lease_renewals_total") for m in metrics) >= 2
    assert await ignored_reports(coordinator, run.id) == []


async def test_idempotency_key_is_the_same_across_retries_and_redeliveries(
    coordinator: CoordinatorHandle, http_server: RecordingServer, worker_process: StartProcess
) -> None:
    gate = Gate()
    seen: list[Recorded] = []

    async def flaky(request: web.Request, record: Recorded) -> web.StreamResponse:
        seen.append(record)
        if len(seen) == 1:
            return web.json_response({"error": "try again"}, status=500)  # attempt 1 fails: a retry
        if len(seen) == 2:
            return await gate(request, record)  # attempt 2: its worker gets SIGKILLed
        return web.json_response({"charged": True})  # attempt 2, redelivered to another worker

    http_server.on("/charge", flaky)
    retry = {"max_attempts": 3, "initial_backoff_seconds": 0.1}
    await coordinator.register(http_workflow("charge", http_server.url("/charge"), retry=retry))
    a = worker_process(process_env(coordinator))
    run_id = await coordinator.start_run("charge", {"n": 1})
    await asyncio.wait_for(gate.arrived.wait(), 30)
    async with in_process_worker(worker_config(coordinator.addr, coordinator.redis_url)):
        a.signal(signal.SIGKILL)
        run = await coordinator.wait_for_run(run_id, timeout_s=20)
    assert run.state == pb.RUN_STATE_COMPLETED
    assert run.tasks[0].attempt == 2
    assert [r.method for r in seen] == ["POST"] * 3
    assert [r.headers["Idempotency-Key"] for r in seen] == [run.tasks[0].id] * 3
