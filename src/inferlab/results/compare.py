"""Comparing runs: each headline metric, its change, and whether that change exceeds
run-to-run noise.

Every value comes with a 95 % confidence interval, from what the runs hold:

- **repeats** (several runs of one configuration, a sweep point run ``--repeats N``):
  the mean over the repeats ± t·s/√n (Student's t, n − 1 degrees of freedom);
- **one run**: *batch means*. The completed requests, in the order they ended, are cut
  into up to 10 batches of at least 10 (for a percentile q, at least 10/(1−q): p99
  needs 1,000 a batch); the metric is computed on each batch (a percentile, a mean, or
  a throughput: the batch's tokens over the time since the previous batch ended), and
  the interval is ± t·s/√k over the k batches (at least 3). Requests next to each
  other share the server's state (a batch, a queue) and are not independent, which
  per-request statistics would ignore; batches are nearly so. A percentile's interval
  is widened, where wider, to the distribution-free interval of a quantile from order
  statistics (ranks n·q ∓ 1.96·√(n·q·(1−q))); a side whose rank falls outside the data
  is unbounded (p99 of under ~300 requests cannot be bounded above), so no change there
  is beyond noise; and to a moving-block bootstrap (runs of √n consecutive requests),
  so that a burst counts once. A mean's interval is widened to ± t·s/√n over the
  requests. Without 3 batches a throughput's noise is unknown.

The change B − A gets the interval of both errors combined (in quadrature, each side
its own); it *exceeds noise* when that interval excludes zero. Mann–Whitney's U test on
the per-request TTFT, TPOT and E2E (normal approximation, ties corrected) tells
whether the whole distribution moved, percentiles aside.
"""

from __future__ import annotations

import math
import random
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inferlab._errors import UsageError
from inferlab.results.metrics import percentile, request_metrics
from inferlab.results.records import RequestRecord
from inferlab.results.sources import Run

Z95 = 1.959963984540054
#: Student's t for a two-sided 95 % interval, by degrees of freedom (the next lower
#: listed one is used: wider, so never overconfident).
_T95 = ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (6, 2.447), (7, 2.365), (8, 2.306),
        (9, 2.262), (10, 2.228), (12, 2.179), (15, 2.131), (20, 2.086), (30, 2.042), (60, 2.000), (120, 1.980))
MAX_BATCHES = 10
BOOTSTRAP_RESAMPLES = 200
MIN_BATCH = 10


def t95(df: int) -> float:
    if df < 1:
        return math.inf
    return next((t for d, t in reversed(_T95) if d <= df), Z95) if df <= 120 else Z95


@dataclass(frozen=True)
class Metric:
    """A metric compare shows: ``key`` in summary.json (``stat`` inside it: p50, p99,
    mean; None for a rate); ``per_request`` the ``RequestMetrics`` field behind it."""

    name: str
    label: str
    unit: str
    key: str
    stat: str | None
    higher_is_better: bool
    per_request: str | None = None


#: The share of the measured requests that failed, in % (cancelled ones, in flight at an
#: interruption, left out): the latencies are over completed requests only, so a
#: run that fails its slowest requests would read as faster without it.
FAILED = Metric("failed_pct", "failed", "%", "counts", None, False)
METRICS: tuple[Metric, ...] = (
    Metric("output_tok_s", "output tok/s", "tok/s", "output_token_throughput_tps", None, True),
    Metric("req_s", "requests/s", "req/s", "request_throughput_rps", None, True),
    Metric("ttft_p50", "TTFT p50", "ms", "ttft_ms", "p50", False, "ttft_ms"),
    Metric("ttft_p99", "TTFT p99", "ms", "ttft_ms", "p99", False, "ttft_ms"),
    Metric("ttft_mean", "TTFT mean", "ms", "ttft_ms", "mean", False, "ttft_ms"),
    Metric("tpot_p50", "TPOT p50", "ms", "tpot_ms", "p50", False, "tpot_ms"),
    Metric("tpot_p99", "TPOT p99", "ms", "tpot_ms", "p99", False, "tpot_ms"),
    Metric("e2e_p50", "E2E p50", "ms", "e2e_ms", "p50", False, "e2e_ms"),
    Metric("e2e_p99", "E2E p99", "ms", "e2e_ms", "p99", False, "e2e_ms"),
    FAILED,
)
BY_NAME = {m.name: m for m in METRICS}
#: The per-request distributions Mann–Whitney is run on.
DISTRIBUTIONS = ("ttft_ms", "tpot_ms", "e2e_ms")


@dataclass(frozen=True)
class Estimate:
    """A metric's value with its 95 % interval (``lo``/``hi`` None: noise unknown)."""

    value: float | None
    lo: float | None
    hi: float | None
    method: str


