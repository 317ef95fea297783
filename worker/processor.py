"""Processing one delivered message: claim, execute, report, ack (seed step 6).

The ack rule, which makes delivery at-least-once end to end: a message is acked
only

* after the coordinator acknowledged its report (the outcome is durable),
* when it is not a task message (logged, acked, discarded),
* when the lease was not acquired (another worker runs it, it is finished, or
  its attempt is stale: dropped), or
* when the lease was lost mid-execution (the result is discarded; acked only
  if the entry is still this worker's, see ``StreamConsumer.ack_if_owned``).

Anything else leaves the message pending, to be reclaimed once idle longer
than the TTL: a report that never got through, a coordinator that could not be
asked, or a shutdown that cancelled the execution (then the lease is released
so the task is re-dispatched at once, and nothing is reported: an interruption
is not a failure).

After execution there are three exits:

=========================  ================================================  ==============================
situation                  what the worker does                              why
=========================  ================================================  ==============================
lease lost while running   discard the result, ack (if still ours)           another worker owns the task
worker shutting down       release the lease; no report, no ack              an interruption is not a failure
normal finish              report success or failure, then ack               the coordinator decides retry
=========================  ================================================  ==============================
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Final

from protos.taskstream import InvalidTaskMessage, TaskMessage
from worker.config import DEFAULT_TASK_TIMEOUT_S, WorkerConfig
from worker.coordinator_client import CoordinatorClient
from worker.errors import CoordinatorRejected, CoordinatorUnavailable, StreamUnavailable
from worker.execution import ActiveExecutions, CancelReason, Execution
from worker.executor_pool import Delivery
from worker.executors import ExecutionResult, TaskContext
from worker.health import Progress
from worker.lease_renewal import LeaseRenewer
from worker.metrics import Outcome, WorkerMetrics
from worker.router import Router
from worker.tasklog import TaskLogger, task_logger

__all__ = ["EXECUTOR_DEADLINE_SLACK_S", "TaskProcessor"]

logger = logging.getLogger(__name__)

#: After a failed lease call the executor waits this long (doubling per
#: consecutive failure, up to the cap) before taking another message, holding
#: its slot: a worker that cannot reach the coordinator (or is refused by it)
#: stops pulling messages into its PEL instead of hoarding the backlog there.
ACQUIRE_BACKOFF_S: Final = 0.5
MAX_ACQUIRE_BACKOFF_S: Final = 10.0

#: Node types used as metric labels; anything else is "other" (labels must stay few).
_KNOWN_NODE_TYPES: Final = frozenset({"http", "python", "js", "node"})

#: Executors honour the task timeout themselves (the HTTP request's timeout; the
#: language server's own timeout, then its RPC deadline at +5 s). This backstop
#: fires only if one does not.
EXECUTOR_DEADLINE_SLACK_S: Final = 10.0


class TaskProcessor:
    """Handles one delivery at a time per executor loop (it holds no per-message state)."""

    def __init__(
        self,
        *,
        config: WorkerConfig,
        coordinator: CoordinatorClient,
        router: Router,
        renewer: LeaseRenewer,
        active: ActiveExecutions,
        metrics: WorkerMetrics,
        progress: Progress,
        stop: asyncio.Event,
    ) -> None:
        self._config = config
        self._stop = stop
        self._acquire_failures = 0
        self._coordinator = coordinator
        self._router = router
        self._renewer = renewer
        self._active = active
        self._metrics = metrics
        self._progress = progress

    async def handle(self, delivery: Delivery) -> None:
        """Processes one delivery to the end and acks it when the ack rule allows.

        Raises nothing for expected trouble (unreachable coordinator or Redis):
        it is logged and the message stays pending.
        """
        entry = delivery.entry
        if entry.fields is None:
            # Deleted from the stream while pending: nothing to run.
            await self._ack(delivery, None)
            return
        try:
            message = TaskMessage.parse(entry.fields)
        except InvalidTaskMessage as exc:
            logger.error(
                "invalid task message; acking and discarding it: %s",
                exc,
                extra={"stream": entry.stream, "entry_id": entry.entry_id, "worker_id": self._config.worker_id},
            )
            self._metrics.outcome(Outcome.INVALID)
            await self._ack(delivery, None)
            return
        log = task_logger(logger, message, self._config.worker_id)
        try:
            leased_at = time.monotonic()
            acquired = await self._coordinator.acquire(message, self._config.lease_ttl_s)
        except CoordinatorUnavailable as exc:
            await self._acquire_unknown(message, log, exc)
            await self._back_off()
            return
        except CoordinatorRejected as exc:
            log.error("coordinator refused the lease request; message left pending: %s", exc)
            self._metrics.outcome(Outcome.COORDINATOR_ERROR)
            await self._back_off()
            return
        self._acquire_failures = 0
        if not acquired:
            log.info(
                "task lease not acquired (running elsewhere, finished, or a stale attempt); dropping the message",
                extra={"entry_id": entry.entry_id, "delivery_count": entry.delivery_count},
            )
            self._metrics.outcome(Outcome.DROPPED)
            await self._ack(delivery, log)
            return
        await self._touch(delivery, log)
        outcome = await self._execute_under_lease(message, delivery, log, leased_at=leased_at)
        if outcome is CancelReason.LEASE_LOST:
            self._metrics.leases_lost.inc()
            self._metrics.outcome(Outcome.LEASE_LOST)
            log.warning("task lease lost during execution; result discarded")
            try:
                if not await delivery.consumer.ack_if_owned(entry.entry_id):
                    log.info("stream entry now belongs to another worker; not acking it")
            except StreamUnavailable as exc:
                log.warning("could not ack the stream entry: %s", exc)
            return
        if outcome is CancelReason.LEASE_EXPIRED:
            # Unknown whether the lease is gone: neither report nor ack; the
            # message is no longer touched, so it is reclaimed once idle.
            self._metrics.outcome(Outcome.LEASE_LOST)
            return
        if outcome is CancelReason.SHUTDOWN:
            self._metrics.outcome(Outcome.INTERRUPTED)
            await self._hand_back(message, log)
            return
        assert isinstance(outcome, ExecutionResult)
        await self._report(message, delivery, self._enforce_limits(outcome), log)

    async def _acquire_unknown(self, message: TaskMessage, log: TaskLogger, exc: Exception) -> None:
        """The acquire's outcome is unknown: this worker may hold the lease with nobody running the task.

        Handing it back (a no-op if we do not hold it) lets the coordinator
        re-dispatch at once; if that fails too, the lease expires after the TTL
        and the pending message is reclaimed.
        """
        log.warning("could not acquire the task lease (outcome unknown); message left pending: %s", exc)
        self._metrics.outcome(Outcome.COORDINATOR_ERROR)
        try:
            await self._coordinator.release(message, "acquire outcome unknown", attempts=1)
        except (CoordinatorUnavailable, CoordinatorRejected) as release_exc:
            log.info("could not release a possibly-held lease either: %s", release_exc)

    async def _back_off(self) -> None:
        """Holds this executor's slot a while after a failed lease call (cut short by stop)."""
        self._acquire_failures += 1
        delay = min(ACQUIRE_BACKOFF_S * 2 ** (self._acquire_failures - 1), MAX_ACQUIRE_BACKOFF_S)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._stop.wait()

    async def _touch(self, delivery: Delivery, log: TaskLogger) -> None:
        """Restarts the entry's idle clock now that we hold the lease.

        Without this the entry's idle time would count from its delivery, which
        precedes the lease: a reclaimer could take it just before the lease of
        a crashed worker expires, be refused, and drop it.
        """
        try:
            await delivery.consumer.touch(delivery.entry.entry_id)
        except StreamUnavailable as exc:
            log.warning("could not refresh the stream entry's idle time: %s", exc)

    async def _execute_under_lease(
        self, message: TaskMessage, delivery: Delivery, log: TaskLogger, *, leased_at: float
    ) -> ExecutionResult | CancelReason:
        timeout_s = float(message.timeout_seconds or DEFAULT_TASK_TIMEOUT_S)
        started = time.monotonic()
        context = TaskContext(
            task_id=message.task_id,
            run_id=message.run_id,
            node_id=message.node_id,
            attempt=message.attempt,
            timeout_s=timeout_s,
            deadline=started + timeout_s,
        )
        self._metrics.schedule_to_start.observe(max(0.0, time.time() - delivery.entry.published_at))
        log.info(
            "executing task",
            extra={
                "node_type": message.node_type,
                "timeout_s": timeout_s,
                "delivery_count": delivery.entry.delivery_count,
                "reclaimed": delivery.reclaimed,
            },
        )
        async with asyncio.TaskGroup() as tg:
            execution = Execution(
                tg.create_task(self._run_executor(message, context, log), name=f"execute-{message.task_id}"),
                task_id=message.task_id,
            )
            self._active.add(execution)
            renewal = tg.create_task(
                self._renewer.keep_alive(
                    message,
                    consumer=delivery.consumer,
                    entry_id=delivery.entry.entry_id,
                    leased_at=leased_at,
                    on_lost=lambda: execution.cancel(CancelReason.LEASE_LOST),
                    on_expired=lambda: execution.cancel(CancelReason.LEASE_EXPIRED),
                    log=log,
                ),
                name=f"renew-{message.task_id}",
            )
            try:
                # asyncio.wait does not raise when the execution is cancelled with a reason.
                await asyncio.wait([execution.task])
            finally:
                self._active.discard(execution)
                renewal.cancel()
        outcome = execution.outcome()
        elapsed = time.monotonic() - started
        if isinstance(outcome, ExecutionResult):
            result = "completed" if outcome.succeeded else "failed"
            node_type = message.node_type if message.node_type in _KNOWN_NODE_TYPES else "other"
            self._metrics.execution.labels(node_type, result).observe(elapsed)
            log.info("task executed", extra={"duration_s": round(elapsed, 4), "success": outcome.succeeded})
        return outcome

    async def _run_executor(self, message: TaskMessage, context: TaskContext, log: TaskLogger) -> ExecutionResult:
        backstop = context.timeout_s + EXECUTOR_DEADLINE_SLACK_S
        try:
            async with asyncio.timeout(backstop):
                return await self._router.route(message.node_type, context, message.input)
        except TimeoutError:
            return ExecutionResult.failed(f"task timed out after {context.timeout_s:g} s")
        except Exception as exc:
            # A bug in an executor fails this task (and is logged with its
            # traceback); it must not take the worker down.
            log.exception("executor raised unexpectedly")
            return ExecutionResult.failed(
                f"internal worker error in the {message.node_type} executor: {type(exc).__name__}: {exc}"
            )

    def _enforce_limits(self, result: ExecutionResult) -> ExecutionResult:
        """Fails a result whose output is over the limit: nothing is ever truncated or replaced silently."""
        limit = self._config.max_output_bytes
        if result.output is not None and len(result.output) > limit:
            return ExecutionResult.failed(
                f"task output is {len(result.output)} bytes, over the limit of {limit} bytes (WORKER_MAX_OUTPUT_BYTES)"
            )
        return result

    async def _report(self, message: TaskMessage, delivery: Delivery, result: ExecutionResult, log: TaskLogger) -> None:
        try:
            ack = await self._coordinator.report(message, result)
        except (CoordinatorUnavailable, CoordinatorRejected) as exc:
            log.error("could not report the task result; message left pending for reclaim: %s", exc)
            self._metrics.outcome(Outcome.COORDINATOR_ERROR)
            return
        if not ack.applied:
            log.info("coordinator acknowledged but ignored the report: %s", ack.ignored_reason or "no reason given")
        self._progress.note()
        self._metrics.outcome(Outcome.COMPLETED if result.succeeded else Outcome.FAILED)
        await self._ack(delivery, log)
        self._metrics.end_to_end.observe(max(0.0, time.time() - delivery.entry.published_at))
        if not result.succeeded:
            log.info("task failed: %s", result.error)

    async def _hand_back(self, message: TaskMessage, log: TaskLogger) -> None:
        """Releases the lease of an execution cancelled by shutdown; neither reports nor acks."""
        try:
            released = await self._coordinator.release(message, CancelReason.SHUTDOWN.value)
        except (CoordinatorUnavailable, CoordinatorRejected) as exc:
            log.warning("interrupted by shutdown; could not release the lease (it will expire): %s", exc)
            return
        log.info("interrupted by shutdown; lease released=%s, message left pending", released)

    async def _ack(self, delivery: Delivery, log: TaskLogger | None) -> None:
        try:
            await delivery.consumer.ack(delivery.entry.entry_id)
        except StreamUnavailable as exc:
            # The outcome is durable; the pending entry will be reclaimed and dropped.
            (log or logger).warning("could not ack stream entry %s: %s", delivery.entry.entry_id, exc)
