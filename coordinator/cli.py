"""The coordinator's command line: `serve`, and the operator's verbs.

    python -m coordinator serve
    python -m coordinator register FILE [FILE...]
    python -m coordinator run WORKFLOW [--input JSON|@FILE] [--version N] [--idempotency-key KEY] [--wait] [--json]
    python -m coordinator show RUN_ID [--json]
    python -m coordinator cancel RUN_ID [--reason TEXT]
    python -m coordinator dead-letters [--run RUN_ID] [--limit N] [--json]

The verbs talk to the coordinator at `COORDINATOR_ADDR` (default
`localhost:50051`), with `COORDINATOR_TOKEN` as bearer token and
`COORDINATOR_TLS_CA` for TLS.

Exit codes: 0 success, 1 a failed operation, or a run that `run --wait` saw
end other than COMPLETED (the error is one line on stderr), 2 usage error,
3 invalid configuration (`serve`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import uvloop

from coordinator.config import CoordinatorConfig
from coordinator.errors import ConfigError, StartupError
from coordinator.operator import ClientSettings, Operator, OperatorError
from coordinator.server import Coordinator
from telemetry import configure_logging

__all__ = ["EXIT_CONFIG", "EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "main", "run_operator"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3

PROG = "python -m coordinator"

log = logging.getLogger(__name__)


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """Reports a usage error as one line (and exit code 2) instead of usage text plus a line."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: {message} (see --help)")


async def _serve(config: CoordinatorConfig) -> None:
    coordinator = Coordinator(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, coordinator.stop)
    await coordinator.run()


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="The workflow coordinator, and the operator's commands.")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per call to the coordinator (default 30)")
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    verbs.add_parser("serve", help="run the coordinator (configured by environment variables; see README)")

    register = verbs.add_parser("register", help="register workflow definition files (JSON)")
    register.add_argument("files", nargs="+", metavar="FILE")

    run = verbs.add_parser("run", help="start a run of a workflow")
    run.add_argument("workflow")
    run.add_argument("--input", default="{}", help="the run input: JSON text, or @FILE (default {})")
    run.add_argument("--version", type=int, default=0, help="workflow version (default: the latest)")
    run.add_argument("--idempotency-key", default="", help="starting twice with one key returns the first run")
    run.add_argument("--wait", action="store_true", help="show each task's progress until the run ends")
    run.add_argument("--json", action="store_true", help="print JSON (with --wait: the final run)")

    show = verbs.add_parser("show", help="show a run with its tasks, attempts, errors and ignored reports")
    show.add_argument("run_id")
    show.add_argument("--json", action="store_true")

    cancel = verbs.add_parser("cancel", help="cancel a run")
    cancel.add_argument("run_id")
    cancel.add_argument("--reason", default="cancelled by operator")

    dead = verbs.add_parser("dead-letters", help="list dead-lettered tasks, newest first")
    dead.add_argument("--run", default="", help="only this run")
    dead.add_argument("--limit", type=int, default=100)
    dead.add_argument("--json", action="store_true")
    return parser


def _run_input(raw: str) -> Any:
    text = raw
    if raw.startswith("@"):
        try:
            text = Path(raw[1:]).read_text()
        except OSError as exc:
            raise _UsageError(f"{PROG} run: --input {raw}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise _UsageError(f"{PROG} run: --input is not valid JSON ({exc})") from None


def _read_files(names: Sequence[str]) -> list[tuple[str, bytes]]:
    files = []
    for name in names:
        try:
            files.append((name, Path(name).read_bytes()))
        except OSError as exc:
            raise OperatorError(f"{name}: {exc.strerror or exc}") from None
    return files


async def _operate(args: argparse.Namespace, operator: Operator, payload: Any) -> int:
    async with operator as op:
        if args.verb == "register":
            return await op.register(payload)
        if args.verb == "run":
            return await op.start(
                args.workflow,
                payload,
                version=args.version,
                idempotency_key=args.idempotency_key,
                wait=args.wait,
                as_json=args.json,
            )
        if args.verb == "show":
            return await op.show(args.run_id, as_json=args.json)
        if args.verb == "cancel":
            return await op.cancel(args.run_id, args.reason)
        if args.verb == "dead-letters":
            return await op.dead_letters(args.run, args.limit, as_json=args.json)
    raise AssertionError(f"unhandled verb {args.verb}")  # pragma: no cover


def _serve_main(environ: Mapping[str, str]) -> int:
    try:
        config = CoordinatorConfig.from_env(environ)
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


def _prepare(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[argparse.Namespace, ClientSettings, Any]:
    """Parses an operator command and reads its files (before any event loop runs)."""
    args = _parser().parse_args(argv)
    if args.timeout <= 0:
        raise _UsageError(f"{PROG}: --timeout must be positive")
    settings = ClientSettings.from_env(environ, timeout_s=args.timeout)
    payload: Any = None
    if args.verb == "register":
        payload = _read_files(args.files)
    elif args.verb == "run":
        payload = _run_input(args.input)
    return args, settings, payload


async def run_operator(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """Runs one operator verb (not `serve`) in the running event loop; prints and returns like `main`."""
    verb = ""
    try:
        args, settings, payload = _prepare(argv, environ)
        verb = args.verb
        if verb == "serve":
            raise _UsageError(f"{PROG}: serve is not an operator verb")
        return await _operate(args, Operator(settings), payload)
    except _UsageError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    except OperatorError as exc:
        print(f"{PROG} {verb}: {exc}", file=sys.stderr)
        return EXIT_FAILED


def main(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> int:
    """Runs one command and returns its exit code."""
    try:
        args = _parser().parse_args(argv)
    except _UsageError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    if args.verb == "serve":
        return _serve_main(environ)
    try:
        return asyncio.run(run_operator(argv, environ))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
