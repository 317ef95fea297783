"""How fast a worker node starts, heals and stops, with the real children.

    .venv/bin/python -m bench.bench_supervisor --rounds 5

Per round: `python -m supervisor` (role all) against a real coordinator,
PostgreSQL and Redis (embedded, or DATABASE_URL / REDIS_URL), timing

- start: launch until both language servers report SERVING and the worker is spawned ("node ready");
- heal: SIGKILL of each language server until it answers SERVING again on the same address
  (includes the restart backoff, SUPERVISOR_RESTART_BACKOFF_SECONDS=0.5 by default);
- stop: SIGTERM until the supervisor exited with code 0 (an idle node: nothing to drain).
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
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench._stack import REPO_ROOT, coordinator, fresh_database, percentile, print_table, servers

_POLL_S = 0.01


def _log(path: Path) -> list[dict[str, Any]]:
    lines = []
    for raw in path.read_text(errors="replace").splitlines():
        try:
            lines.append(json.loads(raw))
        except ValueError:
            continue
    return lines


async def _until(predicate: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        await asyncio.sleep(_POLL_S)


async def _serving(addr: str, timeout_s: float = 60.0) -> None:
    options = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.max_reconnect_backoff_ms", 100)]
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(addr, options=options) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(_POLL_S)
    raise RuntimeError(f"{addr} not serving")


def _launch(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "supervisor"], env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=err
        )


async def _round(coordinator_addr: str, redis_url: str, workdir: Path) -> dict[str, float]:
    log_path = workdir / "supervisor.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "COORDINATOR_ADDR": coordinator_addr,
        "REDIS_ADDR": redis_url,
        "WORKER_METRICS_PORT": "0",
        "WORKER_SHUTDOWN_GRACE_SECONDS": "5",
    }
    env.pop("LANG_WORKER_ADDRS", None)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    proc = _launch(env, log_path)
    try:
        await _until(lambda: any(e.get("event") == "node ready" for e in _log(log_path)))
        timings["start"] = time.perf_counter() - started
        for child in ("langserver-python", "langserver-js"):
            lines = _log(log_path)
            pid = next(e["child_pid"] for e in lines if e.get("event") == f"started {child}")
            addr = next(e["addr"] for e in lines if e.get("event") == f"{child} is serving")
            killed = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.05)  # let the old server's port close before probing
            await _until(lambda child=child: sum(e.get("event") == f"started {child}" for e in _log(log_path)) == 2)
            await _serving(addr)
            timings[f"heal {child}"] = time.perf_counter() - killed
        stopping = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
        timings["stop"] = time.perf_counter() - stopping
        if code != 0:
            raise RuntimeError(f"supervisor exited with {code}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return timings


async def main(rounds: int) -> None:
    with servers() as backing:
        admin = backing.database_url
        database_url = await fresh_database(admin, "bench_supervisor")
        async with coordinator(database_url, backing.redis_url) as addr:
            samples: dict[str, list[float]] = {}
            for _ in range(rounds):
                with tempfile.TemporaryDirectory() as tmp:
                    for name, seconds in (await _round(addr, backing.redis_url, Path(tmp))).items():
                        samples.setdefault(name, []).append(seconds)
    rows = [
        [name, str(len(values)), f"{percentile(values, 50):.2f}", f"{max(values):.2f}"]
        for name, values in samples.items()
    ]
    print_table(f"worker node lifecycle, {rounds} rounds (seconds)", ["phase", "n", "p50", "max"], rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(parser.parse_args().rounds))
