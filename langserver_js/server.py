"""Wiring of the JavaScript language server: pool, gRPC, health, signals, shutdown.

The sandbox processes start before the gRPC server does, and the health service
reports SERVING only once every pool slot has a warm isolate. SIGTERM and SIGINT only
set an event; shutdown then runs in stages:

1. health turns NOT_SERVING (load balancers stop sending);
2. the gRPC server refuses new calls and lets in-flight executions finish for up to
   `shutdown_grace_s`, then cancels what is left (the worker retries those tasks);
3. the pool closes its sandbox processes (stdin EOF, SIGKILL after a grace period);
4. `serve()` returns once every process is reaped.
"""

from __future__ import annotations

import asyncio
import logging
import signal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from langserver_js.config import ServerConfig
from langserver_js.errors import BindError, PoolStartError
from langserver_js.pool import WorkerPool
from langserver_js.service import SERVICE_NAME, LanguageServerService
from protos import langserver_pb2_grpc

__all__ = ["serve"]

logger = logging.getLogger(__name__)

_GRPC_SLACK_BYTES = 1 << 20


async def serve(config: ServerConfig) -> None:
    """Serves until SIGTERM or SIGINT, then shuts down gracefully.

    Raises:
        BindError: the listen address could not be bound.
        PoolStartError: the sandbox processes could not be started.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    pool = WorkerPool(config)
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(pool.run(), name="sandbox-pool")
            try:
                await pool.wait_started()
                await _serve_grpc(config, pool, stop)
            finally:
                pool.stop()
    except* PoolStartError as group:
        raise PoolStartError(str(group.exceptions[0])) from group
    except* BindError as group:
        raise BindError(str(group.exceptions[0])) from group
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    logger.info("stopped")


async def _serve_grpc(config: ServerConfig, pool: WorkerPool, stop: asyncio.Event) -> None:
    # Twice the caps, so that an oversized request still reaches the validation that
    # names its field; beyond that gRPC itself answers RESOURCE_EXHAUSTED.
    max_request = 2 * (config.max_code_bytes + config.max_input_bytes) + _GRPC_SLACK_BYTES
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_request),
            ("grpc.max_send_message_length", 6 * (config.max_output_bytes + config.max_log_bytes) + _GRPC_SLACK_BYTES),
        ]
    )
    langserver_pb2_grpc.add_LanguageServerServicer_to_server(LanguageServerService(config, pool), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        port = server.add_insecure_port(config.listen_addr)
    except RuntimeError as exc:
        raise BindError(f"cannot listen on {config.listen_addr}: {exc}") from exc
    if port == 0:
        raise BindError(f"cannot listen on {config.listen_addr}")
    await server.start()
    try:
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        await health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        logger.info(
            "serving",
            extra={"addr": f"{config.listen_host}:{port}", "pool_processes": config.pool_processes},
        )
        await stop.wait()
        logger.info("draining", extra={"grace_s": config.shutdown_grace_s})
        await health_servicer.enter_graceful_shutdown()
    finally:
        await server.stop(config.shutdown_grace_s)
