"""The outbox relay: woken by NOTIFY, safe with several replicas, TLS on the wire."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis.asyncio as aioredis

from coordinator.db import create_pool
from coordinator.runs import RunEngine
from coordinator.workflows import WorkflowRegistry
from protos import workflow_pb2 as pb
from protos import workflow_pb2_grpc as pb_grpc
from protos.taskstream import TaskMessage
from tests.coordinator_harness import running_coordinator
from tests.helpers import eventually

ONE = {"name": "one", "nodes": [{"id": "a", "type": "HTTP", "request": {"url": "http://svc.local/a"}}]}


async def _messages(redis: aioredis.Redis) -> list[TaskMessage]:
    found = []
    for key in await redis.keys("wf:tasks:*"):
        entries: Any = await redis.xrange(key)
        found += [TaskMessage.parse(fields) for _, fields in entries]
    return found


async def test_notify_wakes_the_relay_long_before_its_polling_interval(
    database_url: str, redis_url: str, redis_client: aioredis.Redis
) -> None:
    async with running_coordinator(database_url, redis_url, relay_poll_interval_s=60.0) as (_, handle):
        await handle.register(ONE)
        await eventually(lambda: redis_client.exists("wf:shards"), what="coordinator up")
        # Commit a dispatch from outside this coordinator: only NOTIFY can wake its relay.
        pool = await create_pool(database_url, max_size=2)
        try:
            engine = RunEngine(pool=pool, workflows=WorkflowRegistry(pool), shards=2, max_output_bytes=1 << 20)
            started = time.monotonic()
            await engine.start_run("one", 0, {}, None)
        finally:
            await pool.close()
        await eventually(lambda: _messages(redis_client), timeout_s=5, what="dispatch published after NOTIFY")
        assert time.monotonic() - started < 5


async def test_two_replicas_publish_every_dispatch_exactly_once(
    database_url: str, redis_url: str, redis_client: aioredis.Redis
) -> None:
    async with (
        running_coordinator(database_url, redis_url, relay_batch_size=7) as (_, first),
        running_coordinator(database_url, redis_url, relay_batch_size=7) as (_, second),
    ):
        await first.register(ONE)
        handles = [first, second]
        run_ids = await asyncio.gather(*(handles[i % 2].start_run("one", {"i": i}) for i in range(200)))

        async def all_published() -> bool:
            return len(await _messages(redis_client)) >= 200

        await eventually(all_published, timeout_s=20, what="200 dispatches published")
        await asyncio.sleep(0.5)  # let any duplicate publication land before counting
        messages = await _messages(redis_client)
    assert sorted(m.run_id for m in messages) == sorted(run_ids), "each dispatch published once, none lost"


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (skips without the openssl command)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_tls_serves_clients_that_trust_the_certificate(
    database_url: str, redis_url: str, certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    async with running_coordinator(database_url, redis_url, tls_cert=cert, tls_key=key) as (coordinator, _):
        addr = f"127.0.0.1:{coordinator.port}"
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        async with grpc.aio.secure_channel(addr, credentials) as channel:
            reply = await pb_grpc.WorkflowServiceStub(channel).ListDeadLetters(pb.ListDeadLettersRequest(), timeout=10)
            assert list(reply.dead_letters) == []
        async with grpc.aio.insecure_channel(addr) as plain:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await pb_grpc.WorkflowServiceStub(plain).ListDeadLetters(pb.ListDeadLettersRequest(), timeout=5)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
