"""The fault storm's stage: real servers, three worker nodes, and the faults done to them.

Everything is a real process: PostgreSQL (the test session's), a Redis of its
own with an append-only file (so it can be killed and restarted), a
coordinator subprocess, and three `python -m supervisor` worker nodes, each
with its worker and both language servers. Faults are real too: SIGKILL of
worker, coordinator, Redis and language-server processes, and one FLUSHALL.

For every fault the stage records which tasks it affected (a SQL snapshot
taken just before it) and then watches the database until each of them makes
progress (its state, attempt or lease owner changes), so the report can give
the worst time from a fault to the next progress of the tasks it hit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import psutil
import redis.asyncio as aioredis

from protos import workflow_pb2 as pb
from supervisor.embedded import EmbeddedRedis, EmbeddedServerError
from tests.coordinator_harness import CoordinatorHandle, CoordinatorProcess
from tests.supervisor_harness import SupervisorProcess

#: The worker's lease TTL in the storm (through the documented short-TTL test path).
TTL_S = 3.0
#: The worker's reclaim interval at that TTL (TTL/2).
RECLAIM_S = TTL_S / 2
STALL_AFTER_S = 2.0
SWEEP_INTERVAL_S = 0.5
MAX_DELIVERIES = 5

#: A task is "in flight" (and so affected by a fault) in these states.
_SNAPSHOT = """
SELECT t.id::text AS id, t.state, t.attempt, coalesce(t.lease_owner, '') AS owner, t.node_type
  FROM task_instances t JOIN runs r ON r.id = t.run_id
 WHERE r.state = 'RUNNING' AND t.state = ANY($1::text[])
"""
_PROGRESS = """
SELECT id::text AS id, state, attempt, coalesce(lease_owner, '') AS owner
  FROM task_instances WHERE id = ANY($1::uuid[])
"""


@dataclass
class Fault:
    """One injected fault and what followed it."""

    kind: str
    detail: str
    at: float
    #: The design's bound on the time to the next progress of the affected tasks.
    bound_s: float
    affected: dict[str, tuple[str, int, str]] = field(default_factory=dict)
    progressed_at: dict[str, float] = field(default_factory=dict)

    def worst_s(self) -> float | None:
        """The longest time from the fault to an affected task's next progress (None: none affected)."""
        if not self.affected:
            return None
        waits = [self.progressed_at.get(task, float("inf")) - self.at for task in self.affected]
        return max(waits)


@dataclass
class Node:
    name: str
    process: SupervisorProcess

    def child(self, module: str) -> psutil.Process | None:
        """The live child process running `python -m <module>` (None between restarts)."""
        for proc in self.process.descendants():
            with contextlib.suppress(psutil.Error):
                cmdline = proc.cmdline()
                if "-m" in cmdline and module in cmdline and proc.status() != psutil.STATUS_ZOMBIE:
                    return proc
        return None

    def worker_id(self, pid: int) -> str | None:
        """The worker id the worker process `pid` logged at start."""
        for line in self.process.logs():
            if line.get("process") == "worker" and line.get("pid") == pid and line.get("worker_id"):
                return str(line["worker_id"])
        return None


