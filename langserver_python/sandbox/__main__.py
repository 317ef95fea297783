"""Entry of the fork server: `python -m langserver_python.sandbox CONTROL_FD PARENT_PID`.

Spawned by `langserver_python.pool.SandboxPool` with an empty environment and
one end of a socketpair. Protocol: the first frame in is the settings; the
first frame out is `ready` (with the start-up report) or `fatal`; then `run`/
`cancel` in and `result` out until the socket closes.
"""

from __future__ import annotations

import gc
import os
import signal
import struct
import sys

from langserver_python.protocol import ExecutionJob, SandboxSettings, decode_frame, encode_frame
from langserver_python.sandbox import libc
from langserver_python.sandbox.forkserver import ForkServer
from langserver_python.sandbox.preparation import PreparationError, prepare

EXIT_CONFIG = 3
_SELF_TEST = ExecutionJob(
    code="import json\n\ndef main(input):\n    print('self-test')\n    return json.loads(json.dumps({'echo': input}))\n",
    filename="self_test.py",
    input_json="[1, 2]",
    timeout_s=10.0,
)


def _read_exactly(fd: int, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        data = os.read(fd, size - len(chunks))
        if not data:
            raise EOFError("control socket closed")
        chunks += data
    return bytes(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main(argv: list[str]) -> int:
    control_fd, parent_pid = int(argv[1]), int(argv[2])
    # Die with the gRPC process; ignore the terminal's and the supervisor's
    # group signals: the gRPC process decides when executions stop.
    libc.prctl(libc.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        return 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    (length,) = struct.unpack("<I", _read_exactly(control_fd, 4))
    meta, _ = decode_frame(_read_exactly(control_fd, length))
    settings = SandboxSettings.from_meta(meta)
    try:
        preparation = prepare(settings)
    except PreparationError as exc:
        _write_all(control_fd, encode_frame({"op": "fatal", "message": str(exc), "config_error": exc.config_error}))
        return EXIT_CONFIG if exc.config_error else 1
    # Not before: writing our own uid_map (unprivileged network namespace) needs a dumpable process.
    libc.prctl(libc.PR_SET_DUMPABLE, 0)
    server = ForkServer(control_fd, preparation.plan)
    server.install_signal_handlers()
    result = server.run_self_test(_SELF_TEST)
    if not result.ok or result.output_json != '{"echo": [1, 2]}' or result.logs != "self-test\n":
        detail = (
            f"{result.error.kind}: {result.error.message}" if result.error else f"unexpected {result.output_json!r}"
        )
        _write_all(control_fd, encode_frame({"op": "fatal", "message": f"sandbox self-test failed: {detail}"}))
        return 1
    preparation.report["self_test_ms"] = round(result.duration_ms, 2)
    gc.freeze()
    server.send(encode_frame({"op": "ready", "report": preparation.report}))
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
