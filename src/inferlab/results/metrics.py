"""Metrics: pure functions of ``RequestRecord``s (definitions in docs/design.md).

Nothing here reads a clock or does I/O; the same records always give the same summary.
Times in records are ns; the summary reports milliseconds (``*_ms``), tokens/s and TPM.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import mul, sub, truediv
from typing import Any

from inferlab.results.records import ErrorKind, RequestRecord

NS_PER_MS = 1e6
NS_PER_S = 1e9
DISTRIBUTION_KEYS = ("mean", "std", "min", "p50", "p90", "p95", "p99", "max")


@dataclass(frozen=True)
class SLO:
    """Service-level objectives for goodput; ``None`` means "no limit"."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def met_by(self, m: RequestMetrics) -> bool:
        """Whether ``m`` is within every limit; a request of one output token meets any
        TPOT limit (it has no time between tokens: vLLM's ``--goodput`` counts TPOT 0)."""
        tpot = 0.0 if m.tpot_ms is None and m.output_tokens == 1 else m.tpot_ms
        checks = ((self.ttft_ms, m.ttft_ms), (self.tpot_ms, tpot), (self.e2e_ms, m.e2e_ms))
        return all(limit is None or (v is not None and v <= limit) for limit, v in checks)


@dataclass(frozen=True)
class RequestMetrics:
    """Derived per-request metrics, in ms (``None``: not defined for this request).

    ``content_ns`` is the record's own list (not a copy: ITL has a value per token), so
    ``itl_ms`` follows the record if the record changes."""

    ttfb_ms: float | None
    ttft_ms: float | None
    e2e_ms: float | None
    tpot_ms: float | None
    decode_tps: float | None
    queue_delay_ms: float | None
    content_ns: Sequence[int] = field(repr=False)
    output_tokens: int | None

    @property
    def itl_ms(self) -> list[float]:
        """Gaps between consecutive content chunks."""
        return list(map(truediv, itl_ns(self.content_ns), repeat(NS_PER_MS)))


def output_token_count(r: RequestRecord) -> int | None:
    """The server's count when it sent usage, else the number of content chunks."""
    if r.output_tokens is not None:
        return r.output_tokens
    return len(r.content_ns) if r.content_ns else None


def request_metrics(r: RequestRecord) -> RequestMetrics:
    send = r.send_ns

    def since_send(t: int | None) -> float | None:
        return None if t is None or send is None else (t - send) / NS_PER_MS

    ttft = since_send(r.content_ns[0]) if r.content_ns else None
    e2e = since_send(r.end_ns)
    n_out = output_token_count(r)
    tpot = decode_tps = None
    if ttft is not None and e2e is not None and n_out is not None and n_out > 1:
        decode_ms = e2e - ttft
        tpot = decode_ms / (n_out - 1)
        decode_tps = (n_out - 1) / (decode_ms / 1e3) if decode_ms > 0 else None
    return RequestMetrics(since_send(r.ttfb_ns), ttft, e2e, tpot, decode_tps, queue_delay_ms(r), r.content_ns, n_out)


def itl_ns(content_ns: Sequence[int]) -> Iterator[int]:
    """The gaps between consecutive content chunks, in ns (lazily, in C)."""
    return map(sub, itertools.islice(content_ns, 1, None), content_ns)


def queue_delay_ms(r: RequestRecord) -> float | None:
    """How late the client started the request against its intended send time: its own
    lag (or a concurrency cap's wait), never the server's (the wait for a connection is
    after ``send_ns``: ``connect_wait_ms``)."""
    if r.intended_send_ns is None or r.send_ns is None:
        return None
    return max(0.0, (r.send_ns - r.intended_send_ns) / NS_PER_MS)


def connect_wait_ms(r: RequestRecord) -> float | None:
    """How long the request waited for new connections to the server (in its TTFT and
    E2E, not in its queue delay); None where not measured."""
    return None if r.connect_wait_ns is None else r.connect_wait_ns / NS_PER_MS


