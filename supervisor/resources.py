"""Samples a child's process tree with psutil: resident memory and CPU.

The tree (the child and every process below it) is what a language server
really costs: its sandboxes are its children. CPU is the sum of the tree's
CPU percentages since the previous sample (100 = one core busy).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import psutil

__all__ = ["ResourceSample", "TreeSampler"]


@dataclass(frozen=True, slots=True)
class ResourceSample:
    rss_bytes: int
    cpu_percent: float
    processes: int


class TreeSampler:
    """Keeps psutil handles across samples, so CPU percentages cover the interval between two calls."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._known: dict[int, psutil.Process] = {}

    def sample(self) -> ResourceSample | None:
        """The tree's usage now, or None when the child is gone."""
        try:
            root = self._known.get(self._pid) or psutil.Process(self._pid)
            members = [root, *root.children(recursive=True)]
        except psutil.Error:
            return None
        current: dict[int, psutil.Process] = {}
        rss = 0
        cpu = 0.0
        for proc in members:
            proc = self._known.get(proc.pid, proc)
            with contextlib.suppress(psutil.Error):
                rss += proc.memory_info().rss
                cpu += proc.cpu_percent(interval=None)
                current[proc.pid] = proc
        self._known = current
        return ResourceSample(rss_bytes=rss, cpu_percent=cpu, processes=len(current))
