"""Warming the fork server: everything done once so that each fork is cheap.

`prepare()` imports and exposes the allowed modules, warms the lazy parts of
the standard library a child would otherwise import from disk (past its
Landlock ruleset), creates the empty working directory, and sets up what the
kernel offers: a network namespace for the fork server itself (children
inherit it: no interfaces but a downed loopback), a Landlock ruleset and a
seccomp program. What the kernel lacks is reported, never silently skipped:
the report goes back to the gRPC process, which logs it once at start.
"""

from __future__ import annotations

import codecs
import datetime
import os
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import langserver_python
from langserver_python.protocol import Layer, SandboxSettings
from langserver_python.sandbox import libc
from langserver_python.sandbox.child import ChildPlan
from langserver_python.sandbox.facades import FacadeError, build_facades
from langserver_python.sandbox.landlock import LandlockRuleset, build_ruleset
from langserver_python.sandbox.policy import compile_user_code, missing_facade_name, restricted_builtins
from langserver_python.sandbox.runner import RunEnvironment
from langserver_python.sandbox.seccomp import SeccompProgram, build_program

__all__ = ["Preparation", "PreparationError", "prepare"]

# Encodings a program plausibly names; each would otherwise be a lazy import from disk.
_WARM_ENCODINGS = (
    "utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "latin-1", "ascii", "cp1252",
    "unicode_escape", "raw_unicode_escape", "idna", "punycode", "iso8859-15",
)  # fmt: skip


class PreparationError(Exception):
    """The fork server cannot start; `config_error` says whether configuration is to blame."""

    def __init__(self, message: str, *, config_error: bool) -> None:
        super().__init__(message)
        self.config_error = config_error


@dataclass(frozen=True, slots=True)
class Preparation:
    plan: ChildPlan
    report: dict[str, Any]


def _warm_stdlib() -> None:
    datetime.datetime.strptime("2024-01-02 03:04:05", "%Y-%m-%d %H:%M:%S")
    time.strptime("2024", "%Y")
    for encoding in _WARM_ENCODINGS:
        codecs.lookup(encoding)
    compile_user_code("def main(input):\n    print(input)\n    return [x for x in input]\n", "warm.py", restricted=True)


def _isolate_network(is_root: bool) -> str:
    """Moves the fork server into an empty network namespace; returns a description."""
    if is_root:
        libc.unshare(libc.CLONE_NEWNET)
        return "on: empty network namespace"
    uid, gid = os.getuid(), os.getgid()
    libc.unshare(libc.CLONE_NEWUSER | libc.CLONE_NEWNET)
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")
    return "on: empty network namespace (inside an unprivileged user namespace)"


def _read_roots(modules: dict[str, Any]) -> tuple[str, ...]:
    roots = {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
    for module in modules.values():
        path = getattr(module, "__file__", None)
        if path:
            roots.add(os.path.dirname(path))
    return tuple(sorted({os.path.realpath(r) for r in roots if os.path.isdir(r)}))


def _host_prefixes(work_dir: str) -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    candidates = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        paths["stdlib"],
        paths["platstdlib"],
        paths["purelib"],
        paths["platlib"],
        os.path.dirname(os.path.dirname(os.path.abspath(langserver_python.__file__))),
        work_dir,
        tempfile.gettempdir(),
    }
    return tuple(sorted((p for p in candidates if len(p) > 4), key=len, reverse=True))


def prepare(settings: SandboxSettings) -> Preparation:
    """Builds the child plan (see the module docstring).

    Raises:
        PreparationError: an allowed module does not import (a configuration
            error), or the working directory cannot be created.
    """
    report: dict[str, Any] = {"layers_disabled": sorted(settings.disabled_layers)}
    try:
        facades, modules = build_facades(settings.allowed_modules, missing_facade_name)
    except FacadeError as exc:
        raise PreparationError(f"PY_ALLOWED_MODULES: {exc}", config_error=True) from None
    report["allowed_modules"] = len(modules)
    _warm_stdlib()
    try:
        work_dir = tempfile.mkdtemp(prefix="langserver-py-", dir=settings.work_dir_parent)
        os.chmod(work_dir, 0o555)
    except OSError as exc:
        raise PreparationError(f"PY_WORK_DIR: cannot create the working directory: {exc}", config_error=True) from None
    report["work_dir"] = work_dir
    is_root = os.geteuid() == 0
    machine = os.uname().machine
    read_roots = _read_roots(modules)

    landlock: LandlockRuleset | None = None
    seccomp: SeccompProgram | None = None
    in_user_namespace = False
    if settings.enabled(Layer.KERNEL):
        try:
            report["network_namespace"] = _isolate_network(is_root)
            in_user_namespace = not is_root
        except OSError as exc:
            report["network_namespace"] = f"unavailable: {exc}"
        try:
            landlock = build_ruleset(read_roots)
            report["landlock"] = f"on: {landlock.describe()}"
        except OSError as exc:
            report["landlock"] = f"unavailable: {exc}"
        try:
            libc.prctl(libc.PR_GET_SECCOMP)
            seccomp = build_program(machine)
            report["seccomp"] = f"on: {machine}, {seccomp.denied} system calls kill the process"
        except (OSError, ValueError) as exc:
            report["seccomp"] = f"unavailable: {exc}"
    else:
        report.update(network_namespace="off", landlock="off", seccomp="off")
    if not settings.enabled(Layer.PROCESS):
        report["privileges"] = "off"
    elif is_root:
        report["privileges"] = f"children run as uid/gid {settings.sandbox_uid_base}+slot, RLIMIT_NPROC 0"
    else:
        report["privileges"] = f"not root: children keep uid {os.getuid()}; RLIMIT_NPROC 0 still stops forks"

    devnull_fd = os.open(os.devnull, os.O_RDWR)
    run_env = RunEnvironment(
        restricted=settings.enabled(Layer.LANGUAGE),
        builtins_table=restricted_builtins(facades),
        max_output_bytes=settings.max_output_bytes,
        max_log_bytes=settings.max_log_bytes,
        host_prefixes=_host_prefixes(work_dir),
    )
    plan = ChildPlan(
        settings=settings,
        work_dir=work_dir,
        devnull_fd=devnull_fd,
        landlock=landlock,
        seccomp=seccomp,
        drop_privileges=is_root and settings.enabled(Layer.PROCESS),
        drop_capabilities=in_user_namespace,
        machine=machine,
        read_roots=read_roots,
        run_env=run_env,
        fork_server_pid=os.getpid(),
        forget_modules=tuple(m for m in sys.modules if m == "_ctypes" or m.startswith("ctypes")),
    )
    # Children inherit both: an empty environment and an empty, read-only working directory.
    os.chdir(work_dir)
    os.environ.clear()
    return Preparation(plan=plan, report=report)