def left_ns(r: RequestRecord, config: Mapping[str, Any]) -> int | None:
    """When a sent request left flight, as far as its run can tell: its last byte; for
    a failed one, which records no end, when the client gave up where the run's timeouts
    (``config``, the run's config.json) say (the whole request's: send + ``timeout_s``;
    the idle one: its last byte + ``idle_timeout_s``), else the last thing recorded of
    it (its last token, first byte or send: an error answer's own bytes are not timed)."""
    if r.end_ns is not None or r.send_ns is None:
        return r.end_ns
    last = max(r.send_ns, r.ttfb_ns or 0, *r.content_ns[-1:])
    limit = {ErrorKind.TIMEOUT: "timeout_s", ErrorKind.IDLE_TIMEOUT: "idle_timeout_s"}.get(r.error_kind or ErrorKind.CANCELLED)
    seconds = config.get(limit) if limit else None
    if not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return last
    return r.send_ns + round(seconds * 1e9) if r.error_kind == ErrorKind.TIMEOUT else last + round(seconds * 1e9)


#: The percentiles every distribution has, as its fields ``p50`` ... ``p99``.
FIXED_PERCENTILES = (50.0, 90.0, 95.0, 99.0)


def peak_overlap(spans: Iterable[tuple[int, int]]) -> int:
    """The most of ``spans`` (start, end) open at one instant; an end comes before a
    start at the same instant (a request sent as another ends does not overlap it)."""
    events = sorted((t, step) for start, end in spans for t, step in ((start, 1), (end, -1)))
    return max(itertools.accumulate(step for _, step in events), default=0)


def percentile_key(q: float) -> str:
    """A percentile's key in a distribution's JSON: ``p`` and the number as written,
    its decimal point as ``_`` (99 → ``p99``, 99.9 → ``p99_9``, 0.5 → ``p0_5``), so the
    key is a plain identifier that jq, pandas and spreadsheets take as it is (vLLM's
    ``p99.9_ttft_ms`` needs quoting in jq and splits in ``json_normalize``).
    ``ValueError`` outside 0–100."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"a percentile is between 0 and 100 (got {q:g})")
    text = f"{q:.6f}".rstrip("0").rstrip(".")
    return "p" + text.replace(".", "_")


_PERCENTILE_KEY = re.compile(r"p(\d+)(?:_(\d+))?")


def key_percentile(key: str) -> float | None:
    """The percentile a distribution key names (``p99_9`` → 99.9), or ``None`` for any
    other key."""
    m = _PERCENTILE_KEY.fullmatch(key)
    if m is None:
        return None
    return float(m.group(1) + ("." + m.group(2) if m.group(2) else ""))


@dataclass(frozen=True, slots=True)
class Distribution:
    """A distribution's summary: mean, std (population), min, p50/p90/p95/p99 (linear
    interpolation between ranks, numpy's default), max; in the unit of its values.

    ``extra`` holds the percentiles asked for beyond the fixed four
    (``--metric-percentiles``) as ``(q, value)`` in ascending ``q``; in JSON each is one
    more key after ``max`` (``percentile_key``: ``p99_9``), so readers of the fixed keys
    see no change."""

    mean: float
    std: float
    min: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float
    extra: tuple[tuple[float, float], ...] = ()

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile, fixed or extra; ``KeyError`` if it was not computed."""
        if q in FIXED_PERCENTILES:
            return float(getattr(self, percentile_key(q)))
        for p, v in self.extra:
            if p == q:
                return v
        raise KeyError(percentile_key(q))

    def to_json(self) -> dict[str, float]:
        out = {k: getattr(self, k) for k in DISTRIBUTION_KEYS}
        out.update((percentile_key(q), v) for q, v in self.extra)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, float]) -> Distribution:
        """Read back from ``to_json``'s form; keys other than the fixed ones and
        percentile keys are ignored."""
        extra = sorted(
            (q, float(v)) for k, v in d.items()
            if k not in DISTRIBUTION_KEYS and (q := key_percentile(k)) is not None
        )
        mean, std, lo, p50, p90, p95, p99, hi = (float(d[k]) for k in DISTRIBUTION_KEYS)
        if any(math.isnan(v) for v in (mean, std, lo, p50, p90, p95, p99, hi, *(v for _, v in extra))):
            raise ValueError(f"a distribution holds NaN ({dict(d)}): not one a run wrote (it writes null for none)")
        return cls(mean, std, lo, p50, p90, p95, p99, hi, tuple(extra))