class Stage:
    """Owns the processes of one storm; `async with Stage(...) as stage:`."""

    def __init__(self, *, database_url: str, root: Path, nodes: int = 3) -> None:
        self.database_url = database_url
        self.root = root
        self.node_count = nodes
        self.redis = EmbeddedRedis(root / "redis", appendonly=True)
        self.coordinator = CoordinatorProcess(
            database_url,
            self.redis.url,
            STALL_AFTER_SECONDS=str(STALL_AFTER_S),
            SWEEP_INTERVAL_SECONDS=str(SWEEP_INTERVAL_S),
            RELAY_POLL_INTERVAL_SECONDS="0.2",
            STREAM_SHARDS="2",
        )
        self.nodes: list[Node] = []
        self.faults: list[Fault] = []
        self.log: list[str] = []
        self.started = time.time()
        self._db: asyncpg.Pool | None = None

    async def __aenter__(self) -> Stage:
        await asyncio.to_thread(self.redis.start)
        await self.coordinator.start()
        for i in range(self.node_count):
            directory = self.root / f"node-{i + 1}"
            directory.mkdir(parents=True, exist_ok=True)
            process = SupervisorProcess(directory, [], self._node_env())
            process.start()
            self.nodes.append(Node(name=f"node-{i + 1}", process=process))
        for node in self.nodes:
            await self._until(
                lambda node=node: node.process.has_log(lambda e: e.get("event") == "node ready"),  # type: ignore[misc]
                timeout_s=90,
                what=f"{node.name} ready",
            )
        self._db = await asyncpg.create_pool(self.database_url, min_size=1, max_size=4)
        self.started = time.time()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._db is not None:
            await self._db.close()
        for node in self.nodes:
            node.process.close()
        self.coordinator.close()
        await asyncio.to_thread(self.redis.stop)

    def _node_env(self) -> dict[str, str]:
        return {
            "COORDINATOR_ADDR": self.coordinator.addr,
            "REDIS_ADDR": self.redis.url,
            "WORKER_ALLOW_SHORT_LEASE_TTL": "1",
            "LEASE_TTL_SECONDS": str(int(TTL_S)),
            "MAX_DELIVERIES": str(MAX_DELIVERIES),
            "WORKER_CONCURRENCY": "6",
            "WORKER_SHUTDOWN_GRACE_SECONDS": "2",
            "SUPERVISOR_CRASH_LOOP_LIMIT": "1000",
            "SUPERVISOR_RESTART_BACKOFF_SECONDS": "0.2",
            "SUPERVISOR_RESTART_BACKOFF_MAX_SECONDS": "1",
            "SUPERVISOR_READY_TIMEOUT_SECONDS": "60",
            "SUPERVISOR_WATCH_INTERVAL_SECONDS": "1",
            "JS_MAX_CONCURRENCY": "2",
            "JS_POOL_PROCESSES": "3",
            "PY_MAX_CONCURRENCY": "4",
            "LOG_LEVEL": "info",
        }

    # -- observation -----------------------------------------------------------

    def note(self, text: str) -> None:
        line = f"t+{time.time() - self.started:6.2f}s  {text}"
        self.log.append(line)
        print(line, flush=True)

    @property
    def db(self) -> asyncpg.Pool:
        """Shared by the fault snapshots, the progress watcher and the final checks."""
        assert self._db is not None, "the stage is not started"
        return self._db

    async def snapshot(
        self, states: tuple[str, ...], predicate: Callable[[asyncpg.Record], bool] = lambda _: True
    ) -> dict[str, tuple[str, int, str]]:
        rows = await self.db.fetch(_SNAPSHOT, list(states))
        return {r["id"]: (r["state"], r["attempt"], r["owner"]) for r in rows if predicate(r)}

    async def watch_progress(self, stop: asyncio.Event) -> None:
        """Until `stop`: records when each affected task of each fault first changes."""
        while not stop.is_set():
            waiting = {task for f in self.faults for task in f.affected if task not in f.progressed_at}
            if waiting:
                with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                    rows = await self.db.fetch(_PROGRESS, list(waiting))
                    now = time.time()
                    current = {r["id"]: (r["state"], r["attempt"], r["owner"]) for r in rows}
                    for fault in self.faults:
                        for task, before in fault.affected.items():
                            if task not in fault.progressed_at and task in current and current[task] != before:
                                fault.progressed_at[task] = now
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.1):
                    await stop.wait()

    # -- faults ----------------------------------------------------------------

    async def _fault(
        self,
        kind: str,
        detail: str,
        bound_s: float,
        affected: dict[str, tuple[str, int, str]],
        act: Callable[[], Awaitable[None]],
    ) -> None:
        fault = Fault(kind=kind, detail=detail, at=time.time(), bound_s=bound_s, affected=affected)
        await act()
        self.faults.append(fault)
        self.note(f"FAULT {kind}: {detail} ({len(affected)} task(s) in flight)")

    async def kill_worker(self, node: Node) -> None:
        proc = node.child("worker")
        if proc is None:
            self.note(f"skip: {node.name} has no worker right now")
            return
        owner = node.worker_id(proc.pid) or "?"
        affected = await self.snapshot(("RUNNING",), lambda r: r["owner"] == owner)

        async def act() -> None:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)

        await self._fault("SIGKILL worker", f"{node.name} pid {proc.pid} ({owner})", TTL_S + RECLAIM_S, affected, act)

    async def kill_langserver(self, node: Node, module: str) -> None:
        proc = node.child(module)
        if proc is None:
            self.note(f"skip: {node.name} has no {module} right now")
            return
        runtime = "python" if module == "langserver_python" else "js"
        worker = node.child("worker")
        owner = (node.worker_id(worker.pid) if worker else None) or "?"
        affected = await self.snapshot(("RUNNING",), lambda r: r["owner"] == owner and r["node_type"] == "CODE")

        async def act() -> None:
            for child in [*proc.children(recursive=True), proc]:
                with contextlib.suppress(psutil.Error):
                    child.send_signal(signal.SIGKILL)

        # The attempt fails with a clear error and is retried after its backoff
        # (0.2 s, doubling) once the supervisor restarted the server.
        await self._fault(f"SIGKILL {module}", f"{node.name} pid {proc.pid} ({runtime})", 5.0, affected, act)

    async def kill_coordinator(self, down_s: float = 1.0) -> None:
        affected = await self.snapshot(("QUEUED", "RUNNING"))

        async def act() -> None:
            self.coordinator.kill()
            await asyncio.sleep(down_s)
            self.coordinator.spawn()
            await self.coordinator.wait_serving(timeout_s=60)

        # Leases may lapse while the coordinator is away: running tasks are
        # fenced by their workers and taken over after TTL + reclaim.
        await self._fault(
            "SIGKILL coordinator", f"down {down_s:.0f} s, then restarted", down_s + TTL_S + RECLAIM_S + 3, affected, act
        )

    async def restart_redis(self) -> None:
        affected = await self.snapshot(("QUEUED", "RUNNING"))

        async def act() -> None:
            await asyncio.to_thread(self.redis.kill)
            await self._start_redis()

        # Entries of the last second may be gone (AOF fsyncs every second): the
        # sweeper re-dispatches them after STALL_AFTER + SWEEP_INTERVAL.
        await self._fault(
            "SIGKILL Redis",
            "restarted from its AOF",
            STALL_AFTER_S + SWEEP_INTERVAL_S + TTL_S + RECLAIM_S,
            affected,
            act,
        )

    async def flush_redis(self) -> None:
        affected = await self.snapshot(("QUEUED", "RUNNING"))

        async def act() -> None:
            client = aioredis.Redis.from_url(self.redis.url)
            try:
                await client.flushall()
            finally:
                await client.aclose()

        await self._fault(
            "FLUSHALL",
            "every stream, group and pending entry gone",
            STALL_AFTER_S + SWEEP_INTERVAL_S + TTL_S + RECLAIM_S,
            affected,
            act,
        )

    # -- helpers ---------------------------------------------------------------

    async def _start_redis(self, attempts: int = 3) -> None:
        """Starts Redis again, as a service manager would (it retries a failed start)."""
        for attempt in range(1, attempts + 1):
            try:
                await asyncio.to_thread(self.redis.start)
                return
            except EmbeddedServerError as exc:
                if attempt == attempts:
                    raise
                self.note(f"Redis did not start ({exc}); starting it again")

    async def _until(self, probe: Callable[[], bool], *, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not await asyncio.to_thread(probe):
            for node in self.nodes:
                proc = node.process.proc
                if proc is not None and proc.poll() is not None:
                    raise AssertionError(
                        f"{node.name} exited with {proc.returncode}:\n{node.process.log_text()[-3000:]}"
                    )
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not reached within {timeout_s}s")
            await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def client(stage: Stage) -> AsyncIterator[CoordinatorHandle]:
    async with grpc.aio.insecure_channel(stage.coordinator.addr) as channel:
        yield CoordinatorHandle(
            addr=stage.coordinator.addr, database_url=stage.database_url, redis_url=stage.redis.url, channel=channel
        )


async def start_run(
    handle: CoordinatorHandle, workflow: str, run_input: Any, key: str, *, deadline_s: float = 60
) -> str:
    """StartRun with an idempotency key, retried while the coordinator is away (no duplicate runs)."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            reply = await handle.stub.StartRun(
                pb.StartRunRequest(workflow=workflow, input=json.dumps(run_input).encode(), idempotency_key=key),
                timeout=5,
            )
            run_id: str = reply.run_id
            return run_id
        except grpc.aio.AioRpcError as exc:
            if (
                exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                or time.monotonic() > deadline
            ):
                raise
            await asyncio.sleep(0.2)
