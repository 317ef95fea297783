"""The fault storm's workflows: every node type, fan-out/fan-in, retries, and a poison task."""

from __future__ import annotations

from typing import Any

_CODE_RETRY = {"max_attempts": 6, "initial_backoff_seconds": 0.2, "multiplier": 2, "max_backoff_seconds": 2}
_HTTP_RETRY = {"max_attempts": 6, "initial_backoff_seconds": 0.2, "multiplier": 2, "max_backoff_seconds": 2}

#: fetch (HTTP) fans out to a Python step, a JS step and a flaky HTTP step; a
#: SWITCH on the Python output picks an HTTP or a JS branch; a Python step
#: joins whatever ran.
STORM: dict[str, Any] = {
    "name": "storm",
    "nodes": [
        {
            "id": "fetch",
            "type": "HTTP",
            "retry": _HTTP_RETRY,
            "request": {
                "method": "POST",
                "url": "${input.sink + '/work?ms=' + string(input.ms)}",
                "body": {"n": "${input.n}"},
            },
        },
        {
            "id": "square",
            "type": "CODE",
            "runtime": "python",
            "depends_on": ["fetch"],
            "retry": _CODE_RETRY,
            "input": {"n": "${input.n}", "fetched": "${steps.fetch.ok}"},
            "code": "def main(input):\n    n = input['n']\n    return {'square': n * n, 'even': n % 2 == 0}\n",
        },
        {
            "id": "label",
            "type": "CODE",
            "runtime": "js",
            "depends_on": ["fetch"],
            "retry": _CODE_RETRY,
            "input": {"n": "${input.n}"},
            "code": "function main(input) { return {label: 'run-' + input.n}; }",
        },
        {
            "id": "flaky",
            "type": "HTTP",
            "depends_on": ["fetch"],
            "retry": _HTTP_RETRY,
            "request": {"method": "POST", "url": "${input.sink + '/flaky'}", "body": {"n": "${input.n}"}},
        },
        {
            "id": "route",
            "type": "SWITCH",
            "depends_on": ["square"],
            "cases": [{"when": "steps.square.even", "then": ["even"]}],
            "default": ["odd"],
        },
        {
            "id": "even",
            "type": "HTTP",
            "depends_on": ["route"],
            "retry": _HTTP_RETRY,
            "request": {
                "method": "POST",
                "url": "${input.sink + '/work?ms=20'}",
                "body": {"square": "${steps.square.square}"},
            },
        },
        {
            "id": "odd",
            "type": "CODE",
            "runtime": "js",
            "depends_on": ["route"],
            "retry": _CODE_RETRY,
            "input": {"square": "${steps.square.square}"},
            "code": "function main(input) { return {odd: input.square % 2 === 1}; }",
        },
        {
            "id": "join",
            "type": "CODE",
            "runtime": "python",
            "depends_on": ["label", "flaky", "even", "odd"],
            "join": "any",
            "retry": _CODE_RETRY,
            "code": "def main(input):\n    return {'ran': sorted(input['steps'])}\n",
        },
    ],
}

#: One HTTP step whose endpoint SIGKILLs the worker that calls it.
POISON: dict[str, Any] = {
    "name": "poison",
    "nodes": [
        {
            "id": "crash",
            "type": "HTTP",
            "retry": {"max_attempts": 1},
            "request": {"method": "POST", "url": "${input.sink + '/poison'}", "body": {}},
        },
    ],
}

HTTP_NODES = frozenset({"fetch", "flaky", "even", "crash"})


def storm_input(sink_url: str, n: int) -> dict[str, Any]:
    """Inputs vary the HTTP delay (so kills land mid-request) and the SWITCH branch."""
    return {"sink": sink_url, "n": n, "ms": 50 + (n * 37) % 250}
