"""The coordinator's command line: `serve`, and the operator's verbs.

Exit codes: 0 success, 1 a failed operation (the error is one line on
stderr), 2 usage error, 3 invalid configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

import uvloop

from coordinator.config import CoordinatorConfig
from coordinator.errors import ConfigError, StartupError
from coordinator.server import Coordinator
from telemetry import configure_logging

__all__ = ["EXIT_CONFIG", "main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 3

log = logging.getLogger(__name__)


async def _serve(config: CoordinatorConfig) -> None:
    coordinator = Coordinator(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, coordinator.stop)
    await coordinator.run()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m coordinator", description="The workflow coordinator.")
    verbs = parser.add_subparsers(dest="verb", required=True)
    verbs.add_parser("serve", help="run the coordinator (configured by environment variables; see README)")
    return parser


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    if args.verb == "serve":
        try:
            config = CoordinatorConfig.from_env(os.environ)
            configure_logging("coordinator", config.log_level)
        except (ConfigError, ValueError) as exc:
            print(f"coordinator: invalid configuration: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        try:
            uvloop.run(_serve(config))
        except StartupError as exc:
            log.error("coordinator did not start: %s", exc)
            return EXIT_FAILED
        return EXIT_OK
    return EXIT_FAILED
