"""Keeps a running task's lease alive (seed step 7, hardened).

Every renewal interval (TTL/3) the renewer asks the coordinator to extend the
lease. Three answers are possible, and only one of them cancels the execution:

* ``acquired = true``: renewed. The stream entry's idle time is reset too
  (``touch``), so no worker reclaims the message of a task that runs longer
  than the TTL; a crash after that point still leaves the message pending.
* ``acquired = false``: the coordinator says the lease is lost (expired and
  taken over, or the task finished): the execution is cancelled with
  ``LEASE_LOST`` and its result discarded.
* no answer (transport error, or the call's own timeout, which is below
  TTL/3): retried after a quarter interval. The lease lives until its TTL, so
  this leaves about three tries before it could expire; a network blip never
  costs the task, and is never read as "lost".

The idle time is reset only after a successful renewal, so a worker cut off
from the coordinator stops protecting its message exactly as its lease starts
running out, and another worker can take the task over.

Self-fencing (beyond the seed): a worker that got no renewal through stops
the execution itself before its lease can expire, so that a worker taking the
task over never runs it at the same time. The coordinator's lease expires TTL
after its own `now()` at the last successful acquire or renewal, which is after
the worker sent that request; so `sent + TTL` on the worker's monotonic clock is
never later than the real expiry, and the execution is cancelled a margin
(`FENCE_MARGIN_FRACTION` of the TTL, at least `MIN_FENCE_MARGIN_S`) before it.
The result is discarded and the message left pending: whether the lease was
really lost is unknown, so the task is left to whoever holds it next.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from protos.taskstream import TaskMessage
from worker.coordinator_client import CoordinatorClient
from worker.errors import CoordinatorRejected, CoordinatorUnavailable, StreamUnavailable
from worker.health import Progress
from worker.metrics import WorkerMetrics
from worker.stream import StreamConsumer
from worker.tasklog import TaskLogger

__all__ = ["FENCE_MARGIN_FRACTION", "MIN_FENCE_MARGIN_S", "LeaseRenewer"]

#: How long before the lease's earliest possible expiry an unrenewed execution stops.
FENCE_MARGIN_FRACTION = 0.1
MIN_FENCE_MARGIN_S = 0.5


class LeaseRenewer:
    """Renews leases for the executions of one worker."""

    def __init__(
        self,
        coordinator: CoordinatorClient,
        *,
        ttl_s: int,
        interval_s: float,
        metrics: WorkerMetrics,
        progress: Progress,
    ) -> None:
        self._coordinator = coordinator
        self._ttl_s = ttl_s
        self._interval_s = interval_s
        self._retry_s = interval_s / 4
        self._fence_after_s = ttl_s - max(MIN_FENCE_MARGIN_S, ttl_s * FENCE_MARGIN_FRACTION)
        self._metrics = metrics
        self._progress = progress

    async def keep_alive(
        self,
        message: TaskMessage,
        *,
        consumer: StreamConsumer,
        entry_id: str,
        leased_at: float,
        on_lost: Callable[[], None],
        on_expired: Callable[[], None],
        log: TaskLogger,
    ) -> None:
        """Renews until cancelled, or until the lease is lost or about to expire unrenewed.

        Args:
            leased_at: `time.monotonic()` just before the acquire request was sent.
            on_lost: called when the coordinator says the lease is lost.
            on_expired: called when no renewal got through in time (self-fencing).

        Cancel-safe: the owner cancels it when the execution ends.
        """
        next_at = time.monotonic() + self._interval_s
        last_renewed = time.monotonic()
        fence_at = leased_at + self._fence_after_s
        while True:
            await asyncio.sleep(max(0.0, min(next_at, fence_at) - time.monotonic()))
            sent = time.monotonic()
            if sent >= fence_at:
                self._fence(log, since_s=sent - last_renewed)
                on_expired()
                return
            try:
                async with asyncio.timeout(fence_at - sent):
                    renewed = await self._coordinator.renew(message, self._ttl_s)
            except TimeoutError:
                continue  # the fence time came while asking: stop at the top of the loop
            except (CoordinatorUnavailable, CoordinatorRejected) as exc:
                self._metrics.renewal_errors.inc()
                log.warning(
                    "lease renewal got no answer (%.1f s since the last renewal, TTL %d s); retrying: %s",
                    time.monotonic() - last_renewed,
                    self._ttl_s,
                    exc,
                )
                next_at = time.monotonic() + self._retry_s
                continue
            if not renewed:
                log.warning("coordinator says the task lease is lost; cancelling the execution")
                on_lost()
                return
            last_renewed = time.monotonic()
            fence_at = sent + self._fence_after_s
            self._metrics.renewals.inc()
            self._progress.note()
            try:
                if not await consumer.touch(entry_id):
                    log.warning("stream entry %s is no longer pending for this worker", entry_id)
            except StreamUnavailable as exc:
                log.warning("could not refresh the stream entry's idle time: %s", exc)
            next_at = time.monotonic() + self._interval_s

    def _fence(self, log: TaskLogger, *, since_s: float) -> None:
        self._metrics.leases_lost.inc()
        log.error(
            "no lease renewal got through for %.1f s (TTL %d s): stopping the execution before the lease can "
            "expire, so a worker taking over never runs the task at the same time; message left pending",
            since_s,
            self._ttl_s,
        )
