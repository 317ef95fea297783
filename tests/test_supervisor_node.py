"""The supervisor's process machinery, against stand-in children that are real processes.

Each test runs `python -m supervisor` with the children replaced by
`tests/standins/child.py` (SUPERVISOR_*_CMD), which serve gRPC health, exit,
crash, ignore SIGTERM or grow memory on request, and record what happened to
them in a file.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from supervisor.node import EXIT_CONFIG, EXIT_CRASH_LOOP, EXIT_FORCED, EXIT_OK
from tests.supervisor_harness import no_survivors, standin, supervisor

pytestmark = pytest.mark.timeout(60)


def _children(**overrides: str) -> dict[str, str]:
    return {
        "SUPERVISOR_LANGSERVER_PYTHON_CMD": standin("langserver-python", "--serve"),
        "SUPERVISOR_LANGSERVER_JS_CMD": standin("langserver-js", "--serve"),
        "SUPERVISOR_WORKER_CMD": standin("worker", "--drain", "0.3"),
        **overrides,
    }


def _serving(addr: str) -> bool:
    with grpc.insecure_channel(addr) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="langserver.v1.LanguageServer"), timeout=2
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def test_sigterm_drains_worker_first_then_language_servers_and_leaves_no_process(tmp_path: Path) -> None:
    env = _children(SUPERVISOR_LANGSERVER_JS_CMD=standin("langserver-js", "--serve", "--grandchild"))
    with supervisor(tmp_path, **env) as node:
        node.wait_ready()
        node.wait_for(lambda: bool(node.events("langserver-js", "grandchild")), what="grandchild started")
        node.wait_started("worker")
        assert len(node.note_descendants()) >= 4  # two language servers, the worker, a grandchild

        node.signal(signal.SIGTERM)
        assert node.wait_exit(20) == EXIT_OK

        order = [(name, event) for name, event, _, _ in node.records() if event in ("term", "exit")]
        worker_exit = order.index(("worker", "exit"))
        assert order.index(("worker", "term")) < worker_exit
        assert worker_exit < order.index(("langserver-python", "term"))
        assert worker_exit < order.index(("langserver-js", "term"))
        assert no_survivors(node) == []


def test_worker_starts_only_after_both_language_servers_serve_and_gets_their_addresses(tmp_path: Path) -> None:
    env = _children(SUPERVISOR_LANGSERVER_JS_CMD=standin("langserver-js", "--serve", "--serve-after", "1.5"))
    with supervisor(tmp_path, **env) as node:
        node.wait_ready()
        node.wait_started("worker")
        names = [(name, event) for name, event, _, _ in node.records()]
        worker_started = names.index(("worker", "started"))
        assert names.index(("langserver-js", "serving")) < worker_started
        assert names.index(("langserver-python", "serving")) < worker_started

        (_, _, _, handed) = node.events("worker", "started")[0]
        (_, _, _, python_addr) = node.events("langserver-python", "serving")[0]
        (_, _, _, js_addr) = node.events("langserver-js", "serving")[0]
        assert handed == f"python:{python_addr},js:{js_addr}"
        assert python_addr.startswith("127.0.0.1:") and js_addr.startswith("127.0.0.1:")
        assert _serving(python_addr) and _serving(js_addr)


def test_a_killed_language_server_is_restarted_on_the_same_address(tmp_path: Path) -> None:
    with supervisor(tmp_path, **_children()) as node:
        node.wait_ready()
        (_, _, first_pid, addr) = node.events("langserver-python", "serving")[0]
        os.kill(first_pid, signal.SIGKILL)
        node.wait_for(lambda: len(node.events("langserver-python", "serving")) == 2, what="restart")

        (_, _, second_pid, second_addr) = node.events("langserver-python", "serving")[1]
        assert second_pid != first_pid
        assert second_addr == addr  # the worker's LANG_WORKER_ADDRS stays valid
        assert len(node.events("worker", "started")) == 1  # the worker kept running
        assert node.has_log(lambda e: "killed by SIGKILL" in str(e.get("event")) and e.get("process") == "supervisor")


def test_crash_loop_stops_the_node_with_exit_code_4_and_a_clear_message(tmp_path: Path) -> None:
    env = _children(
        SUPERVISOR_WORKER_CMD=standin("worker", "--exit-after", "0.05", "--exit-code", "1"),
        SUPERVISOR_CRASH_LOOP_LIMIT="2",
        SUPERVISOR_CRASH_LOOP_WINDOW_SECONDS="30",
    )
    with supervisor(tmp_path, **env) as node:
        assert node.wait_exit(30) == EXIT_CRASH_LOOP
        assert len(node.events("worker", "started")) == 3  # the first start and two restarts, then the limit
        message = [e for e in node.logs() if "crash-looping" in str(e.get("event"))]
        assert message and message[0]["level"] == "error"
        assert "worker" in message[0]["event"] and "exited with code 1" in message[0]["event"]
        # The language servers were still stopped in order, not abandoned.
        assert node.events("langserver-python", "term") and node.events("langserver-js", "term")
        assert no_survivors(node) == []


def test_a_child_with_a_configuration_error_is_not_restarted_and_the_node_exits_3(tmp_path: Path) -> None:
    env = _children(SUPERVISOR_WORKER_CMD=standin("worker", "--exit-code", "3"))
    with supervisor(tmp_path, **env) as node:
        assert node.wait_exit(30) == EXIT_CONFIG
        assert len(node.events("worker", "started")) == 1
        assert node.has_log(lambda e: "configuration is invalid" in str(e.get("event")))


def test_a_language_server_above_the_memory_ceiling_is_restarted(tmp_path: Path) -> None:
    env = _children(
        SUPERVISOR_LANGSERVER_PYTHON_CMD=standin("langserver-python", "--serve", "--grow-mb", "300"),
        SUPERVISOR_LANGSERVER_MEMORY_LIMIT_MB="200",
    )
    with supervisor(tmp_path, **env) as node:
        node.wait_for(lambda: len(node.events("langserver-python", "started")) >= 2, what="memory restart")
        assert node.has_log(lambda e: "limit 200 MiB" in str(e.get("event")) and e.get("child") == "langserver-python")
        assert node.events("langserver-python", "term")  # stopped gracefully first
        assert len(node.events("langserver-js", "started")) == 1  # the other one is under the ceiling


def test_external_lang_worker_addrs_spawn_no_language_server(tmp_path: Path) -> None:
    external = "python:10.0.0.5:50053,js:10.0.0.6:50052"
    with supervisor(tmp_path, LANG_WORKER_ADDRS=external, **_children()) as node:
        node.wait_ready()
        node.wait_started("worker")
        assert [r[0] for r in node.records() if r[1] == "started"] == ["worker"]
        assert node.events("worker", "started")[0][3] == external
        assert {p.pid for p in node.descendants()} == {node.events("worker", "started")[0][2]}


@pytest.mark.parametrize(
    ("role", "expected"),
    [("langserver-python", "langserver-python"), ("langserver-js", "langserver-js"), ("worker", "worker")],
)
def test_a_role_runs_only_its_part(tmp_path: Path, role: str, expected: str) -> None:
    with supervisor(tmp_path, "--role", role, **_children()) as node:
        node.wait_ready()
        node.wait_started(expected)
        assert [r[0] for r in node.records() if r[1] == "started"] == [expected]
        node.signal(signal.SIGTERM)
        assert node.wait_exit(20) == EXIT_OK


def test_role_from_environment_and_its_listen_address(tmp_path: Path) -> None:
    from supervisor.worker_node import bind_free_port

    addr = f"127.0.0.1:{bind_free_port('127.0.0.1')}"
    with supervisor(tmp_path, SUPERVISOR_ROLE="langserver-js", LANGSERVER_JS_ADDR=addr, **_children()) as node:
        node.wait_ready()
        assert node.events("langserver-js", "serving")[0][3] == addr
        assert _serving(addr)


def test_a_second_signal_kills_everything_at_once(tmp_path: Path) -> None:
    env = _children(
        SUPERVISOR_WORKER_CMD=standin("worker", "--ignore-term"),
        WORKER_SHUTDOWN_GRACE_SECONDS="60",
    )
    with supervisor(tmp_path, **env) as node:
        node.wait_ready()
        node.wait_started("worker")
        node.signal(signal.SIGTERM)
        node.wait_for(lambda: node.has_log(lambda e: e.get("event") == "stopping worker (shutting down)"))
        started = time.monotonic()
        node.signal(signal.SIGINT)
        assert node.wait_exit(20) == EXIT_FORCED
        assert time.monotonic() - started < 10  # not the 60 s grace period
        assert no_survivors(node) == []


def test_a_child_that_ignores_sigterm_is_killed_after_its_stop_timeout(tmp_path: Path) -> None:
    env = _children(
        SUPERVISOR_WORKER_CMD=standin("worker", "--ignore-term"),
        WORKER_SHUTDOWN_GRACE_SECONDS="0.5",
        SUPERVISOR_STOP_MARGIN_SECONDS="0.5",
    )
    with supervisor(tmp_path, **env) as node:
        node.wait_ready()
        node.wait_started("worker")
        node.signal(signal.SIGTERM)
        assert node.wait_exit(20) == EXIT_OK
        assert node.has_log(lambda e: "still running 1s after SIGTERM" in str(e.get("event")))
        assert node.has_log(lambda e: e.get("event") == "worker killed by SIGKILL (possible OOM kill)")
        assert no_survivors(node) == []


def test_children_die_with_a_killed_supervisor(tmp_path: Path) -> None:
    with supervisor(tmp_path, **_children()) as node:
        node.wait_ready()
        node.wait_started("worker")
        assert len(node.note_descendants()) == 3
        node.signal(signal.SIGKILL)
        node.wait_exit(10)
        # PR_SET_PDEATHSIG: each child gets SIGTERM from the kernel and drains.
        assert no_survivors(node) == []
        assert {r[0] for r in node.records() if r[1] == "term"} == {"worker", "langserver-python", "langserver-js"}


def test_a_language_server_that_never_serves_counts_as_a_failed_start(tmp_path: Path) -> None:
    env = _children(
        SUPERVISOR_LANGSERVER_JS_CMD=standin("langserver-js", "--not-serving"),
        SUPERVISOR_READY_TIMEOUT_SECONDS="1",
        SUPERVISOR_CRASH_LOOP_LIMIT="1",
    )
    with supervisor(tmp_path, **env) as node:
        assert node.wait_exit(30) == EXIT_CRASH_LOOP
        assert not node.events("worker", "started")  # never started without both servers
        assert node.has_log(lambda e: "did not report SERVING" in str(e.get("event")))


def test_every_log_line_is_json_and_names_its_process(tmp_path: Path) -> None:
    with supervisor(tmp_path, **_children()) as node:
        node.wait_ready()
        node.wait_for(lambda: node.has_log(lambda e: e.get("event") == "plain text from worker"))
        node.signal(signal.SIGTERM)
        node.wait_exit(20)
    lines = node.logs()
    assert all("unparsed" not in line for line in lines), [line for line in lines if "unparsed" in line][:3]
    assert all(line.get("process") for line in lines)
    assert {line["process"] for line in lines} >= {"supervisor", "worker", "langserver-python", "langserver-js"}
    structured = [line for line in lines if line.get("event") == "langserver-js started"]
    assert structured and structured[0]["service"] == "langserver-js" and "raw" not in structured[0]
    plain = [line for line in lines if line.get("event") == "plain text from worker"]
    assert plain and plain[0]["raw"] is True and plain[0]["process"] == "worker"


def test_invalid_configuration_exits_3_naming_the_variable(tmp_path: Path) -> None:
    with supervisor(tmp_path, SUPERVISOR_CRASH_LOOP_LIMIT="many") as node:
        assert node.wait_exit(20) == EXIT_CONFIG
        errors = [line for line in node.logs() if line.get("level") == "error"]
        assert errors and errors[0].get("variable") == "SUPERVISOR_CRASH_LOOP_LIMIT"
        assert node.records() == []


def test_a_language_server_that_stops_answering_health_checks_is_restarted(tmp_path: Path) -> None:
    env = _children(SUPERVISOR_LANGSERVER_JS_CMD=standin("langserver-js", "--serve", "--unhealthy-after", "2"))
    with supervisor(tmp_path, **env) as node:
        node.wait_for(lambda: len(node.events("langserver-js", "started")) >= 2, what="restart of the unhealthy server")
        assert node.events("langserver-js", "unhealthy")
        assert node.has_log(lambda e: "failed a health check (3 in a row)" in str(e.get("event")))
        assert node.has_log(lambda e: str(e.get("event")).startswith("stopping langserver-js (health check failed"))
        assert len(node.events("langserver-python", "started")) == 1


def test_metrics_report_each_childs_memory_and_restarts(tmp_path: Path) -> None:
    import urllib.request

    from supervisor.worker_node import bind_free_port

    port = bind_free_port("127.0.0.1")
    with supervisor(tmp_path, SUPERVISOR_METRICS_PORT=str(port), **_children()) as node:
        node.wait_ready()
        (_, _, pid, _) = node.events("langserver-python", "serving")[0]
        os.kill(pid, signal.SIGKILL)
        node.wait_for(lambda: len(node.events("langserver-python", "serving")) == 2, what="restart")

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                return str(response.read().decode())

        def rss(text: str, process: str) -> float:
            prefix = f'supervisor_child_rss_bytes{{process="{process}"}} '
            return next((float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)), 0.0)

        node.wait_for(lambda: rss(scrape(), "worker") > 0 and rss(scrape(), "langserver-js") > 0, what="samples")
        text = scrape()
        assert rss(text, "langserver-js") > 10 * 2**20  # a Python process with gRPC loaded
        assert 'supervisor_child_restarts_total{process="langserver-python",reason="exited"} 1.0' in text
        assert 'supervisor_child_running{process="worker"} 1.0' in text


def test_a_command_that_cannot_run_is_reported_and_ends_in_a_crash_loop(tmp_path: Path) -> None:
    env = _children(SUPERVISOR_WORKER_CMD="/nonexistent/worker-binary", SUPERVISOR_CRASH_LOOP_LIMIT="1")
    with supervisor(tmp_path, **env) as node:
        assert node.wait_exit(30) == EXIT_CRASH_LOOP
        lines = [e for e in node.logs() if e.get("process") == "worker"]
        assert any("cannot run '/nonexistent/worker-binary'" in str(e.get("event")) for e in lines)
        assert node.has_log(lambda e: "exited with code 127" in str(e.get("event")))
