"""The operator's verbs of `python -m coordinator`, against a live coordinator (real PostgreSQL and Redis).

The coordinator runs as `python -m coordinator serve` in a subprocess, as an
operator meets it (and so its shutdown is not part of each test). Most tests
await `coordinator.cli.run_operator` (what `main` runs) in the test's event
loop; one runs the real entry point as a subprocess for exit codes and stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis.asyncio as aioredis

from coordinator.cli import run_operator
from protos import workflow_pb2 as pb
from protos.taskstream import TaskMessage
from tests.coordinator_harness import REPO_ROOT, CoordinatorHandle, CoordinatorProcess
from tests.helpers import eventually
from tests.stream_worker import Handler, ScriptedWorker, echo

PIPELINE = {
    "name": "cli_pipeline",
    "nodes": [
        {"id": "fetch", "type": "HTTP", "request": {"url": "http://svc.local/x"}},
        {
            "id": "double",
            "type": "CODE",
            "runtime": "python",
            "depends_on": ["fetch"],
            "code": "def main(i):\n    return i",
            "retry": {"max_attempts": 3, "initial_backoff_seconds": 0.1},
        },
    ],
}


async def cli(capsys: pytest.CaptureFixture[str], *argv: str, **env: str) -> tuple[int, str, str]:
    """Runs one CLI command; returns (exit code, stdout, stderr)."""
    code = await run_operator(list(argv), env)
    out, err = capsys.readouterr()
    return code, out, err


def env_for(handle: CoordinatorHandle, **extra: str) -> dict[str, str]:
    return {"COORDINATOR_ADDR": handle.addr, **extra}


@pytest.fixture
async def coordinator(
    coordinator_process: Callable[..., Awaitable[CoordinatorProcess]], database_url: str, redis_url: str
) -> AsyncIterator[CoordinatorHandle]:
    """A `python -m coordinator serve` process, with a client handle (this module's `coordinator`)."""
    process = await coordinator_process()
    channel = grpc.aio.insecure_channel(process.addr)
    try:
        yield CoordinatorHandle(addr=process.addr, database_url=database_url, redis_url=redis_url, channel=channel)
    finally:
        await channel.close()


@asynccontextmanager
async def worker(handle: CoordinatorHandle, handler: Handler = echo) -> AsyncIterator[ScriptedWorker]:
    redis = aioredis.Redis.from_url(handle.redis_url)
    scripted = ScriptedWorker(redis=redis, stub=handle.stub, handler=handler)
    await eventually(lambda: redis.exists("wf:shards"), what="shard count published")
    task = asyncio.create_task(scripted.run())
    try:
        yield scripted
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await redis.aclose()


def write(tmp_path: Path, document: dict[str, Any], name: str = "wf.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return str(path)


async def test_register_new_unchanged_and_refused(
    coordinator: CoordinatorHandle, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    env = env_for(coordinator)
    path = write(tmp_path, PIPELINE)
    assert await cli(capsys, "register", path, **env) == (0, f"registered cli_pipeline version 1 ({path})\n", "")
    assert await cli(capsys, "register", path, **env) == (0, f"cli_pipeline version 1 is unchanged ({path})\n", "")

    bad = write(
        tmp_path,
        {
            "name": "bad",
            "nodes": [{"id": "a", "type": "HTTP", "request": {"url": "http://svc.local/u", "method": "YELL"}}],
        },
    )
    code, out, err = await cli(capsys, "register", bad, **env)
    assert code == 1 and out == ""
    assert err.count("\n") == 1, "one line"
    assert "invalid request" in err and "node 'a'" in err and "request.method" in err

    code, _, err = await cli(capsys, "register", str(tmp_path / "missing.json"), **env)
    assert code == 1 and "missing.json" in err and err.count("\n") == 1
    (tmp_path / "broken.json").write_text("{")
    code, _, err = await cli(capsys, "register", str(tmp_path / "broken.json"), **env)
    assert code == 1 and "not valid JSON" in err


async def test_run_wait_shows_each_task_and_the_result(
    coordinator: CoordinatorHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    await coordinator.register(PIPELINE)
    env = env_for(coordinator)
    failed_once: set[str] = set()

    async def fail_double_once(message: TaskMessage) -> tuple[bool, Any]:
        if message.node_id == "double" and message.task_id not in failed_once:
            failed_once.add(message.task_id)
            return False, "language server restarting"
        return True, {"node": message.node_id}

    async with worker(coordinator, fail_double_once):
        code, out, err = await cli(capsys, "run", "cli_pipeline", "--input", '{"n": 2}', "--wait", **env)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("run ") and lines[0].endswith("of cli_pipeline v1 started")
    progress = [line.split() for line in lines if line.startswith("  ")]
    assert ["fetch", "COMPLETED"] in [p[1:3] for p in progress]
    assert any(p[1:5] == ["double", "QUEUED", "attempt", "2/3"] for p in progress), out
    assert "(retry after: language server restarting)" in out
    assert any(line.startswith("run ") and " COMPLETED in " in line for line in lines)
    output = json.loads(out[out.index("output:\n") + len("output:\n") :])
    assert output == {"double": {"node": "double"}}


async def test_run_wait_exits_1_when_the_run_fails(
    coordinator: CoordinatorHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    await coordinator.register(
        {
            "name": "doomed",
            "nodes": [
                {"id": "a", "type": "HTTP", "request": {"url": "http://svc.local/u"}, "retry": {"max_attempts": 1}}
            ],
        }
    )

    async def fail(message: TaskMessage) -> tuple[bool, Any]:
        return False, "HTTP 500 from svc"

    async with worker(coordinator, fail):
        code, out, _ = await cli(capsys, "run", "doomed", "--wait", **env_for(coordinator))
    assert code == 1
    assert "FAILED" in out and "HTTP 500 from svc" in out


async def test_run_json_and_idempotency_key(coordinator: CoordinatorHandle, capsys: pytest.CaptureFixture[str]) -> None:
    await coordinator.register(PIPELINE)
    env = env_for(coordinator)
    code, out, _ = await cli(capsys, "run", "cli_pipeline", "--idempotency-key", "k1", "--json", **env)
    first = json.loads(out)
    assert code == 0 and first["created"] is True
    code, out, _ = await cli(capsys, "run", "cli_pipeline", "--idempotency-key", "k1", "--json", **env)
    assert json.loads(out) == {**first, "created": False}


async def test_show_lists_tasks_attempts_errors_and_ignored_reports(
    coordinator: CoordinatorHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    await coordinator.register(
        {
            "name": "single",
            "nodes": [
                {
                    "id": "a",
                    "type": "HTTP",
                    "request": {"url": "http://svc.local/u"},
                    "retry": {"max_attempts": 2, "initial_backoff_seconds": 0},
                }
            ],
        }
    )
    run_id = await coordinator.start_run("single", {"k": 1})
    task_id = (await coordinator.get_run(run_id)).tasks[0].id
    lease = pb.AcquireTaskLeaseRequest(task_id=task_id, run_id=run_id, owner="w1", ttl_seconds=30, attempt=1)
    assert (await coordinator.stub.AcquireTaskLease(lease)).acquired
    report = pb.ReportTaskResultRequest(
        task_id=task_id, run_id=run_id, node_id="a", attempt=1, owner="w1", status="failed", error="connection reset"
    )
    assert (await coordinator.stub.ReportTaskResult(report)).applied
    stale = pb.ReportTaskResultRequest(
        task_id=task_id, run_id=run_id, node_id="a", attempt=1, owner="w9", status="completed", output=b"{}"
    )
    assert not (await coordinator.stub.ReportTaskResult(stale)).applied

    code, out, err = await cli(capsys, "show", run_id, **env_for(coordinator))
    assert (code, err) == (0, "")
    assert f"run {run_id}" in out and "single v1" in out and "RUNNING" in out
    task_row = next(line.split() for line in out.splitlines() if line.strip().startswith("a "))
    assert task_row[:5] == ["a", "HTTP", "QUEUED", "2/2", "http"]
    assert "connection reset" in out
    assert "ignored reports" in out and "w9" in out and "stale attempt 1" in out

    code, out, _ = await cli(capsys, "show", run_id, "--json", **env_for(coordinator))
    shown = json.loads(out)
    assert shown["input"] == {"k": 1}
    assert [(t["node_id"], t["state"], t["attempt"], t["error"]) for t in shown["tasks"]] == [
        ("a", "QUEUED", 2, "connection reset")
    ]
    assert [(r["owner"], r["attempt"]) for r in shown["ignored_reports"]] == [("w9", 1)]


async def test_cancel_a_run_and_cancel_again(
    coordinator: CoordinatorHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    await coordinator.register(PIPELINE)
    run_id = await coordinator.start_run("cli_pipeline")
    env = env_for(coordinator)
    assert await cli(capsys, "cancel", run_id, "--reason", "test", **env) == (0, f"run {run_id} cancelled\n", "")
    code, out, _ = await cli(capsys, "cancel", run_id, **env)
    assert code == 0 and "already ended (CANCELLED)" in out
    assert pb.RunState.Name((await coordinator.get_run(run_id)).state) == "RUN_STATE_CANCELLED"


async def test_dead_letters_are_listed(coordinator: CoordinatorHandle, capsys: pytest.CaptureFixture[str]) -> None:
    env = env_for(coordinator)
    assert await cli(capsys, "dead-letters", **env) == (0, "no dead-lettered tasks\n", "")
    await coordinator.register(
        {
            "name": "poison",
            "nodes": [
                {"id": "p", "type": "HTTP", "request": {"url": "http://svc.local/u"}, "retry": {"max_attempts": 1}}
            ],
        }
    )
    run_id = await coordinator.start_run("poison")
    task_id = (await coordinator.get_run(run_id)).tasks[0].id
    reason = "task exceeded max delivery attempts (5)"
    report = pb.ReportTaskResultRequest(
        task_id=task_id,
        run_id=run_id,
        node_id="p",
        attempt=1,
        owner="reclaimer",
        status="failed",
        error=reason,
        dead_letter=True,
        delivery_count=6,
    )
    assert (await coordinator.stub.ReportTaskResult(report)).applied

    code, out, _ = await cli(capsys, "dead-letters", **env)
    row = out.splitlines()[1].split()
    assert code == 0 and run_id in row and "p" in row and "6" in row and "reclaimer" in row
    code, out, _ = await cli(capsys, "dead-letters", "--run", run_id, "--json", **env)
    assert [(d["task_id"], d["delivery_count"], d["reason"]) for d in json.loads(out)] == [(task_id, 6, reason)]


async def test_errors_are_one_line_and_a_non_zero_exit(
    coordinator: CoordinatorHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    env = env_for(coordinator)
    code, out, err = await cli(capsys, "show", "01900000-0000-7000-8000-000000000000", **env)
    assert (code, out) == (1, "") and err.startswith("python -m coordinator show: not found") and err.count("\n") == 1
    code, _, err = await cli(capsys, "show", "not-a-uuid", **env)
    assert code == 1 and "run_id" in err and err.count("\n") == 1
    code, _, err = await cli(capsys, "run", "no_such_workflow", **env)
    assert code == 1 and "no_such_workflow" in err
    code, _, err = await cli(capsys, "run", "x", "--input", "{nope", **env)
    assert code == 2 and "--input is not valid JSON" in err and err.count("\n") == 1
    code, _, err = await cli(capsys, "frobnicate", **env)
    assert code == 2 and err.count("\n") == 1
    code, _, err = await cli(capsys, "--timeout", "2", "show", "x", COORDINATOR_ADDR="127.0.0.1:1")
    assert code == 1 and "cannot reach the coordinator at 127.0.0.1:1 (set COORDINATOR_ADDR)" in err


async def test_token_is_sent_as_bearer(
    coordinator_process: Callable[..., Awaitable[CoordinatorProcess]],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    path = write(tmp_path, PIPELINE)
    process = await coordinator_process(COORDINATOR_TOKEN="s3cret")
    code, _, err = await cli(capsys, "register", path, COORDINATOR_ADDR=process.addr)
    assert code == 1 and "refused the call" in err and "COORDINATOR_TOKEN" in err
    code, out, _ = await cli(capsys, "register", path, COORDINATOR_ADDR=process.addr, COORDINATOR_TOKEN="s3cret")
    assert code == 0 and "registered cli_pipeline" in out


async def test_entry_point_as_a_real_process(coordinator: CoordinatorHandle, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "COORDINATOR_ADDR": coordinator.addr}
    env.pop("COORDINATOR_TOKEN", None)
    path = write(tmp_path, PIPELINE)

    async def run(*argv: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "coordinator",
            *argv,
            env=env,
            cwd=REPO_ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    code, out, _ = await run("register", path)
    assert code == 0 and "registered cli_pipeline version 1" in out
    code, out, err = await run("show", "01900000-0000-7000-8000-000000000000")
    assert (code, out) == (1, "") and len(err.splitlines()) == 1 and "not found" in err
    code, _, err = await run("run")
    assert code == 2 and len(err.splitlines()) == 1


async def test_run_wait_keeps_watching_across_a_coordinator_restart(
    coordinator_process: Callable[..., Awaitable[CoordinatorProcess]],
    database_url: str,
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    process = await coordinator_process()
    channel = grpc.aio.insecure_channel(process.addr)
    handle = CoordinatorHandle(addr=process.addr, database_url=database_url, redis_url=redis_url, channel=channel)
    printed: list[str] = []

    async def shows_progress() -> bool:
        printed.append(capsys.readouterr().out)
        return "fetch" in "".join(printed)

    try:
        await handle.register(PIPELINE)
        waiting = asyncio.create_task(run_operator(["run", "cli_pipeline", "--wait"], env_for(handle)))
        await eventually(shows_progress, what="the first progress line")

        process.kill()  # SIGKILL mid-watch, then the same address again
        process.spawn()
        await process.wait_serving()
        async with worker(handle):
            code = await asyncio.wait_for(waiting, 30)
        printed.append(capsys.readouterr().out)
        assert code == 0 and " COMPLETED in " in "".join(printed)
    finally:
        await channel.close()
