"""Workflow definitions: every refusal names the node and field."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from coordinator.definitions import RetryPolicy, Workflow
from coordinator.errors import InvalidDefinition
from coordinator.expressions import ExpressionError, Template

VALID: dict[str, Any] = {
    "name": "orders",
    "nodes": [
        {
            "id": "fetch",
            "type": "HTTP",
            "request": {"method": "post", "url": "https://api.example.com/o/${input.id}", "body": {"n": "${input.n}"}},
        },
        {
            "id": "total",
            "type": "CODE",
            "runtime": "python",
            "depends_on": ["fetch"],
            "code": "def main(i): return i",
            "input": {"items": "${steps.fetch.items}"},
        },
        {
            "id": "route",
            "type": "SWITCH",
            "depends_on": ["total"],
            "cases": [{"when": "steps.total.sum > 100", "then": ["big"]}],
            "default": ["small"],
        },
        {
            "id": "big",
            "type": "CODE",
            "runtime": "js",
            "depends_on": ["route"],
            "code": "function main(i) { return i }",
        },
        {
            "id": "small",
            "type": "CODE",
            "runtime": "js",
            "depends_on": ["route"],
            "code": "function main(i) { return i }",
        },
    ],
}


def _with(path: list[Any], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(VALID)
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


_DELETE = object()


def test_a_valid_definition_compiles_in_topological_order() -> None:
    workflow = Workflow.parse(VALID)
    assert [n.id for n in workflow.nodes] == ["fetch", "total", "route", "big", "small"]
    assert workflow.sinks == ("big", "small")
    assert workflow.by_id["fetch"].kind == "http"
    assert workflow.by_id["big"].queue == "js"
    rendered = workflow.by_id["fetch"].request.render({"input": {"id": 7, "n": [1]}, "steps": {}})  # type: ignore[union-attr]
    assert rendered == {"method": "POST", "url": "https://api.example.com/o/7", "headers": {}, "body": {"n": [1]}}


def test_identical_definitions_share_a_digest() -> None:
    assert Workflow.parse(VALID).digest() == Workflow.parse(copy.deepcopy(VALID)).digest()
    assert (
        Workflow.parse(VALID).digest()
        != Workflow.parse(_with(["nodes", 0, "request", "url"], "https://other")).digest()
    )


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "a workflow definition must be a JSON object"),
        (_with(["name"], "Bad Name"), "field 'name'"),
        (_with(["nodes"], []), "field 'nodes': must be a non-empty list"),
        (_with(["extra"], 1), "field 'extra': unknown field"),
        (_with(["nodes", 0, "type"], "FTP"), "node 'fetch' field 'type': unknown node type 'FTP'"),
        (_with(["nodes", 1, "depends_on"], ["nope"]), "node 'total' field 'depends_on': unknown dependency 'nope'"),
        (_with(["nodes", 0, "depends_on"], ["small"]), "field 'depends_on': dependencies form a cycle"),
        (
            _with(["nodes", 1, "depends_on"], ["total"]),
            "node 'total' field 'depends_on': a node cannot depend on itself",
        ),
        (_with(["nodes", 4, "id"], "big"), "node 'big' field 'id': duplicate node id"),
        (_with(["nodes", 1, "runtime"], "ruby"), "node 'total' field 'runtime': unknown runtime 'ruby'"),
        (_with(["nodes", 1, "code"], "  "), "node 'total' field 'code'"),
        (_with(["nodes", 1, "dependson"], ["fetch"]), "node 'total' field 'dependson': unknown field for a CODE node"),
        (
            _with(["nodes", 0, "request", "url"], "ftp://x"),
            "node 'fetch' field 'request.url': must be an http:// or https:// URL",
        ),
        (
            _with(["nodes", 0, "request", "method"], "FETCH"),
            "node 'fetch' field 'request.method': unknown method 'FETCH'",
        ),
        (_with(["nodes", 0, "request"], _DELETE), "node 'fetch' field 'request'"),
        (_with(["nodes", 0, "request", "headers"], {"a": 1}), "node 'fetch' field 'request.headers'"),
        (
            _with(["nodes", 0, "request", "url"], "https://x/${input.n +}"),
            "node 'fetch' field 'request.url': bad expression 'input.n +'",
        ),
        (_with(["nodes", 0, "request", "url"], "https://x/${secret.key}"), "unknown variable secret"),
        (_with(["nodes", 0, "request", "url"], "https://x/${input.n"), "unterminated"),
        (
            _with(["nodes", 1, "input"], {"x": "${steps.small.v}"}),
            "node 'total' field 'input': expression reads steps.small, which is not upstream",
        ),
        (
            _with(["nodes", 2, "cases", 0, "when"], "steps.big.x"),
            "node 'route' field 'cases[0].when': expression reads steps.big",
        ),
        (
            _with(["nodes", 2, "cases", 0, "then"], ["fetch"]),
            "node 'route' field 'cases[0].then': 'fetch' is not a direct dependent",
        ),
        (
            _with(["nodes", 2, "default"], []),
            "node 'route' field 'cases': dependent 'small' is in no case and not in default",
        ),
        (_with(["nodes", 2, "cases"], []), "node 'route' field 'cases'"),
        (
            _with(["nodes", 1, "retry"], {"max_attempts": 0}),
            "node 'total' field 'retry.max_attempts': must be an integer between 1 and 100",
        ),
        (_with(["nodes", 1, "retry"], {"multiplier": 0.5}), "node 'total' field 'retry.multiplier'"),
        (
            _with(["nodes", 1, "retry"], {"initial_backoff_seconds": 10, "max_backoff_seconds": 5}),
            "node 'total' field 'retry.max_backoff_seconds'",
        ),
        (_with(["nodes", 1, "retry"], {"tries": 3}), "node 'total' field 'retry.tries': unknown field"),
        (_with(["nodes", 1, "timeout_seconds"], 0), "node 'total' field 'timeout_seconds'"),
        (_with(["nodes", 1, "join"], "some"), "node 'total' field 'join'"),
        (_with(["nodes", 1, "queue"], "Bad Queue"), "node 'total' field 'queue'"),
    ],
)
def test_invalid_definitions_are_refused_naming_node_and_field(document: Any, message: str) -> None:
    with pytest.raises(InvalidDefinition) as caught:
        Workflow.parse(document)
    assert message in str(caught.value)


def test_backoff_grows_and_is_capped() -> None:
    policy = RetryPolicy(max_attempts=10, initial_backoff_s=1, multiplier=3, max_backoff_s=20)
    assert [policy.backoff_s(a) for a in range(1, 6)] == [1, 3, 9, 20, 20]


def test_templates_interpolate_and_keep_types() -> None:
    template = Template.compile(
        {"whole": "${input.list}", "text": "n=${input.n}, l=${input.list}", "plain": 3}, node="n", field="input"
    )
    assert template.render({"input": {"n": 2, "list": [1, {"a": None}]}, "steps": {}}) == {
        "whole": [1, {"a": None}],
        "text": 'n=2, l=[1,{"a":null}]',
        "plain": 3,
    }
    braces = Template.compile("${ {'k': input.n}.k }", node="n", field="input")
    assert braces.render({"input": {"n": 5}, "steps": {}}) == 5
    with pytest.raises(ExpressionError, match=r"input\.missing"):
        Template.compile("${input.missing}", node="n", field="input").render({"input": {}, "steps": {}})
