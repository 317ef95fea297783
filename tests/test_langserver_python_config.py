"""Configuration: every variable is read in one place; bad values name the variable."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from langserver_python.config import DEFAULT_ALLOWED_MODULES, ServerConfig, parse_unsafe_layers
from langserver_python.errors import ConfigError
from langserver_python.protocol import Layer

ROOT = Path(__file__).resolve().parent.parent


def test_defaults() -> None:
    config = ServerConfig.from_env({})
    assert config.addr == "127.0.0.1:50053"
    assert config.memory_limit_mb == 256
    assert config.allowed_modules == DEFAULT_ALLOWED_MODULES
    assert config.disabled_layers == frozenset()
    settings = config.sandbox_settings()
    assert settings.memory_limit_bytes == 256 * 1024 * 1024
    assert all(settings.enabled(layer) for layer in Layer)


def test_values_are_read() -> None:
    config = ServerConfig.from_env(
        {
            "LANGSERVER_ADDR": "0.0.0.0:6000",
            "PY_MAX_CONCURRENCY": "3",
            "PY_QUEUE_TIMEOUT_SECONDS": "2.5",
            "PY_ALLOWED_MODULES": "json, math",
            "PY_MEMORY_LIMIT_MB": "512",
        }
    )
    assert (config.addr, config.max_concurrency, config.queue_timeout_s) == ("0.0.0.0:6000", 3, 2.5)
    assert config.allowed_modules == ("json", "math")
    assert config.memory_limit_mb == 512


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LANGSERVER_ADDR", "no-port"),
        ("LANGSERVER_ADDR", "host:99999"),
        ("PY_MAX_CONCURRENCY", "0"),
        ("PY_MAX_CONCURRENCY", "many"),
        ("PY_QUEUE_TIMEOUT_SECONDS", "-1"),
        ("PY_DEFAULT_TIMEOUT_SECONDS", "nan"),
        ("PY_MEMORY_LIMIT_MB", "abc"),
        ("PY_MEMORY_LIMIT_MB", "16"),
        ("PY_MAX_OPEN_FILES", "4"),
        ("PY_ALLOWED_MODULES", "json,os"),
        ("PY_ALLOWED_MODULES", "subprocess"),
        ("PY_ALLOWED_MODULES", "json,_thread"),
        ("PY_SANDBOX_UID_BASE", "65530"),
        ("PY_SANDBOX_UID_BASE", "-5"),
        ("LOG_LEVEL", "loud"),
    ],
)
def test_bad_value_names_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ServerConfig.from_env({variable: value})
    assert caught.value.variable == variable
    assert str(caught.value).startswith(f"{variable}: ")


def test_default_timeout_above_the_maximum_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        ServerConfig.from_env({"PY_DEFAULT_TIMEOUT_SECONDS": "60", "PY_MAX_TIMEOUT_SECONDS": "10"})
    assert caught.value.variable == "PY_DEFAULT_TIMEOUT_SECONDS"


def test_layer_switch_needs_the_explicit_test_mode() -> None:
    assert parse_unsafe_layers([], {}) == frozenset()
    with pytest.raises(ConfigError) as caught:
        parse_unsafe_layers(["kernel"], {})
    assert caught.value.variable == "LANGSERVER_UNSAFE_TEST_MODE"
    with pytest.raises(ConfigError):
        parse_unsafe_layers(["kernel"], {"LANGSERVER_UNSAFE_TEST_MODE": "yes"})
    assert parse_unsafe_layers(["kernel", "process"], {"LANGSERVER_UNSAFE_TEST_MODE": "1"}) == {
        Layer.KERNEL,
        Layer.PROCESS,
    }
    with pytest.raises(ConfigError):
        parse_unsafe_layers(["everything"], {"LANGSERVER_UNSAFE_TEST_MODE": "1"})


def _run_server(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "langserver_python", *args],
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_bad_environment_exits_3_naming_the_variable() -> None:
    result = _run_server({"PY_MEMORY_LIMIT_MB": "lots"})
    assert result.returncode == 3
    assert "PY_MEMORY_LIMIT_MB" in result.stderr


def test_layer_switch_without_test_mode_exits_3() -> None:
    result = _run_server({}, "--unsafe-disable-layer=kernel")
    assert result.returncode == 3
    assert "LANGSERVER_UNSAFE_TEST_MODE" in result.stderr


def test_allowed_module_that_does_not_import_exits_3() -> None:
    result = _run_server({"PY_ALLOWED_MODULES": "json,no_such_module_anywhere"})
    assert result.returncode == 3
    assert "PY_ALLOWED_MODULES" in result.stderr
    assert "no_such_module_anywhere" in result.stderr


def test_an_address_in_use_exits_1_naming_the_variable() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = _run_server({"LANGSERVER_ADDR": f"127.0.0.1:{taken.getsockname()[1]}"})
    assert result.returncode == 1
    assert "LANGSERVER_ADDR" in result.stderr
