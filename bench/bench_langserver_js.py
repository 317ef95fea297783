"""Latency and throughput of the JavaScript language server, end to end over gRPC.

Starts `python -m langserver_js` (defaults unless overridden below), warms it up,
then measures a trivial `main` (a fresh isolate from the pool per execution):

- per-execution latency, p50/p99, one caller, sequential calls;
- executions per second with 1 and with 8 concurrent callers.

    .venv/bin/python -m bench.bench_langserver_js [--requests 2000] [--pool-processes N] [--concurrency N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from protos import langserver_pb2, langserver_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parent.parent
TRIVIAL = "function main(input) { return input; }"


def start_server(overrides: dict[str, str], log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("JS_", "LANGSERVER_"))}
    env.update({"PYTHONPATH": str(REPO_ROOT), "LANGSERVER_ADDR": "127.0.0.1:0", "LOG_LEVEL": "info"})
    env.update(overrides)
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "langserver_js"], env=env, stderr=log, cwd=REPO_ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in log_path.read_text().splitlines():
            if '"serving"' in line:
                return proc, str(json.loads(line)["addr"])
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("server did not start")


def percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


async def call(stub: langserver_pb2_grpc.LanguageServerStub, n: int) -> float:
    request = langserver_pb2.ExecuteRequest(
        task_id=f"bench-{n}",
        runtime="js",
        input_json=str(n),
        inline_code=langserver_pb2.InlineCode(code=TRIVIAL),
    )
    started = time.perf_counter()
    response = await stub.Execute(request)
    elapsed = time.perf_counter() - started
    if not response.success or response.output_json != str(n):
        raise SystemExit(f"unexpected response: {response}")
    return elapsed


async def run_callers(
    stub: langserver_pb2_grpc.LanguageServerStub, callers: int, total: int
) -> tuple[float, list[float]]:
    """Runs `total` executions split over `callers` concurrent loops; returns (elapsed s, latencies)."""
    latencies: list[float] = []
    per_caller = total // callers

    async def caller(index: int) -> None:
        for i in range(per_caller):
            latencies.append(await call(stub, index * per_caller + i))

    started = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for index in range(callers):
            tg.create_task(caller(index))
    return time.perf_counter() - started, sorted(latencies)


async def measure(addr: str, requests: int) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = langserver_pb2_grpc.LanguageServerStub(channel)
        await run_callers(stub, 1, 300)  # warm-up: JIT, connections, allocator
        for callers in (1, 8):
            elapsed, latencies = await run_callers(stub, callers, requests)
            rows.append(
                (
                    f"{callers} caller{'s' if callers > 1 else ''}",
                    f"{percentile(latencies, 0.50) * 1000:.2f}",
                    f"{percentile(latencies, 0.99) * 1000:.2f}",
                    f"{len(latencies) / elapsed:.0f}",
                )
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="executions per measurement")
    parser.add_argument("--pool-processes", type=int, help="JS_POOL_PROCESSES (default: the server's)")
    parser.add_argument("--concurrency", type=int, help="JS_MAX_CONCURRENCY (default: the server's)")
    args = parser.parse_args()
    overrides: dict[str, str] = {}
    if args.pool_processes is not None:
        overrides["JS_POOL_PROCESSES"] = str(args.pool_processes)
    if args.concurrency is not None:
        overrides["JS_MAX_CONCURRENCY"] = str(args.concurrency)
    with tempfile.TemporaryDirectory() as scratch:
        proc, addr = start_server(overrides, Path(scratch) / "server.log")
        try:
            rows = asyncio.run(measure(addr, args.requests))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    settings = ", ".join(f"{key}={value}" for key, value in overrides.items()) or "server defaults"
    print(
        f"JavaScript language server, trivial main, {args.requests} executions per row ({settings}; {os.cpu_count()} CPUs)"
    )
    print(f"{'callers':<10} | {'p50 ms':>8} | {'p99 ms':>8} | {'exec/s':>8}")
    print(f"{'-' * 10}-+-{'-' * 8}-+-{'-' * 8}-+-{'-' * 8}")
    for name, p50, p99, rate in rows:
        print(f"{name:<10} | {p50:>8} | {p99:>8} | {rate:>8}")


if __name__ == "__main__":
    main()
