"""Hostile programs against the full sandbox (all five layers the process can apply).

Every attack names a goal — create the marker file, connect to the loopback
listener, or return a secret (the server's environment, a readable file,
/etc/passwd) — and each test asserts the goal was *not* reached, not only that
an error came back. Resource attacks end with their typed error, and the
server keeps serving after each of them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import eventually
from tests.langserver_python_harness import KIND, Breach, RunningServer, start_server


@pytest.fixture(scope="module")
def breach() -> Iterator[Breach]:
    markers = Breach.create()
    yield markers
    markers.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, breach: Breach) -> Iterator[RunningServer]:
    running = start_server(
        tmp_path_factory.mktemp("hostile"),
        secret=breach.secret_value,
        env={"PY_MAX_OUTPUT_BYTES": str(64 * 1024), "PY_MAX_LOG_BYTES": "4096"},
    )
    yield running
    assert running.stop() == 0, running.log()


def _main(body: str, prelude: str = "") -> str:
    lines = "\n".join("    " + line for line in body.strip("\n").splitlines())
    return f"{prelude}\ndef main(input):\n{lines}\n"


# name -> code; every one must end as POLICY_VIOLATION without its goal reached.
ATTACKS: dict[str, str] = {
    # escapes through the object graph
    "subclass walk": _main("return [c for c in ().__class__.__bases__[0].__subclasses__()]"),
    "getattr dunder class": _main("return str(getattr((), '__class__'))"),
    "type() builtin": _main("return str(type(1).mro())"),
    "object builtin": _main("return str(object())"),
    "function globals": _main("def f():\n    pass\nreturn str(getattr(f, '__globals__'))"),
    "generator frame": _main("g = (x for x in [1])\nreturn str(g.gi_frame.f_back.f_globals)"),
    "generator frame via getattr": _main("g = (x for x in [1])\nreturn str(getattr(g, 'gi_frame'))"),
    "traceback frame": _main(
        "try:\n    1 / 0\nexcept Exception as e:\n    return str(getattr(e, '__traceback__').tb_frame)"
    ),
    "f-string dunder": _main("return f'{(1).__class__}'"),
    "class __dict__": _main("class A:\n    x = 1\nreturn str(A.__dict__)"),
    "dunder method definition": _main("class A:\n    def __getattr__(self, name):\n        return name\nreturn 1"),
    "metaclass keyword": _main("class X(metaclass=type):\n    pass\nreturn 1"),
    "positional-only guard shadowing": _main("def f(_getattr_, /):\n    return 1\nreturn f(1)"),
    "except* exception group": _main("try:\n    raise ValueError('x')\nexcept* ValueError:\n    pass\nreturn 1"),
    "getattr via map": _main("return str(list(map(getattr, [1], ['__class__'])))"),
    "AttributeError.obj": _main(
        "try:\n    json.nope\nexcept Exception as e:\n    return str(getattr(e, 'obj'))", "import json"
    ),
    # format-string attribute walks
    "str.format walk": _main("return '{0.__class__.__mro__}'.format(1)"),
    "str.format_map walk": _main("return '{x.__class__}'.format_map({'x': 1})"),
    "unbound str.format": _main("f = str.format\nreturn f('{0.__class__}', 1)"),
    "string.Formatter": _main("return string.Formatter().format('{0.__class__}', 1)", "import string"),
    "operator.attrgetter": _main("return str(operator.attrgetter('__class__')(1))", "import operator"),
    # builtins tampering and code execution
    "__import__": _main("return __import__('os').system('touch MARKER')"),
    "__builtins__ item": _main("return __builtins__['open']('MARKER', 'w')"),
    "eval": _main("return eval(\"__import__('os').getenv('LANGSERVER_TEST_SECRET')\")"),
    "exec": _main("exec('import os')\nreturn 1"),
    "compile builtin": _main("return str(compile('1', 'x', 'eval'))"),
    "globals builtin": _main("return str(globals())"),
    "vars builtin": _main("return str(vars())"),
    "overwrite a module function": _main("json.dumps = lambda x: 'pwned'\nreturn 1", "import json"),
    "setattr on a stdlib class": _main(
        "setattr(json.JSONEncoder, 'encode', lambda s, o: 'pwned')\nreturn 1", "import json"
    ),
    "violation caught by except Exception": _main("try:\n    import os\nexcept Exception:\n    pass\nreturn 'escaped'"),
    "violation caught by bare except": _main("try:\n    getattr(1, '__class__')\nexcept:\n    pass\nreturn 1"),
    # reachability through allowed modules
    "json submodule": _main("from json import decoder\nreturn str(decoder)"),
    "uuid.os": _main("return str(uuid.os.environ)", "import uuid"),
    "re.enum.sys": _main("return str(re.enum.sys.modules['os'].environ)", "import re"),
    "random._os": _main("return str(random._os.environ)", "import random"),
    "relative import": _main("from . import secrets\nreturn 1"),
    # modules that reach outside
    "os.system": _main("os.system('touch MARKER')\nreturn 1", "import os"),
    "os.environ": _main("return dict(os.environ)", "import os"),
    "os.getenv": _main("return os.getenv('LANGSERVER_TEST_SECRET')", "import os"),
    "sys.modules": _main("return str(sys.modules['os'].environ)", "import sys"),
    "subprocess": _main("subprocess.run(['/usr/bin/touch', 'MARKER'])\nreturn 1", "import subprocess"),
    "importlib": _main("return importlib.import_module('os').getenv('LANGSERVER_TEST_SECRET')", "import importlib"),
    "ctypes": _main("ctypes.CDLL(None).system(b'touch MARKER')\nreturn 1", "import ctypes"),
    "socket": _main("socket.create_connection(('127.0.0.1', PORT), timeout=2)\nreturn 1", "import socket"),
    "urllib.request": _main("return urllib.request.urlopen('http://127.0.0.1:PORT/').read()", "import urllib.request"),
    "pickle": _main("return pickle.loads(b\"cos\\nsystem\\n(S'touch MARKER'\\ntR.\")", "import pickle"),
    "gc.get_objects": _main("return len(gc.get_objects())", "import gc"),
    "pathlib write": _main("pathlib.Path('MARKER').write_text('x')\nreturn 1", "import pathlib"),
    "shutil": _main("shutil.copy('SECRET_FILE', 'MARKER')\nreturn 1", "import shutil"),
    "threading": _main("threading.Thread(target=print).start()\nreturn 1", "import threading"),
    "codecs.open": _main("codecs.open('MARKER', 'w').write('x')\nreturn 1", "import codecs"),
    # files and the environment
    "open for writing": _main("open('MARKER', 'w').write('breach')\nreturn 1"),
    "open a secret file": _main("return open('SECRET_FILE').read()"),
    "open /etc/passwd": _main("return open('/etc/passwd').read()"),
    "open /proc/self/environ": _main("return open('/proc/self/environ').read()"),
    "io.open": _main("return io.open('SECRET_FILE').read()", "import io"),
    "io.FileIO": _main("io.FileIO('MARKER', 'w').write(b'x')\nreturn 1", "import io"),
    "time.clock_settime": _main("time.clock_settime(0, 0)\nreturn 1", "import time"),
    "uuid.getnode": _main("return uuid.getnode()", "import uuid"),
}


def test_there_are_at_least_forty_distinct_attacks() -> None:
    assert len(ATTACKS) >= 40
    assert len(set(ATTACKS.values())) == len(ATTACKS)


@pytest.mark.parametrize("name", sorted(ATTACKS))
async def test_attack_is_refused_without_breach(name: str, server: RunningServer, breach: Breach) -> None:
    breach.reset()
    async with server.client() as client:
        response = await client.execute(breach.fill(ATTACKS[name]), "{}", timeout_seconds=5)
    breach.assert_none(response)
    assert not response.success, f"{name}: returned {response.output_json[:200]!r}"
    assert response.error.kind == KIND.ERROR_KIND_POLICY_VIOLATION, f"{name}: {response.error}"
    assert response.error.message.startswith("refused by the sandbox"), response.error.message
    assert response.output_json == ""


async def test_policy_violation_names_the_construct_and_line(server: RunningServer) -> None:
    async with server.client() as client:
        response = await client.execute("import json\n\ndef main(input):\n    import os\n    return 1\n")
    assert response.error.kind == KIND.ERROR_KIND_POLICY_VIOLATION
    assert response.error.message == "refused by the sandbox: import of module 'os'"
    assert response.error.line == 4


def _ends_quickly(started: float, limit_s: float) -> None:
    elapsed = time.monotonic() - started
    assert elapsed < limit_s, f"took {elapsed:.2f}s"


async def _still_serves(server: RunningServer) -> None:
    async with server.client() as client:
        response = await client.execute("def main(input):\n    return input + 1\n", "41")
    assert response.success, response
    assert response.output_json == "42"


async def test_infinite_loop_ends_within_timeout_plus_one_second(server: RunningServer) -> None:
    async with server.client() as client:
        started = time.monotonic()
        response = await client.execute(
            _main(
                "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass"
            ),
            timeout_seconds=1,
        )
    _ends_quickly(started, 2.0)
    assert response.error.kind == KIND.ERROR_KIND_TIMEOUT, response.error
    assert "1 s" in response.error.message
    await _still_serves(server)


@pytest.mark.parametrize(
    "body",
    [
        "x = 'a' * (2 ** 40)\nreturn len(x)",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(8 * 1024 * 1024))",
    ],
    ids=["one huge allocation", "growing list"],
)
async def test_memory_bomb_is_a_memory_limit_error(body: str, server: RunningServer) -> None:
    async with server.client() as client:
        response = await client.execute(_main(body), timeout_seconds=10)
    assert response.error.kind == KIND.ERROR_KIND_MEMORY_LIMIT, response.error
    await _still_serves(server)


async def test_fork_bomb_is_refused(server: RunningServer, breach: Breach) -> None:
    async with server.client() as client:
        response = await client.execute(_main("while True:\n    os.fork()", "import os"), timeout_seconds=5)
    assert response.error.kind == KIND.ERROR_KIND_POLICY_VIOLATION, response.error

    async def no_child_left() -> bool:
        return not server.fork_server().children()

    await eventually(no_child_left, what="no process left of the execution")
    await _still_serves(server)


async def test_huge_power_ends_with_timeout_or_memory_limit(server: RunningServer) -> None:
    async with server.client() as client:
        started = time.monotonic()
        response = await client.execute(_main("return 9 ** 9 ** 9"), timeout_seconds=2)
    _ends_quickly(started, 3.0)
    assert response.error.kind in (KIND.ERROR_KIND_TIMEOUT, KIND.ERROR_KIND_MEMORY_LIMIT), response.error
    await _still_serves(server)


async def test_deep_recursion_is_a_runtime_error_with_capped_traceback(server: RunningServer) -> None:
    code = "def down(n):\n    return down(n + 1)\n\ndef main(input):\n    return down(0)\n"
    async with server.client() as client:
        response = await client.execute(code, filename="recursive.py")
    assert response.error.kind == KIND.ERROR_KIND_RUNTIME, response.error
    assert response.error.message.startswith("RecursionError: maximum recursion depth exceeded")
    assert response.error.line == 2
    assert "more frames" in response.error.traceback
    assert response.error.traceback.count('File "recursive.py"') <= 20
    await _still_serves(server)


async def test_huge_output_is_output_too_large(server: RunningServer) -> None:
    async with server.client() as client:
        response = await client.execute(_main("return 'x' * (1024 * 1024)"))
    assert response.error.kind == KIND.ERROR_KIND_OUTPUT_TOO_LARGE, response.error
    assert response.output_json == ""
    await _still_serves(server)


async def test_huge_logs_are_truncated_not_fatal(server: RunningServer) -> None:
    async with server.client() as client:
        response = await client.execute(_main("for i in range(1000):\n    print('y' * 1000)\nreturn 'done'"))
    assert response.success
    assert response.output_json == '"done"'
    assert response.logs_truncated
    assert len(response.logs.encode()) <= 4096


async def test_error_never_carries_host_paths(server: RunningServer) -> None:
    code = _main("return json.loads('{not json')", "import json")
    async with server.client() as client:
        response = await client.execute(code, filename="parse.py")
    assert response.error.kind == KIND.ERROR_KIND_RUNTIME
    assert response.error.message.startswith("JSONDecodeError: Expecting property name")
    for text in (response.error.message, response.error.traceback):
        assert "/work" not in text
        assert "site-packages" not in text
        assert "python3" not in text
        assert str(Path(__file__).parent.parent) not in text
    assert response.error.traceback.splitlines()[1:] == [
        '  File "parse.py", line 3, in main',
        "    return json.loads('{not json')",
        response.error.message,
    ]


async def test_catastrophic_regex_is_killed_from_outside(server: RunningServer) -> None:
    # The backtracking runs in C, deaf to anything inside the interpreter.
    async with server.client() as client:
        started = time.monotonic()
        response = await client.execute(
            _main("return bool(re.match('(a+)+$', 'a' * 64 + 'b'))", "import re"), timeout_seconds=1
        )
    _ends_quickly(started, 2.0)
    assert response.error.kind == KIND.ERROR_KIND_TIMEOUT, response.error
    await _still_serves(server)
