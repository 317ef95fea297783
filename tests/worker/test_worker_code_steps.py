"""Code steps through the whole loop with the real Python language server.

Coordinator -> Redis -> worker -> `python -m langserver_python` (sandboxed) ->
report, with an HTTP step feeding the code step.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from aiohttp import web

from protos import workflow_pb2 as pb
from tests.coordinator_harness import CoordinatorHandle
from tests.langserver_python_harness import RunningServer, start_server
from tests.worker.support import Recorded, RecordingServer, in_process_worker, worker_config


@pytest.fixture(scope="module")
def python_langserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(tmp_path_factory.mktemp("worker-langserver"))
    yield running
    assert running.stop() == 0, running.log()


async def test_http_then_python_code_step(
    coordinator: CoordinatorHandle, http_server: RecordingServer, python_langserver: RunningServer
) -> None:
    async def items(_: web.Request, __: Recorded) -> web.StreamResponse:
        return web.json_response({"items": [3, 4, 5]})

    http_server.on("/items", items)
    await coordinator.register(
        {
            "name": "sum-items",
            "nodes": [
                {"id": "fetch", "type": "HTTP", "request": {"url": http_server.url("/items")}},
                {
                    "id": "total",
                    "type": "CODE",
                    "runtime": "python",
                    "depends_on": ["fetch"],
                    "code": "def main(input):\n    return {'sum': sum(input['items'])}",
                    "input": {"items": "${steps.fetch.items}"},
                },
                {
                    "id": "broken",
                    "type": "CODE",
                    "runtime": "python",
                    "depends_on": ["total"],
                    "code": "def main(input):\n    return 1 // 0",
                    "retry": {"max_attempts": 1},
                },
            ],
        }
    )
    config = worker_config(
        coordinator.addr,
        coordinator.redis_url,
        queues=("http", "python"),
        lang_server_addrs={"python": python_langserver.addr},
    )
    async with in_process_worker(config):
        run = await coordinator.wait_for_run(await coordinator.start_run("sum-items", {}), timeout_s=60)
    fetch, total, broken = run.tasks
    assert json.loads(fetch.output) == {"items": [3, 4, 5]}
    assert json.loads(total.output) == {"sum": 12}
    assert run.state == pb.RUN_STATE_FAILED
    # The task error names the error kind the language server returned.
    assert broken.error.startswith("python code failed (RUNTIME): ZeroDivisionError"), broken.error
