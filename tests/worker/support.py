"""Real things the worker tests run against: an HTTP server, workers, a TCP proxy.

* :class:`RecordingServer` — a real aiohttp server that records every request
  and answers by a per-path behaviour (hold until released, fail, echo...).
* :class:`InProcessWorker` — a production :class:`worker.Worker` running in the
  test's event loop (to read its metrics and stop it gracefully).
* :class:`WorkerProcess` — ``python -m worker`` in a subprocess, for tests that
  SIGTERM or SIGKILL it.
* :class:`TcpProxy` — forwards a port to another and can cut every connection,
  to take the coordinator away from one worker only.
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
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiohttp import web
from multidict import CIMultiDictProxy

from supervisor.embedded import free_port
from worker import Worker, WorkerConfig

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Short lease for failure tests, through the documented test-only path.
TEST_TTL_S = 3


@dataclass
class Recorded:
    """One request the server received."""

    method: str
    path: str
    headers: CIMultiDictProxy[str]
    body: bytes
    at: float
    #: The client's (host, port): the same for requests on one kept-alive connection.
    peer: tuple[str, int] | None = None
    #: Set when the client went away before the handler answered.
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    #: `time.monotonic()` when the client went away (None while connected).
    disconnected_at: float | None = None

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


Behaviour = Callable[[web.Request, Recorded], Awaitable[web.StreamResponse]]


async def ok_json(_: web.Request, __: Recorded) -> web.StreamResponse:
    return web.json_response({"ok": True})


class Gate:
    """A behaviour that holds each request until released, then answers `response`."""

    def __init__(self, response: Any = None) -> None:
        self.response = {"released": True} if response is None else response
        self.arrivals = 0
        self.arrived = asyncio.Event()
        self._open = asyncio.Event()
        self.in_flight = 0
        self.max_in_flight = 0

    def release(self) -> None:
        self._open.set()

    async def __call__(self, _: web.Request, record: Recorded) -> web.StreamResponse:
        self.arrivals += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.arrived.set()
        try:
            await self._open.wait()
        except asyncio.CancelledError:
            record.disconnected_at = time.monotonic()
            record.disconnected.set()
            raise
        finally:
            self.in_flight -= 1
        return web.json_response(self.response)


class RecordingServer:
    """A real HTTP server on 127.0.0.1 that records requests and answers per path."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.behaviours: dict[str, Behaviour] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        # handler_cancellation: a client that disconnects cancels its handler, as in production servers.
        app = web.Application(handler_args={"max_field_size": 65536})
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def on(self, path: str, behaviour: Behaviour) -> None:
        self.behaviours[path] = behaviour

    def to(self, path: str) -> list[Recorded]:
        return [r for r in self.requests if r.path == path]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        record = Recorded(
            method=request.method,
            path=request.path,
            headers=request.headers,
            body=await request.read(),
            at=time.monotonic(),
            peer=request.transport.get_extra_info("peername") if request.transport else None,
        )
        self.requests.append(record)
        behaviour = self.behaviours.get(request.path, ok_json)
        return await behaviour(request, record)


def worker_config(coordinator_addr: str, redis_url: str, **overrides: Any) -> WorkerConfig:
    """A config for an in-process test worker: short TTL (test-only path), free metrics port."""
    base = WorkerConfig(
        coordinator_addr=coordinator_addr,
        redis_url=redis_url,
        queues=("http",),
        concurrency=4,
        lease_ttl_s=TEST_TTL_S,
        allow_short_lease_ttl=True,
        worker_id=f"test-worker-{uuid.uuid4().hex[:8]}",
        metrics_port=0,
        shutdown_grace_s=5.0,
    )
    return replace(base, **overrides)


class InProcessWorker:
    """A production worker running as a task of the test's event loop."""

    def __init__(self, worker: Worker, task: asyncio.Task[None], stop: asyncio.Event) -> None:
        self.worker = worker
        self.task = task
        self.stop_event = stop

    @property
    def id(self) -> str:
        return self.worker.config.worker_id

    async def stop(self, timeout_s: float = 30.0) -> None:
        self.stop_event.set()
        async with asyncio.timeout(timeout_s):
            await asyncio.shield(self.task)


@contextlib.asynccontextmanager
async def in_process_worker(config: WorkerConfig) -> AsyncIterator[InProcessWorker]:
    """Runs a worker until the block ends (then stops it gracefully and waits)."""
    stop = asyncio.Event()
    async with Worker.open(config) as worker:
        task = asyncio.create_task(worker.run(stop), name=f"worker {config.worker_id}")
        running = InProcessWorker(worker, task, stop)
        try:
            yield running
        finally:
            stop.set()
            await task


class WorkerProcess:
    """`python -m worker` in a subprocess; its JSON logs go to a temporary file."""

    def __init__(self, env: dict[str, str]) -> None:
        self.metrics_port = free_port()
        self.worker_id = env.get("WORKER_ID") or f"proc-worker-{uuid.uuid4().hex[:8]}"
        self.env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "WORKER_ID": self.worker_id,
            "WORKER_METRICS_PORT": str(self.metrics_port),
            **env,
        }
        self.log = tempfile.NamedTemporaryFile(prefix="worker-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "worker"],
            env=self.env,
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )

    def logs(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.logs().splitlines():
            with contextlib.suppress(ValueError):
                lines.append(json.loads(line))
        return lines

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    async def wait(self, timeout_s: float) -> int:
        """Waits for the process to exit (without blocking the event loop); returns its code."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"worker did not exit within {timeout_s}s; logs:\n{self.logs()[-3000:]}")
            await asyncio.sleep(0.02)
        return self.proc.returncode

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a target address; `cut()` drops every connection until `restore()`."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.cut_off = False
        self.port = 0

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_off:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(pipe(reader, up_writer))
                tg.create_task(pipe(up_reader, writer))
        finally:
            self._writers.difference_update((writer, up_writer))

    def cut(self) -> None:
        """Closes every open connection and refuses new ones."""
        self.cut_off = True
        for writer in list(self._writers):
            writer.transport.abort()

    def restore(self) -> None:
        self.cut_off = False

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def pending_per_consumer(client: Any, streams: list[str]) -> dict[str, int]:
    """Sums the group's pending entries per consumer over `streams` (XPENDING summary form)."""
    from protos.taskstream import CONSUMER_GROUP

    totals: dict[str, int] = {}
    for stream in streams:
        try:
            summary = await client.xpending(stream, CONSUMER_GROUP)
        except Exception:  # no such stream or group yet: nothing pending
            continue
        for row in summary.get("consumers") or []:
            name = row["name"].decode() if isinstance(row["name"], bytes) else row["name"]
            totals[name] = totals.get(name, 0) + int(row["pending"])
    return totals
