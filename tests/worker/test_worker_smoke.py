"""The whole loop once: coordinator -> Redis -> worker -> HTTP server -> report."""

from __future__ import annotations

import json

from protos import workflow_pb2 as pb
from tests.coordinator_harness import CoordinatorHandle
from tests.worker.conftest import http_workflow
from tests.worker.support import RecordingServer, in_process_worker, worker_config


async def test_http_task_runs_end_to_end(coordinator: CoordinatorHandle, http_server: RecordingServer) -> None:
    await coordinator.register(http_workflow("smoke", http_server.url("/hook")))
    async with in_process_worker(worker_config(coordinator.addr, coordinator.redis_url)) as worker:
        run_id = await coordinator.start_run("smoke", {"n": 7})
        run = await coordinator.wait_for_run(run_id, timeout_s=20)
    assert run.state == pb.RUN_STATE_COMPLETED, run.error
    assert json.loads(run.tasks[0].output) == {"ok": True}
    [request] = http_server.to("/hook")
    assert request.json() == {"run": 7}
    assert request.headers["Idempotency-Key"] == run.tasks[0].id
    assert worker.worker.metrics.sample("worker_tasks_total", outcome="completed") == 1
