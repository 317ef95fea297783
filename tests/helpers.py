"""Waiting helpers: poll a condition until a deadline instead of sleeping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]],
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.02,
    what: str = "condition",
) -> T:
    """Awaits `probe()` until it returns a truthy value, and returns that value.

    Raises:
        AssertionError: the deadline passed; the message names `what` and the
            last value seen.
    """
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while True:
        last = await probe()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not reached within {timeout_s}s (last value: {last!r})")
        await asyncio.sleep(interval_s)
