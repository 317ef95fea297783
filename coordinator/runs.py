"""Applies run events in PostgreSQL: start, report, release, cancel, redispatch.

Every event that changes routing runs in one transaction under the run's row
lock (`SELECT ... FOR UPDATE` on `runs`), decides with the pure planner in
`state_machine.py`, and writes the outbox rows it implies in the same
transaction; nothing is sent to Redis here. Writes to a task are conditional
(fenced by state, attempt and lease owner in the WHERE clause) because leases
change outside the run lock.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from coordinator.db import Connection
from coordinator.definitions import Node, Workflow
from coordinator.errors import NotFound
from coordinator.state_machine import Plan, TaskView, plan_advance, plan_failure, plan_run_failure
from coordinator.workflows import WorkflowRegistry
from protos.taskstream import TaskMessage, shard_for, stream_name

__all__ = ["ReleaseResult", "Report", "ReportOutcome", "RunEngine", "RunSnapshot", "StartResult", "uuid7"]

log = logging.getLogger(__name__)

_LOCK_RUN = """
SELECT workflow, version, state, input FROM runs WHERE id = $1 FOR UPDATE
"""
_RUN_WORKFLOW = """
SELECT workflow, version FROM runs WHERE id = $1
"""
_TASKS = """
SELECT id, node_id, state, attempt, lease_owner, output,
       coalesce(lease_expires_at >= now(), false) AS lease_live
  FROM task_instances WHERE run_id = $1