def extra_percentiles(percentiles: Iterable[float]) -> tuple[float, ...]:
    """The percentiles of ``percentiles`` beyond the fixed four, once each, ascending;
    ``ValueError`` for one outside 0–100."""
    qs = {float(q) for q in percentiles}
    for q in qs:
        percentile_key(q)  # (checks the range)
    return tuple(sorted(qs - set(FIXED_PERCENTILES)))


def distribution(values: Iterable[float], percentiles: Sequence[float] = ()) -> Distribution | None:
    """mean, std (population), min, p50/p90/p95/p99 (linear interpolation), max, and
    ``percentiles`` beyond those (``extra_percentiles``) as ``extra``."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return None
    mean = math.fsum(xs) / n
    # (in C, no intermediate list)
    std = math.sqrt(math.fsum(map(mul, map(sub, xs, repeat(mean)), map(sub, xs, repeat(mean)))) / n)
    return _shape(mean, std, xs.__getitem__, n, percentiles)


def counted_distribution(counts: Mapping[float, int], percentiles: Sequence[float] = ()) -> Distribution | None:
    """``distribution`` of the values ``counts`` holds with their multiplicities (finite
    values, positive counts; -0.0 counts as 0.0), exactly the same numbers without
    listing every value: for ITL, millions of values that take a few thousand distinct
    ones (step durations)."""
    xs = sorted(counts)
    if not xs:
        return None
    ns = [counts[x] for x in xs]
    n = sum(ns)
    ends = list(itertools.accumulate(ns))  # ends[i]: how many values are <= xs[i]

    def at(rank: int) -> float:
        return xs[bisect.bisect_right(ends, rank)]

    mean = _repeated_fsum(xs, ns) / n
    std = math.sqrt(_repeated_fsum([(x - mean) * (x - mean) for x in xs], ns) / n)
    return _shape(mean, std, at, n, percentiles)


def _shape(mean: float, std: float, at: Callable[[int], float], n: int, percentiles: Sequence[float] = ()) -> Distribution:
    """A distribution's summary from its moments and ``at(i)``, the i-th of its ``n``
    sorted values; ``percentiles`` beyond the fixed ones as ``extra``."""
    p50, p90, p95, p99 = (interpolate(at, n, q) for q in FIXED_PERCENTILES)
    extra = tuple((q, interpolate(at, n, q)) for q in extra_percentiles(percentiles))
    return Distribution(mean, std, at(0), p50, p90, p95, p99, at(n - 1), extra)


def _repeated_fsum(xs: Sequence[float], ns: Sequence[int]) -> float:
    """``math.fsum`` of each ``xs[i]`` repeated ``ns[i]`` times (finite values).

    fsum returns the exact sum rounded once to the nearest float; so does this: the
    floats are dyadic rationals, summed exactly over a common power-of-two denominator,
    and ``int / int`` rounds correctly."""
    num, den = 0, 1
    for x, k in zip(xs, ns, strict=True):
        p, q = x.as_integer_ratio()  # q is a power of two
        if q > den:
            num *= q // den
            den = q
        num += k * p * (den // q)
    return num / den


def percentile(sorted_xs: Sequence[float], q: float) -> float:
    """The q-th percentile of sorted data, interpolating linearly (numpy's default)."""
    if not sorted_xs:
        raise ValueError("percentile of no data")
    return interpolate(sorted_xs.__getitem__, len(sorted_xs), q)


def interpolate(at: Callable[[int], float], n: int, q: float) -> float:
    """The q-th percentile of ``n`` sorted values, ``at(i)`` the i-th (from 0),
    interpolating linearly like ``percentile``: for values held other than as a list."""
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return at(lo) + (at(hi) - at(lo)) * frac


def itl_ms_counts(records: Iterable[RequestRecord]) -> Counter[float]:
    """Every ITL value of ``records`` (ms), counted: the gaps are integer ns, counted in
    C, then each distinct gap is converted once (the same floats as gap / 1e6)."""
    gaps = Counter(itertools.chain.from_iterable(map(itl_ns, (r.content_ns for r in records))))
    out: Counter[float] = Counter()
    for gap_ns, k in gaps.items():
        out[gap_ns / NS_PER_MS] += k
    return out
