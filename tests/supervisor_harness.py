"""Runs `python -m supervisor` as a real process for tests, with stand-in or real children.

The supervisor is always its own process: it reaps every child of the process
it runs in (`waitpid(-1)`), which must never be the pytest process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

REPO_ROOT = Path(__file__).resolve().parent.parent
STANDIN = REPO_ROOT / "tests" / "standins" / "child.py"

#: Settings that make the supervisor react in fractions of a second.
FAST_SETTINGS = {
    "SUPERVISOR_WATCH_INTERVAL_SECONDS": "0.2",
    "SUPERVISOR_RESTART_BACKOFF_SECONDS": "0.05",
    "SUPERVISOR_RESTART_BACKOFF_MAX_SECONDS": "0.2",
    "SUPERVISOR_READY_TIMEOUT_SECONDS": "20",
    "SUPERVISOR_STOP_MARGIN_SECONDS": "1",
    "WORKER_SHUTDOWN_GRACE_SECONDS": "5",
    "SUPERVISOR_LANGSERVER_STOP_SECONDS": "5",
}


def standin(name: str, *options: str) -> str:
    """The command line of a stand-in child (see tests/standins/child.py)."""
    return shlex.join([sys.executable, str(STANDIN), name, *options])


class SupervisorProcess:
    """One `python -m supervisor` run; stderr (the merged JSON log) goes to a file."""

    def __init__(self, tmp: Path, args: list[str], env: dict[str, str]) -> None:
        self.tmp = tmp
        self.record_file = tmp / "record.txt"
        self.log_file = tmp / "supervisor.log"
        self.out_file = tmp / "supervisor.out"
        self.args = args
        self.env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "STANDIN_RECORD": str(self.record_file),
            "WORKER_METRICS_PORT": "0",
            **FAST_SETTINGS,
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self._seen: dict[int, psutil.Process] = {}

    def start(self) -> SupervisorProcess:
        with self.log_file.open("wb") as err, self.out_file.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "supervisor", *self.args],
                env=self.env,
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def records(self) -> list[tuple[str, str, int, str]]:
        """(name, event, pid, detail) lines the stand-ins wrote, in order."""
        if not self.record_file.exists():
            return []
        rows = []
        for line in self.record_file.read_text().splitlines():
            name, event, pid, *detail = line.split(" ", 3)
            rows.append((name, event, int(pid), detail[0] if detail else ""))
        return rows

    def events(self, name: str, event: str) -> list[tuple[str, str, int, str]]:
        return [r for r in self.records() if r[0] == name and r[1] == event]

    def logs(self) -> list[dict[str, Any]]:
        lines = []
        for raw in self.log_file.read_text(errors="replace").splitlines():
            try:
                lines.append(json.loads(raw))
            except ValueError:
                lines.append({"unparsed": raw})
        return lines

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace")

    def stdout(self) -> str:
        return self.out_file.read_text(errors="replace")

    def has_log(self, predicate: Callable[[dict[str, Any]], bool]) -> bool:
        return any(predicate(line) for line in self.logs())

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 30.0, what: str = "condition") -> None:
        """Polls `predicate` (also collecting descendant pids); fails early if the supervisor exits."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            self.note_descendants()
            assert self.proc is not None
            if self.proc.poll() is not None and not predicate():
                raise AssertionError(
                    f"supervisor exited ({self.proc.returncode}) before {what}; log tail:\n{self.log_text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not reached within {timeout_s}s; log tail:\n{self.log_text()[-3000:]}")
            time.sleep(0.05)
        self.note_descendants()

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        self.wait_for(lambda: self.has_log(lambda e: e.get("event") == "node ready"), timeout_s, "node ready")

    def wait_started(self, *names: str, timeout_s: float = 30.0) -> None:
        """Waits until each stand-in named has recorded its start (its signal handlers are set by then)."""
        for name in names:

            def started(name: str = name) -> bool:
                return bool(self.events(name, "started"))

            self.wait_for(started, timeout_s, f"{name} started")

    def descendants(self) -> list[psutil.Process]:
        with contextlib.suppress(psutil.Error):
            return psutil.Process(self.pid).children(recursive=True)
        return []

    def note_descendants(self) -> set[int]:
        """Remembers every process seen below the supervisor, to check later that none survived.

        psutil handles (not bare pids) are kept: they notice pid reuse, so a
        later check or kill never touches an unrelated process.
        """
        for proc in self.descendants():
            self._seen.setdefault(proc.pid, proc)
        pids = [r[2] for r in self.records()] + [int(r[3]) for r in self.records() if r[1] == "grandchild"]
        for pid in pids:
            if pid not in self._seen:
                with contextlib.suppress(psutil.Error):
                    self._seen[pid] = psutil.Process(pid)
        return set(self._seen)

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait_exit(self, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def survivors(self) -> list[str]:
        """Processes seen below the supervisor that still exist (zombies of other parents excluded)."""
        alive = []
        for pid, proc in sorted(self._seen.items()):
            with contextlib.suppress(psutil.Error):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{pid} {' '.join(proc.cmdline())[:120]}")
        return alive

    def close(self) -> None:
        """Kills whatever is left (a failed test must not leak processes into the next)."""
        for proc in self.descendants():
            with contextlib.suppress(psutil.Error):
                proc.kill()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for proc in self._seen.values():
            with contextlib.suppress(psutil.Error):
                proc.kill()


@contextlib.contextmanager
def supervisor(tmp: Path, *args: str, **env: str) -> Iterator[SupervisorProcess]:
    """`python -m supervisor *args` with `env` added to the test environment; killed (with its children) at exit."""
    process = SupervisorProcess(tmp, list(args), env).start()
    try:
        yield process
    finally:
        process.close()


def no_survivors(process: SupervisorProcess, timeout_s: float = 10.0) -> list[str]:
    """Waits until no process seen below the supervisor is left; returns the ones still alive."""
    deadline = time.monotonic() + timeout_s
    while (alive := process.survivors()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive
