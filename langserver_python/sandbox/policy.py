"""Layer 1, the language: RestrictedPython's compiler plus this module's guards.

User code is compiled with RestrictedPython (9.0, whose transformer rejects
`_`-prefixed names and attributes, `eval`/`exec` calls, `try/except*`, async
code, `nonlocal`, `metaclass=` and the frame/generator attributes in
`INSPECT_ATTRIBUTES`) and runs with the guards below in its globals:

- `_getattr_` checks the name (no `_` prefix, no frame/code/generator
  introspection, no `str.format`/`format_map`, no `string.Formatter` methods),
  then delegates to RestrictedPython's `safer_getattr`, then refuses to hand
  back a module, frame, code or traceback object whatever path led there.
- `_getitem_` applies the same result check to subscripts.
- `_write_` allows assignment only to data containers, to classes defined by
  the user code and their instances, and to `decimal.Context`; never to
  facades, stdlib classes or functions.
- `__import__` returns facades (see `facades`), and only for allowed names.
- Builtins are RestrictedPython's `safe_builtins` plus plain data helpers;
  names that would open a hole (`open`, `type`, `vars`, `globals`, …) are
  present as stubs that record a violation when called.

Advisories checked against RestrictedPython 9.0 (`RestrictedPython>=9.0` is
the pinned floor):

| advisory | hole | where it is closed |
|---|---|---|
| CVE-2023-37271 | generator `gi_frame` → `f_back` → `f_globals` | 9.0 transformer + `_getattr_` (INSPECT_ATTRIBUTES) + result check |
| CVE-2023-41039 | `str.format`/`format_map` attribute walks | `safer_getattr` (instances and `str` itself) + our check |
| CVE-2024-47532 | `AttributeError.obj`, `string.Formatter` | `string` facade drops `Formatter`; result check refuses modules |
| CVE-2025-22153 | `try/except*` type confusion (CPython 3.11-3.13.1) | 9.0 rejects `TryStar`; `ExceptionGroup` not a builtin |
| CVE-2026-55830 | positional-only params shadowing `_getattr_` | 9.0 checks positional-only names |
| CVE-2026-76825 | `string.Formatter` field resolution | `safer_getattr` + facade |
| 9.0 changelog | `tuple`/`sorted`/`zip`/`bytes` iterate past `_getiter_` | not a hole here: our `_getiter_` enforces nothing per object; policy lives in attribute, item and import guards |

A violation is *sticky*: the guard records it before raising, so code that
catches the exception still ends as `POLICY_VIOLATION` (see `VIOLATIONS`).
"""

from __future__ import annotations

import ast
import builtins
import collections
import decimal
import operator
import string
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

from RestrictedPython.compile import compile_restricted_exec
from RestrictedPython.Guards import (
    guarded_iter_unpack_sequence,
    guarded_unpack_sequence,
    safe_builtins,
    safer_getattr,
    safer_getattr_raise,
)
from RestrictedPython.transformer import INSPECT_ATTRIBUTES

from langserver_python.sandbox.facades import Facade

# RestrictedPython's guards are untyped; these aliases type them once.
_safer_getattr: Callable[..., Any] = safer_getattr
_safer_getattr_raise: Callable[..., Any] = safer_getattr_raise

__all__ = ["VIOLATIONS", "CompileFailure", "PolicyViolation", "Violations", "compile_user_code", "restricted_globals"]


class PolicyViolation(Exception):
    """Raised by a guard; the execution ends as POLICY_VIOLATION even if caught."""


class Violations:
    """The first policy violation of this process, with the user-code line.

    One per child process (module global): each execution is its own process,
    so nothing here outlives it. User code cannot reach this object.
    """

    def __init__(self) -> None:
        self.message: str | None = None
        self.line = 0
        self.filename = ""

    def record(self, message: str) -> PolicyViolation:
        """Remembers `message` if it is the first, and returns the exception to raise."""
        if self.message is None:
            self.message = message
            self.line = self._user_line()
        return PolicyViolation(message)

    def _user_line(self) -> int:
        frame: types.FrameType | None = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_filename == self.filename:
                return frame.f_lineno or 0
            frame = frame.f_back
        return 0


VIOLATIONS = Violations()


def missing_facade_name(qualified: str) -> PolicyViolation:
    """`Facade.__getattr__` hook: user code asked for a name the facade lacks."""
    return VIOLATIONS.record(f"'{qualified}' is not available in the sandbox")


class CompileFailure(Exception):
    """The code does not compile; `kind` is "syntax" or "policy"."""

    def __init__(self, kind: str, message: str, line: int) -> None:
        super().__init__(message)
        self.kind, self.message, self.line = kind, message, line


