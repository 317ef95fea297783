"""The Celery side of the comparison: the same no-op HTTP task, Redis broker, late acks, prefetch 1.

Configured from the environment by `bench.compare` (BENCH_REDIS_URL). A task
GETs the no-op URL, then records its completion time in the Redis hash
`bench:done`, which the driver reads to compute latencies.
"""

from __future__ import annotations

import os
import time
import urllib.request

import redis
from celery import Celery

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")

app = Celery("bench", broker=REDIS_URL)
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    task_default_queue="bench",
)
_done = redis.Redis.from_url(REDIS_URL)


@app.task(name="bench.noop_http")
def noop_http(url: str, key: str) -> None:
    with urllib.request.urlopen(url, timeout=30) as response:
        response.read()
    _done.hset("bench:done", key, time.time())
