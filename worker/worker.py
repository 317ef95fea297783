"""The worker: wires the loops together and runs them (seed steps 4, 5 and 12).

:class:`~worker.intake.Intake` runs, per shard stream of every queue the worker
serves, a :class:`~worker.reader.StreamReader` and a
:class:`~worker.reclaim.Reclaimer` (the shard count is discovered from Redis,
where the coordinator publishes it, and followed when it grows);
``Concurrency`` executors sit behind a bounded hand-off
(:class:`~worker.executor_pool.ExecutorPool`); the health monitor watches it
all. Everything runs in one TaskGroup owned by :meth:`Worker.run`.

Shutdown runs in written stages once ``stop`` is set:

1. Stop intake: readers leave their wait, reclaimers their sleep; the slot
   pool closes so nothing new is read. Readiness turns false.
2. Drain: running tasks get ``WORKER_SHUTDOWN_GRACE_SECONDS`` to finish,
   report and ack. Messages handed over but not started stay pending.
3. Cancel the rest with the reason ``SHUTDOWN``: their leases are released
   (the coordinator re-dispatches them at once) and nothing is reported, since
   an interruption is not a failure.
4. Close the HTTP session, the gRPC channels, the Redis pool and the health server.

Every message not acked stays in its stream's PEL (pending-entries list) and is
reclaimed by another worker once idle longer than the TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator
from typing import Final

import redis.asyncio as aioredis

from telemetry import redact_url
from worker.config import WorkerConfig
from worker.coordinator_client import CoordinatorClient
from worker.errors import ConfigError
from worker.execution import ActiveExecutions, CancelReason
from worker.executor_pool import ExecutorPool
from worker.executors import HTTPExecutor
from worker.health import HealthMonitor, HealthServer, HealthState, Probe, Progress
from worker.intake import Intake
from worker.langclient import LangClientManager
from worker.lease_renewal import LeaseRenewer
from worker.metrics import WorkerMetrics
from worker.processor import TaskProcessor
from worker.router import Router
from worker.slots import SlotPool
from worker.stream import StreamScripts, connect_redis

__all__ = ["Worker", "run_worker"]

logger = logging.getLogger(__name__)

#: Stage 3's budget: releasing the leases of cancelled executions.
CANCEL_BUDGET_S: Final = 10.0


class Worker:
    """A configured worker with its connections; open it with :meth:`open`, then :meth:`run` it."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        redis_client: aioredis.Redis,
        coordinator: CoordinatorClient,
        languages: LangClientManager,
        http: HTTPExecutor,
        metrics: WorkerMetrics,
        health: HealthState,
        metrics_port: int,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.health = health
        #: The port /metrics, /livez and /readyz are served on.
        self.metrics_port = metrics_port
        self._redis = redis_client
        self._scripts = StreamScripts(redis_client)
        self._coordinator = coordinator
        self._languages = languages
        self._http = http
        self._progress = Progress()
        self._intake: Intake | None = None

    @property
    def streams(self) -> tuple[str, ...]:
        """The streams read (known once the shard count was discovered)."""
        return self._intake.streams if self._intake is not None else ()

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, config: WorkerConfig) -> AsyncIterator[Worker]:
        """Opens the worker's connections and health server; closes them on exit (shutdown stage 4).

        Raises:
            ConfigError: the metrics/health port cannot be bound.
        """
        async with contextlib.AsyncExitStack() as stack:
            metrics = WorkerMetrics()
            health = HealthState()
            server = HealthServer(config.metrics_host, config.metrics_port, health, metrics)
            try:
                port = server.start()
            except OSError as exc:
                raise ConfigError(
                    "WORKER_METRICS_PORT", f"cannot listen on {config.metrics_host}:{config.metrics_port}: {exc}"
                ) from exc
            stack.push_async_callback(asyncio.to_thread, server.stop)
            redis_client = connect_redis(config.redis_url)
            stack.push_async_callback(redis_client.aclose)
            coordinator = CoordinatorClient.connect(config)
            stack.push_async_callback(coordinator.close)
            languages = LangClientManager.connect(
                config.lang_server_addrs, worker_id=config.worker_id, max_output_bytes=config.max_output_bytes
            )
            stack.push_async_callback(languages.close)
            http = await HTTPExecutor.create(max_response_bytes=config.max_output_bytes)
            stack.push_async_callback(http.close)
            yield cls(
                config,
                redis_client=redis_client,
                coordinator=coordinator,
                languages=languages,
                http=http,
                metrics=metrics,
                health=health,
                metrics_port=port,
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Runs the worker until `stop` is set, then shuts down in stages (module docstring).

        Raises:
            Exception: only for bugs (a loop that crashed); the worker's own
                trouble (Redis or coordinator down) is logged and retried.
        """
        config = self.config
        self._log_start()
        slots = SlotPool(config.concurrency)
        self.metrics.track_slots(lambda: slots.used, lambda: slots.free)
        active = ActiveExecutions()
        processor = TaskProcessor(
            config=config,
            coordinator=self._coordinator,
            router=Router([self._http], self._languages),
            renewer=LeaseRenewer(
                self._coordinator,
                ttl_s=config.lease_ttl_s,
                interval_s=config.renew_interval_s,
                metrics=self.metrics,
                progress=self._progress,
            ),
            active=active,
            metrics=self.metrics,
            progress=self._progress,
            stop=stop,
        )
        pool = ExecutorPool(concurrency=config.concurrency, slots=slots, handle=processor.handle)
        monitor = HealthMonitor(
            self.health,
            self.metrics,
            probes=self._probes(),
            slots=slots,
            progress=self._progress,
            stall_threshold_s=config.stall_threshold_s,
        )
        intake = Intake(
            config,
            redis_client=self._redis,
            scripts=self._scripts,
            slots=slots,
            pool=pool,
            coordinator=self._coordinator,
            metrics=self.metrics,
        )
        self._intake = intake
        async with asyncio.TaskGroup() as tg:
            monitor_task = tg.create_task(monitor.run(), name="health-monitor")
            tg.create_task(pool.run(), name="executor-pool")  # ends with pool.close() in stage 4
            intake_task = tg.create_task(intake.run(stop), name="intake")
            await stop.wait()
            await self._shut_down(slots=slots, intake=intake_task, pool=pool, active=active)
            monitor_task.cancel()

    async def _shut_down(
        self, *, slots: SlotPool, intake: asyncio.Task[None], pool: ExecutorPool, active: ActiveExecutions
    ) -> None:
        grace = self.config.shutdown_grace_s
        worker_id = self.config.worker_id
        logger.info(
            "stopping: no new messages; draining in-flight tasks for up to %g s", grace, extra={"worker_id": worker_id}
        )
        # Stage 1: stop intake.
        self.health.draining = True
        slots.close()
        await asyncio.wait([intake])
        # Stage 2: drain.
        if not await pool.drain(grace):
            # Stage 3: cancel the rest, with a recorded reason.
            cancelled = active.cancel_all(CancelReason.SHUTDOWN)
            logger.warning(
                "grace period over: cancelling %d task(s) and releasing their leases",
                cancelled,
                extra={"worker_id": worker_id},
            )
            if not await pool.drain(CANCEL_BUDGET_S):
                logger.error(
                    "%d task(s) still busy after cancellation; abandoning them",
                    pool.busy,
                    extra={"worker_id": worker_id},
                )
        pool.close()
        logger.info("worker stopped", extra={"worker_id": worker_id})

    def _probes(self) -> dict[str, Probe]:
        async def redis_ping() -> None:
            await self._redis.ping()

        probes: dict[str, Probe] = {"coordinator": self._coordinator.check, "redis": redis_ping}
        for client in self._languages.clients():
            probes[f"{client.runtime} language server"] = client.check
        return probes

    def _log_start(self) -> None:
        config = self.config
        logger.info(
            "worker starting",
            extra={
                "worker_id": config.worker_id,
                "coordinator": config.coordinator_addr,
                "redis": redact_url(config.redis_url),
                "queues": list(config.served_queues),
                "language_servers": dict(config.lang_server_addrs),
                "concurrency": config.concurrency,
                "lease_ttl_s": config.lease_ttl_s,
                "renew_interval_s": config.renew_interval_s,
                "reclaim_interval_s": config.reclaim_interval_s,
                "max_deliveries": config.max_deliveries,
                "metrics_port": self.metrics_port,
                "tls": config.coordinator_tls_ca is not None,
            },
        )
        if config.coordinator_token and config.coordinator_tls_ca is None and not _is_loopback(config.coordinator_addr):
            logger.warning("COORDINATOR_TOKEN is sent without TLS to a non-loopback address; set COORDINATOR_TLS_CA")


def _is_loopback(addr: str) -> bool:
    host = addr.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def run_worker(config: WorkerConfig, *, stop: asyncio.Event) -> None:
    """Runs one worker until `stop` is set, then shuts it down gracefully.

    This is the entry the supervisor forks into, and what ``python -m worker``
    runs. It returns once every stage of the shutdown is done.

    Raises:
        ConfigError: the metrics/health port cannot be bound.
    """
    async with Worker.open(config) as worker:
        await worker.run(stop)
