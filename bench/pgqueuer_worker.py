"""The PostgreSQL-queue side of the comparison: pgqueuer running the same no-op HTTP task.

`python -m bench.pgqueuer_worker` with BENCH_DATABASE_URL, BENCH_REDIS_URL and
BENCH_CONCURRENCY; a job's payload is `<key> <url>`; completion times go to the
Redis hash `bench:done`, as for Celery.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import aiohttp
import asyncpg
import redis.asyncio as aioredis
import uvloop
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager


async def main() -> None:
    conn = await asyncpg.connect(os.environ["BENCH_DATABASE_URL"])
    done = aioredis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    concurrency = int(os.environ.get("BENCH_CONCURRENCY", "10"))
    manager = QueueManager(Queries(AsyncpgDriver(conn)))
    async with aiohttp.ClientSession() as session:

        @manager.entrypoint("noop_http")
        async def noop_http(job: Job) -> None:
            key, url = (job.payload or b"").decode().split(" ", 1)
            async with session.get(url) as response:
                await response.read()
            await done.hset("bench:done", key, time.time())

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, manager.shutdown.set)
        # pgqueuer requires max_concurrent_tasks >= 2 x batch_size.
        await manager.run(batch_size=max(1, concurrency // 2), max_concurrent_tasks=concurrency)
    await done.aclose()
    await conn.close()


if __name__ == "__main__":
    uvloop.run(main())
