"""The service contract: benign programs, typed errors, request validation, health."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from protos import langserver_pb2
from tests.langserver_python_harness import KIND, RunningServer, start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(
        tmp_path_factory.mktemp("service"),
        env={
            "PY_MAX_CODE_BYTES": "4096",
            "PY_MAX_INPUT_BYTES": "2048",
            "PY_DEFAULT_TIMEOUT_SECONDS": "1",
            "PY_MAX_TIMEOUT_SECONDS": "2",
        },
    )
    yield running
    assert running.stop() == 0, running.log()


# Benign programs: valid plain Python too, so the expected output is what the
# same program returns when run unrestricted in this test process.
BENIGN: dict[str, tuple[str, Any]] = {
    "json handling": (
        "import json\n\n"
        "def main(input):\n"
        "    doc = json.loads(json.dumps(input))\n"
        "    doc['items'] = [dict(item, total=item['qty'] * item['price']) for item in doc['items']]\n"
        "    doc['sum'] = sum(item['total'] for item in doc['items'])\n"
        "    return doc\n",
        {"items": [{"qty": 2, "price": 1.5}, {"qty": 3, "price": 2}]},
    ),
    "math": (
        "import math\n\ndef main(input):\n"
        "    return [math.sqrt(input), math.factorial(10), round(math.pi, 6), math.gcd(84, 36), 2 ** 100]\n",
        16,
    ),
    "regex": (
        "import re\n\n"
        "WORD = re.compile(r'[a-z]+')\n\n"
        "def main(input):\n"
        "    words = WORD.findall(input.lower())\n"
        "    shout = re.sub(r'\\b(\\w)', lambda m: m.group(1).upper(), input)\n"
        "    return {'words': words, 'shout': shout, 'match': bool(re.fullmatch(r'\\d{3}-\\d{4}', '555-1234'))}\n",
        "hello wide World",
    ),
    "datetime": (
        "import datetime\n\n"
        "def main(input):\n"
        "    start = datetime.datetime.fromisoformat(input)\n"
        "    later = start + datetime.timedelta(days=45, hours=3)\n"
        "    parsed = datetime.datetime.strptime('2024-02-29 12:30', '%Y-%m-%d %H:%M')\n"
        "    return [later.isoformat(), later.strftime('%A %d %B %Y'), parsed.weekday(), (later - start).days]\n",
        "2024-01-31T08:00:00",
    ),
    "decimal and fractions": (
        "import decimal\nfrom fractions import Fraction\n\n"
        "def main(input):\n"
        "    context = decimal.getcontext()\n"
        "    context.prec = 6\n"
        "    return [str(decimal.Decimal(1) / decimal.Decimal(7)), str(Fraction(3, 4) + Fraction(1, 6))]\n",
        None,
    ),
    "statistics, collections, itertools, functools": (
        "import statistics\nimport itertools\nimport functools\n"
        "from collections import Counter, defaultdict, deque, namedtuple\n\n"
        "Point = namedtuple('Point', ['x', 'y'])\n\n"
        "@functools.lru_cache(maxsize=None)\n"
        "def fib(n):\n"
        "    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n"
        "def main(input):\n"
        "    groups = defaultdict(list)\n"
        "    for key, items in itertools.groupby(sorted(input), key=lambda v: v % 3):\n"
        "        groups[key] = list(items)\n"
        "    window = deque(input, maxlen=3)\n"
        "    p = Point(1, 2)\n"
        "    return {'mean': statistics.mean(input), 'median': statistics.median(input),\n"
        "            'common': Counter(input).most_common(1), 'groups': groups, 'window': list(window),\n"
        "            'fib': fib(50), 'point': [p.x, p.y], 'product': functools.reduce(lambda a, b: a * b, input)}\n",
        [3, 1, 4, 1, 5, 9, 2, 6],
    ),
    "hashing and encoding": (
        "import hashlib, base64, uuid, hmac, zlib, binascii\n\n"
        "def main(input):\n"
        "    data = input.encode()\n"
        "    return [hashlib.sha256(data).hexdigest(), base64.b64encode(data).decode(),\n"
        "            str(uuid.uuid5(uuid.NAMESPACE_URL, input)), hmac.new(b'k', data, 'sha256').hexdigest(),\n"
        "            zlib.crc32(data), binascii.hexlify(data).decode()]\n",
        "héllo ☃",
    ),
    "classes and attributes": (
        "class Account:\n"
        "    def __init__(self, owner, balance):\n"
        "        self.owner = owner\n"
        "        self.balance = balance\n"
        "    def deposit(self, amount):\n"
        "        self.balance = self.balance + amount\n"
        "        return self\n"
        "    def __lt__(self, other):\n"
        "        return self.balance < other.balance\n\n"
        "class Savings(Account):\n"
        "    rate = 0.02\n\n"
        "def main(input):\n"
        "    accounts = [Savings(name, amount).deposit(10) for name, amount in input.items()]\n"
        "    accounts.sort()\n"
        "    return [[a.owner, a.balance, a.rate] for a in accounts]\n",
        {"ann": 30, "bob": 5, "cy": 20},
    ),
    "strings, generators, builtins": (
        "def evens(limit):\n"
        "    for n in range(limit):\n"
        "        if n % 2 == 0:\n"
        "            yield n\n\n"
        "def main(input):\n"
        "    total = 0\n"
        "    total += sum(evens(input))\n"
        "    pairs = list(zip('abc', reversed(range(3))))\n"
        "    text = ', '.join(f'{k}={v:>3}' for k, v in sorted(pairs))\n"
        "    try:\n"
        "        int('not a number')\n"
        "    except ValueError as exc:\n"
        "        caught = str(exc)\n"
        "    return {'total': total, 'text': text, 'upper': 'abc'.upper().split('B'), 'pct': '%d%%' % 50,\n"
        "            'caught': caught, 'enum': list(enumerate(tuple('xy'))), 'minmax': [min(3, 1), max([4, 2])],\n"
        "            'any': any(x > 2 for x in [1, 3]), 'set': sorted({3, 1, 3}), 'unicode': 'snow ☃'}\n",
        10,
    ),
    "text modules": (
        "import textwrap, html, csv, io, string\nfrom urllib.parse import urlencode, quote\n"
        "from collections.abc import Mapping\n\n"
        "def main(input):\n"
        "    rows = list(csv.reader(['a,b', '1,\"x,y\"']))\n"
        "    buffer = io.StringIO()\n"
        "    buffer.write('written')\n"
        "    return [textwrap.wrap(input, 10), html.escape('<a href=\"x\">'), rows, buffer.getvalue(),\n"
        "            urlencode({'q': input}), quote('a b/c'), string.Template('$x!').substitute(x=1),\n"
        "            string.ascii_lowercase[:5], isinstance({}, Mapping)]\n",
        "the quick brown fox jumps over the lazy dog",
    ),
}


def _expected(code: str, value: Any) -> Any:
    namespace: dict[str, Any] = {"__name__": "expected"}
    exec(compile(code, "expected.py", "exec"), namespace)
    return json.loads(json.dumps(namespace["main"](json.loads(json.dumps(value))), ensure_ascii=False))


@pytest.mark.parametrize("name", sorted(BENIGN))
async def test_benign_program_gives_the_right_output(name: str, server: RunningServer) -> None:
    code, value = BENIGN[name]
    async with server.client() as client:
        response = await client.execute(code, json.dumps(value))
    assert response.success, response.error
    assert json.loads(response.output_json) == _expected(code, value)
    assert response.duration_ms > 0


async def test_print_goes_to_logs_and_unicode_output_stays_readable(server: RunningServer) -> None:
    code = "def main(input):\n    print('hello', input)\n    print('line two')\n    return 'héllo ☃'\n"
    async with server.client() as client:
        response = await client.execute(code, '"world"')
    assert response.success
    assert response.logs == "hello world\nline two\n"
    assert not response.logs_truncated
    assert response.output_json == '"héllo ☃"'


async def test_each_execution_gets_fresh_randomness_and_state(server: RunningServer) -> None:
    code = "import random\nseen = []\n\ndef main(input):\n    seen.append(1)\n    return [random.random(), len(seen)]\n"
    async with server.client() as client:
        first = json.loads((await client.execute(code)).output_json)
        second = json.loads((await client.execute(code)).output_json)
    assert first[0] != second[0]
    assert first[1] == second[1] == 1


async def test_empty_input_is_null(server: RunningServer) -> None:
    async with server.client() as client:
        response = await client.execute("def main(input):\n    return input is None\n", "")
    assert response.output_json == "true"


@pytest.mark.parametrize(
    ("code", "kind", "message", "line"),
    [
        ("def main(input):\n    return (1,\n", KIND.ERROR_KIND_SYNTAX, "'(' was never closed", 2),
        ("x = 1\ndef main(input)\n    return x\n", KIND.ERROR_KIND_SYNTAX, "expected ':'", 2),
        ("def helper():\n    pass\n", KIND.ERROR_KIND_RUNTIME, "the code must define a function main(input)", 0),
        (
            "def main(input):\n    return {1, 2}\n",
            KIND.ERROR_KIND_RUNTIME,
            "main() returned a value that is not JSON",
            0,
        ),
        (
            "def main(input):\n    return float('nan')\n",
            KIND.ERROR_KIND_RUNTIME,
            "main() returned a value that is not JSON",
            0,
        ),
        ("def main(input):\n    raise ValueError('bad input')\n", KIND.ERROR_KIND_RUNTIME, "ValueError: bad input", 2),
        ("raise SystemExit(3)\n", KIND.ERROR_KIND_RUNTIME, "SystemExit: 3", 1),
    ],
)
async def test_typed_errors(code: str, kind: int, message: str, line: int, server: RunningServer) -> None:
    async with server.client() as client:
        response = await client.execute(code)
    assert not response.success
    assert response.error.kind == kind, response.error
    assert response.error.message.startswith(message), response.error.message
    assert response.error.line == line


async def test_runtime_traceback_holds_user_frames_only(server: RunningServer) -> None:
    code = "import json\n\ndef parse(text):\n    return json.loads(text)\n\ndef main(input):\n    return parse(input)\n"
    async with server.client() as client:
        response = await client.execute(code, '"{oops"', filename="transform.py")
    assert response.error.traceback.splitlines() == [
        "Traceback (most recent call last):",
        '  File "transform.py", line 7, in main',
        "    return parse(input)",
        '  File "transform.py", line 4, in parse',
        "    return json.loads(text)",
        response.error.message,
    ]
    assert response.error.line == 4


async def test_default_timeout_applies_when_request_sends_none(server: RunningServer) -> None:
    async with server.client() as client:
        started = time.monotonic()
        response = await client.execute("def main(input):\n    while True:\n        pass\n", timeout_seconds=0)
    assert response.error.kind == KIND.ERROR_KIND_TIMEOUT
    assert response.error.message == "the execution exceeded its time limit of 1 s"
    assert time.monotonic() - started < 2.0


async def test_requested_timeout_is_capped(server: RunningServer) -> None:
    async with server.client() as client:
        started = time.monotonic()
        response = await client.execute("def main(input):\n    while True:\n        pass\n", timeout_seconds=100)
    assert response.error.message == "the execution exceeded its time limit of 2 s"
    assert time.monotonic() - started < 3.0


def _request(**changes: Any) -> langserver_pb2.ExecuteRequest:
    request = langserver_pb2.ExecuteRequest(
        task_id="t",
        runtime="python",
        input_json="{}",
        inline_code=langserver_pb2.InlineCode(code="def main(input):\n    return 1\n", filename="main.py"),
    )
    for name, value in changes.items():
        if name == "code":
            request.inline_code.code = value
        elif name == "filename":
            request.inline_code.filename = value
        elif name == "no_payload":
            request.ClearField("inline_code")
        else:
            setattr(request, name, value)
    return request


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"runtime": "js"}, "runtime"),
        ({"runtime": ""}, "runtime"),
        ({"no_payload": True}, "inline_code"),
        ({"code": ""}, "inline_code.code"),
        ({"code": "   \n"}, "inline_code.code"),
        ({"code": "x = 1\n" * 1000}, "inline_code.code"),
        ({"filename": "../../etc/passwd"}, "inline_code.filename"),
        ({"filename": "/abs.py"}, "inline_code.filename"),
        ({"input_json": "{not json"}, "input_json"),
        ({"input_json": "[" + "1," * 2000 + "1]"}, "input_json"),
        ({"task_id": "t" * 1000}, "task_id"),
    ],
)
async def test_bad_request_is_invalid_argument_naming_the_field(
    changes: dict[str, Any], field: str, server: RunningServer
) -> None:
    async with server.client() as client:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.stub.Execute(_request(**changes), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith(f"{field}: ")


async def test_health_reports_serving(server: RunningServer) -> None:
    async with server.client() as client:
        assert await client.health() == health_pb2.HealthCheckResponse.SERVING
        assert await client.health("langserver.v1.LanguageServer") == health_pb2.HealthCheckResponse.SERVING


async def test_lone_surrogates_stay_valid_json_and_utf8(server: RunningServer) -> None:
    code = "def main(input):\n    print('\\ud800 in logs')\n    return ['\\ud800', 'é']\n"
    async with server.client() as client:
        response = await client.execute(code)
    assert response.success, response.error
    assert json.loads(response.output_json) == ["\ud800", "é"]
    assert response.logs == "? in logs\n"
