"""The coordinator process: gRPC API, outbox relay and sweeper, wired together.

`Coordinator.run()` owns everything it starts. Shutdown runs in stages: stop
taking calls (health NOT_SERVING, server stop with a grace period for calls in
flight), cancel the relay and sweeper, close the pools. Nothing is lost by
stopping at any point: unpublished outbox rows wait in PostgreSQL for the next
relay.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import grpc
import redis.asyncio as aioredis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from prometheus_client import start_http_server
from redis.exceptions import RedisError

from coordinator.auth import BearerTokenInterceptor
from coordinator.config import CoordinatorConfig
from coordinator.db import create_pool
from coordinator.errors import StartupError
from coordinator.grpc_service import WorkflowService
from coordinator.lease import LeaseManager
from coordinator.outbox import OutboxRelay, RelaySettings
from coordinator.runs import RunEngine
from coordinator.schema import apply_migrations
from coordinator.sweeper import Sweeper
from coordinator.watch import RunChangeHub
from coordinator.workflows import WorkflowRegistry
from protos import workflow_pb2_grpc
from protos.taskstream import SHARD_COUNT_KEY
from telemetry import redact_url

__all__ = ["Coordinator"]

log = logging.getLogger(__name__)

_SHUTDOWN_GRACE_S = 5.0
_POOL_CLOSE_S = 5.0
#: How long a starting coordinator waits for PostgreSQL and Redis.
STARTUP_TIMEOUT_S = 30.0
T = TypeVar("T")
_SERVICE_NAME = "workflow.v1.WorkflowService"


async def _until_reachable(what: str, connect: Callable[[], Awaitable[T]]) -> T:
    """Retries a first connection for a while, so a coordinator may start before its database.

    Raises:
        StartupError: still unreachable after STARTUP_TIMEOUT_S.
    """
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    delay = 0.1
    while True:
        try:
            return await connect()
        except (OSError, asyncpg.CannotConnectNowError, asyncpg.InterfaceError, RedisError) as exc:
            if time.monotonic() + delay > deadline:
                raise StartupError(f"could not reach {what} within {STARTUP_TIMEOUT_S:.0f}s: {exc}") from exc
            log.warning("waiting for %s: %s", what, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


class Coordinator:
    """One coordinator replica. Any number may run against the same database."""

    def __init__(self, config: CoordinatorConfig) -> None:
        self._config = config
        self._stop = asyncio.Event()
        self.ready = asyncio.Event()
        #: The bound gRPC port, known once `ready` is set (useful with port 0).
        self.port: int | None = None
        self.relay: OutboxRelay | None = None
        self.sweeper: Sweeper | None = None

    def stop(self) -> None:
        """Asks `run()` to shut down; idempotent, and harmless before start."""
        self._stop.set()

    async def run(self) -> None:
        """Serves until `stop()`; then shuts down in stages and returns."""
        config = self._config
        pool = await _until_reachable(
            f"PostgreSQL at {redact_url(config.database_url)}",
            lambda: create_pool(config.database_url, max_size=config.db_pool_size),
        )
        redis = aioredis.Redis.from_url(config.redis_url, health_check_interval=30)
        try:
            async with pool.acquire() as conn:
                applied = await apply_migrations(conn)
            if applied:
                log.info("schema migrated", extra={"migrations": applied})
            await _until_reachable(
                f"Redis at {redact_url(config.redis_url)}", lambda: redis.set(SHARD_COUNT_KEY, config.stream_shards)
            )
            await self._serve(pool, redis)
        finally:
            await redis.aclose()
            try:
                async with asyncio.timeout(_POOL_CLOSE_S):
                    await pool.close()
            except TimeoutError:
                # close() waits for every connection to come back; one held by
                # a stuck handler must not keep the process from exiting.
                log.warning("PostgreSQL pool did not close within %.0fs; terminating it", _POOL_CLOSE_S)
                pool.terminate()

    async def _serve(self, pool: asyncpg.Pool, redis: aioredis.Redis) -> None:
        config = self._config
        hub = RunChangeHub()
        workflows = WorkflowRegistry(pool)
        relay = OutboxRelay(
            pool=pool,
            redis=redis,
            database_url=config.database_url,
            settings=RelaySettings(
                shards=config.stream_shards,
                batch_size=config.relay_batch_size,
                poll_interval_s=config.relay_poll_interval_s,
                retention_s=config.outbox_retention_s,
            ),
        )

        def changed(run_id: object) -> None:
            hub.notify(run_id)  # type: ignore[arg-type]
            relay.wake()

        engine = RunEngine(
            pool=pool,
            workflows=workflows,
            shards=config.stream_shards,
            max_output_bytes=config.max_output_bytes,
            on_change=changed,
        )
        sweeper = Sweeper(
            pool=pool,
            redis=redis,
            engine=engine,
            interval_s=config.sweep_interval_s,
            stall_after_s=config.stall_after_s,
            shards=config.stream_shards,
        )
        self.relay, self.sweeper = relay, sweeper
        service = WorkflowService(leases=LeaseManager(pool), engine=engine, workflows=workflows, hub=hub)

        interceptors = [BearerTokenInterceptor(config.token)] if config.token else []
        server = grpc.aio.server(interceptors=interceptors, options=[("grpc.so_reuseport", 0)])
        workflow_pb2_grpc.add_WorkflowServiceServicer_to_server(service, server)
        health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        if config.tls_cert is not None and config.tls_key is not None:
            credentials = grpc.ssl_server_credentials([(config.tls_key.read_bytes(), config.tls_cert.read_bytes())])
            self.port = server.add_secure_port(config.listen_addr, credentials)
        else:
            self.port = server.add_insecure_port(config.listen_addr)
        if config.metrics_port:
            start_http_server(config.metrics_port, addr="127.0.0.1")
        await server.start()
        host = config.listen_addr.rpartition(":")[0]
        log.info(
            "coordinator serving",
            extra={
                "addr": f"{host}:{self.port}",
                "tls": config.tls_cert is not None,
                "auth": bool(config.token),
                "shards": config.stream_shards,
            },
        )
        for name in ("", _SERVICE_NAME):
            await health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.ready.set()
        try:
            async with asyncio.TaskGroup() as tg:
                loops = [
                    tg.create_task(relay.run(), name="outbox-relay"),
                    tg.create_task(sweeper.run(), name="sweeper"),
                ]
                await self._stop.wait()
                log.info("coordinator stopping")
                for name in ("", _SERVICE_NAME):
                    await health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
                await server.stop(_SHUTDOWN_GRACE_S)
                for loop in loops:
                    loop.cancel()
        finally:
            await server.stop(None)
            log.info("coordinator stopped")
