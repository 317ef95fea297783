"""Workflow definitions: parsed, validated and compiled once, at registration.

A definition is a JSON document (see README, "Writing a workflow"): a name and
a list of nodes joined by `depends_on`. Validation is default-deny: unknown
fields, node types, runtimes and methods are refused, and every refusal names
the node and field, so an author can fix the document without guessing.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from coordinator.errors import InvalidDefinition
from coordinator.expressions import Expression, Template

__all__ = ["Node", "RetryPolicy", "SwitchCase", "Workflow"]

NODE_TYPES = frozenset({"HTTP", "CODE", "SWITCH"})
#: Runtime names accepted in CODE nodes → the queue and message node_type they map to.
RUNTIMES: Mapping[str, str] = {"python": "python", "js": "js", "node": "js"}
HTTP_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
JOINS = frozenset({"all", "any"})

_COMMON_FIELDS = frozenset({"id", "type", "depends_on", "join", "description"})
_TASK_FIELDS = frozenset({"queue", "retry", "timeout_seconds"})
_FIELDS_BY_TYPE: Mapping[str, frozenset[str]] = {
    "HTTP": _COMMON_FIELDS | _TASK_FIELDS | {"request"},
    "CODE": _COMMON_FIELDS | _TASK_FIELDS | {"runtime", "code", "input"},
    "SWITCH": _COMMON_FIELDS | {"cases", "default"},
}
_REQUEST_FIELDS = frozenset({"method", "url", "headers", "body"})
_RETRY_FIELDS = frozenset({"max_attempts", "initial_backoff_seconds", "multiplier", "max_backoff_seconds"})

_WORKFLOW_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,127}$")
_NODE_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
_QUEUE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_MAX_NODES = 1000
_MAX_CODE_BYTES = 256 * 1024
DEFAULT_TIMEOUT_S = 90
MAX_TIMEOUT_S = 86_400


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a failed task is retried, and how long to wait before each retry."""

    max_attempts: int = 3
    initial_backoff_s: float = 1.0
    multiplier: float = 2.0
    max_backoff_s: float = 60.0

    def backoff_s(self, failed_attempt: int) -> float:
        """The delay before the attempt after `failed_attempt` (1-based)."""
        return float(min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (failed_attempt - 1)))


@dataclass(frozen=True, slots=True)
class SwitchCase:
    when: Expression
    then: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Node:
    """One validated node. `kind` is the task kind sent to workers (None for SWITCH)."""

    id: str
    type: str
    depends_on: tuple[str, ...]
    join: str
    kind: str | None = None
    queue: str | None = None
    request: Template | None = None
    code: str | None = None
    input: Template | None = None
    cases: tuple[SwitchCase, ...] = ()
    default: tuple[str, ...] = ()
    retry: RetryPolicy = RetryPolicy()
    timeout_s: int = DEFAULT_TIMEOUT_S

    @property
    def is_task(self) -> bool:
        """True for nodes a worker executes; False for nodes the coordinator evaluates."""
        return self.type != "SWITCH"

    def filename(self) -> str:
        return f"{self.id}.py" if self.kind == "python" else f"{self.id}.js"


