"""Configuration of the Python language server, read from the environment once.

`python -m langserver_python` builds one frozen `ServerConfig` with
`ServerConfig.from_env(os.environ)`; a bad value exits with code 3 and a
message that names the variable.

| variable | default | meaning |
|---|---|---|
| `LANGSERVER_ADDR` | `127.0.0.1:50053` | gRPC listen address, `host:port` |
| `LOG_LEVEL` | `info` | `debug`, `info`, `warning` or `error` |
| `PY_MAX_CONCURRENCY` | `8` | executions running at once (one sandboxed child each) |
| `PY_MAX_QUEUE` | `256` | requests waiting for a slot; beyond it, `RESOURCE_EXHAUSTED` at once |
| `PY_QUEUE_TIMEOUT_SECONDS` | `10` | longest wait for a slot before `RESOURCE_EXHAUSTED` |
| `PY_DEFAULT_TIMEOUT_SECONDS` | `30` | wall-clock limit when a request sends `timeout_seconds <= 0` |
| `PY_MAX_TIMEOUT_SECONDS` | `300` | requested timeouts are capped at this |
| `PY_CPU_LIMIT_SECONDS` | `300` | `RLIMIT_CPU` of a child (also capped at its timeout + 1 s) |
| `PY_MEMORY_LIMIT_MB` | `256` | `RLIMIT_AS` (address space) of a child, in MiB |
| `PY_MAX_OPEN_FILES` | `32` | `RLIMIT_NOFILE` of a child |
| `PY_MAX_CODE_BYTES` | `262144` | larger `inline_code.code` is `INVALID_ARGUMENT` |
| `PY_MAX_INPUT_BYTES` | `1048576` | larger `input_json` is `INVALID_ARGUMENT` |
| `PY_MAX_OUTPUT_BYTES` | `1048576` | larger JSON output is an `OUTPUT_TOO_LARGE` error |
| `PY_MAX_LOG_BYTES` | `65536` | printed output beyond this is cut (`logs_truncated`) |
| `PY_ALLOWED_MODULES` | see `DEFAULT_ALLOWED_MODULES` | comma-separated import allowlist; replaces the default |
| `PY_SANDBOX_UID_BASE` | `60000` | as root, a child runs as uid/gid `BASE + slot` (slot < concurrency) |
| `PY_WORK_DIR` | the system temp dir | where the empty, read-only working directory of children is created |
| `PY_SHUTDOWN_GRACE_SECONDS` | `30` | on SIGTERM, how long in-flight executions may take to finish |

Modules in `NEVER_ALLOWED_MODULES` (os, sys, subprocess, socket, ctypes, …) are
refused in `PY_ALLOWED_MODULES` even when named: no facade makes them safe.

**Test-only switch.** The sandbox layers can be switched off one by one, so the
tests can prove that each layer stops an attack by itself. It is not part of the
environment configuration: it takes the command-line flag
`--unsafe-disable-layer=LAYER` (repeatable; `language`, `interpreter`, `process`,
`kernel`) *and* `LANGSERVER_UNSAFE_TEST_MODE=1` in the environment; a flag
without that variable exits with code 3. A server running with a layer switched
off logs a warning naming it at start.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field

from langserver_python.errors import ConfigError
from langserver_python.protocol import Layer, SandboxSettings

__all__ = [
    "DEFAULT_ALLOWED_MODULES",
    "NEVER_ALLOWED_MODULES",
    "UNSAFE_TEST_MODE_VAR",
    "ServerConfig",
    "parse_unsafe_layers",
]

DEFAULT_ADDR = "127.0.0.1:50053"
DEFAULT_LOG_LEVEL = "info"
DEFAULT_MAX_CONCURRENCY = 8
DEFAULT_MAX_QUEUE = 256
DEFAULT_QUEUE_TIMEOUT_S = 10.0
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_TIMEOUT_S = 300.0
DEFAULT_CPU_LIMIT_S = 300
DEFAULT_MEMORY_LIMIT_MB = 256
DEFAULT_MAX_OPEN_FILES = 32
DEFAULT_MAX_CODE_BYTES = 256 * 1024
DEFAULT_MAX_INPUT_BYTES = 1024 * 1024
DEFAULT_MAX_OUTPUT_BYTES = 1024 * 1024
DEFAULT_MAX_LOG_BYTES = 64 * 1024
DEFAULT_SANDBOX_UID_BASE = 60000
DEFAULT_SHUTDOWN_GRACE_S = 30.0
UNSAFE_TEST_MODE_VAR = "LANGSERVER_UNSAFE_TEST_MODE"

#: Pure modules user code may import, each exposed through a facade (see
#: `sandbox.facades`). Reviewed in diffs: add a module only after checking that
#: its public functions cannot reach the filesystem, the network, processes or
#: other modules.
DEFAULT_ALLOWED_MODULES: tuple[str, ...] = (
    "base64",
    "binascii",
    "bisect",
    "calendar",
    "cmath",
    "collections",
    "collections.abc",
    "copy",
    "csv",
    "datetime",
    "decimal",
    "difflib",
    "fractions",
    "functools",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "io",
    "itertools",
    "json",
    "math",
    "numbers",
    "operator",
    "random",
    "re",
    "secrets",
    "statistics",
    "string",
    "struct",
    "textwrap",
    "time",
    "unicodedata",
    "urllib.parse",
    "uuid",
    "zlib",
)

#: Modules whose whole point is reaching outside the interpreter, or inside it
#: past the guards. Refused in PY_ALLOWED_MODULES so a typo cannot open them.
NEVER_ALLOWED_MODULES = frozenset(
    {
        "asyncio",
        "builtins",
        "code",
        "codecs",
        "ctypes",
        "dataclasses",
        "gc",
        "glob",
        "importlib",
        "inspect",
        "marshal",
        "mmap",
        "multiprocessing",
        "os",
        "pathlib",
        "pickle",
        "posix",
        "pty",
        "resource",
        "shelve",
        "shutil",
        "signal",
        "socket",
        "subprocess",
        "sys",
        "tempfile",
        "threading",
        "traceback",
        "types",
        "typing",
        "weakref",
        "_thread",
    }
)


def _positive_int(environ: Mapping[str, str], name: str, default: int, *, maximum: int | None = None) -> int:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(name, f"must be a positive integer, not {raw!r}") from None
    if value <= 0 or (maximum is not None and value > maximum):
        bound = f" at most {maximum}" if maximum is not None else ""
        raise ConfigError(name, f"must be a positive integer{bound}, not {raw!r}")
    return value


def _positive_float(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(name, f"must be a positive number of seconds, not {raw!r}") from None
    if not value > 0 or value == float("inf"):
        raise ConfigError(name, f"must be a positive number of seconds, not {raw!r}")
    return value


def _address(environ: Mapping[str, str], name: str, default: str) -> str:
    raw = environ.get(name, default).strip() or default
    host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(name, f"must be host:port, not {raw!r}")
    return raw


def _modules(environ: Mapping[str, str], name: str) -> tuple[str, ...]:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return DEFAULT_ALLOWED_MODULES
    modules = tuple(sorted({m.strip() for m in raw.split(",") if m.strip()}))
    for module in modules:
        parts = module.split(".")
        if not all(p.isidentifier() and not p.startswith("_") for p in parts):
            raise ConfigError(name, f"{module!r} is not a public module name")
        if parts[0] in NEVER_ALLOWED_MODULES or module in NEVER_ALLOWED_MODULES:
            raise ConfigError(name, f"{module!r} can never be allowed: it reaches outside the sandbox")
    return modules


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """The language server's settings (see the module docstring for the variables)."""

    addr: str = DEFAULT_ADDR
    log_level: str = DEFAULT_LOG_LEVEL
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    max_queue: int = DEFAULT_MAX_QUEUE
    queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S
    default_timeout_s: float = DEFAULT_TIMEOUT_S
    max_timeout_s: float = DEFAULT_MAX_TIMEOUT_S
    cpu_limit_s: int = DEFAULT_CPU_LIMIT_S
    memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB
    max_open_files: int = DEFAULT_MAX_OPEN_FILES
    max_code_bytes: int = DEFAULT_MAX_CODE_BYTES
    max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    max_log_bytes: int = DEFAULT_MAX_LOG_BYTES
    allowed_modules: tuple[str, ...] = DEFAULT_ALLOWED_MODULES
    sandbox_uid_base: int = DEFAULT_SANDBOX_UID_BASE
    work_dir: str = field(default_factory=tempfile.gettempdir)
    shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S
    #: Test-only (see the module docstring); never set from the environment alone.
    disabled_layers: frozenset[Layer] = frozenset()

    def __post_init__(self) -> None:
        if self.default_timeout_s > self.max_timeout_s:
            raise ConfigError(
                "PY_DEFAULT_TIMEOUT_SECONDS",
                f"must not exceed PY_MAX_TIMEOUT_SECONDS ({self.max_timeout_s:g})",
            )
        if self.memory_limit_mb < 64:
            raise ConfigError("PY_MEMORY_LIMIT_MB", "must be at least 64 (the interpreter alone needs ~30 MiB)")
        if self.max_open_files < 8:
            raise ConfigError("PY_MAX_OPEN_FILES", "must be at least 8")
        if self.sandbox_uid_base + self.max_concurrency > 65534:
            raise ConfigError("PY_SANDBOX_UID_BASE", "plus PY_MAX_CONCURRENCY must stay below 65534")
        if self.log_level.lower() not in {"debug", "info", "warning", "error"}:
            raise ConfigError("LOG_LEVEL", f"must be debug, info, warning or error, not {self.log_level!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str], *, disabled_layers: frozenset[Layer] = frozenset()) -> ServerConfig:
        """Reads every variable of the table above.

        Raises:
            ConfigError: a value is malformed or out of range; names the variable.
        """
        uid_base = environ.get("PY_SANDBOX_UID_BASE", "").strip()
        if uid_base and not uid_base.isdigit():
            raise ConfigError("PY_SANDBOX_UID_BASE", f"must be a uid, not {uid_base!r}")
        return cls(
            addr=_address(environ, "LANGSERVER_ADDR", DEFAULT_ADDR),
            log_level=environ.get("LOG_LEVEL", DEFAULT_LOG_LEVEL).strip() or DEFAULT_LOG_LEVEL,
            max_concurrency=_positive_int(environ, "PY_MAX_CONCURRENCY", DEFAULT_MAX_CONCURRENCY, maximum=1024),
            max_queue=_positive_int(environ, "PY_MAX_QUEUE", DEFAULT_MAX_QUEUE),
            queue_timeout_s=_positive_float(environ, "PY_QUEUE_TIMEOUT_SECONDS", DEFAULT_QUEUE_TIMEOUT_S),
            default_timeout_s=_positive_float(environ, "PY_DEFAULT_TIMEOUT_SECONDS", DEFAULT_TIMEOUT_S),
            max_timeout_s=_positive_float(environ, "PY_MAX_TIMEOUT_SECONDS", DEFAULT_MAX_TIMEOUT_S),
            cpu_limit_s=_positive_int(environ, "PY_CPU_LIMIT_SECONDS", DEFAULT_CPU_LIMIT_S),
            memory_limit_mb=_positive_int(environ, "PY_MEMORY_LIMIT_MB", DEFAULT_MEMORY_LIMIT_MB, maximum=1 << 20),
            max_open_files=_positive_int(environ, "PY_MAX_OPEN_FILES", DEFAULT_MAX_OPEN_FILES, maximum=65536),
            max_code_bytes=_positive_int(environ, "PY_MAX_CODE_BYTES", DEFAULT_MAX_CODE_BYTES, maximum=16 << 20),
            max_input_bytes=_positive_int(environ, "PY_MAX_INPUT_BYTES", DEFAULT_MAX_INPUT_BYTES, maximum=64 << 20),
            max_output_bytes=_positive_int(environ, "PY_MAX_OUTPUT_BYTES", DEFAULT_MAX_OUTPUT_BYTES, maximum=64 << 20),
            max_log_bytes=_positive_int(environ, "PY_MAX_LOG_BYTES", DEFAULT_MAX_LOG_BYTES, maximum=16 << 20),
            allowed_modules=_modules(environ, "PY_ALLOWED_MODULES"),
            sandbox_uid_base=int(uid_base) if uid_base else DEFAULT_SANDBOX_UID_BASE,
            work_dir=environ.get("PY_WORK_DIR", "").strip() or tempfile.gettempdir(),
            shutdown_grace_s=_positive_float(environ, "PY_SHUTDOWN_GRACE_SECONDS", DEFAULT_SHUTDOWN_GRACE_S),
            disabled_layers=disabled_layers,
        )

    @property
    def max_message_bytes(self) -> int:
        """gRPC's receive limit: room for the largest valid request, nothing more."""
        return self.max_code_bytes + self.max_input_bytes + 64 * 1024

    def sandbox_settings(self) -> SandboxSettings:
        return SandboxSettings(
            allowed_modules=self.allowed_modules,
            memory_limit_bytes=self.memory_limit_mb * 1024 * 1024,
            cpu_limit_s=self.cpu_limit_s,
            max_open_files=self.max_open_files,
            max_output_bytes=self.max_output_bytes,
            max_log_bytes=self.max_log_bytes,
            max_concurrency=self.max_concurrency,
            sandbox_uid_base=self.sandbox_uid_base,
            work_dir_parent=self.work_dir,
            disabled_layers=self.disabled_layers,
        )


def parse_unsafe_layers(values: list[str], environ: Mapping[str, str]) -> frozenset[Layer]:
    """Turns `--unsafe-disable-layer` flags into layers, if the test mode allows it.

    Raises:
        ConfigError: a flag was given without `LANGSERVER_UNSAFE_TEST_MODE=1`,
            or names no layer.
    """
    if not values:
        return frozenset()
    if environ.get(UNSAFE_TEST_MODE_VAR) != "1":
        raise ConfigError(
            UNSAFE_TEST_MODE_VAR,
            "--unsafe-disable-layer is a test-only switch and needs this variable set to 1",
        )
    layers = set()
    for value in values:
        try:
            layers.add(Layer(value))
        except ValueError:
            raise ConfigError(
                "--unsafe-disable-layer", f"must be one of {', '.join(sorted(Layer))}, not {value!r}"
            ) from None
    return frozenset(layers)
