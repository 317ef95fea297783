"""The worker's configuration: one frozen dataclass, built once from the environment.

Environment (step 12 of the seed, plus what the issue adds):

=================================  ==========================  =============================================
variable                           default                     meaning
=================================  ==========================  =============================================
``COORDINATOR_ADDR``               ``localhost:50051``         coordinator gRPC address (host:port)
``COORDINATOR_TOKEN``              (none)                      bearer token sent on every coordinator call
``COORDINATOR_TLS_CA``             (none: plaintext)           PEM file of the CA that signs the coordinator's
                                                               certificate; set it to use TLS
``REDIS_ADDR``                     ``127.0.0.1:6379``          host:port, or a ``redis://`` / ``rediss://`` URL
``LANG_WORKER_ADDRS``              (none)                      ``python:host:port,js:host:port`` (``node`` is
                                                               an alias of ``js``)
``WORKER_QUEUES``                  ``http`` + each runtime     queues to consume, comma-separated
``WORKER_CONCURRENCY``             10                          tasks executed in parallel (= messages held)
``LEASE_TTL_SECONDS``              90                          lease TTL, renewed every TTL/3; at least 15
``WORKER_ALLOW_SHORT_LEASE_TTL``   ``false``                   tests only: allow a TTL down to 2 s (see below)
``WORKER_ID``                      hostname + random suffix    Redis consumer name and lease owner; unique
``MAX_DELIVERIES``                 5                           deliveries before a message is dead-lettered
``WORKER_SHUTDOWN_GRACE_SECONDS``  30                          drain time for in-flight tasks on SIGTERM
``WORKER_METRICS_HOST``            ``127.0.0.1``               bind address of /metrics, /livez, /readyz
``WORKER_METRICS_PORT``            9464                        their port; 0 picks a free one (logged)
``WORKER_MAX_OUTPUT_BYTES``        1048576                     largest task output; larger fails the task
``WORKER_STALL_SECONDS``           2 x TTL                     progress watchdog threshold
``WORKER_LOG_LEVEL``               ``info``                    debug, info, warning or error
=================================  ==========================  =============================================

Short lease TTLs. The seed renews at least every 5 s and reclaims at least every
10 s; with a TTL under 15 s those floors would let a lease expire between two
renewals. This worker therefore *refuses* a TTL under 15 s at start (exit code
3, naming ``LEASE_TTL_SECONDS``). Tests that need failures to resolve in
seconds set ``WORKER_ALLOW_SHORT_LEASE_TTL=1``, which allows a TTL down to 2 s
and drops the floors, so renewal stays at TTL/3 (two retries before expiry) and
reclaim at TTL/2 whatever the TTL. It is not meant for production: a short TTL
turns every garbage-collection pause or network blip into a lost lease.
"""

from __future__ import annotations

import re
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from worker.errors import ConfigError

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_LEASE_TTL_S",
    "DEFAULT_MAX_DELIVERIES",
    "DEFAULT_TASK_TIMEOUT_S",
    "MIN_LEASE_TTL_S",
    "MIN_SHORT_LEASE_TTL_S",
    "WorkerConfig",
]

DEFAULT_COORDINATOR_ADDR = "localhost:50051"
DEFAULT_REDIS_ADDR = "127.0.0.1:6379"
DEFAULT_CONCURRENCY = 10
DEFAULT_LEASE_TTL_S = 90
DEFAULT_MAX_DELIVERIES = 5
DEFAULT_SHUTDOWN_GRACE_S = 30.0
DEFAULT_METRICS_HOST = "127.0.0.1"
DEFAULT_METRICS_PORT = 9464
DEFAULT_MAX_OUTPUT_BYTES = 1024 * 1024
#: A task whose message carries no timeout (0) gets this one, as in the seed.
DEFAULT_TASK_TIMEOUT_S = 90

#: Below this TTL the seed's floors (renew >= 5 s, reclaim >= 10 s) are unsafe.
MIN_LEASE_TTL_S = 15
#: The lowest TTL `allow_short_lease_ttl` accepts (the gRPC field is whole seconds).
MIN_SHORT_LEASE_TTL_S = 2
MAX_LEASE_TTL_S = 24 * 3600
#: The seed's floors, applied unless `allow_short_lease_ttl` is set.
RENEW_FLOOR_S = 5.0
RECLAIM_FLOOR_S = 10.0
#: Upper bound of one renewal call; it is further capped at half the renewal interval.
RENEW_CALL_TIMEOUT_S = 5.0
MAX_CONCURRENCY = 1024
#: Outputs travel to the coordinator in one gRPC message whose default limit is 4 MiB.
MAX_OUTPUT_BYTES_LIMIT = 4_000_000
MIN_OUTPUT_BYTES_LIMIT = 1024

