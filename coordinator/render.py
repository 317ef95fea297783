"""Human-readable (and JSON) renderings of runs, tasks and dead letters for the operator CLI."""

from __future__ import annotations

import datetime
import json
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from protos import workflow_pb2 as pb

__all__ = [
    "dead_letter_dict",
    "dead_letters_table",
    "event_line",
    "run_dict",
    "run_report",
    "run_state",
    "task_state",
]

_MAX_CELL = 60


def run_state(value: int) -> str:
    return str(pb.RunState.Name(value)).removeprefix("RUN_STATE_")


def task_state(value: int) -> str:
    return str(pb.TaskState.Name(value)).removeprefix("TASK_STATE_")


def _when(ts: Timestamp, *, time_only: bool = False) -> str:
    if not ts.seconds and not ts.nanos:
        return "-"
    moment = ts.ToDatetime(tzinfo=datetime.UTC)
    return moment.strftime("%H:%M:%S") if time_only else moment.isoformat(timespec="seconds")


def _json_value(data: bytes) -> Any:
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return data.decode(errors="replace")


def _compact(value: Any, limit: int = _MAX_CELL) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return lines


def event_line(task: pb.TaskInstance) -> str:
    """One line of `run --wait` progress: time, node, state, attempt, and why when it failed."""
    state = task_state(task.state)
    attempt = f"attempt {task.attempt}/{task.max_attempts}" if task.attempt else ""
    line = f"{_when(task.updated_at, time_only=True)}  {task.node_id:<20} {state:<10} {attempt}".rstrip()
    if task.error and state == "FAILED":
        line += f"  error: {_compact(task.error, 200)}"
    elif task.error and state == "QUEUED" and task.attempt > 1:
        line += f"  (retry after: {_compact(task.error, 200)})"
    elif state == "RUNNING" and task.lease_owner:
        line += f"  on {task.lease_owner}"
    return line


def run_report(run: pb.Run, ignored: list[pb.IgnoredReport] | None = None) -> str:
    """The `show` view: the run, its tasks (attempts, errors), and ignored reports."""
    lines = [
        f"run {run.id}",
        f"  workflow  {run.workflow} v{run.version}",
        f"  state     {run_state(run.state)}",
        f"  created   {_when(run.created_at)}",
        f"  updated   {_when(run.updated_at)}",
        f"  input     {_compact(_json_value(run.input), 200)}",
    ]
    if run.output:
        lines.append(f"  output    {_compact(_json_value(run.output), 200)}")
    if run.error:
        lines.append(f"  error     {run.error}")
    rows = [
        [
            t.node_id,
            t.node_type,
            task_state(t.state),
            f"{t.attempt}/{t.max_attempts}",
            t.queue or "-",
            t.lease_owner or "-",
            _when(t.finished_at, time_only=True),
            _compact(t.error) if t.error else "",
        ]
        for t in run.tasks
    ]
    lines += ["", "tasks:"]
    lines += [
        "  " + line for line in _table(["NODE", "TYPE", "STATE", "ATTEMPT", "QUEUE", "WORKER", "DONE", "ERROR"], rows)
    ]
    if ignored:
        nodes = {t.id: t.node_id for t in run.tasks}
        lines += ["", "ignored reports (acknowledged, did not change state):"]
        rows = [
            [_when(r.at, time_only=True), nodes.get(r.task_id, r.task_id), str(r.attempt), r.owner, r.status, r.reason]
            for r in ignored
        ]
        lines += ["  " + line for line in _table(["AT", "NODE", "ATTEMPT", "FROM", "STATUS", "REASON"], rows)]
    return "\n".join(lines)


def _ts_json(ts: Timestamp) -> str | None:
    return _when(ts) if ts.seconds or ts.nanos else None


def run_dict(run: pb.Run, ignored: list[pb.IgnoredReport] | None = None) -> dict[str, Any]:
    """The run as plain JSON (inputs and outputs decoded), for `--json`."""
    return {
        "id": run.id,
        "workflow": run.workflow,
        "version": run.version,
        "state": run_state(run.state),
        "input": _json_value(run.input),
        "output": _json_value(run.output),
        "error": run.error or None,
        "created_at": _ts_json(run.created_at),
        "updated_at": _ts_json(run.updated_at),
        "tasks": [
            {
                "id": t.id,
                "node_id": t.node_id,
                "node_type": t.node_type,
                "queue": t.queue or None,
                "state": task_state(t.state),
                "attempt": t.attempt,
                "max_attempts": t.max_attempts,
                "input": _json_value(t.input),
                "output": _json_value(t.output),
                "error": t.error or None,
                "lease_owner": t.lease_owner or None,
                "started_at": _ts_json(t.started_at),
                "finished_at": _ts_json(t.finished_at),
            }
            for t in run.tasks
        ],
        "ignored_reports": [
            {
                "task_id": r.task_id,
                "attempt": r.attempt,
                "owner": r.owner,
                "status": r.status,
                "reason": r.reason,
                "at": _ts_json(r.at),
            }
            for r in ignored or []
        ],
    }


def dead_letter_dict(d: pb.DeadLetter) -> dict[str, Any]:
    return {
        "run_id": d.run_id,
        "task_id": d.task_id,
        "node_id": d.node_id,
        "attempt": d.attempt,
        "delivery_count": d.delivery_count,
        "reported_by": d.reported_by,
        "reason": d.reason,
        "at": _ts_json(d.at),
    }


def dead_letters_table(items: list[pb.DeadLetter]) -> str:
    if not items:
        return "no dead-lettered tasks"
    rows = [
        [_when(d.at), d.run_id, d.node_id, str(d.attempt), str(d.delivery_count), d.reported_by, _compact(d.reason)]
        for d in items
    ]
    return "\n".join(_table(["AT", "RUN", "NODE", "ATTEMPT", "DELIVERIES", "REPORTED BY", "REASON"], rows))
