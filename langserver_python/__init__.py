"""The Python language server: runs user-written Python steps in layered sandboxes.

`python -m langserver_python` serves `langserver.v1.LanguageServer`. The gRPC
process (`server`, `grpc_service`, `admission`, `pool`) never runs user code;
it hands jobs to a fork server (`sandbox`) spawned before any gRPC thread,
which forks one confined child per execution. This package's `__init__`
imports nothing heavy: the fork server imports it too, and must not load grpc.
"""

from langserver_python.config import ServerConfig
from langserver_python.protocol import ErrorKind, ExecutionResult, Layer

__all__ = ["ErrorKind", "ExecutionResult", "Layer", "ServerConfig"]
