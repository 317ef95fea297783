"""The worker's client of the coordinator: lease, renew, release and report (seed step 3).

Every call has its own deadline and waits for the channel to be ready within
it, so a coordinator restart delays calls instead of failing them at once.
Failures are translated in one place (:func:`_translate`):

* transport trouble (UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, ...) ->
  :class:`CoordinatorUnavailable`: the outcome is unknown and, for a renewal,
  it is *never* read as "lease lost" — only ``acquired = false`` means that;
* a refusal status (INVALID_ARGUMENT, UNAUTHENTICATED, ...) ->
  :class:`CoordinatorRejected`.

Idempotent calls (report, release) are retried here with backoff. Acquire is
not: if its reply is lost, a retry would be refused (the worker itself holds
the lease) and the message dropped while its task sits leased by nobody; the
processor leaves such a message pending instead.

The report carries the attempt straight from the message: the fencing token
travels state machine -> outbox -> stream -> worker -> report.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import workflow_pb2, workflow_pb2_grpc
from protos.taskstream import TaskMessage
from worker.config import WorkerConfig
from worker.errors import CoordinatorRejected, CoordinatorUnavailable
from worker.executors import ExecutionResult

__all__ = ["CoordinatorClient", "ReportAck", "channel_options"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

ACQUIRE_TIMEOUT_S: Final = 5.0
RELEASE_TIMEOUT_S: Final = 5.0
REPORT_TIMEOUT_S: Final = 10.0
HEALTH_TIMEOUT_S: Final = 2.0
#: Attempts of an idempotent call (report, release) before giving up, and the first backoff.
REPORT_ATTEMPTS: Final = 4
RELEASE_ATTEMPTS: Final = 2
RETRY_BACKOFF_S: Final = 0.5

#: Statuses that mean "the coordinator refused", as opposed to "the call may not have got through".
_REFUSALS: Final = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)


def channel_options(*, max_receive_bytes: int | None = None) -> list[tuple[str, int]]:
    """gRPC channel options shared by the worker's channels.

    Reconnect backoff is capped at 5 s (the default grows to 2 minutes), so a
    restarted server is found again quickly; keepalive pings detect a dead peer
    on an idle connection.
    """
    options = [
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.min_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 5000),
        ("grpc.keepalive_time_ms", 30000),
        ("grpc.keepalive_timeout_ms", 10000),
    ]
    if max_receive_bytes is not None:
        options.append(("grpc.max_receive_message_length", max_receive_bytes))
    return options


def _translate(call: str, exc: grpc.aio.AioRpcError) -> Exception:
    detail = f"coordinator {call}: {exc.code().name}: {exc.details()}"
    if exc.code() in _REFUSALS:
        return CoordinatorRejected(detail)
    return CoordinatorUnavailable(detail)


@dataclass(frozen=True, slots=True)
class ReportAck:
    """The coordinator's answer to a report it made durable."""

    applied: bool
    ignored_reason: str


