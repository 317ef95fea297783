"""The worker as a service: health and metrics endpoints, code steps, auth, the entry point, FLUSHALL."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
import redis.asyncio as aioredis

from protos import workflow_pb2 as pb
from protos import workflow_pb2_grpc as pb_grpc
from protos.taskstream import queue_streams
from supervisor.embedded import free_port
from tests.coordinator_harness import CoordinatorHandle, running_coordinator
from tests.helpers import eventually
from tests.worker.conftest import http_workflow
from tests.worker.langserver_fake import Server, start_langserver
from tests.worker.support import (
    REPO_ROOT,
    RecordingServer,
    WorkerProcess,
    in_process_worker,
    pending_per_consumer,
    worker_config,
)
from worker.metrics import Outcome


def fetch(port: int, path: str) -> tuple[int, str]:
    """A blocking GET (usable from a thread while the event loop is blocked)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def aget(port: int, path: str) -> tuple[int, str]:
    return await asyncio.to_thread(fetch, port, path)


async def flag(value: bool) -> bool:
    return value


@pytest.fixture
async def langserver() -> AsyncIterator[Server]:
    server, handle = await start_langserver(with_health=True)
    yield handle
    await server.stop(None)


async def test_health_and_metrics_endpoints(coordinator: CoordinatorHandle) -> None:
    dead_langserver = f"127.0.0.1:{free_port()}"
    config = worker_config(coordinator.addr, coordinator.redis_url, lang_server_addrs={"python": dead_langserver})
    async with in_process_worker(config) as worker:
        port = worker.worker.metrics_port
        assert (await aget(port, "/livez"))[0] == 200

        async def not_ready_naming_python() -> bool:
            status, body = await aget(port, "/readyz")
            return status == 503 and "python language server" in body

        await eventually(not_ready_naming_python, timeout_s=10, what="readiness names the language server")
        status, body = await aget(port, "/readyz")
        problems = json.loads(body)["problems"]
        assert all(p.startswith("python language server") for p in problems), problems  # coordinator, redis fine
        status, metrics = await aget(port, "/metrics")
        assert status == 200
        assert "worker_slots_available 4.0" in metrics
        assert "worker_slots_used 0.0" in metrics
        for name in (
            "worker_tasks_total",
            "worker_schedule_to_start_seconds",
            "worker_task_execution_seconds",
            "worker_task_end_to_end_seconds",
            "worker_leases_lost_total",
            "worker_messages_reclaimed_total",
            "worker_dead_lettered_total",
        ):
            assert name in metrics
        assert (await aget(port, "/nope"))[0] == 404


async def test_ready_when_everything_answers(coordinator: CoordinatorHandle, langserver: Server) -> None:
    config = worker_config(coordinator.addr, coordinator.redis_url, lang_server_addrs={"js": langserver.addr})
    async with in_process_worker(config) as worker:
        port = worker.worker.metrics_port

        async def ready() -> bool:
            return (await aget(port, "/readyz"))[0] == 200

        await eventually(ready, timeout_s=10, what="ready")
        assert worker.worker.metrics.sample("worker_ready") == 1


async def test_a_blocked_event_loop_fails_liveness(coordinator: CoordinatorHandle) -> None:
    async with in_process_worker(worker_config(coordinator.addr, coordinator.redis_url)) as worker:
        port = worker.worker.metrics_port
        worker.worker.health.loop_stall_s = 0.5
        seen: list[tuple[int, str]] = []

        def probe() -> None:
            time.sleep(1.2)
            seen.append(fetch(port, "/livez"))

        prober = threading.Thread(target=probe)
        prober.start()
        time.sleep(2.0)  # noqa: ASYNC251 -- deliberately blocks the event loop the worker runs on
        await asyncio.to_thread(prober.join)
        [(status, body)] = seen
        assert status == 503
        assert "event loop unresponsive" in body

        async def live_again() -> bool:
            return (await aget(port, "/livez"))[0] == 200

        await eventually(live_again, timeout_s=5, what="live again")


