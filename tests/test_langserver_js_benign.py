"""Ordinary programs run and come back right: values, logs, typed errors with lines."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import pytest

from protos import langserver_pb2_grpc
from tests.langserver_js_support import LangServerProcess, aio_stub, kind_name, request, running_server

MAX_LOG_BYTES = 2000


@pytest.fixture(scope="module")
def server() -> Iterator[LangServerProcess]:
    with running_server(JS_POOL_PROCESSES="2", JS_MAX_CONCURRENCY="2", JS_MAX_LOG_BYTES=str(MAX_LOG_BYTES)) as proc:
        yield proc


@pytest.fixture
async def stub(server: LangServerProcess) -> AsyncIterator[langserver_pb2_grpc.LanguageServerStub]:
    async with aio_stub(server.addr) as client:
        yield client


BENIGN = [
    pytest.param(
        "function main(input) { return JSON.parse(JSON.stringify({a: [1, 2, {b: input.x}], s: 'é🌍'})); }",
        {"x": True},
        {"a": [1, 2, {"b": True}], "s": "é🌍"},
        id="json",
    ),
    pytest.param(
        "function main() { return [Math.max(3, 9, 4), Math.round(Math.sqrt(16)), Math.PI.toFixed(4), Math.hypot(3, 4)]; }",
        None,
        [9, 4, "3.1416", 5],
        id="math",
    ),
    pytest.param(
        "function main() { const d = new Date(Date.UTC(2020, 0, 31, 12)); d.setUTCDate(d.getUTCDate() + 1);"
        " return [d.toISOString(), Date.now() > 1.6e12, new Date('2021-03-04T05:06:07Z').getTime()]; }",
        None,
        ["2020-02-01T12:00:00.000Z", True, 1614834367000],
        id="date",
    ),
    pytest.param(
        "function main(s) { const m = /(?<y>\\d{4})-(?<mo>\\d{2})/.exec(s);"
        " return [s.match(/\\d+/g), m.groups.y, s.replace(/-/g, '/'), /^a.c$/s.test('a\\nc')]; }",
        "2024-05-17",
        [["2024", "05", "17"], "2024", "2024/05/17", True],
        id="regex",
    ),
    pytest.param(
        """
        class Shape { constructor(name) { this.name = name; } area() { return 0; } toString() { return this.name; } }
        class Rect extends Shape {
          #w; #h; static count = 0;
          constructor(w, h) { super('rect'); this.#w = w; this.#h = h; Rect.count++; }
          area() { return this.#w * this.#h; }
          get label() { return `${super.toString()}:${this.area()}`; }
        }
        function main(input) { const r = new Rect(input.w, input.h); new Rect(1, 1); return [r.area(), r.label, Rect.count, r instanceof Shape]; }
        """,
        {"w": 3, "h": 4},
        [12, "rect:12", 2, True],
        id="classes",
    ),
    pytest.param(
        """
        async function double(x) { await null; return x * 2; }
        async function main(input) {
          const values = await Promise.all(input.map(double));
          const settled = await Promise.allSettled([Promise.reject(new Error('no')), double(1)]);
          try { await Promise.reject(new TypeError('caught')); } catch (e) { values.push(e.message); }
          return { values, settled: settled.map(s => s.status) };
        }
        """,
        [1, 2, 3],
        {"values": [2, 4, 6, "caught"], "settled": ["rejected", "fulfilled"]},
        id="async-await",
    ),
    pytest.param(
        "function main(x) { return new Promise(resolve => resolve(x + 1)).then(v => v * 10); }",
        4,
        50,
        id="returned-promise",
    ),
    pytest.param(
        "const main = ({items}) => items.filter(Boolean).map(({id, ...rest}) => ({id, keys: Object.keys(rest)}));",
        {"items": [{"id": 1, "a": 1, "b": 2}, None, {"id": 2}]},
        [{"id": 1, "keys": ["a", "b"]}, {"id": 2, "keys": []}],
        id="arrow-main-destructuring",
    ),
    pytest.param(
        """
        function* fib() { let [a, b] = [0, 1]; for (;;) { yield a; [a, b] = [b, a + b]; } }
        function main() {
          const out = []; for (const v of fib()) { if (v > 50) break; out.push(v); }
          const m = new Map([['a', 1]]); const s = new Set([1, 1, 2]);
          return { fib: out, map: [...m], set: [...s], big: (2n ** 70n).toString(), opt: ({}).x?.y ?? 'none' };
        }
        """,
        None,
        {
            "fib": [0, 1, 1, 2, 3, 5, 8, 13, 21, 34],
            "map": [["a", 1]],
            "set": [1, 2],
            "big": str(2**70),
            "opt": "none",
        },
        id="generators-collections-bigint",
    ),
    pytest.param(
        "function main() { return [new Intl.NumberFormat('en-US').format(1234.5), 'ß'.toUpperCase(),"
        " [...new Uint8Array([1, 2, 3]).map(v => v * 2)], 'b,a,c'.split(',').sort()]; }",
        None,
        ["1,234.5", "SS", [2, 4, 6], ["a", "b", "c"]],
        id="intl-typed-arrays",
    ),
    pytest.param("function main() {}", None, None, id="undefined-is-null"),
    pytest.param("function main(x) { return x; }", "just a string", "just a string", id="string-input"),
]


@pytest.mark.parametrize(("code", "value", "expected"), BENIGN)
async def test_benign_program_returns_its_value(
    stub: langserver_pb2_grpc.LanguageServerStub, code: str, value: object, expected: object
) -> None:
    response = await stub.Execute(request(code, json.dumps(value)))
    assert kind_name(response) == "OK", response
    assert json.loads(response.output_json) == expected
    assert response.duration_ms > 0


async def test_node_alias_and_empty_input(stub: langserver_pb2_grpc.LanguageServerStub) -> None:
    response = await stub.Execute(request("function main(x) { return x === null; }", "", runtime="node"))
    assert kind_name(response) == "OK"
    assert response.output_json == "true"


async def test_console_is_captured(stub: langserver_pb2_grpc.LanguageServerStub) -> None:
    code = """
    console.log('loading');
    function main(input) {
      console.log('plain', 1, {a: [1]}, null, undefined);
      console.info('info'); console.debug('debug');
      console.warn('careful'); console.error(new RangeError('bad'));
      return 'done';
    }
    """
    response = await stub.Execute(request(code))
    assert kind_name(response) == "OK"
    lines = response.logs.split("\n")
    assert lines[:5] == ["loading", 'plain 1 {"a":[1]} null undefined', "info", "debug", "[warn] careful"]
    assert lines[5].startswith("[error] RangeError: bad")
    assert not response.logs_truncated


async def test_logs_are_capped(stub: langserver_pb2_grpc.LanguageServerStub) -> None:
    code = "function main() { for (let i = 0; i < 10000; i++) console.log('line ' + i + ' é'); return 1; }"
    response = await stub.Execute(request(code))
    assert kind_name(response) == "OK"
    assert response.logs_truncated
    assert response.logs.startswith("line 0 é\nline 1 é")
    assert len(response.logs.encode()) <= MAX_LOG_BYTES


async def test_syntax_error_has_its_line(stub: langserver_pb2_grpc.LanguageServerStub) -> None:
    response = await stub.Execute(request("// comment\nfunction main(x) {\n  return x +;\n}\n"))
    assert kind_name(response) == "SYNTAX"
    assert response.error.line == 3
    assert "SyntaxError" in response.error.message
    assert "return x +;" in response.error.traceback


async def test_runtime_error_has_line_and_user_frames_only(stub: langserver_pb2_grpc.LanguageServerStub) -> None:
    code = "function helper(x) {\n  return x.missing.field;\n}\nfunction main(x) {\n  return helper(x);\n}\n"
    response = await stub.Execute(request(code, "{}", filename="transform.js"))
    assert kind_name(response) == "RUNTIME"
    assert response.error.message.startswith("TypeError: Cannot read properties of undefined")
    assert response.error.line == 2
    frames = response.error.traceback.splitlines()[1:]
    assert frames == ["    at helper (transform.js:2:20)", "    at main (transform.js:5:10)"]
    assert "harness" not in response.error.traceback


async def test_error_thrown_at_top_level(stub: langserver_pb2_grpc.LanguageServerStub) -> None:
    response = await stub.Execute(request("const x = 1;\nthrow new Error('at load');\nfunction main() {}"))
    assert kind_name(response) == "RUNTIME"
    assert response.error.message == "Error: at load"
    assert response.error.line == 2


@pytest.mark.parametrize(
    ("code", "message_part"),
    [
        ("async function main() { throw new TypeError('async boom'); }", "TypeError: async boom"),
        ("function main() { return Promise.reject(new Error('rejected')); }", "Error: rejected"),
        ("function main() { throw 42; }", "Uncaught 42"),
        ("function main() { throw {code: 7}; }", '{"code":7}'),
        ("function main() { return 10n; }", "cannot be serialised to JSON"),
        ("function main() { const a = {}; a.self = a; return a; }", "cannot be serialised to JSON"),
        ("function notMain() { return 1; }", "must define a function main(input)"),
    ],
)
async def test_failures_are_runtime_errors(
    stub: langserver_pb2_grpc.LanguageServerStub, code: str, message_part: str
) -> None:
    response = await stub.Execute(request(code))
    assert kind_name(response) == "RUNTIME", response
    assert message_part in response.error.message
