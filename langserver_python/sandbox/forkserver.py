"""The fork server ("zygote"): a warm, single-threaded parent of every child.

It is spawned by the gRPC process before any gRPC thread exists, with an empty
environment, and never imports grpc; forking a process that runs gRPC's
threads is unsafe, forking this one is cheap (the interpreter, RestrictedPython
and every allowed module are already loaded, and `gc.freeze()` keeps the
collector from dirtying the shared pages).

One loop over `selectors` multiplexes:

- the control socket: `run` and `cancel` frames in, `result` frames out;
- one result pipe per child (read as it comes, capped, so a child can never
  make this process buffer more than its output and log limits allow);
- a wake-up pipe written by the SIGCHLD handler, after which every exited
  child is found with `waitid(WNOHANG | WNOWAIT)`, its process group killed
  (while the zombie still pins the id) and then reaped;
- the nearest wall-clock deadline, at which the child's process group gets
  SIGKILL. Limits are enforced from outside the code they limit.

A child's whole report is answered as soon as it arrives (the child is killed
at once: nothing of it outlives its answer); its slot, and with it the slot's
uid, is reused only after the reap.

When the control socket closes (the gRPC process is stopping or gone) the
fork server kills what still runs, reaps it, removes its working directory and
exits. It is also killed by the kernel if its parent dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import collections
import contextlib
import os
import selectors
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from langserver_python.protocol import (
    ErrorKind,
    ExecutionError,
    ExecutionJob,
    ExecutionResult,
    FrameDecoder,
    FrameError,
    FrameTooLarge,
)
from langserver_python.sandbox.child import EXIT_OUT_OF_MEMORY, ChildPlan, run_child

__all__ = ["ForkServer", "classify"]

_CONTROL_FRAME_LIMIT = 256 * 1024 * 1024
_READ_CHUNK = 256 * 1024


@dataclass(slots=True)
class _Child:
    request_id: int
    job: ExecutionJob
    pid: int
    slot: int
    pipe_fd: int
    started: float
    deadline: float
    decoder: FrameDecoder
    frames: list[tuple[dict[str, Any], list[bytes]]] = field(default_factory=list)
    frame_error: str | None = None
    killed_for: str | None = None
    replied: bool = False
    reaped: bool = False


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def classify(child: _Child, status: int) -> ExecutionResult:
    """Turns how a child ended (its frames, wait status, and why we killed it) into a result.

    Used when the child did not deliver a whole report before it ended; a whole
    report is answered as soon as it arrives (see `ForkServer._drain`).
    """
    if os.WIFEXITED(status) and child.killed_for is None and child.frame_error is None and len(child.frames) == 1:
        return _finished(child)
    if child.killed_for == "timeout":
        return _error(ErrorKind.TIMEOUT, f"the execution exceeded its time limit of {child.job.timeout_s:g} s")
    if child.killed_for == "output":
        return _error(ErrorKind.OUTPUT_TOO_LARGE, "the execution wrote more output and logs than allowed")
    if child.killed_for is not None:
        return _error(ErrorKind.INTERNAL, f"the execution was stopped ({child.killed_for})")
    if child.frame_error is not None:
        return _error(ErrorKind.INTERNAL, f"the sandbox sent a malformed result ({child.frame_error})")
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        if signum == signal.SIGXCPU:
            return _error(ErrorKind.TIMEOUT, "the execution exceeded its CPU time limit")
        if signum == signal.SIGSYS:
            return _error(
                ErrorKind.POLICY_VIOLATION,
                "refused by the sandbox: a forbidden system call was stopped by the kernel (seccomp)",
            )
        if signum == signal.SIGKILL:
            return _error(ErrorKind.MEMORY_LIMIT, "the execution was killed by the system (probably out of memory)")
        return _error(ErrorKind.INTERNAL, f"the sandbox process crashed ({_signal_name(signum)})")
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
    if code == EXIT_OUT_OF_MEMORY:
        return _error(ErrorKind.MEMORY_LIMIT, "the execution ran out of memory")
    return _error(ErrorKind.INTERNAL, f"the sandbox process exited with status {code} without a result")


def _finished(child: _Child) -> ExecutionResult:
    """The result of a child whose report frame arrived whole."""
    meta, blobs = child.frames[0]
    try:
        return ExecutionResult.from_frame(meta, blobs)
    except FrameError as exc:
        return _error(ErrorKind.INTERNAL, f"the sandbox sent a malformed result ({exc})")


def _error(kind: ErrorKind, message: str) -> ExecutionResult:
    return ExecutionResult(error=ExecutionError(kind=kind, message=message))


class ForkServer:
    """Runs jobs from the control socket in forked children (see the module docstring)."""

    def __init__(self, control_fd: int, plan: ChildPlan) -> None:
        self._control_fd = control_fd
        self._plan = plan
        self._selector = selectors.DefaultSelector()
        self._children: dict[int, _Child] = {}  # by pid
        self._by_request: dict[int, _Child] = {}
        self._waiting: collections.deque[tuple[int, ExecutionJob]] = collections.deque()
        self._free_slots = list(range(plan.settings.max_concurrency - 1, -1, -1))
        self._outgoing = bytearray()
        self._control_decoder = FrameDecoder(_CONTROL_FRAME_LIMIT)
        self._closing = False
        self._pipe_cap = plan.settings.max_output_bytes + plan.settings.max_log_bytes + 256 * 1024
        self._results: dict[int, ExecutionResult] = {}
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    # --- lifecycle ------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._on_wake)

    def run_self_test(self, job: ExecutionJob) -> ExecutionResult:
        """Runs `job` to completion without the control socket (at start-up)."""
        self._start(-1, job)
        while -1 not in self._results:
            self._step()
        return self._results.pop(-1)

    def send(self, frame: bytes) -> None:
        """Queues a frame for the gRPC process."""
        self._outgoing += frame
        self._flush()

    def serve(self) -> None:
        """Serves the control socket until it closes and every child is reaped."""
        os.set_blocking(self._control_fd, False)
        self._selector.register(self._control_fd, selectors.EVENT_READ, self._on_control)
        while not (self._closing and not self._children):
            self._step()
        shutil.rmtree(self._plan.work_dir, ignore_errors=True)

    # --- the loop ---------------------------------------------------------------

    def _step(self) -> None:
        now = time.monotonic()
        deadline = min((c.deadline for c in self._children.values()), default=None)
        timeout = None if deadline is None else max(0.0, deadline - now)
        for key, mask in self._selector.select(timeout):
            handler: Callable[[int, int], None] = key.data
            handler(key.fd, mask)
        self._reap()
        self._enforce_deadlines()

    def _on_wake(self, fd: int, mask: int) -> None:
        try:
            while os.read(fd, 512):
                pass
        except BlockingIOError:
            pass

    def _on_control(self, fd: int, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            self._flush()
        if not mask & selectors.EVENT_READ:
            return
        try:
            data = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._shutdown()
            return
        for meta, blobs in self._control_decoder.feed(data):
            op = meta.get("op")
            if op == "run":
                code, input_json = (b.decode() for b in blobs)
                job = ExecutionJob(
                    code=code,
                    filename=str(meta["filename"]),
                    input_json=input_json,
                    timeout_s=float(meta["timeout_s"]),
                    task_id=str(meta.get("task_id", "")),
                )
                self._waiting.append((int(meta["id"]), job))
            elif op == "cancel":
                self._cancel(int(meta["id"]))
        self._start_waiting()

    def _flush(self) -> None:
        if self._closing:
            self._outgoing.clear()
            return
        while self._outgoing:
            try:
                written = os.write(self._control_fd, self._outgoing)
            except BlockingIOError:
                break
            except OSError:  # the gRPC process is gone
                self._shutdown()
                return
            del self._outgoing[:written]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if self._outgoing else 0)
        # Not registered yet (self-test) or already closed: nothing to watch.
        with contextlib.suppress(KeyError, ValueError):
            self._selector.modify(self._control_fd, events, self._on_control)

    def _shutdown(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._waiting.clear()
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(self._control_fd)
        for child in self._children.values():
            self._kill(child, "shutdown")

    # --- children -----------------------------------------------------------------

    def _start_waiting(self) -> None:
        while self._waiting and self._free_slots and not self._closing:
            request_id, job = self._waiting.popleft()
            self._start(request_id, job)

    def _start(self, request_id: int, job: ExecutionJob) -> None:
        slot = self._free_slots.pop()
        read_fd, write_fd = os.pipe()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child; never returns
            try:
                os.close(read_fd)
                run_child(job, plan=self._plan, slot=slot, result_fd=write_fd)
            finally:
                os._exit(70)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        with contextlib.suppress(OSError):  # the child did it first, or already exited
            os.setpgid(pid, pid)
        child = _Child(
            request_id=request_id,
            job=job,
            pid=pid,
            slot=slot,
            pipe_fd=read_fd,
            started=started,
            deadline=started + job.timeout_s,
            decoder=FrameDecoder(self._pipe_cap),
        )
        self._children[pid] = child
        self._by_request[request_id] = child
        self._selector.register(read_fd, selectors.EVENT_READ, lambda fd, mask: self._drain(child))

    def _drain(self, child: _Child) -> None:
        while child.pipe_fd >= 0:
            try:
                data = os.read(child.pipe_fd, _READ_CHUNK)
            except BlockingIOError:
                return
            if not data:
                self._close_pipe(child)
                return
            try:
                child.frames.extend(child.decoder.feed(data))
            except FrameError as exc:
                child.frame_error = str(exc)
                self._kill(child, "output" if isinstance(exc, FrameTooLarge) else None)
                self._close_pipe(child)
                return
            if len(child.frames) == 1 and child.decoder.buffered == 0 and not child.replied:
                # The report is complete: answer now rather than after the exit's
                # teardown, and make sure nothing of the child outlives its answer.
                self._kill(child, None)
                self._reply(child, _finished(child))

    def _close_pipe(self, child: _Child) -> None:
        if child.pipe_fd >= 0:
            self._selector.unregister(child.pipe_fd)
            os.close(child.pipe_fd)
            child.pipe_fd = -1

    def _kill(self, child: _Child, reason: str | None) -> None:
        if child.killed_for is None and reason is not None:
            child.killed_for = reason
        if child.reaped:
            return  # its pid may belong to someone else by now
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(OSError):
                kill(child.pid, signal.SIGKILL)

    def _cancel(self, request_id: int) -> None:
        child = self._by_request.get(request_id)
        if child is not None:
            self._kill(child, "cancelled")
            return
        self._waiting = collections.deque((rid, job) for rid, job in self._waiting if rid != request_id)

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for child in self._children.values():
            if child.killed_for is None and now >= child.deadline:
                self._kill(child, "timeout")

    def _reap(self) -> None:
        while True:
            # Peek first (WNOWAIT): while the zombie exists its pid, which is also
            # its process group id, cannot be reused, so killing the group is safe.
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            if info is None or info.si_pid == 0:
                return
            pid = info.si_pid
            with contextlib.suppress(OSError):  # anything the child left behind in its group
                os.killpg(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            child = self._children.pop(pid, None)
            if child is not None:
                child.reaped = True
                self._finish(child, status)

    def _finish(self, child: _Child, status: int) -> None:
        ended = time.monotonic()
        self._drain(child)
        self._close_pipe(child)
        self._by_request.pop(child.request_id, None)
        self._free_slots.append(child.slot)  # only now: the slot's uid has no process left
        if not child.replied:
            self._reply(child, classify(child, status), ended)
        self._start_waiting()

    def _reply(self, child: _Child, result: ExecutionResult, ended: float | None = None) -> None:
        child.replied = True
        ended = time.monotonic() if ended is None else ended
        result = ExecutionResult(
            output_json=result.output_json,
            error=result.error,
            logs=result.logs,
            logs_truncated=result.logs_truncated,
            duration_ms=(ended - child.started) * 1000.0,
        )
        if child.request_id < 0:
            self._results[child.request_id] = result
        elif not self._closing:
            self.send(result.to_frame(op="result", id=child.request_id))