async def test_code_steps_go_to_the_language_server(coordinator: CoordinatorHandle, langserver: Server) -> None:
    definition = {
        "name": "code",
        "nodes": [
            {"id": "echo", "type": "CODE", "runtime": "python", "code": "echo", "input": {"v": "${input.n}"}},
            {
                "id": "big",
                "type": "CODE",
                "runtime": "python",
                "code": "big",
                "depends_on": ["echo"],
                "retry": {"max_attempts": 1},
            },
        ],
    }
    await coordinator.register(definition)
    config = worker_config(
        coordinator.addr,
        coordinator.redis_url,
        queues=("python",),
        lang_server_addrs={"python": langserver.addr},
        max_output_bytes=2048,
    )
    async with in_process_worker(config):
        run = await coordinator.wait_for_run(await coordinator.start_run("code", {"n": 5}), timeout_s=20)
    echo, big = run.tasks
    assert json.loads(echo.output) == {"v": 5}
    assert langserver.servicer.seen[0].request.task_id == echo.id
    # An output over the limit fails the task loudly; nothing is truncated.
    assert big.state == pb.TASK_STATE_FAILED
    assert big.error == "task output is 5002 bytes, over the limit of 2048 bytes (WORKER_MAX_OUTPUT_BYTES)"
    assert run.state == pb.RUN_STATE_FAILED


async def test_bearer_token_is_sent_to_the_coordinator(
    database_url: str, redis_url: str, redis_client: aioredis.Redis, http_server: RecordingServer
) -> None:
    async with running_coordinator(database_url, redis_url, token="s3cret") as (_, coordinator):
        await coordinator.register(http_workflow("auth", http_server.url("/ok")))
        run_ids = [await coordinator.start_run("auth", {"n": n}) for n in range(5)]
        streams = queue_streams(["http"], 2)

        async def published() -> bool:
            return sum([await redis_client.xlen(s) for s in streams]) == len(run_ids)

        await eventually(published, what="dispatches published")
        anonymous = worker_config(coordinator.addr, redis_url, concurrency=1)
        async with in_process_worker(anonymous) as worker:
            metrics = worker.worker.metrics
            await eventually(lambda: flag(metrics.count(Outcome.COORDINATOR_ERROR) >= 2), what="refused twice")
            # Refused, it backs off instead of pulling the whole backlog into its PEL.
            assert (await pending_per_consumer(redis_client, streams))[worker.id] <= 3
        assert http_server.requests == []  # never executed without a lease
        # The message was left pending (not acked); the task waits for a worker that may lease it.
        authorised = worker_config(coordinator.addr, redis_url, coordinator_token="s3cret")
        async with in_process_worker(authorised):
            # The pending message of the stopped worker goes idle and is reclaimed.
            runs = [await coordinator.wait_for_run(run_id, timeout_s=30) for run_id in run_ids]
        assert [run.state for run in runs] == [pb.RUN_STATE_COMPLETED] * len(runs)


async def test_worker_survives_a_redis_flushall(
    coordinator: CoordinatorHandle, redis_client: aioredis.Redis, http_server: RecordingServer
) -> None:
    await coordinator.register(http_workflow("flush", http_server.url("/ok")))
    async with in_process_worker(worker_config(coordinator.addr, coordinator.redis_url)):
        first = await coordinator.wait_for_run(await coordinator.start_run("flush", {"n": 1}), timeout_s=20)
        await redis_client.flushall()  # streams and the consumer group are gone (NOGROUP)
        second = await coordinator.wait_for_run(await coordinator.start_run("flush", {"n": 2}), timeout_s=20)
    assert (first.state, second.state) == (pb.RUN_STATE_COMPLETED, pb.RUN_STATE_COMPLETED)


# -- the entry point -------------------------------------------------------------------


