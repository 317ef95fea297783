"""Layer 4, the kernel: a Landlock ruleset for the filesystem, TCP and signals.

The fork server builds one ruleset at start; each child enforces it on itself
(`landlock_restrict_self`) before user code runs. The ruleset handles every
filesystem right the kernel's ABI knows and grants only reading (files and
directory listings) beneath the Python library directories, so a lazy import
of an allowed module still works and everything else — writing, creating,
executing, reading `/etc` or `/proc` — is refused by the kernel. From ABI 4 it
also handles TCP bind/connect with no rule (no TCP at all), and from ABI 6 it
scopes abstract Unix sockets and signals to the sandbox's own domain.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from langserver_python.sandbox import libc

__all__ = ["LandlockRuleset", "build_ruleset"]

_EXECUTE = 1 << 0
_WRITE_FILE = 1 << 1
_READ_FILE = 1 << 2
_READ_DIR = 1 << 3
_FS_V1 = (1 << 13) - 1  # EXECUTE … MAKE_SYM
_FS_REFER = 1 << 13  # ABI 2
_FS_TRUNCATE = 1 << 14  # ABI 3
_FS_IOCTL_DEV = 1 << 15  # ABI 5
_NET_BIND_TCP = 1 << 0
_NET_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
_SCOPE_SIGNAL = 1 << 1


@dataclass(frozen=True, slots=True)
class LandlockRuleset:
    """An open ruleset descriptor and what it covers (for the start-up report)."""

    fd: int
    abi: int
    read_roots: tuple[str, ...]

    def describe(self) -> str:
        parts = ["filesystem"]
        if self.abi >= 4:
            parts.append("TCP")
        if self.abi >= 6:
            parts.append("signals and abstract sockets")
        return f"Landlock ABI {self.abi} ({', '.join(parts)}; read-only beneath {len(self.read_roots)} library dirs)"


def _handled_fs(abi: int) -> int:
    rights = _FS_V1
    if abi >= 2:
        rights |= _FS_REFER
    if abi >= 3:
        rights |= _FS_TRUNCATE
    if abi >= 5:
        rights |= _FS_IOCTL_DEV
    return rights


def build_ruleset(read_roots: Iterable[str]) -> LandlockRuleset:
    """Creates the ruleset (in the fork server, once).

    Raises:
        libc.LibcError: the kernel has no Landlock, or it is disabled.
    """
    abi = libc.landlock_abi()
    handled_net = _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
    fd = libc.landlock_create_ruleset(_handled_fs(abi), handled_net, scoped, abi)
    os.set_inheritable(fd, True)
    roots = tuple(sorted({os.path.realpath(r) for r in read_roots if os.path.isdir(r)}))
    for root in roots:
        path_fd = os.open(root, os.O_PATH | os.O_CLOEXEC)
        try:
            libc.landlock_add_path_rule(fd, path_fd, _READ_FILE | _READ_DIR)
        finally:
            os.close(path_fd)
    return LandlockRuleset(fd=fd, abi=abi, read_roots=roots)
