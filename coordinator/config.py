"""The coordinator's configuration, read from the environment in one place.

| variable | default | meaning |
|---|---|---|
| `DATABASE_URL` | (required) | PostgreSQL DSN |
| `REDIS_ADDR` | `127.0.0.1:6379` | Redis `host:port`, or a `redis://`/`rediss://` URL |
| `COORDINATOR_LISTEN_ADDR` | `127.0.0.1:50051` | gRPC listen address (loopback unless told otherwise) |
| `COORDINATOR_TOKEN` | unset | when set, every RPC but health needs `authorization: Bearer <token>` |
| `COORDINATOR_TLS_CERT` / `COORDINATOR_TLS_KEY` | unset | PEM files; both set → TLS |
| `STREAM_SHARDS` | `4` | streams per queue (published in Redis for workers) |
| `SWEEP_INTERVAL_SECONDS` | `10` | how often the sweeper looks for stalled tasks |
| `STALL_AFTER_SECONDS` | `30` | a task with no progress for this long is checked for a lost message |
| `RELAY_POLL_INTERVAL_SECONDS` | `1` | relay polling fallback when no NOTIFY arrives |
| `RELAY_BATCH_SIZE` | `500` | outbox rows published per round trip |
| `OUTBOX_RETENTION_SECONDS` | `3600` | published outbox rows are kept this long |
| `MAX_OUTPUT_BYTES` | `1048576` | a task output above this fails the task |
| `DB_POOL_SIZE` | `20` | PostgreSQL connections |
| `COORDINATOR_METRICS_PORT` | `0` (off) | Prometheus metrics on 127.0.0.1:PORT |
| `LOG_LEVEL` | `info` | debug, info, warning, error |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from coordinator.errors import ConfigError

__all__ = ["DEFAULT_LEASE_TTL_S", "CoordinatorConfig"]

#: The lease length when a request asks for ttl_seconds <= 0.
DEFAULT_LEASE_TTL_S = 90
DEFAULT_LISTEN_ADDR = "127.0.0.1:50051"
DEFAULT_REDIS_ADDR = "127.0.0.1:6379"


@dataclass(frozen=True, kw_only=True)
class CoordinatorConfig:
    database_url: str
    redis_url: str
    listen_addr: str = DEFAULT_LISTEN_ADDR
    token: str | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    stream_shards: int = 4
    sweep_interval_s: float = 10.0
    stall_after_s: float = 30.0
    relay_poll_interval_s: float = 1.0
    relay_batch_size: int = 500
    outbox_retention_s: float = 3600.0
    max_output_bytes: int = 1 << 20
    db_pool_size: int = 20
    metrics_port: int = 0
    log_level: str = "info"

    def __post_init__(self) -> None:
        if not self.database_url:
            raise ConfigError("DATABASE_URL is required (a PostgreSQL DSN)")
        if self.stream_shards < 1 or self.stream_shards > 1024:
            raise ConfigError(f"STREAM_SHARDS must be between 1 and 1024, not {self.stream_shards}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("COORDINATOR_TLS_CERT and COORDINATOR_TLS_KEY must be set together")
        for name, value in (
            ("SWEEP_INTERVAL_SECONDS", self.sweep_interval_s),
            ("STALL_AFTER_SECONDS", self.stall_after_s),
            ("RELAY_POLL_INTERVAL_SECONDS", self.relay_poll_interval_s),
        ):
            if value <= 0:
                raise ConfigError(f"{name} must be positive, not {value}")
        if self.relay_batch_size < 1:
            raise ConfigError(f"RELAY_BATCH_SIZE must be positive, not {self.relay_batch_size}")
        if self.db_pool_size < 2:
            raise ConfigError(f"DB_POOL_SIZE must be at least 2, not {self.db_pool_size}")
        if self.max_output_bytes < 1:
            raise ConfigError(f"MAX_OUTPUT_BYTES must be positive, not {self.max_output_bytes}")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"COORDINATOR_METRICS_PORT must be a port number, not {self.metrics_port}")
        _check_listen_addr(self.listen_addr)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> CoordinatorConfig:
        """Builds the configuration from environment variables.

        Raises:
            ConfigError: a variable is missing or invalid; the message names it.
        """
        cert = environ.get("COORDINATOR_TLS_CERT") or None
        key = environ.get("COORDINATOR_TLS_KEY") or None
        return cls(
            database_url=environ.get("DATABASE_URL", ""),
            redis_url=redis_url_from_addr(environ.get("REDIS_ADDR") or DEFAULT_REDIS_ADDR),
            listen_addr=environ.get("COORDINATOR_LISTEN_ADDR") or DEFAULT_LISTEN_ADDR,
            token=environ.get("COORDINATOR_TOKEN") or None,
            tls_cert=Path(cert) if cert else None,
            tls_key=Path(key) if key else None,
            stream_shards=_int(environ, "STREAM_SHARDS", 4),
            sweep_interval_s=_float(environ, "SWEEP_INTERVAL_SECONDS", 10.0),
            stall_after_s=_float(environ, "STALL_AFTER_SECONDS", 30.0),
            relay_poll_interval_s=_float(environ, "RELAY_POLL_INTERVAL_SECONDS", 1.0),
            relay_batch_size=_int(environ, "RELAY_BATCH_SIZE", 500),
            outbox_retention_s=_float(environ, "OUTBOX_RETENTION_SECONDS", 3600.0),
            max_output_bytes=_int(environ, "MAX_OUTPUT_BYTES", 1 << 20),
            db_pool_size=_int(environ, "DB_POOL_SIZE", 20),
            metrics_port=_int(environ, "COORDINATOR_METRICS_PORT", 0),
            log_level=environ.get("LOG_LEVEL") or "info",
        )


def redis_url_from_addr(addr: str) -> str:
    """Accepts `host:port` (as in the seed's REDIS_ADDR) or a full Redis URL.

    Raises:
        ConfigError: neither form.
    """
    if addr.startswith(("redis://", "rediss://", "unix://")):
        return addr
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"REDIS_ADDR must be host:port or a redis:// URL, not {addr!r}")
    return f"redis://{host}:{port}/0"


def _check_listen_addr(addr: str) -> None:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"COORDINATOR_LISTEN_ADDR must be host:port, not {addr!r}")


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, not {raw!r}") from None


def _float(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, not {raw!r}") from None
