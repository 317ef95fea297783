"""The lease policy of the seed, row by row, against the real coordinator and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import grpc
import pytest

from protos import workflow_pb2 as pb
from tests.coordinator_harness import CoordinatorHandle

ONE_TASK = {"name": "one", "nodes": [{"id": "a", "type": "HTTP", "request": {"url": "http://127.0.0.1:9/x"}}]}


async def _task(handle: CoordinatorHandle) -> tuple[str, str]:
    await handle.register(ONE_TASK)
    run_id = await handle.start_run("one")
    run = await handle.get_run(run_id)
    return run_id, run.tasks[0].id


async def _sql(handle: CoordinatorHandle, query: str, *args: Any) -> Any:
    conn = await asyncpg.connect(handle.database_url)
    try:
        return await conn.fetchrow(query, *args)
    finally:
        await conn.close()


async def _acquire(
    handle: CoordinatorHandle, run_id: str, task_id: str, owner: str, ttl: int = 30, attempt: int = 0
) -> bool:
    reply = await handle.stub.AcquireTaskLease(
        pb.AcquireTaskLeaseRequest(task_id=task_id, run_id=run_id, owner=owner, ttl_seconds=ttl, attempt=attempt)
    )
    acquired: bool = reply.acquired
    return acquired


async def _renew(handle: CoordinatorHandle, run_id: str, task_id: str, owner: str) -> bool:
    reply = await handle.stub.RenewTaskLease(
        pb.AcquireTaskLeaseRequest(task_id=task_id, run_id=run_id, owner=owner, ttl_seconds=30)
    )
    renewed: bool = reply.acquired
    return renewed


@pytest.mark.parametrize(
    ("state", "expected"),
    [("PENDING", True), ("QUEUED", True), ("COMPLETED", False), ("FAILED", False), ("SKIPPED", False)],
)
async def test_acquire_by_state(coordinator: CoordinatorHandle, state: str, expected: bool) -> None:
    run_id, task_id = await _task(coordinator)
    await _sql(
        coordinator, "UPDATE task_instances SET state = $3 WHERE run_id = $1 AND id = $2", run_id, task_id, state
    )
    assert await _acquire(coordinator, run_id, task_id, "w1") is expected
    row = await _sql(
        coordinator, "SELECT state, lease_owner FROM task_instances WHERE run_id = $1 AND id = $2", run_id, task_id
    )
    assert (row["state"], row["lease_owner"]) == (("RUNNING", "w1") if expected else (state, None))


async def test_running_with_live_lease_is_refused_to_everyone_including_its_owner(
    coordinator: CoordinatorHandle,
) -> None:
    run_id, task_id = await _task(coordinator)
    assert await _acquire(coordinator, run_id, task_id, "w1")
    assert not await _acquire(coordinator, run_id, task_id, "w2")
    assert not await _acquire(coordinator, run_id, task_id, "w1"), (
        "a redelivered message must not start a second execution"
    )


async def test_expired_lease_is_taken_over(coordinator: CoordinatorHandle) -> None:
    run_id, task_id = await _task(coordinator)
    assert await _acquire(coordinator, run_id, task_id, "w1")
    await _sql(
        coordinator,
        "UPDATE task_instances SET lease_expires_at = now() - interval '1 second' WHERE run_id = $1 AND id = $2",
        run_id,
        task_id,
    )
    assert await _acquire(coordinator, run_id, task_id, "w2")
    row = await _sql(
        coordinator, "SELECT lease_owner FROM task_instances WHERE run_id = $1 AND id = $2", run_id, task_id
    )
    assert row["lease_owner"] == "w2"
    assert not await _renew(coordinator, run_id, task_id, "w1"), "the previous owner lost the lease"


async def test_fifty_concurrent_acquirers_one_winner(coordinator: CoordinatorHandle) -> None:
    run_id, task_id = await _task(coordinator)
    results = await asyncio.gather(*(_acquire(coordinator, run_id, task_id, f"w{i}") for i in range(50)))
    assert sum(results) == 1
    winner = f"w{results.index(True)}"
    row = await _sql(
        coordinator, "SELECT lease_owner FROM task_instances WHERE run_id = $1 AND id = $2", run_id, task_id
    )
    assert row["lease_owner"] == winner


async def test_renew_only_by_the_owner_of_a_running_task(coordinator: CoordinatorHandle) -> None:
    run_id, task_id = await _task(coordinator)
    assert not await _renew(coordinator, run_id, task_id, "w1"), "nothing to renew before acquiring"
    assert await _acquire(coordinator, run_id, task_id, "w1")
    before = await _sql(
        coordinator, "SELECT lease_expires_at FROM task_instances WHERE run_id = $1 AND id = $2", run_id, task_id
    )
    assert not await _renew(coordinator, run_id, task_id, "intruder")
    assert await _renew(coordinator, run_id, task_id, "w1")
    after = await _sql(
        coordinator, "SELECT lease_expires_at FROM task_instances WHERE run_id = $1 AND id = $2", run_id, task_id
    )
    assert after["lease_expires_at"] > before["lease_expires_at"]


async def test_renew_after_expiry_without_takeover_still_works(coordinator: CoordinatorHandle) -> None:
    run_id, task_id = await _task(coordinator)
    assert await _acquire(coordinator, run_id, task_id, "w1")
    await _sql(
        coordinator,
        "UPDATE task_instances SET lease_expires_at = now() - interval '1 second' WHERE run_id = $1 AND id = $2",
        run_id,
        task_id,
    )
    assert await _renew(coordinator, run_id, task_id, "w1")


async def test_renew_after_completion_is_refused(coordinator: CoordinatorHandle) -> None:
    run_id, task_id = await _task(coordinator)
    assert await _acquire(coordinator, run_id, task_id, "w1")
    reply = await coordinator.stub.ReportTaskResult(
        pb.ReportTaskResultRequest(
            task_id=task_id, run_id=run_id, node_id="a", attempt=1, owner="w1", status="completed", output=b"{}"
        )
    )
    assert reply.applied
    assert not await _renew(coordinator, run_id, task_id, "w1")


async def test_default_ttl_is_ninety_seconds(coordinator: CoordinatorHandle) -> None:
    run_id, task_id = await _task(coordinator)
    assert await _acquire(coordinator, run_id, task_id, "w1", ttl=0)
    row = await _sql(
        coordinator,
        "SELECT extract(epoch FROM lease_expires_at - now()) AS left FROM task_instances WHERE run_id = $1 AND id = $2",
        run_id,
        task_id,
    )
    assert 85 < float(row["left"]) <= 90


async def test_a_stale_attempt_cannot_claim_a_retry(coordinator: CoordinatorHandle) -> None:
    run_id, task_id = await _task(coordinator)
    await _sql(coordinator, "UPDATE task_instances SET attempt = 2 WHERE run_id = $1 AND id = $2", run_id, task_id)
    assert not await _acquire(coordinator, run_id, task_id, "w1", attempt=1)
    assert await _acquire(coordinator, run_id, task_id, "w1", attempt=2)


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"run_id": "00000000-0000-0000-0000-000000000001", "owner": "w"}, "task_id"),
        ({"task_id": "00000000-0000-0000-0000-000000000001", "owner": "w"}, "run_id"),
        (
            {"task_id": "00000000-0000-0000-0000-000000000001", "run_id": "00000000-0000-0000-0000-000000000001"},
            "owner",
        ),
        ({"task_id": "nope", "run_id": "00000000-0000-0000-0000-000000000001", "owner": "w"}, "task_id"),
    ],
)
@pytest.mark.parametrize("rpc", ["AcquireTaskLease", "RenewTaskLease"])
async def test_lease_requests_missing_fields_are_invalid(
    coordinator: CoordinatorHandle, rpc: str, request_fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await getattr(coordinator.stub, rpc)(pb.AcquireTaskLeaseRequest(**request_fields))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith(f"{field}:")
