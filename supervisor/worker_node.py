"""What a worker node runs, by role: the stages of children handed to `Node`.

Role `all` (the default): the Python and JavaScript language servers on
loopback ports, then the worker, told their addresses through
`LANG_WORKER_ADDRS`. When `LANG_WORKER_ADDRS` is already set, the language
servers are external and only the worker runs. Roles `worker`,
`langserver-python` and `langserver-js` run one part each, so each can be its
own container (and scale on its own).

The worker runs as its own process (`python -m worker`, on uvloop), not as a
fork of the supervisor: the supervisor holds gRPC channels (health checks),
and forking a process with gRPC threads is unsafe; a fresh interpreter also
starts with no inherited state.
"""

from __future__ import annotations

import socket

from supervisor.child import ChildSpec
from supervisor.config import Role, SupervisorConfig, parse_host_port
from supervisor.node import NodeSettings, Stage

__all__ = ["LANGSERVER_HEALTH_SERVICE", "bind_free_port", "node_settings", "node_stages"]

#: The gRPC service both language servers register with the health service.
LANGSERVER_HEALTH_SERVICE = "langserver.v1.LanguageServer"


def bind_free_port(host: str) -> int:
    """A TCP port on `host` that was free a moment ago."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _resolve(variable: str, addr: str) -> str:
    """`host:0` becomes `host:<free port>`, chosen once so a restarted server keeps its address."""
    host, port = parse_host_port(variable, addr)
    if port == 0:
        port = bind_free_port(host)
    return f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"


def _dial(addr: str) -> str:
    """How the worker on this machine reaches a server bound to `addr`."""
    host, _, port = addr.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("0.0.0.0", "[::]") else addr


def node_settings(config: SupervisorConfig) -> NodeSettings:
    return NodeSettings(
        restart_backoff_s=config.restart_backoff_s,
        restart_backoff_max_s=config.restart_backoff_max_s,
        crash_loop_limit=config.crash_loop_limit,
        crash_loop_window_s=config.crash_loop_window_s,
        watch_interval_s=config.watch_interval_s,
        ready_timeout_s=config.ready_timeout_s,
    )


def node_stages(config: SupervisorConfig, *, extra_env: dict[str, str] | None = None) -> list[Stage]:
    """The stages for `config.role`. Free ports are chosen here, once.

    Raises:
        ConfigError: an address is malformed.
    """
    env = {**config.environ, **(extra_env or {})}
    memory = config.memory_limit_mb << 20
    servers: list[ChildSpec] = []

    def langserver(name: str, variable: str, addr: str, cmd: tuple[str, ...]) -> str:
        bound = _resolve(variable, addr)
        servers.append(
            ChildSpec(
                name=name,
                argv=cmd,
                env={**env, "LANGSERVER_ADDR": bound},
                stop_timeout_s=config.langserver_stop_s,
                health_addr=bound,
                health_service=LANGSERVER_HEALTH_SERVICE,
                memory_limit_bytes=memory,
            )
        )
        return _dial(bound)

    role = config.role
    if role is Role.LANGSERVER_PYTHON:
        langserver("langserver-python", "LANGSERVER_PYTHON_ADDR", config.python_addr, config.python_cmd)
        return [Stage("language servers", servers)]
    if role is Role.LANGSERVER_JS:
        langserver("langserver-js", "LANGSERVER_JS_ADDR", config.js_addr, config.js_cmd)
        return [Stage("language servers", servers)]

    stages: list[Stage] = []
    worker_env = dict(env)
    if config.spawns_language_servers:
        python = langserver("langserver-python", "LANGSERVER_PYTHON_ADDR", config.python_addr, config.python_cmd)
        js = langserver("langserver-js", "LANGSERVER_JS_ADDR", config.js_addr, config.js_cmd)
        worker_env["LANG_WORKER_ADDRS"] = f"python:{python},js:{js}"
        stages.append(Stage("language servers", servers))
    worker = ChildSpec(
        name="worker", argv=config.worker_cmd, env=worker_env, stop_timeout_s=config.worker_stop_timeout_s
    )
    stages.append(Stage("worker", [worker]))
    return stages
