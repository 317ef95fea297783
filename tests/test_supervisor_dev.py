"""`python -m supervisor --dev` on a fresh data directory (skipped until the worker and language servers exist).

It starts embedded PostgreSQL and Redis, the coordinator and a worker node,
registers examples/, runs the example workflow to COMPLETED (an HTTP step that
fails once with 503 and succeeds on retry, Python and JS steps, a SWITCH,
fan-out and fan-in), prints progress and result, and stops everything on
SIGINT. A second start on the same directory finds the data again.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from supervisor.worker_node import bind_free_port
from tests.supervisor_harness import SupervisorProcess, no_survivors, standin

pytestmark = pytest.mark.timeout(240)
_PARTS_MISSING = any(
    importlib.util.find_spec(f"{pkg}.__main__") is None for pkg in ("worker", "langserver_python", "langserver_js")
)

_NOT_INHERITED = ("DATABASE_URL", "REDIS_ADDR", "COORDINATOR_ADDR", "COORDINATOR_TOKEN", "LANG_WORKER_ADDRS")


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A fresh directory the unprivileged PostgreSQL user can reach (not under pytest's 0700 tmp)."""
    path = Path(tempfile.mkdtemp(prefix="wf-dev-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _servers_using(data_dir: Path) -> list[str]:
    """Processes (PostgreSQL, Redis) still running on the data directory."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(data_dir) in cmdline:
            found.append(f"{proc.info['pid']} {cmdline[:120]}")
    return found


def _dev(tmp: Path, data_dir: Path, *args: str) -> SupervisorProcess:
    process = SupervisorProcess(
        tmp,
        ["--dev", "--data-dir", str(data_dir), *args],
        {
            "COORDINATOR_LISTEN_ADDR": f"127.0.0.1:{bind_free_port('127.0.0.1')}",
            "SUPERVISOR_READY_TIMEOUT_SECONDS": "90",
        },
    )
    for name in _NOT_INHERITED:
        process.env.pop(name, None)
    return process


def test_dev_runs_the_example_to_completed_and_stops_cleanly_on_sigint(tmp_path: Path, data_dir: Path) -> None:
    if _PARTS_MISSING:
        pytest.skip("needs the worker and both language servers")
    (tmp_path / "first").mkdir()
    node = _dev(tmp_path / "first", data_dir).start()
    try:
        node.wait_for(lambda: " COMPLETED in " in node.stdout() or " FAILED" in node.stdout(), 180, "the example run")
        out = node.stdout()
        assert " COMPLETED in " in out, out
        assert "registered order_pipeline version 1" in out
        # Progress of every node, the SWITCH choosing "express", and the retried HTTP step.
        for step in ("fetch_order", "price", "labels", "route", "express", "summary", "ship"):
            assert f"  {step} " in out, f"no progress line for {step}:\n{out}"
        assert "ship                 QUEUED     attempt 2/3  (retry after:" in out and "503" in out
        result = json.loads(out[out.index("output:\n") + len("output:\n") : out.index("\n}\n") + 2])
        assert "  standard             SKIPPED" in out, "the SWITCH chose express (total 151.2 > 100)"
        assert result["ship"]["status"] == "booked" and result["ship"]["calls"] == 2
        # Python priced the order, JS formatted the lines, and the fan-in summed up both.
        assert result["ship"]["order"] == {
            "order_id": 1042,
            "customer": "ADA LOVELACE",
            "lines": ["12 x difference-engine-gear", "3 x punched-card-pack"],
            "total": 151.2,
            "shipping": "express",
        }

        node.note_descendants()
        node.signal(signal.SIGINT)
        assert node.wait_exit(60) == 0
        assert "dev stack stopped" in node.stdout()
        assert no_survivors(node) == []
        assert _servers_using(data_dir) == [], "embedded PostgreSQL and Redis stopped too"
    finally:
        node.close()

    # The data directory is reused: the workflow registered by the first start is still there.
    (tmp_path / "second").mkdir()
    again = _dev(tmp_path / "second", data_dir, "--no-example").start()
    try:
        again.wait_for(lambda: "press Ctrl-C" in again.stdout(), 120, "the second start")
        assert "order_pipeline version 1 is unchanged" in again.stdout()
        again.note_descendants()
        again.signal(signal.SIGINT)
        assert again.wait_exit(60) == 0
        assert no_survivors(again) == []
    finally:
        again.close()


def test_dev_uses_the_real_services_when_they_are_configured(
    tmp_path: Path, data_dir: Path, database_url: str, redis_url: str
) -> None:
    """DATABASE_URL and REDIS_ADDR set: no embedded server starts; the coordinator it runs uses them."""
    node = _dev(tmp_path, data_dir, "--no-example")
    node.env.update(
        DATABASE_URL=database_url,
        REDIS_ADDR=redis_url,
        SUPERVISOR_LANGSERVER_PYTHON_CMD=standin("langserver-python", "--serve"),
        SUPERVISOR_LANGSERVER_JS_CMD=standin("langserver-js", "--serve"),
        SUPERVISOR_WORKER_CMD=standin("worker"),
    )
    node.start()
    try:
        node.wait_for(lambda: "press Ctrl-C" in node.stdout(), 60, "the stack")
        out = node.stdout()
        assert "embedded" not in out
        assert "registered order_pipeline version 1" in out
        assert list(data_dir.iterdir()) == [], "nothing was written to the data directory"
        (_, _, _, worker_addrs) = node.events("worker", "started")[0]
        assert worker_addrs.startswith("python:127.0.0.1:")
        node.note_descendants()
        node.signal(signal.SIGTERM)
        assert node.wait_exit(60) == 0
        assert no_survivors(node) == []
    finally:
        node.close()


def test_dev_refuses_a_coordinator_port_in_use_with_a_clear_message(
    tmp_path: Path, data_dir: Path, database_url: str, redis_url: str
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = f"127.0.0.1:{taken.getsockname()[1]}"
        node = _dev(tmp_path, data_dir, "--no-example")
        node.env.update(DATABASE_URL=database_url, REDIS_ADDR=redis_url, COORDINATOR_LISTEN_ADDR=addr)
        node.start()
        try:
            assert node.wait_exit(60) == 1
            assert f"{addr} is already in use" in node.stdout() and "COORDINATOR_LISTEN_ADDR" in node.stdout()
        finally:
            node.close()
