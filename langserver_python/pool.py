"""The gRPC process's side of the fork server: spawn it, talk to it, replace it.

`SandboxPool.run()` spawns `python -m langserver_python.sandbox` over a Unix
socketpair — with an empty environment apart from `PYTHONPATH` (this process's
`sys.path`), so no secret
of this process is in the fork server's (or a child's) `/proc/self/environ` —
sends the settings, waits for `ready`, and then routes `result` frames to the
waiting `execute()` calls. The fork server is spawned (fork + exec), never
forked from this process, which may run gRPC threads.

If the fork server dies, executions in flight end with an INTERNAL error (the
server itself keeps serving), health turns NOT_SERVING, and a new fork server
is spawned with backoff. A fork server that fails its *first* start ends
`run()` with `SandboxStartError`, which `__main__` turns into an exit code.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import langserver_python
from langserver_python.errors import SandboxStartError, SandboxUnavailable
from langserver_python.protocol import (
    ErrorKind,
    ExecutionError,
    ExecutionJob,
    ExecutionResult,
    FrameError,
    SandboxSettings,
    decode_frame,
    encode_frame,
)

__all__ = ["SandboxPool"]

logger = logging.getLogger(__name__)

_START_TIMEOUT_S = 60.0
#: How long past its own deadline an execution may take before we stop waiting
#: for the fork server (which kills at the deadline itself).
_ANSWER_GRACE_S = 10.0
_BACKOFF_INITIAL_S = 0.1
_BACKOFF_MAX_S = 5.0
_MAX_RESULT_FRAME = 256 * 1024 * 1024


def _crashed(message: str) -> ExecutionResult:
    return ExecutionResult(error=ExecutionError(kind=ErrorKind.INTERNAL, message=message))


async def _read_frame(reader: asyncio.StreamReader) -> tuple[dict[str, Any], list[bytes]]:
    (length,) = struct.unpack("<I", await reader.readexactly(4))
    if length > _MAX_RESULT_FRAME:
        raise FrameError(f"frame of {length} bytes from the fork server")
    return decode_frame(await reader.readexactly(length))


class SandboxPool:
    """Runs jobs in the fork server (see the module docstring).

    Args:
        settings: sent to the fork server as its first frame.
        on_availability: called with True when a fork server is ready and
            False when it went away (health status).
    """

    def __init__(self, settings: SandboxSettings, *, on_availability: Callable[[bool], Awaitable[None]]) -> None:
        self._settings = settings
        self._on_availability = on_availability
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[ExecutionResult]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._first_start: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._stopping = asyncio.Event()
        self._process: subprocess.Popen[bytes] | None = None

    async def wait_ready(self) -> dict[str, Any]:
        """Waits for the first fork server; returns its start-up report.

        Raises:
            SandboxStartError: it could not start.
        """
        return await asyncio.shield(self._first_start)

    async def run(self) -> None:
        """Keeps a fork server running until `stop()`; the owner awaits this."""
        backoff = _BACKOFF_INITIAL_S
        while not self._stopping.is_set():
            try:
                await self._run_once()
                backoff = _BACKOFF_INITIAL_S
            except SandboxStartError as exc:
                if not self._first_start.done():
                    self._first_start.set_exception(exc)
                    return
                logger.error("fork server failed to restart: %s", exc)
            if self._stopping.is_set():
                return
            logger.error("fork server exited; restarting in %.1f s", backoff)
            try:
                async with asyncio.timeout(backoff):
                    await self._stopping.wait()
            except TimeoutError:
                pass
            backoff = min(backoff * 2, _BACKOFF_MAX_S)

    async def stop(self) -> None:
        """Closes the control socket: the fork server kills what runs and exits. Idempotent."""
        self._stopping.set()
        if self._writer is not None:
            self._writer.close()

    async def execute(self, job: ExecutionJob) -> ExecutionResult:
        """Runs one job; anything the user code does comes back as a result.

        Raises:
            SandboxUnavailable: no fork server is running right now.

        Safe to cancel: the fork server is told to kill the child.
        """
        writer = self._writer
        if writer is None or writer.is_closing():
            raise SandboxUnavailable("the sandbox is restarting")
        request_id = next(self._ids)
        future: asyncio.Future[ExecutionResult] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        meta = {"op": "run", "id": request_id, "filename": job.filename, "timeout_s": job.timeout_s}
        writer.write(encode_frame(meta, (job.code.encode(errors="replace"), job.input_json.encode(errors="replace"))))
        try:
            async with asyncio.timeout(job.timeout_s + _ANSWER_GRACE_S):
                return await future
        except TimeoutError:
            self._send_cancel(request_id)
            return _crashed("the sandbox did not answer in time")
        except asyncio.CancelledError:
            self._send_cancel(request_id)
            raise
        finally:
            self._pending.pop(request_id, None)

    def _send_cancel(self, request_id: int) -> None:
        writer = self._writer
        if writer is not None and not writer.is_closing():
            writer.write(encode_frame({"op": "cancel", "id": request_id}))

    def _spawn(self) -> tuple[subprocess.Popen[bytes], socket.socket]:
        ours, theirs = socket.socketpair()
        # The fork server must import exactly what this process imports: same package, same sys.path.
        package_root = str(Path(langserver_python.__file__).resolve().parent.parent)
        search_path = os.pathsep.join(dict.fromkeys([package_root, *(p for p in sys.path if p and os.path.isdir(p))]))
        try:
            process = subprocess.Popen(
                [sys.executable, "-s", "-m", "langserver_python.sandbox", str(theirs.fileno()), str(os.getpid())],
                pass_fds=[theirs.fileno()],
                env={"PYTHONPATH": search_path},
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd="/",
            )
        finally:
            theirs.close()
        return process, ours

    async def _run_once(self) -> None:
        try:
            process, sock = self._spawn()
        except OSError as exc:
            raise SandboxStartError(f"cannot spawn the fork server: {exc}", config_error=False) from None
        self._process = process
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 20)
        meta: dict[str, Any] = {}
        try:
            writer.write(encode_frame(self._settings.to_meta()))
            try:
                async with asyncio.timeout(_START_TIMEOUT_S):
                    meta, _ = await _read_frame(reader)
            except (asyncio.IncompleteReadError, FrameError, TimeoutError, ConnectionError) as exc:
                raise SandboxStartError(f"the fork server did not start ({exc!r})", config_error=False) from None
            if meta.get("op") != "ready":
                raise SandboxStartError(str(meta.get("message")), config_error=meta.get("config_error") is True)
            self._writer = writer
            if not self._first_start.done():
                self._first_start.set_result(meta.get("report", {}))
            else:
                logger.warning("a replacement fork server is ready", extra={"sandbox": meta.get("report", {})})
            await self._on_availability(True)
            await self._read_results(reader)
        finally:
            self._writer = None
            writer.close()
            for future in self._pending.values():
                if not future.done():
                    future.set_result(_crashed("the sandbox process pool exited during the execution"))
            await asyncio.to_thread(self._reap, process)
            # A fork server that was killed could not remove its working directory.
            work_dir = meta.get("report", {}).get("work_dir") if meta.get("op") == "ready" else None
            if isinstance(work_dir, str) and Path(work_dir).name.startswith("langserver-py-"):
                await asyncio.to_thread(shutil.rmtree, work_dir, True)
            await self._on_availability(False)

    async def _read_results(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                meta, blobs = await _read_frame(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            except FrameError:
                logger.exception("malformed frame from the fork server; replacing it")
                return
            if meta.get("op") != "result":
                continue
            future = self._pending.get(int(meta.get("id", -1)))
            if future is None or future.done():
                continue  # cancelled or timed out meanwhile
            try:
                future.set_result(ExecutionResult.from_frame(meta, blobs))
            except FrameError as exc:
                future.set_result(_crashed(f"the sandbox sent a malformed result ({exc})"))

    @staticmethod
    def _reap(process: subprocess.Popen[bytes]) -> None:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