def compile_user_code(source: str, filename: str, *, restricted: bool) -> types.CodeType:
    """Compiles user code, restricted or (for tests of other layers) plain.

    Raises:
        CompileFailure: a syntax error, or a construct the policy refuses.
    """
    try:
        tree = ast.parse(source, filename, "exec")
    except SyntaxError as exc:
        raise CompileFailure("syntax", f"{exc.msg}", exc.lineno or 0) from None
    except (ValueError, RecursionError, MemoryError) as exc:
        # NUL bytes, or nesting deeper than the parser's stack.
        raise CompileFailure("syntax", f"{type(exc).__name__}: {exc}", 0) from None
    if not restricted:
        return compile(tree, filename, "exec")
    result = compile_restricted_exec(tree, filename=filename)
    if result.errors or result.code is None:
        first = result.errors[0] if result.errors else "refused by the sandbox policy"
        line = 0
        if first.startswith("Line "):
            head, _, rest = first.partition(":")
            line = int(head[5:]) if head[5:].isdigit() else 0
            first = rest.strip()
        more = f" (and {len(result.errors) - 1} more)" if len(result.errors) > 1 else ""
        raise CompileFailure("policy", first + more, line)
    return result.code


# --- guards -----------------------------------------------------------------

_UNREACHABLE_TYPES = (types.ModuleType, types.FrameType, types.CodeType, types.TracebackType)
_FORMATTER_METHODS = frozenset({"format", "vformat", "get_field", "get_value", "parse", "convert_field"})


def _check_result(value: Any, what: str) -> Any:
    if isinstance(value, _UNREACHABLE_TYPES):
        raise VIOLATIONS.record(f"{what} leads to a {type(value).__name__} object, which is not reachable")
    return value


_RAISE = object()


def guarded_getattr(obj: Any, name: Any, default: Any = _RAISE) -> Any:
    """`_getattr_` and the `getattr` builtin (see the module docstring)."""
    if type(name) is not str:
        raise TypeError("attribute name must be a string")
    if name.startswith("_"):
        raise VIOLATIONS.record(f"access to attribute '{name}' (names starting with '_' are private)")
    if name in INSPECT_ATTRIBUTES:
        raise VIOLATIONS.record(f"access to attribute '{name}' (frame and code introspection)")
    if name in ("format", "format_map") and (isinstance(obj, str) or (isinstance(obj, type) and issubclass(obj, str))):
        raise VIOLATIONS.record(f"str.{name}() (it walks attributes named in the format string; use an f-string)")
    if name in _FORMATTER_METHODS and (
        isinstance(obj, string.Formatter) or (isinstance(obj, type) and issubclass(obj, string.Formatter))
    ):
        raise VIOLATIONS.record(f"string.Formatter.{name}()")
    try:
        value = _safer_getattr_raise(obj, name) if default is _RAISE else _safer_getattr(obj, name, default)
    except NotImplementedError as exc:  # safer_getattr's own refusals
        raise VIOLATIONS.record(str(exc)) from None
    return _check_result(value, f"attribute '{name}'")


def guarded_hasattr(obj: Any, name: Any) -> bool:
    try:
        guarded_getattr(obj, name)
    except AttributeError:
        return False
    return True


def guarded_getitem(obj: Any, key: Any) -> Any:
    return _check_result(obj[key], "a subscript")


_USER_CLASSES: set[type] = set()
_WRITABLE_CONTAINERS = (dict, list, bytearray, set, collections.deque)
_WRITABLE_INSTANCES = (decimal.Context,)


def guarded_write(obj: Any) -> Any:
    """`_write_`: the object an assignment `obj.x = …` / `obj[k] = …` may target."""
    if isinstance(obj, (_WRITABLE_CONTAINERS, _WRITABLE_INSTANCES)):
        return obj
    if type(obj) in _USER_CLASSES or (isinstance(obj, type) and obj in _USER_CLASSES):
        return obj
    raise VIOLATIONS.record(f"assignment to attributes or items of {type(obj).__name__!r} objects")


def guarded_setattr(obj: Any, name: Any, value: Any) -> None:
    if type(name) is not str or name.startswith("_"):
        raise VIOLATIONS.record(f"setattr() of attribute {name!r}")
    setattr(guarded_write(obj), name, value)


def guarded_delattr(obj: Any, name: Any) -> None:
    if type(name) is not str or name.startswith("_"):
        raise VIOLATIONS.record(f"delattr() of attribute {name!r}")
    delattr(guarded_write(obj), name)


def user_metaclass(name: str, bases: tuple[Any, ...], namespace: dict[str, Any]) -> type:
    """`__metaclass__` of every `class` statement: builds and registers the class."""
    meta: type = type
    for base in bases:
        if isinstance(base, type) and issubclass(type(base), meta):
            meta = type(base)
    cls: type = meta(name, bases, namespace)
    _USER_CLASSES.add(cls)
    return cls


