"""When to restart a child that exited, and when to give up.

Capped exponential backoff: the first restart after a crash waits
`initial_s`, each consecutive crash doubles the wait up to `max_s`, and a
child that stayed up longer than the crash-loop window starts again from
`initial_s`. A child that exits more than `limit` times within `window_s` is
crash-looping: restarting it again would only hide the problem, so the node
stops with a clear message and exit code 4 (STYLE #11: halt on a documented
code instead of crash-looping forever).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["RestartPolicy"]


@dataclass(kw_only=True)
class RestartPolicy:
    initial_s: float
    max_s: float
    limit: int
    window_s: float
    _exits: deque[float] = field(default_factory=deque, init=False, repr=False)
    _consecutive: int = field(default=0, init=False, repr=False)

    def record_exit(self, *, now: float, uptime_s: float) -> float | None:
        """Records an unexpected exit at `now` (monotonic seconds) of a child that ran `uptime_s`.

        Returns:
            The delay before the restart, or None when the child exits too
            often (more than `limit` exits within `window_s`).
        """
        self._exits.append(now)
        while self._exits and self._exits[0] < now - self.window_s:
            self._exits.popleft()
        if len(self._exits) > self.limit:
            return None
        self._consecutive = 1 if uptime_s >= self.window_s else self._consecutive + 1
        return float(min(self.max_s, self.initial_s * 2 ** (self._consecutive - 1)))

    @property
    def recent_exits(self) -> int:
        return len(self._exits)
