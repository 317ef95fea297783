"""The few Linux system calls Python 3.11's `os` module lacks, through ctypes.

Used by the fork server (before it forks) and by a child while it confines
itself, never by user code: the child removes `ctypes` from `sys.modules`
before user code runs, the audit hook refuses every `ctypes.*` event, and
RestrictedPython code cannot import it.
"""

from __future__ import annotations

import ctypes
import os
import struct

__all__ = [
    "LibcError",
    "capdrop_all",
    "landlock_abi",
    "landlock_add_path_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "prctl",
    "seccomp_set_filter",
    "unshare",
]

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_GET_SECCOMP = 21
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
SECCOMP_MODE_FILTER = 2
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000

# The same numbers on every architecture (added after the syscall table unification).
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
_LANDLOCK_RULE_PATH_BENEATH = 1
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.unshare.argtypes = [ctypes.c_int]


class LibcError(OSError):
    """A system call failed; carries errno like OSError."""


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise LibcError(err, f"{what}: {os.strerror(err)}")
    return result


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    return _check(_libc.prctl(option, arg2, arg3, arg4, arg5), f"prctl({option})")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def seccomp_set_filter(program: bytes) -> None:
    """Installs a classic-BPF seccomp filter on this thread (needs no_new_privs)."""
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    _check(
        _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0),
        "prctl(PR_SET_SECCOMP)",
    )


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; raises LibcError when Landlock is off."""
    return _check(
        _libc.syscall(
            _SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION)
        ),
        "landlock_create_ruleset",
    )


def landlock_create_ruleset(handled_fs: int, handled_net: int, scoped: int, abi: int) -> int:
    """Creates a ruleset; the attribute size follows what `abi` understands."""
    if abi >= 6:
        attr = struct.pack("<QQQ", handled_fs, handled_net, scoped)
    elif abi >= 4:
        attr = struct.pack("<QQ", handled_fs, handled_net)
    else:
        attr = struct.pack("<Q", handled_fs)
    buffer = ctypes.create_string_buffer(attr, len(attr))
    return _check(
        _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, buffer, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0)),
        "landlock_create_ruleset",
    )


def landlock_add_path_rule(ruleset_fd: int, path_fd: int, allowed: int) -> None:
    attr = struct.pack("<Qi", allowed, path_fd)  # struct landlock_path_beneath_attr is packed
    buffer = ctypes.create_string_buffer(attr, len(attr))
    _check(
        _libc.syscall(
            _SYS_LANDLOCK_ADD_RULE,
            ctypes.c_int(ruleset_fd),
            ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH),
            buffer,
            ctypes.c_uint32(0),
        ),
        "landlock_add_rule",
    )


def landlock_restrict_self(ruleset_fd: int) -> None:
    _check(
        _libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset_fd), ctypes.c_uint32(0)),
        "landlock_restrict_self",
    )


def capdrop_all(machine: str) -> None:
    """Empties this process's capability sets (for children inside a user namespace)."""
    number = _SYS_CAPSET.get(machine)
    if number is None:
        raise LibcError(0, f"capset: unknown architecture {machine}")
    header = ctypes.create_string_buffer(struct.pack("<Ii", _LINUX_CAPABILITY_VERSION_3, 0), 8)
    data = ctypes.create_string_buffer(bytes(24), 24)
    _check(_libc.syscall(number, header, data), "capset")