def run_module(env: dict[str, str], timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker"],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), **env},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def error_lines(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def test_bad_configuration_exits_3_naming_the_variable() -> None:
    result = run_module({"WORKER_CONCURRENCY": "lots"})
    assert result.returncode == 3
    [line] = error_lines(result.stderr)
    assert line["level"] == "error"
    assert line["variable"] == "WORKER_CONCURRENCY"
    assert "WORKER_CONCURRENCY: must be an integer, got 'lots'" in line["event"]


def test_short_ttl_is_refused_at_start() -> None:
    result = run_module({"LEASE_TTL_SECONDS": "5"})
    assert result.returncode == 3
    assert "LEASE_TTL_SECONDS" in error_lines(result.stderr)[0]["event"]


def test_busy_metrics_port_exits_3(redis_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_module({"REDIS_ADDR": redis_url, "WORKER_METRICS_PORT": str(port)})
    assert result.returncode == 3
    assert error_lines(result.stderr)[-1]["variable"] == "WORKER_METRICS_PORT"


async def test_sigterm_while_waiting_for_the_coordinator_exits_0(
    redis_url: str, worker_process: Callable[[dict[str, str]], WorkerProcess]
) -> None:
    """No shard count published yet (no coordinator): the worker waits, and still stops cleanly."""
    process = worker_process({"REDIS_ADDR": redis_url, "COORDINATOR_ADDR": f"127.0.0.1:{free_port()}"})

    async def waiting() -> bool:
        return any("waiting for the shard count" in line.get("event", "") for line in process.log_lines())

    await eventually(waiting, timeout_s=20, what="worker waiting for the shard count")
    process.signal(signal.SIGTERM)
    assert await process.wait(timeout_s=10) == 0
    assert any(line.get("event") == "worker stopped" for line in process.log_lines())


async def test_new_shards_are_read_without_a_restart(
    redis_url: str, redis_client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    import worker.intake

    monkeypatch.setattr(worker.intake, "SHARD_RECHECK_S", 0.1)
    await redis_client.set("wf:shards", 2)
    config = worker_config(f"127.0.0.1:{free_port()}", redis_url)
    async with in_process_worker(config) as running:

        async def streams(count: int) -> bool:
            return len(running.worker.streams) == count

        await eventually(lambda: streams(2), what="two streams")
        await redis_client.set("wf:shards", 4)  # the coordinator restarted with more shards
        await eventually(lambda: streams(4), what="four streams")
        await redis_client.set("wf:shards", 1)  # lowered: keep reading what is served
        await redis_client.xadd("wf:tasks:http:3", {"task": "not a task"})  # a new shard's reader is live
        metrics = running.worker.metrics
        await eventually(lambda: flag(metrics.count(Outcome.INVALID) == 1), what="message on shard 3 read")
        assert running.worker.streams == tuple(f"wf:tasks:http:{n}" for n in range(4))


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (skips without the openssl command)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"),
            *("-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_tls_and_token_to_the_coordinator(
    database_url: str, redis_url: str, http_server: RecordingServer, certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    async with running_coordinator(database_url, redis_url, tls_cert=cert, tls_key=key, token="tls-token") as (
        server,
        _,
    ):
        addr = f"127.0.0.1:{server.port}"
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        metadata = (("authorization", "Bearer tls-token"),)
        async with grpc.aio.secure_channel(addr, credentials) as channel:
            stub = pb_grpc.WorkflowServiceStub(channel)
            definition = json.dumps(http_workflow("tls", http_server.url("/ok"))).encode()
            await stub.RegisterWorkflow(pb.RegisterWorkflowRequest(definition=definition), metadata=metadata)
            reply = await stub.StartRun(pb.StartRunRequest(workflow="tls", input=b'{"n": 1}'), metadata=metadata)
            config = worker_config(addr, redis_url, coordinator_tls_ca=cert.read_bytes(), coordinator_token="tls-token")
            async with in_process_worker(config):

                async def completed() -> bool:
                    run = (await stub.GetRun(pb.GetRunRequest(run_id=reply.run_id), metadata=metadata)).run
                    return bool(run.state == pb.RUN_STATE_COMPLETED)

                await eventually(completed, timeout_s=20, what="run completed over TLS")
    assert len(http_server.to("/ok")) == 1
