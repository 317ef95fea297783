"""The run state machine's decisions, as pure functions over a run snapshot.

`plan_advance` answers "given what has finished, what happens next?": which
pending nodes are queued (with their inputs), which SWITCH nodes are evaluated,
which branches are skipped, and whether the run is over. `plan_failure`
answers "this attempt failed: retry or give up?". Neither touches the database;
`coordinator/runs.py` applies their plans in one transaction under the run's
lock, together with the outbox rows they imply. Keeping the decisions pure
makes every rule testable on its own and keeps the SQL a thin applier.

Task states: PENDING (waiting for dependencies) → QUEUED (dispatched) →
RUNNING (leased) → COMPLETED | FAILED | SKIPPED. A failed attempt with attempts
left goes back to QUEUED with attempt + 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from coordinator.definitions import Node, Workflow
from coordinator.expressions import ExpressionError

__all__ = ["TERMINAL", "Plan", "TaskView", "node_input", "plan_advance", "plan_failure"]

TERMINAL = frozenset({"COMPLETED", "FAILED", "SKIPPED"})


@dataclass(slots=True)
class TaskView:
    """What the planner needs of one task row."""

    id: str
    node_id: str
    state: str
    attempt: int
    output: Any = None


@dataclass(slots=True)
class Plan:
    """Changes to apply atomically. Node ids refer to the run's task rows."""

    queue: dict[str, Any] = field(default_factory=dict)  # node id → task input; becomes QUEUED, attempt 1
    complete: dict[str, Any] = field(default_factory=dict)  # node id → output (SWITCH nodes)
    fail: dict[str, str] = field(default_factory=dict)  # node id → error (an input that could not be built)
    skip: list[str] = field(default_factory=list)
    run_state: str | None = None  # COMPLETED or FAILED when the run ends
    run_output: Any = None
    run_error: str | None = None


@dataclass(frozen=True, slots=True)
class RetryDecision:
    retry: bool
    delay_s: float = 0.0


def plan_failure(node: Node, attempt: int) -> RetryDecision:
    """Retry while the node's policy has attempts left, after its backoff."""
    if attempt < node.retry.max_attempts:
        return RetryDecision(retry=True, delay_s=node.retry.backoff_s(attempt))
    return RetryDecision(retry=False)


def node_input(node: Node, run_input: Any, outputs: Mapping[str, Any]) -> Any:
    """Builds the input of a task node from the run input and upstream outputs.

    Raises:
        ExpressionError: a template expression failed.
    """
    variables = {"input": run_input, "steps": dict(outputs)}
    if node.request is not None:
        return node.request.render(variables)
    if node.input is not None:
        return node.input.render(variables)
    return {"input": run_input, "steps": {d: outputs[d] for d in node.depends_on if d in outputs}}


def plan_advance(workflow: Workflow, run_input: Any, tasks: dict[str, TaskView]) -> Plan:
    """Moves every node whose dependencies are settled, then decides the run.

    `tasks` is updated in place to reflect the plan, so one pass in
    topological order settles chains of SWITCH and skipped nodes at once.
    """
    plan = Plan()
    outputs = {t.node_id: t.output for t in tasks.values() if t.state == "COMPLETED"}
    for node in workflow.nodes:
        task = tasks[node.id]
        if task.state != "PENDING":
            continue
        deps = [tasks[d] for d in node.depends_on]
        if any(d.state not in TERMINAL for d in deps):
            continue
        if not _should_run(node, deps, workflow):
            task.state = "SKIPPED"
            plan.skip.append(node.id)
            continue
        if node.type == "SWITCH":
            try:
                chosen = _evaluate_switch(node, run_input, outputs)
            except ExpressionError as exc:
                task.state = "FAILED"
                plan.fail[node.id] = str(exc)
                break
            task.state, task.output = "COMPLETED", {"branch": list(chosen)}
            outputs[node.id] = task.output
            plan.complete[node.id] = task.output
            continue
        try:
            plan.queue[node.id] = node_input(node, run_input, outputs)
        except ExpressionError as exc:
            task.state = "FAILED"
            plan.fail[node.id] = f"could not build the input: {exc}"
            break
        task.state, task.attempt = "QUEUED", 1
    if plan.fail:
        node_id, error = next(iter(plan.fail.items()))
        _fail_run(plan, tasks, f"node {node_id!r} failed: {error}")
    elif all(t.state in TERMINAL for t in tasks.values()):
        _finish_run(plan, workflow, tasks)
    return plan


def plan_run_failure(tasks: dict[str, TaskView], error: str) -> Plan:
    """A task failed for good: the run fails and everything unfinished is skipped."""
    plan = Plan()
    _fail_run(plan, tasks, error)
    return plan


def _fail_run(plan: Plan, tasks: dict[str, TaskView], error: str) -> None:
    for task in tasks.values():
        if task.state not in TERMINAL:
            task.state = "SKIPPED"
            plan.skip.append(task.node_id)
    # Nodes queued earlier in this same plan are skipped instead.
    for node_id in list(plan.queue):
        del plan.queue[node_id]
    plan.run_state, plan.run_error = "FAILED", error


def _finish_run(plan: Plan, workflow: Workflow, tasks: dict[str, TaskView]) -> None:
    failed = [t for t in tasks.values() if t.state == "FAILED"]
    if failed:
        plan.run_state, plan.run_error = "FAILED", f"node {failed[0].node_id!r} failed"
        return
    plan.run_state = "COMPLETED"
    plan.run_output = {s: tasks[s].output for s in workflow.sinks if tasks[s].state == "COMPLETED"}


def _should_run(node: Node, deps: list[TaskView], workflow: Workflow) -> bool:
    by_id = workflow.by_id
    for dep in deps:
        if (
            by_id[dep.node_id].type == "SWITCH"
            and dep.state == "COMPLETED"
            and node.id not in (dep.output or {}).get("branch", [])
        ):
            return False
    completed = sum(1 for d in deps if d.state == "COMPLETED")
    if node.join == "any":
        return completed > 0 or not deps
    return completed == len(deps)


def _evaluate_switch(node: Node, run_input: Any, outputs: Mapping[str, Any]) -> tuple[str, ...]:
    variables = {"input": run_input, "steps": dict(outputs)}
    for case in node.cases:
        value = case.when.evaluate(variables)
        if not isinstance(value, bool):
            raise ExpressionError(f"switch condition {case.when.source!r} returned {type(value).__name__}, not a bool")
        if value:
            return case.then
    return node.default
