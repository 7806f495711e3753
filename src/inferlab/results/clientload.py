"""Was the client the bottleneck? What each sending process saw of its own event loop and
CPU during a run (measured by ``load.monitor``), summarised for ``summary.json`` with a
plain-language warning when the client, not the server, likely set the latencies.

Why loop lag: every timestamp of a response (first byte, each chunk, the end) is taken
when the event loop gets round to the read. A timer that should fire every 50 ms and
wakes late measures exactly that wait; the same wait is in every latency the process
measured at that moment. A process near one core of CPU has no slack left to keep it
short.

Why also the share of time late: the timer fires every 50 ms while the loop runs, but once
per stall, however long. A loop that stood still for 2 s at a time, four times in an 18 s
run, has 4 late timers among 200 on time: its p90 lag looks quiet while much of the run's
reads waited. Counted in time instead (a timer ``L`` ms late means anything that became
readable in the first ``L - LAG_P90_MS`` ms of that wait waited longer than
``LAG_P90_MS``), that run was late about 44 % of the time. The same count gives the wait
a read met at a random moment of the run (``ProcessLoad.wait_ms``), which for such a run
is seconds at p99 where the timers' p99 is a fraction of a millisecond.
"""

from __future__ import annotations

import itertools
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
#: The fewest loop timers (``load.monitor``: one per 50 ms, so half a second of run) a
#: process must have fired for a verdict on it: p50 and p99 of one or two timers are
#: those timers, and one late timer is no bottleneck.
MIN_TIMERS = 10
#: The share of a run's wall time with the loop more than ``LAG_P90_MS`` late at or above
#: which the client likely inflated what it measured (the same tenth as the p90 rule,
#: counted in time rather than in timer ticks).
LATE_SHARE = 0.1


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

    @property
    def late_share(self) -> float:
        """The share of wall time in which the loop was more than ``LAG_P90_MS`` late."""
        return self._late_ms(LAG_P90_MS) / 1e3 / self.wall_s if self.wall_s > 0 else 0.0

    def _late_ms(self, x_ms: float) -> float:
        """Wall time (ms, at most the run's) in which anything readable waited more than ``x_ms``."""
        late = sum(lag - x_ms for lag in self.loop_lag_ms if lag > x_ms)
        return min(late, self.wall_s * 1e3)

    def wait_ms(self, q: float) -> float:
        """The ``q``-quantile (0-1) of the wait a read met at a moment drawn uniformly from
        the run: 0 outside the timers' late spells; in a spell ``L`` ms long, anything
        readable at its start waited ``L``, at its end nothing."""
        target = (1 - q) * self.wall_s * 1e3  # the time in which the wait is longer than the answer
        if self.wall_s <= 0 or not self.loop_lag_ms or self._late_ms(0.0) <= target:
            return 0.0
        # the late time over x, sum(L - x for L > x), falls linearly between lags: with
        # the k longest lags (sum S) over x it is S - k x, so x = (S - target) / k
        lags = sorted(self.loop_lag_ms, reverse=True)
        total = 0.0
        for k, lag in enumerate(lags, 1):
            total += lag
            below = lags[k] if k < len(lags) else 0.0
            x = (total - target) / k
            if x >= below:
                return x
        return 0.0  # (not reached: the late time over 0 is above the target)


@dataclass(frozen=True)
class ClientProcess:
    """One sending process in ``summary.json``: its CPU share, its loop lag and both
    second by second (``timeline``: [largest lag ms, CPU share] per second);
    ``late_share``: the share of the run its loop was more than ``LAG_P90_MS`` late
    (None in summaries written before it was measured)."""

    role: str
    cpu_share: float
    loop_lag_ms: Distribution | None
    timeline: tuple[tuple[float, float], ...]
    late_share: float | None = None
    #: about what the process added to the latencies it measured, p50 and p99: the larger
    #: of its timers' lag and the wait counted in time (``ProcessLoad.wait_ms``); None in
    #: summaries written before it was kept (``inflation`` then falls back to the lag)
    inflation_ms: tuple[float, float] | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "cpu_share": self.cpu_share,
            "loop_lag_ms": None if self.loop_lag_ms is None else self.loop_lag_ms.to_json(),
            "late_share": self.late_share,
            "inflation_ms": None if self.inflation_ms is None else {"p50": self.inflation_ms[0], "p99": self.inflation_ms[1]},
            "timeline": [[lag, cpu] for lag, cpu in self.timeline],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ClientProcess:
        lag, late, added = d["loop_lag_ms"], d.get("late_share"), d.get("inflation_ms")
        return cls(
            str(d["role"]), float(d["cpu_share"]), None if lag is None else Distribution.from_json(lag),
            tuple((float(a), float(b)) for a, b in d["timeline"]), None if late is None else float(late),
            None if added is None else (float(added["p50"]), float(added["p99"])),
        )


