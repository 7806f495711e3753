"""Arrival processes: the send offsets of requests arriving at a mean rate.

``poisson`` draws exponential gaps, ``constant`` spaces requests evenly, ``gamma`` draws
gaps of shape ``burstiness`` with the same mean (vLLM's convention: 1 is Poisson, below 1
burstier, above 1 more regular). Seeded, so the same seed gives the same times. Used by
open-loop schedules (``load.schedules.OpenLoop``) and by traces that record a rate
instead of send times (a vLLM benchmark result).
"""

from __future__ import annotations

import math
import random
from typing import Literal

Arrival = Literal["poisson", "constant", "gamma"]
ARRIVALS: tuple[Arrival, ...] = ("poisson", "constant", "gamma")


def gap_s(rate_rps: float, arrival: Arrival, burstiness: float, rng: random.Random) -> float:
    """One inter-arrival gap in seconds (0 at an infinite rate)."""
    if math.isinf(rate_rps):
        return 0.0
    mean = 1.0 / rate_rps
    if arrival == "constant":
        return mean
    if arrival == "poisson":
        return rng.expovariate(rate_rps)
    return rng.gammavariate(burstiness, mean / burstiness)


def arrival_times_s(
    rate_rps: float,
    arrival: Arrival,
    burstiness: float,
    seed: int,
    num_requests: int | None,
    duration_s: float | None,
) -> list[float]:
    """Send offsets from the start: ``num_requests`` of them, or all before
    ``duration_s``; the first at 0. ``ValueError`` without a bound (an infinite rate
    needs ``num_requests``) or for a rate or burstiness that is not positive."""
    if not rate_rps > 0 or not burstiness > 0:
        raise ValueError(f"rate ({rate_rps}) and burstiness ({burstiness}) must be positive")
    if num_requests is None and (duration_s is None or math.isinf(rate_rps)):
        raise ValueError("arrivals need a count, or a duration at a finite rate")
    rng = random.Random(seed)
    times: list[float] = []
    t = 0.0
    while num_requests is None or len(times) < num_requests:
        if duration_s is not None and t >= duration_s:
            break
        times.append(t)
        if arrival == "constant" and not math.isinf(rate_rps):
            t = len(times) / rate_rps  # no accumulated rounding
        else:
            t += gap_s(rate_rps, arrival, burstiness, rng)
    return times
