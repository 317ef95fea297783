"""The sandbox: a fork server and the children it confines and runs user code in.

Runs in its own process (`python -m langserver_python.sandbox`), spawned by
the gRPC process before it starts any thread; nothing here imports grpc.

- `forkserver`: the single-threaded loop that forks, times out and reaps children;
- `preparation`: what the fork server warms and sets up once;
- `child`: the confinement steps of one child, in order;
- `runner`: compiling and running the user code, shaping its result;
- `policy`, `facades`: layer 1 (RestrictedPython guards, module facades);
- `audit`: layer 2 (PEP 578 audit hook);
- `seccomp`, `landlock`, `libc`: layer 4 (kernel).
"""

__all__: list[str] = []
