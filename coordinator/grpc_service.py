"""The gRPC face of the coordinator: `workflow.v1.WorkflowService`.

Handlers validate their request (INVALID_ARGUMENT naming the field), call the
domain objects, and translate results into messages. They hold no SQL and no
business rules. Domain exceptions become status codes in exactly one place,
`_STATUS_BY_ERROR`, applied by the `_rpc` decorator.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from redis.exceptions import RedisError

from coordinator.config import DEFAULT_LEASE_TTL_S
from coordinator.errors import CoordinatorError, InvalidDefinition, InvalidRequest, NotFound
from coordinator.lease import LeaseManager
from coordinator.metrics import LEASES, REPORTS, RPC_SECONDS
from coordinator.runs import Report, RunEngine, RunSnapshot
from coordinator.watch import RunChangeHub
from coordinator.workflows import WorkflowRegistry
from protos import workflow_pb2 as pb
from protos import workflow_pb2_grpc as pb_grpc

__all__ = ["WorkflowService"]

log = logging.getLogger(__name__)

_STATUS_BY_ERROR: dict[type[CoordinatorError], grpc.StatusCode] = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidDefinition: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
}
# Infrastructure that is down right now: the caller should retry.
_UNAVAILABLE = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    RedisError,
)

_RUN_STATES = {
    "RUNNING": pb.RUN_STATE_RUNNING,
    "COMPLETED": pb.RUN_STATE_COMPLETED,
    "FAILED": pb.RUN_STATE_FAILED,
    "CANCELLED": pb.RUN_STATE_CANCELLED,
}
_TASK_STATES = {
    "PENDING": pb.TASK_STATE_PENDING,
    "QUEUED": pb.TASK_STATE_QUEUED,
    "RUNNING": pb.TASK_STATE_RUNNING,
    "COMPLETED": pb.TASK_STATE_COMPLETED,
    "FAILED": pb.TASK_STATE_FAILED,
    "SKIPPED": pb.TASK_STATE_SKIPPED,
}
_TERMINAL_RUN = frozenset({"COMPLETED", "FAILED", "CANCELLED"})
_MAX_ID_CHARS = 256
MAX_LEASE_TTL_S = 86_400
_MAX_ERROR_CHARS = 64 * 1024
_MAX_INPUT_BYTES = 1 << 20
_WATCH_POLL_S = 0.5

Context = grpc.aio.ServicerContext[Any, Any]
Req = TypeVar("Req")
Resp = TypeVar("Resp")


def _rpc(
    handler: Callable[[Any, Req, Context], Awaitable[Resp]],
) -> Callable[[Any, Req, Context], Awaitable[Resp]]:
    """Maps domain and infrastructure errors to status codes, and times the call."""
    name = handler.__name__

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Req, context: Context) -> Resp:
        started = time.perf_counter()
        try:
            return await handler(self, request, context)
        except CoordinatorError as exc:
            await context.abort(_STATUS_BY_ERROR.get(type(exc), grpc.StatusCode.FAILED_PRECONDITION), str(exc))
            raise  # unreachable: abort raises
        except _UNAVAILABLE as exc:
            log.warning("%s failed: a backing service is unavailable: %s", name, exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{type(exc).__name__}: {exc}")
            raise
        finally:
            RPC_SECONDS.labels(name).observe(time.perf_counter() - started)

    return wrapper


def _required(value: str, field: str) -> str:
    if not value:
        raise InvalidRequest(field, "is required")
    if len(value) > _MAX_ID_CHARS:
        raise InvalidRequest(field, f"is longer than {_MAX_ID_CHARS} characters")
    return value


def _uuid(value: str, field: str) -> uuid.UUID:
    _required(value, field)
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidRequest(field, f"must be a UUID, not {value[:64]!r}") from None


def _attempt_ref(request: pb.ReleaseTaskLeaseRequest | pb.ReportTaskResultRequest) -> tuple[uuid.UUID, uuid.UUID, str]:
    """Validates the (task_id, run_id, owner, attempt) that name one attempt of one task."""
    task_id = _uuid(request.task_id, "task_id")
    run_id = _uuid(request.run_id, "run_id")
    owner = _required(request.owner, "owner")
    if request.attempt < 1:
        raise InvalidRequest("attempt", "must be at least 1")
    return run_id, task_id, owner


def _json(data: bytes, field: str, *, empty: Any) -> Any:
    if not data:
        return empty
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(field, f"is not valid JSON ({exc})") from None


def _ts(value: datetime.datetime | None) -> Timestamp | None:
    if value is None:
        return None
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def _task_message(row: Any) -> pb.TaskInstance:
    return pb.TaskInstance(
        id=str(row["id"]),
        node_id=row["node_id"],
        node_type=row["node_type"],
        queue=row["queue"] or "",
        state=_TASK_STATES[row["state"]],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        input=(row["input"] or "").encode(),
        output=(row["output"] or "").encode(),
        error=row["error"] or "",
        lease_owner=row["lease_owner"] or "",
        lease_expires_at=_ts(row["lease_expires_at"]),
        next_attempt_at=_ts(row["next_attempt_at"]),
        started_at=_ts(row["started_at"]),
        finished_at=_ts(row["finished_at"]),
        updated_at=_ts(row["updated_at"]),
    )


def _run_message(snapshot: RunSnapshot, *, with_tasks: bool = True) -> pb.Run:
    run = snapshot.run
    return pb.Run(
        id=str(run["id"]),
        workflow=run["workflow"],
        version=run["version"],
        state=_RUN_STATES[run["state"]],
        input=(run["input"] or "").encode(),
        output=(run["output"] or "").encode(),
        error=run["error"] or "",
        created_at=_ts(run["created_at"]),
        updated_at=_ts(run["updated_at"]),
        tasks=[_task_message(t) for t in snapshot.tasks] if with_tasks else [],
    )


class WorkflowService(pb_grpc.WorkflowServiceServicer):  # type: ignore[misc]
    def __init__(
        self, *, leases: LeaseManager, engine: RunEngine, workflows: WorkflowRegistry, hub: RunChangeHub
    ) -> None:
        self._leases = leases
        self._engine = engine
        self._workflows = workflows
        self._hub = hub

    # -- worker-facing -------------------------------------------------------

    def _lease_args(self, request: pb.AcquireTaskLeaseRequest) -> tuple[uuid.UUID, uuid.UUID, str, float]:
        task_id = _uuid(request.task_id, "task_id")
        run_id = _uuid(request.run_id, "run_id")
        owner = _required(request.owner, "owner")
        if request.ttl_seconds > MAX_LEASE_TTL_S:
            raise InvalidRequest("ttl_seconds", f"must be at most {MAX_LEASE_TTL_S} (a day)")
        ttl = float(request.ttl_seconds) if request.ttl_seconds > 0 else float(DEFAULT_LEASE_TTL_S)
        return run_id, task_id, owner, ttl

    @_rpc
    async def AcquireTaskLease(
        self, request: pb.AcquireTaskLeaseRequest, context: Context
    ) -> pb.AcquireTaskLeaseResponse:
        run_id, task_id, owner, ttl = self._lease_args(request)
        if request.attempt < 0:
            raise InvalidRequest("attempt", "must not be negative")
        acquired = await self._leases.acquire(run_id, task_id, owner, ttl, request.attempt)
        LEASES.labels("acquire", "granted" if acquired else "refused").inc()
        if acquired:
            self._hub.notify(run_id)
        return pb.AcquireTaskLeaseResponse(acquired=acquired)

    @_rpc
    async def RenewTaskLease(
        self, request: pb.AcquireTaskLeaseRequest, context: Context
    ) -> pb.AcquireTaskLeaseResponse:
        run_id, task_id, owner, ttl = self._lease_args(request)
        renewed = await self._leases.renew(run_id, task_id, owner, ttl)
        LEASES.labels("renew", "granted" if renewed else "refused").inc()
        return pb.AcquireTaskLeaseResponse(acquired=renewed)

    @_rpc
    async def ReleaseTaskLease(
        self, request: pb.ReleaseTaskLeaseRequest, context: Context
    ) -> pb.ReleaseTaskLeaseResponse:
        run_id, task_id, owner = _attempt_ref(request)
        released = await self._engine.release(run_id, task_id, owner, request.attempt, request.reason[:1000])
        LEASES.labels("release", "granted" if released else "refused").inc()
        return pb.ReleaseTaskLeaseResponse(released=released)

    @_rpc
    async def ReportTaskResult(
        self, request: pb.ReportTaskResultRequest, context: Context
    ) -> pb.ReportTaskResultResponse:
        run_id, task_id, owner = _attempt_ref(request)
        if request.status not in ("completed", "failed"):
            raise InvalidRequest("status", f"must be 'completed' or 'failed', not {request.status[:32]!r}")
        completed = request.status == "completed"
        output_json: str | None = None
        if completed:
            if request.dead_letter:
                raise InvalidRequest("status", "a dead-letter report must be 'failed'")
            _json(request.output, "output", empty=None)
            output_json = request.output.decode() if request.output else "null"
        elif not request.error:
            raise InvalidRequest("error", "is required when status is 'failed'")
        outcome = await self._engine.report(
            Report(
                run_id=run_id,
                task_id=task_id,
                attempt=request.attempt,
                owner=owner,
                completed=completed,
                output_json=output_json,
                error=request.error[:_MAX_ERROR_CHARS],
                dead_letter=request.dead_letter,
                delivery_count=request.delivery_count,
            )
        )
        REPORTS.labels(request.status, "applied" if outcome.applied else "ignored").inc()
        return pb.ReportTaskResultResponse(
            acknowledged=True, applied=outcome.applied, ignored_reason=outcome.ignored_reason
        )

    # -- client-facing -------------------------------------------------------

    @_rpc
    async def RegisterWorkflow(
        self, request: pb.RegisterWorkflowRequest, context: Context
    ) -> pb.RegisterWorkflowResponse:
        if not request.definition:
            raise InvalidRequest("definition", "is required (a JSON workflow definition)")
        document = _json(request.definition, "definition", empty=None)
        name, version, created = await self._workflows.register(document)
        return pb.RegisterWorkflowResponse(name=name, version=version, created=created)

    @_rpc
    async def StartRun(self, request: pb.StartRunRequest, context: Context) -> pb.StartRunResponse:
        workflow = _required(request.workflow, "workflow")
        if request.version < 0:
            raise InvalidRequest("version", "must not be negative (0 means the latest)")
        if len(request.input) > _MAX_INPUT_BYTES:
            raise InvalidRequest("input", f"is larger than {_MAX_INPUT_BYTES} bytes")
        run_input = _json(request.input, "input", empty={})
        key = request.idempotency_key or None
        if key is not None and len(key) > _MAX_ID_CHARS:
            raise InvalidRequest("idempotency_key", f"is longer than {_MAX_ID_CHARS} characters")
        result = await self._engine.start_run(workflow, request.version, run_input, key)
        return pb.StartRunResponse(run_id=str(result.run_id), created=result.created, version=result.version)

    @_rpc
    async def GetRun(self, request: pb.GetRunRequest, context: Context) -> pb.GetRunResponse:
        snapshot = await self._engine.snapshot(_uuid(request.run_id, "run_id"))
        ignored = [
            pb.IgnoredReport(
                task_id=str(r["task_id"]),
                attempt=r["attempt"],
                owner=r["owner"],
                status=r["status"],
                reason=r["reason"],
                at=_ts(r["created_at"]),
            )
            for r in snapshot.ignored
        ]
        return pb.GetRunResponse(run=_run_message(snapshot), ignored_reports=ignored)

    async def WatchRun(self, request: pb.WatchRunRequest, context: Context) -> AsyncIterator[pb.RunEvent]:
        """Streams task changes until the run ends; wakes on local changes, polls for remote ones."""
        try:
            run_id = _uuid(request.run_id, "run_id")
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        seen: dict[str, tuple[str, int]] = {}
        with self._hub.subscribe(run_id) as changed:
            while True:
                changed.clear()
                try:
                    snapshot = await self._engine.snapshot(run_id)
                except NotFound as exc:
                    await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
                    return
                except _UNAVAILABLE as exc:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, f"{type(exc).__name__}: {exc}")
                    return
                run_state = _RUN_STATES[snapshot.run["state"]]
                for task in snapshot.tasks:
                    key = (task["state"], task["attempt"])
                    if seen.get(task["node_id"]) != key:
                        seen[task["node_id"]] = key
                        yield pb.RunEvent(run_id=str(run_id), run_state=run_state, task=_task_message(task))
                if snapshot.run["state"] in _TERMINAL_RUN:
                    yield pb.RunEvent(run_id=str(run_id), run_state=run_state, run=_run_message(snapshot))
                    return
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_WATCH_POLL_S):
                        await changed.wait()

    @_rpc
    async def CancelRun(self, request: pb.CancelRunRequest, context: Context) -> pb.CancelRunResponse:
        run_id = _uuid(request.run_id, "run_id")
        cancelled, state = await self._engine.cancel(run_id, request.reason[:1000] or "cancelled by request")
        return pb.CancelRunResponse(cancelled=cancelled, state=_RUN_STATES[state])

    @_rpc
    async def ListDeadLetters(self, request: pb.ListDeadLettersRequest, context: Context) -> pb.ListDeadLettersResponse:
        limit = request.limit or 100
        if not 1 <= limit <= 10_000:
            raise InvalidRequest("limit", "must be between 1 and 10000")
        run_id = _uuid(request.run_id, "run_id") if request.run_id else None
        rows = await self._engine.dead_letters(run_id, limit)
        return pb.ListDeadLettersResponse(
            dead_letters=[
                pb.DeadLetter(
                    run_id=str(r["run_id"]),
                    task_id=str(r["task_id"]),
                    node_id=r["node_id"],
                    attempt=r["attempt"],
                    delivery_count=r["delivery_count"],
                    reported_by=r["reported_by"],
                    reason=r["reason"],
                    at=_ts(r["created_at"]),
                )
                for r in rows
            ]
        )
