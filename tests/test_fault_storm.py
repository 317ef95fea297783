"""Proof under fire: the whole stack keeps its promises while its processes are killed.

At least 500 runs (HTTP, Python and JS steps, fan-out/fan-in, a SWITCH, a step
that fails once per task, and one poison task that SIGKILLs every worker that
runs it) go through a real coordinator and three real worker nodes, while a
logged schedule SIGKILLs workers mid-task, SIGKILLs and restarts the
coordinator, SIGKILLs and restarts Redis (from its AOF), flushes Redis once,
and SIGKILLs language servers. Afterwards the suite checks, and prints:

* every run ended (none stuck) and no task was lost;
* the poison task was dead-lettered, with its reason, and failed its run;
* no two executions of one task overlapped in time (from the HTTP sink's
  records, keyed by the task id the worker sends as `Idempotency-Key`);
* every side effect belongs to a known task, and every completed HTTP task
  has one;
* for every fault, the worst time to the next progress of the tasks it hit,
  against the bound of the design's failure table.

`pytest --soak` runs a longer storm (3,000 runs, the fault schedule three times).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from protos import workflow_pb2 as pb
from tests.coordinator_harness import CoordinatorHandle
from tests.faultstorm.sink import Record, Sink, running_sink
from tests.faultstorm.storm import MAX_DELIVERIES, Stage, client, start_run
from tests.faultstorm.workload import HTTP_NODES, POISON, STORM, storm_input

pytestmark = pytest.mark.timeout(1800)

#: Tolerance on top of each bound: two shared cores run the whole system here.
SLACK_S = 3.0
ROUND_S = 34.0


async def _submit(handle: CoordinatorHandle, sink: Sink, runs: int, duration_s: float, stage: Stage) -> list[str]:
    """Starts `runs` storm runs in bursts, one burst a second over `duration_s`, so faults find a backlog."""
    bursts = max(1, int(duration_s))
    run_ids: list[str] = []
    started = time.monotonic()
    for burst in range(bursts):
        if (wait := started + burst - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        numbers = range(burst * runs // bursts, (burst + 1) * runs // bursts)
        run_ids += await asyncio.gather(
            *(start_run(handle, "storm", storm_input(sink.url, n), f"storm-{n}") for n in numbers)
        )
    stage.note(f"submitted {runs} runs")
    return run_ids


async def _faults(stage: Stage, handle: CoordinatorHandle, sink: Sink, rounds: int) -> None:
    """The logged fault schedule; one round takes ROUND_S seconds."""
    n1, n2, n3 = stage.nodes
    # Bursts of runs start on whole seconds; faults land 0.3 s into a burst.
    schedule: list[tuple[float, Any]] = [
        (3.3, lambda: stage.kill_worker(n1)),
        (7.3, lambda: stage.kill_coordinator(down_s=1.0)),
        (13.3, stage.restart_redis),
        (17.3, lambda: stage.kill_worker(n2)),
        (21.3, lambda: stage.kill_langserver(n3, "langserver_python")),
        (25.3, stage.flush_redis),
        (28.3, lambda: stage.kill_langserver(n1, "langserver_js")),
        (31.3, lambda: stage.kill_worker(n3)),
    ]
    origin = time.monotonic()
    await asyncio.sleep(1)
    await start_run(handle, "poison", {"sink": sink.url}, "poison-1")
    stage.note("started the poison run (its step SIGKILLs whichever worker runs it)")
    for round_index in range(rounds):
        for offset, fault in schedule:
            due = origin + round_index * ROUND_S + offset
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            await fault()


async def _wait_terminal(stage: Stage, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        running = await stage.db.fetchval("SELECT count(*) FROM runs WHERE state = 'RUNNING'")
        if running == 0:
            stage.note("every run has ended")
            return
        if time.monotonic() > deadline:
            stuck = await stage.db.fetch(
                """SELECT r.workflow, t.node_id, t.state, t.attempt, t.lease_owner, t.error
                     FROM runs r JOIN task_instances t ON t.run_id = r.id
                    WHERE r.state = 'RUNNING' AND t.state NOT IN ('COMPLETED', 'SKIPPED', 'FAILED') LIMIT 20"""
            )
            raise AssertionError(f"{running} run(s) still RUNNING after {timeout_s}s; e.g. {[dict(r) for r in stuck]}")
        await asyncio.sleep(0.5)


def _overlaps(records: list[Record]) -> list[str]:
    """Pairs of requests for one task whose lifetimes overlapped."""
    by_key: defaultdict[str, list[Record]] = defaultdict(list)
    for record in records:
        by_key[record.key].append(record)
    found = []
    for key, executions in by_key.items():
        executions.sort(key=lambda r: r.started)
        for earlier, later in itertools.pairwise(executions):
            if earlier.ended is None or later.started < earlier.ended:
                found.append(
                    f"{key}: {earlier.path} {earlier.started:.3f}-{earlier.ended} overlaps {later.started:.3f}"
                )
    return found


def _report(stage: Stage, rows: dict[str, Any]) -> str:
    lines = ["", "Fault storm: what each fault hit and how long until those tasks moved again", ""]
    lines.append(
        f"| {'t (s)':>6} | {'fault':<26} | {'detail':<44} | {'tasks hit':>9} | {'worst (s)':>9} | {'bound (s)':>9} |"
    )
    lines.append(f"|{'-' * 8}|{'-' * 28}|{'-' * 46}|{'-' * 11}|{'-' * 11}|{'-' * 11}|")
    for fault in stage.faults:
        worst = fault.worst_s()
        shown = "-" if worst is None else ("never" if worst == float("inf") else f"{worst:.2f}")
        lines.append(
            f"| {fault.at - stage.started:6.1f} | {fault.kind:<26} | {fault.detail[:44]:<44} | {len(fault.affected):>9} "
            f"| {shown:>9} | {fault.bound_s:>9.1f} |"
        )
    lines += ["", "| check | result |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows.items()]
    lines += ["", "Fault log:", *stage.log]
    return "\n".join(lines)


async def test_the_stack_keeps_its_promises_under_a_fault_storm(
    database_url: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    soak = bool(request.config.getoption("--soak"))
    runs, rounds = (3000, 3) if soak else (500, 1)
    async with (
        running_sink() as sink,
        Stage(database_url=database_url, root=tmp_path) as stage,
        client(stage) as handle,
    ):
        await handle.register(STORM)
        await handle.register(POISON)
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            watcher = tg.create_task(stage.watch_progress(stop))
            submitter = tg.create_task(_submit(handle, sink, runs, ROUND_S * rounds - 1, stage))
            await _faults(stage, handle, sink, rounds)
            run_ids = await submitter
            try:
                await _wait_terminal(stage, timeout_s=240)
            finally:
                stop.set()
                await watcher
        finished = time.time()

        states: dict[str, int] = {
            r["state"]: r["count"]
            for r in await stage.db.fetch("SELECT state, count(*) FROM runs WHERE workflow = 'storm' GROUP BY state")
        }
        unfinished = await stage.db.fetchval(
            "SELECT count(*) FROM task_instances WHERE state NOT IN ('COMPLETED', 'FAILED', 'SKIPPED')"
        )
        failed_tasks = await stage.db.fetch(
            """SELECT t.node_id, t.error FROM task_instances t JOIN runs r ON r.id = t.run_id
                WHERE r.workflow = 'storm' AND t.state = 'FAILED'"""
        )
        skipped = await stage.db.fetchval(
            """SELECT count(*) FROM task_instances t JOIN runs r ON r.id = t.run_id
                WHERE r.workflow = 'storm' AND t.state = 'SKIPPED'"""
        )
        poison = await stage.db.fetchrow("SELECT id, state, error FROM runs WHERE workflow = 'poison'")
        assert poison is not None, "the poison run was started"
        letters = (await handle.stub.ListDeadLetters(pb.ListDeadLettersRequest(run_id=str(poison["id"])))).dead_letters
        http_tasks = {
            r["id"]: (r["state"], r["node_id"])
            for r in await stage.db.fetch(
                "SELECT id::text AS id, state, node_id FROM task_instances WHERE node_id = ANY($1::text[])",
                sorted(HTTP_NODES),
            )
        }
        ignored = await stage.db.fetchval("SELECT count(*) FROM ignored_reports")
        redispatched = await stage.db.fetchval("SELECT count(*) - count(DISTINCT (task_id, attempt)) FROM outbox")

    overlaps = _overlaps(sink.records)
    unknown_effects = sorted({r.key for r in sink.records} - set(http_tasks))
    completed_http = {task for task, (state, _) in http_tasks.items() if state == "COMPLETED"}
    with_effect = {r.key for r in sink.records if r.status == 200}
    missing_effects = sorted(completed_http - with_effect)
    slow = [f for f in stage.faults if (w := f.worst_s()) is not None and w > f.bound_s + SLACK_S]
    rows = {
        "storm runs": f"{len(run_ids)} started, {dict(states)} ({finished - stage.started:.0f} s)",
        "tasks not finished": unfinished,
        "storm tasks FAILED": len(failed_tasks),
        "storm tasks SKIPPED (the SWITCH branch not taken)": skipped,
        "poison run": f"{poison['state']}: {poison['error']}",
        "dead letters": [(d.node_id, d.delivery_count, d.reason) for d in letters],
        "workers SIGKILLed by the poison step": len(sink.poison_kills),
        "HTTP requests recorded": len(sink.records),
        "overlapping executions of one task": len(overlaps),
        "side effects of unknown tasks": len(unknown_effects),
        "completed HTTP tasks without a side effect": len(missing_effects),
        "reports ignored (stale or duplicate)": ignored,
        "dispatches beyond one per attempt (redeliveries, sweeps)": redispatched,
        f"faults over their bound (+{SLACK_S:.0f} s slack)": [f.kind for f in slow],
    }
    report = _report(stage, rows)
    with capsys.disabled():
        print(report)

    assert states == {"COMPLETED": runs}, report
    assert len(run_ids) == runs
    assert unfinished == 0, report
    assert failed_tasks == [], report
    assert skipped == runs, "exactly one SWITCH branch per run is skipped"
    assert poison["state"] == "FAILED"
    reason = f"task exceeded max delivery attempts ({MAX_DELIVERIES})"
    assert reason in poison["error"]
    assert [(d.node_id, d.reason) for d in letters] == [("crash", reason)]
    assert letters[0].delivery_count > MAX_DELIVERIES
    assert overlaps == [], "\n".join(overlaps[:10])
    assert unknown_effects == []
    assert missing_effects == []
    assert all(f.worst_s() != float("inf") for f in stage.faults), report
    assert slow == [], report
