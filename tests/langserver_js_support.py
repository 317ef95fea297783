"""Runs the real `python -m langserver_js` as a subprocess for the langserver_js tests.

The server listens on port 0 (a free port picked by the kernel) and the tests learn
the port from its "serving" log line, so parallel runs never race for a port.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import IO

import grpc
import psutil

from protos import langserver_pb2, langserver_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 60.0


class LangServerProcess:
    """One running server; `addr` is where it serves."""

    def __init__(self, proc: subprocess.Popen[bytes], log: IO[str], addr: str) -> None:
        self.proc = proc
        self.addr = addr
        self._log = log
        self.ps = psutil.Process(proc.pid)

    def logs(self) -> str:
        """Everything the server (and its sandboxes) wrote to stderr so far."""
        self._log.flush()
        self._log.seek(0)
        return self._log.read()

    def sandbox_pids(self) -> set[int]:
        """The sandbox processes currently alive."""
        return {child.pid for child in self.ps.children() if child.is_running()}

    def tree_rss_bytes(self) -> int:
        """Resident memory of the server and all its sandbox processes."""
        total = 0
        for process in [self.ps, *self.ps.children(recursive=True)]:
            try:
                total += process.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, then wait; SIGKILL if it does not exit in time. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def server_env(overrides: Mapping[str, str]) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("JS_", "LANGSERVER_"))}
    env.update({"PYTHONPATH": str(REPO_ROOT), "LANGSERVER_ADDR": "127.0.0.1:0", "LOG_LEVEL": "info"})
    env.update(overrides)
    return env


@contextmanager
def running_server(**overrides: str) -> Iterator[LangServerProcess]:
    """Starts a server with the given environment overrides; stops it afterwards."""
    with tempfile.TemporaryFile("w+", encoding="utf-8") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "langserver_js"],
            env=server_env(overrides),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            cwd=REPO_ROOT,
        )
        try:
            addr = _wait_serving(proc, log)
            server = LangServerProcess(proc, log, addr)
            yield server
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _wait_serving(proc: subprocess.Popen[bytes], log: IO[str]) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        log.flush()
        log.seek(0)
        for line in log:
            if '"serving"' in line:
                return str(json.loads(line)["addr"])
        if proc.poll() is not None:
            log.seek(0)
            raise AssertionError(f"the server exited with {proc.returncode}:\n{log.read()}")
        time.sleep(0.02)
    raise AssertionError("the server did not report serving in time")


def request(
    code: str,
    input_json: str = "null",
    *,
    timeout_seconds: int = 5,
    runtime: str = "js",
    filename: str = "",
) -> langserver_pb2.ExecuteRequest:
    return langserver_pb2.ExecuteRequest(
        task_id="test",
        runtime=runtime,
        input_json=input_json,
        timeout_seconds=timeout_seconds,
        inline_code=langserver_pb2.InlineCode(code=code, filename=filename),
    )


@contextmanager
def sync_stub(addr: str) -> Iterator[langserver_pb2_grpc.LanguageServerStub]:
    with grpc.insecure_channel(addr) as channel:
        yield langserver_pb2_grpc.LanguageServerStub(channel)


def kind_name(response: langserver_pb2.ExecuteResponse) -> str:
    """ "OK" or the error kind without its prefix ("TIMEOUT", ...), for readable asserts."""
    if response.success:
        return "OK"
    return str(langserver_pb2.ErrorKind.Name(response.error.kind)).removeprefix("ERROR_KIND_")


@asynccontextmanager
async def aio_stub(addr: str) -> AsyncIterator[langserver_pb2_grpc.LanguageServerStub]:
    async with grpc.aio.insecure_channel(addr) as channel:
        yield langserver_pb2_grpc.LanguageServerStub(channel)
