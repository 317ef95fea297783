"""The HTTP endpoint every HTTP step of the fault storm calls, recording each request.

Each record keeps the request's `Idempotency-Key` (the task id), its path, and
when the handler started and ended (or was cut off by the client going away),
so the suite can check that no two executions of one task overlapped and that
every side effect belongs to a known task.

Routes:
    POST /work?ms=N   sleeps N ms, answers {"ok": true, "key": ...}
    POST /flaky       503 on the first call of each key, 200 afterwards
    POST /poison      SIGKILLs the worker process that sent it (a task that crashes workers)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import psutil
from aiohttp import web


@dataclass
class Record:
    key: str
    path: str
    started: float
    ended: float | None = None
    status: int = 0


@dataclass
class Sink:
    records: list[Record] = field(default_factory=list)
    flaky_calls: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    poison_kills: list[int] = field(default_factory=list)
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/work", self._work)
        app.router.add_post("/flaky", self._flaky)
        app.router.add_post("/poison", self._poison)
        return app

    def _record(self, request: web.Request) -> Record:
        record = Record(key=request.headers.get("Idempotency-Key", ""), path=request.path, started=time.time())
        self.records.append(record)
        return record

    async def _work(self, request: web.Request) -> web.Response:
        record = self._record(request)
        try:
            await asyncio.sleep(int(request.query.get("ms", "0")) / 1000)
            record.status = 200
            return web.json_response({"ok": True, "key": record.key})
        finally:
            record.ended = time.time()

    async def _flaky(self, request: web.Request) -> web.Response:
        record = self._record(request)
        self.flaky_calls[record.key] += 1
        record.status = 503 if self.flaky_calls[record.key] == 1 else 200
        record.ended = time.time()
        if record.status == 503:
            return web.json_response({"error": "try again"}, status=503)
        return web.json_response({"ok": True, "calls": self.flaky_calls[record.key]})

    async def _poison(self, request: web.Request) -> web.Response:
        record = self._record(request)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        pid = await asyncio.to_thread(_pid_of_peer, peer[1]) if peer else None
        if pid is not None and pid != os.getpid():
            self.poison_kills.append(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        record.ended = time.time()
        record.status = 500
        return web.json_response({"error": "poison"}, status=500)


def _pid_of_peer(port: int) -> int | None:
    """The process that owns the client end of a loopback connection from `port`."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.laddr and conn.laddr.port == port and conn.pid is not None:
            return conn.pid
    return None


@contextlib.asynccontextmanager
async def running_sink() -> AsyncIterator[Sink]:
    sink = Sink()
    runner = web.AppRunner(sink.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    sink.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield sink
    finally:
        await runner.cleanup()
