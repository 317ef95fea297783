"""The life of one forked child: confine itself, run the job, report, exit.

Order matters; each step needs the privileges the next one drops:

1. plumbing (always): default signal handlers, own process group, standard
   streams on /dev/null, the result pipe on fd 3, every other inherited
   descriptor closed (other children's pipes, the fork server's socket);
2. process layer: empty working directory, empty environment, rlimits
   (address space, CPU, open files, file size 0, core 0, processes 0, locked
   memory 0), then — when started as root — no supplementary groups and the
   slot's unprivileged uid/gid (after which the kernel enforces RLIMIT_NPROC),
   and not dumpable;
3. parent-death signal: SIGKILL if the fork server goes away;
4. kernel layer: no_new_privs, empty capability sets inside a user namespace,
   Landlock, then the seccomp filter (last: it forbids the calls above);
5. interpreter layer: the audit hook;
6. ctypes forgotten, `random` reseeded (the fork server's state is shared by
   every child otherwise), then the user code (`runner.execute`).

If any step fails the child reports an INTERNAL error and exits without running
user code: a sandbox that cannot be built is not weakened instead.
"""

from __future__ import annotations

import fcntl
import math
import os
import random
import resource
import signal
import sys
from dataclasses import dataclass
from typing import NoReturn

from langserver_python.protocol import ErrorKind, ExecutionError, ExecutionJob, ExecutionResult, Layer, SandboxSettings
from langserver_python.sandbox import libc, runner
from langserver_python.sandbox.audit import install_audit_hook
from langserver_python.sandbox.landlock import LandlockRuleset
from langserver_python.sandbox.policy import VIOLATIONS
from langserver_python.sandbox.seccomp import SeccompProgram

__all__ = ["EXIT_OUT_OF_MEMORY", "EXIT_REPORT_FAILED", "EXIT_SETUP_FAILED", "ChildPlan", "run_child"]

RESULT_FD = 3
_LANDLOCK_FD = 4
_FIRST_FREE_FD = 5
EXIT_SETUP_FAILED = 70
EXIT_REPORT_FAILED = 71
EXIT_OUT_OF_MEMORY = 72


@dataclass(frozen=True, slots=True)
class ChildPlan:
    """Everything a child needs, prepared once by the fork server."""

    settings: SandboxSettings
    work_dir: str
    devnull_fd: int
    landlock: LandlockRuleset | None
    seccomp: SeccompProgram | None
    drop_privileges: bool
    drop_capabilities: bool
    machine: str
    read_roots: tuple[str, ...]
    run_env: runner.RunEnvironment
    fork_server_pid: int
    #: Modules dropped from `sys.modules` before user code (ctypes and friends).
    forget_modules: tuple[str, ...] = ()


class _SetupFailed(Exception):
    def __init__(self, step: str, cause: BaseException) -> None:
        super().__init__(f"{step}: {type(cause).__name__}: {cause}")
        self.step = step


def _arrange_descriptors(plan: ChildPlan, result_fd: int) -> None:
    wanted = {0: plan.devnull_fd, 1: plan.devnull_fd, 2: plan.devnull_fd, RESULT_FD: result_fd}
    if plan.landlock is not None and plan.settings.enabled(Layer.KERNEL):
        wanted[_LANDLOCK_FD] = plan.landlock.fd
    # Lift every source above the targets first, so no dup2 clobbers a source.
    lifted = {target: fcntl.fcntl(source, fcntl.F_DUPFD, 16) for target, source in wanted.items()}
    for target, source in lifted.items():
        os.dup2(source, target)
    os.closerange(_FIRST_FREE_FD, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _set_rlimits(settings: SandboxSettings, timeout_s: float) -> None:
    cpu = max(1, min(settings.cpu_limit_s, math.ceil(timeout_s) + 1))
    limits = {
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_NOFILE: (settings.max_open_files, settings.max_open_files),
        resource.RLIMIT_FSIZE: (0, 0),
        resource.RLIMIT_CORE: (0, 0),
        resource.RLIMIT_NPROC: (0, 0),
        resource.RLIMIT_MEMLOCK: (0, 0),
        resource.RLIMIT_MSGQUEUE: (0, 0),
        resource.RLIMIT_AS: (settings.memory_limit_bytes, settings.memory_limit_bytes),
    }
    for which, value in limits.items():
        resource.setrlimit(which, value)


def _confine(job: ExecutionJob, plan: ChildPlan, slot: int, result_fd: int) -> None:
    step = "signals"
    try:
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        step = "process group"
        os.setpgid(0, 0)
        step = "descriptors"
        _arrange_descriptors(plan, result_fd)
        settings = plan.settings
        if settings.enabled(Layer.PROCESS):
            step = "working directory"
            os.chdir(plan.work_dir)
            step = "environment"
            if os.environ:  # the fork server already cleared its own; this is the guarantee
                os.environ.clear()
            step = "rlimits"
            _set_rlimits(settings, job.timeout_s)
            if plan.drop_privileges:
                step = "uid"
                uid = settings.sandbox_uid_base + slot
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
            step = "dumpable"
            libc.prctl(libc.PR_SET_DUMPABLE, 0)
        step = "parent death signal"
        libc.prctl(libc.PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != plan.fork_server_pid:
            os._exit(EXIT_SETUP_FAILED)
        if settings.enabled(Layer.KERNEL):
            step = "no_new_privs"
            libc.prctl(libc.PR_SET_NO_NEW_PRIVS, 1)
            if plan.drop_capabilities:
                step = "capabilities"
                libc.capdrop_all(plan.machine)
            if plan.landlock is not None:
                step = "landlock"
                libc.landlock_restrict_self(_LANDLOCK_FD)
                os.close(_LANDLOCK_FD)
            if plan.seccomp is not None:
                step = "seccomp"
                libc.seccomp_set_filter(plan.seccomp.for_pid(os.getpid()))
        step = "reseed"
        random.seed()
        for name in plan.forget_modules:
            sys.modules.pop(name, None)
        if settings.enabled(Layer.INTERPRETER):
            step = "audit hook"
            install_audit_hook(
                allowed_modules=settings.allowed_modules, read_roots=plan.read_roots, record=VIOLATIONS.record
            )
    except BaseException as exc:
        raise _SetupFailed(step, exc) from None


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(RESULT_FD, view)
        view = view[written:]


def run_child(job: ExecutionJob, *, plan: ChildPlan, slot: int, result_fd: int) -> NoReturn:
    """Confines this (freshly forked) process, runs `job`, reports, and exits."""
    try:
        _confine(job, plan, slot, result_fd)
    except _SetupFailed as failure:
        # Before the descriptors were arranged the pipe is still `result_fd`; while
        # they were being arranged neither number is certain, so say nothing.
        fd = {"signals": result_fd, "process group": result_fd, "descriptors": -1}.get(failure.step, RESULT_FD)
        message = plan.run_env.scrub(f"sandbox setup failed at {failure}")  # no host path in a reply
        error = ExecutionError(kind=ErrorKind.INTERNAL, message=message)
        try:
            if fd >= 0:
                os.write(fd, ExecutionResult(error=error).to_frame())
        finally:
            os._exit(EXIT_SETUP_FAILED)
    try:
        _write_all(runner.execute(job, plan.run_env).to_frame())
    except MemoryError:
        os._exit(EXIT_OUT_OF_MEMORY)
    except BaseException:
        os._exit(EXIT_REPORT_FAILED)
    os._exit(0)
