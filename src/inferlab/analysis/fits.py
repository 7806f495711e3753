"""The small fits a profile makes from its measurements: pure functions of numbers.

``prefill_fit``: TTFT against prompt length at concurrency 1 → a fixed overhead (ms) and
a prefill rate (tokens/s), how well a line fits, and whether the cost per token grows
with length (attention) or jumps once (a chunk or a batching budget). ``knee``: where
adding concurrency stops adding throughput, at every higher concurrency measured.
``line_quality``: whether a straight line's slope (a cost per token) can be trusted: R²,
monotonic points, requests behind each point.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: The marginal cost per token of the longest prompts against the shorter ones (from
#: ``SUPERLINEAR_FROM_TOKENS``) beyond which growth is called super-linear.
SUPERLINEAR_RATIO = 1.3
#: Below this length a step's cost is mostly reading the weights, whatever the prompt
#: (flat, not linear): the flags look at longer prompts only.
SUPERLINEAR_FROM_TOKENS = 512
#: One segment's marginal cost per token this many times its neighbours' is a step.
STEP_RATIO = 2.0
#: Throughput that grows by less than this factor when concurrency doubles is past the knee.
KNEE_GAIN = 1.15
#: A point that is the median of fewer requests than this is too noisy to fit a slope to.
MIN_REQUESTS_PER_POINT = 5
#: A line that explains less than this share of the points' variance (R²) does not
#: describe them: its slope is no cost per token.
MIN_R2 = 0.9
#: A point this share below the one before it (a longer input, a longer output) breaks
#: the monotonic growth a cost per token assumes; smaller dips are noise.
MONOTONIC_SLACK = 0.05


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least squares ``y = a + b·x``: (a, b). ``ValueError`` for fewer than two distinct x."""
    if len(xs) != len(ys) or len(set(xs)) < 2:
        raise ValueError("a line needs at least two distinct points")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    sxy = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    b = sxy / sxx
    return my - b * mx, b


def r_squared(xs: Sequence[float], ys: Sequence[float], a: float, b: float) -> float | None:
    """The share of ``ys``' variance the line ``y = a + b·x`` explains (1: every point
    on it; 0 or below: no better than their mean); None where ``ys`` are all equal."""
    my = statistics.fmean(ys)
    total = math.fsum((y - my) ** 2 for y in ys)
    if total == 0:
        return None
    return 1 - math.fsum((y - (a + b * x)) ** 2 for x, y in zip(xs, ys, strict=True)) / total


@dataclass(frozen=True)
class LineQuality:
    """How far a straight line's slope over ``points`` can be trusted as a cost per
    token: ``r2`` (``r_squared``), ``monotonic`` (no point ``MONOTONIC_SLACK`` below the
    one before it), ``requests_per_point`` (the fewest completed requests behind a
    point), ``trusted`` (none of ``caveats``: fewer than ``MIN_REQUESTS_PER_POINT``
    requests per point, points not monotonic, R² below ``MIN_R2``, a slope not above 0)."""

    r2: float | None
    monotonic: bool
    requests_per_point: int
    trusted: bool
    caveats: list[str]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def words(self) -> str:
        """The caveats in one clause ("" where the line is trusted)."""
        return "" if self.trusted else "not to be trusted: " + "; ".join(self.caveats)


def line_quality(points: Sequence[tuple[float, float]], requests_per_point: int, unit: str = "") -> LineQuality:
    """``LineQuality`` of the least squares line through ``points`` (x, y), at least two
    distinct x; ``unit`` names x in the caveats ("tokens")."""
    pts = sorted(points)
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    a, b = linear_fit(xs, ys)
    r2 = r_squared(xs, ys, a, b)
    drops = [(p1, p2) for p1, p2 in itertools.pairwise(pts) if p2[1] < p1[1] * (1 - MONOTONIC_SLACK)]
    caveats = []
    if requests_per_point < MIN_REQUESTS_PER_POINT:
        caveats.append(f"{requests_per_point} requests per point (fewer than {MIN_REQUESTS_PER_POINT})")
    for (x1, y1), (x2, y2) in drops:
        caveats.append(f"not monotonic: {x1:,.0f}{unit} {y1:,.0f} ms, then {x2:,.0f}{unit} {y2:,.0f} ms")
    if r2 is not None and r2 < MIN_R2:
        caveats.append(f"a poor line fit (R² {r2:.2f}, below {MIN_R2})")
    if b <= 0:
        caveats.append("the slope is not positive")
    return LineQuality(r2, not drops, requests_per_point, not caveats, caveats)


