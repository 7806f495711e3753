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

from inferlab._clock import NS_PER_S, Clock
from inferlab.results.clientload import ProcessLoad

#: How often the loop-lag timer should fire.
INTERVAL_S = 0.05
#: Timer ticks per second of the run's timeline (``ProcessLoad.seconds``).
_PER_SECOND = round(1 / INTERVAL_S)


def autogroup_enabled() -> bool:
    """Whether Linux's autogroup scheduling applies to this process (it shares the CPU
    between sessions first: a busy server started in another session can starve this
    one): on (``kernel.sched_autogroup_enabled``), and this process in the root CPU
    cgroup, the only one autogroups divide (a container's or a service's cgroup is not)."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            if f.read().strip() != "1":
                return False
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    for line in lines:  # "ID:CONTROLLERS:PATH"; cgroup v2's one line has no controllers
        _, controllers, path = line.split(":", 2)
        if (controllers == "" or "cpu" in controllers.split(",")) and path != "/":
            return False
    return True


class LoopMonitor:
    """Samples this process's loop lag and CPU while running (``start``/``stop``), as
    ``role`` (see ``ProcessLoad``)."""

    def __init__(self, clock: Clock, role: str = "client") -> None:
        self.clock = clock
        self.load = ProcessLoad(role)
        self._task: asyncio.Task[None] | None = None
        self._t0_ns = 0
        self._cpu0 = 0.0
        self._second: tuple[int, float, int] = (0, 0.0, 0)  # its start: clock ns, CPU s, lag index

    def start(self) -> None:
        self._t0_ns = self.clock.now_ns()
        self._cpu0 = time.process_time()
        self._second = (self._t0_ns, self._cpu0, 0)
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        interval_ns = round(INTERVAL_S * NS_PER_S)
        lags = self.load.loop_lag_ms
        while True:
            due = self.clock.now_ns() + interval_ns
            await asyncio.sleep(INTERVAL_S)
            lags.append(max(0, self.clock.now_ns() - due) / 1e6)
            if len(lags) - self._second[2] >= _PER_SECOND:
                self._close_second()

    def _close_second(self) -> None:
        """Add the second since the last one to the timeline."""
        t_ns, cpu, first = self._second
        now_ns, now_cpu = self.clock.now_ns(), time.process_time()
        lags = self.load.loop_lag_ms
        if now_ns > t_ns and len(lags) > first:
            self.load.seconds.append((max(lags[first:]), (now_cpu - cpu) / ((now_ns - t_ns) / NS_PER_S)))
        self._second = (now_ns, now_cpu, len(lags))

    async def stop(self) -> ProcessLoad:
        """Stop sampling; what was seen."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            self._close_second()  # (the last, partial second)
        self.load.cpu_s = time.process_time() - self._cpu0
        self.load.wall_s = (self.clock.now_ns() - self._t0_ns) / NS_PER_S
        return self.load
