"""Is the client the bottleneck? Each sending process watches its own event loop while
it runs: how late a timer that should fire every ``INTERVAL_S`` wakes up (loop lag:
everything the loop had to do first delayed it, and delayed every chunk's timestamp the
same way), and how much CPU the process used against the wall-clock time it ran. A
loop that lags, or a process near one core of CPU, adds its own delay to the latencies
it measures.

The clock is read through ``_clock`` only; CPU time comes from the OS (``time.process_time``
is no clock of the run: it times nothing in the records).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from inferlab._clock import NS_PER_S, Clock

#: How often the loop-lag timer should fire.
INTERVAL_S = 0.05


@dataclass
class ProcessLoad:
    """One sending process over a run: ``loop_lag_ms`` one value per timer, ``cpu_s``
    the CPU it used (user + system) over ``wall_s``."""

    loop_lag_ms: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    wall_s: float = 0.0

    @property
    def cpu_share(self) -> float:
        """CPU used over wall time: 1.0 is one core busy all the time."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


class LoopMonitor:
    """Samples this process's loop lag and CPU while running (``start``/``stop``)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.load = ProcessLoad()
        self._task: asyncio.Task[None] | None = None
        self._t0_ns = 0
        self._cpu0 = 0.0

    def start(self) -> None:
        self._t0_ns = self.clock.now_ns()
        self._cpu0 = time.process_time()
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        interval_ns = round(INTERVAL_S * NS_PER_S)
        lags = self.load.loop_lag_ms
        while True:
            due = self.clock.now_ns() + interval_ns
            await asyncio.sleep(INTERVAL_S)
            lags.append(max(0, self.clock.now_ns() - due) / 1e6)

    async def stop(self) -> ProcessLoad:
        """Stop sampling; what was seen."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.load.cpu_s = time.process_time() - self._cpu0
        self.load.wall_s = (self.clock.now_ns() - self._t0_ns) / NS_PER_S
        return self.load
