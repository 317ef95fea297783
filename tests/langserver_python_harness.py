"""Starts the real Python language server as a subprocess and talks gRPC to it.

Used by the `test_langserver_python_*` modules (it is not a test module itself).
Each server gets a free loopback port, `PYTHONPATH` set to the worktree root,
a log file, and optionally some sandbox layers switched off through the
test-only switch (`--unsafe-disable-layer` + `LANGSERVER_UNSAFE_TEST_MODE=1`).

Breach markers: `Breach` owns a world-writable directory (so a child that
escaped its layers *could* write there even as an unprivileged uid), a
readable secret file, a loopback TCP listener that counts connections, and a
secret value put in the server's environment. `Breach.assert_none()` checks
that none of them was touched or leaked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import langserver_pb2, langserver_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
SECRET_ENV = "LANGSERVER_TEST_SECRET"
KIND = langserver_pb2.ErrorKind


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Breach:
    """Markers an attack would leave (see the module docstring)."""

    directory: Path
    secret_value: str
    listener: socket.socket
    connections: int = 0

    @classmethod
    def create(cls) -> Breach:
        directory = Path(tempfile.mkdtemp(prefix="lsp-breach-", dir="/tmp"))
        directory.chmod(0o777)
        secret_file = directory / "secret.txt"
        secret_file.write_text(f"FILE-SECRET-{uuid.uuid4().hex}")
        secret_file.chmod(0o644)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.setblocking(False)
        return cls(directory=directory, secret_value=f"ENV-SECRET-{uuid.uuid4().hex}", listener=listener)

    @property
    def marker(self) -> Path:
        return self.directory / "marker"

    @property
    def secret_file(self) -> Path:
        return self.directory / "secret.txt"

    @property
    def port(self) -> int:
        port: int = self.listener.getsockname()[1]
        return port

    def fill(self, code: str) -> str:
        """Substitutes MARKER, SECRET_FILE and PORT in attack code."""
        return (
            code.replace("MARKER", str(self.marker))
            .replace("SECRET_FILE", str(self.secret_file))
            .replace("PORT", str(self.port))
        )

    def accepted_connections(self) -> int:
        while True:
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                return self.connections
            conn.close()
            self.connections += 1

    def leaked(self, response: langserver_pb2.ExecuteResponse) -> list[str]:
        text = "\n".join((response.output_json, response.logs, response.error.message, response.error.traceback))
        secrets = {
            "environment secret": self.secret_value,
            "secret file": self.secret_file.read_text(),
            "/etc/passwd": "root:x:0:0",
        }
        return [name for name, value in secrets.items() if value in text]

    def assert_none(self, response: langserver_pb2.ExecuteResponse | None = None) -> None:
        assert not self.marker.exists(), f"breach: {self.marker} was created"
        assert self.accepted_connections() == 0, "breach: a connection reached the loopback listener"
        if response is not None:
            assert not self.leaked(response), f"breach: leaked {self.leaked(response)}"

    def reset(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.marker.unlink()
        self.accepted_connections()
        self.connections = 0

    def close(self) -> None:
        self.listener.close()
        for path in self.directory.iterdir():
            path.unlink()
        self.directory.rmdir()


@dataclass
class RunningServer:
    addr: str
    process: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    @contextlib.asynccontextmanager
    async def client(self) -> AsyncIterator[LangClient]:
        async with grpc.aio.insecure_channel(self.addr) as channel:
            yield LangClient(langserver_pb2_grpc.LanguageServerStub(channel), channel)

    def psutil_process(self) -> psutil.Process:
        return psutil.Process(self.process.pid)

    def fork_server(self) -> psutil.Process:
        children = self.psutil_process().children()
        assert len(children) == 1, f"expected one fork server, found {children}"
        return children[0]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"server did not stop within {timeout_s}s; log:\n{self.log()}") from None


@dataclass
class LangClient:
    stub: langserver_pb2_grpc.LanguageServerStub
    channel: grpc.aio.Channel

    async def execute(
        self,
        code: str,
        input_json: str = "null",
        *,
        timeout_seconds: int = 10,
        filename: str = "main.py",
        task_id: str = "test",
    ) -> langserver_pb2.ExecuteResponse:
        request = langserver_pb2.ExecuteRequest(
            task_id=task_id,
            runtime="python",
            input_json=input_json,
            timeout_seconds=timeout_seconds,
            inline_code=langserver_pb2.InlineCode(code=code, filename=filename),
        )
        response: langserver_pb2.ExecuteResponse = await self.stub.Execute(request, timeout=timeout_seconds + 30)
        return response

    async def health(self, service: str = "") -> int:
        stub = health_pb2_grpc.HealthStub(self.channel)
        response = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        status: int = response.status
        return status


def start_server(
    log_dir: Path,
    *,
    disabled_layers: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    secret: str = "",
    wrapper: Iterable[str] = (),
) -> RunningServer:
    """Starts `python -m langserver_python` and waits until health says SERVING."""
    addr = f"127.0.0.1:{free_port()}"
    full_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(ROOT),
        "LANGSERVER_ADDR": addr,
        "LOG_LEVEL": "info",
        **(env or {}),
    }
    if secret:
        full_env[SECRET_ENV] = secret
    args = [f"--unsafe-disable-layer={layer}" for layer in disabled_layers]
    if args:
        full_env["LANGSERVER_UNSAFE_TEST_MODE"] = "1"
    log_path = log_dir / f"langserver-{addr.rsplit(':', 1)[1]}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*wrapper, sys.executable, "-m", "langserver_python", *args],
            env=full_env,
            cwd=str(ROOT),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    server = RunningServer(addr=addr, process=process, log_path=log_path, env=full_env)
    with grpc.insecure_channel(addr) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(), timeout=60, wait_for_ready=True)
        except grpc.RpcError as exc:
            process.kill()
            process.wait()
            raise AssertionError(f"server did not start ({exc}); log:\n{server.log()}") from None
    assert response.status == health_pb2.HealthCheckResponse.SERVING, server.log()
    return server
