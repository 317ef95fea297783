"""The HTTP executor: one request per task, on one shared, pooled aiohttp session.

The session is created once per worker and reused by every task, so TCP and
TLS connections are kept alive across thousands of tasks (bounded in total and
per host). It has no global timeout: each request carries its task's deadline.

The task input is the node's request, already resolved by the coordinator::

    {"method": "POST", "url": "https://...", "headers": {"X-A": "b"}, "body": <JSON value or null>}

Rules (seed step 10, plus the issue):

* ``Idempotency-Key: <task id>`` on POST, PUT and PATCH unless the caller set
  one. The task id is the same across every attempt and redelivery, so an API
  that honours the header performs a retried request once.
* A body is sent as is when it is a string, JSON-encoded otherwise; the
  content type defaults to ``application/json`` when there is a body.
* A status >= 400 fails the task with the status and (the start of) the body.
* The response becomes the task's output as JSON: empty -> ``{}``; valid JSON
  as is; anything else -> ``{"body": "<text>"}``.
* A response body over the output limit fails the task; nothing is truncated.
* A bad node configuration (no URL, bad method...) fails the task with a
  message naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from worker.executors.executor import ExecutionResult, TaskContext

__all__ = ["ALLOWED_METHODS", "HTTPExecutor", "normalize_response_body"]

#: Methods a node may use; anything else fails the task naming the field.
ALLOWED_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
#: Methods that change state and therefore carry the task's idempotency key.
IDEMPOTENCY_KEY_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})
#: How much of an error response's body goes into the task's error message.
ERROR_BODY_EXCERPT_BYTES: Final = 1024
#: Connection pool bounds of the shared session.
POOL_LIMIT: Final = 100
POOL_LIMIT_PER_HOST: Final = 20
KEEPALIVE_TIMEOUT_S: Final = 30.0
CONNECT_TIMEOUT_S: Final = 30.0
_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class _Request:
    method: str
    url: URL
    headers: CIMultiDict[str]
    body: bytes | None

    @property
    def display(self) -> str:
        """Method and URL without credentials, query or fragment: safe in an error message."""
        return f"{self.method} {self.url.with_user(None).with_query(None).with_fragment(None)}"


class _BadConfig(Exception):
    """Internal: the node's request is malformed; the message names the field."""


