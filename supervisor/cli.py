"""`python -m supervisor`: a worker node, one role of it, or (`--dev`) the whole system on one machine.

Exit codes: 0 clean shutdown, 1 failure (a start-up step, or an unexpected
error), 2 usage, 3 invalid configuration (the supervisor's, or a child that
exited with 3), 4 a child is crash-looping, 5 forced stop by a second signal.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

from prometheus_client import start_http_server

from supervisor.config import DevConfig, Role, SupervisorConfig
from supervisor.embedded import default_data_dir
from supervisor.errors import ConfigError
from supervisor.logstream import tag_own_logs
from supervisor.node import EXIT_CONFIG, EXIT_FAILED, Node
from supervisor.worker_node import node_settings, node_stages
from telemetry import configure_logging

__all__ = ["main"]

log = logging.getLogger(__name__)

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m supervisor",
        description="Runs a worker node (language servers + worker), one role of it, or with --dev the whole system.",
    )
    parser.add_argument(
        "--role",
        choices=[r.value for r in Role],
        help="run only this part (default: SUPERVISOR_ROLE, else all)",
    )
    parser.add_argument(
        "--dev",
        action="store_true",
        help="also run embedded PostgreSQL and Redis and a coordinator, register examples/ and run the example",
    )
    parser.add_argument(
        "--data-dir",
        help="--dev: where embedded data lives (default: SUPERVISOR_DEV_DATA_DIR, else a per-user directory)",
    )
    parser.add_argument("--examples", default=str(EXAMPLES_DIR), help="--dev: the workflows to register")
    parser.add_argument("--no-example", action="store_true", help="--dev: register the examples, do not run one")
    return parser


def _install_signals(stop: asyncio.Event, force: asyncio.Event) -> None:
    """SIGTERM/SIGINT set `stop`; a second one sets `force`. The handlers do nothing else."""

    def on_signal() -> None:
        (force if stop.is_set() else stop).set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)


async def _run_node(config: SupervisorConfig) -> int:
    stop, force = asyncio.Event(), asyncio.Event()
    _install_signals(stop, force)
    if config.metrics_port:
        start_http_server(config.metrics_port, addr=config.metrics_host)
    node = Node(node_stages(config), node_settings(config))
    log.info(
        "supervisor starting",
        extra={"role": config.role.value, "spawns_language_servers": config.spawns_language_servers},
    )
    return await node.run(stop=stop, force=force)


async def _run_dev(config: SupervisorConfig, dev: DevConfig) -> int:
    from supervisor.dev import run_dev  # the --dev machinery (aiohttp endpoint, embedded servers)

    stop, force = asyncio.Event(), asyncio.Event()
    _install_signals(stop, force)
    return await run_dev(config, dev, stop=stop, force=force)


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """Parses `argv`, reads `environ`, runs, and returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        config = SupervisorConfig.from_env(environ, role=args.role)
        dev = (
            DevConfig.from_env(
                environ,
                default_data_dir=default_data_dir(),
                examples_dir=Path(args.examples),
                data_dir=args.data_dir,
                run_example=not args.no_example,
            )
            if args.dev
            else None
        )
        if dev is not None and config.role is not Role.ALL:
            raise ConfigError("--role", "--dev runs the whole system; it cannot be combined with a role")
    except ConfigError as exc:
        configure_logging("supervisor")
        tag_own_logs()
        log.error("invalid configuration: %s", exc, extra={"variable": exc.variable})
        return EXIT_CONFIG
    configure_logging("supervisor", config.log_level)
    tag_own_logs()
    try:
        if dev is not None:
            return asyncio.run(_run_dev(config, dev))
        return asyncio.run(_run_node(config))
    except ConfigError as exc:
        log.error("invalid configuration: %s", exc, extra={"variable": exc.variable})
        return EXIT_CONFIG
    except Exception:
        log.exception("supervisor crashed")
        return EXIT_FAILED
