"""Exec shim: ask the kernel to signal this process when the supervisor dies, then exec the child.

Run as ``python -I -S _exec_child.py <supervisor pid> <signal number> <argv...>``.

Why a shim: ``PR_SET_PDEATHSIG`` must be set inside the child, between fork
and exec. ``subprocess``'s ``preexec_fn`` would run Python code in a forked
copy of a multi-threaded process (the supervisor holds gRPC threads), which
can deadlock; ``posix_spawn`` cannot run code at all. So the supervisor spawns
this tiny program, which sets the flag and replaces itself with the real child
(the setting survives ``execve``). If the supervisor already died before the
flag was set, the parent pid no longer matches and the shim exits instead of
starting an orphan.

Nothing here may import the project: it runs with ``-I -S`` for a fast start.
"""

import os
import sys

_PR_SET_PDEATHSIG = 1
_EXIT_PARENT_GONE = 125
_EXIT_CANNOT_EXEC = 127


def main(argv: list[str]) -> None:
    parent, signum, command = int(argv[1]), int(argv[2]), argv[3:]
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            sys.stderr.write(f"exec shim: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}\n")
    if os.getppid() != parent:
        os._exit(_EXIT_PARENT_GONE)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"cannot run {command[0]!r}: {exc.strerror}\n")
        sys.stderr.flush()
        os._exit(_EXIT_CANNOT_EXEC)


if __name__ == "__main__":
    main(sys.argv)
