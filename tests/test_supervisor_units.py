"""Pure parts of the supervisor: configuration, restart policy, log tagging, exit descriptions."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from supervisor.config import DevConfig, Role, SupervisorConfig
from supervisor.errors import ConfigError
from supervisor.logstream import LogSink
from supervisor.reaper import describe_exit
from supervisor.restart_policy import RestartPolicy
from supervisor.worker_node import node_stages


def test_defaults_run_everything_on_free_loopback_ports() -> None:
    config = SupervisorConfig.from_env({})
    assert config.role is Role.ALL and config.spawns_language_servers
    stages = node_stages(config)
    assert [s.name for s in stages] == ["language servers", "worker"]
    python, js = stages[0].children
    assert python.health_addr and python.health_addr.startswith("127.0.0.1:") and not python.health_addr.endswith(":0")
    assert python.env["LANGSERVER_ADDR"] == python.health_addr
    assert python.memory_limit_bytes == 2048 << 20
    worker = stages[1].children[0]
    assert worker.env["LANG_WORKER_ADDRS"] == f"python:{python.health_addr},js:{js.health_addr}"
    assert worker.memory_limit_bytes == 0
    assert worker.stop_timeout_s == 30 + 5  # the worker's grace period plus the margin


def test_external_language_servers_mean_only_a_worker() -> None:
    config = SupervisorConfig.from_env({"LANG_WORKER_ADDRS": "python:ls-py:50053,js:ls-js:50052"})
    stages = node_stages(config)
    assert [c.name for s in stages for c in s.children] == ["worker"]
    assert stages[0].children[0].env["LANG_WORKER_ADDRS"] == "python:ls-py:50053,js:ls-js:50052"


def test_single_language_server_roles_default_to_the_servers_own_ports() -> None:
    python = node_stages(SupervisorConfig.from_env({"SUPERVISOR_ROLE": "langserver-python"}))
    assert [c.env["LANGSERVER_ADDR"] for s in python for c in s.children] == ["127.0.0.1:50053"]
    js = node_stages(SupervisorConfig.from_env({}, role="langserver-js"))
    assert [c.env["LANGSERVER_ADDR"] for s in js for c in s.children] == ["127.0.0.1:50052"]
    bound = node_stages(SupervisorConfig.from_env({"LANGSERVER_JS_ADDR": "0.0.0.0:7000"}, role="langserver-js"))
    assert bound[0].children[0].env["LANGSERVER_ADDR"] == "0.0.0.0:7000"


def test_role_option_wins_over_the_environment() -> None:
    assert SupervisorConfig.from_env({"SUPERVISOR_ROLE": "worker"}, role="langserver-js").role is Role.LANGSERVER_JS


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"SUPERVISOR_ROLE": "everything"}, "SUPERVISOR_ROLE"),
        ({"SUPERVISOR_CRASH_LOOP_LIMIT": "0"}, "SUPERVISOR_CRASH_LOOP_LIMIT"),
        ({"SUPERVISOR_CRASH_LOOP_LIMIT": "x"}, "SUPERVISOR_CRASH_LOOP_LIMIT"),
        ({"SUPERVISOR_WATCH_INTERVAL_SECONDS": "0"}, "SUPERVISOR_WATCH_INTERVAL_SECONDS"),
        ({"SUPERVISOR_LANGSERVER_MEMORY_LIMIT_MB": "-1"}, "SUPERVISOR_LANGSERVER_MEMORY_LIMIT_MB"),
        ({"SUPERVISOR_RESTART_BACKOFF_MAX_SECONDS": "0.1"}, "SUPERVISOR_RESTART_BACKOFF_MAX_SECONDS"),
        ({"WORKER_SHUTDOWN_GRACE_SECONDS": "-1"}, "WORKER_SHUTDOWN_GRACE_SECONDS"),
        ({"LANGSERVER_PYTHON_ADDR": "nowhere"}, "LANGSERVER_PYTHON_ADDR"),
        ({"LANG_WORKER_ADDRS": "python"}, "LANG_WORKER_ADDRS"),
        ({"LANG_WORKER_ADDRS": "python:host"}, "LANG_WORKER_ADDRS"),
        ({"SUPERVISOR_METRICS_PORT": "70000"}, "SUPERVISOR_METRICS_PORT"),
        ({"SUPERVISOR_WORKER_CMD": "'unbalanced"}, "SUPERVISOR_WORKER_CMD"),
        ({"LOG_LEVEL": "loud"}, "LOG_LEVEL"),
    ],
)
def test_invalid_settings_name_their_variable(environ: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as caught:
        SupervisorConfig.from_env(environ)
    assert caught.value.variable == variable
    assert str(caught.value).startswith(variable)


def test_dev_config_prefers_the_option_then_the_variable(tmp_path: Path) -> None:
    default = tmp_path / "default"
    from_env = DevConfig.from_env(
        {"SUPERVISOR_DEV_DATA_DIR": str(tmp_path / "env")}, default_data_dir=default, examples_dir=tmp_path
    )
    assert from_env.data_dir == tmp_path / "env"
    option = DevConfig.from_env(
        {"SUPERVISOR_DEV_DATA_DIR": str(tmp_path / "env")},
        default_data_dir=default,
        examples_dir=tmp_path,
        data_dir=str(tmp_path / "opt"),
    )
    assert option.data_dir == tmp_path / "opt"
    assert DevConfig.from_env({}, default_data_dir=default, examples_dir=tmp_path).data_dir == default
    with pytest.raises(ConfigError, match="COORDINATOR_ADDR"):
        DevConfig.from_env({"COORDINATOR_ADDR": "x"}, default_data_dir=default, examples_dir=tmp_path)


def test_backoff_doubles_up_to_the_cap_and_a_crash_loop_returns_none() -> None:
    policy = RestartPolicy(initial_s=0.5, max_s=2.0, limit=4, window_s=60.0)
    delays = [policy.record_exit(now=float(t), uptime_s=0.1) for t in range(4)]
    assert delays == [0.5, 1.0, 2.0, 2.0]
    assert policy.record_exit(now=4.0, uptime_s=0.1) is None  # the fifth exit within 60 s


def test_exits_outside_the_window_are_forgotten_and_a_stable_child_starts_over() -> None:
    policy = RestartPolicy(initial_s=1.0, max_s=30.0, limit=2, window_s=10.0)
    assert policy.record_exit(now=0.0, uptime_s=1) == 1.0
    assert policy.record_exit(now=5.0, uptime_s=1) == 2.0
    assert policy.record_exit(now=100.0, uptime_s=95.0) == 1.0  # ran longer than the window: backoff reset
    assert policy.recent_exits == 1


def test_log_sink_tags_json_and_wraps_anything_else() -> None:
    out = io.BytesIO()
    sink = LogSink(out)
    sink.child_line("worker", 42, b'{"event": "hello", "level": "info", "pid": 7}\n')
    sink.child_line("worker", 42, b"Traceback (most recent call last):\n")
    sink.child_line("worker", 42, b"[1, 2]\n")  # JSON, but not an object
    sink.child_line("worker", 42, b"   \n")  # blank lines are dropped
    sink.child_line("js", 43, b'{"event": "cut', truncated=True)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 4
    assert lines[0] == {"event": "hello", "level": "info", "pid": 7, "process": "worker"}
    assert lines[1]["event"] == "Traceback (most recent call last):" and lines[1]["raw"] is True
    assert lines[1]["process"] == "worker" and lines[1]["pid"] == 42
    assert lines[2]["event"] == "[1, 2]" and lines[2]["raw"] is True
    assert lines[3]["truncated"] is True and lines[3]["process"] == "js"


def test_exit_descriptions_name_signals() -> None:
    assert describe_exit(0) == "exited with code 0"
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-9) == "killed by SIGKILL (possible OOM kill)"
    assert describe_exit(-15) == "killed by SIGTERM"