def _parse_request(task_input: Any, task_id: str) -> _Request:
    if not isinstance(task_input, Mapping):
        raise _BadConfig("http node input must be a JSON object with 'method', 'url', 'headers' and 'body'")
    method = task_input.get("method", "GET")
    if method is None:
        method = "GET"
    if not isinstance(method, str) or method.upper() not in ALLOWED_METHODS:
        raise _BadConfig(
            f"http node field 'method' must be one of {', '.join(sorted(ALLOWED_METHODS))}, got {method!r}"
        )
    method = method.upper()
    raw_url = task_input.get("url")
    if not isinstance(raw_url, str) or not raw_url.strip():
        raise _BadConfig("http node field 'url' is required (a non-empty string)")
    try:
        url = URL(raw_url.strip())
    except (ValueError, TypeError) as exc:
        raise _BadConfig(f"http node field 'url' is not a valid URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise _BadConfig(f"http node field 'url' must be an absolute http:// or https:// URL, got {raw_url[:200]!r}")
    raw_headers = task_input.get("headers") or {}
    if not isinstance(raw_headers, Mapping):
        raise _BadConfig("http node field 'headers' must be an object of string values")
    headers: CIMultiDict[str] = CIMultiDict()
    for name, value in raw_headers.items():
        if not isinstance(name, str) or not isinstance(value, str) or not name:
            raise _BadConfig(f"http node field 'headers' must be an object of string values (header {name!r})")
        if any(c in name or c in value for c in "\r\n\0") or any(c.isspace() or c == ":" for c in name):
            raise _BadConfig(f"http node field 'headers' has a malformed header {name!r}")
        headers[name] = value
    raw_body = task_input.get("body")
    body: bytes | None
    if raw_body is None:
        body = None
    elif isinstance(raw_body, str):
        body = raw_body.encode()
    else:
        body = json.dumps(raw_body, separators=(",", ":")).encode()
    if body is not None and "Content-Type" not in headers:
        headers["Content-Type"] = "application/json"
    if method in IDEMPOTENCY_KEY_METHODS and "Idempotency-Key" not in headers:
        headers["Idempotency-Key"] = task_id
    return _Request(method=method, url=url, headers=headers, body=body)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def normalize_response_body(body: bytes, charset: str | None = None) -> bytes:
    """Returns a response body as a JSON document, so downstream templates always get JSON.

    Empty -> ``{}``; valid JSON -> as is (re-encoded only when it is not plain
    UTF-8, e.g. UTF-16 or with a byte-order mark); anything else ->
    ``{"body": "<text>"}`` with the text decoded by the response's charset
    (UTF-8 by default, undecodable bytes replaced).
    """
    if not body:
        return b"{}"
    try:
        parsed = json.loads(body, parse_constant=_reject_constant)
    except ValueError:
        pass
    else:
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            return json.dumps(parsed, separators=(",", ":")).encode()
        if body.startswith(b"\xef\xbb\xbf"):
            return json.dumps(parsed, separators=(",", ":")).encode()
        return body
    return json.dumps({"body": _decode(body, charset)}, separators=(",", ":")).encode()


def _decode(data: bytes, charset: str | None) -> str:
    try:
        return data.decode(charset or "utf-8", errors="replace")
    except LookupError:  # an unknown charset name in Content-Type
        return data.decode("utf-8", errors="replace")


class HTTPExecutor:
    """Executes HTTP tasks on one shared session; build it with :meth:`create`, end it with :meth:`close`."""

    def __init__(self, session: aiohttp.ClientSession, *, max_response_bytes: int) -> None:
        self._session = session
        self._max_response_bytes = max_response_bytes

    @classmethod
    async def create(cls, *, max_response_bytes: int) -> HTTPExecutor:
        """Builds the executor and its pooled session (inside the running event loop).

        Args:
            max_response_bytes: the largest response body accepted; a larger one
                fails the task (the worker passes its output limit).
        """
        connector = aiohttp.TCPConnector(
            limit=POOL_LIMIT, limit_per_host=POOL_LIMIT_PER_HOST, keepalive_timeout=KEEPALIVE_TIMEOUT_S
        )
        session = aiohttp.ClientSession(
            connector=connector,
            # No global timeout: each request gets its task's remaining time.
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
            raise_for_status=False,
        )
        return cls(session, max_response_bytes=max_response_bytes)

    @property
    def node_type(self) -> str:
        return "http"

    async def close(self) -> None:
        """Closes the pooled connections. Idempotent."""
        if not self._session.closed:
            await self._session.close()

    async def execute(self, task: TaskContext, task_input: Any) -> ExecutionResult:
        """Sends the task's request and returns its normalised response (see the module docstring).

        Cancel-safe: cancellation aborts the request and closes its connection.
        """
        try:
            request = _parse_request(task_input, task.task_id)
        except _BadConfig as exc:
            return ExecutionResult.failed(str(exc))
        timeout_s = max(task.remaining_s(), 0.001)
        try:
            async with self._session.request(
                request.method,
                request.url,
                headers=request.headers,
                data=request.body,
                timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(timeout_s, CONNECT_TIMEOUT_S)),
            ) as response:
                if response.status >= 400:
                    excerpt, more = await _read_excerpt(response)
                    return ExecutionResult.failed(
                        f"HTTP {response.status} from {request.display}: {excerpt}"
                        + (f" [first {ERROR_BODY_EXCERPT_BYTES} bytes of a longer body]" if more else "")
                    )
                declared = response.content_length
                if declared is not None and declared > self._max_response_bytes:
                    return self._too_large(request, f"{declared} bytes declared")
                body = bytearray()
                async for chunk in response.content.iter_chunked(_CHUNK):
                    body += chunk
                    if len(body) > self._max_response_bytes:
                        return self._too_large(request, f"over {self._max_response_bytes} bytes read")
                return ExecutionResult.ok(normalize_response_body(bytes(body), response.charset))
        except TimeoutError:
            return ExecutionResult.failed(f"HTTP request {request.display} timed out after {timeout_s:.3g} s")
        except aiohttp.ClientError as exc:
            return ExecutionResult.failed(f"HTTP request {request.display} failed: {type(exc).__name__}: {exc}")

    def _too_large(self, request: _Request, seen: str) -> ExecutionResult:
        return ExecutionResult.failed(
            f"HTTP response body from {request.display} exceeds the limit of {self._max_response_bytes} bytes "
            f"({seen}; WORKER_MAX_OUTPUT_BYTES)"
        )


async def _read_excerpt(response: aiohttp.ClientResponse) -> tuple[str, bool]:
    """Reads at most ERROR_BODY_EXCERPT_BYTES (+1 to know whether there is more) of an error body."""
    data = await response.content.read(ERROR_BODY_EXCERPT_BYTES + 1)
    while len(data) <= ERROR_BODY_EXCERPT_BYTES and not response.content.at_eof():
        more = await response.content.read(ERROR_BODY_EXCERPT_BYTES + 1 - len(data))
        if not more:
            break
        data += more
    truncated = len(data) > ERROR_BODY_EXCERPT_BYTES
    return _decode(data[:ERROR_BODY_EXCERPT_BYTES], response.charset), truncated
