"""The task lease: who may execute a task right now.

The lease lives on the task row (`lease_owner`, `lease_expires_at`). Acquiring
it is one conditional UPDATE, so the database decides who wins; its `now()` is
the only clock, so skew between worker machines cannot break it. The lease is
deliberately not a state-machine event: it does not change routing, only who
may execute, so it runs outside the run lock and never waits behind other
events of the same run.

| task state | acquire? |
|---|---|
| PENDING / QUEUED | yes (first execution, or a retry) |
| RUNNING, lease still valid | no — the same owner included, so a redelivered message cannot start a second execution |
| RUNNING, lease expired | yes (the previous worker died: takeover) |
| COMPLETED / FAILED / SKIPPED | no (the message is stale) |

Beyond the seed: a caller may pass the attempt its message is for, and the
lease is then only granted while the task is on that attempt, so a stale
message of an earlier attempt cannot claim a retry before its backoff ends.
"""

from __future__ import annotations

import uuid

import asyncpg

__all__ = ["LeaseManager"]

_ACQUIRE = """
UPDATE task_instances
   SET state = 'RUNNING',
       lease_owner = $1,
       lease_expires_at = now() + make_interval(secs => $2),
       started_at = now(),
       updated_at = now()
 WHERE run_id = $3 AND id = $4
   AND ($5 = 0 OR attempt = $5)
   AND (state IN ('PENDING', 'QUEUED')
        OR (state = 'RUNNING' AND lease_expires_at < now()))
RETURNING id
"""

_RENEW = """
UPDATE task_instances
   SET lease_expires_at = now() + make_interval(secs => $1),
       updated_at = now()
 WHERE run_id = $2 AND id = $3 AND state = 'RUNNING' AND lease_owner = $4
RETURNING id
"""


class LeaseManager:
    """Acquires and renews task leases with single conditional UPDATEs."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def acquire(self, run_id: uuid.UUID, task_id: uuid.UUID, owner: str, ttl_s: float, attempt: int = 0) -> bool:
        """Claims the task for `owner` and moves it to RUNNING.

        Returns False when the policy refuses (see the module table). Safe to
        retry: a second call by the winner is refused, never granted twice.
        """
        return await self._pool.fetchval(_ACQUIRE, owner, float(ttl_s), run_id, task_id, attempt) is not None

    async def renew(self, run_id: uuid.UUID, task_id: uuid.UUID, owner: str, ttl_s: float) -> bool:
        """Extends a lease `owner` holds on a RUNNING task.

        Returns False once the lease is lost (taken over after expiry, or the
        task finished or was skipped): the worker must abandon the execution.
        A lease that expired with nobody taking over is still renewed.
        """
        return await self._pool.fetchval(_RENEW, float(ttl_s), run_id, task_id, owner) is not None