@dataclass(frozen=True)
class Delta:
    """B against A for one metric. ``verdict``: "beyond noise", "within noise", "noise
    unknown" or "no value" (a run has none: nothing completed); ``better`` whether B is better (None when equal or unknown)."""

    metric: Metric
    a: Estimate
    b: Estimate
    delta: float | None
    rel: float | None  # delta / a
    lo: float | None
    hi: float | None
    verdict: str

    @property
    def better(self) -> bool | None:
        if self.delta is None or self.delta == 0:
            return None
        return (self.delta > 0) == self.metric.higher_is_better

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric.name, "unit": self.metric.unit, "a": self.a.value, "b": self.b.value,
            "delta": self.delta, "rel": self.rel, "delta_ci95": [self.lo, self.hi], "verdict": self.verdict,
            "better": self.better, "method": self.b.method if self.b.method == self.a.method else f"{self.a.method} / {self.b.method}",
        }


def summary_value(summary: dict[str, Any], m: Metric) -> float | None:
    if m is FAILED:
        ended = failed_and_ended(summary)
        return 100.0 * ended[0] / ended[1] if ended and ended[1] else None
    v = summary.get(m.key)
    if m.stat is not None:
        v = v.get(m.stat) if isinstance(v, dict) else None
    # (a summary edited by hand may hold NaN, which would compare as no change at all)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def failed_and_ended(summary: dict[str, Any]) -> tuple[int, int] | None:
    """(failed, failed + completed) of a summary's ``counts``; None where it has none."""
    counts = summary.get("counts")
    if not isinstance(counts, dict):
        return None
    failed, completed = counts.get("failed"), counts.get("completed")
    if type(failed) is not int or type(completed) is not int or failed < 0 or completed < 0:
        return None
    return failed, failed + completed


def wilson_interval(k: int, n: int) -> tuple[float, float]:
    """The 95 % Wilson score interval of a share ``k`` of ``n`` (n > 0), in %: bounded
    by 0 and 100, and not empty when ``k`` is 0 or ``n``."""
    p, z2 = k / n, Z95 * Z95
    center = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return 100 * max(0.0, center - half), 100 * min(1.0, center + half)


def per_request(records: Sequence[RequestRecord], name: str) -> list[float]:
    """The per-request values of ``name`` (a ``RequestMetrics`` field) of the completed
    records, None left out."""
    out = []
    for r in records:
        if r.ok and not r.warmup:
            v = getattr(request_metrics(r), name)
            if v is not None:
                out.append(float(v))
    return out


def estimate(m: Metric, runs: Sequence[Run]) -> Estimate:
    """``m`` over ``runs``: repeats of one configuration when more than one."""
    if len(runs) > 1:
        values = [v for v in (summary_value(r.summary, m) for r in runs) if v is not None]
        if len(values) < 2:
            return Estimate(values[0] if values else None, None, None, "repeats")
        mean = statistics.fmean(values)
        half = t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
        return Estimate(mean, mean - half, mean + half, f"{len(values)} repeats")
    (run,) = runs
    value = summary_value(run.summary, m)
    if value is None:
        return Estimate(None, None, None, "")
    if m is FAILED:  # (value is not None: the counts are there)
        failed, ended = failed_and_ended(run.summary) or (0, 1)
        return Estimate(value, *wilson_interval(failed, ended), "Wilson score")
    if m.per_request is None:
        rel = batch_rel_half_width(run.records, tokens=m.name == "output_tok_s")
        if rel is None:
            return Estimate(value, None, None, "batch means (too few requests)")
        return Estimate(value, value * (1 - rel), value * (1 + rel), "batch means")
    xs = sorted(per_request(run.records, m.per_request))
    stat = m.stat or "p50"
    batch = batch_half_width(run.records, m.per_request, stat)
    if stat == "mean":
        halves = [h for h in (batch,) if h is not None]
        if len(xs) > 1:
            halves.append(t95(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs)))
        if not halves:
            return Estimate(value, None, None, "per request")
        return Estimate(value, value - max(halves), value + max(halves), "batch means" if batch is not None else "per request")
    if not xs:
        return Estimate(value, None, None, "")
    lo, hi = quantile_interval(xs, float(stat[1:]) / 100)
    # a side the data cannot bound (p99 of 200 requests: its upper rank is past the last)
    # is unbounded: such a change is never beyond noise on that side
    lo_f = -math.inf if lo is None else lo
    hi_f = math.inf if hi is None else hi
    if batch is not None:  # the widest of them on each side
        lo_f, hi_f = min(lo_f, value - batch), max(hi_f, value + batch)
    boot = block_bootstrap_interval(in_end_order(run.records, m.per_request), float(stat[1:]))
    if boot is not None:
        lo_f, hi_f = min(lo_f, value - (boot[1] - boot[0]) / 2, boot[0]), max(hi_f, value + (boot[1] - boot[0]) / 2, boot[1])
    return Estimate(value, lo_f, hi_f, "order statistics, batch means, block bootstrap")