_QUEUE_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_WORKER_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,199}$")
_LOG_LEVELS = frozenset({"debug", "info", "warning", "error"})
#: Runtimes served by language servers; "node" is accepted as an alias of "js".
LANGUAGE_RUNTIMES = frozenset({"python", "js"})
RUNTIME_ALIASES: Mapping[str, str] = MappingProxyType({"node": "js"})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})

#: The environment variable behind each field, so errors name what the operator set.
ENV_VARS: Mapping[str, str] = MappingProxyType(
    {
        "coordinator_addr": "COORDINATOR_ADDR",
        "coordinator_token": "COORDINATOR_TOKEN",
        "coordinator_tls_ca": "COORDINATOR_TLS_CA",
        "redis_url": "REDIS_ADDR",
        "lang_server_addrs": "LANG_WORKER_ADDRS",
        "queues": "WORKER_QUEUES",
        "concurrency": "WORKER_CONCURRENCY",
        "lease_ttl_s": "LEASE_TTL_SECONDS",
        "allow_short_lease_ttl": "WORKER_ALLOW_SHORT_LEASE_TTL",
        "worker_id": "WORKER_ID",
        "max_deliveries": "MAX_DELIVERIES",
        "shutdown_grace_s": "WORKER_SHUTDOWN_GRACE_SECONDS",
        "metrics_host": "WORKER_METRICS_HOST",
        "metrics_port": "WORKER_METRICS_PORT",
        "max_output_bytes": "WORKER_MAX_OUTPUT_BYTES",
        "stall_after_s": "WORKER_STALL_SECONDS",
        "log_level": "WORKER_LOG_LEVEL",
    }
)


def _bad(name: str, message: str) -> ConfigError:
    return ConfigError(ENV_VARS.get(name, name), message)


