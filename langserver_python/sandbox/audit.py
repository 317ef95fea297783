"""Layer 2, the interpreter: a PEP 578 audit hook installed in the child.

CPython raises an audit event before most operations that reach outside the
interpreter; the hook below refuses the ones a code step has no business
doing, by raising before the operation happens:

- opening a file for writing (any of `w`, `a`, `x`, `+`, or a write/create/
  truncate/append flag), and opening anything for reading outside the Python
  library directories (lazy imports of allowed modules read there);
- sockets and network clients (`socket.*`, `http.client.*`, `urllib.Request`…);
- processes: `subprocess.Popen`, `os.system`, `os.exec*`, `os.posix_spawn`,
  `os.spawn*`, `os.fork`, `os.forkpty`, `pty.spawn`, signals to processes;
- `ctypes.*` (with ctypes a program can rewrite memory, hooks included);
- imports of modules outside the allowlist (and what its modules need lazily);
- changing the filesystem (`os.remove`, `os.rename`, `shutil.*`…), listing
  directories, environment writes, rlimit changes, `mmap`, crafting code
  objects, and walking the garbage collector's object graph.

Every refusal is recorded as the execution's policy violation before the
exception is raised, so catching it does not hide it. The hook cannot be
removed once added; CPython documents audit hooks as unsuitable as a sandbox
boundary on their own, which is why the kernel layer exists.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["install_audit_hook"]

_REFUSED_PREFIXES = (
    "socket.",
    "ctypes.",
    "shutil.",
    "http.client.",
    "ftplib.",
    "smtplib.",
    "poplib.",
    "imaplib.",
    "nntplib.",
    "telnetlib.",
    "sqlite3.",
    "webbrowser.",
    "syslog.",
    "fcntl.",
    "resource.",
    "msvcrt.",
    "winreg.",
    "_winapi.",
)

_REFUSED_EVENTS = {
    "subprocess.Popen": "starting a subprocess",
    "os.system": "running a shell command",
    "os.exec": "executing a program",
    "os.posix_spawn": "spawning a process",
    "os.spawn": "spawning a process",
    "os.fork": "forking",
    "os.forkpty": "forking",
    "pty.spawn": "spawning a process",
    "os.startfile": "starting a program",
    "os.kill": "signalling a process",
    "os.killpg": "signalling a process group",
    "signal.pthread_kill": "signalling a thread",
    "os.remove": "removing a file",
    "os.rmdir": "removing a directory",
    "os.rename": "renaming a file",
    "os.mkdir": "creating a directory",
    "os.chmod": "changing file permissions",
    "os.chown": "changing file ownership",
    "os.chflags": "changing file flags",
    "os.lchflags": "changing file flags",
    "os.link": "creating a link",
    "os.symlink": "creating a link",
    "os.truncate": "truncating a file",
    "os.utime": "changing file times",
    "os.setxattr": "changing file attributes",
    "os.removexattr": "changing file attributes",
    "os.getxattr": "reading file attributes",
    "os.listxattr": "reading file attributes",
    "os.listdir": "listing a directory",
    "os.scandir": "listing a directory",
    "glob.glob": "listing a directory",
    "glob.glob/2": "listing a directory",
    "os.chdir": "changing directory",
    "os.putenv": "changing the environment",
    "os.unsetenv": "changing the environment",
    "mmap.__new__": "mapping memory or files",
    "code.__new__": "building a code object",
    "gc.get_objects": "walking the object graph",
    "gc.get_referrers": "walking the object graph",
    "gc.get_referents": "walking the object graph",
    "sys._current_frames": "reading other threads' frames",
    "builtins.input": "reading standard input",
    "builtins.breakpoint": "starting a debugger",
    "urllib.Request": "opening a URL",
    "os.add_dll_directory": "loading libraries",
}

#: Modules the runtime itself may import lazily after the hook is in place.
_RUNTIME_LAZY_IMPORTS = frozenset({"encodings", "_strptime", "unicodedata", "_bootlocale", "locale"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def install_audit_hook(
    *,
    allowed_modules: Iterable[str],
    read_roots: Iterable[str],
    record: Callable[[str], BaseException],
) -> None:
    """Adds the hook to this interpreter (in the child, last step before user code).

    Args:
        allowed_modules: the import allowlist; submodules and parent packages
            of allowed names are allowed too (`urllib` for `urllib.parse`).
        read_roots: directories beneath which files may be opened for reading,
            already resolved with `os.path.realpath` (the fork server does it once).
        record: records a violation and returns the exception to raise.

    Not idempotent: every call adds another hook, for the rest of the process.
    """
    allowed = frozenset(allowed_modules)
    parents = frozenset(".".join(m.split(".")[:i]) for m in allowed for i in range(1, m.count(".") + 1))
    roots = tuple(os.path.join(r, "") for r in read_roots)
    refused_events = dict(_REFUSED_EVENTS)

    def import_allowed(module: str) -> bool:
        if module in allowed or module in parents:
            return True
        if module.partition(".")[0] in _RUNTIME_LAZY_IMPORTS:
            return True
        return any(module.startswith(name + ".") for name in allowed)

    def read_allowed(path: Any) -> bool:
        if isinstance(path, int):
            return True  # an already-open descriptor: the open was checked
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return any((real + os.sep).startswith(root) for root in roots)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        reason = refused_events.get(event)
        if reason is None and event.startswith(_REFUSED_PREFIXES):
            reason = f"'{event}'"
        if reason is None:
            if event == "open":
                path, mode, flags = ((*tuple(args), None, None, None))[:3]
                writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                    isinstance(flags, int) and flags & _WRITE_FLAGS
                )
                if writing:
                    reason = "opening a file for writing"
                elif not read_allowed(path):
                    reason = "reading a file outside the Python library"
            elif event == "import":
                module = args[0] if args else ""
                if isinstance(module, str) and not import_allowed(module):
                    reason = f"import of module '{module}'"
            elif event == "object.__setattr__" and len(args) >= 2 and args[1] == "__code__":
                reason = "replacing a function's code"
            else:
                return
        if reason is not None:
            raise record(f"{reason} (refused by the interpreter audit hook)")

    sys.addaudithook(hook)