def in_end_order(records: Sequence[RequestRecord], name: str) -> list[float]:
    """``name``'s per-request values, in the order the requests ended."""
    done = sorted((r for r in records if r.ok and not r.warmup), key=lambda r: r.end_ns or 0)
    return [v for r in done if (v := getattr(request_metrics(r), name)) is not None]


def block_bootstrap_interval(xs: Sequence[float], q: float, resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float] | None:
    """The 95 % interval of the ``q``-th percentile (0–100) of ``xs`` (in the order the
    requests ended) by the moving-block bootstrap: resamples made of runs of √n
    consecutive values, so that bursts (requests that waited together) stay together;
    seeded, so the same data gives the same interval. None under 30 values."""
    n = len(xs)
    if n < 30:
        return None
    block = max(5, round(math.sqrt(n)))
    rng = random.Random(0)
    stats = []
    for _ in range(resamples):
        sample: list[float] = []
        while len(sample) < n:
            start = rng.randrange(0, n - block + 1)
            sample.extend(xs[start:start + block])
        stats.append(percentile(sorted(sample[:n]), q))
    stats.sort()
    return stats[int(0.025 * resamples)], stats[min(resamples - 1, math.ceil(0.975 * resamples) - 1)]


def batches(records: Sequence[RequestRecord], min_batch: int = MIN_BATCH) -> list[list[RequestRecord]]:
    """The completed requests in the order they ended, cut into up to ``MAX_BATCHES``
    batches of at least ``min_batch``: consecutive requests share the server's state
    (a batch, a queue), so they are not independent, but batches far enough apart
    nearly are (the method of batch means). Empty with fewer than 3 batches."""
    done = sorted((r for r in records if r.ok and not r.warmup), key=lambda r: r.end_ns or 0)
    k = min(MAX_BATCHES, len(done) // min_batch)
    return [done[j * len(done) // k:(j + 1) * len(done) // k] for j in range(k)] if k >= 3 else []


def batch_half_width(records: Sequence[RequestRecord], name: str, stat: str) -> float | None:
    """The 95 % half-width of a per-request statistic (``mean`` or ``pNN``) by batch
    means: the statistic of each batch, ± t·s/√k; None with fewer than 3 batches."""
    # a batch must be large enough for its own percentile to mean the same thing as the
    # run's: ten requests beyond it (p50: 20 a batch, p99: 1,000)
    q = None if stat == "mean" else float(stat[1:]) / 100
    min_batch = MIN_BATCH if q is None else max(MIN_BATCH, math.ceil(10 / min(q, 1 - q)))
    values = []
    for batch in batches(records, min_batch):
        xs = sorted(v for r in batch if (v := getattr(request_metrics(r), name)) is not None)
        if xs:
            values.append(statistics.fmean(xs) if stat == "mean" else percentile(xs, float(stat[1:])))
    if len(values) < 3:
        return None
    return t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def quantile_interval(sorted_xs: Sequence[float], q: float) -> tuple[float | None, float | None]:
    """The distribution-free 95 % interval of the ``q`` quantile (0 < q < 1) of
    ``sorted_xs``: the values at ranks n·q ∓ 1.96·√(n·q·(1−q)) (1-based); None on a
    side whose rank falls outside the data (too few values to bound it)."""
    n = len(sorted_xs)
    if n == 0:
        return None, None
    spread = Z95 * math.sqrt(n * q * (1 - q))
    lo_rank = math.floor(n * q - spread)
    hi_rank = math.ceil(n * q + spread) + 1
    lo = sorted_xs[lo_rank - 1] if lo_rank >= 1 else None
    hi = sorted_xs[hi_rank - 1] if hi_rank <= n else None
    return lo, hi


def batch_rel_half_width(records: Sequence[RequestRecord], *, tokens: bool) -> float | None:
    """The 95 % half-width of a run's throughput relative to it, by batch means over
    ``batches``: each batch's tokens (``tokens``) or requests over the time since the
    previous batch ended; None with fewer than 3 batches."""
    parts = batches(records)
    if not parts:
        return None
    k = len(parts)
    start = min(r.send_ns or 0 for b in parts for r in b)
    rates, prev_end = [], start
    for j in range(k):
        batch = parts[j]
        end = batch[-1].end_ns or prev_end
        span_s = (end - prev_end) / 1e9
        amount = sum((r.output_tokens or 0) for r in batch) if tokens else len(batch)
        if span_s <= 0:
            return None
        rates.append(amount / span_s)
        prev_end = end
    mean = statistics.fmean(rates)
    if mean <= 0:
        return None
    return t95(k - 1) * statistics.stdev(rates) / math.sqrt(k) / mean


def compare_pair(m: Metric, a: Estimate, b: Estimate) -> Delta:
    if a.value is None or b.value is None:
        return Delta(m, a, b, None, None, None, None, "no value")
    d = b.value - a.value
    rel = d / a.value if a.value else None
    if None in (a.lo, a.hi, b.lo, b.hi):
        return Delta(m, a, b, d, rel, None, None, "noise unknown")
    assert a.lo is not None and a.hi is not None and b.lo is not None and b.hi is not None
    lo = d - math.hypot(b.value - b.lo, a.hi - a.value)
    hi = d + math.hypot(b.hi - b.value, a.value - a.lo)
    verdict = "beyond noise" if lo > 0 or hi < 0 else "within noise"
    return Delta(m, a, b, d, rel, lo, hi, verdict)


def compare(a: Sequence[Run], b: Sequence[Run], metrics: Sequence[Metric] = METRICS) -> list[Delta]:
    """Each metric of ``b`` against ``a`` (each one run, or repeats of one configuration)."""
    return [compare_pair(m, estimate(m, a), estimate(m, b)) for m in metrics]


def mann_whitney_p(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Two-sided p-value of Mann–Whitney's U test (normal approximation with the tie
    correction, continuity corrected); None with fewer than 5 values on a side."""
    n1, n2 = len(xs), len(ys)
    if n1 < 5 or n2 < 5:
        return None
    pooled = sorted([(x, 0) for x in xs] + [(y, 1) for y in ys])
    rank_sum_x, ties, i = 0.0, 0.0, 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        rank = (i + j) / 2 + 1
        t = j - i + 1
        ties += t**3 - t
        rank_sum_x += rank * sum(1 for k in range(i, j + 1) if pooled[k][1] == 0)
        i = j + 1
    u = rank_sum_x - n1 * (n1 + 1) / 2
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(var)
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


def distribution_tests(a: Sequence[Run], b: Sequence[Run]) -> dict[str, float | None]:
    """Mann–Whitney p per distribution in ``DISTRIBUTIONS`` (requests of all repeats pooled)."""
    return {
        name: mann_whitney_p([v for r in a for v in per_request(r.records, name)],
                             [v for r in b for v in per_request(r.records, name)])
        for name in DISTRIBUTIONS
    }


@dataclass(frozen=True)
class FailIf:
    """``--fail-if 'ttft_p99>+10%'``: trips when the change of ``metric`` passes
    ``limit`` (relative when ``percent``) in the direction of ``op``, and is not within
    noise."""

    text: str
    metric: Metric
    op: str
    limit: float
    percent: bool

    def trips(self, d: Delta) -> bool:
        """The change passes the limit beyond noise, or a run has no value to compare
        (it completed nothing that measures the metric): a gate fails closed."""
        if d.verdict == "no value":
            return True
        if d.verdict == "within noise":
            return False
        change = (None if d.rel is None else d.rel * 100) if self.percent else d.delta
        if change is None:
            return False
        return change > self.limit if self.op == ">" else change < self.limit


_FAIL_IF = re.compile(r"\s*([a-z0-9_]+)\s*([<>])\s*([-+]?\d+(?:\.\d+)?)\s*(%?)\s*")


def parse_fail_if(text: str) -> FailIf:
    """``METRIC>LIMIT`` or ``METRIC<LIMIT``, LIMIT a signed number, ``%`` for a relative
    change (``ttft_p99>+10%``, ``output_tok_s<-5%``, ``tpot_p50>+2``, in the metric's
    unit); ``UsageError`` otherwise."""
    match = _FAIL_IF.fullmatch(text)
    names = ", ".join(BY_NAME)
    if match is None:
        raise UsageError(f"--fail-if {text!r}: expected METRIC>LIMIT or METRIC<LIMIT, e.g. 'ttft_p99>+10%' (metrics: {names})")
    name, op, limit, pct = match.groups()
    name = name.removesuffix("_ms")
    if name not in BY_NAME:
        raise UsageError(f"--fail-if {text!r}: unknown metric {name!r} (metrics: {names})")
    if pct and BY_NAME[name].unit == "%":  # (a share's change relative to 0 % is no number: such a gate never trips)
        raise UsageError(f"--fail-if {text!r}: {name} is a share in %: give its change in points ({name}{op}{limit})")
    return FailIf(text.strip(), BY_NAME[name], op, float(limit), pct == "%")


def verdict_words(d: Delta) -> str:
    """A short sentence for a table cell: "within noise", "worse, beyond noise", ..."""
    if d.verdict != "beyond noise":
        return d.verdict
    return f"{'better' if d.better else 'worse'}, beyond noise"

