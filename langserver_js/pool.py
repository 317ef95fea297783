"""The pool of sandbox processes that runs executions, one per process at a time.

The pool has `pool_processes` slots. Each slot is a loop owned by `run()`: start a
sandbox process, wait until it has an isolate ready, offer it to callers, and once
a caller gives it back wait for the next isolate; the process is replaced after
`recycle_after` executions, when it keeps more than half the RSS limit after an
execution, or as soon as it dies, is killed, or stops answering. A
fatal V8 error therefore costs the one execution that caused it, never the server.

A caller borrows an idle process directly (as from a connection pool) and does the
pipe I/O itself, so an execution costs no hand-off between tasks.
`max_concurrency` bounds how many executions wait or run at once; slots beyond it are
warm spares that hide a respawn. One watchdog task samples the resident memory of
the borrowed processes and kills any over `rss_limit_mb`.

Stopping is staged: `stop()` turns away new executions and retires idle processes;
borrowed ones finish their execution first; `run()` returns once every process is
closed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from langserver_js.config import ServerConfig
from langserver_js.errors import PoolClosed, PoolStartError, WorkerDied, WorkerError
from langserver_js.protocol import ExecuteJob, ExecutionResult, SandboxSettings, Status
from langserver_js.worker_process import WorkerProcess, spawn_worker

__all__ = ["CompletedExecution", "WorkerPool"]

logger = logging.getLogger(__name__)

_RESPAWN_BACKOFF_INITIAL_S: Final = 0.1
_RESPAWN_BACKOFF_MAX_S: Final = 10.0
# How long a process gets, after answering, to dispose of the isolate it used and
# prepare the next one (normally a few milliseconds), on top of the kill grace. An
# isolate still busy in a builtin that ignores termination blocks its disposal:
# such code outlived its execution, and the process is killed.
_READY_TIMEOUT_S: Final = 1.0
# The directory holding the `langserver_js` package, for the sandbox's PYTHONPATH.
_PACKAGE_ROOT: Final = str(Path(__file__).resolve().parent.parent)


@dataclass(frozen=True, slots=True)
class CompletedExecution:
    """A result with the time its sandbox took, measured by the server."""

    result: ExecutionResult
    duration_ms: float
    worker_pid: int


class WorkerPool:
    """Runs jobs on a fixed number of warm sandbox processes. See the module docstring."""

    def __init__(self, config: ServerConfig) -> None:
        self._config = config
        self._settings = SandboxSettings(
            heap_limit_mb=config.heap_limit_mb,
            data_limit_mb=config.data_limit_mb,
            max_code_bytes=config.max_code_bytes,
            max_input_bytes=config.max_input_bytes,
            max_output_bytes=config.max_output_bytes,
            max_log_bytes=config.max_log_bytes,
            log_level=config.log_level,
        )
        self._command = (sys.executable, "-s", "-m", "langserver_js.sandbox", self._settings.to_json())
        # A fresh environment: nothing of the server's (credentials included) reaches the sandbox.
        self._env = {"PYTHONPATH": _PACKAGE_ROOT, "PATH": os.defpath, "LC_ALL": "C.UTF-8"}
        # Processes with a ready isolate; None tells waiting callers the pool closed.
        self._idle: asyncio.Queue[WorkerProcess | None] = asyncio.Queue()
        self._busy: set[WorkerProcess] = set()
        self._admission = asyncio.Semaphore(config.max_concurrency)
        self._recycle_rss_bytes = (config.rss_limit_mb << 20) // 2
        self._started = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._slots_ready: set[int] = set()
        self._slots_running = 0
        self._stopping = False

    async def run(self) -> None:
        """Runs the slots and the watchdog until `stop()`; returns when every process is closed.

        Raises:
            PoolStartError: a sandbox process could not start before the pool was
                ready (a broken installation, a bad limit); nothing is retried then.
        """
        self._slots_running = self._config.pool_processes
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._watchdog(), name="sandbox-watchdog")
                for index in range(self._config.pool_processes):
                    tg.create_task(self._run_slot(index), name=f"sandbox-slot-{index}")
        finally:
            self._stopping = True
            self._idle.put_nowait(None)

    async def wait_started(self) -> None:
        """Returns once every slot has a sandbox process with an isolate ready."""
        await self._started.wait()

    def stop(self) -> None:
        """Turns away new executions, lets running ones finish, closes every process.

        Idempotent; safe before `run()`.
        """
        if self._stopping:
            return
        self._stopping = True
        self._stop_requested.set()
        self._idle.put_nowait(None)

    async def execute(self, job: ExecuteJob) -> CompletedExecution:
        """Runs one job on the next idle sandbox process.

        Raises:
            PoolClosed: the pool is stopping.

        Cancelling the caller kills the execution's process (nobody wants the result).
        """
        if self._stopping:
            raise PoolClosed("the server is shutting down")
        async with self._admission:
            worker = await self._borrow(job)
            self._busy.add(worker)
            started = time.perf_counter()
            try:
                result = await worker.result(
                    hard_deadline_s=job.timeout_s + self._config.kill_grace_s,
                    rss_limit_bytes=self._config.rss_limit_mb << 20,
                )
            finally:
                self._busy.discard(worker)
                worker.give_back()
            return CompletedExecution(result, (time.perf_counter() - started) * 1000.0, worker.pid)

    async def _borrow(self, job: ExecuteJob) -> WorkerProcess:
        """Takes an idle process and hands it the job.

        Raises:
            PoolClosed: the pool closed while waiting.
        """
        while True:
            worker = await self._idle.get()
            if worker is None:
                self._idle.put_nowait(None)  # for the next waiter
                raise PoolClosed("the server is shutting down")
            if not worker.borrow():
                continue  # retired or dead while it sat in the queue
            try:
                await worker.send(job)
            except WorkerDied:
                worker.give_back()  # never delivered: try another process
                continue
            except BaseException:
                # Cancelled mid-send: the job may or may not arrive; nobody will
                # read its result, so the process cannot be trusted with another.
                worker.kill(None)
                worker.give_back()
                raise
            return worker

    async def _run_slot(self, index: int) -> None:
        backoff = _RESPAWN_BACKOFF_INITIAL_S
        try:
            while not self._stopping:
                became_ready = False
                try:
                    async with spawn_worker(self._command, env=self._env, settings=self._settings) as worker:
                        await worker.wait_ready(self._config.worker_start_timeout_s)
                        became_ready = True
                        backoff = _RESPAWN_BACKOFF_INITIAL_S
                        self._slot_ready(index)
                        await self._serve(worker)
                except WorkerError as exc:
                    if not self._started.is_set():
                        raise PoolStartError(f"a sandbox process failed to start: {exc}") from exc
                    logger.warning("sandbox slot %d: %s", index, exc)
                    if not became_ready:
                        # Failing to start is not the user code's doing: back off.
                        await self._pause(backoff)
                        backoff = min(backoff * 2, _RESPAWN_BACKOFF_MAX_S)
        finally:
            self._slots_running -= 1

    async def _serve(self, worker: WorkerProcess) -> None:
        """Offers one process to callers until it must be replaced or the pool stops.

        Raises:
            WorkerError: the process did not get ready for its next execution.
        """
        stop = asyncio.ensure_future(self._stop_requested.wait())
        try:
            while worker.executions < self._config.recycle_after:
                returned = worker.offer()
                self._idle.put_nowait(worker)
                waits: set[asyncio.Future[Any]] = {returned, worker.exited, stop}
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if worker.retire_if_unborrowed():
                    return  # never borrowed: the process exited, or the pool is stopping
                await returned  # borrowed: its caller always gives it back
                if not worker.alive or self._stopping:
                    return
                await worker.wait_ready(_READY_TIMEOUT_S + self._config.kill_grace_s)
                if worker.rss_bytes() > self._recycle_rss_bytes:
                    # V8 keeps memory it once used; offered again, the process
                    # could be killed by the watchdog during an innocent execution.
                    logger.info("recycling sandbox process %d: it kept %d MiB", worker.pid, worker.rss_bytes() >> 20)
                    return
            logger.info("recycling sandbox process %d after %d executions", worker.pid, worker.executions)
        finally:
            worker.retire_if_unborrowed()
            stop.cancel()
            await asyncio.wait({stop})

    async def _watchdog(self) -> None:
        """Kills borrowed processes whose resident memory exceeds the limit."""
        limit = self._config.rss_limit_mb << 20
        while not (self._stopping and self._slots_running == 0):
            for worker in list(self._busy):
                if worker.alive and worker.rss_bytes() > limit:
                    logger.warning("sandbox process %d exceeded %d MiB resident; killing it", worker.pid, limit >> 20)
                    worker.kill(Status.MEMORY_LIMIT)
            await asyncio.sleep(self._config.watchdog_interval_s)

    def _slot_ready(self, index: int) -> None:
        self._slots_ready.add(index)
        if len(self._slots_ready) >= self._config.pool_processes:
            self._started.set()

    async def _pause(self, seconds: float) -> None:
        """A respawn backoff that ends early when the pool stops."""
        with suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop_requested.wait()
