"""Pieces of the sandbox checked on their own: module facades and the seccomp filter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest

from langserver_python.config import DEFAULT_ALLOWED_MODULES
from langserver_python.sandbox.facades import Facade, build_facades
from langserver_python.sandbox.policy import PolicyViolation, missing_facade_name
from langserver_python.sandbox.seccomp import build_program

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def facades() -> dict[str, Facade]:
    built, _ = build_facades(DEFAULT_ALLOWED_MODULES, missing_facade_name)
    return built


def test_no_facade_reaches_a_module(facades: dict[str, Facade]) -> None:
    for name, facade in facades.items():
        for attr in facade.facade_names():
            value = getattr(facade, attr)
            assert not isinstance(value, types.ModuleType), f"{name}.{attr} is a module"
            assert all(value is not forbidden for forbidden in (open, getattr, eval, exec))


def test_facades_have_no_name_and_refuse_writes(facades: dict[str, Facade]) -> None:
    json_facade = facades["json"]
    with pytest.raises(AttributeError):
        json_facade.__name__  # noqa: B018 (the lookup is the test)
    with pytest.raises(AttributeError):
        json_facade.dumps = None
    assert json_facade.dumps.__module__ == "json"


@pytest.mark.parametrize(
    ("module", "name"),
    [("operator", "attrgetter"), ("operator", "methodcaller"), ("string", "Formatter"), ("uuid", "getnode"),
     ("uuid", "os"), ("io", "open"), ("io", "FileIO"), ("json", "decoder"), ("re", "enum"), ("time", "tzset")],
)  # fmt: skip
def test_dangerous_names_are_not_exposed(facades: dict[str, Facade], module: str, name: str) -> None:
    with pytest.raises(PolicyViolation):
        getattr(facades[module], name)


def test_from_import_cannot_fall_back_to_sys_modules(facades: dict[str, Facade]) -> None:
    # CPython's import_from falls back to sys.modules["json.decoder"] when the
    # object has a __name__; a facade has none, and a missing name is refused.
    namespace = {"__builtins__": {"__import__": lambda *args, **kwargs: facades["json"]}}
    with pytest.raises(PolicyViolation):
        exec("from json import decoder", namespace)


def test_submodule_facades_nest(facades: dict[str, Facade]) -> None:
    assert isinstance(facades["collections"].abc, Facade)
    assert facades["urllib"].facade_names() == ["parse"]


_SECCOMP_PROBE = """
import ctypes, os, socket, sys
from langserver_python.sandbox import libc
from langserver_python.sandbox.seccomp import build_program
program = build_program(os.uname().machine).for_pid(os.getpid())
libc.prctl(libc.PR_SET_NO_NEW_PRIVS, 1)
libc.seccomp_set_filter(program)
os.getpid(); open(os.devnull).close(); os.kill(os.getpid(), 0)
print("allowed calls work", flush=True)
action = sys.argv[1]
if action == "socket":
    socket.socket()
elif action == "write":
    open(os.devnull, "w")
elif action == "signal-other":
    os.kill(os.getppid(), 0)
elif action == "fork":
    os.fork()
elif action == "exec":
    os.execv("/bin/true", ["true"])
sys.exit(0)
"""


@pytest.mark.parametrize("action", ["nothing", "socket", "write", "signal-other", "fork", "exec"])
def test_seccomp_filter_kills_forbidden_calls(action: str) -> None:
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("no syscall table for this architecture")
    result = subprocess.run(
        [sys.executable, "-c", _SECCOMP_PROBE, action],
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.stdout == "allowed calls work\n", result.stderr
    expected = 0 if action == "nothing" else -signal.SIGSYS
    assert result.returncode == expected, result.stderr


def test_seccomp_program_is_well_formed() -> None:
    program = build_program("x86_64")
    assert len(program.program) % 8 == 0
    assert len(program.program) // 8 < 4096  # BPF_MAXINSNS
    assert len(program.pid_offsets) == 3
    assert program.for_pid(1234) != program.program
    with pytest.raises(ValueError, match="no seccomp syscall table"):
        build_program("sparc")
