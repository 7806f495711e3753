"""When requests are sent: closed loop (N users), open loop (pre-computed arrivals), or
replay (a trace's own timestamps).

Open-loop arrival times are computed up front from a seeded generator, so the intended
send time of every request is known and client-side queueing shows up as queue delay
instead of silently lowering the offered load (coordinated omission).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from inferlab._errors import UsageError
from inferlab.workload.arrivals import ARRIVALS, Arrival, arrival_times_s
from inferlab.workload.spec import TimedSpec


@dataclass(frozen=True)
class ClosedLoop:
    """``concurrency`` users; each sends its next request when its previous one ends."""

    concurrency: int

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise UsageError("--concurrency must be at least 1")


@dataclass(frozen=True)
class OpenLoop:
    """Requests at ``rate_rps`` on average, gaps drawn by ``arrival``.

    ``gamma`` uses shape ``burstiness`` with the same mean rate: burstiness 1 is Poisson,
    below 1 is burstier, above 1 is more regular (vLLM's convention). ``rate_rps`` may be
    ``math.inf``: every request is due at time 0. ``max_concurrency`` optionally caps
    requests in flight (later ones wait, and that wait is queue delay).
    """

    rate_rps: float
    arrival: Arrival = "poisson"
    burstiness: float = 1.0
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if not self.rate_rps > 0:
            raise UsageError("--rate must be positive")
        if not self.burstiness > 0:
            raise UsageError("--burstiness must be positive")
        if self.arrival not in ARRIVALS:
            raise UsageError(f"unknown arrival process {self.arrival!r}")

    def arrival_times_s(
        self, seed: int, num_requests: int | None, duration_s: float | None
    ) -> list[float]:
        """Send offsets from the run's start: ``num_requests`` of them, or all before
        ``duration_s``; the first request goes at 0. At least one bound is required."""
        if num_requests is None and duration_s is None:
            raise UsageError("an open-loop run needs --num-requests or --duration")
        if math.isinf(self.rate_rps) and num_requests is None:
            raise UsageError("--rate inf needs --num-requests")
        return arrival_times_s(self.rate_rps, self.arrival, self.burstiness, seed, num_requests, duration_s)


@dataclass(frozen=True)
class Replay:
    """Open loop at the workload's own timestamps (a trace of ``TimedSpec``): each
    request's intended send time is its arrival time. ``max_concurrency`` as for
    ``OpenLoop``."""

    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise UsageError("--max-concurrency must be at least 1")


Schedule = ClosedLoop | OpenLoop | Replay

@dataclass(frozen=True)
class LoadConfig:
    schedule: Schedule
    num_requests: int | None = None
    duration_s: float | None = None
    warmup: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests is None and self.duration_s is None and not isinstance(self.schedule, Replay):
            raise UsageError("give --num-requests or --duration")
        if self.num_requests is not None and self.num_requests < 1:
            raise UsageError("--num-requests must be at least 1")
        if self.duration_s is not None and not self.duration_s > 0:
            raise UsageError("--duration must be positive")
        if self.warmup < 0:
            raise UsageError("--warmup cannot be negative")


def replay_times_s(trace: Sequence[TimedSpec], load: LoadConfig) -> list[float]:
    """A trace's send offsets: the first ``num_requests + warmup`` arrivals, those
    before ``duration_s`` (the whole trace if neither is set)."""
    times = [t.arrival_s for t in trace]
    if load.duration_s is not None:
        times = [t for t in times if t < load.duration_s]
    if load.num_requests is not None:
        times = times[: load.num_requests + load.warmup]
    return times
