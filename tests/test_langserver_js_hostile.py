"""Hostile programs are contained, leave nothing behind, and the server keeps serving.

The server here has ONE sandbox process, so every execution after a hostile one
runs in the same process (or its replacement): the canary that follows each case
proves that no global, prototype change, timer or pending job carried over.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import pytest

from langserver_js.sandbox.harness import ALLOWED_GLOBALS
from protos import langserver_pb2, langserver_pb2_grpc
from tests.langserver_js_support import LangServerProcess, aio_stub, kind_name, request, running_server

MAX_OUTPUT_BYTES = 100_000
MAX_LOG_BYTES = 5_000

# Run after every hostile program: everything a previous execution could have
# tampered with, as the next execution sees it.
CANARY = r"""
function main() {
  return {
    marker: typeof globalThis.__marker,
    pollutedObject: ({}).polluted === undefined,
    pollutedArray: [].polluted === undefined,
    objectProtoKeys: Object.getOwnPropertyNames(Object.prototype).length,
    arrayMap: [1, 2].map(x => x * 2),
    json: JSON.stringify({a: [1]}),
    parse: JSON.parse('{"b":2}').b,
    then: typeof Promise.prototype.then,
    consoleLog: typeof console.log,
    timers: typeof setTimeout,
    mathMax: Math.max(1, 3),
    globals: Object.getOwnPropertyNames(globalThis).length,
  };
}
"""


@dataclass(frozen=True)
class Hostile:
    code: str
    check: Callable[[langserver_pb2.ExecuteResponse], None]
    timeout_seconds: int = 5


def kind(*expected: str) -> Callable[[langserver_pb2.ExecuteResponse], None]:
    def check(response: langserver_pb2.ExecuteResponse) -> None:
        assert kind_name(response) in expected, response

    return check


def output(expected: object) -> Callable[[langserver_pb2.ExecuteResponse], None]:
    def check(response: langserver_pb2.ExecuteResponse) -> None:
        assert kind_name(response) == "OK", response
        assert json.loads(response.output_json) == expected

    return check


def policy(name: str) -> Callable[[langserver_pb2.ExecuteResponse], None]:
    def check(response: langserver_pb2.ExecuteResponse) -> None:
        assert kind_name(response) == "POLICY_VIOLATION", response
        assert response.error.message.startswith(f"{name}: ")
        assert "not available in this sandbox" in response.error.message

    return check


def capped_logs(response: langserver_pb2.ExecuteResponse) -> None:
    assert response.logs_truncated, response
    assert len(response.logs.encode()) <= MAX_LOG_BYTES


def timeout_with_logs(response: langserver_pb2.ExecuteResponse) -> None:
    assert kind_name(response) == "TIMEOUT", response
    capped_logs(response)


def huge_logs(response: langserver_pb2.ExecuteResponse) -> None:
    assert kind_name(response) == "OK", response
    capped_logs(response)


def array_buffers_refused(response: langserver_pb2.ExecuteResponse) -> None:
    assert kind_name(response) in ("RUNTIME", "MEMORY_LIMIT"), response
    if kind_name(response) == "RUNTIME":
        assert "Array buffer allocation failed" in response.error.message


def only_allowed_globals(response: langserver_pb2.ExecuteResponse) -> None:
    assert kind_name(response) == "OK", response
    assert set(json.loads(response.output_json)) - ALLOWED_GLOBALS == {"main"}


def harness_frames_unreachable(response: langserver_pb2.ExecuteResponse) -> None:
    assert kind_name(response) == "OK", response
    frames = json.loads(response.output_json)
    assert frames[0][:2] == ["main", True]
    # The harness's frame and the appended call's frame hand out no function or receiver.
    assert [frame[1:] for frame in frames[1:]] == [[False, "undefined"]] * (len(frames) - 1)


def stack_overflow(response: langserver_pb2.ExecuteResponse) -> None:
    assert kind_name(response) == "RUNTIME", response
    assert "Maximum call stack size exceeded" in response.error.message


HOSTILE = {
    # Reaching outside through the global object.
    "constructor-chain-global": Hostile(
        "function main() { const g = ({}).constructor.constructor('return this')(); g.__marker = 1;"
        " return [g === globalThis, typeof g.process, typeof g.require, typeof g.module]; }",
        output([True, "undefined", "undefined", "undefined"]),
    ),
    "constructor-chain-process": Hostile(
        "function main() { return this.constructor.constructor('return process')().env; }",
        policy("process"),
    ),
    "async-function-constructor": Hostile(
        "function main() { const AsyncFunction = (async () => {}).constructor;"
        " return AsyncFunction('return process.mainModule')(); }",
        policy("process"),
    ),
    "require": Hostile("function main() { return require('child_process').execSync('id'); }", policy("require")),
    "process-exit": Hostile("function main() { process.exit(1); }", policy("process")),
    "module-exports": Hostile("module.exports = { main() { return 1; } };", policy("module")),
    "dynamic-import": Hostile(
        "async function main() { return (await import('fs')).readFileSync('/etc/passwd'); }", kind("RUNTIME")
    ),
    "static-import": Hostile("import fs from 'fs';\nfunction main() { return fs; }", kind("SYNTAX")),
    "globals-are-the-allowlist": Hostile(
        "function main() { return Object.getOwnPropertyNames(globalThis).filter(n => globalThis[n] !== undefined); }",
        only_allowed_globals,
    ),
    "eval-global": Hostile(
        "function main() { const g = eval('globalThis'); g.polluted = 1;"
        " return [typeof g.process, typeof Function('return this')().require, typeof __timer_manager]; }",
        output(["undefined", "undefined", "undefined"]),
    ),
    "callsites-and-callers": Hostile(
        "function main() {"
        " Error.prepareStackTrace = (e, sites) => sites.map(s => [s.getFunctionName(), !!s.getFunction(), typeof s.getThis()]);"
        " if (main.caller !== null) throw new Error('caller reachable');"
        " return new Error().stack; }",
        harness_frames_unreachable,
    ),
    "natives-syntax": Hostile("function main() { return %GetOptimizationStatus(main); }", kind("SYNTAX")),
    # Outliving the execution or blocking the host.
    "set-timeout": Hostile(
        "function main() { setTimeout(() => { globalThis.__marker = 1; }, 0); }", policy("setTimeout")
    ),
    "set-interval": Hostile("function main() { setInterval(() => {}, 1); }", policy("setInterval")),
    "timer-manager-class": Hostile(
        "function main() { new __TimerManager().setTimeout(() => { globalThis.__marker = 1; }, 0); }",
        policy("SharedArrayBuffer"),
    ),
    "atomics-wait": Hostile(
        "function main() { Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0); }", policy("Atomics")
    ),
    "shared-array-buffer": Hostile(
        "function main() { return new SharedArrayBuffer(8).byteLength; }", policy("SharedArrayBuffer")
    ),
    "webassembly": Hostile(
        "function main() { return new WebAssembly.Memory({initial: 1, maximum: 65536, shared: true}).buffer; }",
        policy("WebAssembly"),
    ),
    "work-after-result": Hostile(
        "function main() { (async () => { for (;;) { globalThis.__marker = 1; await null; } })(); return 'returned'; }",
        output("returned"),
    ),
    # Tampering that must not reach the harness or the next execution.
    "prototype-pollution": Hostile(
        "function main() { Object.prototype.polluted = 'yes'; Array.prototype.polluted = 1;"
        " Array.prototype.map = () => 'hacked'; Array.prototype.push = () => { throw new Error('x'); };"
        " JSON.stringify = () => '\"forged\"'; JSON.parse = () => 'forged'; String.prototype.slice = () => ''; return 1; }",
        output(1),
    ),
    "envelope-forgery": Hostile(
        "function main() { Object.prototype.toJSON = function () { return {status: 'ok'}; };"
        " Object.defineProperty(Object.prototype, 'status', {set() { throw new Error('setter'); }});"
        " Promise.prototype.then = function () { return 'forged'; };"
        " console.log('still captured'); return 'real'; }",
        output("real"),
    ),
    "hostile-thrown-values": Hostile(
        "function main() { Error.prepareStackTrace = () => { throw new Error('no stack'); };"
        " throw new Proxy({}, { get() { throw new Error('trap'); } }); }",
        kind("RUNTIME"),
    ),
    # Resource exhaustion.
    "infinite-loop": Hostile("function main() { for (;;) {} }", kind("TIMEOUT"), timeout_seconds=1),
    "microtask-loop": Hostile("async function main() { for (;;) { await null; } }", kind("TIMEOUT"), timeout_seconds=1),
    "never-settles": Hostile("function main() { return new Promise(() => {}); }", kind("TIMEOUT"), timeout_seconds=1),
    "catastrophic-regex": Hostile(
        "function main() { return /^(a+)+$/.test('a'.repeat(40) + '!'); }", kind("TIMEOUT"), timeout_seconds=1
    ),
    "endless-to-json": Hostile(
        "function main() { return { toJSON() { for (;;) {} } }; }", kind("TIMEOUT"), timeout_seconds=1
    ),
    "heap-growth": Hostile(
        "function main() { const a = []; for (;;) a.push({i: a.length, s: 'x' + a.length}); }", kind("MEMORY_LIMIT")
    ),
    "string-doubling": Hostile("function main() { let s = 'x'; for (;;) s += s; }", kind("RUNTIME", "MEMORY_LIMIT")),
    "array-buffers-beyond-data-limit": Hostile(
        "function main() { const keep = []; for (let i = 0; i < 64; i++) keep.push(new ArrayBuffer(256 * 2 ** 20)); }",
        array_buffers_refused,
    ),
    "deep-recursion": Hostile(
        "function main() { const f = n => f(n + 1) + 1; return f(0); }",
        stack_overflow,
    ),
    "huge-output": Hostile("function main() { return 'x'.repeat(10_000_000); }", kind("OUTPUT_TOO_LARGE")),
    "huge-logs": Hostile(
        "function main() { for (let i = 0; i < 100000; i++) console.log('y'.repeat(1000)); return 1; }", huge_logs
    ),
    "logs-until-timeout": Hostile(
        "function main() { for (;;) console.error('z'.repeat(100)); }", timeout_with_logs, timeout_seconds=1
    ),
}


@pytest.fixture(scope="module")
def server() -> Iterator[LangServerProcess]:
    with running_server(
        JS_POOL_PROCESSES="1",
        JS_MAX_CONCURRENCY="1",
        JS_MAX_OUTPUT_BYTES=str(MAX_OUTPUT_BYTES),
        JS_MAX_LOG_BYTES=str(MAX_LOG_BYTES),
        JS_KILL_GRACE_SECONDS="2",
    ) as proc:
        yield proc


@pytest.fixture
async def stub(server: LangServerProcess) -> AsyncIterator[langserver_pb2_grpc.LanguageServerStub]:
    async with aio_stub(server.addr) as client:
        yield client


@pytest.fixture
async def clean_fingerprint(stub: langserver_pb2_grpc.LanguageServerStub) -> dict[str, object]:
    response = await stub.Execute(request(CANARY))
    assert kind_name(response) == "OK", response
    fingerprint: dict[str, object] = json.loads(response.output_json)
    assert fingerprint["marker"] == "undefined"
    assert fingerprint["timers"] == "undefined"
    return fingerprint


def test_there_are_at_least_25_hostile_programs() -> None:
    assert len(HOSTILE) >= 25


@pytest.mark.parametrize("name", list(HOSTILE))
async def test_hostile_program_is_contained(
    stub: langserver_pb2_grpc.LanguageServerStub, clean_fingerprint: dict[str, object], name: str
) -> None:
    case = HOSTILE[name]
    started = time.monotonic()
    response = await stub.Execute(request(case.code, timeout_seconds=case.timeout_seconds))
    elapsed = time.monotonic() - started
    case.check(response)
    # Bounded by its own timeout (the sandbox answers at the timeout; the kill
    # grace is never needed for these), never by the program.
    assert elapsed < case.timeout_seconds + 1.5

    after = await stub.Execute(request(CANARY))
    assert kind_name(after) == "OK", after
    assert json.loads(after.output_json) == clean_fingerprint


async def test_state_is_invisible_to_the_next_execution(stub: langserver_pb2_grpc.LanguageServerStub) -> None:
    setter = """
    var leaked = 'var';
    globalThis.viaGlobal = 'global';
    function main() {
      counter = (typeof counter === 'number' ? counter : 0) + 1;
      Object.defineProperty(Object.prototype, 'inherited', { value: 'proto', configurable: false });
      Object.freeze(Array.prototype);
      Math.random = () => 4;
      return counter;
    }
    """
    reader = """
    function main() {
      return [typeof leaked, typeof viaGlobal, typeof counter, ({}).inherited === undefined,
              Object.isFrozen(Array.prototype), Math.random() !== 4];
    }
    """
    for _ in range(3):
        first = await stub.Execute(request(setter))
        assert kind_name(first) == "OK"
        assert first.output_json == "1"  # never sees the previous run's counter
        second = await stub.Execute(request(reader))
        assert json.loads(second.output_json) == ["undefined", "undefined", "undefined", True, False, True]
