"""The supervisor's configuration, read from the environment in one place.

| variable | default | meaning |
|---|---|---|
| `SUPERVISOR_ROLE` | `all` | `all` (language servers + worker), `worker`, `langserver-python` or `langserver-js`; `--role` overrides |
| `LANG_WORKER_ADDRS` | unset | `python:host:port,js:host:port`: external language servers; when set, none are spawned |
| `LANGSERVER_PYTHON_ADDR` | `127.0.0.1:0` (role `langserver-python`: `127.0.0.1:50053`) | where the spawned Python language server listens; port 0 picks a free loopback port |
| `LANGSERVER_JS_ADDR` | `127.0.0.1:0` (role `langserver-js`: `127.0.0.1:50052`) | same for the JavaScript language server |
| `SUPERVISOR_LANGSERVER_MEMORY_LIMIT_MB` | `2048` | a language server whose process tree (server + sandboxes) uses more RSS than this is restarted gracefully; 0 turns it off |
| `SUPERVISOR_WATCH_INTERVAL_SECONDS` | `5` | how often children's memory, CPU and health are sampled |
| `SUPERVISOR_RESTART_BACKOFF_SECONDS` | `0.5` | delay before the first restart of a child; doubles per consecutive crash |
| `SUPERVISOR_RESTART_BACKOFF_MAX_SECONDS` | `30` | cap of that delay |
| `SUPERVISOR_CRASH_LOOP_LIMIT` | `5` | a child that exits more than this many times within the window stops the node (exit code 4) |
| `SUPERVISOR_CRASH_LOOP_WINDOW_SECONDS` | `60` | the crash-loop window |
| `SUPERVISOR_READY_TIMEOUT_SECONDS` | `60` | a language server must report SERVING within this, or it counts as a crash |
| `WORKER_SHUTDOWN_GRACE_SECONDS` | `30` | the worker's drain time (read by the worker too); the supervisor waits this plus `SUPERVISOR_STOP_MARGIN_SECONDS` before SIGKILL |
| `SUPERVISOR_STOP_MARGIN_SECONDS` | `5` | extra time a stopping child gets before SIGKILL |
| `SUPERVISOR_LANGSERVER_STOP_SECONDS` | `35` | how long a language server may take to drain after SIGTERM (keep it above its own drain time, e.g. `PY_SHUTDOWN_GRACE_SECONDS`) |
| `SUPERVISOR_METRICS_PORT` | `0` (off) | Prometheus metrics of the children (RSS, CPU, restarts) on `SUPERVISOR_METRICS_HOST:PORT` |
| `SUPERVISOR_METRICS_HOST` | `127.0.0.1` | bind address of the metrics endpoint |
| `SUPERVISOR_WORKER_CMD`, `SUPERVISOR_LANGSERVER_PYTHON_CMD`, `SUPERVISOR_LANGSERVER_JS_CMD` | `python -m worker`, ... | the command of each child (shell-style words); for custom builds and tests |
| `LOG_LEVEL` | `info` | the supervisor's own log level; children keep their own settings |

Every other variable passes through to the children unchanged (the worker's
`COORDINATOR_ADDR`, `REDIS_ADDR`, `WORKER_*`..., the language servers' own).
"""

from __future__ import annotations

import enum
import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.errors import ConfigError

__all__ = ["DevConfig", "Role", "SupervisorConfig", "parse_host_port"]

DEFAULT_MEMORY_LIMIT_MB = 2048
DEFAULT_WATCH_INTERVAL_S = 5.0
DEFAULT_BACKOFF_S = 0.5
DEFAULT_BACKOFF_MAX_S = 30.0
DEFAULT_CRASH_LOOP_LIMIT = 5
DEFAULT_CRASH_LOOP_WINDOW_S = 60.0
DEFAULT_READY_TIMEOUT_S = 60.0
DEFAULT_WORKER_GRACE_S = 30.0
DEFAULT_STOP_MARGIN_S = 5.0
DEFAULT_LANGSERVER_STOP_S = 35.0
DEFAULT_PYTHON_PORT = 50053
DEFAULT_JS_PORT = 50052
DEFAULT_COORDINATOR_LISTEN_ADDR = "127.0.0.1:50051"
_LOG_LEVELS = frozenset({"debug", "info", "warning", "error"})


