"""Lease round trips through gRPC, beside the raw UPDATE rate of the same SQL.

For each concurrency level: N single-task runs are started, then N callers'
worth of AcquireTaskLease + ReportTaskResult pairs go through the coordinator
(each report is a full state-machine transaction that finishes its run). The
raw row is the seed's acquire UPDATE issued straight to the same PostgreSQL
with asyncpg, on the same number of task rows.

    python -m bench.bench_lease [--tasks 2000] [--concurrency 1,16,64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid

import asyncpg
import grpc
import uvloop

from bench._stack import coordinator, fresh_database, percentile, print_table, servers
from coordinator.lease import _ACQUIRE
from protos import workflow_pb2 as pb
from protos import workflow_pb2_grpc as pb_grpc

ONE_TASK = {"name": "bench-lease", "nodes": [{"id": "a", "type": "HTTP", "request": {"url": "http://127.0.0.1:9/"}}]}


async def _start_runs(stub: pb_grpc.WorkflowServiceStub, count: int) -> list[tuple[str, str]]:
    sem = asyncio.Semaphore(32)

    async def one() -> str:
        async with sem:
            reply = await stub.StartRun(pb.StartRunRequest(workflow="bench-lease"))
            return str(reply.run_id)

    run_ids = await asyncio.gather(*(one() for _ in range(count)))
    tasks = []
    for run_id in run_ids:
        run = (await stub.GetRun(pb.GetRunRequest(run_id=run_id))).run
        tasks.append((run_id, run.tasks[0].id))
    return tasks


async def _grpc_round_trips(
    stub: pb_grpc.WorkflowServiceStub, tasks: list[tuple[str, str]], concurrency: int
) -> tuple[float, list[float]]:
    queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    for task in tasks:
        queue.put_nowait(task)
    latencies: list[float] = []

    async def caller(n: int) -> None:
        owner = f"bench-{n}"
        while not queue.empty():
            run_id, task_id = queue.get_nowait()
            started = time.perf_counter()
            lease = await stub.AcquireTaskLease(
                pb.AcquireTaskLeaseRequest(task_id=task_id, run_id=run_id, owner=owner, ttl_seconds=60, attempt=1)
            )
            assert lease.acquired
            reply = await stub.ReportTaskResult(
                pb.ReportTaskResultRequest(
                    task_id=task_id,
                    run_id=run_id,
                    node_id="a",
                    attempt=1,
                    owner=owner,
                    status="completed",
                    output=b"{}",
                )
            )
            assert reply.applied
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(caller(n) for n in range(concurrency)))
    return len(tasks) / (time.perf_counter() - started), latencies


async def _raw_updates(database_url: str, tasks: list[tuple[str, str]], concurrency: int) -> tuple[float, list[float]]:
    pool = await asyncpg.create_pool(database_url, min_size=concurrency, max_size=concurrency)
    try:
        await pool.execute(
            "UPDATE task_instances SET state = 'QUEUED', lease_owner = NULL, lease_expires_at = NULL WHERE run_id = ANY($1::uuid[])",
            [uuid.UUID(r) for r, _ in tasks],
        )
        queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        for task in tasks:
            queue.put_nowait(task)
        latencies: list[float] = []

        async def caller(n: int) -> None:
            while not queue.empty():
                run_id, task_id = queue.get_nowait()
                started = time.perf_counter()
                got = await pool.fetchval(_ACQUIRE, f"raw-{n}", 60.0, uuid.UUID(run_id), uuid.UUID(task_id), 0)
                assert got is not None
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(caller(n) for n in range(concurrency)))
        return len(tasks) / (time.perf_counter() - started), latencies
    finally:
        await pool.close()


async def main(task_count: int, levels: list[int]) -> None:
    rows: list[list[str]] = []
    with servers() as srv:
        database_url = await fresh_database(srv.database_url, "bench_lease")
        async with coordinator(database_url, srv.redis_url) as addr, grpc.aio.insecure_channel(addr) as channel:
            stub = pb_grpc.WorkflowServiceStub(channel)
            await stub.RegisterWorkflow(pb.RegisterWorkflowRequest(definition=json.dumps(ONE_TASK).encode()))
            await _grpc_round_trips(stub, await _start_runs(stub, 200), 8)  # warm-up
            for level in levels:
                tasks = await _start_runs(stub, task_count)
                rate, lat = await _grpc_round_trips(stub, tasks, level)
                rows.append(
                    [
                        "gRPC acquire+report",
                        str(level),
                        f"{rate:,.0f}",
                        f"{percentile(lat, 50) * 1000:.2f}",
                        f"{percentile(lat, 99) * 1000:.2f}",
                    ]
                )
                raw_rate, raw_lat = await _raw_updates(database_url, tasks, level)
                rows.append(
                    [
                        "raw acquire UPDATE (asyncpg)",
                        str(level),
                        f"{raw_rate:,.0f}",
                        f"{percentile(raw_lat, 50) * 1000:.2f}",
                        f"{percentile(raw_lat, 99) * 1000:.2f}",
                    ]
                )
    print_table(
        f"Lease benchmark ({task_count} tasks per row; PostgreSQL with fsync on)",
        ["path", "concurrency", "ops/s", "p50 ms", "p99 ms"],
        rows,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--concurrency", default="1,16,64")
    args = parser.parse_args()
    uvloop.run(main(args.tasks, [int(c) for c in args.concurrency.split(",")]))
