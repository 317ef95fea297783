"""`python -m supervisor.probe`: a health probe for container healthchecks (compose; Kubernetes uses its own).

    python -m supervisor.probe grpc HOST:PORT [SERVICE]   # exit 0 when the gRPC health service says SERVING
    python -m supervisor.probe http URL                   # exit 0 on a 2xx answer (the worker's /readyz)

Exit 1 otherwise, with one line on stderr. It needs no shell and writes no
file, so it works in the hardened images (read-only root, no capabilities).
"""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

__all__ = ["main"]

_TIMEOUT_S = 3.0


def _grpc(addr: str, service: str) -> str | None:
    with grpc.insecure_channel(addr) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=_TIMEOUT_S
            )
        except grpc.RpcError as exc:
            return f"{addr}: {exc.code().name}"
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return f"{addr}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
    return None


def _http(url: str) -> str | None:
    if not url.startswith(("http://", "https://")):
        return f"{url}: not an http(s) URL"
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response:
            status = int(response.status)
    except OSError as exc:
        return f"{url}: {exc}"
    return None if 200 <= status < 300 else f"{url}: HTTP {status}"


def main(argv: Sequence[str]) -> int:
    if len(argv) >= 2 and argv[0] == "grpc":
        problem = _grpc(argv[1], argv[2] if len(argv) > 2 else "")
    elif len(argv) == 2 and argv[0] == "http":
        problem = _http(argv[1])
    else:
        print("usage: python -m supervisor.probe grpc HOST:PORT [SERVICE] | http URL", file=sys.stderr)
        return 2
    if problem:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
