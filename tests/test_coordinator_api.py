"""The gRPC surface: named INVALID_ARGUMENTs, NOT_FOUND, auth, health, configuration and migrations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import asyncpg
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.config import CoordinatorConfig
from coordinator.errors import ConfigError
from coordinator.schema import apply_migrations
from protos import workflow_pb2 as pb
from protos import workflow_pb2_grpc as pb_grpc
from tests.coordinator_harness import REPO_ROOT, CoordinatorHandle, running_coordinator

RUN = "00000000-0000-7000-8000-000000000001"


async def _status(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code(), caught.value.details() or ""


@pytest.mark.parametrize(
    ("rpc", "request_message", "field"),
    [
        (
            "ReportTaskResult",
            pb.ReportTaskResultRequest(run_id=RUN, owner="w", attempt=1, status="completed"),
            "task_id",
        ),
        (
            "ReportTaskResult",
            pb.ReportTaskResultRequest(task_id=RUN, run_id=RUN, owner="w", attempt=0, status="completed"),
            "attempt",
        ),
        (
            "ReportTaskResult",
            pb.ReportTaskResultRequest(task_id=RUN, run_id=RUN, owner="w", attempt=1, status="done"),
            "status",
        ),
        (
            "ReportTaskResult",
            pb.ReportTaskResultRequest(task_id=RUN, run_id=RUN, owner="w", attempt=1, status="failed"),
            "error",
        ),
        (
            "ReportTaskResult",
            pb.ReportTaskResultRequest(task_id=RUN, run_id=RUN, owner="w", attempt=1, status="completed", output=b"{x"),
            "output",
        ),
        (
            "ReportTaskResult",
            pb.ReportTaskResultRequest(task_id=RUN, run_id=RUN, attempt=1, status="completed"),
            "owner",
        ),
        ("ReleaseTaskLease", pb.ReleaseTaskLeaseRequest(task_id=RUN, run_id=RUN, owner="w", attempt=0), "attempt"),
        ("ReleaseTaskLease", pb.ReleaseTaskLeaseRequest(task_id=RUN, owner="w", attempt=1), "run_id"),
        ("RegisterWorkflow", pb.RegisterWorkflowRequest(), "definition"),
        ("RegisterWorkflow", pb.RegisterWorkflowRequest(definition=b"not json"), "definition"),
        ("StartRun", pb.StartRunRequest(), "workflow"),
        ("StartRun", pb.StartRunRequest(workflow="w", input=b"[1,"), "input"),
        ("StartRun", pb.StartRunRequest(workflow="w", version=-1), "version"),
        ("GetRun", pb.GetRunRequest(run_id="17"), "run_id"),
        ("CancelRun", pb.CancelRunRequest(), "run_id"),
        ("ListDeadLetters", pb.ListDeadLettersRequest(limit=-5), "limit"),
    ],
)
async def test_invalid_requests_name_the_field(
    coordinator: CoordinatorHandle, rpc: str, request_message: Any, field: str
) -> None:
    code, details = await _status(getattr(coordinator.stub, rpc)(request_message))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(f"{field}:"), details


async def test_invalid_definition_is_refused_over_grpc_naming_node_and_field(coordinator: CoordinatorHandle) -> None:
    bad = {"name": "bad", "nodes": [{"id": "a", "type": "HTTP", "request": {"url": "http://x", "method": "YELL"}}]}
    code, details = await _status(
        coordinator.stub.RegisterWorkflow(pb.RegisterWorkflowRequest(definition=json.dumps(bad).encode()))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("node 'a' field 'request.method': unknown method 'YELL'")


async def test_unknown_workflow_and_run_are_not_found(coordinator: CoordinatorHandle) -> None:
    code, details = await _status(coordinator.stub.StartRun(pb.StartRunRequest(workflow="ghost")))
    assert (code, details) == (grpc.StatusCode.NOT_FOUND, "workflow 'ghost' is not registered")
    code, _ = await _status(coordinator.stub.GetRun(pb.GetRunRequest(run_id=RUN)))
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = await _status(coordinator.stub.StartRun(pb.StartRunRequest(workflow="ghost", version=3)))
    assert code == grpc.StatusCode.NOT_FOUND


async def test_registering_creates_versions_and_identical_definitions_are_not_duplicated(
    coordinator: CoordinatorHandle,
) -> None:
    doc: dict[str, Any] = {"name": "v", "nodes": [{"id": "a", "type": "HTTP", "request": {"url": "http://x/1"}}]}
    first = await coordinator.stub.RegisterWorkflow(pb.RegisterWorkflowRequest(definition=json.dumps(doc).encode()))
    again = await coordinator.stub.RegisterWorkflow(pb.RegisterWorkflowRequest(definition=json.dumps(doc).encode()))
    doc["nodes"][0]["request"]["url"] = "http://x/2"
    second = await coordinator.stub.RegisterWorkflow(pb.RegisterWorkflowRequest(definition=json.dumps(doc).encode()))
    assert [(r.version, r.created) for r in (first, again, second)] == [(1, True), (1, False), (2, True)]
    pinned = await coordinator.stub.StartRun(pb.StartRunRequest(workflow="v", version=1))
    latest = await coordinator.stub.StartRun(pb.StartRunRequest(workflow="v"))
    assert (pinned.version, latest.version) == (1, 2)
    run = await coordinator.get_run(pinned.run_id)
    assert json.loads(run.tasks[0].input)["url"] == "http://x/1", "a run keeps the version it started with"


async def test_bearer_token_guards_everything_but_health(database_url: str, redis_url: str) -> None:
    async with running_coordinator(database_url, redis_url, token="s3cret") as (_, handle):
        reply = await handle.stub.ListDeadLetters(pb.ListDeadLettersRequest())
        assert list(reply.dead_letters) == []
        async with grpc.aio.insecure_channel(handle.addr) as bare:
            code, details = await _status(
                pb_grpc.WorkflowServiceStub(bare).ListDeadLetters(pb.ListDeadLettersRequest())
            )
            assert code == grpc.StatusCode.UNAUTHENTICATED
            assert "s3cret" not in details
            wrong = pb_grpc.WorkflowServiceStub(bare).ListDeadLetters(
                pb.ListDeadLettersRequest(), metadata=(("authorization", "Bearer nope"),)
            )
            assert (await _status(wrong))[0] == grpc.StatusCode.UNAUTHENTICATED
            stream = pb_grpc.WorkflowServiceStub(bare).WatchRun(pb.WatchRunRequest(run_id=RUN))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in stream:
                    pass
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            health = await health_pb2_grpc.HealthStub(bare).Check(
                health_pb2.HealthCheckRequest(service="workflow.v1.WorkflowService")
            )
            assert health.status == health_pb2.HealthCheckResponse.SERVING


async def test_migrations_apply_once(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        assert await apply_migrations(conn) == ["0001_init.sql"]
        assert await apply_migrations(conn) == []
        assert await conn.fetchval("SELECT count(*) FROM schema_migrations") == 1
        partitions = await conn.fetchval(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'task_instances'::regclass"
        )
        assert partitions == 16
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({}, "DATABASE_URL"),
        ({"DATABASE_URL": "postgresql://x", "STREAM_SHARDS": "zero"}, "STREAM_SHARDS"),
        ({"DATABASE_URL": "postgresql://x", "STREAM_SHARDS": "0"}, "STREAM_SHARDS"),
        ({"DATABASE_URL": "postgresql://x", "REDIS_ADDR": "nowhere"}, "REDIS_ADDR"),
        ({"DATABASE_URL": "postgresql://x", "COORDINATOR_LISTEN_ADDR": "0.0.0.0"}, "COORDINATOR_LISTEN_ADDR"),
        ({"DATABASE_URL": "postgresql://x", "COORDINATOR_TLS_CERT": "/c.pem"}, "COORDINATOR_TLS_KEY"),
        ({"DATABASE_URL": "postgresql://x", "SWEEP_INTERVAL_SECONDS": "-1"}, "SWEEP_INTERVAL_SECONDS"),
    ],
)
def test_bad_configuration_names_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        CoordinatorConfig.from_env(env)


def test_configuration_defaults_bind_to_loopback() -> None:
    config = CoordinatorConfig.from_env({"DATABASE_URL": "postgresql://x"})
    assert config.listen_addr == "127.0.0.1:50051"
    assert config.redis_url == "redis://127.0.0.1:6379/0"


def test_serve_with_bad_configuration_exits_3_naming_the_variable() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)}
    env["PYTHONPATH"] = str(REPO_ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "coordinator", "serve"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 3
    assert "DATABASE_URL" in result.stderr
