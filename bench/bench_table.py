"""The benchmark table: our stack beside Celery and a PostgreSQL-backed queue, on one machine, in one run.

Ours, end to end (StartRun → coordinator → outbox → Redis → worker → lease →
execute → report → run COMPLETED), for three one-step workloads — a no-op HTTP
call to a local server, a Python code step, a JavaScript code step — with 1
and 4 worker processes (concurrency 10 each) sharing one Python and one
JavaScript language server. Beside it, the same no-op HTTP workload on Celery
(Redis broker, acks_late, prefetch 1; `bench/celery_app.py`) and on pgqueuer
(`bench/pgqueuer_worker.py`), with 1 and 4 worker processes of 10 concurrent
tasks each. Every system gets the same burst: N tasks submitted by 32
concurrent producers; tasks/s is N over first submission to last completion;
latency is each task's submission to completion (queueing included).

PostgreSQL runs with fsync on and Redis with its AOF, as in production.

    pip install -e '.[bench]'
    python -m bench.bench_table [--tasks 2000] [--workers 1,4] [--skip-competitors]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import grpc
import uvloop

from bench._stack import coordinator, fresh_database, percentile, print_table, servers, spawn, wait_serving
from bench.bench_worker_e2e import noop_server, workers
from protos import workflow_pb2 as pb
from protos import workflow_pb2_grpc as pb_grpc
from supervisor.embedded import free_port

PRODUCERS = 32


@dataclass(frozen=True)
class Row:
    system: str
    workload: str
    workers: int
    tasks: int
    tasks_per_s: float
    p50_ms: float
    p99_ms: float


def _workflows(noop_url: str) -> dict[str, dict[str, object]]:
    return {
        "no-op HTTP": {
            "name": "bench-http",
            "nodes": [{"id": "call", "type": "HTTP", "request": {"method": "POST", "url": noop_url, "body": {}}}],
        },
        "Python step": {
            "name": "bench-python",
            "nodes": [
                {
                    "id": "code",
                    "type": "CODE",
                    "runtime": "python",
                    "code": "def main(input):\n    return {'ok': True}\n",
                }
            ],
        },
        "JS step": {
            "name": "bench-js",
            "nodes": [
                {"id": "code", "type": "CODE", "runtime": "js", "code": "function main(input) { return {ok: true}; }"}
            ],
        },
    }


@contextlib.asynccontextmanager
async def language_servers() -> AsyncIterator[str]:
    """One Python and one JavaScript language server; yields LANG_WORKER_ADDRS."""
    addrs = {"python": f"127.0.0.1:{free_port()}", "js": f"127.0.0.1:{free_port()}"}
    procs = [
        spawn(["-m", "langserver_python"], {"LANGSERVER_ADDR": addrs["python"], "LOG_LEVEL": "warning"}),
        spawn(["-m", "langserver_js"], {"LANGSERVER_ADDR": addrs["js"], "LOG_LEVEL": "warning"}),
    ]
    try:
        for proc, addr in zip(procs, addrs.values(), strict=True):
            await wait_serving(addr, proc, timeout_s=60)
        yield ",".join(f"{runtime}:{addr}" for runtime, addr in addrs.items())
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            await asyncio.to_thread(proc.wait, 60)


async def _burst(
    stub: pb_grpc.WorkflowServiceStub, db: asyncpg.Connection, workflow: str, count: int
) -> tuple[float, list[float]]:
    """Starts `count` runs from PRODUCERS concurrent callers; completion times come from the database."""
    await db.execute("DELETE FROM task_instances WHERE run_id IN (SELECT id FROM runs WHERE workflow = $1)", workflow)
    await db.execute("DELETE FROM runs WHERE workflow = $1", workflow)
    queue = list(range(count))
    first = time.time()

    async def producer() -> None:
        while queue:
            queue.pop()
            await stub.StartRun(pb.StartRunRequest(workflow=workflow, input=b"{}"))

    await asyncio.gather(*(producer() for _ in range(PRODUCERS)))
    while await db.fetchval("SELECT count(*) FROM runs WHERE workflow = $1 AND state <> 'RUNNING'", workflow) < count:  # noqa: ASYNC110 - polling another process's database
        await asyncio.sleep(0.1)
    failed = await db.fetchval("SELECT count(*) FROM runs WHERE workflow = $1 AND state <> 'COMPLETED'", workflow)
    if failed:
        raise RuntimeError(f"{failed} {workflow} runs did not complete")
    rows = await db.fetch(
        "SELECT extract(epoch FROM created_at) AS created, extract(epoch FROM finished_at) AS finished FROM runs WHERE workflow = $1",
        workflow,
    )
    last = max(float(r["finished"]) for r in rows)
    return count / (last - first), [float(r["finished"]) - float(r["created"]) for r in rows]


async def ours(task_count: int, worker_counts: list[int], database_url: str, redis_url: str) -> list[Row]:
    rows: list[Row] = []
    async with (
        noop_server() as url,
        language_servers() as lang_addrs,
        coordinator(database_url, redis_url) as addr,
        grpc.aio.insecure_channel(addr) as channel,
    ):
        stub = pb_grpc.WorkflowServiceStub(channel)
        db = await asyncpg.connect(database_url)
        try:
            flows = _workflows(url)
            for definition in flows.values():
                await stub.RegisterWorkflow(pb.RegisterWorkflowRequest(definition=json.dumps(definition).encode()))
            for count in worker_counts:
                async with workers(
                    count, coordinator_addr=addr, redis_url=redis_url, concurrency=10, lang_addrs=lang_addrs
                ):
                    for label, definition in flows.items():
                        name = str(definition["name"])
                        await _burst(stub, db, name, 100)  # warm-up: connections, pools, caches
                        rate, latencies = await _burst(stub, db, name, task_count)
                        rows.append(_row("ours", label, count, task_count, rate, latencies))
                        print(f"  ours {label} x{count}: {rate:,.0f} tasks/s", flush=True)
        finally:
            await db.close()
    return rows


async def competitors(task_count: int, worker_counts: list[int], database_url: str, redis_url: str) -> list[Row]:
    from bench import competitors as other

    rows: list[Row] = []
    async with noop_server() as url:
        for count in worker_counts:
            measured = await other.celery(redis_url=redis_url, url=url, tasks=task_count, workers=count)
            rows.append(_row("Celery", "no-op HTTP", count, task_count, measured.tasks_per_s, measured.latencies_s))
            print(f"  Celery x{count}: {measured.tasks_per_s:,.0f} tasks/s", flush=True)
            db = await fresh_database(database_url.rsplit("/", 1)[0] + "/postgres", f"bench_pgqueuer_{count}")
            measured = await other.pgqueuer(
                database_url=db, redis_url=redis_url, url=url, tasks=task_count, workers=count
            )
            rows.append(_row("pgqueuer", "no-op HTTP", count, task_count, measured.tasks_per_s, measured.latencies_s))
            print(f"  pgqueuer x{count}: {measured.tasks_per_s:,.0f} tasks/s", flush=True)
    return rows


def _row(system: str, workload: str, count: int, tasks: int, rate: float, latencies: list[float]) -> Row:
    return Row(system, workload, count, tasks, rate, percentile(latencies, 50) * 1000, percentile(latencies, 99) * 1000)


async def main(task_count: int, worker_counts: list[int], skip_competitors: bool) -> None:
    with servers() as srv:
        database_url = await fresh_database(srv.database_url, "bench_table")
        print("measuring our stack...", flush=True)
        rows = await ours(task_count, worker_counts, database_url, srv.redis_url)
        if not skip_competitors:
            print("measuring Celery and pgqueuer...", flush=True)
            rows += await competitors(task_count, worker_counts, srv.database_url, srv.redis_url)
    baseline = {(r.workers): r for r in rows if r.system == "ours" and r.workload == "no-op HTTP"}
    table = []
    for r in rows:
        base = baseline.get(r.workers)
        ratio = (
            "1.00"
            if r.system == "ours" and r.workload == "no-op HTTP"
            else (f"{r.tasks_per_s / base.tasks_per_s:.2f}" if base else "-")
        )
        p50_ratio = f"{r.p50_ms / base.p50_ms:.2f}" if base and base.p50_ms else "-"
        table.append(
            [
                r.system,
                r.workload,
                str(r.workers),
                str(r.tasks),
                f"{r.tasks_per_s:,.0f}",
                f"{r.p50_ms:,.1f}",
                f"{r.p99_ms:,.1f}",
                ratio,
                p50_ratio,
            ]
        )
    print_table(
        f"End to end, {task_count} tasks per row, submitted by {PRODUCERS} concurrent producers "
        "(PostgreSQL fsync on, Redis AOF); ratios against ours, no-op HTTP, same worker count",
        ["system", "workload", "workers", "tasks", "tasks/s", "p50 ms", "p99 ms", "throughput ratio", "p50 ratio"],
        table,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--workers", default="1,4")
    parser.add_argument(
        "--skip-competitors", action="store_true", help="measure only our stack (no bench extra needed)"
    )
    args = parser.parse_args()
    uvloop.run(main(args.tasks, [int(w) for w in args.workers.split(",")], args.skip_competitors))
