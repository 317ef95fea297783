"""One child process: how it is started, how its output is collected, how it is stopped.

Every child is spawned with `posix_spawn` (no Python code runs between fork
and exec, which matters in a process holding gRPC threads) through a small
exec shim that sets `PR_SET_PDEATHSIG` (see `_exec_child.py`), in a session
and process group of its own. So:

- a signal sent to the supervisor's terminal group (Ctrl-C) does not reach the
  children directly; the supervisor decides the order they stop in;
- stopping a child can end its whole group (its own helpers) with one `killpg`;
- if the supervisor itself dies without a chance to stop anything (SIGKILL,
  OOM), the kernel sends each child SIGTERM. SIGTERM rather than SIGKILL
  because every child of this project drains on SIGTERM and stops the
  processes it started (a language server's sandboxes) on the way out.

stdin is /dev/null; stdout and stderr go to one pipe that `pump_lines` turns
into tagged log lines (a one-shot job may keep stdout, for human output).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.logstream import LogSink, pump_lines
from supervisor.reaper import Reaper, describe_exit

__all__ = ["PDEATH_SIGNAL", "ChildProcess", "ChildSpec"]

log = logging.getLogger(__name__)

#: Sent by the kernel to a child when the supervisor dies.
PDEATH_SIGNAL = signal.SIGTERM
_SHIM = str(Path(__file__).with_name("_exec_child.py"))
#: Signals reset to their default action in the child (Python ignores SIGPIPE and
#: SIGXFSZ; a shell that started us in the background may have ignored SIGINT).
_DEFAULT_SIGNALS = (
    signal.SIGPIPE,
    signal.SIGXFSZ,
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGCHLD,
)
#: How long the log pump may run on after the child's group is gone.
_PUMP_DRAIN_S = 2.0


@dataclass(frozen=True, kw_only=True)
class ChildSpec:
    """What to run, and how to treat it.

    Attributes:
        name: the process name in logs and metrics ("worker", "langserver-python").
        argv: the command.
        env: its complete environment.
        stop_timeout_s: how long it may take to exit after SIGTERM before its group is SIGKILLed.
        health_addr: `host:port` of its gRPC health service, if it has one; it is
            ready once that reports SERVING.
        health_service: the service name to check ("" is the server as a whole).
        memory_limit_bytes: restart it when its process tree's RSS exceeds this (0: never).
        restart: False for a one-shot job (run once, its exit code is the result).
        keep_stdout: let it write to the supervisor's stdout (human output of a one-shot job).
    """

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    stop_timeout_s: float
    health_addr: str | None = None
    health_service: str = ""
    memory_limit_bytes: int = 0
    restart: bool = True
    keep_stdout: bool = False


class ChildProcess:
    """One running instance of a `ChildSpec`. Create with `spawn`."""

    def __init__(self, spec: ChildSpec, pid: int, exited: asyncio.Future[int], output_fd: int) -> None:
        self.spec = spec
        self.pid = pid
        self.exited = exited
        self.output_fd = output_fd
        self.started_at = time.monotonic()

    @classmethod
    def spawn(cls, spec: ChildSpec, reaper: Reaper) -> ChildProcess:
        """Starts the process (in its own session) and registers it with the reaper.

        Must be called from the event loop's thread: PR_SET_PDEATHSIG fires when
        the *thread* that spawned the child exits.

        Raises:
            OSError: the shim could not be spawned (the child's own command failing
                to exec shows up as a quick exit with code 127 or 125).
        """
        read_fd, write_fd = os.pipe()
        devnull = os.open(os.devnull, os.O_RDONLY)
        actions: list[tuple[int, int, int]] = [(os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, write_fd, 2)]
        if not spec.keep_stdout:
            actions.append((os.POSIX_SPAWN_DUP2, write_fd, 1))
        argv = [sys.executable, "-I", "-S", _SHIM, str(os.getpid()), str(int(PDEATH_SIGNAL)), *spec.argv]
        try:
            pid = os.posix_spawn(
                sys.executable,
                argv,
                dict(spec.env),
                file_actions=actions,
                setsid=True,
                setsigdef=_DEFAULT_SIGNALS,
                setsigmask=(),
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
            os.close(devnull)
        exited = reaper.watch(pid)
        log.info("started %s", spec.name, extra={"child": spec.name, "child_pid": pid})
        return cls(spec, pid, exited, read_fd)

    @property
    def running(self) -> bool:
        return not self.exited.done()

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self.started_at

    async def wait(self) -> int:
        """The returncode, once the child exited. Cancelling the wait leaves the exit status intact."""
        return await asyncio.shield(self.exited)

    async def pump_logs(self, sink: LogSink) -> None:
        """Forwards the child's output to `sink` until every writer of the pipe is gone."""
        await pump_lines(self.output_fd, self.spec.name, self.pid, sink)

    def send(self, sig: signal.Signals) -> None:
        """Signals the child itself; a no-op once it exited."""
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill_group(self) -> None:
        """SIGKILLs everything left in the child's process group (it, and helpers it started)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)

    async def stop(self, *, force: asyncio.Event, reason: str) -> int:
        """SIGTERM, up to `stop_timeout_s` to exit (cut short by `force`), then SIGKILL to the group.

        Returns the child's returncode. Idempotent; safe to call after it exited.
        """
        if self.running:
            log.info(
                "stopping %s (%s)",
                self.spec.name,
                reason,
                extra={"child": self.spec.name, "child_pid": self.pid, "timeout_s": self.spec.stop_timeout_s},
            )
            self.send(signal.SIGTERM)
            forced: asyncio.Future[Any] = asyncio.ensure_future(force.wait())
            exited: asyncio.Future[Any] = self.exited
            try:
                await asyncio.wait(
                    {exited, forced}, timeout=self.spec.stop_timeout_s, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                forced.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await forced
            if self.running:
                why = "forced stop" if force.is_set() else f"still running {self.spec.stop_timeout_s:g}s after SIGTERM"
                log.warning("killing %s: %s", self.spec.name, why, extra={"child": self.spec.name})
        self.kill_group()
        returncode = await self.wait()
        log.info(
            "%s %s",
            self.spec.name,
            describe_exit(returncode),
            extra={"child": self.spec.name, "child_pid": self.pid, "returncode": returncode},
        )
        return returncode


async def drain_pump(pump: asyncio.Task[None]) -> None:
    """Lets a log pump finish the child's last lines, then cancels it if a stray process holds the pipe."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(pump), _PUMP_DRAIN_S)
    if not pump.done():
        pump.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await pump
