"""Metrics: pure functions of ``RequestRecord``s (definitions in docs/design.md).

Nothing here reads a clock or does I/O; the same records always give the same summary.
Times in records are ns; the summary reports milliseconds (``*_ms``), tokens/s and TPM.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import mul, sub, truediv
from typing import Any

from inferlab.results.records import ErrorKind, RequestRecord

SCHEMA = "inferlab.summary/1"
NS_PER_MS = 1e6
NS_PER_S = 1e9
DISTRIBUTION_KEYS = ("mean", "std", "min", "p50", "p90", "p95", "p99", "max")
#: A request whose actual send lagged its intended time by more than this is "late".
LATE_THRESHOLD_MS = 10.0
#: An open-loop run whose completion rate is below this share of the offered rate, while
#: latency grew, was more than the server could take.
KEEP_UP_RATIO = 0.8
#: ... and "latency grew" means the last tenth's mean is at least this many times the first's.
LATENCY_GROWTH = 2.0


@dataclass(frozen=True)
class SLO:
    """Service-level objectives for goodput; ``None`` means "no limit"."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def met_by(self, m: RequestMetrics) -> bool:
        checks = ((self.ttft_ms, m.ttft_ms), (self.tpot_ms, m.tpot_ms), (self.e2e_ms, m.e2e_ms))
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
    """How late the request left the client against its intended send time."""
    if r.intended_send_ns is None or r.send_ns is None:
        return None
    return max(0.0, (r.send_ns - r.intended_send_ns) / NS_PER_MS)


