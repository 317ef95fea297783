"""Runs a real coordinator for tests: in-process, or as a `python -m coordinator serve` subprocess.

Both talk to the test's own PostgreSQL database and Redis. The handle offers the
few calls most tests need (register, start, get, wait) over real gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from coordinator.config import CoordinatorConfig
from coordinator.server import Coordinator
from protos import workflow_pb2 as pb
from protos import workflow_pb2_grpc as pb_grpc
from supervisor.embedded import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
TERMINAL_RUN_STATES = (pb.RUN_STATE_COMPLETED, pb.RUN_STATE_FAILED, pb.RUN_STATE_CANCELLED)

#: Settings that keep tests quick: frequent sweeps, short stall detection.
TEST_SETTINGS: dict[str, Any] = {
    "stream_shards": 2,
    "sweep_interval_s": 0.2,
    "stall_after_s": 1.0,
    "relay_poll_interval_s": 0.2,
}


@dataclass
class CoordinatorHandle:
    addr: str
    database_url: str
    redis_url: str
    channel: grpc.aio.Channel
    stub: Any = field(init=False)

    def __post_init__(self) -> None:
        self.stub = pb_grpc.WorkflowServiceStub(self.channel)

    async def register(self, definition: dict[str, Any]) -> int:
        reply = await self.stub.RegisterWorkflow(pb.RegisterWorkflowRequest(definition=json.dumps(definition).encode()))
        version: int = reply.version
        return version

    async def start_run(self, workflow: str, input: Any = None, *, idempotency_key: str = "", version: int = 0) -> str:
        reply = await self.stub.StartRun(
            pb.StartRunRequest(
                workflow=workflow,
                version=version,
                input=json.dumps({} if input is None else input).encode(),
                idempotency_key=idempotency_key,
            )
        )
        run_id: str = reply.run_id
        return run_id

    async def get_run(self, run_id: str) -> pb.Run:
        reply = await self.stub.GetRun(pb.GetRunRequest(run_id=run_id))
        run: pb.Run = reply.run
        return run

    async def wait_for_run(self, run_id: str, timeout_s: float = 30.0) -> pb.Run:
        """Polls until the run is terminal; raises AssertionError with the last state on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            run = await self.get_run(run_id)
            if run.state in TERMINAL_RUN_STATES:
                return run
            if time.monotonic() > deadline:
                states = {t.node_id: pb.TaskState.Name(t.state) for t in run.tasks}
                raise AssertionError(f"run {run_id} still {pb.RunState.Name(run.state)} after {timeout_s}s: {states}")
            await asyncio.sleep(0.05)


def test_config(database_url: str, redis_url: str, **overrides: Any) -> CoordinatorConfig:
    settings = {**TEST_SETTINGS, **overrides}
    return CoordinatorConfig(database_url=database_url, redis_url=redis_url, listen_addr="127.0.0.1:0", **settings)


@contextlib.asynccontextmanager
async def running_coordinator(
    database_url: str, redis_url: str, **overrides: Any
) -> AsyncIterator[tuple[Coordinator, CoordinatorHandle]]:
    """An in-process coordinator, owned by this context: stopped and awaited on exit."""
    coordinator = Coordinator(test_config(database_url, redis_url, **overrides))
    task = asyncio.create_task(coordinator.run(), name="coordinator")
    ready = asyncio.create_task(coordinator.ready.wait())
    try:
        done, _ = await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED, timeout=30)
        if task in done:
            task.result()  # re-raises the start-up failure
        assert ready in done, "coordinator did not become ready within 30s"
        addr = f"127.0.0.1:{coordinator.port}"
        metadata = (("authorization", f"Bearer {overrides['token']}"),) if overrides.get("token") else None
        channel = grpc.aio.insecure_channel(addr, interceptors=[_Metadata(metadata)] if metadata else None)
        try:
            yield (
                coordinator,
                CoordinatorHandle(addr=addr, database_url=database_url, redis_url=redis_url, channel=channel),
            )
        finally:
            await channel.close()
    finally:
        ready.cancel()
        coordinator.stop()
        try:
            await asyncio.wait_for(task, timeout=30)
        except TimeoutError:
            raise AssertionError("the in-process coordinator did not stop within 30s") from None


class _Metadata(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        details = details._replace(metadata=(*(details.metadata or ()), *self._metadata))
        return await continuation(details, request)


class CoordinatorProcess:
    """`python -m coordinator serve` in a subprocess, for tests that SIGKILL it."""

    def __init__(self, database_url: str, redis_url: str, **env: str) -> None:
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "DATABASE_URL": database_url,
            "REDIS_ADDR": redis_url,
            "COORDINATOR_LISTEN_ADDR": self.addr,
            "STREAM_SHARDS": "2",
            "SWEEP_INTERVAL_SECONDS": "0.2",
            "STALL_AFTER_SECONDS": "1",
            "RELAY_POLL_INTERVAL_SECONDS": "0.2",
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        # A file, not a pipe: nobody drains a pipe, and a full one would block the process.
        self.log = tempfile.NamedTemporaryFile(prefix="coordinator-", suffix=".log", delete=False)  # noqa: SIM115

    def spawn(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "coordinator", "serve"],
            env=self.env,
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )

    def logs(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    async def start(self) -> None:
        self.spawn()
        await self.wait_serving()

    async def wait_serving(self, timeout_s: float = 30.0) -> None:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + timeout_s
        async with grpc.aio.insecure_channel(self.addr) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise AssertionError(f"coordinator exited with {self.proc.returncode}: {self.logs()[-2000:]}")
                with contextlib.suppress(grpc.aio.AioRpcError):
                    reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                if time.monotonic() > deadline:
                    raise AssertionError("coordinator subprocess did not start serving")
                await asyncio.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def close(self) -> None:
        self.kill()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)

    def terminate(self, timeout_s: float = 15.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)
