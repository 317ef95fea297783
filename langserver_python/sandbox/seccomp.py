"""Layer 4, the kernel: a seccomp-bpf filter built by hand, no libseccomp needed.

The filter is a deny list (CPython needs too many system calls for an allow
list to stay honest across versions). A denied call kills the whole process
(`SECCOMP_RET_KILL_PROCESS`): by the time user code reaches one, the language
and interpreter layers have already failed, so the attempt is hostile and the
fork server reports it as a policy violation (the child dies of SIGSYS).

Denied: creating or using sockets; exec; fork/vfork/clone (clone3 answers
ENOSYS, so libc falls back to clone and dies there); ptrace and cross-process
memory access; signalling any process but itself (the pid is patched into the
program for each child); namespaces, mounts, modules, keyrings, BPF,
perf, io_uring, userfaultfd, clocks, reboot, uid/gid/capability changes;
every call that creates, removes, renames, links or changes metadata of a
file; `open`/`openat` with any write, create, truncate or append flag
(`openat2` answers ENOSYS: its flags sit behind a pointer the filter cannot read).

Architectures: x86_64 (the x32 ABI and 32-bit calls are killed by the arch
check) and aarch64. Anything else reports the kernel layer as unavailable.
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["DENIED_SYSCALLS", "SeccompProgram", "build_program"]

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_RET_KILL_PROCESS = 0x80000000
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_LD_ABS = 0x20
_JEQ = 0x15
_JGE = 0x35
_JSET = 0x45
_RET = 0x06
_JA = 0x05
_BLOCK = 200
_X32_SYSCALL_BIT = 0x40000000
# O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND | __O_TMPFILE (same values on both architectures).
_OPEN_WRITE_FLAGS = 0x1 | 0x2 | 0x40 | 0x200 | 0x400 | 0x400000

#: Killed outright. Names missing on an architecture (aarch64 has no `open`,
#: `fork`, …) are skipped there.
DENIED_SYSCALLS: tuple[str, ...] = (
    # network
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4", "sendto", "sendmsg",
    "sendmmsg", "recvfrom", "recvmsg", "recvmmsg", "shutdown", "getsockopt", "setsockopt",
    "getpeername", "getsockname",
    # processes
    "execve", "execveat", "fork", "vfork", "clone", "ptrace", "process_vm_readv", "process_vm_writev",
    "kcmp", "pidfd_open", "pidfd_getfd", "pidfd_send_signal", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
    "setsid", "setpgid",
    # the system
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "swapon", "swapoff", "reboot",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "acct", "quotactl",
    "quotactl_fd", "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "open_by_handle_at", "name_to_handle_at",
    "lookup_dcookie", "fanotify_init", "syslog", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "sethostname", "setdomainname", "iopl", "ioperm", "personality", "modify_ldt",
    "uselib", "ustat", "sysfs", "_sysctl", "nfsservctl", "vhangup", "memfd_create", "memfd_secret",
    "move_mount", "open_tree", "fsopen", "fsmount", "fspick", "mount_setattr", "process_madvise",
    "migrate_pages", "move_pages",
    # credentials
    "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups", "setfsuid",
    "setfsgid", "capset",
    # the filesystem
    "mknod", "mknodat", "unlink", "unlinkat", "rename", "renameat", "renameat2", "mkdir", "mkdirat",
    "rmdir", "link", "linkat", "symlink", "symlinkat", "chmod", "fchmod", "fchmodat", "fchmodat2",
    "chown", "fchown", "lchown", "fchownat", "truncate", "ftruncate", "creat", "utime", "utimes",
    "utimensat", "futimesat", "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr",
    "fremovexattr", "setxattrat", "removexattrat", "fallocate",
)  # fmt: skip

_X86_64: Mapping[str, int] = {
    "socket": 41, "socketpair": 53, "connect": 42, "bind": 49, "listen": 50, "accept": 43, "accept4": 288,
    "sendto": 44, "sendmsg": 46, "sendmmsg": 307, "recvfrom": 45, "recvmsg": 47, "recvmmsg": 299,
    "shutdown": 48, "getsockopt": 55, "setsockopt": 54, "getpeername": 52, "getsockname": 51,
    "execve": 59, "execveat": 322, "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "ptrace": 101,
    "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "pidfd_open": 434, "pidfd_getfd": 438,
    "pidfd_send_signal": 424, "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129,
    "rt_tgsigqueueinfo": 297, "setsid": 112, "setpgid": 109, "mount": 165, "umount2": 166,
    "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "swapon": 167, "swapoff": 168,
    "reboot": 169, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "acct": 163, "quotactl": 179, "quotactl_fd": 443, "bpf": 321,
    "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248, "request_key": 249,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_by_handle_at": 304,
    "name_to_handle_at": 303, "lookup_dcookie": 212, "fanotify_init": 300, "syslog": 103,
    "settimeofday": 164, "clock_settime": 227, "clock_adjtime": 305, "adjtimex": 159, "sethostname": 170,
    "setdomainname": 171, "iopl": 172, "ioperm": 173, "personality": 135, "modify_ldt": 154, "uselib": 134,
    "ustat": 136, "sysfs": 139, "_sysctl": 156, "nfsservctl": 180, "vhangup": 153, "memfd_create": 319,
    "memfd_secret": 447, "move_mount": 429, "open_tree": 428, "fsopen": 430, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "process_madvise": 440, "migrate_pages": 256, "move_pages": 279, "setuid": 105,
    "setgid": 106, "setreuid": 113, "setregid": 114, "setresuid": 117, "setresgid": 119, "setgroups": 116,
    "setfsuid": 122, "setfsgid": 123, "capset": 126, "mknod": 133, "mknodat": 259, "unlink": 87,
    "unlinkat": 263, "rename": 82, "renameat": 264, "renameat2": 316, "mkdir": 83, "mkdirat": 258,
    "rmdir": 84, "link": 86, "linkat": 265, "symlink": 88, "symlinkat": 266, "chmod": 90, "fchmod": 91,
    "fchmodat": 268, "fchmodat2": 452, "chown": 92, "fchown": 93, "lchown": 94, "fchownat": 260,
    "truncate": 76, "ftruncate": 77, "creat": 85, "utime": 132, "utimes": 235, "utimensat": 280,
    "futimesat": 261, "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197,
    "lremovexattr": 198, "fremovexattr": 199, "setxattrat": 463, "removexattrat": 466, "fallocate": 285,
    "open": 2, "openat": 257, "openat2": 437,
}  # fmt: skip

_AARCH64: Mapping[str, int] = {
    "socket": 198, "socketpair": 199, "connect": 203, "bind": 200, "listen": 201, "accept": 202,
    "accept4": 242, "sendto": 206, "sendmsg": 211, "sendmmsg": 269, "recvfrom": 207, "recvmsg": 212,
    "recvmmsg": 243, "shutdown": 210, "getsockopt": 209, "setsockopt": 208, "getpeername": 205,
    "getsockname": 204, "execve": 221, "execveat": 281, "clone": 220, "clone3": 435, "ptrace": 117,
    "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "pidfd_open": 434, "pidfd_getfd": 438,
    "pidfd_send_signal": 424, "kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138,
    "rt_tgsigqueueinfo": 240, "setsid": 157, "setpgid": 154, "mount": 40, "umount2": 39, "pivot_root": 41,
    "chroot": 51, "unshare": 97, "setns": 268, "swapon": 224, "swapoff": 225, "reboot": 142,
    "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273,
    "delete_module": 106, "acct": 89, "quotactl": 60, "quotactl_fd": 443, "bpf": 280,
    "perf_event_open": 241, "userfaultfd": 282, "keyctl": 219, "add_key": 217, "request_key": 218,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_by_handle_at": 265,
    "name_to_handle_at": 264, "lookup_dcookie": 18, "fanotify_init": 262, "syslog": 116,
    "settimeofday": 170, "clock_settime": 112, "clock_adjtime": 266, "adjtimex": 171, "sethostname": 161,
    "setdomainname": 162, "personality": 92, "nfsservctl": 42, "vhangup": 58, "memfd_create": 279,
    "memfd_secret": 447, "move_mount": 429, "open_tree": 428, "fsopen": 430, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "process_madvise": 440, "migrate_pages": 238, "move_pages": 239, "setuid": 146,
    "setgid": 144, "setreuid": 145, "setregid": 143, "setresuid": 147, "setresgid": 149, "setgroups": 159,
    "setfsuid": 151, "setfsgid": 152, "capset": 91, "mknodat": 33, "unlinkat": 35, "renameat": 38,
    "renameat2": 276, "mkdirat": 34, "linkat": 37, "symlinkat": 36, "fchmod": 52, "fchmodat": 53,
    "fchmodat2": 452, "fchown": 55, "fchownat": 54, "truncate": 45, "ftruncate": 46, "utimensat": 88,
    "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14, "lremovexattr": 15,
    "fremovexattr": 16, "setxattrat": 463, "removexattrat": 466, "fallocate": 47, "openat": 56,
    "openat2": 437,
}  # fmt: skip

_TABLES: Mapping[str, Mapping[str, int]] = {"x86_64": _X86_64, "aarch64": _AARCH64}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def _arg_low(index: int) -> int:
    # struct seccomp_data: int nr; u32 arch; u64 ip; u64 args[6] (little-endian: low word first).
    return 16 + 8 * index


@dataclass(frozen=True, slots=True)
class SeccompProgram:
    """A filter ready to install, with the offsets where a child patches its pid."""

    machine: str
    program: bytes
    pid_offsets: tuple[int, ...]
    denied: int

    def for_pid(self, pid: int) -> bytes:
        """The program allowing signals to `pid` only (call in the child)."""
        patched = bytearray(self.program)
        for offset in self.pid_offsets:
            struct.pack_into("<I", patched, offset, pid)
        return bytes(patched)


def build_program(machine: str) -> SeccompProgram:
    """Builds the filter for `machine` (`os.uname().machine`).

    Raises:
        ValueError: no syscall table for this architecture.
    """
    table = _TABLES.get(machine)
    if table is None:
        raise ValueError(f"no seccomp syscall table for {machine}")
    out: list[bytes] = []
    pid_insns: list[int] = []
    kill = _insn(_RET, _RET_KILL_PROCESS)
    allow = _insn(_RET, _RET_ALLOW)

    out += [_insn(_LD_ABS, 4), _insn(_JEQ, _AUDIT_ARCH[machine], 1, 0), kill, _insn(_LD_ABS, 0)]
    if machine == "x86_64":
        out += [_insn(_JGE, _X32_SYSCALL_BIT, 0, 1), kill]
    numbers = [table[name] for name in DENIED_SYSCALLS if name in table]
    # One `jeq` per call, all jumping forward to a shared `ret KILL` that closes each
    # block; blocks keep every jump offset within the 8-bit field.
    for start in range(0, len(numbers), _BLOCK):
        block = numbers[start : start + _BLOCK]
        out += [_insn(_JEQ, number, len(block) - i, 0) for i, number in enumerate(block)]
        out += [_insn(_JA, 1), kill]
    for name in ("openat2", "clone3"):
        out += [_insn(_JEQ, table[name], 0, 1), _insn(_RET, _RET_ERRNO | errno.ENOSYS)]
    for name, flags_arg in (("open", 1), ("openat", 2)):
        if name in table:
            # jeq → [ld flags, jset write → kill, allow]
            out += [
                _insn(_JEQ, table[name], 0, 4),
                _insn(_LD_ABS, _arg_low(flags_arg)),
                _insn(_JSET, _OPEN_WRITE_FLAGS, 0, 1),
                kill,
                allow,
            ]
    for name in ("kill", "tkill", "tgkill"):
        # jeq → [ld target, jeq self → allow, kill]; target is arg0 for all three.
        out += [_insn(_JEQ, table[name], 0, 4), _insn(_LD_ABS, _arg_low(0))]
        pid_insns.append(len(out))
        out += [_insn(_JEQ, 0, 0, 1), allow, kill]
    out.append(allow)
    program = b"".join(out)
    # k sits at byte 4 of each 8-byte instruction.
    return SeccompProgram(machine, program, tuple(i * 8 + 4 for i in pid_insns), len(numbers))
