"""Fixtures of the worker tests: a real HTTP server and worker subprocesses."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from tests.worker.support import RecordingServer, WorkerProcess


@pytest.fixture
async def http_server() -> AsyncIterator[RecordingServer]:
    server = RecordingServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def worker_process() -> Iterator[Callable[[dict[str, str]], WorkerProcess]]:
    """Starts `python -m worker` subprocesses; kills whatever is left after the test."""
    started: list[WorkerProcess] = []

    def start(env: dict[str, str]) -> WorkerProcess:
        process = WorkerProcess(env)
        started.append(process)
        process.start()
        return process

    yield start
    for process in started:
        process.close()


def http_workflow(name: str, url: str, **node: Any) -> dict[str, Any]:
    """A one-node workflow: an HTTP POST to `url` (node fields override)."""
    request = {"method": "POST", "url": url, "body": {"run": "${input.n}"}}
    request.update(node.pop("request", {}))
    return {"name": name, "nodes": [{"id": "call", "type": "HTTP", "request": request, **node}]}
