"""The stream contract shared by the coordinator's relay and the workers."""

from __future__ import annotations

import json

import pytest

from protos.taskstream import InvalidTaskMessage, TaskMessage, queue_streams, shard_for, stream_name


def _message(**overrides: object) -> TaskMessage:
    fields: dict[str, object] = {
        "task_id": "t",
        "run_id": "r",
        "node_id": "n",
        "node_type": "http",
        "workflow_id": "wf",
        "workflow_version": 1,
        "attempt": 1,
        "timeout_seconds": 30,
        "input": {"url": "http://x"},
    }
    fields.update(overrides)
    return TaskMessage(**fields)  # type: ignore[arg-type]


def test_message_round_trips_through_the_stream_field() -> None:
    msg = _message()
    assert TaskMessage.parse({"task": msg.encode()}) == msg
    assert TaskMessage.parse({b"task": msg.encode().encode()}) == msg


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({}, "no 'task' field"),
        ({"task": "{nope"}, "not JSON"),
        ({"task": "[]"}, "not a JSON object"),
        ({"task": json.dumps({**json.loads(_message().encode()), "task_id": ""})}, "'task_id'"),
        ({"task": json.dumps({**json.loads(_message().encode()), "attempt": 0})}, "'attempt'"),
        ({"task": json.dumps({**json.loads(_message().encode()), "attempt": True})}, "'attempt'"),
    ],
)
def test_malformed_entries_are_refused_with_the_reason(fields: dict[str, str], error: str) -> None:
    with pytest.raises(InvalidTaskMessage, match=error):
        TaskMessage.parse(fields)


def test_a_run_always_maps_to_one_shard() -> None:
    shards = {shard_for("run-42", 8) for _ in range(10)}
    assert len(shards) == 1
    assert 0 <= shards.pop() < 8
    assert queue_streams(["http", "js"], 2) == [
        stream_name("http", 0),
        stream_name("http", 1),
        stream_name("js", 0),
        stream_name("js", 1),
    ]


async def test_fixtures_give_real_servers(database_url: str, redis_client: object) -> None:
    import asyncpg

    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()
