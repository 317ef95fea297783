"""A minimal worker for coordinator tests: real streams, real leases, scripted execution.

It reads task messages from the real Redis streams through the consumer group,
claims each through the real coordinator, "executes" it by calling a Python
function, reports, and acks — the seed's loop without the production worker's
machinery, so the coordinator's tests do not depend on the worker package.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from protos import workflow_pb2 as pb
from protos.taskstream import CONSUMER_GROUP, SHARD_COUNT_KEY, TaskMessage, queue_streams

#: Returns (succeeded, output or error message).
Handler = Callable[[TaskMessage], Awaitable[tuple[bool, Any]]]


async def echo(message: TaskMessage) -> tuple[bool, Any]:
    """Succeeds with the node id and the input it was given."""
    return True, {"node": message.node_id, "input": message.input}


@dataclass
class ScriptedWorker:
    redis: aioredis.Redis
    stub: Any
    handler: Handler = echo
    owner: str = "scripted-worker"
    queues: tuple[str, ...] = ("http", "python", "js")
    ttl_seconds: int = 30
    executions: list[TaskMessage] = field(default_factory=list)
    reports: list[pb.ReportTaskResultResponse] = field(default_factory=list)

    async def streams(self) -> list[str]:
        shards = int(await self.redis.get(SHARD_COUNT_KEY) or 1)
        return queue_streams(list(self.queues), shards)

    async def ensure_groups(self, streams: list[str]) -> None:
        for stream in streams:
            try:
                await self.redis.xgroup_create(stream, CONSUMER_GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def run(self) -> None:
        """Processes messages until cancelled."""
        streams = await self.streams()
        await self.ensure_groups(streams)
        while True:
            try:
                batches: Any = await self.redis.xreadgroup(
                    CONSUMER_GROUP, self.owner, dict.fromkeys(streams, ">"), count=10, block=50
                )
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                await self.ensure_groups(streams)  # Redis was flushed
                continue
            for stream, entries in batches or []:
                for entry_id, fields in entries:
                    await self.process(stream, entry_id, fields)

    async def process(self, stream: Any, entry_id: Any, fields: dict[Any, Any]) -> None:
        message = TaskMessage.parse(fields)
        lease = await self.stub.AcquireTaskLease(
            pb.AcquireTaskLeaseRequest(
                task_id=message.task_id,
                run_id=message.run_id,
                owner=self.owner,
                ttl_seconds=self.ttl_seconds,
                attempt=message.attempt,
            )
        )
        if lease.acquired:
            self.executions.append(message)
            ok, result = await self.handler(message)
            request = pb.ReportTaskResultRequest(
                task_id=message.task_id,
                run_id=message.run_id,
                node_id=message.node_id,
                attempt=message.attempt,
                owner=self.owner,
                status="completed" if ok else "failed",
            )
            if ok:
                request.output = json.dumps(result).encode()
            else:
                request.error = str(result)
            self.reports.append(await self.stub.ReportTaskResult(request))
        await self.redis.xack(stream, CONSUMER_GROUP, entry_id)