class CoordinatorClient:
    """Calls the coordinator on one channel; build with :meth:`connect` inside the event loop."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        owner: str,
        renew_timeout_s: float,
        token: str | None = None,
        retry_backoff_s: float = RETRY_BACKOFF_S,
    ) -> None:
        self._channel = channel
        self._stub = workflow_pb2_grpc.WorkflowServiceStub(channel)
        self._health = health_pb2_grpc.HealthStub(channel)
        self._owner = owner
        self._renew_timeout_s = renew_timeout_s
        self._metadata: Sequence[tuple[str, str]] = (("authorization", f"Bearer {token}"),) if token else ()
        self._retry_backoff_s = retry_backoff_s

    @classmethod
    def connect(cls, config: WorkerConfig) -> CoordinatorClient:
        """Opens the channel described by `config` (TLS when a CA is configured). Connects lazily."""
        options = channel_options(max_receive_bytes=16 * 1024 * 1024)
        channel: grpc.aio.Channel
        if config.coordinator_tls_ca is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates=config.coordinator_tls_ca)
            channel = grpc.aio.secure_channel(config.coordinator_addr, credentials, options=options)
        else:
            channel = grpc.aio.insecure_channel(config.coordinator_addr, options=options)
        return cls(
            channel,
            owner=config.worker_id,
            renew_timeout_s=config.renew_timeout_s,
            token=config.coordinator_token,
        )

    async def close(self) -> None:
        """Closes the channel (in-flight calls are cancelled). Idempotent."""
        await self._channel.close()

    async def _call(self, name: str, rpc: Callable[[], Awaitable[T]]) -> T:
        try:
            return await rpc()
        except grpc.aio.AioRpcError as exc:
            raise _translate(name, exc) from exc

    async def _retrying(self, name: str, attempts: int, rpc: Callable[[], Awaitable[T]]) -> T:
        """Retries an idempotent call on CoordinatorUnavailable, with exponential backoff."""
        delay = self._retry_backoff_s
        for attempt in range(1, attempts + 1):
            try:
                return await self._call(name, rpc)
            except CoordinatorUnavailable as exc:
                if attempt == attempts:
                    raise
                logger.warning(
                    "%s failed (attempt %d of %d), retrying in %.1f s: %s", name, attempt, attempts, delay, exc
                )
                await asyncio.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def _lease_request(self, message: TaskMessage, ttl_s: int) -> workflow_pb2.AcquireTaskLeaseRequest:
        return workflow_pb2.AcquireTaskLeaseRequest(
            task_id=message.task_id,
            run_id=message.run_id,
            owner=self._owner,
            ttl_seconds=ttl_s,
            attempt=message.attempt,
        )

    async def acquire(self, message: TaskMessage, ttl_s: int) -> bool:
        """Claims the task of `message` for this worker (not retried, see the module docstring).

        Returns:
            True when acquired; False when the coordinator refused (running
            elsewhere under a live lease — this worker included —, finished, or
            the message's attempt is stale).

        Raises:
            CoordinatorUnavailable: outcome unknown.
            CoordinatorRejected: the request was refused as invalid.
        """
        request = self._lease_request(message, ttl_s)
        response = await self._call(
            "AcquireTaskLease",
            lambda: self._stub.AcquireTaskLease(
                request, timeout=ACQUIRE_TIMEOUT_S, metadata=self._metadata, wait_for_ready=True
            ),
        )
        return bool(response.acquired)

    async def renew(self, message: TaskMessage, ttl_s: int) -> bool:
        """Extends the lease this worker holds. One call, bounded by the renewal timeout (< TTL/3).

        Returns:
            False only when the coordinator says the lease is lost.

        Raises:
            CoordinatorUnavailable: the renewal did not get an answer; the
                caller retries, and the lease lives on until its TTL.
            CoordinatorRejected: the request was refused as invalid.
        """
        request = self._lease_request(message, ttl_s)
        response = await self._call(
            "RenewTaskLease",
            lambda: self._stub.RenewTaskLease(
                request, timeout=self._renew_timeout_s, metadata=self._metadata, wait_for_ready=True
            ),
        )
        return bool(response.acquired)

    async def release(self, message: TaskMessage, reason: str, *, attempts: int = RELEASE_ATTEMPTS) -> bool:
        """Hands the task back (QUEUED, same attempt, re-dispatched at once). Retried.

        Returns:
            False when this worker did not hold the lease (nothing changed).
        """
        request = workflow_pb2.ReleaseTaskLeaseRequest(
            task_id=message.task_id,
            run_id=message.run_id,
            owner=self._owner,
            attempt=message.attempt,
            reason=reason,
        )
        response = await self._retrying(
            "ReleaseTaskLease",
            attempts,
            lambda: self._stub.ReleaseTaskLease(
                request, timeout=RELEASE_TIMEOUT_S, metadata=self._metadata, wait_for_ready=True
            ),
        )
        return bool(response.released)

    async def report(self, message: TaskMessage, result: ExecutionResult) -> ReportAck:
        """Reports one attempt's outcome; returns once the coordinator made it durable. Retried.

        Raises:
            CoordinatorUnavailable: still no acknowledgement after the retries;
                the message must stay pending.
            CoordinatorRejected: the report was refused as invalid.
        """
        request = workflow_pb2.ReportTaskResultRequest(
            task_id=message.task_id,
            run_id=message.run_id,
            node_id=message.node_id,
            attempt=message.attempt,
            owner=self._owner,
            status="completed" if result.succeeded else "failed",
            output=result.output or b"",
            error=result.error or "",
        )
        return await self._report(request)

    async def report_dead_letter(self, message: TaskMessage, *, delivery_count: int, error: str) -> ReportAck:
        """Reports a message delivered too many times as failed, flagged as a dead letter. Retried."""
        request = workflow_pb2.ReportTaskResultRequest(
            task_id=message.task_id,
            run_id=message.run_id,
            node_id=message.node_id,
            attempt=message.attempt,
            owner=self._owner,
            status="failed",
            error=error,
            dead_letter=True,
            delivery_count=delivery_count,
        )
        return await self._report(request)

    async def _report(self, request: workflow_pb2.ReportTaskResultRequest) -> ReportAck:
        async def once() -> workflow_pb2.ReportTaskResultResponse:
            response: workflow_pb2.ReportTaskResultResponse = await self._stub.ReportTaskResult(
                request, timeout=REPORT_TIMEOUT_S, metadata=self._metadata, wait_for_ready=True
            )
            if not response.acknowledged:
                # Not durable: the same as no answer (the report is idempotent, so it is retried).
                raise CoordinatorUnavailable("coordinator ReportTaskResult: report not acknowledged")
            return response

        response = await self._retrying("ReportTaskResult", REPORT_ATTEMPTS, once)
        return ReportAck(applied=bool(response.applied), ignored_reason=str(response.ignored_reason))

    async def check(self) -> None:
        """Raises CoordinatorUnavailable unless the coordinator answers a health check.

        A server without the health service (UNIMPLEMENTED) answered, so it is reachable.
        """
        try:
            response = await self._health.Check(
                health_pb2.HealthCheckRequest(service=""),
                timeout=HEALTH_TIMEOUT_S,
                metadata=self._metadata,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return
            raise CoordinatorUnavailable(f"coordinator health check: {exc.code().name}: {exc.details()}") from exc
        if response.status != health_pb2.HealthCheckResponse.SERVING:
            raise CoordinatorUnavailable(f"coordinator health check: status {response.status}")
