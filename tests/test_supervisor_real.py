"""The supervisor with the real worker and language servers (skipped until those packages are present).

A worker node (`python -m supervisor`) against a real coordinator, PostgreSQL
and Redis: code steps run on both language servers; a language server killed
with SIGKILL is restarted and the worker keeps executing code tasks through
it; SIGTERM then stops the node cleanly with no process left.
"""

from __future__ import annotations

import importlib.util
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from protos import workflow_pb2 as pb
from tests.coordinator_harness import CoordinatorHandle
from tests.supervisor_harness import SupervisorProcess, no_survivors, supervisor

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        any(
            importlib.util.find_spec(f"{pkg}.__main__") is None
            for pkg in ("worker", "langserver_python", "langserver_js")
        ),
        reason="needs the worker and both language servers (python -m worker / langserver_python / langserver_js)",
    ),
]

CODE_WORKFLOW: dict[str, Any] = {
    "name": "code_steps",
    "nodes": [
        {
            "id": "py",
            "type": "CODE",
            "runtime": "python",
            "code": "def main(input):\n    return {'doubled': input['input']['n'] * 2}",
            "retry": {"max_attempts": 5, "initial_backoff_seconds": 0.5},
        },
        {
            "id": "js",
            "type": "CODE",
            "runtime": "js",
            "depends_on": ["py"],
            "input": {"v": "${steps.py.doubled}"},
            "code": "function main(input) { return {plus_one: input.v + 1}; }",
            "retry": {"max_attempts": 5, "initial_backoff_seconds": 0.5},
        },
    ],
}


def _node_env(coordinator: CoordinatorHandle) -> dict[str, str]:
    return {
        "COORDINATOR_ADDR": coordinator.addr,
        "REDIS_ADDR": coordinator.redis_url,
        "WORKER_QUEUES": "python,js",
        "WORKER_SHUTDOWN_GRACE_SECONDS": "5",
        "SUPERVISOR_READY_TIMEOUT_SECONDS": "60",
    }


def _starts(node: SupervisorProcess, child: str) -> list[int]:
    return [int(e["child_pid"]) for e in node.logs() if e.get("event") == f"started {child}"]


async def _run(coordinator: CoordinatorHandle, n: int) -> dict[str, Any]:
    run_id = await coordinator.start_run("code_steps", {"n": n})
    run = await coordinator.wait_for_run(run_id, timeout_s=60)
    assert pb.RunState.Name(run.state) == "RUN_STATE_COMPLETED", (run.error, [(t.node_id, t.error) for t in run.tasks])
    import json

    output: dict[str, Any] = json.loads(run.output)
    return output


async def test_a_killed_language_server_is_restarted_and_the_worker_keeps_executing_code(
    coordinator: CoordinatorHandle, tmp_path: Path
) -> None:
    await coordinator.register(CODE_WORKFLOW)
    with supervisor(tmp_path, **_node_env(coordinator)) as node:
        node.wait_ready(timeout_s=60)
        assert await _run(coordinator, 20) == {"js": {"plus_one": 41}}

        for child in ("langserver-python", "langserver-js"):
            (pid,) = _starts(node, child)
            os.kill(pid, signal.SIGKILL)
            node.wait_for(lambda child=child: len(_starts(node, child)) == 2, 30, f"{child} restarted")  # type: ignore[misc]
            assert await _run(coordinator, 1) == {"js": {"plus_one": 3}}

        worker_starts = _starts(node, "worker")
        assert len(worker_starts) == 1, "the worker was never restarted"
        node.note_descendants()
        node.signal(signal.SIGTERM)
        assert node.wait_exit(60) == 0
        assert no_survivors(node) == []
