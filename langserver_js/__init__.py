"""The JavaScript language server: runs user-written JavaScript steps in V8 isolates.

`python -m langserver_js` serves `langserver.v1.LanguageServer/Execute` for runtime
"js" (alias "node"). Every execution gets a fresh V8 isolate (mini-racer) inside a
pool of sandbox processes that the server recycles, so a fatal V8 error costs one
execution, never the server. Configuration: `langserver_js.config`.

Modules: `config` (environment), `errors` (exception tree), `protocol` (server ↔
sandbox frames), `worker_process` (one sandbox process), `pool` (the slots),
`service` (the gRPC servicer), `server` (wiring and shutdown), `sandbox` (what runs
inside a sandbox process: the harness, one execution per isolate, limits).
"""

from langserver_js.config import ServerConfig
from langserver_js.errors import LangServerJsError

__all__ = ["LangServerJsError", "ServerConfig"]
