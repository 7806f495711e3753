"""The one clock: no other module reads time directly.

Times are integers in nanoseconds on a monotonic timeline. ``WallClock`` follows the
machine's monotonic clock and really waits; ``VirtualClock`` only moves when told to, so
the same scheduling code runs in virtual time, deterministically and much faster.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

NS_PER_S = 1_000_000_000
#: the longest time a setting may name, in seconds (about 11.6 days): a duration, a
#: timeout or a cache lifetime beyond it (1e300, inf) overflowed the integer nanoseconds
LONGEST_S = 1e6
_COARSE_MARGIN_NS = 2_000_000


def _sleep_until_ns(deadline_ns: int) -> None:
    delay_ns = deadline_ns - time.monotonic_ns()
    if delay_ns > 0:
        time.sleep(delay_ns / NS_PER_S)


def epoch_anchor_ns() -> tuple[int, int]:
    """``(Unix time, monotonic time)`` in ns, read back to back: places this machine's
    monotonic timeline on the wall clock that machines share (as far as NTP keeps them
    together), for runs whose requests are sent from several machines (Locust's
    workers). Differences of monotonic times stay exact whatever the wall clock does."""
    return time.time_ns(), time.monotonic_ns()


class Clock(Protocol):
    """What every time-aware component is given."""

    def now_ns(self) -> int:
        """Current time in ns on this clock's monotonic timeline."""
        ...

    async def sleep_until_ns(self, deadline_ns: int) -> None:
        """Return once ``now_ns() >= deadline_ns`` (immediately if already past)."""
        ...


class WallClock:
    """The machine's monotonic clock (``CLOCK_MONOTONIC``; comparable across processes)."""

    def now_ns(self) -> int:
        return time.monotonic_ns()

    async def sleep_until_ns(self, deadline_ns: int) -> None:
        # asyncio's timers wake up to ~1 ms late (epoll's timeout is whole milliseconds,
        # rounded up). Sleep coarsely until just before the deadline, then finish in a
        # worker thread with the OS's fine-grained sleep.
        delay_ns = deadline_ns - time.monotonic_ns()
        if delay_ns > _COARSE_MARGIN_NS:
            await asyncio.sleep((delay_ns - _COARSE_MARGIN_NS) / NS_PER_S)
            delay_ns = deadline_ns - time.monotonic_ns()
        if delay_ns > 0:
            await asyncio.to_thread(_sleep_until_ns, deadline_ns)


class VirtualClock:
    """A clock that advances only through ``advance_to_ns``; sleeping never blocks."""

    def __init__(self, start_ns: int = 0) -> None:
        self._now_ns = start_ns

    def now_ns(self) -> int:
        return self._now_ns

    def advance_to_ns(self, t_ns: int) -> None:
        """Move time forward to ``t_ns``; moving backwards raises ``ValueError``."""
        if t_ns < self._now_ns:
            raise ValueError(f"virtual time cannot go back ({t_ns} < {self._now_ns})")
        self._now_ns = t_ns

    async def sleep_until_ns(self, deadline_ns: int) -> None:
        self._now_ns = max(self._now_ns, deadline_ns)


def wall_time_s() -> float:
    """Seconds since the Unix epoch (UTC): a label saying when something happened, such
    as a run recorded in the history; never a measurement (those use a ``Clock``)."""
    return time.time()
