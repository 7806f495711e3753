"""Was the client the bottleneck? What each sending process saw of its own event loop and
CPU during a run (measured by ``load.monitor``), summarised for ``summary.json`` with a
plain-language warning when the client, not the server, likely set the latencies.

Why loop lag: every timestamp of a response (first byte, each chunk, the end) is taken
when the event loop gets round to the read. A timer that should fire every 50 ms and
wakes late measures exactly that wait; the same wait is in every latency the process
measured at that moment. A process near one core of CPU has no slack left to keep it
short.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferlab.results.metrics import Distribution, distribution

#: Loop lag (ms) at the 90th percentile above which the client likely inflated what it
#: measured: for a tenth of the run or more, the loop was this late to every read. (A
#: single late timer, a garbage collection say, is not a bottleneck: no p99 rule.)
LAG_P90_MS = 2.0
#: CPU used over wall time (1.0: one core busy all the time) at or above which a process
#: is saturated.
CPU_SATURATED = 0.9
#: A process whose loop lagged while it used less CPU than this waited for a core that
#: other processes held, rather than working through its own backlog.
CPU_BUSY = 0.5


@dataclass
class ProcessLoad:
    """One sending process over a run, as ``load.monitor`` measured it: ``loop_lag_ms``
    one value per timer, ``cpu_s`` the CPU it used (user + system) over ``wall_s``;
    ``seconds`` the run second by second: (the largest loop lag in that second, ms; the
    CPU share in it). ``role``: "client" (the only process), "parent" (it dispatches
    to workers) or "worker N"."""

    role: str = "client"
    loop_lag_ms: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    wall_s: float = 0.0
    seconds: list[tuple[float, float]] = field(default_factory=list)

    @property
    def cpu_share(self) -> float:
        """CPU used over wall time: 1.0 is one core busy all the time."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class ClientProcess:
    """One sending process in ``summary.json``: its CPU share, its loop lag and both
    second by second (``timeline``: [largest lag ms, CPU share] per second)."""

    role: str
    cpu_share: float
    loop_lag_ms: Distribution | None
    timeline: tuple[tuple[float, float], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "cpu_share": self.cpu_share,
            "loop_lag_ms": None if self.loop_lag_ms is None else self.loop_lag_ms.to_json(),
            "timeline": [[lag, cpu] for lag, cpu in self.timeline],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ClientProcess:
        lag = d["loop_lag_ms"]
        return cls(
            str(d["role"]), float(d["cpu_share"]), None if lag is None else Distribution.from_json(lag),
            tuple((float(a), float(b)) for a, b in d["timeline"]),
        )


@dataclass(frozen=True)
class ClientLoad:
    """The client's own load over a run: every sending process, and whether the client
    was likely the bottleneck (``bottleneck``), with the loop lag that may be in its
    latencies (``inflation_ms``: the busiest process's loop lag p50 and p99)."""

    processes: tuple[ClientProcess, ...]
    bottleneck: bool
    inflation_ms: tuple[float, float]

    @property
    def busiest(self) -> ClientProcess:
        """The process whose loop lagged most (ties: the one with more CPU)."""
        return max(self.processes, key=lambda p: (_p(p, "p90"), p.cpu_share))

    def to_json(self) -> dict[str, Any]:
        return {
            "bottleneck": self.bottleneck,
            "inflation_ms": {"p50": self.inflation_ms[0], "p99": self.inflation_ms[1]},
            "processes": [p.to_json() for p in self.processes],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ClientLoad:
        inf = d["inflation_ms"]
        return cls(
            tuple(ClientProcess.from_json(p) for p in d["processes"]), bool(d["bottleneck"]),
            (float(inf["p50"]), float(inf["p99"])),
        )


def _p(process: ClientProcess, key: str) -> float:
    lag = process.loop_lag_ms
    return 0.0 if lag is None else float(getattr(lag, key))


def saturated(process: ClientProcess) -> bool:
    """Whether this process likely delayed what it measured. One whose loop timer never
    fired (it ran for less than one interval: every request refused at once, say) is no
    verdict: its CPU share is that of its few milliseconds of start-up."""
    if process.loop_lag_ms is None:
        return False
    return process.cpu_share >= CPU_SATURATED or _p(process, "p90") > LAG_P90_MS


def client_load(loads: Sequence[ProcessLoad]) -> ClientLoad | None:
    """The summary of the sending processes' loads; ``None`` when none was measured."""
    if not loads:
        return None
    processes = tuple(
        ClientProcess(p.role, p.cpu_share, distribution(p.loop_lag_ms), tuple(p.seconds)) for p in loads
    )
    load = ClientLoad(processes, False, (0.0, 0.0))
    worst = load.busiest
    return ClientLoad(processes, any(saturated(p) for p in processes), (_p(worst, "p50"), _p(worst, "p99")))


def bottleneck_warning(load: ClientLoad, workers: int, cores: int) -> str | None:
    """The summary's warning when the client was likely the bottleneck: which process,
    its CPU and loop lag, how much latency that may add, and what to do about it."""
    if not load.bottleneck:
        return None
    hot = [p for p in load.processes if saturated(p)]
    worst = max(hot, key=lambda p: (_p(p, "p90"), p.cpu_share))
    who = "the client" if len(load.processes) == 1 else f"the client's {worst.role} process"
    p50, p99 = _p(worst, "p50"), _p(worst, "p99")
    if worst.role == "parent":  # it sends nothing itself: its lateness is in when requests left
        effect = "requests may have left later than the load asked (queue_delay_ms)"
    else:
        effect = "latencies measured then (TTFT, ITL, E2E) may be inflated by about as much"
    if worst.cpu_share < CPU_BUSY:  # late, yet mostly idle: it waited for a core
        cause = f"used only {worst.cpu_share:.0%} of a core, yet its event loop ran late"
        fix = "other processes on this machine held the CPU (a local server competes for it too): leave the client a core"
    else:
        cause = f"used {worst.cpu_share:.0%} of a core and its event loop ran late"
        if workers < max(1, cores - 1):
            fix = f"rerun with --workers {min(cores - 1, max(2, workers * 2))} (this machine has {cores} cores)"
        else:
            fix = "give the client more cores, or spread the load over machines"
    return (
        f"the client was likely the bottleneck: {who} {cause} by {p50:.1f} ms at p50, {p99:.1f} ms at "
        f"p99; {effect}; {fix}"
    )
