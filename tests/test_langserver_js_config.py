"""Configuration from the environment: defaults, every variable, and exit code 3 naming a bad one."""

from __future__ import annotations

import subprocess
import sys

import pytest

from langserver_js.config import ServerConfig
from langserver_js.errors import ConfigError
from tests.langserver_js_support import REPO_ROOT, server_env


def test_defaults() -> None:
    config = ServerConfig.from_env({})
    assert config.listen_addr == "127.0.0.1:50052"
    assert config.max_concurrency == 4
    assert config.pool_processes == 5
    assert config.heap_limit_mb == 128
    assert config.default_timeout_s == 30
    assert config.effective_timeout_s(0) == 30
    assert config.effective_timeout_s(-5) == 30
    assert config.effective_timeout_s(10) == 10
    assert config.effective_timeout_s(100_000) == config.max_timeout_s


def test_every_variable_is_read() -> None:
    config = ServerConfig.from_env(
        {
            "LANGSERVER_ADDR": "[::1]:6000",
            "LOG_LEVEL": "DEBUG",
            "JS_MAX_CONCURRENCY": "3",
            "JS_POOL_PROCESSES": "6",
            "JS_RECYCLE_AFTER": "10",
            "JS_HEAP_LIMIT_MB": "64",
            "JS_DATA_LIMIT_MB": "0",
            "JS_RSS_LIMIT_MB": "512",
            "JS_DEFAULT_TIMEOUT_SECONDS": "2.5",
            "JS_MAX_TIMEOUT_SECONDS": "60",
            "JS_KILL_GRACE_SECONDS": "1",
            "JS_MAX_CODE_BYTES": "100",
            "JS_MAX_INPUT_BYTES": "200",
            "JS_MAX_OUTPUT_BYTES": "300",
            "JS_MAX_LOG_BYTES": "0",
            "JS_SHUTDOWN_GRACE_SECONDS": "5",
            "JS_WORKER_START_TIMEOUT_SECONDS": "7",
        }
    )
    assert config == ServerConfig(
        listen_host="::1",
        listen_port=6000,
        log_level="debug",
        max_concurrency=3,
        pool_processes=6,
        recycle_after=10,
        heap_limit_mb=64,
        data_limit_mb=0,
        rss_limit_mb=512,
        default_timeout_s=2.5,
        max_timeout_s=60,
        kill_grace_s=1,
        max_code_bytes=100,
        max_input_bytes=200,
        max_output_bytes=300,
        max_log_bytes=0,
        shutdown_grace_s=5,
        worker_start_timeout_s=7,
    )
    assert config.listen_addr == "[::1]:6000"


@pytest.mark.parametrize(
    ("variable", "value", "others"),
    [
        ("LANGSERVER_ADDR", "no-port", {}),
        ("LANGSERVER_ADDR", "127.0.0.1:70000", {}),
        ("LOG_LEVEL", "loud", {}),
        ("JS_MAX_CONCURRENCY", "0", {}),
        ("JS_POOL_PROCESSES", "2", {"JS_MAX_CONCURRENCY": "4"}),
        ("JS_RECYCLE_AFTER", "many", {}),
        ("JS_HEAP_LIMIT_MB", "8", {}),
        ("JS_DATA_LIMIT_MB", "512", {}),
        ("JS_RSS_LIMIT_MB", "100", {}),
        ("JS_DEFAULT_TIMEOUT_SECONDS", "90", {"JS_MAX_TIMEOUT_SECONDS": "60"}),
        ("JS_MAX_TIMEOUT_SECONDS", "inf", {}),
        ("JS_KILL_GRACE_SECONDS", "-1", {}),
        ("JS_MAX_CODE_BYTES", "1.5", {}),
        ("JS_MAX_INPUT_BYTES", "0", {}),
        ("JS_MAX_OUTPUT_BYTES", "", {"JS_MAX_OUTPUT_BYTES": "-3"}),
        ("JS_MAX_LOG_BYTES", "-1", {}),
        ("JS_SHUTDOWN_GRACE_SECONDS", "soon", {}),
        ("JS_WORKER_START_TIMEOUT_SECONDS", "0", {}),
    ],
)
def test_invalid_values_name_their_variable(variable: str, value: str, others: dict[str, str]) -> None:
    environ = {variable: value, **others}
    with pytest.raises(ConfigError) as caught:
        ServerConfig.from_env(environ)
    assert caught.value.variable == variable
    assert str(caught.value).startswith(f"{variable}: ")


@pytest.mark.parametrize(
    ("variable", "value"), [("JS_HEAP_LIMIT_MB", "lots"), ("LANGSERVER_ADDR", "localhost"), ("JS_POOL_PROCESSES", "0")]
)
def test_the_server_exits_3_naming_a_bad_variable(variable: str, value: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "langserver_js"],
        env=server_env({variable: value}),
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3
    assert variable.encode() in done.stderr
    assert b"invalid configuration" in done.stderr
