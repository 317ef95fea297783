"""The server's handle on one sandbox process: spawning it, talking to it, watching it die.

Sandbox processes are started with fork+exec of a fresh interpreter
(`asyncio.create_subprocess_exec`; CPython runs no Python code between the fork and
the exec), the equivalent of multiprocessing's "spawn": nothing of the server's
gRPC threads, locks or sockets is inherited, so the pool can replace processes while
gRPC is serving. Each gets an environment of its own (no variable of the server's,
so no secret, reaches it), a session of its own (a Ctrl-C or SIGTERM meant for the
server's process group does not kill executions that the server is draining), and
pipes: stdin/stdout carry frames, stderr is relayed into the server's log.

While an execution runs, the server enforces what the process cannot enforce on
itself: the hard deadline here (the execution's timeout plus a grace period; the
sandbox answers at the timeout on its own, so this only fires for a process that
stopped answering altogether), and the resident-memory limit in the pool's
watchdog. A process that dies on its own during an
execution is classified from what it left on stderr: V8 announces a fatal
out-of-memory there before it aborts, and nothing else tells it apart from a crash.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import signal
import sys
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Final

import psutil

from langserver_js.errors import ProtocolError, WorkerDied, WorkerError, WorkerUnresponsive
from langserver_js.protocol import ExecuteJob, ExecutionResult, SandboxSettings, Status, read_frame

__all__ = ["WorkerProcess", "spawn_worker"]

logger = logging.getLogger(__name__)

# What V8 prints before aborting on a fatal out-of-memory ("Fatal JavaScript out of
# memory: ...", "Fatal process out of memory: ...").
_V8_OOM_MARKERS: Final = ("out of memory", "Out of memory")
_STDERR_TAIL_LINES: Final = 60
_STDERR_CHUNK_BYTES: Final = 1 << 16
_STDERR_MAX_LINE_CHARS: Final = 8192
# After a death, how long the relay gets to read what the process left on stderr.
_STDERR_DRAIN_S: Final = 1.0
# How long a process told to stop (stdin closed) gets before it is killed.
_CLOSE_TIMEOUT_S: Final = 2.0


class _State(enum.Enum):
    STARTING = "starting"
    IDLE = "idle"
    BORROWED = "borrowed"
    RETURNED = "returned"
    RETIRED = "retired"


class WorkerProcess:
    """One running sandbox process. Built only by `spawn_worker`.

    Its slot in the pool owns its lifecycle (`offer`, `retire_if_unborrowed`, waiting
    for ready);
    a caller borrows it for exactly one execution (`borrow`, `send`, `result`,
    `give_back`), like a connection from a connection pool.
    """

    def __init__(self, proc: asyncio.subprocess.Process, exited: asyncio.Task[int], settings: SandboxSettings) -> None:
        assert proc.stdin is not None
        assert proc.stdout is not None
        self._proc = proc
        self._stdin = proc.stdin
        self._stdout = proc.stdout
        self._settings = settings
        self._ps: psutil.Process | None
        try:
            self._ps = psutil.Process(proc.pid)
        except psutil.Error:
            self._ps = None  # already gone; the exit task will say so
        self._stderr_tail: deque[str] = deque(maxlen=_STDERR_TAIL_LINES)
        self._stderr_closed = asyncio.Event()
        self._kill_cause: Status | None = None
        self._broken = False
        self._state = _State.STARTING
        self._returned: asyncio.Future[None] | None = None
        self.exited = exited
        self.pid = proc.pid
        self.executions = 0

    def offer(self) -> asyncio.Future[None]:
        """Marks the process idle (borrowable); the future resolves when a borrower gives it back."""
        self._state = _State.IDLE
        self._returned = asyncio.get_running_loop().create_future()
        return self._returned

    def borrow(self) -> bool:
        """Takes an idle, live process for one execution; False if it is not available."""
        if self._state is not _State.IDLE or not self.alive:
            return False
        self._state = _State.BORROWED
        return True

    def give_back(self) -> None:
        """Ends a borrow. Idempotent."""
        self._state = _State.RETURNED
        if self._returned is not None and not self._returned.done():
            self._returned.set_result(None)

    def retire_if_unborrowed(self) -> bool:
        """Takes a process that nobody borrowed since `offer` out of service.

        Returns False (and changes nothing) if a caller has it or had it.
        """
        if self._state in (_State.BORROWED, _State.RETURNED):
            return False
        self._state = _State.RETIRED
        return True

    @property
    def alive(self) -> bool:
        """False once the process died, was killed, or broke the protocol."""
        return not self._broken and self._proc.returncode is None and not self.exited.done()

    async def wait_ready(self, timeout_s: float) -> None:
        """Waits for the process to report a prepared isolate.

        Raises:
            WorkerUnresponsive: no report within `timeout_s`.
            WorkerDied: the process exited.
            ProtocolError: it sent something else.
        """
        try:
            async with asyncio.timeout(timeout_s):
                message = await read_frame(self._stdout, max_bytes=self._settings.max_result_frame_bytes())
        except TimeoutError:
            self._broken = True
            raise WorkerUnresponsive(
                f"sandbox process {self.pid} did not report ready within {timeout_s:g} s"
            ) from None
        except WorkerError:
            self._broken = True
            raise
        if message["type"] != "ready":
            self._broken = True
            raise ProtocolError(f"sandbox process {self.pid} sent {message['type']!r} instead of ready")

    async def send(self, job: ExecuteJob) -> None:
        """Hands a job to the process.

        Raises:
            WorkerDied: the pipe is closed; the job was not delivered.
        """
        try:
            self._stdin.write(job.to_frame())
            await self._stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            self._broken = True
            raise WorkerDied(f"sandbox process {self.pid} closed its stdin") from exc

    async def result(self, *, hard_deadline_s: float, rss_limit_bytes: int) -> ExecutionResult:
        """Waits for the result of the job just sent, killing the process at the hard deadline.

        Returns a result in every case: when the process has to be killed (here, or
        by the pool's RSS watchdog), dies, or breaks the protocol, the result says so
        and `alive` turns false. If the caller is cancelled, the process is killed:
        nobody wants the result, and its position in the stream is lost.
        """
        try:
            async with asyncio.timeout(hard_deadline_s):
                message = await read_frame(self._stdout, max_bytes=self._settings.max_result_frame_bytes())
            return self._decode(message)
        except TimeoutError:
            logger.warning("killing sandbox process %d: its execution outlived the hard deadline", self.pid)
            self.kill(Status.TIMEOUT)
        except WorkerDied:
            self._broken = True
        except ProtocolError as exc:
            logger.error("sandbox process %d broke the protocol: %s", self.pid, exc)
            self.kill(None)
            return ExecutionResult(status=Status.INTERNAL, message="the sandbox process sent an invalid answer")
        except BaseException:
            self.kill(None)
            raise
        return await self._death_result(hard_deadline_s=hard_deadline_s, rss_limit_bytes=rss_limit_bytes)

    def _decode(self, message: dict[str, object]) -> ExecutionResult:
        if message["type"] != "result":
            raise ProtocolError(f"expected a result, got {str(message['type'])[:40]!r}")
        self.executions += 1
        return ExecutionResult.from_message(message)

    async def _death_result(self, *, hard_deadline_s: float, rss_limit_bytes: int) -> ExecutionResult:
        """Explains why the process ended mid-execution."""
        returncode = await self._proc.wait()
        with suppress(TimeoutError):
            async with asyncio.timeout(_STDERR_DRAIN_S):
                await self._stderr_closed.wait()
        if self._kill_cause is Status.TIMEOUT:
            message = (
                f"the execution did not stop within {hard_deadline_s:g} s (its timeout plus the grace period); "
                "its sandbox process was killed"
            )
            return ExecutionResult(status=Status.TIMEOUT, message=message)
        if self._kill_cause is Status.MEMORY_LIMIT:
            message = f"the sandbox process exceeded {rss_limit_bytes >> 20} MiB of resident memory and was killed"
            return ExecutionResult(status=Status.MEMORY_LIMIT, message=message)
        if any(marker in line for line in self._stderr_tail for marker in _V8_OOM_MARKERS):
            message = (
                f"V8 ran out of memory (heap limit {self._settings.heap_limit_mb} MiB); "
                "the sandbox process was aborted and replaced"
            )
            return ExecutionResult(status=Status.MEMORY_LIMIT, message=message)
        logger.error("sandbox process %d died during an execution (%s)", self.pid, describe_exit(returncode))
        return ExecutionResult(
            status=Status.INTERNAL,
            message=f"the sandbox process died during the execution ({describe_exit(returncode)}) and was replaced",
        )

    def rss_bytes(self) -> int:
        """Resident memory of the process; 0 when it is gone."""
        if self._ps is None:
            return 0
        try:
            return int(self._ps.memory_info().rss)
        except psutil.Error:
            return 0

    def kill(self, cause: Status | None) -> None:
        """SIGKILLs the process, remembering why. Idempotent."""
        self._broken = True
        if self._kill_cause is None:
            self._kill_cause = cause
        if self._proc.returncode is None:
            with suppress(ProcessLookupError):
                self._proc.kill()

    async def close(self) -> None:
        """Stops and reaps the process. Idempotent.

        A healthy process is asked to exit (stdin EOF) and killed only if it does
        not; one that already failed (unresponsive, dead, off-protocol) is killed.
        """
        if self._broken:
            self.kill(None)
        self._broken = True
        if not self._stdin.is_closing():
            self._stdin.close()
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                await self._proc.wait()
        except TimeoutError:
            self.kill(None)
            await self._proc.wait()

    async def relay_stderr(self, stream: asyncio.StreamReader) -> None:
        """Copies the process's stderr into the server's, keeping a tail for post-mortems."""
        pending = ""
        try:
            while chunk := await stream.read(_STDERR_CHUNK_BYTES):
                pending += chunk.decode("utf-8", "replace")
                *lines, pending = pending.split("\n")
                if len(pending) > _STDERR_MAX_LINE_CHARS:
                    lines.append(pending)
                    pending = ""
                for line in lines:
                    self._relay_line(line[:_STDERR_MAX_LINE_CHARS])
            if pending:
                self._relay_line(pending[:_STDERR_MAX_LINE_CHARS])
        finally:
            self._stderr_closed.set()

    def _relay_line(self, line: str) -> None:
        if not line.strip():
            return
        self._stderr_tail.append(line)
        if line.startswith("{"):
            # Already a JSON log line (the sandbox logs through telemetry.logs).
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        else:
            logger.warning("sandbox process %d: %s", self.pid, line)


def describe_exit(returncode: int) -> str:
    """ "exit code 1" or "signal SIGTRAP" for a process's return code."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


@asynccontextmanager
async def spawn_worker(
    command: Sequence[str], *, env: Mapping[str, str], settings: SandboxSettings
) -> AsyncIterator[WorkerProcess]:
    """Starts a sandbox process; on exit from the block, stops and reaps it.

    Raises:
        WorkerDied: the process could not be started.
    """
    try:
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
            start_new_session=True,
        )
    except OSError as exc:
        raise WorkerDied(f"could not start a sandbox process: {exc}") from exc
    assert proc.stderr is not None
    # Not a TaskGroup: it would wrap the block's own exceptions (WorkerUnresponsive,
    # ...) in an ExceptionGroup. The two tasks are owned and awaited here all the same.
    exited = asyncio.create_task(proc.wait(), name=f"sandbox-{proc.pid}-exit")
    worker = WorkerProcess(proc, exited, settings)
    relay = asyncio.create_task(worker.relay_stderr(proc.stderr), name=f"sandbox-{proc.pid}-stderr")
    try:
        yield worker
    finally:
        try:
            await worker.close()
        finally:
            if proc.returncode is None:
                with suppress(ProcessLookupError):
                    proc.kill()
            for task in (relay, exited):
                if not task.done():
                    task.cancel()
            for outcome in await asyncio.gather(relay, exited, return_exceptions=True):
                if isinstance(outcome, Exception):
                    logger.error("sandbox process %d: helper task failed", proc.pid, exc_info=outcome)