@dataclass(frozen=True, slots=True)
class Workflow:
    """A validated workflow version; `nodes` are in a topological order."""

    name: str
    nodes: tuple[Node, ...]
    document: Mapping[str, Any]
    by_id: Mapping[str, Node]
    #: Nodes nothing depends on: their outputs form the run's output.
    sinks: tuple[str, ...]
    #: Set by the registry once stored; 0 for a definition not yet registered.
    version: int = 0

    def dependents(self, node_id: str) -> list[str]:
        return [n.id for n in self.nodes if node_id in n.depends_on]

    def digest(self) -> str:
        """A hash of the canonical document: equal definitions share it."""
        canonical = json.dumps(self.document, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @classmethod
    def parse(cls, document: Any) -> Workflow:
        """Validates a definition document and compiles its expressions.

        Raises:
            InvalidDefinition: the first problem found, naming node and field.
        """
        if not isinstance(document, dict):
            raise InvalidDefinition("a workflow definition must be a JSON object")
        unknown = sorted(set(document) - {"name", "description", "nodes"})
        if unknown:
            raise InvalidDefinition(f"unknown field {unknown[0]!r}", field=unknown[0])
        name = document.get("name")
        if not isinstance(name, str) or not _WORKFLOW_NAME.match(name):
            raise InvalidDefinition(
                "must be 1-128 characters of a-z, 0-9, '_', '.', '-', starting with a letter or digit", field="name"
            )
        raw_nodes = document.get("nodes")
        if not isinstance(raw_nodes, list) or not raw_nodes:
            raise InvalidDefinition("must be a non-empty list of nodes", field="nodes")
        if len(raw_nodes) > _MAX_NODES:
            raise InvalidDefinition(f"at most {_MAX_NODES} nodes", field="nodes")
        parsed: dict[str, Node] = {}
        for index, raw in enumerate(raw_nodes):
            node = _parse_node(raw, index)
            if node.id in parsed:
                raise InvalidDefinition("duplicate node id", node=node.id, field="id")
            parsed[node.id] = node
        for node in parsed.values():
            for dep in node.depends_on:
                if dep not in parsed:
                    raise InvalidDefinition(f"unknown dependency {dep!r}", node=node.id, field="depends_on")
        ordered = _topological_order(parsed)
        needed = {d for n in ordered for d in n.depends_on}
        workflow = cls(
            name=name,
            nodes=tuple(ordered),
            document=document,
            by_id={n.id: n for n in ordered},
            sinks=tuple(n.id for n in ordered if n.id not in needed),
        )
        _check_switches(workflow)
        _check_references(workflow)
        return workflow


def _parse_node(raw: Any, index: int) -> Node:
    if not isinstance(raw, dict):
        raise InvalidDefinition(f"nodes[{index}] must be an object", field="nodes")
    node_id = raw.get("id")
    if not isinstance(node_id, str) or not _NODE_ID.match(node_id):
        raise InvalidDefinition(
            f"nodes[{index}].id must be 1-64 characters of letters, digits, '_' or '-', starting with a letter or '_'",
            field="id",
        )
    node_type = raw.get("type")
    if node_type not in NODE_TYPES:
        raise InvalidDefinition(
            f"unknown node type {node_type!r} (expected one of {', '.join(sorted(NODE_TYPES))})",
            node=node_id,
            field="type",
        )
    unknown = sorted(set(raw) - _FIELDS_BY_TYPE[node_type])
    if unknown:
        raise InvalidDefinition(f"unknown field for a {node_type} node", node=node_id, field=unknown[0])
    depends_on = raw.get("depends_on", [])
    if not isinstance(depends_on, list) or not all(isinstance(d, str) for d in depends_on):
        raise InvalidDefinition("must be a list of node ids", node=node_id, field="depends_on")
    if len(set(depends_on)) != len(depends_on):
        raise InvalidDefinition("lists a dependency twice", node=node_id, field="depends_on")
    if node_id in depends_on:
        raise InvalidDefinition("a node cannot depend on itself", node=node_id, field="depends_on")
    join = raw.get("join", "all")
    if join not in JOINS:
        raise InvalidDefinition(f"must be 'all' or 'any', not {join!r}", node=node_id, field="join")
    common: dict[str, Any] = {"id": node_id, "type": node_type, "depends_on": tuple(depends_on), "join": join}
    if node_type == "SWITCH":
        return _parse_switch(raw, common)
    common["retry"] = _parse_retry(raw.get("retry"), node_id)
    common["timeout_s"] = _parse_timeout(raw.get("timeout_seconds", DEFAULT_TIMEOUT_S), node_id)
    queue = raw.get("queue")
    if queue is not None and (not isinstance(queue, str) or not _QUEUE.match(queue)):
        raise InvalidDefinition("must be 1-64 characters of a-z, 0-9, '_' or '-'", node=node_id, field="queue")
    if node_type == "HTTP":
        request = _parse_request(raw.get("request"), node_id)
        return Node(**common, kind="http", queue=queue or "http", request=request)
    runtime = raw.get("runtime")
    if not isinstance(runtime, str) or runtime not in RUNTIMES:
        raise InvalidDefinition(
            f"unknown runtime {runtime!r} (expected one of {', '.join(RUNTIMES)})", node=node_id, field="runtime"
        )
    code = raw.get("code")
    if not isinstance(code, str) or not code.strip():
        raise InvalidDefinition("must be a non-empty string of source code", node=node_id, field="code")
    if len(code.encode()) > _MAX_CODE_BYTES:
        raise InvalidDefinition(f"is larger than {_MAX_CODE_BYTES} bytes", node=node_id, field="code")
    kind = RUNTIMES[runtime]
    input_template = Template.compile(raw["input"], node=node_id, field="input") if "input" in raw else None
    return Node(**common, kind=kind, queue=queue or kind, code=code, input=input_template)


def _parse_request(raw: Any, node_id: str) -> Template:
    if not isinstance(raw, dict):
        raise InvalidDefinition(
            "an HTTP node needs a request object with at least a url", node=node_id, field="request"
        )
    unknown = sorted(set(raw) - _REQUEST_FIELDS)
    if unknown:
        raise InvalidDefinition("unknown field", node=node_id, field=f"request.{unknown[0]}")
    url = raw.get("url")
    if not isinstance(url, str) or not url.strip():
        raise InvalidDefinition("must be a non-empty string", node=node_id, field="request.url")
    if "${" not in url and not url.startswith(("http://", "https://")):
        raise InvalidDefinition("must be an http:// or https:// URL", node=node_id, field="request.url")
    method = raw.get("method", "GET")
    if not isinstance(method, str) or method.upper() not in HTTP_METHODS:
        raise InvalidDefinition(
            f"unknown method {method!r} (expected one of {', '.join(sorted(HTTP_METHODS))})",
            node=node_id,
            field="request.method",
        )
    headers = raw.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise InvalidDefinition("must be an object of string values", node=node_id, field="request.headers")
    resolved = {"method": method.upper(), "url": url, "headers": headers, "body": raw.get("body")}
    return Template.compile(resolved, node=node_id, field="request")


def _parse_switch(raw: dict[str, Any], common: dict[str, Any]) -> Node:
    node_id = common["id"]
    cases_raw = raw.get("cases")
    if not isinstance(cases_raw, list) or not cases_raw:
        raise InvalidDefinition("a SWITCH needs a non-empty list of cases", node=node_id, field="cases")
    cases = []
    for i, case in enumerate(cases_raw):
        where = f"cases[{i}]"
        if not isinstance(case, dict) or set(case) - {"when", "then"}:
            raise InvalidDefinition("must be an object with 'when' and 'then'", node=node_id, field=where)
        when = case.get("when")
        if not isinstance(when, str):
            raise InvalidDefinition("must be a CEL expression string", node=node_id, field=f"{where}.when")
        then = _id_list(case.get("then"), node_id, f"{where}.then")
        cases.append(SwitchCase(when=Expression.compile(when, node=node_id, field=f"{where}.when"), then=then))
    default = _id_list(raw.get("default", []), node_id, "default", allow_empty=True)
    return Node(**common, cases=tuple(cases), default=default)


def _id_list(raw: Any, node_id: str, field: str, *, allow_empty: bool = False) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw) or (not raw and not allow_empty):
        raise InvalidDefinition("must be a list of node ids", node=node_id, field=field)
    return tuple(raw)


