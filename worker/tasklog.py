"""Per-task structured logging: every line about a task carries its identity.

Lines are rendered as JSON by ``telemetry.configure_logging``; the adapter adds
``task_id``, ``run_id``, ``node_id``, ``attempt`` and ``worker_id`` as fields,
merged with any ``extra`` the call passes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from typing import Any

from protos.taskstream import TaskMessage

__all__ = ["TaskLogger", "task_logger"]


class TaskLogger(logging.LoggerAdapter[logging.Logger]):
    """A LoggerAdapter that merges its fields with the call's ``extra`` instead of replacing them."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        fields: dict[str, Any] = dict(self.extra or {})
        call_extra = kwargs.get("extra")
        if isinstance(call_extra, Mapping):
            fields.update(call_extra)
        kwargs["extra"] = fields
        return msg, kwargs


def task_logger(logger: logging.Logger, message: TaskMessage, worker_id: str) -> TaskLogger:
    """Returns `logger` bound to the task of `message`."""
    return TaskLogger(
        logger,
        {
            "task_id": message.task_id,
            "run_id": message.run_id,
            "node_id": message.node_id,
            "attempt": message.attempt,
            "worker_id": worker_id,
        },
    )
