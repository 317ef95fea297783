"""Fixtures that give every test real servers.

PostgreSQL and Redis are started once per test session, embedded from PyPI
packages, in a fresh temporary directory (so a run never sees another run's
data). `TEST_DATABASE_URL` / `TEST_REDIS_URL` point the suite at external
servers instead. Each test gets its own database (created and dropped around
it) and a flushed Redis database.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import redis.asyncio as aioredis

from supervisor.embedded import EmbeddedPostgres, EmbeddedRedis
from tests.coordinator_harness import CoordinatorHandle, CoordinatorProcess, running_coordinator


@pytest.fixture(scope="session")
def scratch_dir() -> Iterator[Path]:
    """A per-session directory reachable by the unprivileged user PostgreSQL runs as."""
    path = Path(tempfile.mkdtemp(prefix="wf-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_admin_dsn(scratch_dir: Path) -> Iterator[str]:
    external = os.environ.get("TEST_DATABASE_URL")
    if external:
        yield external
        return
    server = EmbeddedPostgres(scratch_dir / "pg", durable=False)
    server.start()
    yield server.dsn
    server.stop()


@pytest.fixture(scope="session")
def redis_server_url(scratch_dir: Path) -> Iterator[str]:
    external = os.environ.get("TEST_REDIS_URL")
    if external:
        yield external
        return
    server = EmbeddedRedis(scratch_dir / "redis", appendonly=False)
    server.start()
    yield server.url
    server.stop()


def _with_database(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{database}"))


@pytest.fixture
async def database_url(postgres_admin_dsn: str) -> AsyncIterator[str]:
    """A fresh, empty database for this test only."""
    name = f"wf_test_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(postgres_admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield _with_database(postgres_admin_dsn, name)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
async def redis_url(redis_server_url: str) -> str:
    """The session's Redis, flushed before this test."""
    client = aioredis.Redis.from_url(redis_server_url)
    try:
        await client.flushdb()
    finally:
        await client.aclose()
    return redis_server_url


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
async def coordinator(database_url: str, redis_url: str) -> AsyncIterator[CoordinatorHandle]:
    """A real coordinator in this test's event loop, over the test's database and Redis."""
    async with running_coordinator(database_url, redis_url) as (_, handle):
        yield handle


@pytest.fixture
async def coordinator_process(
    database_url: str, redis_url: str
) -> AsyncIterator[Callable[..., Awaitable[CoordinatorProcess]]]:
    """Starts `python -m coordinator serve` subprocesses; kills them after the test."""
    started: list[CoordinatorProcess] = []

    async def start(**env: str) -> CoordinatorProcess:
        process = CoordinatorProcess(database_url, redis_url, **env)
        started.append(process)
        await process.start()
        return process

    yield start
    for process in started:
        process.close()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", default=False, help="run the long fault-injection soak")
