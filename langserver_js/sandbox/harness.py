"""The JavaScript installed in every isolate before the user's code, and the policy it applies.

The harness runs first in a fresh isolate and leaves behind only what the user may
touch: the reviewed ECMAScript globals of `ALLOWED_GLOBALS` and a `console` that
records into a capped buffer. Everything else on the global object is deleted
(default deny), so a global that a newer V8 or mini-racer adds is gone until someone
reviews it here. Its own functions live in a closure, reachable only through a
`const` with a random name per isolate: a script-level `const` is not a property of
`globalThis`, JavaScript has no way to list such bindings, and the name never
appears in anything the user code can read. Only the host's own source (appended
after the user's code, see `user_source`) names it.

The decisions, and why:

- Timers (`setTimeout`, `clearTimeout`, mini-racer's `__timer_manager`) are removed:
  an execution is over when `main()` returns or its promise settles, and a timer
  would be code outliving its execution. mini-racer installs them with `var`, so they
  cannot be deleted; they are overwritten with `undefined` and made read-only.
  (mini-racer's `__TimerManager` class binding cannot be removed either; it is inert
  because it needs `SharedArrayBuffer` and `Atomics`, which are gone.)
- `SharedArrayBuffer` and `Atomics` are removed: there is no other thread to share
  memory with, `Atomics.wait` blocks the isolate's thread, and `Atomics.waitAsync` is
  how mini-racer builds its timers.
- `WebAssembly` is removed: its memories live outside the V8 heap limit, its
  compilers are a large extra attack surface, and data transformations do not need
  it (a shared `Memory` would also hand out a `SharedArrayBuffer`).
- `Temporal` is not (yet) allowed: a large, new native implementation; `Date`
  covers time.
- `eval` and `Function` (string code generation) are kept: they give the code no
  capability it does not already have (it is arbitrary JavaScript already, and
  `constructor.constructor` reaches `Function` whatever the global names say); the
  boundary is the isolate and its process, not the language. Bundled libraries and
  template engines that users paste in rely on them.
- `require`, `process`, `module` and the other Node and web APIs simply do not exist
  in a bare V8 isolate; `typeof module === 'undefined'` keeps working, as UMD bundles
  expect. Using one of `DENIED_GLOBALS` reports a POLICY_VIOLATION that names it.

The harness treats the user code as hostile too: it captures every built-in it uses
before the user code runs (a user who replaces `JSON.stringify` or
`Promise.prototype.then` only changes their own values), builds its envelope from
null-prototype objects and primitives (no `toJSON` or setter on `Object.prototype`
can reach it), and gives the promise it returns its own `then`, so mini-racer's
`promise.then(...)` is the real one.

`run(inputJson)` returns an envelope string: a one-line JSON header (status, error
name/message/stack, logs), a newline, then the output JSON (empty unless the status
is "ok"). When `main()` returned a thenable, `run` returns undefined and `result()`
returns the envelope once it settled; the host asks again (a cancellable eval that
V8 runs after the microtasks) rather than registering a callback into Python, so
nothing on the host waits on V8 in a way a timeout cannot interrupt. The output is
serialised and measured inside the isolate, so an oversized result never crosses
into Python.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from typing import Final

__all__ = [
    "ALLOWED_GLOBALS",
    "DEFAULT_FILENAME",
    "DENIED_GLOBALS",
    "HARNESS_SOURCE_URL",
    "MAX_MESSAGE_CHARS",
    "MAX_STACK_CHARS",
    "drain_source",
    "new_binding",
    "prelude_source",
    "result_source",
    "safe_filename",
    "user_source",
]

# The ECMAScript globals user code keeps. Anything not named here is deleted.
ALLOWED_GLOBALS: Final = frozenset(
    {
        # Values and functions of the global object.
        "globalThis",
        "Infinity",
        "NaN",
        "undefined",
        "eval",
        "isFinite",
        "isNaN",
        "parseFloat",
        "parseInt",
        "decodeURI",
        "decodeURIComponent",
        "encodeURI",
        "encodeURIComponent",
        "escape",
        "unescape",
        # Fundamental objects and errors.
        "Object",
        "Function",
        "Boolean",
        "Symbol",
        "Error",
        "AggregateError",
        "EvalError",
        "RangeError",
        "ReferenceError",
        "SyntaxError",
        "TypeError",
        "URIError",
        "SuppressedError",
        # Numbers, dates, text.
        "Number",
        "BigInt",
        "Math",
        "Date",
        "String",
        "RegExp",
        "Intl",
        # Collections and binary data (ArrayBuffers are bounded by the process's RLIMIT_DATA and RSS watchdog).
        "Array",
        "Map",
        "Set",
        "WeakMap",
        "WeakSet",
        "ArrayBuffer",
        "DataView",
        "Int8Array",
        "Uint8Array",
        "Uint8ClampedArray",
        "Int16Array",
        "Uint16Array",
        "Int32Array",
        "Uint32Array",
        "Float16Array",
        "Float32Array",
        "Float64Array",
        "BigInt64Array",
        "BigUint64Array",
        # Structured data, control abstraction, reflection, memory management.
        "JSON",
        "Promise",
        "Iterator",
        "Proxy",
        "Reflect",
        "WeakRef",
        "FinalizationRegistry",
        "DisposableStack",
        "AsyncDisposableStack",
        # Replaced by the harness's capturing console.
        "console",
    }
)

# Names whose use is reported as a POLICY_VIOLATION (with this explanation)
# instead of a plain ReferenceError/TypeError.
DENIED_GLOBALS: Final[Mapping[str, str]] = {
    **dict.fromkeys(
        [
            "setTimeout",
            "setInterval",
            "setImmediate",
            "clearTimeout",
            "clearInterval",
            "clearImmediate",
            "__timer_manager",
        ],
        "timers are not available in this sandbox: an execution ends when main() returns or its promise settles",
    ),
    **dict.fromkeys(
        ["SharedArrayBuffer", "Atomics"],
        "shared memory and blocking waits are not available in this sandbox",
    ),
    "WebAssembly": "WebAssembly is not available in this sandbox",
    **dict.fromkeys(
        ["require", "process", "module", "exports", "Buffer", "global", "__dirname", "__filename"],
        "Node.js modules and APIs are not available in this sandbox: it runs plain ECMAScript",
    ),
    **dict.fromkeys(
        ["fetch", "XMLHttpRequest", "WebSocket", "importScripts", "Deno", "Bun"],
        "network and host APIs are not available in this sandbox",
    ),
}

DEFAULT_FILENAME: Final = "main.js"
# Contains ":", which `safe_filename` never lets through, so no user file can
# pose as the harness in a stack trace.
HARNESS_SOURCE_URL: Final = "langserver:harness"
MAX_MESSAGE_CHARS: Final = 4000
MAX_STACK_CHARS: Final = 16000
_MAX_FILENAME_CHARS: Final = 100
_FILENAME_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]")

_PRELUDE: Final = r"""
const BINDING = (function (cfg) {
  'use strict';
  const G = globalThis;
  const apply = Reflect.apply;
  const ownKeys = Reflect.ownKeys;
  const getOwnPropertyDescriptor = Reflect.getOwnPropertyDescriptor;
  const defineProperty = Reflect.defineProperty;
  const deleteProperty = Reflect.deleteProperty;
  const stringify = JSON.stringify;
  const parse = JSON.parse;
  const String_ = String;
  const Error_ = Error;
  const Promise_ = Promise;
  const promiseThen = Promise.prototype.then;
  const stringSlice = String.prototype.slice;
  const toWellFormed = String.prototype.toWellFormed;
  const freeze = Object.freeze;
  const maxOutput = cfg.maxOutputChars;
  const maxLog = cfg.maxLogChars;
  const maxMessage = cfg.maxMessageChars;
  const maxStack = cfg.maxStackChars;

  // Default deny: keep only the reviewed globals.
  const allowed = new Set(cfg.allowedGlobals);
  for (const key of ownKeys(G)) {
    if (typeof key !== 'string' || allowed.has(key)) continue;
    const desc = getOwnPropertyDescriptor(G, key);
    const removed = desc.configurable
      ? deleteProperty(G, key)
      : defineProperty(G, key, { value: undefined, writable: false });
    if (!removed) throw new Error_('the sandbox could not remove the global ' + key);
  }

  let logText = '';
  let logTruncated = false;

  function cut(text, limit) {
    return text.length > limit ? apply(stringSlice, text, [0, limit]) : text;
  }

  function show(value) {
    if (typeof value === 'string') return value;
    try {
      if (value instanceof Error_) {
        const stack = value.stack;
        if (typeof stack === 'string') return stack;
      }
      const text = stringify(value);
      if (typeof text === 'string') return text;
    } catch (_) {}
    try {
      return String_(value);
    } catch (_) {
      return '<unprintable value>';
    }
  }

  function record(prefix, args) {
    if (logTruncated) return;
    let line = prefix;
    for (let i = 0; i < args.length; i++) {
      if (i > 0) line += ' ';
      line += show(args[i]);
      if (line.length > maxLog) break;
    }
    const separator = logText.length > 0 ? 1 : 0;
    const room = maxLog - logText.length - separator;
    if (line.length > room) {
      logTruncated = true;
      if (room <= 0) return;
      line = apply(stringSlice, line, [0, room]);
    }
    logText += (separator ? '\n' : '') + line;
  }

  const console_ = freeze({
    log: function log(...args) { record('', args); },
    info: function info(...args) { record('', args); },
    debug: function debug(...args) { record('', args); },
    warn: function warn(...args) { record('[warn] ', args); },
    error: function error(...args) { record('[error] ', args); },
  });
  defineProperty(G, 'console', { value: console_, writable: true, enumerable: false, configurable: true });

  function describe(error) {
    let name = 'Uncaught';
    let message = '';
    let stack = '';
    try {
      if (error !== null && (typeof error === 'object' || typeof error === 'function')) {
        const errorMessage = error.message;
        if (typeof errorMessage === 'string') {
          const errorName = error.name;
          name = typeof errorName === 'string' ? errorName : 'Error';
          message = errorMessage;
          const errorStack = error.stack;
          if (typeof errorStack === 'string') stack = errorStack;
        } else {
          message = show(error);
        }
      } else {
        message = show(error);
      }
    } catch (_) {
      message = '<the thrown value could not be described>';
    }
    return { __proto__: null, name: cut(name, 200), message: cut(message, maxMessage), stack: cut(stack, maxStack) };
  }

  function wellFormed(text) {
    return apply(toWellFormed, text, []);
  }

  function envelope(status, error, output) {
    const header = stringify({
      __proto__: null,
      status: status,
      name: error === null ? '' : wellFormed(error.name),
      message: error === null ? '' : wellFormed(error.message),
      stack: error === null ? '' : wellFormed(error.stack),
      logs: wellFormed(logText),
      logsTruncated: logTruncated,
    });
    return header + '\n' + output;
  }

  function failed(error) {
    return envelope('runtime', describe(error), '');
  }

  function note(name, message) {
    return { __proto__: null, name: name, message: message, stack: '' };
  }

  function finish(value) {
    let output;
    try {
      output = stringify(value);
    } catch (error) {
      const described = describe(error);
      return envelope('runtime', note(described.name,
        'main() returned a value that cannot be serialised to JSON: ' + described.message), '');
    }
    if (output === undefined) output = 'null';
    if (output.length > maxOutput) {
      return envelope('output_too_large', note('OutputTooLarge',
        `the result is ${output.length} characters of JSON, over the limit of ${maxOutput}`), '');
    }
    return envelope('ok', null, output);
  }

  let settled;

  function run(inputJson) {
    let input;
    try {
      input = parse(inputJson);
    } catch (_) {
      return envelope('internal', note('Error', 'the input could not be parsed inside the sandbox'), '');
    }
    if (typeof main !== 'function') {
      return envelope('runtime', note('TypeError',
        'the code must define a function main(input), but main is ' + typeof main), '');
    }
    let value;
    try {
      value = main(input);
    } catch (error) {
      return failed(error);
    }
    let thenable = false;
    try {
      thenable = value !== null && (typeof value === 'object' || typeof value === 'function')
        && typeof value.then === 'function';
    } catch (error) {
      return failed(error);
    }
    if (!thenable) return finish(value);
    const adopted = new Promise_(function (adopt) { adopt(value); });
    apply(promiseThen, adopted, [
      function (result) { settled = finish(result); },
      function (error) { settled = failed(error); },
    ]);
    return undefined;
  }

  function result() {
    return settled;
  }

  function drain() {
    return stringify({ __proto__: null, logs: wellFormed(logText), logsTruncated: logTruncated });
  }

  return freeze({ __proto__: null, run: run, result: result, drain: drain });
})"""


def new_binding() -> str:
    """A fresh, unguessable name for one isolate's harness."""
    return f"__langserver_{secrets.token_hex(16)}"