def _parse_retry(raw: Any, node_id: str) -> RetryPolicy:
    if raw is None:
        return RetryPolicy()
    if not isinstance(raw, dict):
        raise InvalidDefinition("must be an object", node=node_id, field="retry")
    unknown = sorted(set(raw) - _RETRY_FIELDS)
    if unknown:
        raise InvalidDefinition("unknown field", node=node_id, field=f"retry.{unknown[0]}")
    defaults = RetryPolicy()

    def number(key: str, default: float, low: float, high: float, *, integer: bool = False) -> float:
        value = raw.get(key, default)
        ok = isinstance(value, int) if integer else isinstance(value, int | float)
        if isinstance(value, bool) or not ok or not low <= value <= high:
            kind = "an integer" if integer else "a number"
            raise InvalidDefinition(
                f"must be {kind} between {low:g} and {high:g}, not {value!r}", node=node_id, field=f"retry.{key}"
            )
        return float(value)

    policy = RetryPolicy(
        max_attempts=int(number("max_attempts", defaults.max_attempts, 1, 100, integer=True)),
        initial_backoff_s=number("initial_backoff_seconds", defaults.initial_backoff_s, 0, 86_400),
        multiplier=number("multiplier", defaults.multiplier, 1, 100),
        max_backoff_s=number(
            "max_backoff_seconds", max(defaults.max_backoff_s, raw.get("initial_backoff_seconds", 0) or 0), 0, 86_400
        ),
    )
    if policy.max_backoff_s < policy.initial_backoff_s:
        raise InvalidDefinition(
            "must not be below initial_backoff_seconds", node=node_id, field="retry.max_backoff_seconds"
        )
    return policy


