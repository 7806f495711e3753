"""Comparing runs: each headline metric, its change, and whether that change exceeds
run-to-run noise.

Every value comes with a 95 % interval, from what the runs hold:

- **repeats** (several runs of one configuration, a sweep point run ``--repeats N``):
  the mean over the repeats ± t·s/√n (Student's t, n − 1 degrees of freedom);
- **one run**: *batches*. Requests that overlap in time share the server's state (a
  batch, a queue), so neighbours are not independent and per-request statistics are
  far too sure of themselves (seeds alone then differ "significantly"). The completed
  requests, in the order they ended, are cut into 3 to 5 batches, each at least 10
  and, where the run is long enough, at least twice as many requests as it had in
  flight on average (its concurrency, by Little's law): batches that far apart are
  nearly independent. A mean or a throughput (a batch's tokens over the time since the
  previous batch ended) is computed per batch, ± t·s/√k over the k batches; a mean's
  interval is widened to ± t·s/√n over the requests where wider. A percentile gets the grouped jackknife over
  the batches (the percentile of the run without each batch in turn: a burst moves it
  once, as a whole), ± t·SE, widened to the distribution-free interval of a quantile
  from order statistics (ranks n·q ∓ 1.96·√(n·q·(1−q))). A side of a percentile with
  fewer than 20 requests beyond it (p99 of under 2,000 requests) is unbounded, so no
  change there is beyond noise: the few requests there come in bursts, and at 1,000
  requests seeds alone moved a p99 further than its interval said (docs/report.md).
  Without 3 batches (under 30 requests) a mean's or throughput's noise is unknown.

The change B − A gets the interval of both errors combined (in quadrature, each side
its own); it *exceeds noise* when that interval excludes zero. Mann–Whitney's U test on
the batches' medians of the per-request TTFT, TPOT and E2E (exact for small samples)
tells whether the typical request moved; on the requests themselves it called seeds
alone a moved distribution in most pairs.
"""

from __future__ import annotations

import math
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
MAX_BATCHES = 5
MIN_BATCH = 10
#: a batch holds at least this many times the requests a run had in flight on average
BATCH_IN_FLIGHT = 2
#: requests beyond a percentile (on one side) that bound it on that side
TAIL_MIN = 20


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
    """A metric's value with its 95 % interval (``lo``/``hi`` None: noise unknown; -inf
    or inf: a side the data cannot bound). ``batches``: how many batches of one run the
    interval rests on (0: not batches), and ``full``: the requests that would make
    ``MAX_BATCHES`` of them (``short_run``), where it rests on fewer."""

    value: float | None
    lo: float | None
    hi: float | None
    method: str
    batches: int = 0
    full: int | None = None


@dataclass(frozen=True)
class Delta:
    """B against A for one metric. ``verdict``: "beyond noise", "within noise", "noise
    unknown" or "no value" (a run has none: nothing completed); ``better`` whether B is better (None when equal or unknown);
    ``lo``/``hi`` the change's 95 % interval, -inf or inf on a side a run cannot bound
    (None in ``to_json``)."""

    metric: Metric
    a: Estimate
    b: Estimate
    delta: float | None
    rel: float | None  # delta / a
    lo: float | None
    hi: float | None
    verdict: str
    # within noise only for a run too short for MAX_BATCHES batches: (its fewest batches,
    # the requests that make MAX_BATCHES of them); None otherwise (``short_run``)
    short: tuple[int, int] | None = None

    @property
    def unbounded(self) -> bool:
        """The change's interval is unbounded on a side (a run has too few requests
        beyond a percentile: ``TAIL_MIN``), so it is within noise whatever it is."""
        return any(v is not None and math.isinf(v) for v in (self.lo, self.hi))

    @property
    def better(self) -> bool | None:
        if self.delta is None or self.delta == 0:
            return None
        return (self.delta > 0) == self.metric.higher_is_better

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric.name, "unit": self.metric.unit, "a": self.a.value, "b": self.b.value,
            "delta": self.delta, "rel": self.rel, "delta_ci95": [finite(self.lo), finite(self.hi)], "verdict": self.verdict,
            "better": self.better, "method": self.b.method if self.b.method == self.a.method else f"{self.a.method} / {self.b.method}",
            "short_run": None if self.short is None else {"batches": self.short[0], "requests_for_full": self.short[1]},
        }