def default_worker_id() -> str:
    """Returns hostname + a random suffix: unique across restarts and replicas."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:100] or "worker"
    return f"{host}-{secrets.token_hex(4)}"


def canonical_runtime(name: str) -> str:
    """Maps a runtime name to its canonical form ("node" -> "js")."""
    lowered = name.strip().lower()
    return RUNTIME_ALIASES.get(lowered, lowered)


def _check_host_port(name: str, value: str) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or host in ("[", "[]"):
        raise _bad(name, f"must be host:port, got {value!r}")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise _bad(name, f"port must be 1-65535, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """Everything one worker needs; validated on construction.

    Raises:
        ConfigError: a field is invalid; the message names its environment variable.
    """

    coordinator_addr: str = DEFAULT_COORDINATOR_ADDR
    #: Secret: kept out of repr() so it never reaches a log line.
    coordinator_token: str | None = field(default=None, repr=False)
    #: PEM bytes of the coordinator's CA; None means a plaintext channel.
    coordinator_tls_ca: bytes | None = field(default=None, repr=False)
    redis_url: str = f"redis://{DEFAULT_REDIS_ADDR}/0"
    #: runtime ("python", "js") -> host:port of its language server.
    lang_server_addrs: Mapping[str, str] = field(default_factory=dict)
    #: Queues to consume; empty means "http" plus one per language runtime.
    queues: tuple[str, ...] = ()
    concurrency: int = DEFAULT_CONCURRENCY
    lease_ttl_s: int = DEFAULT_LEASE_TTL_S
    allow_short_lease_ttl: bool = False
    worker_id: str = field(default_factory=default_worker_id)
    max_deliveries: int = DEFAULT_MAX_DELIVERIES
    shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S
    metrics_host: str = DEFAULT_METRICS_HOST
    #: 0 binds a free port (tests run several workers in one process).
    metrics_port: int = DEFAULT_METRICS_PORT
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    #: None means 2 x TTL.
    stall_after_s: float | None = None
    log_level: str = "info"

    def __post_init__(self) -> None:
        _check_host_port("coordinator_addr", self.coordinator_addr)
        if self.coordinator_token is not None and (
            not self.coordinator_token or any(c.isspace() for c in self.coordinator_token)
        ):
            raise _bad("coordinator_token", "must be a non-empty token without whitespace")
        self._check_redis_url()
        addrs: dict[str, str] = {}
        for runtime, addr in self.lang_server_addrs.items():
            canonical = canonical_runtime(runtime)
            if canonical not in LANGUAGE_RUNTIMES:
                raise _bad("lang_server_addrs", f"unknown runtime {runtime!r} (expected python, js or node)")
            if canonical in addrs:
                raise _bad("lang_server_addrs", f"runtime {canonical!r} is listed twice")
            _check_host_port("lang_server_addrs", addr)
            addrs[canonical] = addr
        object.__setattr__(self, "lang_server_addrs", MappingProxyType(addrs))
        for queue in self.queues:
            if not _QUEUE_RE.match(queue):
                raise _bad("queues", f"invalid queue name {queue!r} (lowercase letters, digits, '_', '.', '-')")
        if len(set(self.queues)) != len(self.queues):
            raise _bad("queues", "a queue is listed twice")
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise _bad("concurrency", f"must be 1-{MAX_CONCURRENCY}, got {self.concurrency}")
        low = MIN_SHORT_LEASE_TTL_S if self.allow_short_lease_ttl else MIN_LEASE_TTL_S
        if not low <= self.lease_ttl_s <= MAX_LEASE_TTL_S:
            hint = "" if self.allow_short_lease_ttl else " (shorter TTLs are for tests: WORKER_ALLOW_SHORT_LEASE_TTL=1)"
            raise _bad("lease_ttl_s", f"must be {low}-{MAX_LEASE_TTL_S} seconds, got {self.lease_ttl_s}{hint}")
        if not _WORKER_ID_RE.match(self.worker_id):
            raise _bad("worker_id", f"must be 1-200 of [A-Za-z0-9_.:@-] starting alphanumeric, got {self.worker_id!r}")
        if not 1 <= self.max_deliveries <= 1000:
            raise _bad("max_deliveries", f"must be 1-1000, got {self.max_deliveries}")
        if not 0 <= self.shutdown_grace_s <= 3600:
            raise _bad("shutdown_grace_s", f"must be 0-3600 seconds, got {self.shutdown_grace_s}")
        if not self.metrics_host:
            raise _bad("metrics_host", "must not be empty")
        if not 0 <= self.metrics_port <= 65535:
            raise _bad("metrics_port", f"must be 0-65535, got {self.metrics_port}")
        if not MIN_OUTPUT_BYTES_LIMIT <= self.max_output_bytes <= MAX_OUTPUT_BYTES_LIMIT:
            raise _bad(
                "max_output_bytes",
                f"must be {MIN_OUTPUT_BYTES_LIMIT}-{MAX_OUTPUT_BYTES_LIMIT} bytes, got {self.max_output_bytes}",
            )
        if self.stall_after_s is not None and not self.renew_interval_s < self.stall_after_s <= 86400:
            raise _bad(
                "stall_after_s",
                f"must exceed the renewal interval ({self.renew_interval_s:g} s), got {self.stall_after_s}",
            )
        if self.log_level not in _LOG_LEVELS:
            raise _bad("log_level", f"must be one of {', '.join(sorted(_LOG_LEVELS))}, got {self.log_level!r}")

    def _check_redis_url(self) -> None:
        parts = urlsplit(self.redis_url)
        if parts.scheme == "unix":
            if not parts.path:
                raise _bad("redis_url", "a unix:// URL needs a socket path")
            return
        if parts.scheme not in ("redis", "rediss"):
            raise _bad("redis_url", "must be host:port or a redis://, rediss:// or unix:// URL")
        try:
            port = parts.port
        except ValueError as exc:
            raise _bad("redis_url", f"invalid port: {exc}") from None
        if not parts.hostname or (port is not None and port == 0):
            raise _bad("redis_url", "must name a host (and a port 1-65535)")

    # -- derived timings -----------------------------------------------------------------

    @property
    def renew_interval_s(self) -> float:
        """How often a running task's lease is renewed: TTL/3 (floored at 5 s unless short TTLs are allowed)."""
        third = self.lease_ttl_s / 3
        return third if self.allow_short_lease_ttl else max(third, RENEW_FLOOR_S)

    @property
    def renew_timeout_s(self) -> float:
        """The deadline of one renewal call: at most half the renewal interval, so a retry fits before expiry."""
        return min(RENEW_CALL_TIMEOUT_S, self.renew_interval_s / 2)

    @property
    def reclaim_interval_s(self) -> float:
        """How often each stream's PEL is scanned: TTL/2 (floored at 10 s unless short TTLs are allowed)."""
        half = self.lease_ttl_s / 2
        return half if self.allow_short_lease_ttl else max(half, RECLAIM_FLOOR_S)

    @property
    def reclaim_min_idle_s(self) -> float:
        """A pending message idle this long belongs to a worker that stopped renewing: the TTL."""
        return float(self.lease_ttl_s)

    @property
    def stall_threshold_s(self) -> float:
        """The progress watchdog's threshold (WORKER_STALL_SECONDS, default 2 x TTL)."""
        return self.stall_after_s if self.stall_after_s is not None else 2.0 * self.lease_ttl_s

    @property
    def served_queues(self) -> tuple[str, ...]:
        """WORKER_QUEUES if set, otherwise "http" plus one queue per configured runtime."""
        if self.queues:
            return self.queues
        return ("http", *sorted(self.lang_server_addrs))

    # -- environment ---------------------------------------------------------------------

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> WorkerConfig:
        """Builds the config from environment variables (see the module docstring).

        Raises:
            ConfigError: a variable is malformed or out of range; names the variable.
        """
        kwargs: dict[str, Any] = {}
        env = {k: v.strip() for k, v in environ.items()}

        def text(var: str) -> str | None:
            value = env.get(var)
            return value if value else None

        if (value := text("COORDINATOR_ADDR")) is not None:
            kwargs["coordinator_addr"] = value
        if "COORDINATOR_TOKEN" in env:
            kwargs["coordinator_token"] = env["COORDINATOR_TOKEN"]
        if (value := text("COORDINATOR_TLS_CA")) is not None:
            try:
                kwargs["coordinator_tls_ca"] = Path(value).read_bytes()
            except OSError as exc:
                raise ConfigError("COORDINATOR_TLS_CA", f"cannot read {value}: {exc.strerror}") from None
        if (value := text("REDIS_ADDR")) is not None:
            kwargs["redis_url"] = value if "://" in value else _redis_url_from_addr(value)
        if (value := text("LANG_WORKER_ADDRS")) is not None:
            kwargs["lang_server_addrs"] = _parse_lang_addrs(value)
        if (value := text("WORKER_QUEUES")) is not None:
            queues = tuple(dict.fromkeys(q.strip().lower() for q in value.split(",") if q.strip()))
            if not queues:
                raise ConfigError("WORKER_QUEUES", "lists no queue")
            kwargs["queues"] = queues
        for var, name in (
            ("WORKER_CONCURRENCY", "concurrency"),
            ("LEASE_TTL_SECONDS", "lease_ttl_s"),
            ("MAX_DELIVERIES", "max_deliveries"),
            ("WORKER_METRICS_PORT", "metrics_port"),
            ("WORKER_MAX_OUTPUT_BYTES", "max_output_bytes"),
        ):
            if (value := text(var)) is not None:
                kwargs[name] = _int(var, value)
        for var, name in (
            ("WORKER_SHUTDOWN_GRACE_SECONDS", "shutdown_grace_s"),
            ("WORKER_STALL_SECONDS", "stall_after_s"),
        ):
            if (value := text(var)) is not None:
                kwargs[name] = _float(var, value)
        if "WORKER_ALLOW_SHORT_LEASE_TTL" in env:
            flag = env["WORKER_ALLOW_SHORT_LEASE_TTL"].lower()
            if flag not in _TRUE | _FALSE:
                raise ConfigError("WORKER_ALLOW_SHORT_LEASE_TTL", f"must be true or false, got {flag!r}")
            kwargs["allow_short_lease_ttl"] = flag in _TRUE
        if (value := text("WORKER_ID")) is not None:
            kwargs["worker_id"] = value
        if (value := text("WORKER_METRICS_HOST")) is not None:
            kwargs["metrics_host"] = value
        if (value := text("WORKER_LOG_LEVEL")) is not None:
            kwargs["log_level"] = value.lower()
        return cls(**kwargs)


def _int(var: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(var, f"must be an integer, got {value!r}") from None


def _float(var: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(var, f"must be a number of seconds, got {value!r}") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise ConfigError(var, f"must be a finite number, got {value!r}")
    return number


def _redis_url_from_addr(addr: str) -> str:
    _check_host_port("redis_url", addr)
    return f"redis://{addr}/0"


def _parse_lang_addrs(value: str) -> dict[str, str]:
    addrs: dict[str, str] = {}
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        runtime, sep, addr = item.partition(":")
        if not sep or not runtime:
            raise ConfigError("LANG_WORKER_ADDRS", f"entries must be runtime:host:port, got {item!r}")
        canonical = canonical_runtime(runtime)
        if canonical in addrs:
            raise ConfigError("LANG_WORKER_ADDRS", f"runtime {canonical!r} is listed twice")
        addrs[canonical] = addr.strip()
    return addrs
