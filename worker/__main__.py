"""``python -m worker``: read the environment, set up logging, run until SIGTERM/SIGINT.

Exit codes: 0 after a clean shutdown, 3 (``EXIT_CONFIG``) for a configuration
error (the log line names the variable), 1 for an unexpected crash.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Mapping

import uvloop

from telemetry import configure_logging
from worker.config import WorkerConfig
from worker.errors import ConfigError
from worker.worker import run_worker

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_CONFIG = 3

logger = logging.getLogger("worker")


async def _serve(config: WorkerConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await run_worker(config, stop=stop)


def main(environ: Mapping[str, str]) -> int:
    """Runs a worker configured by `environ`; returns the process exit code."""
    try:
        config = WorkerConfig.from_env(environ)
    except ConfigError as exc:
        configure_logging("worker")
        logger.error("invalid configuration: %s", exc, extra={"variable": exc.variable})
        return EXIT_CONFIG
    configure_logging("worker", config.log_level)
    try:
        uvloop.run(_serve(config))
    except ConfigError as exc:
        logger.error("invalid configuration: %s", exc, extra={"variable": exc.variable})
        return EXIT_CONFIG
    except Exception:
        logger.exception("worker crashed")
        return EXIT_CRASH
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(os.environ))
