"""The job loop of a sandbox process: read a job, run it, answer, prepare the next isolate.

The process serves one execution at a time. Its answer goes out before the used
isolate is disposed of, so disposal and the creation of the next isolate overlap
with the server handling the result; "ready" follows once the next isolate exists.
"""

from __future__ import annotations

import asyncio
import logging
import os

from langserver_js.errors import WorkerDied
from langserver_js.protocol import ExecuteJob, ExecutionResult, SandboxSettings, Status, encode_frame, read_frame
from langserver_js.sandbox.isolate import PreparedIsolate

__all__ = ["serve_jobs"]

logger = logging.getLogger(__name__)

_READY = encode_frame({"type": "ready"})


async def serve_jobs(settings: SandboxSettings, *, job_fd: int, result_fd: int) -> None:
    """Serves jobs from `job_fd` until it closes (the server's way of saying stop).

    Raises:
        ProtocolError: the server sent something that is not a job (a bug).
        JSEvalException, TypeError: an isolate could not be prepared; the process
            should exit and be replaced.
    """
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 16)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(job_fd, "rb", buffering=0)
    )
    isolate = PreparedIsolate.create(loop, settings)
    try:
        _write(result_fd, _READY)
        while True:
            try:
                message = await read_frame(reader, max_bytes=settings.max_job_frame_bytes())
            except WorkerDied:
                return
            job = ExecuteJob.from_message(message)
            result = await _execute(isolate, job)
            _write(result_fd, result.to_frame())
            isolate.close()
            isolate = PreparedIsolate.create(loop, settings)
            _write(result_fd, _READY)
    except BrokenPipeError:
        return  # the server went away; nobody is left to answer
    finally:
        isolate.close()
        transport.close()


async def _execute(isolate: PreparedIsolate, job: ExecuteJob) -> ExecutionResult:
    try:
        return await isolate.execute(job)
    except Exception:
        logger.exception("the sandbox failed to run a job", extra={"task_id": job.task_id})
        return ExecutionResult(status=Status.INTERNAL, message="the sandbox failed to run the code")


def _write(fd: int, data: bytes) -> None:
    """Writes a whole frame to the (blocking) result pipe."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
