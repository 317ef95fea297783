"""`python -m langserver_python`: read the environment, configure logging, serve.

Exit codes: 0 after a clean stop, 3 for a configuration error (the message
names the variable), 1 for any other failure to start.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from langserver_python.config import ServerConfig, parse_unsafe_layers
from langserver_python.errors import ConfigError
from langserver_python.server import EXIT_CONFIG, serve
from telemetry.logs import configure_logging


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m langserver_python", description=__doc__)
    parser.add_argument(
        "--unsafe-disable-layer",
        action="append",
        default=[],
        metavar="LAYER",
        help="test-only: switch a sandbox layer off (needs LANGSERVER_UNSAFE_TEST_MODE=1)",
    )
    args = parser.parse_args(argv)
    try:
        layers = parse_unsafe_layers(args.unsafe_disable_layer, os.environ)
        config = ServerConfig.from_env(os.environ, disabled_layers=layers)
        configure_logging("langserver-python", config.log_level)
    except ConfigError as exc:
        print(f"langserver_python: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