@dataclass(frozen=True)
class ClientLoad:
    """The client's own load over a run: every sending process, and whether the client
    was likely the bottleneck (``bottleneck``: a process that measured inflated its
    latencies, or the parent of workers delayed the sends; None: no verdict, no process
    that measures ran long enough for ``MIN_TIMERS`` loop timers), with what it may have added
    to its latencies (``inflation_ms``: the busiest measuring process's, p50 and p99,
    ``ClientProcess``; the parent of workers measures nothing, its lateness delays sends)."""

    processes: tuple[ClientProcess, ...]
    bottleneck: bool | None
    inflation_ms: tuple[float, float]

    @property
    def busiest(self) -> ClientProcess:
        """The process that likely added most to what it measured (``busiest``)."""
        return busiest(self.processes)

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
            tuple(ClientProcess.from_json(p) for p in d["processes"]),
            None if d["bottleneck"] is None else bool(d["bottleneck"]),
            (float(inf["p50"]), float(inf["p99"])),
        )


def _p(process: ClientProcess, key: str) -> float:
    lag = process.loop_lag_ms
    return 0.0 if lag is None else float(getattr(lag, key))


def busiest(processes: Sequence[ClientProcess]) -> ClientProcess:
    """The process that likely added most to what it measured: a likely bottleneck before
    others, one that measures before the parent of workers (its lateness delays sends,
    not latencies), then by what it added at p99 (``inflation``), at p90, and CPU."""
    return max(processes, key=lambda p: (saturated(p), measures(p), inflation(p)[1], _p(p, "p90"), p.cpu_share))


def measures(process: ClientProcess) -> bool:
    """Whether ``process`` timed responses (the parent of workers only dispatches)."""
    return process.role != "parent"


def inflation(process: ClientProcess) -> tuple[float, float]:
    """About what ``process`` added to the latencies it measured, p50 and p99."""
    return process.inflation_ms or (_p(process, "p50"), _p(process, "p99"))


def saturated(process: ClientProcess) -> bool:
    """Whether this process likely delayed what it measured. One whose loop timer never
    fired (it ran for less than one interval: every request refused at once, say) is no
    verdict: its CPU share is that of its few milliseconds of start-up."""
    if process.loop_lag_ms is None:
        return False
    return process.cpu_share >= CPU_SATURATED or _p(process, "p90") > LAG_P90_MS or _stalled(process)


def _stalled(process: ClientProcess) -> bool:
    """Late for a tenth of the run or more, counted in time (see the module's docstring)."""
    return (process.late_share or 0.0) >= LATE_SHARE


def client_load(loads: Sequence[ProcessLoad]) -> ClientLoad | None:
    """The summary of the sending processes' loads; ``None`` when none was measured."""
    if not loads:
        return None
    processes = []
    for p in loads:
        lag = distribution(p.loop_lag_ms)
        ticks = (0.0, 0.0) if lag is None else (float(lag.p50), float(lag.p99))
        added = (max(ticks[0], p.wait_ms(0.5)), max(ticks[1], p.wait_ms(0.99)))
        processes.append(ClientProcess(p.role, p.cpu_share, lag, tuple(p.seconds), p.late_share, added))
    measuring = [p for p in processes if measures(p)]
    judged = [c for c, p in zip(processes, loads, strict=True) if len(p.loop_lag_ms) >= MIN_TIMERS]
    verdict: bool | None = any(saturated(p) for p in judged)
    if not verdict and not any(measures(p) for p in judged):
        verdict = None  # (no process that measures ran long enough to say: ``MIN_TIMERS``)
    added = inflation(busiest(measuring)) if measuring else (0.0, 0.0)
    return ClientLoad(tuple(processes), verdict, added)


