"""Each sandbox layer proves itself alone.

Servers here run with some layers switched off by the test-only switch
(`--unsafe-disable-layer`, honoured only with `LANGSERVER_UNSAFE_TEST_MODE=1`).
The same three attacks — write a file, connect to a loopback listener, start a
subprocess — are plain Python, so they only make sense with the language layer
off. A control server with *every* layer off shows each attack really works
when nothing stops it; then the interpreter layer alone and the kernel layer
alone each stop all three, the process layer alone stops what it can
(processes, file contents, other users' files, the environment), and the
language layer alone refuses the code before it runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.langserver_python_harness import KIND, SECRET_ENV, Breach, RunningServer, start_server

ALL_LAYERS = ("language", "interpreter", "process", "kernel")

FILE_WRITE = "def main(input):\n    with open('MARKER', 'w') as f:\n        f.write('breach')\n    return 'written'\n"
SOCKET_CONNECT = (
    "import socket\n\n"
    "def main(input):\n"
    "    s = socket.create_connection(('127.0.0.1', PORT), timeout=3)\n"
    "    s.sendall(b'breach')\n"
    "    s.close()\n"
    "    return 'connected'\n"
)
SUBPROCESS = (
    "import subprocess\n\n"
    "def main(input):\n"
    "    subprocess.run(['/usr/bin/touch', 'MARKER'], check=True)\n"
    "    return 'spawned'\n"
)
ATTACKS = {"file write": FILE_WRITE, "socket connection": SOCKET_CONNECT, "subprocess": SUBPROCESS}


@pytest.fixture
def breach() -> Iterator[Breach]:
    markers = Breach.create()
    yield markers
    markers.close()


def _server_with_only(
    layers: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory, secret: str = "unused"
) -> Iterator[RunningServer]:
    off = [layer for layer in ALL_LAYERS if layer not in layers]
    running = start_server(tmp_path_factory.mktemp("layers"), disabled_layers=off, secret=secret)
    log = running.log()
    for layer in off:
        assert f"sandbox layer {layer} is OFF" in log
    yield running
    assert running.stop() == 0, running.log()


@pytest.fixture(scope="module")
def no_layers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    yield from _server_with_only((), tmp_path_factory)


@pytest.fixture(scope="module")
def interpreter_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    yield from _server_with_only(("interpreter",), tmp_path_factory)


@pytest.fixture(scope="module")
def kernel_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    for running in _server_with_only(("kernel",), tmp_path_factory):
        if '"seccomp": "unavailable' in running.log() or '"landlock": "unavailable' in running.log():
            running.stop()
            pytest.skip("this kernel offers no seccomp or no Landlock")
        yield running


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop (and what it protects) needs root")


@pytest.fixture(scope="module")
def process_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    yield from _server_with_only(("process",), tmp_path_factory, secret="PROCESS-LAYER-SECRET")


@pytest.fixture(scope="module")
def language_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    yield from _server_with_only(("language",), tmp_path_factory)


@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_control_every_attack_works_with_no_layer(attack: str, no_layers: RunningServer, breach: Breach) -> None:
    async with no_layers.client() as client:
        response = await client.execute(breach.fill(ATTACKS[attack]))
    assert response.success, response.error
    if attack == "socket connection":
        assert breach.accepted_connections() == 1
    else:
        assert breach.marker.exists()


@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_interpreter_layer_alone_stops(attack: str, interpreter_only: RunningServer, breach: Breach) -> None:
    async with interpreter_only.client() as client:
        response = await client.execute(breach.fill(ATTACKS[attack]))
    breach.assert_none(response)
    assert response.error.kind == KIND.ERROR_KIND_POLICY_VIOLATION, response.error
    assert "refused by the interpreter audit hook" in response.error.message


@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_kernel_layer_alone_stops(attack: str, kernel_only: RunningServer, breach: Breach) -> None:
    async with kernel_only.client() as client:
        response = await client.execute(breach.fill(ATTACKS[attack]))
    breach.assert_none(response)
    assert response.error.kind == KIND.ERROR_KIND_POLICY_VIOLATION, response.error
    assert "seccomp" in response.error.message


async def test_kernel_layer_alone_refuses_reads_outside_the_library(kernel_only: RunningServer, breach: Breach) -> None:
    # Landlock: reading is allowed beneath the Python library only.
    code = "def main(input):\n    return open('SECRET_FILE').read()\n"
    async with kernel_only.client() as client:
        response = await client.execute(breach.fill(code))
    breach.assert_none(response)
    assert response.error.kind == KIND.ERROR_KIND_RUNTIME
    assert response.error.message.startswith("PermissionError")


@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_language_layer_alone_refuses(attack: str, language_only: RunningServer, breach: Breach) -> None:
    async with language_only.client() as client:
        response = await client.execute(breach.fill(ATTACKS[attack]))
    breach.assert_none(response)
    assert response.error.kind == KIND.ERROR_KIND_POLICY_VIOLATION, response.error


FORK_EXEC = (
    "import os\n\n"
    "def main(input):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        os.execv('/usr/bin/touch', ['touch', 'MARKER'])\n"
    "    os.waitpid(pid, 0)\n"
    "    return 'forked'\n"
)


async def test_process_layer_alone_stops_subprocesses(process_only: RunningServer, breach: Breach) -> None:
    # As root RLIMIT_NPROC is ignored: as root this passes only because the child dropped to its slot's uid.
    async with process_only.client() as client:
        response = await client.execute(breach.fill(FORK_EXEC))
    breach.assert_none(response)
    assert response.error.kind == KIND.ERROR_KIND_RUNTIME
    assert "Resource temporarily unavailable" in response.error.message


async def test_process_layer_alone_writes_no_file_contents(process_only: RunningServer, breach: Breach) -> None:
    async with process_only.client() as client:
        response = await client.execute(breach.fill(FILE_WRITE))
    assert response.error.kind == KIND.ERROR_KIND_RUNTIME
    assert "File too large" in response.error.message  # RLIMIT_FSIZE 0
    assert not breach.marker.exists() or breach.marker.read_bytes() == b""


@ROOT_ONLY
async def test_process_layer_alone_cannot_touch_root_files(
    process_only: RunningServer, tmp_path: Path, breach: Breach
) -> None:
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    code = f"def main(input):\n    open('{private}/x', 'w')\n    return 1\n"
    async with process_only.client() as client:
        response = await client.execute(code)
    assert response.error.kind == KIND.ERROR_KIND_RUNTIME
    assert response.error.message.startswith("PermissionError")
    assert list(private.iterdir()) == []


@ROOT_ONLY
async def test_process_layer_alone_hides_the_environment(process_only: RunningServer) -> None:
    server_pid = process_only.process.pid
    code = (
        "import os\n\n"
        "def main(input):\n"
        f"    found = [os.environ.get('{SECRET_ENV}'), dict(os.environ), os.getcwd(), os.listdir('.')]\n"
        "    try:\n"
        f"        found.append(open('/proc/{server_pid}/environ').read())\n"
        "    except OSError as exc:\n"
        "        found.append(type(exc).__name__)\n"
        "    return found\n"
    )
    async with process_only.client() as client:
        response = await client.execute(code)
    assert response.success, response.error
    assert "PROCESS-LAYER-SECRET" not in response.output_json
    env_value, environ, cwd, listing, proc_environ = json.loads(response.output_json)
    assert env_value is None
    assert environ == {}
    assert listing == []
    assert proc_environ == "PermissionError"
    assert os.path.basename(cwd).startswith("langserver-py-")