def finite(v: float | None) -> float | None:
    """``v``, or None where it is none or not finite (a side of an interval the data
    cannot bound: JSON has no infinity)."""
    return v if v is not None and math.isfinite(v) else None


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
    k, full = batch_plan(run.records)
    if m.per_request is None:
        rel = batch_rel_half_width(run.records, tokens=m.name == "output_tok_s")
        if rel is None:
            return Estimate(value, None, None, "batch means (too few requests)")
        return Estimate(value, value * (1 - rel), value * (1 + rel), "batch means", k, full)
    xs = sorted(per_request(run.records, m.per_request))
    parts = batch_values(run.records, m.per_request)
    if m.stat == "mean":
        if len(parts) < 3:  # (batches holding no value of it left out) per-request spread alone
            return Estimate(value, None, None, "batch means (too few requests)")  # is too sure: noise unknown
        means = [statistics.fmean(p) for p in parts]
        half = t95(len(means) - 1) * statistics.stdev(means) / math.sqrt(len(means))
        if len(xs) > 1:
            half = max(half, t95(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs)))
        return Estimate(value, value - half, value + half, "batch means", len(parts), full)
    if not xs:
        return Estimate(value, None, None, "")
    q = float((m.stat or "p50")[1:]) / 100
    lo, hi = quantile_interval(xs, q)
    # a side the data cannot bound (p99 of 200 requests: its upper rank is past the last)
    # is unbounded: such a change is never beyond noise on that side
    lo_f = -math.inf if lo is None else lo
    hi_f = math.inf if hi is None else hi
    if len(parts) >= 3:  # the wider of the two on each side
        half = t95(len(parts) - 1) * jackknife_se(parts, 100 * q)
        lo_f, hi_f = min(lo_f, value - half), max(hi_f, value + half)
    # the few requests beyond a tail percentile come in bursts: with fewer than TAIL_MIN
    # of them its interval is not to be trusted on that side
    if len(xs) * (1 - q) < TAIL_MIN:
        hi_f = math.inf
    if len(xs) * q < TAIL_MIN:
        lo_f = -math.inf
    return Estimate(value, lo_f, hi_f, "order statistics, jackknife over batches", len(parts) if len(parts) >= 3 else 0, full)


def in_flight(done: Sequence[RequestRecord]) -> float:
    """The average number of requests in flight over ``done`` (sent and ended): their
    summed durations over the time from the first send to the last end (Little's law);
    0 when there is no such time."""
    timed = [r for r in done if r.send_ns is not None and r.end_ns is not None]
    if not timed:
        return 0.0
    span = max(r.end_ns or 0 for r in timed) - min(r.send_ns or 0 for r in timed)
    return sum((r.end_ns or 0) - (r.send_ns or 0) for r in timed) / span if span > 0 else 0.0


