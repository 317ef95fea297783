"""Allowed modules, as user code sees them: facades, never module objects.

Reachability, not names: an allowed module keeps other modules as attributes
(`uuid.os`, `json.decoder`, `re.enum` → `enum.sys` → `sys.modules["os"]`), so
handing user code the module object hands it everything the module imported.
A `Facade` carries only a module's public functions, classes and constants:

- names from `__all__` when the module defines it, else names without a
  leading underscore;
- minus every value that is a module (allowed submodules come back as nested
  facades, e.g. `collections.abc`);
- minus every value that *is* a dangerous builtin (`open`, `getattr`, `eval`…),
  whatever name the module gives it;
- minus the per-module exclusions in `EXCLUDED_NAMES`, each with its reason;
- or only the names in `ONLY_NAMES`, for modules that are mostly unsafe.

A facade has no `__name__`, which matters: `from json import decoder` falls back
to `sys.modules["json.decoder"]` when the attribute is missing and the object
has a `__name__` (CPython's `import_from`). Looking up a missing public name
records a policy violation, so `from json import decoder` fails as one.

Facades are built once in the fork server, before it forks, and shared by
every child (copy-on-write). A child that scribbles on one changes only itself.
"""

from __future__ import annotations

import builtins
import importlib
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["EXCLUDED_NAMES", "ONLY_NAMES", "Facade", "FacadeError", "build_facades"]


class FacadeError(Exception):
    """An allowlisted module could not be imported or exposed."""


#: Public names that reach past the guards, per module.
EXCLUDED_NAMES: Mapping[str, frozenset[str]] = {
    # attrgetter("__class__") / methodcaller run getattr in C, past _getattr_.
    "operator": frozenset({"attrgetter", "methodcaller"}),
    # Formatter.get_field walks attributes named in a format string.
    "string": frozenset({"Formatter"}),
    # getnode()/uuid1() probe the host (ifconfig, ip, netstat via subprocess).
    "uuid": frozenset({"getnode", "uuid1"}),
    # Setting clocks or the process time zone is not a computation.
    "time": frozenset({"clock_settime", "clock_settime_ns", "tzset", "pthread_getcpuclockid"}),
}

#: Modules exposed only through the names listed (the rest opens files).
ONLY_NAMES: Mapping[str, frozenset[str]] = {
    "io": frozenset({"StringIO", "BytesIO"}),
}

#: Builtins a facade must never carry, under any name.
_FORBIDDEN_BUILTIN_VALUES = tuple(
    getattr(builtins, name)
    for name in (
        "open",
        "eval",
        "exec",
        "compile",
        "__import__",
        "getattr",
        "setattr",
        "delattr",
        "vars",
        "dir",
        "globals",
        "locals",
        "input",
        "breakpoint",
        "type",
        "object",
        "super",
        "memoryview",
    )
)


class Facade:
    """A read-only bag of a module's public names (see the module docstring)."""

    __slots__ = ("__attrs", "__label", "__on_missing")

    def __init__(self, label: str, attrs: Mapping[str, Any], on_missing: Callable[[str], BaseException]) -> None:
        object.__setattr__(self, "_Facade__label", label)
        object.__setattr__(self, "_Facade__attrs", dict(attrs))
        object.__setattr__(self, "_Facade__on_missing", on_missing)

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup failed, i.e. for every public name.
        attrs: dict[str, Any] = object.__getattribute__(self, "_Facade__attrs")
        if name in attrs:
            return attrs[name]
        if name.startswith("_"):
            raise AttributeError(name)
        on_missing = object.__getattribute__(self, "_Facade__on_missing")
        label = object.__getattribute__(self, "_Facade__label")
        raise on_missing(f"{label}.{name}")

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("sandbox modules are read-only")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("sandbox modules are read-only")

    def __repr__(self) -> str:
        return f"<sandbox module {object.__getattribute__(self, '_Facade__label')}>"

    def facade_names(self) -> list[str]:
        """The names this facade carries (for tests and documentation)."""
        return sorted(object.__getattribute__(self, "_Facade__attrs"))


def _public_names(module: types.ModuleType) -> Iterable[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    return [n for n in names if isinstance(n, str) and not n.startswith("_")]


def _exposed(module_name: str, module: types.ModuleType) -> dict[str, Any]:
    only = ONLY_NAMES.get(module_name)
    excluded = EXCLUDED_NAMES.get(module_name, frozenset())
    names = only if only is not None else _public_names(module)
    exposed = {}
    for name in names:
        if name in excluded or not hasattr(module, name):
            continue
        value = getattr(module, name)
        if isinstance(value, types.ModuleType):
            continue
        if any(value is forbidden for forbidden in _FORBIDDEN_BUILTIN_VALUES):
            continue
        exposed[name] = value
    return exposed


def build_facades(
    allowed: Iterable[str], on_missing: Callable[[str], BaseException]
) -> tuple[dict[str, Facade], dict[str, types.ModuleType]]:
    """Imports every allowed module and builds its facade.

    Args:
        allowed: dotted module names (e.g. "json", "urllib.parse").
        on_missing: builds the exception raised when user code asks a facade
            for a name it does not carry (it should also record the violation).

    Returns:
        facades by dotted name, including parents of allowed submodules
        (`urllib` carrying only `parse`), and the real modules imported.

    Raises:
        FacadeError: a module does not import.
    """
    modules: dict[str, types.ModuleType] = {}
    for name in sorted(set(allowed)):
        try:
            modules[name] = importlib.import_module(name)
        except Exception as exc:  # any import failure is a configuration problem
            raise FacadeError(f"allowed module {name!r} does not import: {type(exc).__name__}: {exc}") from None
    contents: dict[str, dict[str, Any]] = {name: _exposed(name, module) for name, module in modules.items()}
    for name in list(modules):
        parts = name.split(".")
        for depth in range(1, len(parts)):
            contents.setdefault(".".join(parts[:depth]), {})
    facades: dict[str, Facade] = {}
    # Deepest first, so a parent can carry its finished children.
    for name in sorted(contents, key=lambda n: n.count("."), reverse=True):
        attrs = dict(contents[name])
        prefix = name + "."
        for child, facade in facades.items():
            if child.startswith(prefix) and "." not in child[len(prefix) :]:
                attrs[child[len(prefix) :]] = facade
        facades[name] = Facade(name, attrs, on_missing)
    return facades, modules