"""
_INSERT_RUN = """
INSERT INTO runs (id, workflow, version, state, input, idempotency_key)
VALUES ($1, $2, $3, 'RUNNING', $4::jsonb, $5)
ON CONFLICT (workflow, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id
"""
_RUN_BY_KEY = """
SELECT id, version FROM runs WHERE workflow = $1 AND idempotency_key = $2
"""
# A new run's tasks are inserted in the state the planner decided for them
# (roots QUEUED with their input, SWITCHes evaluated, the rest PENDING), so
# starting a run writes each row once.
_INSERT_TASKS = """
INSERT INTO task_instances (run_id, id, node_id, node_type, queue, state, attempt, max_attempts, input, output, error,
                            next_attempt_at, started_at, finished_at)
SELECT $1, t.id, t.node_id, t.node_type, t.queue, t.state, t.attempt, t.max_attempts, t.input::jsonb, t.output::jsonb,
       t.error,
       CASE WHEN t.state = 'QUEUED' THEN now() END,
       CASE WHEN t.state = 'COMPLETED' THEN now() END,
       CASE WHEN t.state IN ('COMPLETED', 'FAILED', 'SKIPPED') THEN now() END
  FROM unnest($2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int[], $8::int[], $9::text[], $10::text[],
              $11::text[])
       AS t(id, node_id, node_type, queue, state, attempt, max_attempts, input, output, error)
"""
_QUEUE_TASKS = """
UPDATE task_instances t
   SET state = 'QUEUED', attempt = 1, input = x.input::jsonb, next_attempt_at = now(), updated_at = now()
  FROM unnest($2::text[], $3::text[]) AS x(node_id, input)
 WHERE t.run_id = $1 AND t.node_id = x.node_id AND t.state = 'PENDING'
"""
_SKIP_TASKS = """
UPDATE task_instances
   SET state = 'SKIPPED', lease_expires_at = NULL, finished_at = now(), updated_at = now()
 WHERE run_id = $1 AND node_id = ANY($2::text[]) AND state NOT IN ('COMPLETED', 'FAILED', 'SKIPPED')
"""
_COMPLETE_SWITCH = """
UPDATE task_instances
   SET state = 'COMPLETED', attempt = 1, output = $3::jsonb, started_at = now(), finished_at = now(), updated_at = now()
 WHERE run_id = $1 AND node_id = $2 AND state = 'PENDING'
"""
_FAIL_PENDING = """
UPDATE task_instances
   SET state = 'FAILED', error = $3, finished_at = now(), updated_at = now()
 WHERE run_id = $1 AND node_id = $2 AND state = 'PENDING'
"""
_FINISH_RUN = """
UPDATE runs SET state = $2, output = $3::jsonb, error = $4, finished_at = now(), updated_at = now() WHERE id = $1
"""
_TOUCH_RUN = """
UPDATE runs SET updated_at = now() WHERE id = $1
"""
# A report changes state only for the task's current attempt, and only from the
# worker that holds (or held, with nobody taking over since) its lease. A
# dead-letter report comes from a reclaiming worker instead: it is accepted as
# long as nobody holds a live lease.
_FENCE = """
   AND attempt = $3
   AND CASE WHEN $5::bool
            THEN state IN ('PENDING', 'QUEUED', 'RUNNING')
                 AND (state <> 'RUNNING' OR lease_expires_at < now() OR lease_owner = $4)
            ELSE state = 'RUNNING' AND lease_owner = $4
       END
"""
_REPORT_COMPLETED = f"""
UPDATE task_instances
   SET state = 'COMPLETED', output = $6::text::jsonb, error = NULL, lease_expires_at = NULL,
       finished_at = now(), updated_at = now()
 WHERE run_id = $1 AND id = $2 {_FENCE}
RETURNING id
"""
_REPORT_FAILED = f"""
UPDATE task_instances
   SET state = 'FAILED', error = $6, lease_expires_at = NULL, finished_at = now(), updated_at = now()
 WHERE run_id = $1 AND id = $2 {_FENCE}
RETURNING id
"""
_REPORT_RETRY = f"""
UPDATE task_instances
   SET state = 'QUEUED', attempt = attempt + 1, error = $6, lease_owner = NULL, lease_expires_at = NULL,
       next_attempt_at = now() + make_interval(secs => $7), dispatch_stream = NULL, dispatch_id = NULL,
       dispatched_at = NULL, updated_at = now()
 WHERE run_id = $1 AND id = $2 {_FENCE}
RETURNING input::text
"""
_RECORD_IGNORED = """
INSERT INTO ignored_reports (run_id, task_id, attempt, owner, status, reason) VALUES ($1, $2, $3, $4, $5, $6)
"""
_RECORD_DEAD_LETTER = """
INSERT INTO dead_letters (run_id, task_id, node_id, attempt, delivery_count, reported_by, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7)
"""
_RELEASE = """
UPDATE task_instances
   SET state = 'QUEUED', lease_owner = NULL, lease_expires_at = NULL, dispatch_stream = NULL,
       dispatch_id = NULL, dispatched_at = NULL, updated_at = now()
 WHERE run_id = $1 AND id = $2 AND state = 'RUNNING' AND lease_owner = $3 AND attempt = $4
RETURNING node_id, input::text
"""
_REDISPATCH = """
UPDATE task_instances
   SET updated_at = now(), swept_at = now()
 WHERE run_id = $1 AND id = $2 AND attempt = $3
   AND (state = 'QUEUED' OR (state = 'RUNNING' AND lease_expires_at < now()))
RETURNING node_id, input::text
"""
# The outbox insert wakes every relay (in this and other replicas) through
# NOTIFY; notifications are delivered at commit, and duplicates within one
# transaction are folded into one.
_INSERT_OUTBOX = """
WITH inserted AS (
    INSERT INTO outbox (stream, payload, run_id, task_id, attempt, available_at)
    SELECT o.stream, o.payload, o.run_id, o.task_id, o.attempt, now() + make_interval(secs => o.delay)
      FROM unnest($1::text[], $2::text[], $3::uuid[], $4::uuid[], $5::int[], $6::float8[])
           AS o(stream, payload, run_id, task_id, attempt, delay)
    RETURNING 1
)
SELECT pg_notify('wf_outbox', '') FROM (SELECT count(*) FROM inserted) AS c
"""
_GET_RUN = """
SELECT id, workflow, version, state, input::text, output::text, error, created_at, updated_at FROM runs WHERE id = $1
"""
_GET_TASKS = """
SELECT id, node_id, node_type, queue, state, attempt, max_attempts, input::text, output::text, error, lease_owner,
       lease_expires_at, next_attempt_at, started_at, finished_at, updated_at
  FROM task_instances WHERE run_id = $1
"""
_DEAD_LETTERS = """
SELECT run_id, task_id, node_id, attempt, delivery_count, reported_by, reason, created_at
  FROM dead_letters WHERE ($1::uuid IS NULL OR run_id = $1) ORDER BY id DESC LIMIT $2
"""
_GET_IGNORED = """
SELECT task_id, attempt, owner, status, reason, created_at FROM ignored_reports WHERE run_id = $1 ORDER BY id
"""


def uuid7() -> uuid.UUID:
    """A time-ordered UUID (RFC 9562 version 7): new rows land at the right edge of indexes."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | (rand >> 68) << 64 | 0b10 << 62 | (rand & ((1 << 62) - 1))
    return uuid.UUID(int=value)


@dataclass(frozen=True, slots=True)
class StartResult:
    run_id: uuid.UUID
    version: int
    created: bool


@dataclass(frozen=True, slots=True)
class Report:
    """One worker report, already validated by the gRPC layer."""

    run_id: uuid.UUID
    task_id: uuid.UUID
    attempt: int
    owner: str
    completed: bool
    output_json: str | None  # completed only, valid JSON text
    error: str
    dead_letter: bool = False
    delivery_count: int = 0


@dataclass(frozen=True, slots=True)
class ReportOutcome:
    applied: bool
    ignored_reason: str = ""


@dataclass(frozen=True, slots=True)
class ReleaseResult:
    released: bool


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    run: asyncpg.Record
    tasks: list[asyncpg.Record]
    ignored: list[asyncpg.Record]


@dataclass(frozen=True, slots=True)
class _Dispatch:
    stream: str
    payload: str
    run_id: uuid.UUID
    task_id: uuid.UUID
    attempt: int
    delay_s: float


class RunEngine:
    """Runs' events, each one transaction.

    Args:
        pool: the coordinator's PostgreSQL pool.
        workflows: the registry, for definitions.
        shards: streams per queue (decides each dispatch's stream).
        max_output_bytes: a reported output above this fails the task.
        on_change: called with a run id after a transaction that changed the
            run commits (wakes watchers and the local relay).
    """

    def __init__(
        self,
        *,
        pool: asyncpg.Pool,
        workflows: WorkflowRegistry,
        shards: int,
        max_output_bytes: int,
        on_change: Callable[[uuid.UUID], None] = lambda _: None,
    ) -> None:
        self._pool = pool
        self._workflows = workflows
        self._shards = shards
        self._max_output_bytes = max_output_bytes
        self._on_change = on_change

    # -- events --------------------------------------------------------------

    async def start_run(
        self, workflow_name: str, version: int, run_input: Any, idempotency_key: str | None
    ) -> StartResult:
        """Creates a run, its task rows, and dispatches the nodes that can start.

        With an idempotency key, a second start with the same key returns the
        first run (created=False) and changes nothing.

        Raises:
            NotFound: the workflow or version does not exist.
        """
        if version == 0:
            version = await self._workflows.latest_version(workflow_name)
        workflow = await self._workflows.get(workflow_name, version)
        run_id = uuid7()
        task_ids = {node.id: uuid7() for node in workflow.nodes}
        async with self._pool.acquire() as conn, conn.transaction():
            inserted = await conn.fetchval(_INSERT_RUN, run_id, workflow_name, version, run_input, idempotency_key)
            if inserted is None:
                existing = await conn.fetchrow(_RUN_BY_KEY, workflow_name, idempotency_key)
                assert existing is not None, "the conflicting run exists"
                return StartResult(run_id=existing["id"], version=existing["version"], created=False)
            nodes = workflow.nodes
            tasks = {n.id: TaskView(id=str(task_ids[n.id]), node_id=n.id, state="PENDING", attempt=0) for n in nodes}
            plan = plan_advance(workflow, run_input, tasks)
            await conn.execute(
                _INSERT_TASKS,
                run_id,
                [task_ids[n.id] for n in nodes],
                [n.id for n in nodes],
                [n.type for n in nodes],
                [n.queue for n in nodes],
                [tasks[n.id].state for n in nodes],
                [tasks[n.id].attempt for n in nodes],
                [n.retry.max_attempts if n.is_task else 1 for n in nodes],
                [json.dumps(plan.queue[n.id]) if n.id in plan.queue else None for n in nodes],
                [json.dumps(plan.complete[n.id]) if n.id in plan.complete else None for n in nodes],
                [plan.fail.get(n.id) for n in nodes],
            )
            await self._insert_outbox(
                conn,
                [
                    self._dispatch(workflow, workflow.by_id[n], run_id, task_ids[n], 1, task_input, 0.0)
                    for n, task_input in plan.queue.items()
                ],
            )
            if plan.run_state is not None:
                output = plan.run_output if plan.run_state == "COMPLETED" else None
                await conn.execute(_FINISH_RUN, run_id, plan.run_state, output, plan.run_error)
        self._on_change(run_id)
        return StartResult(run_id=run_id, version=version, created=True)

    async def report(self, report: Report) -> ReportOutcome:
        """Applies a worker's report, or records why it was ignored.

        Idempotent: a duplicate report is ignored (and recorded). Either way
        the report is durable when this returns, so the worker may ack.
        """
        if report.completed and report.output_json is not None and len(report.output_json) > self._max_output_bytes:
            report = Report(
                run_id=report.run_id,
                task_id=report.task_id,
                attempt=report.attempt,
                owner=report.owner,
                completed=False,
                output_json=None,
                dead_letter=report.dead_letter,
                delivery_count=report.delivery_count,
                error=f"output is {len(report.output_json)} bytes, over the limit of {self._max_output_bytes} (MAX_OUTPUT_BYTES)",
            )
        async with self._pool.acquire() as conn, conn.transaction():
            run = await conn.fetchrow(_LOCK_RUN, report.run_id)
            if run is None:
                return await self._ignore(conn, report, "unknown run")
            # A statement of its own, started after the lock is held: under READ
            # COMMITTED it sees every report committed before ours. (Reading the
            # tasks in the locking statement would use a snapshot taken before
            # the wait, and a fan-in completed by two concurrent reports would
            # never queue its join.)
            rows = await conn.fetch(_TASKS, report.run_id)
            row = next((r for r in rows if r["id"] == report.task_id), None)
            if row is None:
                return await self._ignore(conn, report, "unknown task")
            reason = _fence_refusal(row, report)
            if reason:
                return await self._ignore(conn, report, reason)
            workflow = await self._workflows.get(run["workflow"], run["version"], conn)
            node = workflow.by_id[row["node_id"]]
            tasks = _views(rows)
            args = (report.run_id, report.task_id, report.attempt, report.owner, report.dead_letter)
            if report.completed:
                output_text = report.output_json if report.output_json else "null"
                if await conn.fetchval(_REPORT_COMPLETED, *args, output_text) is None:
                    return await self._ignore(conn, report, "lease changed hands while reporting")
                tasks[node.id].state, tasks[node.id].output = "COMPLETED", json.loads(output_text)
                plan = plan_advance(workflow, run["input"], tasks)
            else:
                decision = plan_failure(node, report.attempt)
                if decision.retry:
                    input_text = await conn.fetchval(_REPORT_RETRY, *args, report.error, decision.delay_s)
                    if input_text is None:
                        return await self._ignore(conn, report, "lease changed hands while reporting")
                    dispatch = self._dispatch(
                        workflow,
                        node,
                        report.run_id,
                        report.task_id,
                        report.attempt + 1,
                        json.loads(input_text),
                        decision.delay_s,
                    )
                    await self._insert_outbox(conn, [dispatch])
                    plan = Plan()
                else:
                    if await conn.fetchval(_REPORT_FAILED, *args, report.error) is None:
                        return await self._ignore(conn, report, "lease changed hands while reporting")
                    tasks[node.id].state = "FAILED"
                    attempts = f"{report.attempt} attempt{'s' if report.attempt != 1 else ''}"
                    plan = plan_run_failure(tasks, f"node {node.id!r} failed after {attempts}: {report.error}")
            if report.dead_letter:
                await conn.execute(
                    _RECORD_DEAD_LETTER,
                    report.run_id,
                    report.task_id,
                    node.id,
                    report.attempt,
                    report.delivery_count,
                    report.owner,
                    report.error,
                )
            await self._apply(conn, report.run_id, workflow, tasks, plan)
        self._on_change(report.run_id)
        return ReportOutcome(applied=True)

    async def release(self, run_id: uuid.UUID, task_id: uuid.UUID, owner: str, attempt: int, reason: str) -> bool:
        """Hands a leased task back: QUEUED again, same attempt, dispatched now.

        Returns False (and changes nothing) unless `owner` holds the lease on
        that attempt.
        """
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(_RELEASE, run_id, task_id, owner, attempt)
            if row is None:
                return False
            run = await conn.fetchrow(_RUN_WORKFLOW, run_id)
            assert run is not None, "a task row implies its run row"
            workflow = await self._workflows.get(run["workflow"], run["version"], conn)
            node = workflow.by_id[row["node_id"]]
            dispatch = self._dispatch(workflow, node, run_id, task_id, attempt, json.loads(row["input"]), 0.0)
            await self._insert_outbox(conn, [dispatch])
        log.info(
            "task released by its worker",
            extra={"run_id": str(run_id), "task_id": str(task_id), "owner": owner, "reason": reason},
        )
        self._on_change(run_id)
        return True

    async def cancel(self, run_id: uuid.UUID, reason: str) -> tuple[bool, str]:
        """Ends a running run: unfinished tasks are SKIPPED, the run CANCELLED.

        Returns (cancelled, the run's state afterwards).

        Raises:
            NotFound: no such run.
        """
        async with self._pool.acquire() as conn, conn.transaction():
            run = await conn.fetchrow(_LOCK_RUN, run_id)
            if run is None:
                raise NotFound(f"run {run_id} does not exist")
            if run["state"] != "RUNNING":
                return False, str(run["state"])
            tasks = _views(await conn.fetch(_TASKS, run_id))
            plan = plan_run_failure(tasks, reason or "cancelled")
            plan.run_state = "CANCELLED"
            workflow = await self._workflows.get(run["workflow"], run["version"], conn)
            await self._apply(conn, run_id, workflow, tasks, plan)
        self._on_change(run_id)
        return True, "CANCELLED"

    async def redispatch(
        self, run_id: uuid.UUID, task_id: uuid.UUID, attempt: int, workflow_name: str, version: int
    ) -> bool:
        """Publishes a stalled task's current attempt again (the sweeper's remedy).

        A no-op (False) when the task made progress since it was found stalled.
        """
        workflow = await self._workflows.get(workflow_name, version)
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(_REDISPATCH, run_id, task_id, attempt)
            if row is None:
                return False
            node = workflow.by_id[row["node_id"]]
            dispatch = self._dispatch(workflow, node, run_id, task_id, attempt, json.loads(row["input"]), 0.0)
            await self._insert_outbox(conn, [dispatch])
        self._on_change(run_id)
        return True

    async def snapshot(self, run_id: uuid.UUID) -> RunSnapshot:
        """The run, its tasks (in the workflow's node order) and ignored reports.

        Raises:
            NotFound: no such run.
        """
        async with self._pool.acquire() as conn:
            run = await conn.fetchrow(_GET_RUN, run_id)
            if run is None:
                raise NotFound(f"run {run_id} does not exist")
            tasks = await conn.fetch(_GET_TASKS, run_id)
            ignored = await conn.fetch(_GET_IGNORED, run_id)
        workflow = await self._workflows.get(run["workflow"], run["version"])
        order = {n.id: i for i, n in enumerate(workflow.nodes)}
        return RunSnapshot(
            run=run, tasks=sorted(tasks, key=lambda t: order.get(t["node_id"], 0)), ignored=list(ignored)
        )

    async def dead_letters(self, run_id: uuid.UUID | None, limit: int) -> list[asyncpg.Record]:
        """Dead-lettered tasks, newest first, optionally of one run."""
        return list(await self._pool.fetch(_DEAD_LETTERS, run_id, limit))

    # -- helpers -------------------------------------------------------------

    async def _ignore(self, conn: Connection, report: Report, reason: str) -> ReportOutcome:
        status = "completed" if report.completed else "failed"
        await conn.execute(_RECORD_IGNORED, report.run_id, report.task_id, report.attempt, report.owner, status, reason)
        log.info(
            "report ignored: %s",
            reason,
            extra={
                "run_id": str(report.run_id),
                "task_id": str(report.task_id),
                "attempt": report.attempt,
                "owner": report.owner,
            },
        )
        return ReportOutcome(applied=False, ignored_reason=reason)

    def _dispatch(
        self,
        workflow: Workflow,
        node: Node,
        run_id: uuid.UUID,
        task_id: uuid.UUID,
        attempt: int,
        task_input: Any,
        delay_s: float,
    ) -> _Dispatch:
        assert node.kind is not None, "only task nodes are dispatched"
        assert node.queue is not None, "only task nodes are dispatched"
        payload = (
            task_input if node.kind == "http" else {"code": node.code, "filename": node.filename(), "input": task_input}
        )
        message = TaskMessage(
            task_id=str(task_id),
            run_id=str(run_id),
            node_id=node.id,
            node_type=node.kind,
            workflow_id=workflow.name,
            workflow_version=workflow.version,
            attempt=attempt,
            timeout_seconds=node.timeout_s,
            input=payload,
        )
        stream = stream_name(node.queue, shard_for(str(run_id), self._shards))
        return _Dispatch(
            stream=stream, payload=message.encode(), run_id=run_id, task_id=task_id, attempt=attempt, delay_s=delay_s
        )

    async def _insert_outbox(self, conn: Connection, dispatches: Sequence[_Dispatch]) -> None:
        if not dispatches:
            return
        await conn.execute(
            _INSERT_OUTBOX,
            [d.stream for d in dispatches],
            [d.payload for d in dispatches],
            [d.run_id for d in dispatches],
            [d.task_id for d in dispatches],
            [d.attempt for d in dispatches],
            [d.delay_s for d in dispatches],
        )

    async def _apply(
        self, conn: Connection, run_id: uuid.UUID, workflow: Workflow, tasks: dict[str, TaskView], plan: Plan
    ) -> None:
        for node_id, output in plan.complete.items():
            await conn.execute(_COMPLETE_SWITCH, run_id, node_id, output)
        for node_id, error in plan.fail.items():
            await conn.execute(_FAIL_PENDING, run_id, node_id, error)
        if plan.queue:
            node_ids = list(plan.queue)
            await conn.execute(_QUEUE_TASKS, run_id, node_ids, [json.dumps(plan.queue[n]) for n in node_ids])
            await self._insert_outbox(
                conn,
                [
                    self._dispatch(workflow, workflow.by_id[n], run_id, uuid.UUID(tasks[n].id), 1, plan.queue[n], 0.0)
                    for n in node_ids
                ],
            )
        if plan.skip:
            await conn.execute(_SKIP_TASKS, run_id, plan.skip)
        if plan.run_state is not None:
            output = plan.run_output if plan.run_state == "COMPLETED" else None
            await conn.execute(_FINISH_RUN, run_id, plan.run_state, output, plan.run_error)
        elif plan.queue or plan.complete:
            await conn.execute(_TOUCH_RUN, run_id)


def _views(rows: list[asyncpg.Record]) -> dict[str, TaskView]:
    return {
        r["node_id"]: TaskView(
            id=str(r["id"]), node_id=r["node_id"], state=r["state"], attempt=r["attempt"], output=r["output"]
        )
        for r in rows
    }


def _fence_refusal(row: asyncpg.Record, report: Report) -> str:
    """Why a report may not change the task, or "" when it may."""
    state, attempt, owner = row["state"], row["attempt"], row["lease_owner"]
    if state in ("COMPLETED", "FAILED", "SKIPPED"):
        return f"task is already {state}"
    if attempt != report.attempt:
        return f"stale attempt {report.attempt} (the task is on attempt {attempt})"
    if report.dead_letter:
        if state == "RUNNING" and row["lease_live"] and owner != report.owner:
            return f"dead-letter report while {owner} holds a live lease"
        return ""
    if state != "RUNNING":
        return f"task is {state}, not running"
    if owner != report.owner:
        return f"lease is held by {owner}, not {report.owner}"
    return ""
