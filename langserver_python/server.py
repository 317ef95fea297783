"""Wiring of the Python language server, and its start and stop stages.

Start: (1) spawn the fork server and wait for its report — before any gRPC
object exists, so no gRPC thread is alive when it is spawned (it is spawned by
fork + exec anyway); (2) log once what the sandbox could and could not set up;
(3) serve `LanguageServer` and the gRPC health service.

Stop, on SIGTERM or SIGINT (the handlers only set an event): (1) health turns
NOT_SERVING and the server refuses new RPCs; (2) executions in flight finish,
for at most `shutdown_grace_s`; (3) whatever still runs then is cancelled —
its child is killed; (4) the fork server is told to exit and is reaped.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from langserver_python.admission import Admission
from langserver_python.config import ServerConfig
from langserver_python.errors import SandboxStartError
from langserver_python.grpc_service import LanguageServerService
from langserver_python.pool import SandboxPool
from protos import langserver_pb2_grpc

__all__ = ["EXIT_CONFIG", "EXIT_FAILURE", "EXIT_OK", "serve"]

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 3
SERVICE_NAME = "langserver.v1.LanguageServer"
_KERNEL_FEATURES = ("seccomp", "landlock", "network_namespace")


def _log_report(config: ServerConfig, report: dict[str, Any]) -> None:
    logger.info("sandbox ready", extra={"sandbox": report})
    for layer in sorted(config.disabled_layers):
        logger.warning("sandbox layer %s is OFF (test-only switch); never run like this in production", layer)
    missing = [f for f in _KERNEL_FEATURES if str(report.get(f, "")).startswith("unavailable")]
    for feature in missing:
        logger.warning("kernel sandbox feature %s is %s", feature, report[feature])
    if len(missing) == len(_KERNEL_FEATURES):
        logger.warning(
            "the kernel offers no sandboxing here (no seccomp, no Landlock, no network namespace): "
            "only the language, interpreter and process layers apply"
        )


async def serve(config: ServerConfig) -> int:
    """Runs the server until SIGTERM/SIGINT; returns the process exit code."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    health_servicer = health.aio.HealthServicer()

    async def availability(up: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if up else health_pb2.HealthCheckResponse.NOT_SERVING
        if not stop.is_set():
            for name in ("", SERVICE_NAME):
                await health_servicer.set(name, status)

    pool = SandboxPool(config.sandbox_settings(), on_availability=availability)
    admission = Admission(
        limit=config.max_concurrency, max_queue=config.max_queue, queue_timeout_s=config.queue_timeout_s
    )
    start_error: SandboxStartError | None = None
    try:
        async with asyncio.TaskGroup() as tasks:
            pool_task = tasks.create_task(pool.run(), name="sandbox-pool")
            try:
                report = await pool.wait_ready()
            except SandboxStartError:
                await pool_task
                raise
            _log_report(config, report)
            server = grpc.aio.server(
                options=[
                    ("grpc.max_receive_message_length", config.max_message_bytes),
                    ("grpc.so_reuseport", 0),
                ]
            )
            langserver_pb2_grpc.add_LanguageServerServicer_to_server(
                LanguageServerService(config=config, admission=admission, pool=pool), server
            )
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
            try:
                bound = server.add_insecure_port(config.addr)
            except RuntimeError as exc:
                bound, reason = 0, str(exc)
            else:
                reason = "the port is taken or the address is not local"
            if not bound:
                logger.error("cannot listen on %s (LANGSERVER_ADDR): %s", config.addr, reason)
                await pool.stop()
                return EXIT_FAILURE
            await server.start()
            for name in ("", SERVICE_NAME):
                await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
            logger.info("serving on %s", config.addr)
            await stop.wait()

            logger.info("stopping: draining %d running and %d queued executions", admission.running, admission.waiting)
            await health_servicer.enter_graceful_shutdown()
            await server.stop(config.shutdown_grace_s)
            await pool.stop()
    except* SandboxStartError as group:
        error = group.exceptions[0]
        assert isinstance(error, SandboxStartError)
        logger.error("the sandbox could not start: %s", error)
        start_error = error
    if start_error is not None:
        return EXIT_CONFIG if start_error.config_error else EXIT_FAILURE
    logger.info("stopped")
    return EXIT_OK