def prelude_source(binding: str, *, max_output_chars: int, max_log_chars: int) -> str:
    """The harness script for one isolate, declaring its functions under `binding`."""
    cfg = {
        "allowedGlobals": sorted(ALLOWED_GLOBALS),
        "maxOutputChars": max_output_chars,
        "maxLogChars": max_log_chars,
        "maxMessageChars": MAX_MESSAGE_CHARS,
        "maxStackChars": MAX_STACK_CHARS,
    }
    script = _PRELUDE.replace("const BINDING =", f"const {binding} =", 1)
    return f"{script}({json.dumps(cfg)});\n//# sourceURL={HARNESS_SOURCE_URL}\n"


def safe_filename(requested: str) -> str:
    """The name the user's script gets in stack traces: letters, digits, `._-` only."""
    cleaned = _FILENAME_UNSAFE.sub("_", requested.strip())[:_MAX_FILENAME_CHARS]
    return cleaned if cleaned.strip("._") else DEFAULT_FILENAME


def user_source(code: str, filename: str, *, binding: str, input_json: str) -> str:
    """The user's code followed by the call of `main`, as one script.

    The user's lines keep their numbers; `;void 0;` closes whatever the last user
    line left open (or makes it a syntax error there); the appended call's result
    (the envelope, or undefined while a returned promise is pending) is the
    script's completion value, so a script ending in a huge expression is never
    copied into Python. `sourceURL` names the user's stack frames.
    """
    call = f"{binding}.run({json.dumps(input_json, ensure_ascii=False)});"
    return f"{code}\n;void 0;\n{call}\n//# sourceURL={filename}\n"


def result_source(binding: str) -> str:
    """Asks the harness for the envelope of a settled promise (undefined while pending)."""
    return f"{binding}.result()"


def drain_source(binding: str) -> str:
    """Asks the harness for the logs captured so far (after a timeout or memory failure)."""
    return f"{binding}.drain()"