def _completed(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The measured requests that completed, in the order they ended."""
    return sorted((r for r in records if r.ok and not r.warmup), key=lambda r: r.end_ns or 0)


def batch_plan(records: Sequence[RequestRecord]) -> tuple[int, int]:
    """(how many batches ``batches`` cuts, the completed requests that would make
    ``MAX_BATCHES``): batches of at least ``MIN_BATCH`` and ``BATCH_IN_FLIGHT`` times
    the requests in flight on average; (0, …) under 3 · ``MIN_BATCH`` requests."""
    done = _completed(records)
    size = max(MIN_BATCH, math.ceil(BATCH_IN_FLIGHT * in_flight(done)))
    k = 0 if len(done) < 3 * MIN_BATCH else max(3, min(MAX_BATCHES, len(done) // size))
    return k, MAX_BATCHES * size


def batches(records: Sequence[RequestRecord]) -> list[list[RequestRecord]]:
    """The completed requests in the order they ended, cut into 3 to ``MAX_BATCHES``
    batches of at least ``MIN_BATCH``, and of at least ``BATCH_IN_FLIGHT`` times the
    requests in flight on average where the run is long enough (``batch_plan``):
    requests overlapping in time share the server's state (a batch, a queue), so they
    are not independent, but batches far enough apart nearly are (the method of batch
    means). Empty under 3 · ``MIN_BATCH`` requests."""
    done = _completed(records)
    k, _ = batch_plan(records)
    return [done[j * len(done) // k:(j + 1) * len(done) // k] for j in range(k)]


def batch_values(records: Sequence[RequestRecord], name: str) -> list[list[float]]:
    """``name``'s per-request values in each of ``batches(records)`` (None left out),
    the batches that hold none dropped."""
    parts = ([v for r in batch if (v := getattr(request_metrics(r), name)) is not None] for batch in batches(records))
    return [p for p in parts if p]


def jackknife_se(parts: Sequence[Sequence[float]], q: float) -> float:
    """The grouped jackknife's standard error of the ``q``-th percentile (0–100) of all
    of ``parts`` (k ≥ 2 batches): the percentile without each batch in turn, θ₋ⱼ, and
    √((k−1)/k · Σ(θ₋ⱼ − θ̄)²). A batch holding a burst moves it as a whole."""
    k = len(parts)
    without = [percentile(sorted(v for i, p in enumerate(parts) if i != j for v in p), q) for j in range(k)]
    mean = statistics.fmean(without)
    return math.sqrt((k - 1) / k * sum((t - mean) ** 2 for t in without))


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
    short = short_run(a, b, d) if verdict == "within noise" else None
    return Delta(m, a, b, d, rel, lo, hi, verdict, short)


def _full_scale(k: int) -> float:
    """How much narrower a batch interval of ``k`` batches would be over ``MAX_BATCHES``
    batches of the same spread: t·s/√k → t′·s/√MAX_BATCHES (1.0 at MAX_BATCHES or not
    batches)."""
    if not 3 <= k < MAX_BATCHES:
        return 1.0
    return (t95(MAX_BATCHES - 1) / math.sqrt(MAX_BATCHES)) / (t95(k - 1) / math.sqrt(k))


def short_run(a: Estimate, b: Estimate, d: float) -> tuple[int, int] | None:
    """Whether a change within noise is so only because a run made fewer than
    ``MAX_BATCHES`` batches (too short for more of the size its load needs: a closed
    loop's few waves, say): the change's interval with each such run's half-widths as
    ``MAX_BATCHES`` batches of the same spread would give excludes zero. (its fewest
    batches, the requests that make ``MAX_BATCHES``), else None. An unbounded side (a
    percentile without ``TAIL_MIN`` requests beyond it) is another cause: None."""
    assert a.value is not None and b.value is not None and None not in (a.lo, a.hi, b.lo, b.hi)
    short = [e for e in (a, b) if 3 <= e.batches < MAX_BATCHES and e.full is not None]
    if not short or any(math.isinf(v) for v in (a.lo, a.hi, b.lo, b.hi) if v is not None):
        return None
    fa, fb = _full_scale(a.batches), _full_scale(b.batches)
    lo = d - math.hypot(fb * (b.value - (b.lo or 0.0)), fa * ((a.hi or 0.0) - a.value))
    hi = d + math.hypot(fb * ((b.hi or 0.0) - b.value), fa * (a.value - (a.lo or 0.0)))
    if not (lo > 0 or hi < 0):
        return None
    return min(e.batches for e in short), max(e.full or 0 for e in short)


def compare(a: Sequence[Run], b: Sequence[Run], metrics: Sequence[Metric] = METRICS) -> list[Delta]:
    """Each metric of ``b`` against ``a`` (each one run, or repeats of one configuration)."""
    return [compare_pair(m, estimate(m, a), estimate(m, b)) for m in metrics]


#: Mann–Whitney's p is exact (counted over every ordering) up to this n1 · n2, and from
#: the normal approximation above it.
EXACT_U_MAX = 400


def mann_whitney_p(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Two-sided p-value of Mann–Whitney's U test: exact for small samples without ties
    (n1 · n2 up to ``EXACT_U_MAX``: 5 batches against 5 give p ≥ 0.008, 3 against 3 never
    under 0.1), else the normal approximation with the tie correction, continuity
    corrected; None with fewer than 3 values on a side."""
    n1, n2 = len(xs), len(ys)
    if n1 < 3 or n2 < 3:
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
    if ties == 0 and n1 * n2 <= EXACT_U_MAX:
        counts = u_counts(n1, n2)
        dev = abs(u - n1 * n2 / 2)
        extreme = sum(c for v, c in enumerate(counts) if abs(v - n1 * n2 / 2) >= dev)
        return min(1.0, extreme / math.comb(n1 + n2, n1))
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(var)
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


def u_counts(n1: int, n2: int) -> list[int]:
    """How many of the C(n1 + n2, n1) orderings of two samples give each U, 0 to n1 · n2
    (the recurrence c(i, j) = c(i − 1, j) shifted by j + c(i, j − 1))."""
    # row[j]: the counts for i values of the first sample against j of the second
    row = [[1] for _ in range(n2 + 1)]  # i = 0: U is 0
    for _ in range(n1):
        new = [[1]]  # j = 0: U is 0
        for j in range(1, n2 + 1):
            shifted, left = [0] * j + row[j], new[j - 1]
            new.append([(shifted[u] if u < len(shifted) else 0) + (left[u] if u < len(left) else 0)
                        for u in range(max(len(shifted), len(left)))])
        row = new
    return row[n2]


def batch_medians(runs: Sequence[Run], name: str) -> list[float]:
    """The median of ``name`` in each batch (``batches``) of each of ``runs``."""
    return [statistics.median(p) for r in runs for p in batch_values(r.records, name)]


def distribution_tests(a: Sequence[Run], b: Sequence[Run]) -> dict[str, float | None]:
    """Mann–Whitney p per distribution in ``DISTRIBUTIONS``, over the batches' medians
    (``batch_medians``, the batches of all repeats pooled): the requests themselves are
    not independent, and a test over them called seeds alone a moved distribution."""
    return {name: mann_whitney_p(batch_medians(a, name), batch_medians(b, name)) for name in DISTRIBUTIONS}


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
    """A short sentence for a table cell: "within noise", "worse, beyond noise", "within
    noise (too few requests)" (a run cannot bound the percentile: ``TAIL_MIN``), ..."""
    if d.verdict == "within noise" and d.unbounded:
        return "within noise (too few requests)"
    if d.verdict == "within noise" and d.short is not None:
        return f"within noise (only {d.short[0]} batches: run {d.short[1]:,}+ requests)"
    if d.verdict != "beyond noise":
        return d.verdict
    return f"{'better' if d.better else 'worse'}, beyond noise"

