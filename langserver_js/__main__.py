"""`python -m langserver_js`: exit 0 after a clean shutdown, 3 on bad configuration, 1 on startup failure."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from langserver_js.config import ServerConfig
from langserver_js.errors import BindError, ConfigError, PoolStartError
from langserver_js.server import serve
from telemetry.logs import configure_logging

EXIT_OK = 0
EXIT_STARTUP = 1
EXIT_CONFIG = 3

logger = logging.getLogger("langserver_js")


def main() -> int:
    configure_logging("langserver_js")
    try:
        config = ServerConfig.from_env(os.environ)
    except ConfigError as exc:
        logger.error("invalid configuration: %s", exc, extra={"variable": exc.variable})
        return EXIT_CONFIG
    configure_logging("langserver_js", config.log_level)
    try:
        asyncio.run(serve(config))
    except (BindError, PoolStartError) as exc:
        logger.error("cannot start: %s", exc)
        return EXIT_STARTUP
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
