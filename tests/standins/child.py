"""A stand-in child for supervisor tests: a real process that behaves as told.

    python tests/standins/child.py NAME [options]

It appends "<NAME> <event> <pid> [detail]" lines to $STANDIN_RECORD (started,
term, exit) so tests can see what happened and in which order, logs one JSON
line and one plain line at start (log-merging tests), and:

  --serve             serve the standard gRPC health service (SERVING for "" and
                      langserver.v1.LanguageServer) on $LANGSERVER_ADDR
  --exit-after S      exit with --exit-code (default 1) after S seconds
  --exit-code N       the code for --exit-after (and exit at once when given alone)
  --ignore-term       ignore SIGTERM (the supervisor must SIGKILL it)
  --drain S           on SIGTERM, wait S seconds before exiting 0
  --grow-mb N         allocate and touch N MiB after start
  --grandchild        start a sleeping grandchild in the same process group
  --not-serving       serve health, but report NOT_SERVING
  --serve-after S     wait S seconds before serving
  --unhealthy-after S report NOT_SERVING S seconds after serving (and stay up)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
from typing import Any


def record(name: str, event: str, detail: str = "") -> None:
    path = os.environ.get("STANDIN_RECORD")
    if path:
        with open(path, "a") as f:
            f.write(f"{name} {event} {os.getpid()} {detail}".rstrip() + "\n")


async def serve_health(addr: str, serving: bool) -> tuple[Any, Any]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_health.v1._async import HealthServicer

    server = grpc.aio.server()
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    server.add_insecure_port(addr)
    await server.start()
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for service in ("", "langserver.v1.LanguageServer"):
        await health.set(service, status)
    return server, health


async def main(args: argparse.Namespace) -> int:
    name = args.name
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    record(name, "started", os.environ.get("LANG_WORKER_ADDRS", ""))
    print(json.dumps({"event": f"{name} started", "level": "info", "service": name}), file=sys.stderr, flush=True)
    print(f"plain text from {name}", flush=True)
    if args.grandchild:
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # noqa: ASYNC220
        record(name, "grandchild", str(grandchild.pid))
    hog = None
    if args.grow_mb:
        hog = bytearray(args.grow_mb << 20)
        for i in range(0, len(hog), 4096):
            hog[i] = 1
    server = None
    if args.serve or args.not_serving:
        if args.serve_after:
            await asyncio.sleep(args.serve_after)
        server, health = await serve_health(os.environ["LANGSERVER_ADDR"], serving=not args.not_serving)
        record(name, "serving", os.environ["LANGSERVER_ADDR"])
        if args.unhealthy_after:
            await asyncio.sleep(args.unhealthy_after)
            await health.enter_graceful_shutdown()  # every service reports NOT_SERVING from now on
            record(name, "unhealthy")
    if args.exit_code is not None and args.exit_after is None:
        record(name, "exit", str(args.exit_code))
        return int(args.exit_code)
    try:
        async with asyncio.timeout_at(None if args.exit_after is None else loop.time() + args.exit_after):
            await stop.wait()
    except TimeoutError:
        code = 1 if args.exit_code is None else int(args.exit_code)
        record(name, "exit", str(code))
        return code
    record(name, "term")
    if args.drain:
        await asyncio.sleep(args.drain)
    if server is not None:
        await server.stop(None)
    record(name, "exit", "0")
    del hog
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--not-serving", action="store_true")
    parser.add_argument("--exit-after", type=float)
    parser.add_argument("--exit-code", type=int)
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--drain", type=float, default=0.0)
    parser.add_argument("--grow-mb", type=int, default=0)
    parser.add_argument("--grandchild", action="store_true")
    parser.add_argument("--serve-after", type=float, default=0.0)
    parser.add_argument("--unhealthy-after", type=float, default=0.0)
    sys.exit(asyncio.run(main(parser.parse_args())))
