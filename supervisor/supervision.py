"""Keeps one child running: start, readiness, watching, restart with backoff, stop.

A `ChildSupervisor` runs one life of its child after another until it is
asked to stop (or its child turns out to be unrecoverable):

    spawn ──► ready? (gRPC health SERVING within the ready timeout)
                │
                ▼
            watch: exit │ memory above the ceiling │ health failing │ stop asked
                │
                ▼
            stop the process (SIGTERM, timeout, SIGKILL its group)
                │
                ▼
            restart after backoff ── or ── report a fatal error and return

Fatal errors (the child exited with code 3, a crash loop) are handed to the
node through `on_fatal` rather than raised, so the node can still shut the
other children down in order (the worker drains first).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from supervisor.child import ChildProcess, ChildSpec, drain_pump
from supervisor.errors import ChildConfigError, CrashLoop, SupervisorError
from supervisor.health import HealthProbe
from supervisor.logstream import LogSink
from supervisor.metrics import CHILD_CPU, CHILD_RSS, CHILD_RUNNING, CHILD_STARTS
from supervisor.reaper import Reaper, describe_exit
from supervisor.resources import TreeSampler
from supervisor.restart_policy import RestartPolicy

__all__ = ["EXIT_CONFIG_CHILD", "ChildSupervisor"]

log = logging.getLogger(__name__)

#: A child exiting with this code says its configuration is invalid (the project's convention).
EXIT_CONFIG_CHILD = 3
#: Consecutive failed health checks of a running child before it is restarted.
UNHEALTHY_AFTER = 3
_READY_POLL_S = 0.1
_PROBE_TIMEOUT_S = 1.0

T = TypeVar("T")


class _End(enum.Enum):
    STOP = "stop"
    EXITED = "exited"
    MEMORY = "memory"
    UNHEALTHY = "unhealthy"
    NOT_READY = "not_ready"


async def _first(*coros: Awaitable[Any]) -> tuple[int, Any]:
    """Runs the awaitables until the first finishes; cancels and awaits the rest.

    Returns the index of the first one and its result (its exception is re-raised).
    """
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for index, task in enumerate(tasks):
            if task in done:
                return index, task.result()
        raise AssertionError("asyncio.wait returned nothing done")  # pragma: no cover
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


class ChildSupervisor:
    """Supervises one `ChildSpec`. `run()` owns every process it starts; `stop()` ends it."""

    def __init__(
        self,
        spec: ChildSpec,
        *,
        reaper: Reaper,
        sink: LogSink,
        policy: RestartPolicy,
        watch_interval_s: float,
        ready_timeout_s: float,
        force: asyncio.Event,
        on_fatal: Callable[[SupervisorError], None],
    ) -> None:
        self.spec = spec
        #: Set once the child first became ready (SERVING, or started when it has no health service).
        self.ready = asyncio.Event()
        #: The exit code of a one-shot job, once it ran.
        self.result: int | None = None
        self.starts = 0
        self._reaper = reaper
        self._sink = sink
        self._policy = policy
        self._watch_interval_s = watch_interval_s
        self._ready_timeout_s = ready_timeout_s
        self._force = force
        self._on_fatal = on_fatal
        self._stop = asyncio.Event()
        self.current: ChildProcess | None = None

    def stop(self) -> None:
        """Asks `run()` to stop the child and return; idempotent, harmless before start."""
        self._stop.set()

    async def run(self) -> None:
        """Runs the child (again and again, unless it is a one-shot job) until `stop()` or a fatal error."""
        name = self.spec.name
        while not self._stop.is_set():
            try:
                proc = ChildProcess.spawn(self.spec, self._reaper)
            except OSError as exc:  # e.g. EAGAIN at the PID limit: counts as a failed start
                log.error("cannot start %s: %s", name, exc, extra={"child": name})
                delay = self._policy.record_exit(now=time.monotonic(), uptime_s=0.0)
                if delay is None:
                    self._on_fatal(CrashLoop(f"{name} could not be started ({exc}); stopping the node"))
                    return
                await self._pause(delay)
                continue
            self.current = proc
            self.starts += 1
            CHILD_RUNNING.labels(name).set(1)
            pump = asyncio.ensure_future(proc.pump_logs(self._sink))
            try:
                end = await self._life(proc)
                returncode = await proc.stop(force=self._force, reason=_reason(end))
            finally:
                if proc.running:  # cancelled mid-life: never leave the process behind
                    proc.kill_group()
                await drain_pump(pump)
                CHILD_RUNNING.labels(name).set(0)
            if end is _End.STOP:
                return
            if not self.spec.restart:
                self.result = returncode
                return
            delay = self._restart_delay(proc, end, returncode)
            if delay is None:
                return
            CHILD_STARTS.labels(name, end.value).inc()
            await self._pause(delay)

    async def _pause(self, delay_s: float) -> None:
        """Waits out a restart delay, cut short by `stop()`."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay_s):
                await self._stop.wait()

    def _restart_delay(self, proc: ChildProcess, end: _End, returncode: int) -> float | None:
        """Decides what follows an unplanned end; None after reporting a fatal error."""
        name = self.spec.name
        if end is _End.MEMORY:
            return 0.0
        if end is _End.EXITED and returncode == EXIT_CONFIG_CHILD:
            self._on_fatal(
                ChildConfigError(
                    f"{name} exited with code {EXIT_CONFIG_CHILD}: its configuration is invalid "
                    "(see its log lines); not restarting it"
                )
            )
            return None
        what = describe_exit(returncode) if end is _End.EXITED else _reason(end)
        delay = self._policy.record_exit(now=time.monotonic(), uptime_s=proc.uptime_s)
        if delay is None:
            self._on_fatal(
                CrashLoop(
                    f"{name} is crash-looping: it ended {self._policy.recent_exits} times within "
                    f"{self._policy.window_s:g}s (limit {self._policy.limit}; last: {what}); stopping the node"
                )
            )
            return None
        log.warning(
            "%s %s after %.1fs; restarting in %.1fs",
            name,
            what,
            proc.uptime_s,
            delay,
            extra={"child": name, "reason": end.value, "restart_in_s": delay},
        )
        return delay

    async def _life(self, proc: ChildProcess) -> _End:
        if self.spec.health_addr is None:
            self.ready.set()
        else:
            try:
                index, _ = await _first(self._stop.wait(), proc.wait(), self._wait_serving())
            except _NotReady:
                log.warning(
                    "%s did not report SERVING within %gs",
                    self.spec.name,
                    self._ready_timeout_s,
                    extra={"child": self.spec.name, "addr": self.spec.health_addr},
                )
                return _End.NOT_READY
            if index == 0:
                return _End.STOP
            if index == 1:
                return _End.EXITED
            if not self.ready.is_set():
                log.info(
                    "%s is serving", self.spec.name, extra={"child": self.spec.name, "addr": self.spec.health_addr}
                )
            self.ready.set()
        index, end = await _first(self._stop.wait(), proc.wait(), self._monitor(proc))
        if index == 0:
            return _End.STOP
        if index == 1:
            return _End.EXITED
        result: _End = end
        return result

    async def _wait_serving(self) -> None:
        """Returns once the child reports SERVING.

        Raises:
            _NotReady: not within the ready timeout.
        """
        assert self.spec.health_addr is not None
        deadline = time.monotonic() + self._ready_timeout_s
        async with HealthProbe(self.spec.health_addr, self.spec.health_service) as probe:
            while not await probe.serving(_PROBE_TIMEOUT_S):
                if time.monotonic() > deadline:
                    raise _NotReady
                await asyncio.sleep(_READY_POLL_S)

    async def _monitor(self, proc: ChildProcess) -> _End:
        """Samples memory/CPU (and health) every interval; returns when the child must be restarted."""
        name = self.spec.name
        sampler = TreeSampler(proc.pid)
        limit = self.spec.memory_limit_bytes
        failures = 0
        probe = HealthProbe(self.spec.health_addr, self.spec.health_service) if self.spec.health_addr else None
        async with probe if probe is not None else contextlib.nullcontext():
            while True:
                await asyncio.sleep(self._watch_interval_s)
                sample = sampler.sample()
                if sample is None:
                    continue  # gone: the exit is about to be reaped
                CHILD_RSS.labels(name).set(sample.rss_bytes)
                CHILD_CPU.labels(name).set(sample.cpu_percent)
                if limit and sample.rss_bytes > limit:
                    log.warning(
                        "%s uses %d MiB (limit %d MiB); restarting it",
                        name,
                        sample.rss_bytes >> 20,
                        limit >> 20,
                        extra={"child": name, "rss_bytes": sample.rss_bytes, "limit_bytes": limit},
                    )
                    return _End.MEMORY
                if probe is not None:
                    if await probe.serving(min(_PROBE_TIMEOUT_S * 3, self._watch_interval_s)):
                        failures = 0
                    else:
                        failures += 1
                        log.warning("%s failed a health check (%d in a row)", name, failures, extra={"child": name})
                        if failures >= UNHEALTHY_AFTER:
                            return _End.UNHEALTHY


class _NotReady(Exception):
    """Internal: the child did not report SERVING within the ready timeout."""


def _reason(end: _End) -> str:
    return {
        _End.STOP: "shutting down",
        _End.EXITED: "exited",
        _End.MEMORY: "memory above the ceiling",
        _End.UNHEALTHY: f"health check failed {UNHEALTHY_AFTER} times in a row",
        _End.NOT_READY: "not serving within the ready timeout",
    }[end]