_INPLACE_OPERATORS: Mapping[str, Callable[[Any, Any], Any]] = {
    "+=": operator.iadd,
    "-=": operator.isub,
    "*=": operator.imul,
    "/=": operator.itruediv,
    "//=": operator.ifloordiv,
    "%=": operator.imod,
    "**=": operator.ipow,
    "<<=": operator.ilshift,
    ">>=": operator.irshift,
    "|=": operator.ior,
    "^=": operator.ixor,
    "&=": operator.iand,
    "@=": operator.imatmul,
}


def inplace_var(op: str, target: Any, value: Any) -> Any:
    return _INPLACE_OPERATORS[op](target, value)


def apply(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return func(*args, **kwargs)


class PrintCollector:
    """`_print_`: `print()` in user code appends to the execution's log."""

    def __init__(self, _getattr_: Any = None) -> None:
        self._parts: list[str] = []
        self._size = 0

    def write(self, text: str) -> None:
        LOG_SINK.write(text)
        if self._size < LOG_SINK.max_chars:  # what `printed` returns is capped like the log
            self._parts.append(text[: LOG_SINK.max_chars - self._size])
            self._size += len(self._parts[-1])

    def __call__(self) -> str:
        return "".join(self._parts)

    def _call_print(self, *objects: Any, **kwargs: Any) -> None:
        if kwargs.get("file") is None:
            kwargs["file"] = self
        else:
            guarded_getattr(kwargs["file"], "write")
        print(*objects, **kwargs)


class LogSink:
    """The capped log of this process; `sys.stdout`/`stderr` point here too."""

    def __init__(self) -> None:
        self.max_chars = 64 * 1024
        self.truncated = False
        self._parts: list[str] = []
        self._size = 0

    def write(self, text: str) -> int:
        if type(text) is not str:
            raise TypeError("write() argument must be str")
        room = self.max_chars - self._size
        if len(text) > room:
            self.truncated = True
            text = text[: max(room, 0)]
        if text:
            self._parts.append(text)
            self._size += len(text)
        return len(text)

    def flush(self) -> None:
        return None

    def text(self) -> str:
        return "".join(self._parts)


LOG_SINK = LogSink()


def _refusing(name: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise VIOLATIONS.record(f"{name}() is not available in the sandbox")

    refuse.__name__ = refuse.__qualname__ = name
    return refuse


#: Builtins that would open a hole; present as stubs so the user gets a clear refusal.
REFUSED_BUILTINS = frozenset(
    {
        "open",
        "eval",
        "exec",
        "compile",
        "type",
        "vars",
        "dir",
        "globals",
        "locals",
        "input",
        "breakpoint",
        "help",
        "memoryview",
        "object",
        "super",
        "exit",
        "quit",
        "classmethod",
        "staticmethod",
        "property",
    }
)

#: Plain data helpers added to RestrictedPython's safe_builtins.
_DATA_BUILTINS = (
    "all",
    "any",
    "ascii",
    "bin",
    "bytearray",
    "bytes",
    "dict",
    "enumerate",
    "filter",
    "format",
    "frozenset",
    "iter",
    "list",
    "map",
    "max",
    "min",
    "next",
    "reversed",
    "set",
    "sorted",
    "sum",
    "tuple",
    "zip",
    "ArithmeticError",
    "StopIteration",
)


def _make_import(facades: Mapping[str, Facade]) -> Callable[..., Any]:
    def guarded_import(
        name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> Facade:
        if level != 0:
            raise VIOLATIONS.record("relative imports")
        facade = facades.get(name)
        if facade is None:
            raise VIOLATIONS.record(f"import of module '{name}'")
        if fromlist:
            return facade
        return facades[name.partition(".")[0]]

    return guarded_import


def restricted_builtins(facades: Mapping[str, Facade]) -> dict[str, Any]:
    """The `__builtins__` of user code (built once per fork server)."""
    table: dict[str, Any] = {k: v for k, v in safe_builtins.items() if not k.startswith("_") or k == "__build_class__"}
    for name in _DATA_BUILTINS:
        table[name] = getattr(builtins, name)
    table.update(
        getattr=guarded_getattr,
        hasattr=guarded_hasattr,
        setattr=guarded_setattr,
        delattr=guarded_delattr,
        __import__=_make_import(facades),
    )
    for name in REFUSED_BUILTINS:
        table[name] = _refusing(name)
    return table


def restricted_globals(builtins_table: Mapping[str, Any]) -> dict[str, Any]:
    """Fresh globals for one execution of restricted code."""
    return {
        "__builtins__": dict(builtins_table),
        "__name__": "sandbox",
        "__metaclass__": user_metaclass,
        "_getattr_": guarded_getattr,
        "_getitem_": guarded_getitem,
        "_getiter_": iter,
        "_write_": guarded_write,
        "_print_": PrintCollector,
        "_apply_": apply,
        "_inplacevar_": inplace_var,
        "_unpack_sequence_": guarded_unpack_sequence,
        "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
    }
