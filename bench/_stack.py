"""Starts the pieces benchmarks measure: embedded servers and a coordinator subprocess.

Benchmarks use real processes (the coordinator in its own process, as in
production) so the client's event loop does not share a core with the server.
`DATABASE_URL` / `REDIS_URL` point them at external servers instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from supervisor.embedded import EmbeddedPostgres, EmbeddedRedis, free_port

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Servers:
    database_url: str
    redis_url: str


@contextlib.contextmanager
def servers() -> Iterator[Servers]:
    """Embedded PostgreSQL (durable settings) and Redis (AOF), or the external ones named by env."""
    if os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"):
        yield Servers(os.environ["DATABASE_URL"], os.environ["REDIS_URL"])
        return
    base = Path(tempfile.mkdtemp(prefix="wf-bench-"))
    base.chmod(0o755)
    pg = EmbeddedPostgres(base / "pg", durable=True)
    redis = EmbeddedRedis(base / "redis", appendonly=True)
    try:
        pg.start()
        redis.start()
        yield Servers(pg.dsn, redis.url)
    finally:
        redis.stop()
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


async def fresh_database(admin_dsn: str, name: str) -> str:
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return admin_dsn.rsplit("/", 1)[0] + f"/{name}"


@contextlib.asynccontextmanager
async def coordinator(database_url: str, redis_url: str, **env: str) -> AsyncIterator[str]:
    """`python -m coordinator serve` on a free port; yields its address."""
    addr = f"127.0.0.1:{free_port()}"
    proc = spawn(
        ["-m", "coordinator", "serve"],
        {
            "DATABASE_URL": database_url,
            "REDIS_ADDR": redis_url,
            "COORDINATOR_LISTEN_ADDR": addr,
            "LOG_LEVEL": "warning",
            **env,
        },
    )
    try:
        await wait_serving(addr, proc)
        yield addr
    finally:
        proc.terminate()
        proc.wait(30)


def spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Starts `python <args>` from this checkout with extra environment variables."""
    return subprocess.Popen(
        [sys.executable, *args],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env},
        stdout=subprocess.DEVNULL,
    )


async def wait_serving(addr: str, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
            with contextlib.suppress(grpc.aio.AioRpcError):
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{addr} did not start serving")


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    print(f"\n{title}")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
