"""Runs the same no-op HTTP workload on Celery and on pgqueuer, measured like ours.

Each task GETs a local no-op URL and records its completion time in Redis;
the driver enqueues N tasks at once and reports tasks/s (N over first enqueue
to last completion) and per-task enqueue-to-completion latency. Workers are
separate processes with 10 concurrent tasks each, like ours:

* Celery 5: Redis broker, `acks_late`, prefetch multiplier 1, thread pool.
* pgqueuer: PostgreSQL-backed (LISTEN/NOTIFY + SKIP LOCKED), asyncio.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import asyncpg
import redis.asyncio as aioredis

from bench._stack import REPO_ROOT, spawn

CONCURRENCY = 10
#: Concurrent producers, like the 32 concurrent StartRun callers of our benchmark.
PRODUCERS = 32


@dataclass(frozen=True)
class Measured:
    tasks_per_s: float
    latencies_s: list[float]


async def _burst(redis: aioredis.Redis, tasks: int, send: Callable[[str], Awaitable[None]]) -> Measured:
    """Enqueues `tasks` tasks from PRODUCERS concurrent producers (as the StartRun callers of ours), then waits."""
    keys = [uuid.uuid4().hex for _ in range(tasks)]
    enqueued: dict[str, float] = {}
    queue = list(reversed(keys))

    async def producer() -> None:
        while queue:
            key = queue.pop()
            enqueued[key] = time.time()
            await send(key)

    await asyncio.gather(*(producer() for _ in range(PRODUCERS)))
    return await _wait_done(redis, keys, enqueued, timeout_s=180)


async def _wait_done(redis: aioredis.Redis, keys: list[str], enqueued: dict[str, float], timeout_s: float) -> Measured:
    deadline = time.monotonic() + timeout_s
    while await redis.hlen("bench:done") < len(keys):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"only {await redis.hlen('bench:done')} of {len(keys)} tasks completed within {timeout_s}s"
            )
        await asyncio.sleep(0.05)
    raw: dict[bytes, bytes] = await redis.hgetall("bench:done")  # type: ignore[assignment]
    done = {k.decode(): float(v) for k, v in raw.items()}
    first = min(enqueued.values())
    last = max(done[k] for k in keys)
    return Measured(tasks_per_s=len(keys) / (last - first), latencies_s=[done[k] - enqueued[k] for k in keys])


@contextlib.contextmanager
def _processes(commands: list[tuple[list[str], dict[str, str]]]) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [spawn(args, env) for args, env in commands]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.asynccontextmanager
async def _redis(url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(url)
    try:
        yield client
    finally:
        await client.aclose()


async def celery(*, redis_url: str, url: str, tasks: int, workers: int) -> Measured:
    """Celery with `workers` worker processes (thread pool, 10 each)."""
    from bench.celery_app import app, noop_http

    app.conf.broker_url = redis_url
    env = {"BENCH_REDIS_URL": redis_url}
    command = [
        "-m",
        "celery",
        "-A",
        "bench.celery_app",
        "worker",
        "--pool=threads",
        f"--concurrency={CONCURRENCY}",
        "--prefetch-multiplier=1",
        "-Q",
        "bench",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--loglevel=WARNING",
    ]
    async with _redis(redis_url) as redis:
        await redis.flushdb()
        with _processes([([*command, "-n", f"bench{i}@%h"], env) for i in range(workers)]):
            await _warm_up_async(redis, lambda key: asyncio.to_thread(noop_http.delay, url, key))
            with ThreadPoolExecutor(PRODUCERS) as pool:
                loop = asyncio.get_running_loop()

                async def send(key: str) -> None:
                    await loop.run_in_executor(pool, lambda: noop_http.delay(url, key))

                return await _burst(redis, tasks, send)


async def pgqueuer(*, database_url: str, redis_url: str, url: str, tasks: int, workers: int) -> Measured:
    """pgqueuer with `workers` worker processes (10 concurrent jobs each)."""
    from pgqueuer import AsyncpgPoolDriver, Queries

    install = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "pgqueuer", "--pg-dsn", database_url, "install"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=False,
    )
    if install.returncode != 0 and b"already exists" not in install.stderr + install.stdout:
        raise RuntimeError(f"pgqueuer install failed: {install.stderr.decode()[-500:]}")
    pool = await asyncpg.create_pool(database_url, min_size=PRODUCERS, max_size=PRODUCERS)
    queries = Queries(AsyncpgPoolDriver(pool))
    env = {"BENCH_DATABASE_URL": database_url, "BENCH_REDIS_URL": redis_url, "BENCH_CONCURRENCY": str(CONCURRENCY)}
    try:
        async with _redis(redis_url) as redis:
            await redis.flushdb()
            with _processes([(["-m", "bench.pgqueuer_worker"], env) for _ in range(workers)]):

                async def enqueue_one(key: str) -> None:
                    await queries.enqueue("noop_http", f"{key} {url}".encode())

                await _warm_up_async(redis, enqueue_one)
                return await _burst(redis, tasks, enqueue_one)
    finally:
        await pool.close()


async def _warm_up_async(redis: aioredis.Redis, enqueue: Callable[[str], Awaitable[object]]) -> None:
    """Waits until the workers run tasks, then clears the completion record."""
    keys = [f"warm-{i}" for i in range(20)]
    for key in keys:
        await enqueue(key)
    deadline = time.monotonic() + 60
    while await redis.hlen("bench:done") < len(keys):
        if time.monotonic() > deadline:
            raise RuntimeError("workers did not start within 60s")
        await asyncio.sleep(0.1)
    await redis.delete("bench:done")
