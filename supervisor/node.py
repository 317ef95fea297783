"""A node: children started in stages, stopped in the reverse order.

Stages make the dependencies explicit: for a worker node the language
servers come first and the worker starts only once both report SERVING; in
`--dev` the coordinator comes before them. Shutdown (SIGTERM/SIGINT, or a
fatal error of any child) walks the stages backwards, one stage at a time:

1. the worker is sent SIGTERM and drains for its grace period (in-flight
   tasks finish and report; the rest are handed back), then
2. the language servers are sent SIGTERM and drain, then
3. (in `--dev`) the coordinator stops.

Each child that overstays its stop timeout is SIGKILLed with its process
group. A second signal (`force`) cuts every wait short: all remaining groups
are SIGKILLed at once. Finally every process still below the supervisor
(an orphan that escaped its group) is killed and reaped, so nothing outlives
the node.

Exit codes (`Node.run` returns them; `python -m supervisor` exits with them):
0 clean shutdown, 1 a start-up step failed, 3 a child's configuration is
invalid, 4 a child is crash-looping, 5 forced stop by a second signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from supervisor.child import ChildSpec
from supervisor.errors import ChildConfigError, CrashLoop, StartFailed, SupervisorError
from supervisor.logstream import LogSink
from supervisor.reaper import Reaper
from supervisor.restart_policy import RestartPolicy
from supervisor.supervision import ChildSupervisor

__all__ = [
    "EXIT_CONFIG",
    "EXIT_CRASH_LOOP",
    "EXIT_FAILED",
    "EXIT_FORCED",
    "EXIT_OK",
    "AfterReady",
    "Node",
    "NodeSettings",
    "Stage",
]

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 3
EXIT_CRASH_LOOP = 4
EXIT_FORCED = 5

_SWEEP_WAIT_S = 5.0


@dataclass(frozen=True)
class Stage:
    """Children started together; the next stage starts once all of them are ready."""

    name: str
    children: Sequence[ChildSpec]


@dataclass(frozen=True, kw_only=True)
class NodeSettings:
    restart_backoff_s: float
    restart_backoff_max_s: float
    crash_loop_limit: int
    crash_loop_window_s: float
    watch_interval_s: float
    ready_timeout_s: float


AfterReady = Callable[["Node"], Awaitable[None]]


class Node:
    """Runs stages of children under one reaper. Build, then `await run(stop=..., force=...)` once."""

    def __init__(
        self,
        stages: Sequence[Stage],
        settings: NodeSettings,
        *,
        sink: LogSink | None = None,
        keep_pids: Callable[[], set[int]] = set,
    ) -> None:
        self._stages = stages
        self._settings = settings
        self._sink = sink or LogSink()
        self._keep_pids = keep_pids
        self._reaper = Reaper()
        self._force = asyncio.Event()
        self._fatal: SupervisorError | None = None
        self._failed = asyncio.Event()
        self._jobs: list[ChildSupervisor] = []
        #: Set once every stage is ready.
        self.ready = asyncio.Event()

    def fail(self, error: SupervisorError) -> None:
        """Stops the node because of `error` (the first one wins); its exit code follows from its type."""
        if self._fatal is None:
            self._fatal = error
            log.error("%s", error, extra={"error_type": type(error).__name__})
        self._failed.set()

    def _supervisor(self, spec: ChildSpec) -> ChildSupervisor:
        s = self._settings
        return ChildSupervisor(
            spec,
            reaper=self._reaper,
            sink=self._sink,
            policy=RestartPolicy(
                initial_s=s.restart_backoff_s,
                max_s=s.restart_backoff_max_s,
                limit=s.crash_loop_limit,
                window_s=s.crash_loop_window_s,
            ),
            watch_interval_s=s.watch_interval_s,
            ready_timeout_s=s.ready_timeout_s,
            force=self._force,
            on_fatal=self.fail,
        )

    async def run_job(self, spec: ChildSpec) -> int:
        """Runs a one-shot child (no restart) to completion and returns its exit code.

        Only valid from `after_ready`. A node shutdown stops the job first; it
        then returns its exit code as it ended.
        """
        job = self._supervisor(spec)
        self._jobs.append(job)
        await job.run()
        return job.result if job.result is not None else EXIT_FAILED

    async def run(self, *, stop: asyncio.Event, force: asyncio.Event, after_ready: AfterReady | None = None) -> int:
        """Starts the stages, serves until `stop` (or a fatal error), shuts down in reverse order.

        Returns the exit code. `force` (a second signal) turns the shutdown into SIGKILLs.
        """
        self._reaper.install()
        try:
            async with asyncio.TaskGroup() as tg:
                reaping = tg.create_task(self._reaper.run(), name="reaper")
                forwarding = tg.create_task(self._forward_force(force), name="force")
                started: list[list[tuple[ChildSupervisor, asyncio.Task[None]]]] = []
                for stage in self._stages:
                    supervisors = [self._supervisor(spec) for spec in stage.children]
                    started.append([(s, tg.create_task(s.run(), name=s.spec.name)) for s in supervisors])
                    if not await self._until_ready(stage, supervisors, stop):
                        break
                else:
                    log.info("node ready", extra={"stages": [s.name for s in self._stages]})
                    self.ready.set()
                extra: asyncio.Task[None] | None = None
                if after_ready is not None and self.ready.is_set():
                    extra = tg.create_task(self._guarded(after_ready), name="after-ready")
                await _first_event(stop, self._failed)
                log.info("node stopping", extra={"reason": "failure" if self._fatal else "signal"})
                if extra is not None:
                    for job in self._jobs:
                        job.stop()
                    extra.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await extra
                for stage_started in reversed(started):
                    for supervisor, _ in stage_started:
                        supervisor.stop()
                    for _, task in stage_started:
                        await task
                forwarding.cancel()
                reaping.cancel()
        finally:
            self._sweep()
            self._reaper.uninstall()
        return self._exit_code(force)

    async def _guarded(self, after_ready: AfterReady) -> None:
        try:
            await after_ready(self)
        except SupervisorError as exc:
            self.fail(exc)

    async def _forward_force(self, force: asyncio.Event) -> None:
        await force.wait()
        log.warning("second signal: killing every child now")
        self._force.set()

    async def _until_ready(self, stage: Stage, supervisors: list[ChildSupervisor], stop: asyncio.Event) -> bool:
        """Waits for the stage's children to be ready; False when the node must stop first."""
        waiting: asyncio.Future[Any] = asyncio.gather(*(s.ready.wait() for s in supervisors))
        stopping: asyncio.Future[Any] = asyncio.ensure_future(_first_event(stop, self._failed))
        try:
            done, _ = await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if waiting in done:
                log.info("stage %s ready", stage.name, extra={"stage": stage.name})
                return True
            return False
        finally:
            for pending in (waiting, stopping):
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending

    def _sweep(self) -> None:
        """Kills and reaps every process still below the supervisor (except `keep_pids` trees)."""
        me = psutil.Process(os.getpid())
        keep: set[int] = set()
        for pid in self._keep_pids():
            keep.add(pid)
            with contextlib.suppress(psutil.Error):
                keep.update(p.pid for p in psutil.Process(pid).children(recursive=True))
        self._reaper.reap()
        try:
            leftovers = [p for p in me.children(recursive=True) if p.pid not in keep and _alive(p)]
        except psutil.Error:
            return
        for proc in leftovers:
            log.warning("killing leftover process %s (%s)", proc.pid, _name(proc), extra={"child_pid": proc.pid})
            with contextlib.suppress(psutil.Error):
                proc.kill()
        if leftovers:
            psutil.wait_procs(leftovers, timeout=_SWEEP_WAIT_S)
            self._reaper.reap()

    def _exit_code(self, force: asyncio.Event) -> int:
        if isinstance(self._fatal, ChildConfigError):
            return EXIT_CONFIG
        if isinstance(self._fatal, CrashLoop):
            return EXIT_CRASH_LOOP
        if isinstance(self._fatal, StartFailed):
            return EXIT_FAILED
        if self._fatal is not None:
            return EXIT_FAILED
        if force.is_set():
            return EXIT_FORCED
        return EXIT_OK


async def _first_event(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
        for w in waits:
            with contextlib.suppress(asyncio.CancelledError):
                await w


def _alive(proc: psutil.Process) -> bool:
    """Running, and not a zombie: a killed process waiting to be reaped is no leftover."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _name(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:200] or proc.name()
    except psutil.Error:
        return "?"
