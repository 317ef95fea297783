"""Wakes the watchers of a run when this process changes it.

WatchRun streams read the run from the database; this hub only tells them when
to look again, so a change made by another coordinator replica is still seen,
by the watchers' polling fallback.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["RunChangeHub"]


class RunChangeHub:
    def __init__(self) -> None:
        self._waiters: defaultdict[uuid.UUID, set[asyncio.Event]] = defaultdict(set)

    def notify(self, run_id: uuid.UUID) -> None:
        """Called after a transaction that changed the run committed."""
        for event in self._waiters.get(run_id, ()):
            event.set()

    @contextmanager
    def subscribe(self, run_id: uuid.UUID) -> Iterator[asyncio.Event]:
        """An event set on every change of the run while the block runs; clear it before each read."""
        event = asyncio.Event()
        self._waiters[run_id].add(event)
        try:
            yield event
        finally:
            waiters = self._waiters.get(run_id)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[run_id]
