"""The operator's verbs, over the coordinator's gRPC API: register, run, show, cancel, dead letters.

Each verb prints its result on stdout and returns an exit code. Failures
raise `OperatorError`, whose message is the one line `cli.py` prints on
stderr: a gRPC status becomes words that say what to do (which variable to
set, which field is wrong).

Environment: `COORDINATOR_ADDR` (default `localhost:50051`),
`COORDINATOR_TOKEN` (sent as `authorization: Bearer ...`),
`COORDINATOR_TLS_CA` (a PEM file; set it when the coordinator serves TLS).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from coordinator import render
from protos import workflow_pb2 as pb
from protos import workflow_pb2_grpc as pb_grpc

__all__ = ["ClientSettings", "Operator", "OperatorError"]

DEFAULT_COORDINATOR_ADDR = "localhost:50051"
_TERMINAL = (pb.RUN_STATE_COMPLETED, pb.RUN_STATE_FAILED, pb.RUN_STATE_CANCELLED)
#: How long `run --wait` keeps reconnecting when the coordinator goes away mid-watch.
_WATCH_RECONNECT_S = 60.0
_RECONNECT_PAUSE_S = 1.0


class OperatorError(Exception):
    """A verb failed; the message is one line for the operator."""


@dataclass(frozen=True, kw_only=True)
class ClientSettings:
    addr: str = DEFAULT_COORDINATOR_ADDR
    token: str | None = None
    tls_ca: Path | None = None
    timeout_s: float = 30.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str], *, timeout_s: float = 30.0) -> ClientSettings:
        ca = environ.get("COORDINATOR_TLS_CA") or None
        return cls(
            addr=environ.get("COORDINATOR_ADDR") or DEFAULT_COORDINATOR_ADDR,
            token=environ.get("COORDINATOR_TOKEN") or None,
            tls_ca=Path(ca) if ca else None,
            timeout_s=timeout_s,
        )


def _explain(exc: grpc.aio.AioRpcError, settings: ClientSettings) -> str:
    code, details = exc.code(), (exc.details() or "").strip()
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"cannot reach the coordinator at {settings.addr} (set COORDINATOR_ADDR): {details or 'unavailable'}"
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return f"the coordinator at {settings.addr} refused the call: {details}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the coordinator at {settings.addr} did not answer within {settings.timeout_s:g}s"
    if code == grpc.StatusCode.NOT_FOUND:
        return f"not found: {details}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return f"invalid request: {details}"
    return f"{code.name.lower()}: {details}"


def _say(text: str = "") -> None:
    print(text, flush=True)


class Operator:
    """A connection to one coordinator. Use as an async context manager."""

    def __init__(self, settings: ClientSettings) -> None:
        """Raises OperatorError when the TLS CA file cannot be read."""
        self.settings = settings
        self._metadata = (("authorization", f"Bearer {settings.token}"),) if settings.token else None
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._ca: bytes | None = None
        if settings.tls_ca is not None:
            try:
                self._ca = settings.tls_ca.read_bytes()
            except OSError as exc:
                raise OperatorError(f"COORDINATOR_TLS_CA: cannot read {settings.tls_ca}: {exc.strerror}") from None

    async def __aenter__(self) -> Operator:
        if self._ca is not None:
            self._channel = grpc.aio.secure_channel(self.settings.addr, grpc.ssl_channel_credentials(self._ca))
        else:
            self._channel = grpc.aio.insecure_channel(self.settings.addr)
        self._stub = pb_grpc.WorkflowServiceStub(self._channel)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._channel is not None:
            await self._channel.close()

    async def _call(self, method: str, request: Any) -> Any:
        try:
            return await getattr(self._stub, method)(
                request, timeout=self.settings.timeout_s, metadata=self._metadata, wait_for_ready=False
            )
        except grpc.aio.AioRpcError as exc:
            raise OperatorError(_explain(exc, self.settings)) from None

    async def register(self, files: Sequence[tuple[str, bytes]]) -> int:
        """Registers each (file name, definition) in order; stops at the first refusal."""
        for name, definition in files:
            try:
                json.loads(definition)
            except ValueError as exc:
                raise OperatorError(f"{name}: not valid JSON ({exc})") from None
            try:
                reply = await self._call("RegisterWorkflow", pb.RegisterWorkflowRequest(definition=definition))
            except OperatorError as exc:
                raise OperatorError(f"{name}: {exc}") from None
            if reply.created:
                _say(f"registered {reply.name} version {reply.version} ({name})")
            else:
                _say(f"{reply.name} version {reply.version} is unchanged ({name})")
        return 0

    async def start(
        self, workflow: str, run_input: Any, *, version: int, idempotency_key: str, wait: bool, as_json: bool
    ) -> int:
        reply = await self._call(
            "StartRun",
            pb.StartRunRequest(
                workflow=workflow,
                version=version,
                input=json.dumps(run_input).encode(),
                idempotency_key=idempotency_key,
            ),
        )
        if not as_json:
            note = "" if reply.created else " (already started with this idempotency key)"
            _say(f"run {reply.run_id} of {workflow} v{reply.version} started{note}")
        if not wait:
            if as_json:
                _say(json.dumps({"run_id": reply.run_id, "created": reply.created, "version": reply.version}))
            return 0
        run = await self._watch(reply.run_id, quiet=as_json)
        if as_json:
            _say(json.dumps(render.run_dict(run), indent=2))
        else:
            self._print_outcome(run)
        return 0 if run.state == pb.RUN_STATE_COMPLETED else 1

    async def _watch(self, run_id: str, *, quiet: bool) -> pb.Run:
        """Prints each task change until the run ends; reconnects if the coordinator restarts meanwhile."""
        outage_since: float | None = None
        seen: dict[str, tuple[int, int]] = {}
        while True:
            try:
                stream = self._stub.WatchRun(pb.WatchRunRequest(run_id=run_id), metadata=self._metadata)
                async for event in stream:
                    outage_since = None
                    if event.HasField("task"):
                        task = event.task
                        key = (task.state, task.attempt)
                        if seen.get(task.node_id) != key:
                            seen[task.node_id] = key
                            if not quiet and task.state != pb.TASK_STATE_PENDING:
                                _say("  " + render.event_line(task))
                    if event.HasField("run") and event.run.state in _TERMINAL:
                        run: pb.Run = event.run
                        return run
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise OperatorError(_explain(exc, self.settings)) from None
                now = time.monotonic()
                outage_since = outage_since or now
                if now - outage_since > _WATCH_RECONNECT_S:
                    raise OperatorError(_explain(exc, self.settings)) from None
                await asyncio.sleep(_RECONNECT_PAUSE_S)
                continue
            # The stream ended without a final event (the coordinator stopped): look again.
            reply = await self._call("GetRun", pb.GetRunRequest(run_id=run_id))
            if reply.run.state in _TERMINAL:
                final: pb.Run = reply.run
                return final
            await asyncio.sleep(_RECONNECT_PAUSE_S)

    @staticmethod
    def _print_outcome(run: pb.Run) -> None:
        state = render.run_state(run.state)
        elapsed = ""
        if run.created_at.seconds and run.updated_at.seconds:
            seconds = (run.updated_at.ToDatetime() - run.created_at.ToDatetime()).total_seconds()
            elapsed = f" in {seconds:.1f}s"
        _say(f"run {run.id} {state}{elapsed}")
        if run.error:
            _say(f"error: {run.error}")
        if run.output:
            try:
                output = json.dumps(json.loads(run.output), indent=2)
            except ValueError:
                output = run.output.decode(errors="replace")
            _say("output:")
            _say(output)

    async def show(self, run_id: str, *, as_json: bool) -> int:
        reply = await self._call("GetRun", pb.GetRunRequest(run_id=run_id))
        ignored = list(reply.ignored_reports)
        if as_json:
            _say(json.dumps(render.run_dict(reply.run, ignored), indent=2))
        else:
            _say(render.run_report(reply.run, ignored))
        return 0

    async def cancel(self, run_id: str, reason: str) -> int:
        reply = await self._call("CancelRun", pb.CancelRunRequest(run_id=run_id, reason=reason))
        if reply.cancelled:
            _say(f"run {run_id} cancelled")
        else:
            _say(f"run {run_id} had already ended ({render.run_state(reply.state)}); nothing to cancel")
        return 0

    async def dead_letters(self, run_id: str, limit: int, *, as_json: bool) -> int:
        reply = await self._call("ListDeadLetters", pb.ListDeadLettersRequest(run_id=run_id, limit=limit))
        items = list(reply.dead_letters)
        if as_json:
            _say(json.dumps([render.dead_letter_dict(d) for d in items], indent=2))
        else:
            _say(render.dead_letters_table(items))
        return 0