@dataclass(frozen=True)
class PrefillFit:
    """TTFT ≈ ``overhead_ms`` + tokens / ``prefill_tps`` × 1000 over the ladder's
    ``points`` ([prompt tokens, median TTFT ms]); ``residual_pct``: the fit's RMS error
    relative to the measured TTFTs; ``superlinear``: the cost per token of the longest
    prompts is ``SUPERLINEAR_RATIO`` times that of the shorter ones or more (attention's
    quadratic part); ``step_at_tokens``: the length after which the cost jumped once (a
    prefill chunk or a batching budget), or None."""

    points: list[tuple[float, float]]
    overhead_ms: float
    prefill_tps: float | None  # None: TTFT did not grow with length
    residual_pct: float
    marginal_ms_per_token: list[float]
    superlinear: bool
    growth_ratio: float | None
    step_at_tokens: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def prefill_fit(points: Sequence[tuple[float, float]]) -> PrefillFit:
    """Fit ``points`` (prompt tokens, TTFT ms), at least two distinct lengths."""
    pts = sorted(points)
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    a, b = linear_fit(xs, ys)
    residual = math.sqrt(statistics.fmean(((y - (a + b * x)) / y) ** 2 for x, y in pts if y > 0)) * 100
    marginal = [
        (y2 - y1) / (x2 - x1) for (x1, y1), (x2, y2) in itertools.pairwise(pts) if x2 > x1
    ]
    long = [
        (y2 - y1) / (x2 - x1) for (x1, y1), (x2, y2) in itertools.pairwise(pts)
        if x2 > x1 and x1 >= SUPERLINEAR_FROM_TOKENS
    ]
    growth = None
    if len(long) >= 2 and long[0] > 0:
        growth = long[-1] / long[0]
    superlinear = growth is not None and growth >= SUPERLINEAR_RATIO and all(
        m2 >= m1 * 0.95 for m1, m2 in itertools.pairwise(long)
    )
    step = None
    # (below SUPERLINEAR_FROM_TOKENS the cost is flat, then turns linear: not a step)
    segments = [
        (x1, (y2 - y1) / (x2 - x1)) for (x1, y1), (x2, y2) in itertools.pairwise(pts)
        if x2 > x1 and x1 >= SUPERLINEAR_FROM_TOKENS / 2
    ]
    for i in range(1, len(segments) - 1):
        x, m = segments[i]
        if m > 0 and m >= STEP_RATIO * max(segments[i - 1][1], 1e-12) and m >= STEP_RATIO * max(segments[i + 1][1], 1e-12):
            step = x
            break
    return PrefillFit(
        [(float(x), float(y)) for x, y in pts], a, 1000.0 / b if b > 0 else None, residual, marginal,
        superlinear and step is None, growth, step,
    )


def paid(c_low: float, tps_low: float, c_high: float, tps_high: float) -> bool:
    """Whether going from concurrency ``c_low`` to ``c_high`` raised aggregate
    throughput by ``KNEE_GAIN`` per doubling or more (the gain scaled to their ratio:
    1.15× from 4 to 8, 1.32× from 4 to 16)."""
    need = KNEE_GAIN ** math.log2(c_high / c_low) if c_high > c_low > 0 else 1.0
    return tps_low > 0 and tps_high >= need * tps_low


@dataclass(frozen=True)
class Knee:
    """Throughput against concurrency: ``knee_concurrency`` is the first concurrency
    measured from which no higher one paid (``paid``: ``KNEE_GAIN`` per doubling over
    it, scaled to their ratio), so the knee is where more concurrency stopped buying
    throughput for good, not a step that paid little before the next paid again (774,
    873, 1,021, 1,408 tokens/s at 1, 2, 4, 8 has no knee: 1 → 2 gains 13 %, 1 → 8
    82 %). None: some higher concurrency paid over every one but the highest, or only
    one was measured. ``best_goodput_concurrency``: where requests meeting the SLOs
    per second peaked (None without SLO data)."""

    knee_concurrency: int | None
    best_goodput_concurrency: int | None


def knee(concurrency: Sequence[int], throughput: Sequence[float], goodput: Sequence[float | None]) -> Knee:
    """The knee of ``throughput`` over ascending ``concurrency`` (see ``Knee``)."""
    at = None
    points = list(zip(concurrency, throughput, strict=True))
    for i, (c, tps) in enumerate(points[:-1]):
        if tps > 0 and not any(paid(c, tps, c_high, tps_high) for c_high, tps_high in points[i + 1:]):
            at = c
            break
    good = [(g, c) for g, c in zip(goodput, concurrency, strict=True) if g is not None]
    best = max(good)[1] if good and max(good)[0] > 0 else None
    return Knee(at, best)
