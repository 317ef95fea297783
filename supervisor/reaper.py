"""Collects the exit status of every child of this process.

The supervisor may be PID 1 in a container, and it registers as a *child
subreaper* (Linux), so processes orphaned below it (a language server's
sandbox child whose parent crashed) are re-parented to it rather than to
init. Either way it must reap every child, known or not: on SIGCHLD (the
handler only sets an event, STYLE #11) it calls `waitpid(-1, WNOHANG)` until
that returns 0, tolerating ECHILD, and hands each status to whoever waits for
that pid.

Not for use in a process that also runs `subprocess`/asyncio child watchers
while the reaper is installed: it would collect their children's statuses too.
The supervisor therefore spawns every process itself (see `child.py`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

__all__ = ["Reaper", "describe_exit"]

log = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36
#: How a death by signal is worded in logs; SIGKILL from outside is most often the OOM killer.
_SIGNAL_HINTS = {signal.SIGKILL: " (possible OOM kill)", signal.SIGSEGV: " (crash)", signal.SIGABRT: " (abort)"}


def describe_exit(returncode: int) -> str:
    """'exited with code 3' or 'killed by SIGKILL (possible OOM kill)', for a returncode as Popen reports it."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        sig = signal.Signals(-returncode)
    except ValueError:
        return f"killed by signal {-returncode}"
    return f"killed by {sig.name}{_SIGNAL_HINTS.get(sig, '')}"


class Reaper:
    """Reaps children on SIGCHLD and resolves one future per watched pid with its returncode."""

    def __init__(self) -> None:
        self._waiters: dict[int, asyncio.Future[int]] = {}
        self._wake = asyncio.Event()
        self._installed = False

    def install(self) -> None:
        """Handles SIGCHLD in the running loop and becomes the subreaper of orphaned descendants."""
        if self._installed:
            return
        if sys.platform.startswith("linux"):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
                log.warning("could not become child subreaper: %s", os.strerror(ctypes.get_errno()))
        asyncio.get_running_loop().add_signal_handler(signal.SIGCHLD, self._wake.set)
        self._installed = True
        self._wake.set()  # a child may have exited before the handler existed

    def uninstall(self) -> None:
        """Removes the SIGCHLD handler; idempotent."""
        if self._installed:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGCHLD)
            self._installed = False

    def watch(self, pid: int) -> asyncio.Future[int]:
        """A future resolved with the pid's returncode (negative: killed by that signal).

        Call right after spawning, before the next `await`, so the status cannot be reaped unclaimed.
        """
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters[pid] = future
        return future

    async def run(self) -> None:
        """Reaps whenever SIGCHLD arrives, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            self.reap()

    def reap(self) -> None:
        """Collects every exited child now; never blocks."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            returncode = os.waitstatus_to_exitcode(status)
            future = self._waiters.pop(pid, None)
            if future is None:
                # An orphan re-parented to us, or a process spawned by other means.
                log.debug("reaped pid %s, not a supervised child: %s", pid, describe_exit(returncode))
            elif not future.done():
                future.set_result(returncode)