def distribution(values: Iterable[float]) -> dict[str, float] | None:
    """mean, std (population), min, p50/p90/p95/p99 (linear interpolation), max."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return None
    mean = math.fsum(xs) / n
    # (in C, no intermediate list)
    std = math.sqrt(math.fsum(map(mul, map(sub, xs, repeat(mean)), map(sub, xs, repeat(mean)))) / n)
    return _shape(mean, std, xs.__getitem__, n)


def counted_distribution(counts: Mapping[float, int]) -> dict[str, float] | None:
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
    return _shape(mean, std, at, n)


def _shape(mean: float, std: float, at: Callable[[int], float], n: int) -> dict[str, float]:
    """A distribution's summary from its moments and ``at(i)``, the i-th of its ``n``
    sorted values."""
    out = {"mean": mean, "std": std, "min": at(0)}
    for q in (50, 90, 95, 99):
        out[f"p{q}"] = interpolate(at, n, q)
    out["max"] = at(n - 1)
    return out


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


def _present(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def summarize(
    records: Sequence[RequestRecord],
    *,
    config: dict[str, Any] | None = None,
    slo: SLO | None = None,
    interrupted: bool = False,
) -> dict[str, Any]:
    """The run summary (DESIGN.md's results contract). Warm-up records are excluded."""
    measured = [r for r in records if not r.warmup]
    done = [r for r in measured if r.ok]
    cancelled = [r for r in measured if r.error_kind is ErrorKind.CANCELLED]
    failed = [r for r in measured if not r.ok and r.error_kind is not ErrorKind.CANCELLED]
    per = [request_metrics(r) for r in done]

    sends = [r.send_ns for r in measured if r.send_ns is not None]
    ends = [r.end_ns for r in done if r.end_ns is not None]
    duration_s = (max(ends) - min(sends)) / NS_PER_S if sends and ends else 0.0

    out_tokens = sum(m.output_tokens or 0 for m in per)
    in_tokens = sum(r.input_tokens or 0 for r in done)

    def rate(x: float) -> float | None:
        return x / duration_s if duration_s > 0 else None

    out_tps = rate(out_tokens)
    total_tps = rate(out_tokens + in_tokens)
    goodput = rate(sum(1 for m in per if slo.met_by(m))) if slo else None

    summary: dict[str, Any] = {
        "schema": SCHEMA,
        "config": config or {},
        "interrupted": interrupted,
        "counts": {
            "total": len(measured),
            "completed": len(done),
            "failed": len(failed),
            "cancelled": len(cancelled),
            "warmup": len(records) - len(measured),
            "errors": dict(Counter(r.error_kind.value for r in failed if r.error_kind)),
        },
        "duration_s": duration_s,
        "request_throughput_rps": rate(len(done)),
        "output_token_throughput_tps": out_tps,
        "total_token_throughput_tps": total_tps,
        "output_tpm": out_tps * 60 if out_tps is not None else None,
        "total_tpm": total_tps * 60 if total_tps is not None else None,
        "goodput_rps": goodput,
        "slo": None if slo is None else {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2e_ms": slo.e2e_ms},
        "input_tokens": in_tokens,
        "output_tokens": out_tokens,
        "token_source": _token_source(done),
        "ttfb_ms": distribution(_present(m.ttfb_ms for m in per)),
        "ttft_ms": distribution(_present(m.ttft_ms for m in per)),
        "e2e_ms": distribution(_present(m.e2e_ms for m in per)),
        "tpot_ms": distribution(_present(m.tpot_ms for m in per)),
        "itl_ms": counted_distribution(itl_ms_counts(done)),
        "decode_tps": distribution(_present(m.decode_tps for m in per)),
        "queue_delay_ms": distribution(
            _present(queue_delay_ms(r) for r in measured)
        ),
        "cached_tokens": sum(r.cached_tokens or 0 for r in done),
        "server_timeline": server_comparison(done, per),
        "error_examples": _error_examples(failed),
    }
    summary["warnings"] = warnings(summary, done, measured)
    return summary


def _token_source(done: Sequence[RequestRecord]) -> str:
    if not done:
        return "none: no request completed"
    if all(r.usage_source == "engine" for r in done):
        return "the engine's own counts"
    with_usage = sum(1 for r in done if r.usage_source == "server")
    if with_usage == len(done):
        return "server usage"
    if with_usage == 0:
        return "content chunks (approximate: no usage from the server)"
    return f"server usage for {with_usage} of {len(done)} requests, content chunks for the rest"


def server_comparison(
    done: Sequence[RequestRecord], metrics: Sequence[RequestMetrics] | None = None
) -> dict[str, Any] | None:
    """Client TTFT against the server's own (from the sim's timeline extension).

    ``ttft_error_ms`` = client TTFT − server TTFT: what the network, the HTTP stacks and
    the client's parsing add. ``None`` when the server sends no timeline.
    """
    server_ttft: list[float] = []
    error: list[float] = []
    queued: list[float] = []
    for i, r in enumerate(done):
        tl = r.server_timeline
        if not tl:
            continue
        m = metrics[i] if metrics is not None else request_metrics(r)
        if m.ttft_ms is None or tl.get("first_token_ms") is None:
            continue
        server_ttft.append(float(tl["first_token_ms"]))
        error.append(m.ttft_ms - float(tl["first_token_ms"]))
        if tl.get("scheduled_ms") is not None:
            queued.append(float(tl["scheduled_ms"]))
    if not server_ttft:
        return None
    return {
        "requests": len(server_ttft),
        "server_ttft_ms": distribution(server_ttft),
        "ttft_error_ms": distribution(error),
        "server_queue_ms": distribution(queued),
    }


def _error_examples(failed: Sequence[RequestRecord]) -> dict[str, str]:
    examples: dict[str, str] = {}
    for r in failed:
        if r.error_kind and r.error_kind.value not in examples:
            examples[r.error_kind.value] = r.error or ""
    return examples


def warnings(
    summary: dict[str, Any], done: Sequence[RequestRecord], measured: Sequence[RequestRecord] = ()
) -> list[str]:
    """Plain-language caveats about how far the numbers can be trusted. ``done``: the
    measured requests that completed; ``measured``: all measured requests (for the
    offered rate)."""
    out: list[str] = []
    overload = overload_warning(summary, done, measured)
    if overload:
        out.append(overload)
    qd = summary.get("queue_delay_ms")
    cap = ((summary.get("config") or {}).get("load") or {}).get("schedule", {}).get("max_concurrency")
    if qd and qd["p99"] > LATE_THRESHOLD_MS:
        if cap:
            out.append(
                f"requests waited for one of the {cap} --max-concurrency slots: p99 queue delay "
                f"{qd['p99']:.1f} ms (max {qd['max']:.1f} ms); the cap set the offered load"
            )
        else:
            out.append(
                f"the client fell behind its schedule: p99 queue delay {qd['p99']:.1f} ms "
                f"(max {qd['max']:.1f} ms); the offered load was lower than asked"
            )
    if summary["counts"]["completed"] and not summary["token_source"].startswith(("server usage", "the engine")):
        out.append(f"token counts: {summary['token_source']}")
    short = [
        r for r in done
        if r.requested_output_tokens is not None
        and r.output_tokens is not None
        and r.output_tokens != r.requested_output_tokens
    ]
    if short:
        out.append(
            f"{len(short)} of {len(done)} requests did not generate exactly the requested "
            "output tokens (the server may ignore ignore_eos/min_tokens)"
        )
    if summary.get("interrupted"):
        out.append("the run was interrupted: the summary covers what completed")
    return out


def overload_warning(
    summary: dict[str, Any], done: Sequence[RequestRecord], measured: Sequence[RequestRecord]
) -> str | None:
    """Open loop: did completions fall behind the offered rate while queues grew?

    Offered rate: (n − 1) / (last intended send − first intended send) over ``measured``
    (the intended times must be spread out); completion rate: the summary's
    ``request_throughput_rps``. A short run understates the latter (its last requests'
    latency counts in the duration), hence the second condition. A warning when completions < ``KEEP_UP_RATIO`` × offered and the mean TTFT (E2E
    if there is no TTFT) of the last tenth of ``done``, by send time, is at least
    ``LATENCY_GROWTH`` times the first tenth's. ``None`` for closed loops and sessions
    (each send follows a completion there, so they cannot outrun the server)."""
    load = (summary.get("config") or {}).get("load") or {}
    if (load.get("schedule") or {}).get("kind") == "ClosedLoop" or any(r.session is not None for r in measured):
        return None
    intended = sorted(r.intended_send_ns for r in measured if r.intended_send_ns is not None)
    completed_rps = summary.get("request_throughput_rps")
    if len(intended) < 2 or intended[-1] <= intended[0] or not completed_rps:
        return None
    offered_rps = (len(intended) - 1) / ((intended[-1] - intended[0]) / NS_PER_S)
    if completed_rps >= KEEP_UP_RATIO * offered_rps:
        return None
    by_send = sorted(done, key=lambda r: (r.intended_send_ns if r.intended_send_ns is not None else r.send_ns or 0))
    per = [request_metrics(r) for r in by_send]
    label, lat = "TTFT", [m.ttft_ms for m in per]
    if any(v is None for v in lat):
        label, lat = "E2E", [m.e2e_ms for m in per]
    values = _present(lat)
    if len(values) < 2:
        return None
    tenth = max(1, len(values) // 10)
    first = math.fsum(values[:tenth]) / tenth
    last = math.fsum(values[-tenth:]) / tenth
    if last < LATENCY_GROWTH * first:
        return None
    return (
        f"the server could not keep up: offered {offered_rps:.1f} req/s, completed "
        f"{completed_rps:.1f} req/s; queues grew through the run ({label} rose from "
        f"{first:,.0f} ms in the first tenth to {last:,.0f} ms in the last)"
    )