class Role(enum.Enum):
    """Which part of a worker node this supervisor runs."""

    ALL = "all"
    WORKER = "worker"
    LANGSERVER_PYTHON = "langserver-python"
    LANGSERVER_JS = "langserver-js"


def parse_host_port(variable: str, value: str) -> tuple[str, int]:
    """Splits `host:port` (port 0 allowed: pick a free one).

    Raises:
        ConfigError: not `host:port`; names `variable`.
    """
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(variable, f"must be host:port, not {value!r}")
    return host.strip("[]"), int(port)


@dataclass(frozen=True, kw_only=True)
class SupervisorConfig:
    role: Role = Role.ALL
    lang_worker_addrs: str | None = None
    python_addr: str = "127.0.0.1:0"
    js_addr: str = "127.0.0.1:0"
    memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB
    watch_interval_s: float = DEFAULT_WATCH_INTERVAL_S
    restart_backoff_s: float = DEFAULT_BACKOFF_S
    restart_backoff_max_s: float = DEFAULT_BACKOFF_MAX_S
    crash_loop_limit: int = DEFAULT_CRASH_LOOP_LIMIT
    crash_loop_window_s: float = DEFAULT_CRASH_LOOP_WINDOW_S
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    worker_grace_s: float = DEFAULT_WORKER_GRACE_S
    stop_margin_s: float = DEFAULT_STOP_MARGIN_S
    langserver_stop_s: float = DEFAULT_LANGSERVER_STOP_S
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0
    worker_cmd: tuple[str, ...] = (sys.executable, "-m", "worker")
    python_cmd: tuple[str, ...] = (sys.executable, "-m", "langserver_python")
    js_cmd: tuple[str, ...] = (sys.executable, "-m", "langserver_js")
    log_level: str = "info"
    #: The environment the children start from (the supervisor's own, by default).
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))

    def __post_init__(self) -> None:
        for variable, seconds in (
            ("SUPERVISOR_WATCH_INTERVAL_SECONDS", self.watch_interval_s),
            ("SUPERVISOR_RESTART_BACKOFF_SECONDS", self.restart_backoff_s),
            ("SUPERVISOR_RESTART_BACKOFF_MAX_SECONDS", self.restart_backoff_max_s),
            ("SUPERVISOR_CRASH_LOOP_WINDOW_SECONDS", self.crash_loop_window_s),
            ("SUPERVISOR_READY_TIMEOUT_SECONDS", self.ready_timeout_s),
            ("SUPERVISOR_LANGSERVER_STOP_SECONDS", self.langserver_stop_s),
        ):
            if not seconds > 0:
                raise ConfigError(variable, f"must be positive, not {seconds}")
        for variable, seconds in (
            ("WORKER_SHUTDOWN_GRACE_SECONDS", self.worker_grace_s),
            ("SUPERVISOR_STOP_MARGIN_SECONDS", self.stop_margin_s),
        ):
            if seconds < 0:
                raise ConfigError(variable, f"must not be negative, not {seconds}")
        if self.restart_backoff_max_s < self.restart_backoff_s:
            raise ConfigError(
                "SUPERVISOR_RESTART_BACKOFF_MAX_SECONDS",
                f"must be at least SUPERVISOR_RESTART_BACKOFF_SECONDS ({self.restart_backoff_s})",
            )
        if self.crash_loop_limit < 1:
            raise ConfigError("SUPERVISOR_CRASH_LOOP_LIMIT", f"must be at least 1, not {self.crash_loop_limit}")
        if self.memory_limit_mb < 0:
            raise ConfigError(
                "SUPERVISOR_LANGSERVER_MEMORY_LIMIT_MB", f"must not be negative, not {self.memory_limit_mb}"
            )
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError("SUPERVISOR_METRICS_PORT", f"must be a port number, not {self.metrics_port}")
        if self.log_level not in _LOG_LEVELS:
            raise ConfigError("LOG_LEVEL", f"must be one of {', '.join(sorted(_LOG_LEVELS))}, not {self.log_level!r}")
        parse_host_port("LANGSERVER_PYTHON_ADDR", self.python_addr)
        parse_host_port("LANGSERVER_JS_ADDR", self.js_addr)
        if self.lang_worker_addrs is not None:
            _check_lang_worker_addrs(self.lang_worker_addrs)
        for variable, cmd in (
            ("SUPERVISOR_WORKER_CMD", self.worker_cmd),
            ("SUPERVISOR_LANGSERVER_PYTHON_CMD", self.python_cmd),
            ("SUPERVISOR_LANGSERVER_JS_CMD", self.js_cmd),
        ):
            if not cmd:
                raise ConfigError(variable, "must name a command")

    @property
    def spawns_language_servers(self) -> bool:
        """Role `all` spawns both language servers unless LANG_WORKER_ADDRS names external ones."""
        return self.role is Role.ALL and self.lang_worker_addrs is None

    @property
    def worker_stop_timeout_s(self) -> float:
        return self.worker_grace_s + self.stop_margin_s

    @classmethod
    def from_env(cls, environ: Mapping[str, str], *, role: str | None = None) -> SupervisorConfig:
        """Builds the configuration from environment variables (`role` from `--role` wins over SUPERVISOR_ROLE).

        Raises:
            ConfigError: a variable is invalid; the message names it.
        """
        role_name = role or environ.get("SUPERVISOR_ROLE") or Role.ALL.value
        try:
            parsed_role = Role(role_name)
        except ValueError:
            choices = ", ".join(r.value for r in Role)
            raise ConfigError("SUPERVISOR_ROLE", f"must be one of {choices}, not {role_name!r}") from None
        python_default = f"127.0.0.1:{DEFAULT_PYTHON_PORT}" if parsed_role is Role.LANGSERVER_PYTHON else "127.0.0.1:0"
        js_default = f"127.0.0.1:{DEFAULT_JS_PORT}" if parsed_role is Role.LANGSERVER_JS else "127.0.0.1:0"
        return cls(
            role=parsed_role,
            lang_worker_addrs=environ.get("LANG_WORKER_ADDRS") or None,
            python_addr=environ.get("LANGSERVER_PYTHON_ADDR") or python_default,
            js_addr=environ.get("LANGSERVER_JS_ADDR") or js_default,
            memory_limit_mb=_int(environ, "SUPERVISOR_LANGSERVER_MEMORY_LIMIT_MB", DEFAULT_MEMORY_LIMIT_MB),
            watch_interval_s=_float(environ, "SUPERVISOR_WATCH_INTERVAL_SECONDS", DEFAULT_WATCH_INTERVAL_S),
            restart_backoff_s=_float(environ, "SUPERVISOR_RESTART_BACKOFF_SECONDS", DEFAULT_BACKOFF_S),
            restart_backoff_max_s=_float(environ, "SUPERVISOR_RESTART_BACKOFF_MAX_SECONDS", DEFAULT_BACKOFF_MAX_S),
            crash_loop_limit=_int(environ, "SUPERVISOR_CRASH_LOOP_LIMIT", DEFAULT_CRASH_LOOP_LIMIT),
            crash_loop_window_s=_float(environ, "SUPERVISOR_CRASH_LOOP_WINDOW_SECONDS", DEFAULT_CRASH_LOOP_WINDOW_S),
            ready_timeout_s=_float(environ, "SUPERVISOR_READY_TIMEOUT_SECONDS", DEFAULT_READY_TIMEOUT_S),
            worker_grace_s=_float(environ, "WORKER_SHUTDOWN_GRACE_SECONDS", DEFAULT_WORKER_GRACE_S),
            stop_margin_s=_float(environ, "SUPERVISOR_STOP_MARGIN_SECONDS", DEFAULT_STOP_MARGIN_S),
            langserver_stop_s=_float(environ, "SUPERVISOR_LANGSERVER_STOP_SECONDS", DEFAULT_LANGSERVER_STOP_S),
            metrics_host=environ.get("SUPERVISOR_METRICS_HOST") or "127.0.0.1",
            metrics_port=_int(environ, "SUPERVISOR_METRICS_PORT", 0),
            worker_cmd=_cmd(environ, "SUPERVISOR_WORKER_CMD", (sys.executable, "-m", "worker")),
            python_cmd=_cmd(environ, "SUPERVISOR_LANGSERVER_PYTHON_CMD", (sys.executable, "-m", "langserver_python")),
            js_cmd=_cmd(environ, "SUPERVISOR_LANGSERVER_JS_CMD", (sys.executable, "-m", "langserver_js")),
            log_level=(environ.get("LOG_LEVEL") or "info").lower(),
            environ=dict(environ),
        )


