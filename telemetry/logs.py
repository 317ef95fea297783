"""One JSON log line per event, on stderr, for every process of the system.

Services log through the standard library (`logging.getLogger(__name__)` with
`%s` arguments, and `extra={...}` for fields); this module renders every record
as one JSON object carrying the service name and pid, so a supervisor can merge
the streams of its children and an operator can filter them with `jq`.
"""

from __future__ import annotations

import logging
import os
import sys
from urllib.parse import urlsplit, urlunsplit

import structlog

__all__ = ["configure_logging", "redact_url"]

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(service: str, level: str = "info") -> None:
    """Routes all logging of this process to stderr as JSON lines.

    Args:
        service: the process's role, added to every line (e.g. "coordinator").
        level: debug, info, warning or error.

    Raises:
        ValueError: `level` is not one of those names.
    """
    if level.lower() not in _LEVELS:
        raise ValueError(f"log level must be one of {', '.join(_LEVELS)}, not {level!r}")
    pid = os.getpid()

    def add_service(_: object, __: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
        event.setdefault("service", service)
        event.setdefault("pid", pid)
        return event

    shared: list[structlog.typing.Processor] = [
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_service,
    ]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level.lower()])
    # Library chatter at INFO (connection churn) is noise in production logs.
    for noisy in ("asyncio", "grpc", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def redact_url(url: str) -> str:
    """Returns `url` with any password replaced, safe to log."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))
