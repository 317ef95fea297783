"""`python -m supervisor --dev`: the whole system on one machine.

    embedded PostgreSQL + Redis ─► coordinator ─► language servers ─► worker
                                                        │
              register examples/*.json, run the example ◄┘ (python -m coordinator ...)

PostgreSQL and Redis are embedded servers from PyPI packages, with their data
in `DevConfig.data_dir` (reused across starts); `DATABASE_URL`, `REDIS_ADDR`
or `COORDINATOR_ADDR` in the environment replace the corresponding part with
the real service. The example's HTTP steps call a small endpoint served by
this process on a loopback port (`example_api.py`), whose URL goes into the
run input.

The examples are registered and run with the operator CLI itself
(`python -m coordinator register|run --wait`), as one-shot children whose
stdout is ours: what a user sees is exactly what the CLI prints, and the
supervisor does not import the coordinator's internals.

Ctrl-C (or SIGTERM) stops everything in order: worker, language servers,
coordinator, then Redis and PostgreSQL. A second Ctrl-C kills what is left.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
from pathlib import Path

from supervisor.child import ChildSpec
from supervisor.config import DevConfig, SupervisorConfig
from supervisor.embedded import EmbeddedPostgres, EmbeddedRedis, EmbeddedServerError
from supervisor.errors import StartFailed
from supervisor.example_api import example_api
from supervisor.node import EXIT_FAILED, AfterReady, Node, Stage
from supervisor.worker_node import bind_free_port, node_settings, node_stages

__all__ = ["EXAMPLE_INPUT", "EXAMPLE_WORKFLOW", "run_dev"]

log = logging.getLogger(__name__)

EXAMPLE_WORKFLOW = "order_pipeline"
#: The example run's input, beside the endpoint's base URL.
EXAMPLE_INPUT = {"order_id": 1042}
_COORDINATOR_STOP_S = 15.0
_CLI_STOP_S = 5.0
#: The worker's default metrics port (worker/config.py).
_WORKER_METRICS_PORT = 9464


def say(text: str) -> None:
    """A line for the human at the terminal (stdout); logs go to stderr.

    If whoever read our stdout went away (a closed pipe), the stack keeps
    running and stopping normally: further output goes to /dev/null.
    """
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


class _Embedded:
    """The embedded servers this run started; stopped last, in reverse order."""

    def __init__(self) -> None:
        self.postgres: EmbeddedPostgres | None = None
        self.redis: EmbeddedRedis | None = None

    def pids(self) -> set[int]:
        return {pid for pid in (self.postgres and self.postgres.pid, self.redis and self.redis.pid) if pid}

    def stop(self, *, force: bool) -> None:
        for server in (self.redis, self.postgres):
            if server is not None:
                server.kill() if force else server.stop()


def _dial(addr: str) -> str:
    host, _, port = addr.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("0.0.0.0", "[::]") else addr


async def run_dev(config: SupervisorConfig, dev: DevConfig, *, stop: asyncio.Event, force: asyncio.Event) -> int:
    """Runs the whole system until `stop`; returns the exit code (see `node.py`)."""
    embedded = _Embedded()
    try:
        database_url, redis_addr = _start_embedded(dev, embedded)
        if stop.is_set():
            return 0
        async with example_api() as base_url:
            stages, coordinator_addr = _stages(config, dev, database_url, redis_addr)
            node = Node(stages, node_settings(config), keep_pids=embedded.pids)
            examples = _examples(config, dev, coordinator_addr, base_url)
            return await node.run(stop=stop, force=force, after_ready=examples)
    except StartFailed as exc:
        log.error("%s", exc)
        say(f"dev stack failed to start: {exc}")
        return EXIT_FAILED
    finally:
        embedded.stop(force=force.is_set())
        say("dev stack stopped")


def _start_embedded(dev: DevConfig, embedded: _Embedded) -> tuple[str | None, str]:
    """Starts what the environment does not provide. Runs in the main thread (see `embedded.py`)."""
    database_url = dev.database_url
    try:
        if dev.coordinator_addr is None and database_url is None:
            dev.data_dir.mkdir(parents=True, exist_ok=True)
            embedded.postgres = EmbeddedPostgres(dev.data_dir / "postgres", durable=True)
            say(f"starting embedded PostgreSQL (data in {dev.data_dir / 'postgres'}) ...")
            database_url = embedded.postgres.start()
        redis_addr = dev.redis_addr
        if redis_addr is None:
            embedded.redis = EmbeddedRedis(dev.data_dir / "redis", appendonly=True)
            say(f"starting embedded Redis (data in {dev.data_dir / 'redis'}) ...")
            embedded.redis.start()
            redis_addr = embedded.redis.addr
    except (EmbeddedServerError, OSError) as exc:
        raise StartFailed(f"embedded server: {exc}") from exc
    return database_url, redis_addr


def _stages(
    config: SupervisorConfig, dev: DevConfig, database_url: str | None, redis_addr: str
) -> tuple[list[Stage], str]:
    stages: list[Stage] = []
    coordinator_addr = dev.coordinator_addr
    if coordinator_addr is None:
        assert database_url is not None
        listen = dev.coordinator_listen_addr
        host, _, port = listen.rpartition(":")
        if port == "0":
            listen = f"{host}:{bind_free_port(host)}"
        elif not _port_free(host, int(port)):
            raise StartFailed(f"{listen} is already in use (another coordinator?); set COORDINATOR_LISTEN_ADDR")
        coordinator = ChildSpec(
            name="coordinator",
            argv=(sys.executable, "-m", "coordinator", "serve"),
            env={
                **config.environ,
                "DATABASE_URL": database_url,
                "REDIS_ADDR": redis_addr,
                "COORDINATOR_LISTEN_ADDR": listen,
            },
            stop_timeout_s=_COORDINATOR_STOP_S,
            health_addr=listen,
        )
        stages.append(Stage("coordinator", [coordinator]))
        coordinator_addr = _dial(listen)
    extra = {"COORDINATOR_ADDR": coordinator_addr, "REDIS_ADDR": redis_addr}
    if not config.environ.get("WORKER_METRICS_PORT") and not _port_free("127.0.0.1", _WORKER_METRICS_PORT):
        extra["WORKER_METRICS_PORT"] = "0"  # the worker logs the port it picked
        say(f"port {_WORKER_METRICS_PORT} is taken: the worker's /metrics goes on a free port (see its log)")
    stages += node_stages(config, extra_env=extra)
    return stages, coordinator_addr


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True


def _examples(config: SupervisorConfig, dev: DevConfig, coordinator_addr: str, base_url: str) -> AfterReady:
    files = sorted(str(p) for p in Path(dev.examples_dir).glob("*.json"))
    env = {**config.environ, "COORDINATOR_ADDR": coordinator_addr}

    def cli(name: str, *args: str) -> ChildSpec:
        return ChildSpec(
            name=name,
            argv=(sys.executable, "-m", "coordinator", *args),
            env=env,
            stop_timeout_s=_CLI_STOP_S,
            restart=False,
            keep_stdout=True,
        )

    async def run(node: Node) -> None:
        say(f"dev stack ready: coordinator at {coordinator_addr} (COORDINATOR_ADDR), example API at {base_url}")
        if not files:
            say(f"no workflows in {dev.examples_dir}; nothing to register")
        elif await node.run_job(cli("register-examples", "register", *files)) != 0:
            say("registering the examples failed (see the log); the stack keeps running")
        elif dev.run_example:
            run_input = json.dumps({**EXAMPLE_INPUT, "base_url": base_url})
            say(f"running the example workflow {EXAMPLE_WORKFLOW!r} with input {run_input}")
            code = await node.run_job(cli("example-run", "run", EXAMPLE_WORKFLOW, "--input", run_input, "--wait"))
            if code != 0:
                say(f"the example run did not complete (exit code {code}); the stack keeps running")
        say(
            "the stack keeps running; press Ctrl-C to stop it. Inspect runs with: "
            f"COORDINATOR_ADDR={coordinator_addr} python -m coordinator show <run id>"
        )

    return run