@dataclass(frozen=True, kw_only=True)
class DevConfig:
    """`--dev`: what to start beside the node, and where its data lives.

    | variable | default | meaning |
    |---|---|---|
    | `SUPERVISOR_DEV_DATA_DIR` | per-user (see `default_data_dir`) | embedded PostgreSQL and Redis data; `--data-dir` overrides |
    | `DATABASE_URL` | unset | use this PostgreSQL instead of the embedded one |
    | `REDIS_ADDR` | unset | use this Redis instead of the embedded one |
    | `COORDINATOR_ADDR` | unset | use this coordinator instead of starting one |
    | `COORDINATOR_LISTEN_ADDR` | `127.0.0.1:50051` | where the started coordinator listens |
    """

    data_dir: Path
    examples_dir: Path
    database_url: str | None = None
    redis_addr: str | None = None
    coordinator_addr: str | None = None
    coordinator_listen_addr: str = DEFAULT_COORDINATOR_LISTEN_ADDR
    run_example: bool = True

    def __post_init__(self) -> None:
        parse_host_port("COORDINATOR_LISTEN_ADDR", self.coordinator_listen_addr)
        if self.coordinator_addr is not None:
            parse_host_port("COORDINATOR_ADDR", self.coordinator_addr)

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str],
        *,
        default_data_dir: Path,
        examples_dir: Path,
        data_dir: str | None = None,
        run_example: bool = True,
    ) -> DevConfig:
        """Builds the `--dev` settings (`data_dir` from `--data-dir` wins over SUPERVISOR_DEV_DATA_DIR).

        Raises:
            ConfigError: a variable is invalid; the message names it.
        """
        chosen = data_dir or environ.get("SUPERVISOR_DEV_DATA_DIR")
        return cls(
            data_dir=Path(chosen).expanduser().absolute() if chosen else default_data_dir,
            examples_dir=examples_dir,
            database_url=environ.get("DATABASE_URL") or None,
            redis_addr=environ.get("REDIS_ADDR") or None,
            coordinator_addr=environ.get("COORDINATOR_ADDR") or None,
            coordinator_listen_addr=environ.get("COORDINATOR_LISTEN_ADDR") or DEFAULT_COORDINATOR_LISTEN_ADDR,
            run_example=run_example,
        )


def _check_lang_worker_addrs(value: str) -> None:
    for item in value.split(","):
        runtime, sep, addr = item.strip().partition(":")
        if not sep or not runtime:
            raise ConfigError("LANG_WORKER_ADDRS", f"entries must be runtime:host:port, not {item.strip()!r}")
        parse_host_port("LANG_WORKER_ADDRS", addr)


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(name, f"must be an integer, not {raw!r}") from None


def _float(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(name, f"must be a number, not {raw!r}") from None


def _cmd(environ: Mapping[str, str], name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return tuple(shlex.split(raw))
    except ValueError as exc:
        raise ConfigError(name, f"is not a valid command line ({exc})") from None
