"""Configuration of the JavaScript language server, read once from the environment.

Every knob is an environment variable; `ServerConfig.from_env` is the only reader and
`python -m langserver_js` exits with code 3 naming the variable when one is invalid.

| variable | default | meaning |
|---|---|---|
| `LANGSERVER_ADDR` | `127.0.0.1:50052` | `host:port` the gRPC server listens on (port 0 picks a free one) |
| `LOG_LEVEL` | `info` | `debug`, `info`, `warning` or `error` |
| `JS_MAX_CONCURRENCY` | `4` | executions running at once; further requests wait for a slot |
| `JS_POOL_PROCESSES` | concurrency + 1 | sandbox processes kept warm (>= `JS_MAX_CONCURRENCY`; the extra ones hide the respawn of a recycled or crashed process) |
| `JS_RECYCLE_AFTER` | `500` | executions a sandbox process serves before it is replaced |
| `JS_HEAP_LIMIT_MB` | `128` | hard V8 heap limit per isolate (execution ends with MEMORY_LIMIT); V8's own fatal limit per process is twice this |
| `JS_DATA_LIMIT_MB` | `2048` | `RLIMIT_DATA` of each sandbox process, bounding memory outside the V8 heap (ArrayBuffers); `0` disables; V8 alone needs about 600 MiB of it |
| `JS_RSS_LIMIT_MB` | `768` | the watchdog kills a sandbox process whose resident memory exceeds this during an execution (MEMORY_LIMIT) |
| `JS_DEFAULT_TIMEOUT_SECONDS` | `30` | wall-clock limit when a request says `timeout_seconds <= 0` |
| `JS_MAX_TIMEOUT_SECONDS` | `300` | larger requested timeouts are lowered to this |
| `JS_KILL_GRACE_SECONDS` | `2` | how long V8 gets to stop after the timeout (and to dispose of an isolate after any execution, plus 1 s) before its process is killed |
| `JS_MAX_CODE_BYTES` | `1048576` | larger `inline_code.code` is refused (INVALID_ARGUMENT) |
| `JS_MAX_INPUT_BYTES` | `4194304` | larger `input_json` is refused (INVALID_ARGUMENT) |
| `JS_MAX_OUTPUT_BYTES` | `1048576` | larger serialised results end with OUTPUT_TOO_LARGE |
| `JS_MAX_LOG_BYTES` | `65536` | console output beyond this is dropped and `logs_truncated` set |
| `JS_SHUTDOWN_GRACE_SECONDS` | `30` | on SIGTERM, how long in-flight executions may finish |
| `JS_WORKER_START_TIMEOUT_SECONDS` | `30` | how long a sandbox process may take to boot and prepare its first isolate |
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from langserver_js.errors import ConfigError

__all__ = ["ServerConfig"]

DEFAULT_ADDR: Final = "127.0.0.1:50052"
DEFAULT_LOG_LEVEL: Final = "info"
DEFAULT_MAX_CONCURRENCY: Final = 4
DEFAULT_RECYCLE_AFTER: Final = 500
DEFAULT_HEAP_LIMIT_MB: Final = 128
DEFAULT_DATA_LIMIT_MB: Final = 2048
DEFAULT_RSS_LIMIT_MB: Final = 768
DEFAULT_TIMEOUT_S: Final = 30.0
DEFAULT_MAX_TIMEOUT_S: Final = 300.0
DEFAULT_KILL_GRACE_S: Final = 2.0
DEFAULT_MAX_CODE_BYTES: Final = 1 << 20
DEFAULT_MAX_INPUT_BYTES: Final = 4 << 20
DEFAULT_MAX_OUTPUT_BYTES: Final = 1 << 20
DEFAULT_MAX_LOG_BYTES: Final = 64 << 10
DEFAULT_SHUTDOWN_GRACE_S: Final = 30.0
DEFAULT_WORKER_START_TIMEOUT_S: Final = 30.0

# Measured: V8 14 with one isolate already holds ~560 MiB of RLIMIT_DATA (its
# writable reservations); below this floor a sandbox process cannot even start.
MIN_DATA_LIMIT_MB: Final = 1024
_LOG_LEVELS: Final = frozenset({"debug", "info", "warning", "error"})

# Field name → the environment variable it comes from, so a validation error
# raised on a field can name what the operator has to change.
_ENV_NAMES: Final[Mapping[str, str]] = {
    "listen_host": "LANGSERVER_ADDR",
    "listen_port": "LANGSERVER_ADDR",
    "log_level": "LOG_LEVEL",
    "max_concurrency": "JS_MAX_CONCURRENCY",
    "pool_processes": "JS_POOL_PROCESSES",
    "recycle_after": "JS_RECYCLE_AFTER",
    "heap_limit_mb": "JS_HEAP_LIMIT_MB",
    "data_limit_mb": "JS_DATA_LIMIT_MB",
    "rss_limit_mb": "JS_RSS_LIMIT_MB",
    "default_timeout_s": "JS_DEFAULT_TIMEOUT_SECONDS",
    "max_timeout_s": "JS_MAX_TIMEOUT_SECONDS",
    "kill_grace_s": "JS_KILL_GRACE_SECONDS",
    "max_code_bytes": "JS_MAX_CODE_BYTES",
    "max_input_bytes": "JS_MAX_INPUT_BYTES",
    "max_output_bytes": "JS_MAX_OUTPUT_BYTES",
    "max_log_bytes": "JS_MAX_LOG_BYTES",
    "shutdown_grace_s": "JS_SHUTDOWN_GRACE_SECONDS",
    "worker_start_timeout_s": "JS_WORKER_START_TIMEOUT_SECONDS",
}


class _InvalidField(ValueError):
    """A field of `ServerConfig` has a value outside its range."""

    def __init__(self, field_name: str, reason: str) -> None:
        super().__init__(f"{field_name}: {reason}")
        self.field_name = field_name
        self.reason = reason


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """Everything the server and its sandbox processes need, validated.

    Raises:
        ValueError: (from the constructor) a field is out of range; the message
            starts with the field name.
    """

    listen_host: str = "127.0.0.1"
    listen_port: int = 50052
    log_level: str = DEFAULT_LOG_LEVEL
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    pool_processes: int = DEFAULT_MAX_CONCURRENCY + 1
    recycle_after: int = DEFAULT_RECYCLE_AFTER
    heap_limit_mb: int = DEFAULT_HEAP_LIMIT_MB
    data_limit_mb: int = DEFAULT_DATA_LIMIT_MB
    rss_limit_mb: int = DEFAULT_RSS_LIMIT_MB
    default_timeout_s: float = DEFAULT_TIMEOUT_S
    max_timeout_s: float = DEFAULT_MAX_TIMEOUT_S
    kill_grace_s: float = DEFAULT_KILL_GRACE_S
    max_code_bytes: int = DEFAULT_MAX_CODE_BYTES
    max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    max_log_bytes: int = DEFAULT_MAX_LOG_BYTES
    shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S
    worker_start_timeout_s: float = DEFAULT_WORKER_START_TIMEOUT_S
    # Not configurable: how often the watchdog samples a busy process's RSS.
    watchdog_interval_s: float = field(default=0.05, repr=False)

    def __post_init__(self) -> None:
        if not self.listen_host:
            raise _InvalidField("listen_host", "must not be empty")
        if not 0 <= self.listen_port <= 65535:
            raise _InvalidField("listen_port", f"must be a port number, got {self.listen_port}")
        if self.log_level not in _LOG_LEVELS:
            raise _InvalidField("log_level", f"must be one of {', '.join(sorted(_LOG_LEVELS))}")
        _require_range("max_concurrency", self.max_concurrency, 1, 1024)
        _require_range("pool_processes", self.pool_processes, self.max_concurrency, 1024)
        _require_range("recycle_after", self.recycle_after, 1, 10_000_000)
        _require_range("heap_limit_mb", self.heap_limit_mb, 16, 16384)
        if self.data_limit_mb != 0:
            floor = max(MIN_DATA_LIMIT_MB, 4 * self.heap_limit_mb)
            _require_range("data_limit_mb", self.data_limit_mb, floor, 1 << 30)
        _require_range("rss_limit_mb", self.rss_limit_mb, max(256, 2 * self.heap_limit_mb), 1 << 30)
        _require_range("default_timeout_s", self.default_timeout_s, 0.001, self.max_timeout_s)
        _require_range("max_timeout_s", self.max_timeout_s, 0.001, 86400.0)
        _require_range("kill_grace_s", self.kill_grace_s, 0.0, 3600.0)
        _require_range("max_code_bytes", self.max_code_bytes, 1, 64 << 20)
        _require_range("max_input_bytes", self.max_input_bytes, 1, 64 << 20)
        _require_range("max_output_bytes", self.max_output_bytes, 1, 256 << 20)
        _require_range("max_log_bytes", self.max_log_bytes, 0, 64 << 20)
        _require_range("shutdown_grace_s", self.shutdown_grace_s, 0.0, 86400.0)
        _require_range("worker_start_timeout_s", self.worker_start_timeout_s, 0.1, 3600.0)

    @property
    def listen_addr(self) -> str:
        """The address in the form gRPC binds (`host:port`, IPv6 hosts bracketed)."""
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return f"{host}:{self.listen_port}"

    def effective_timeout_s(self, requested_s: int) -> float:
        """The wall-clock limit for a request: the default for <= 0, capped at the maximum."""
        if requested_s <= 0:
            return self.default_timeout_s
        return min(float(requested_s), self.max_timeout_s)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ServerConfig:
        """Builds the configuration from environment variables (see the module docstring).

        Raises:
            ConfigError: a variable does not parse or is out of range; names it.
        """
        host, port = _parse_addr(environ.get("LANGSERVER_ADDR", DEFAULT_ADDR))
        concurrency = _int(environ, "JS_MAX_CONCURRENCY", DEFAULT_MAX_CONCURRENCY)
        try:
            return cls(
                listen_host=host,
                listen_port=port,
                log_level=environ.get("LOG_LEVEL", DEFAULT_LOG_LEVEL).strip().lower(),
                max_concurrency=concurrency,
                pool_processes=_int(environ, "JS_POOL_PROCESSES", concurrency + 1),
                recycle_after=_int(environ, "JS_RECYCLE_AFTER", DEFAULT_RECYCLE_AFTER),
                heap_limit_mb=_int(environ, "JS_HEAP_LIMIT_MB", DEFAULT_HEAP_LIMIT_MB),
                data_limit_mb=_int(environ, "JS_DATA_LIMIT_MB", DEFAULT_DATA_LIMIT_MB),
                rss_limit_mb=_int(environ, "JS_RSS_LIMIT_MB", DEFAULT_RSS_LIMIT_MB),
                default_timeout_s=_float(environ, "JS_DEFAULT_TIMEOUT_SECONDS", DEFAULT_TIMEOUT_S),
                max_timeout_s=_float(environ, "JS_MAX_TIMEOUT_SECONDS", DEFAULT_MAX_TIMEOUT_S),
                kill_grace_s=_float(environ, "JS_KILL_GRACE_SECONDS", DEFAULT_KILL_GRACE_S),
                max_code_bytes=_int(environ, "JS_MAX_CODE_BYTES", DEFAULT_MAX_CODE_BYTES),
                max_input_bytes=_int(environ, "JS_MAX_INPUT_BYTES", DEFAULT_MAX_INPUT_BYTES),
                max_output_bytes=_int(environ, "JS_MAX_OUTPUT_BYTES", DEFAULT_MAX_OUTPUT_BYTES),
                max_log_bytes=_int(environ, "JS_MAX_LOG_BYTES", DEFAULT_MAX_LOG_BYTES),
                shutdown_grace_s=_float(environ, "JS_SHUTDOWN_GRACE_SECONDS", DEFAULT_SHUTDOWN_GRACE_S),
                worker_start_timeout_s=_float(
                    environ, "JS_WORKER_START_TIMEOUT_SECONDS", DEFAULT_WORKER_START_TIMEOUT_S
                ),
            )
        except _InvalidField as exc:
            raise ConfigError(_ENV_NAMES[exc.field_name], exc.reason) from exc


def _require_range(name: str, value: float, low: float, high: float) -> None:
    if not (low <= value <= high) or (isinstance(value, float) and not math.isfinite(value)):
        raise _InvalidField(name, f"must be between {low:g} and {high:g}, got {value:g}")


def _parse_addr(raw: str) -> tuple[str, int]:
    text = raw.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ConfigError("LANGSERVER_ADDR", f"must be host:port, got {raw!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = int(port_text)
    if port > 65535:
        raise ConfigError("LANGSERVER_ADDR", f"port must be at most 65535, got {port}")
    return host, port


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigError(name, f"must be an integer, got {raw!r}") from None


def _float(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise ConfigError(name, f"must be a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise ConfigError(name, f"must be a finite number, got {raw!r}")
    return value
