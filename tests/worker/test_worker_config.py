"""WorkerConfig from the environment: defaults, parsing, and errors that name the variable."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from worker.config import WorkerConfig
from worker.errors import ConfigError


def test_defaults_follow_the_seed() -> None:
    config = WorkerConfig.from_env({})
    assert config.coordinator_addr == "localhost:50051"
    assert config.redis_url == "redis://127.0.0.1:6379/0"
    assert config.concurrency == 10
    assert config.lease_ttl_s == 90
    assert config.max_deliveries == 5
    assert config.shutdown_grace_s == 30
    assert config.served_queues == ("http",)
    assert config.coordinator_token is None
    assert config.metrics_host == "127.0.0.1"
    # WORKER_ID: hostname plus a random suffix, different for every worker.
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())
    assert config.worker_id.startswith(host + "-")
    assert WorkerConfig.from_env({}).worker_id != config.worker_id


def test_timings_derive_from_the_ttl() -> None:
    config = WorkerConfig.from_env({"LEASE_TTL_SECONDS": "90"})
    assert config.renew_interval_s == 30
    assert config.reclaim_interval_s == 45
    assert config.reclaim_min_idle_s == 90
    assert config.renew_timeout_s == 5  # its own deadline, below TTL/3
    assert config.stall_threshold_s == 180
    # At the smallest accepted TTL the reclaim floor (10 s) applies.
    low = WorkerConfig.from_env({"LEASE_TTL_SECONDS": "15"})
    assert (low.renew_interval_s, low.reclaim_interval_s, low.renew_timeout_s) == (5, 10, 2.5)


def test_full_environment_is_parsed() -> None:
    config = WorkerConfig.from_env(
        {
            "COORDINATOR_ADDR": "coord.internal:7000",
            "COORDINATOR_TOKEN": "s3cret",
            "REDIS_ADDR": "10.0.0.5:6380",
            "LANG_WORKER_ADDRS": "python:127.0.0.1:50053, node:127.0.0.1:50052",
            "WORKER_CONCURRENCY": "3",
            "LEASE_TTL_SECONDS": "30",
            "WORKER_ID": "w-1",
            "MAX_DELIVERIES": "7",
            "WORKER_SHUTDOWN_GRACE_SECONDS": "2.5",
            "WORKER_METRICS_PORT": "0",
            "WORKER_MAX_OUTPUT_BYTES": "2048",
            "WORKER_LOG_LEVEL": "DEBUG",
        }
    )
    assert config.coordinator_addr == "coord.internal:7000"
    assert config.coordinator_token == "s3cret"
    assert "s3cret" not in repr(config)  # secrets never reach a log line through repr
    assert config.redis_url == "redis://10.0.0.5:6380/0"
    assert dict(config.lang_server_addrs) == {"python": "127.0.0.1:50053", "js": "127.0.0.1:50052"}
    # Default queues: http plus one per runtime ("node" is the js runtime).
    assert config.served_queues == ("http", "js", "python")
    assert (config.concurrency, config.lease_ttl_s, config.worker_id, config.max_deliveries) == (3, 30, "w-1", 7)
    assert (config.shutdown_grace_s, config.metrics_port, config.max_output_bytes) == (2.5, 0, 2048)
    assert config.log_level == "debug"


def test_worker_queues_override_the_default() -> None:
    config = WorkerConfig.from_env({"WORKER_QUEUES": " HTTP, python ,http", "LANG_WORKER_ADDRS": "js:h:1"})
    assert config.served_queues == ("http", "python")


def test_redis_url_forms() -> None:
    assert WorkerConfig.from_env({"REDIS_ADDR": "redis://:pw@r:6379/2"}).redis_url == "redis://:pw@r:6379/2"
    assert WorkerConfig.from_env({"REDIS_ADDR": "rediss://r:6380"}).redis_url == "rediss://r:6380"


def test_tls_ca_is_read_from_the_file(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\n...")
    assert WorkerConfig.from_env({"COORDINATOR_TLS_CA": str(ca)}).coordinator_tls_ca == ca.read_bytes()


@pytest.mark.parametrize(
    ("env", "variable", "fragment"),
    [
        ({"WORKER_CONCURRENCY": "ten"}, "WORKER_CONCURRENCY", "must be an integer"),
        ({"WORKER_CONCURRENCY": "0"}, "WORKER_CONCURRENCY", "must be 1-1024"),
        ({"LEASE_TTL_SECONDS": "abc"}, "LEASE_TTL_SECONDS", "must be an integer"),
        ({"LEASE_TTL_SECONDS": "14"}, "LEASE_TTL_SECONDS", "WORKER_ALLOW_SHORT_LEASE_TTL"),
        (
            {"LEASE_TTL_SECONDS": "1", "WORKER_ALLOW_SHORT_LEASE_TTL": "1"},
            "LEASE_TTL_SECONDS",
            "must be 2-86400",
        ),
        ({"WORKER_ALLOW_SHORT_LEASE_TTL": "maybe"}, "WORKER_ALLOW_SHORT_LEASE_TTL", "true or false"),
        ({"MAX_DELIVERIES": "0"}, "MAX_DELIVERIES", "must be 1-1000"),
        ({"COORDINATOR_ADDR": "nohostport"}, "COORDINATOR_ADDR", "host:port"),
        ({"COORDINATOR_ADDR": "h:99999"}, "COORDINATOR_ADDR", "port must be 1-65535"),
        ({"COORDINATOR_TOKEN": "has space"}, "COORDINATOR_TOKEN", "without whitespace"),
        ({"COORDINATOR_TLS_CA": "/nonexistent/ca.pem"}, "COORDINATOR_TLS_CA", "cannot read"),
        ({"REDIS_ADDR": "localhost"}, "REDIS_ADDR", "host:port"),
        ({"REDIS_ADDR": "http://x:1"}, "REDIS_ADDR", "redis://"),
        ({"LANG_WORKER_ADDRS": "ruby:h:1"}, "LANG_WORKER_ADDRS", "unknown runtime 'ruby'"),
        ({"LANG_WORKER_ADDRS": "python"}, "LANG_WORKER_ADDRS", "runtime:host:port"),
        ({"LANG_WORKER_ADDRS": "python:h:1,python:h:2"}, "LANG_WORKER_ADDRS", "listed twice"),
        ({"LANG_WORKER_ADDRS": "js:h:1,node:h:2"}, "LANG_WORKER_ADDRS", "listed twice"),
        ({"LANG_WORKER_ADDRS": "python:h:port"}, "LANG_WORKER_ADDRS", "port must be"),
        ({"WORKER_QUEUES": " , "}, "WORKER_QUEUES", "lists no queue"),
        ({"WORKER_QUEUES": "http,Bad Queue"}, "WORKER_QUEUES", "invalid queue name"),
        ({"WORKER_ID": "has space"}, "WORKER_ID", "must be 1-200"),
        ({"WORKER_SHUTDOWN_GRACE_SECONDS": "-1"}, "WORKER_SHUTDOWN_GRACE_SECONDS", "0-3600"),
        ({"WORKER_SHUTDOWN_GRACE_SECONDS": "nan"}, "WORKER_SHUTDOWN_GRACE_SECONDS", "finite"),
        ({"WORKER_METRICS_PORT": "70000"}, "WORKER_METRICS_PORT", "0-65535"),
        ({"WORKER_MAX_OUTPUT_BYTES": "99999999"}, "WORKER_MAX_OUTPUT_BYTES", "bytes"),
        ({"WORKER_STALL_SECONDS": "1"}, "WORKER_STALL_SECONDS", "renewal interval"),
        ({"WORKER_LOG_LEVEL": "loud"}, "WORKER_LOG_LEVEL", "must be one of"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], variable: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        WorkerConfig.from_env(env)
    assert caught.value.variable == variable
    assert str(caught.value).startswith(f"{variable}: ")
    assert fragment in str(caught.value)


def test_short_ttl_path_scales_the_floors() -> None:
    """WORKER_ALLOW_SHORT_LEASE_TTL drops the 5 s / 10 s floors so renewal stays at TTL/3."""
    config = WorkerConfig.from_env({"LEASE_TTL_SECONDS": "3", "WORKER_ALLOW_SHORT_LEASE_TTL": "true"})
    assert config.renew_interval_s == 1
    assert config.reclaim_interval_s == 1.5
    assert config.renew_timeout_s == 0.5
    # Three renewal intervals fit in the TTL: the lease survives two failed renewals.
    assert config.renew_interval_s * 3 <= config.lease_ttl_s