def _parse_timeout(raw: Any, node_id: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= MAX_TIMEOUT_S:
        raise InvalidDefinition(
            f"must be an integer between 1 and {MAX_TIMEOUT_S}, not {raw!r}", node=node_id, field="timeout_seconds"
        )
    return raw


def _topological_order(nodes: dict[str, Node]) -> list[Node]:
    """Kahn's algorithm, stable in document order; refuses cycles by naming a node on one."""
    remaining = {n.id: set(n.depends_on) for n in nodes.values()}
    ordered: list[Node] = []
    while remaining:
        ready = [nid for nid, deps in remaining.items() if not deps]
        if not ready:
            on_cycle = sorted(remaining)[0]
            raise InvalidDefinition("dependencies form a cycle", node=on_cycle, field="depends_on")
        for nid in ready:
            del remaining[nid]
            ordered.append(nodes[nid])
        for deps in remaining.values():
            deps.difference_update(ready)
    return ordered


def _check_switches(workflow: Workflow) -> None:
    for node in workflow.nodes:
        if node.type != "SWITCH":
            continue
        dependents = set(workflow.dependents(node.id))
        targets: list[tuple[str, str]] = [(t, f"cases[{i}].then") for i, c in enumerate(node.cases) for t in c.then]
        targets += [(t, "default") for t in node.default]
        for target, field in targets:
            if target not in dependents:
                raise InvalidDefinition(
                    f"{target!r} is not a direct dependent of this switch", node=node.id, field=field
                )
        never = sorted(dependents - {t for t, _ in targets})
        if never:
            raise InvalidDefinition(
                f"dependent {never[0]!r} is in no case and not in default, so it could never run",
                node=node.id,
                field="cases",
            )


def _check_references(workflow: Workflow) -> None:
    """Every `steps.x` an expression reads must be upstream of its node."""
    ancestors: dict[str, set[str]] = {}
    for node in workflow.nodes:  # topological: dependencies come first
        ancestors[node.id] = set(node.depends_on).union(*(ancestors[d] for d in node.depends_on))
        refs: list[tuple[str, frozenset[str]]] = []
        if node.request is not None:
            refs.append(("request", node.request.step_references))
        if node.input is not None:
            refs.append(("input", node.input.step_references))
        refs += [(f"cases[{i}].when", c.when.step_references) for i, c in enumerate(node.cases)]
        for field, names in refs:
            for name in sorted(names):
                if name not in ancestors[node.id]:
                    raise InvalidDefinition(
                        f"expression reads steps.{name}, which is not upstream of this node", node=node.id, field=field
                    )
