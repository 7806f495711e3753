"""Confidence intervals over repeated runs: Student's t interval for a mean."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: Two-sided 95 % quantiles of Student's t (t_0.975) for 1..30 degrees of freedom.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)
_Z975 = 1.959964


def t975(df: int) -> float:
    """t_0.975 with ``df`` degrees of freedom (the table to 30, then the Cornish-Fisher
    expansion around the normal quantile, within 0.01 % there)."""
    if df < 1:
        raise ValueError("a t quantile needs at least 1 degree of freedom")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` repeats with its 95 % t interval (``low``/``high`` None for one
    repeat: no spread to go on)."""

    mean: float
    low: float | None
    high: float | None
    n: int

    def to_json(self) -> dict[str, float | int | None]:
        return {"mean": self.mean, "ci95_low": self.low, "ci95_high": self.high, "n": self.n}


def t_interval(values: Sequence[float]) -> Interval:
    """The mean of ``values`` and its 95 % confidence interval, mean ± t·s/√n (s the
    sample standard deviation). ``ValueError`` for no values."""
    if not values:
        raise ValueError("no values")
    mean = statistics.fmean(values)
    n = len(values)
    if n < 2:
        return Interval(mean, None, None, n)
    half = t975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)
