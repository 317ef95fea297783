"""Process limits a sandbox process puts on itself before it creates isolates.

`RLIMIT_AS` is deliberately absent: V8 reserves large ranges of address space it
never touches (its pointer-compression cage, the sandbox, code ranges) and dies
when it cannot. `RLIMIT_DATA` counts only what is made writable, which V8 tolerates
(measured on V8 14: about 560 MiB with one isolate) and which bounds memory the
heap limit cannot see: an `ArrayBuffer` over the limit fails with a catchable
`RangeError` instead of growing the process.
"""

from __future__ import annotations

import resource

from langserver_js.protocol import SandboxSettings

__all__ = ["apply_process_limits"]


def apply_process_limits(settings: SandboxSettings) -> None:
    """Sets RLIMIT_DATA (unless 0), and no core files: a V8 abort must not write gigabytes.

    Raises:
        OSError: the kernel refused a limit.
    """
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if settings.data_limit_mb > 0:
        limit = settings.data_limit_mb << 20
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
