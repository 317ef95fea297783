"""Health and metrics endpoints, and the checks behind them.

``GET /livez`` — liveness. The HTTP server runs in its own thread, so it still
answers when the event loop is blocked, and says so: the loop beats every
0.5 s and a beat older than ``LOOP_STALL_S`` makes the worker not live. The
progress watchdog also fails liveness: a worker that holds tasks but has
neither completed a task nor renewed a lease for ``WORKER_STALL_SECONDS``
(2 x TTL by default) has lost those leases anyway, and a restart frees its slots.

``GET /readyz`` — readiness: the coordinator, Redis and every language server
answered the last probe (every 5 s), the probe result is fresh, and the worker
is not draining.

``GET /metrics`` — the Prometheus exposition of the worker's registry.

Bodies are JSON objects with ``ok`` and, when not ok, ``problems``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

from prometheus_client import CONTENT_TYPE_LATEST

from worker.metrics import WorkerMetrics
from worker.slots import SlotPool

__all__ = ["HealthMonitor", "HealthServer", "HealthState", "Progress"]

logger = logging.getLogger(__name__)

LOOP_BEAT_INTERVAL_S: Final = 0.5
#: A loop that has not beaten for this long is blocked: not live.
LOOP_STALL_S: Final = 5.0
READINESS_INTERVAL_S: Final = 5.0
PROBE_TIMEOUT_S: Final = 3.0
WATCHDOG_INTERVAL_S: Final = 1.0

Probe = Callable[[], Awaitable[None]]


class Progress:
    """When the worker last made progress: a task reported or a lease renewed."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def note(self) -> None:
        self.last = time.monotonic()


class HealthState:
    """What the endpoints report. Written by the event loop, read by the HTTP thread.

    Each attribute is replaced whole (never mutated in place), so a reader sees
    either the old or the new value.
    """

    def __init__(self, *, loop_stall_s: float = LOOP_STALL_S) -> None:
        self.loop_stall_s = loop_stall_s
        self.loop_beat = time.monotonic()
        self.ready_problems: tuple[str, ...] = ("not probed yet",)
        self.ready_checked_at = 0.0
        self.stall: str | None = None
        self.draining = False

    def liveness(self) -> tuple[bool, list[str]]:
        problems = []
        silent = time.monotonic() - self.loop_beat
        if silent > self.loop_stall_s:
            problems.append(f"event loop unresponsive for {silent:.1f} s")
        if self.stall is not None:
            problems.append(self.stall)
        return not problems, problems

    def readiness(self) -> tuple[bool, list[str]]:
        problems = list(self.ready_problems)
        age = time.monotonic() - self.ready_checked_at
        if self.ready_checked_at and age > 3 * READINESS_INTERVAL_S:
            problems.append(f"readiness last probed {age:.0f} s ago")
        if self.draining:
            problems.append("draining: the worker is stopping")
        alive, dead = self.liveness()
        if not alive:
            problems.extend(dead)
        return not problems, problems


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: HealthState
    metrics: WorkerMetrics


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, self.server.metrics.render(), CONTENT_TYPE_LATEST)
            return
        if path in ("/livez", "/healthz"):
            ok, problems = self.server.state.liveness()
        elif path == "/readyz":
            ok, problems = self.server.state.readiness()
        else:
            self._send(404, b'{"error":"not found"}', "application/json")
            return
        body: dict[str, Any] = {"ok": ok}
        if problems:
            body["problems"] = problems
        self._send(200 if ok else 503, json.dumps(body).encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # probes every few seconds are not worth a log line


class HealthServer:
    """Serves /livez, /readyz and /metrics from a thread of its own."""

    def __init__(self, host: str, port: int, state: HealthState, metrics: WorkerMetrics) -> None:
        self._address = (host, port)
        self._state = state
        self._metrics = metrics
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        """Binds and starts serving; returns the port (useful with port 0).

        Raises:
            OSError: the address cannot be bound.
        """
        server = _Server(self._address, _Handler)
        server.state = self._state
        server.metrics = self._metrics
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="worker-health", daemon=True)
        self._thread.start()
        port: int = server.server_address[1]
        return port

    def stop(self) -> None:
        """Stops serving and closes the socket. Idempotent; blocks up to about half a second."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join()


class HealthMonitor:
    """The event-loop side: heartbeat, readiness probes and the progress watchdog."""

    def __init__(
        self,
        state: HealthState,
        metrics: WorkerMetrics,
        *,
        probes: Mapping[str, Probe],
        slots: SlotPool,
        progress: Progress,
        stall_threshold_s: float,
    ) -> None:
        self._state = state
        self._metrics = metrics
        self._probes = dict(probes)
        self._slots = slots
        self._progress = progress
        self._stall_threshold_s = stall_threshold_s

    async def run(self) -> None:
        """Runs the three loops until cancelled."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._heartbeat())
            tg.create_task(self._readiness())
            tg.create_task(self._watchdog())

    async def _heartbeat(self) -> None:
        while True:
            before = time.monotonic()
            self._state.loop_beat = before
            await asyncio.sleep(LOOP_BEAT_INTERVAL_S)
            self._metrics.loop_lag.set(max(0.0, time.monotonic() - before - LOOP_BEAT_INTERVAL_S))

    async def probe_once(self) -> tuple[str, ...]:
        """Runs every readiness probe concurrently; returns the problems found (empty when ready)."""

        async def run(name: str, probe: Probe) -> str | None:
            try:
                async with asyncio.timeout(PROBE_TIMEOUT_S):
                    await probe()
            except TimeoutError:
                return f"{name}: no answer within {PROBE_TIMEOUT_S:g} s"
            except Exception as exc:  # any failure of a probe means "not reachable"
                return f"{name}: {exc}"
            return None

        results = await asyncio.gather(*(run(name, probe) for name, probe in self._probes.items()))
        return tuple(problem for problem in results if problem is not None)

    async def _readiness(self) -> None:
        previous: tuple[str, ...] = ()
        while True:
            problems = await self.probe_once()
            self._state.ready_problems = problems
            self._state.ready_checked_at = time.monotonic()
            self._metrics.ready.set(0 if problems else 1)
            if problems != previous:
                if problems:
                    logger.warning("worker not ready: %s", "; ".join(problems))
                else:
                    logger.info("worker ready")
                previous = problems
            await asyncio.sleep(READINESS_INTERVAL_S)

    async def _watchdog(self) -> None:
        busy_since: float | None = None
        while True:
            now = time.monotonic()
            held = self._slots.used
            if held == 0:
                busy_since = None
                stall = None
            else:
                busy_since = busy_since if busy_since is not None else now
                quiet = now - max(busy_since, self._progress.last)
                stall = (
                    f"stalled: holding {held} task(s) with no task reported or lease renewed for {quiet:.0f} s"
                    if quiet > self._stall_threshold_s
                    else None
                )
            if stall != self._state.stall and (stall is None) != (self._state.stall is None):
                if stall:
                    logger.error("progress watchdog: %s", stall)
                else:
                    logger.info("progress watchdog: progress resumed")
            self._state.stall = stall
            self._metrics.stalled.set(1 if stall else 0)
            await asyncio.sleep(WATCHDOG_INTERVAL_S)
