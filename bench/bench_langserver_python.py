"""Per-execution cost of a trivial `main` through the full Python sandbox.

Three views of the same work (`def main(input): return input`):

- **child**: fork → confine → run → report, as timed by the fork server
  (`duration_ms`): the sandboxed child's own overhead;
- **direct**: `SandboxPool.execute()` in this process, i.e. the fork server
  round trip without gRPC;
- **gRPC**: `LanguageServer/Execute` against `python -m langserver_python`
  started as a subprocess on a free loopback port.

Each is run with 1 caller and with 8 concurrent callers; the table gives p50
and p99 latency and executions per second. Usage:

    .venv/bin/python bench/bench_langserver_python.py [--executions 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from langserver_python.config import ServerConfig
from langserver_python.pool import SandboxPool
from langserver_python.protocol import ExecutionJob, ExecutionResult
from protos import langserver_pb2, langserver_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
CODE = "def main(input):\n    return input\n"


@dataclass
class Row:
    path: str
    callers: int
    latencies_ms: list[float]
    wall_s: float

    def cells(self) -> list[str]:
        ordered = sorted(self.latencies_ms)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        rate = f"{len(ordered) / self.wall_s:,.0f}" if self.wall_s else "-"
        return [
            self.path,
            str(self.callers),
            str(len(ordered)),
            f"{statistics.median(ordered):.2f}",
            f"{p99:.2f}",
            rate,
        ]


async def _drive(callers: int, total: int, call: Callable[[int], Awaitable[float]]) -> tuple[list[float], float]:
    latencies: list[float] = []
    counter = iter(range(total))

    async def worker() -> None:
        for i in counter:
            latencies.append(await call(i))

    started = time.perf_counter()
    async with asyncio.TaskGroup() as tasks:
        for _ in range(callers):
            tasks.create_task(worker())
    return latencies, time.perf_counter() - started


async def bench_direct(total: int, callers: int) -> tuple[Row, Row]:
    async def availability(up: bool) -> None:
        return None

    config = ServerConfig(max_concurrency=8)
    pool = SandboxPool(config.sandbox_settings(), on_availability=availability)
    child_ms: list[float] = []

    async def call(i: int) -> float:
        job = ExecutionJob(code=CODE, filename="bench.py", input_json=str(i), timeout_s=10.0)
        started = time.perf_counter()
        result: ExecutionResult = await pool.execute(job)
        elapsed = (time.perf_counter() - started) * 1000
        assert result.ok, result
        assert result.output_json == str(i)
        child_ms.append(result.duration_ms)
        return elapsed

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(pool.run())
        await pool.wait_ready()
        await _drive(1, 50, call)  # warm-up
        child_ms.clear()
        latencies, wall = await _drive(callers, total, call)
        await pool.stop()
    return Row("child (fork→report)", callers, child_ms, 0.0), Row("direct (no gRPC)", callers, latencies, wall)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def bench_grpc(total: int, callers: int) -> Row:
    addr = f"127.0.0.1:{_free_port()}"
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), "LANGSERVER_ADDR": addr, "LOG_LEVEL": "warning"}
    server = subprocess.Popen([sys.executable, "-m", "langserver_python"], env=env, cwd=ROOT)  # noqa: ASYNC220
    try:
        with grpc.insecure_channel(addr) as probe:
            health_pb2_grpc.HealthStub(probe).Check(health_pb2.HealthCheckRequest(), timeout=60, wait_for_ready=True)
        async with grpc.aio.insecure_channel(addr) as channel:
            stub = langserver_pb2_grpc.LanguageServerStub(channel)

            async def call(i: int) -> float:
                request = langserver_pb2.ExecuteRequest(
                    task_id=f"bench-{i}",
                    runtime="python",
                    input_json=str(i),
                    timeout_seconds=10,
                    inline_code=langserver_pb2.InlineCode(code=CODE, filename="bench.py"),
                )
                started = time.perf_counter()
                response = await stub.Execute(request, timeout=30)
                elapsed = (time.perf_counter() - started) * 1000
                assert response.success, response
                assert response.output_json == str(i)
                return elapsed

            await _drive(1, 50, call)  # warm-up
            latencies, wall = await _drive(callers, total, call)
        return Row("gRPC", callers, latencies, wall)
    finally:
        server.terminate()
        server.wait(timeout=30)


async def main(total: int) -> None:
    rows: list[Row] = []
    for callers in (1, 8):
        rows.extend(await bench_direct(total, callers))
        rows.append(await bench_grpc(total, callers))
    header = ["path", "callers", "executions", "p50 ms", "p99 ms", "execs/s"]
    table = [header, *(row.cells() for row in sorted(rows, key=lambda r: (r.path, r.callers)))]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    print(f"\ntrivial main through the full sandbox, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}\n")
    for n, line in enumerate(table):
        print("| " + " | ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)) + " |")
        if n == 0:
            print("|" + "|".join("-" * (width + 2) for width in widths) + "|")
    print(
        "\n'child' is the fork server's own time from fork to the whole report per execution; execs/s is not measured for it."
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--executions", type=int, default=1000, help="executions per row (default 1000)")
    asyncio.run(main(parser.parse_args().executions))
