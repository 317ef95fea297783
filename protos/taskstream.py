"""The Redis Streams contract between the coordinator and the workers.

The coordinator's outbox relay publishes one message per task dispatch to the
stream of the task's queue and shard; workers read those streams through one
consumer group. Both sides import this module, so the names, the sharding rule
and the message schema have exactly one definition.

A message carries a single field, ``task``, holding the JSON encoding of a
:class:`TaskMessage`.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CONSUMER_GROUP",
    "MESSAGE_FIELD",
    "SHARD_COUNT_KEY",
    "InvalidTaskMessage",
    "TaskMessage",
    "queue_streams",
    "shard_for",
    "stream_name",
]

#: Every worker reads through this one group; the consumer name is the worker id.
CONSUMER_GROUP = "workers"
#: The coordinator keeps the number of shards per queue here, for workers to discover.
SHARD_COUNT_KEY = "wf:shards"
#: The stream entry field that holds the encoded task message.
MESSAGE_FIELD = "task"

_STREAM_PREFIX = "wf:tasks"


def stream_name(queue: str, shard: int) -> str:
    """Returns the stream of one shard of a queue, e.g. ``wf:tasks:http:3``."""
    return f"{_STREAM_PREFIX}:{queue}:{shard}"


def shard_for(run_id: str, shards: int) -> int:
    """Chooses the shard of a run: stable, so one run's tasks share a stream."""
    return zlib.crc32(run_id.encode()) % shards


def queue_streams(queues: list[str], shards: int) -> list[str]:
    """Returns every stream a worker serving ``queues`` must read."""
    return [stream_name(q, s) for q in queues for s in range(shards)]


class InvalidTaskMessage(ValueError):
    """A stream entry that is not a task message; it is acked and discarded."""


@dataclass(frozen=True, slots=True)
class TaskMessage:
    """One dispatch of one attempt of a task.

    ``node_type`` selects the executor: ``http``, or a code runtime (``python``,
    ``js``). ``input`` is what the executor needs, already resolved by the
    coordinator: the request for an HTTP step, ``{"code": ..., "input": ...}``
    for a code step. ``attempt`` is the fencing token that travels back in the
    report.
    """

    task_id: str
    run_id: str
    node_id: str
    node_type: str
    workflow_id: str
    workflow_version: int
    attempt: int
    timeout_seconds: int
    input: Any

    def encode(self) -> str:
        """Returns the JSON stored in the stream entry's ``task`` field."""
        return json.dumps(
            {
                "task_id": self.task_id,
                "run_id": self.run_id,
                "node_id": self.node_id,
                "node_type": self.node_type,
                "workflow_id": self.workflow_id,
                "workflow_version": self.workflow_version,
                "attempt": self.attempt,
                "timeout_seconds": self.timeout_seconds,
                "input": self.input,
            },
            separators=(",", ":"),
        )

    @classmethod
    def parse(cls, fields: Mapping[Any, Any]) -> TaskMessage:
        """Decodes a stream entry's fields.

        Raises:
            InvalidTaskMessage: the entry is not a well-formed task message; the
                message names what is wrong.
        """
        raw = fields.get(MESSAGE_FIELD, fields.get(MESSAGE_FIELD.encode()))
        if raw is None:
            raise InvalidTaskMessage(f"stream entry has no {MESSAGE_FIELD!r} field")
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidTaskMessage(f"task field is not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise InvalidTaskMessage("task field is not a JSON object")
        strings = ("task_id", "run_id", "node_id", "node_type", "workflow_id")
        for name in strings:
            if not isinstance(doc.get(name), str) or not doc[name]:
                raise InvalidTaskMessage(f"task message field {name!r} must be a non-empty string")
        for name in ("workflow_version", "attempt", "timeout_seconds"):
            value = doc.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidTaskMessage(f"task message field {name!r} must be a non-negative integer")
        if doc["attempt"] < 1:
            raise InvalidTaskMessage("task message field 'attempt' must be at least 1")
        return cls(
            task_id=doc["task_id"],
            run_id=doc["run_id"],
            node_id=doc["node_id"],
            node_type=doc["node_type"],
            workflow_id=doc["workflow_id"],
            workflow_version=doc["workflow_version"],
            attempt=doc["attempt"],
            timeout_seconds=doc["timeout_seconds"],
            input=doc.get("input"),
        )
