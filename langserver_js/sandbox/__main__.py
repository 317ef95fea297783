"""Entry of a sandbox process (see `langserver_js.sandbox`); exit code 3 for bad settings."""

from __future__ import annotations

import asyncio
import os
import sys

from langserver_js.protocol import SandboxSettings
from langserver_js.sandbox.isolate import init_v8
from langserver_js.sandbox.limits import apply_process_limits
from langserver_js.sandbox.loop import serve_jobs
from telemetry.logs import configure_logging

EXIT_CONFIG = 3


def main(argv: list[str]) -> int:
    try:
        settings = SandboxSettings.from_json(argv[1])
    except (IndexError, ValueError) as exc:
        print(f"langserver_js.sandbox: invalid settings argument: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging("langserver_js.sandbox", settings.log_level)
    # The frames get private descriptors; fd 1 becomes stderr, so anything else that
    # prints (V8 diagnostics, a stray print) cannot corrupt the protocol.
    job_fd, result_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    apply_process_limits(settings)
    init_v8(settings)
    asyncio.run(serve_jobs(settings, job_fd=job_fd, result_fd=result_fd))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