def bottleneck_warning(
    load: ClientLoad, workers: int, cores: int, autogroup: bool = False, collapsed_share: float = 0.0
) -> str | None:
    """The summary's warning when the client was likely the bottleneck: which process,
    its CPU and loop lag, how much latency that may add, and what to do about it.
    ``autogroup``: Linux's autogroup scheduling is on (``kernel.sched_autogroup_enabled``),
    which the advice for a client starved of a core names. ``collapsed_share``: the share
    (0–1) of completed requests with content chunks read at one instant (a zero gap,
    ``collapsed_gap_share``), said where above 0."""
    if not load.bottleneck:
        return None
    worst = load.busiest  # (a likely bottleneck: the verdict says one is; one that measures first)
    who = "the client" if len(load.processes) == 1 else f"the client's {worst.role} process"
    p50, p99 = inflation(worst)
    stood = ""
    if _stalled(worst):
        stood = (f" (counted over the run's time: it was more than {LAG_P90_MS:g} ms late for "
                 f"{worst.late_share or 0:.0%} of the run, longest {_p(worst, 'max'):,.0f} ms)")
    others = [p for p in load.processes if p is not worst and saturated(p)]
    also = "".join(f"; so was the {p.role} process ({p.cpu_share:.0%} of a core, loop lag p99 {inflation(p)[1]:,.1f} ms)"
                   + ("" if measures(p) else ": that delayed sends (queue_delay_ms), not the latencies")
                   for p in others)
    if not measures(worst):  # it sends nothing itself: its lateness is in when requests left
        effect = "requests may have left later than the load asked (queue_delay_ms); the latencies are not inflated by it"
    else:
        # (chunks a late loop reads together get one timestamp: the gaps before them
        # stretch, the gaps among them are 0, so ITL and TPOT are distorted either way)
        effect = ("TTFT and E2E measured then may be inflated by about as much, and ITL and TPOT distorted: "
                  "gaps stretched while chunks waited, and collapsed to 0 where chunks were read together")
        if collapsed_share > 0:
            effect += f" ({collapsed_share:.0%} of completed requests had chunks read at one instant)"
    if worst.cpu_share < CPU_BUSY:  # late, yet mostly idle: it waited for a core
        cause = f"used only {worst.cpu_share:.0%} of a core, yet its event loop ran late"
        fix = "other processes on this machine held the CPU (a local server competes for it too): leave the client a core"
        if autogroup and _stalled(worst):  # (seconds at a time: its mark)
            fix += ("; with Linux's autogroup scheduling on (kernel.sched_autogroup_enabled = 1), a server started "
                    "in another session (another terminal, setsid) can keep this one off the CPU for seconds: "
                    "start it from the client's session, or set kernel.sched_autogroup_enabled = 0")
    else:
        cause = f"used {worst.cpu_share:.0%} of a core and its event loop ran late"
        if workers < max(1, cores - 1):
            fix = f"rerun with --workers {min(cores - 1, max(2, workers * 2))} (this process may run on {cores} cores)"
        else:
            fix = "give the client more cores, or spread the load over machines"
    return (
        f"the client was likely the bottleneck: {who} {cause} by {p50:,.1f} ms at p50, {p99:,.1f} ms at "
        f"p99{stood}{also}; {effect}; {fix}"
    )


def collapsed_gap_share(content_ns: Sequence[Sequence[int]]) -> float:
    """The share (0–1) of requests, given each one's content chunk times (ns), with two
    chunks at one timestamp: read together by a late client, a zero ITL. 0 for none."""
    if not content_ns:
        return 0.0
    hit = sum(any(b == a for a, b in itertools.pairwise(times)) for times in content_ns)
    return hit / len(content_ns)
