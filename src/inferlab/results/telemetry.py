"""A server's own telemetry: its Prometheus ``/metrics`` page read into one vocabulary,
and what changed over a run.

vLLM, SGLang, llama.cpp's server and the simulated server name the same things
differently (``vllm:num_requests_running``, ``sglang:num_running_reqs``,
``llamacpp:requests_processing``); ``VOCABULARY`` maps each of their names to one of
ours. ``parse_prometheus`` reads the text exposition format (a small reader: names,
labels, values; comments and timestamps skipped), ``snapshot`` maps one page to our
names (a name's label sets summed: several models or engines on one server count
together), and ``server_metrics`` turns the page before a run, the pages sampled during
it and the page after into the summary's ``server_metrics``: counter deltas, gauges'
mean and max, histogram deltas with their mean and the bucket bounds their percentiles fall under.
``emit_lag`` reads the simulated server's own lateness histogram off its page (the bench
scripts' "sim late" columns). Pure: no I/O, no clock.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

#: The run directory's time series of the server's metrics (one JSON object a sample).
SERVER_METRICS_FILE = "server_metrics.jsonl"

#: Counters (cumulative): our name → the servers' names, first present wins.
COUNTERS: dict[str, tuple[str, ...]] = {
    # every prompt token a request brought, cached ones included (llama.cpp's computed
    # and cached counters are added up: ``snapshot``)
    "prompt_tokens": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total", "llamacpp:prompt_tokens_total"),
    "generation_tokens": ("vllm:generation_tokens_total", "sglang:generation_tokens_total", "llamacpp:tokens_predicted_total"),
    "prefix_cache_queries_tokens": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits_tokens": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    # SGLang retracts a running request when its KV cache runs short (0.5's scheduler
    # counts them; earlier releases have no such counter)
    "preemptions": ("vllm:num_preemptions_total", "sglang:num_retracted_requests_total"),
    # SGLang counts every request it finished, as vLLM's counts each finish reason
    "requests_finished": ("vllm:request_success_total", "sglang:num_requests_total"),
    # llama.cpp's own time totals: what its slots spent on prompts and on generating
    "prompt_seconds": ("llamacpp:prompt_seconds_total",),
    "generation_seconds": ("llamacpp:tokens_predicted_seconds_total",),
}
#: Gauges (a value now).
GAUGES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage", "llamacpp:kv_cache_usage_ratio"),
    # SGLang's: the share of its last prefill batch's prompt tokens its radix cache held,
    # not a rate over the run (SGLang 0.5.11 scheduler_metrics_mixin.py)
    "prefix_cache_hit_rate": ("sglang:cache_hit_rate",),
}
#: Histograms in seconds.
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
    "tpot": ("vllm:request_time_per_output_token_seconds",),
    # vLLM before 0.11 called the inter-token latency time_per_output_token; SGLang's
    # time_per_output_token is observed per token too
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds", "sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds"),
    "queue": ("vllm:request_queue_time_seconds", "sglang:queue_time_seconds"),
    "prefill": ("vllm:request_prefill_time_seconds",),
    "decode": ("vllm:request_decode_time_seconds",),
}
#: Every name of ours, with the servers' names for it.
VOCABULARY: dict[str, tuple[str, ...]] = {**COUNTERS, **GAUGES, **HISTOGRAMS}


def server_names(ours: Iterable[str]) -> tuple[str, ...]:
    """The servers' names for these names of ours (``parse_prometheus``'s ``only``;
    a histogram's include its ``_bucket``, ``_sum`` and ``_count`` lines)."""
    return tuple(n for o in ours for n in VOCABULARY[o])

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
#: An escape in a label value: ``\\``, ``\"`` or ``\n`` (the text format's three).
_ESCAPE = re.compile(r"\\(.)")

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_prometheus(text: str, only: tuple[str, ...] = ()) -> Samples:
    """Prometheus text exposition → ``{metric name: [(labels, value), ...]}``. Comments,
    blank lines and lines that are not samples are skipped; values are floats (``NaN``,
    ``+Inf`` included). A counter the page declares (``# TYPE``) with no sample yet, as one
    process's labelled counter before its first event (the simulated SGLang's
    retractions), is there with no rows: 0 so far. (SGLang's own, exported from several
    processes, shows nothing before the first: ``server_metrics`` counts it from 0 then.) With ``only`` (metric names), a line that begins with none of them is
    skipped unread: a few gauges off a large page cost a fraction of the whole."""
    out: Samples = {}
    for raw in text.split("\n"):  # (only a newline ends a line: a label value may hold U+2028 and the like)
        line = raw.strip()
        if line.startswith("# TYPE "):
            declared = line.split()
            if len(declared) == 4 and declared[3] == "counter":
                name = declared[2] if declared[2].endswith("_total") else declared[2] + "_total"
                if not only or name.startswith(only):
                    out.setdefault(name, [])
            continue
        if not line or line.startswith("#") or (only and not line.startswith(only)):
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = {k: _unescape(v) for k, v in _LABEL.findall(m.group(2) or "")}
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def _unescape(value: str) -> str:
    """A label value as written (``\\n`` a newline, ``\\x`` any other ``x``), in one pass:
    ``\\\\n`` is a backslash and an n."""
    return _ESCAPE.sub(lambda m: "\n" if m[1] == "n" else m[1], value) if "\\" in value else value


@dataclass(frozen=True)
class HistogramCounts:
    """A histogram summed over its label sets: cumulative counts per upper bound (seconds,
    ``inf`` last), the sum of observations and their count."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    sum: float
    count: float


@dataclass(frozen=True)
class Snapshot:
    """One ``/metrics`` page in our names: ``values`` (counters and gauges),
    ``histograms``, and ``server``: whose names it used (vllm, sglang, llama.cpp)."""

    values: dict[str, float]
    histograms: dict[str, HistogramCounts]
    server: str | None

    def to_json(self) -> dict[str, Any]:
        """A time-series line's values (histograms as count and sum)."""
        out: dict[str, Any] = {k: _finite(v) for k, v in self.values.items()}
        for k, h in self.histograms.items():
            out[f"{k}_count"] = h.count
            out[f"{k}_sum_s"] = _finite(h.sum)
        return out


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


_SERVERS = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llama.cpp"}


def _added(parts: Sequence[HistogramCounts]) -> HistogramCounts:
    """Histograms added (a page's label sets, or pages read as one server's). Where their
    buckets differ (two engines', two releases'), each one's count at a bound it does not
    have is its count at its next bound down, the observations known to be at or under
    it: the sums still rise bound by bound, and a quantile's bound read off them is still
    an upper bound."""
    if len(parts) == 1:
        return parts[0]
    bounds = tuple(sorted({b for h in parts for b in h.bounds}))
    cumulative = tuple(math.fsum(_at_or_under(h, b) for h in parts) for b in bounds)
    return HistogramCounts(bounds, cumulative, math.fsum(h.sum for h in parts), math.fsum(h.count for h in parts))


def _at_or_under(h: HistogramCounts, bound: float) -> float:
    """The observations of ``h`` known to be at or under ``bound``: its cumulative count
    at its largest bound not above it (0 below its first)."""
    i = bisect.bisect_right(h.bounds, bound) - 1
    return h.cumulative[i] if i >= 0 else 0.0


def snapshot(samples: Samples) -> Snapshot:
    """Map a parsed page to our names; a name the server does not expose is left out."""
    values: dict[str, float] = {}
    used: list[str] = []
    for ours, names in {**COUNTERS, **GAUGES}.items():
        for name in names:
            if name in samples:
                vals = [v for _, v in samples[name]]
                values[ours] = max(vals) if ours in _LARGEST else math.fsum(vals)
                used.append(name)
                break
    hists: dict[str, HistogramCounts] = {}
    for ours, names in HISTOGRAMS.items():
        for name in names:
            h = _histogram(samples, name)
            if h is not None:
                hists[ours] = h
                used.append(name)
                break
    cached = samples.get("llamacpp:prompt_tokens_cached_total")
    if cached is not None and "prompt_tokens" in values:
        # llama.cpp counts the prompt tokens it computed and the ones its slot's cache
        # held apart; ours (vLLM's) count every prompt token, hits among them
        hits = math.fsum(v for _, v in cached)
        values["prompt_tokens"] += hits
        values["prefix_cache_queries_tokens"] = values["prompt_tokens"]
        values["prefix_cache_hits_tokens"] = hits
        used.append("llamacpp:prompt_tokens_cached_total")
    if "prompt_tokens" in values and "sglang:prompt_tokens_total" in used:
        _sglang_prefix_cache(samples, values, used)
    servers = {_SERVERS.get(n.split(":")[0]) for n in used} - {None}
    server = next(iter(servers)) if len(servers) == 1 else None
    return Snapshot(values, hists, server)


#: Gauges of one server's that are the largest of its pages', not their sum (a share each).
_LARGEST = ("kv_usage", "prefix_cache_hit_rate")


def merge(pages: Sequence[Snapshot]) -> Snapshot:
    """Pages read as one server's (``bench --metrics-url`` named several), put together
    as ``snapshot`` puts a name's label sets together: counters, running and waiting
    summed, KV usage and the hit rate the largest, histograms added bound by bound; the
    server's names where every page used the same ones. Each page keeps the names it
    uses (one vLLM's ``kv_cache_usage_perc`` beside an older one's
    ``gpu_cache_usage_perc``: both read)."""
    if len(pages) == 1:
        return pages[0]
    values: dict[str, float] = {}
    for page in pages:
        for name, v in page.values.items():
            if name not in values:
                values[name] = v
            else:
                values[name] = max(values[name], v) if name in _LARGEST else values[name] + v
    hists = {name: _added([page.histograms[name] for page in pages if name in page.histograms])
             for name in {n for page in pages for n in page.histograms}}
    servers = {page.server for page in pages}
    return Snapshot(values, hists, servers.pop() if len(servers) == 1 else None)


#: SGLang's count of the prompt tokens its prefix cache served, by ``cache_source`` (device,
#: host, storage_*: summed), added up as each request finishes (SGLang 0.4.6
#: srt/metrics/collector.py, 0.5.11 srt/observability/metrics_collector.py).
SGLANG_CACHED = "sglang:cached_tokens_total"


def _sglang_prefix_cache(samples: Samples, values: dict[str, float], used: list[str]) -> None:
    """SGLang's prefix-cache counters in ours: every prompt token of its finished
    requests looked up, its cached ones hit. SGLang shows ``SGLANG_CACHED`` only once a
    request had cached tokens (it never adds a 0): where its prompt counter is there and
    that one is not, the cache has served none."""
    values["prefix_cache_queries_tokens"] = values["prompt_tokens"]
    values["prefix_cache_hits_tokens"] = math.fsum(v for _, v in samples.get(SGLANG_CACHED, []))
    used.append(SGLANG_CACHED)


def _histogram(samples: Samples, name: str) -> HistogramCounts | None:
    buckets = samples.get(name + "_bucket")
    if not buckets:
        return None
    # each label set's buckets apart (its labels but ``le``), then added as pages are
    by_set: dict[tuple[tuple[str, str], ...], dict[float, float]] = {}
    for labels, value in buckets:
        try:
            bound = float(labels.get("le", "nan"))
        except ValueError:
            continue
        if not math.isnan(bound):
            key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
            by_set.setdefault(key, {})[bound] = value
    sets = [HistogramCounts(tuple(sorted(b)), tuple(b[x] for x in sorted(b)), 0.0, 0.0) for b in by_set.values()]
    total = math.fsum(v for _, v in samples.get(name + "_sum", []))
    count = math.fsum(v for _, v in samples.get(name + "_count", []))
    return replace(_added(sets), sum=total, count=count)


#: The simulated server's own histogram on its /metrics: how late each engine step's
#: tokens left its loop, wall time against simulated time, in seconds.
EMIT_LAG = "inferlab:token_emit_lag_seconds"


def emit_lag(page: str) -> dict[float, float]:
    """The simulator's emit-lag histogram on the /metrics ``page``: each upper bound
    (seconds, ``inf`` last) → the steps at or under it, its label sets summed. ValueError
    where the page has none: an empty histogram would read as no step late."""
    h = _histogram(parse_prometheus(page, (EMIT_LAG,)), EMIT_LAG)
    if h is None:
        raise ValueError(f"the server's /metrics has no {EMIT_LAG} buckets")
    return dict(zip(h.bounds, h.cumulative, strict=True))


def quantile_bound(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float | None:
    """An upper bound of the ``q`` quantile (0–1) of a cumulative-bucket histogram: the
    smallest bucket bound at or below which at least that share of the observations fell.
    Exact as a bound, where interpolating inside a bucket (Prometheus's
    ``histogram_quantile``) can be far off with coarse buckets. ``None`` without
    observations, or when the quantile is in the ``+Inf`` bucket."""
    if not cumulative or cumulative[-1] <= 0:
        return None
    rank = q * cumulative[-1]
    for bound, count in zip(bounds, cumulative, strict=True):
        if count >= rank:
            return None if math.isinf(bound) else bound
    return None


@dataclass(frozen=True)
class GaugeStats:
    """A gauge over the samples taken during the run."""

    mean: float
    max: float


@dataclass(frozen=True)
class HistogramDelta:
    """A server-side histogram's observations during the run, in ms: how many, their
    mean (exact: sum / count) and, for p50/p90/p99, the bucket bound that share of them
    fell at or below (``quantile_bound``: an upper bound, as fine as the buckets)."""

    count: int
    mean_ms: float
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True)
class ServerMetrics:
    """What the server's own ``/metrics`` said about a run (``available`` false: it has
    no such page, ``reason`` says why, and nothing else is known; available, ``reason``
    is a caveat or None: the page after the run could not be read, and the counters end
    at the last page sampled during it)."""

    available: bool
    reason: str | None = None
    server: str | None = None  # whose metric names: vllm, sglang, llama.cpp
    samples: int = 0  # pages read during the run (besides the one before and the one after)
    # after − before, from 0 for one the page before did not show (None: it went back: a restart)
    counters: dict[str, float | None] = field(default_factory=dict)
    prefix_cache_hit_rate: float | None = None
    gauges: dict[str, GaugeStats] = field(default_factory=dict)
    histograms: dict[str, HistogramDelta] = field(default_factory=dict)
    missing: tuple[str, ...] = ()  # names of ours this server does not expose

    def prefix_cache_tokens(self) -> tuple[int, int] | None:
        """The prompt tokens the server's prefix cache served and those it looked up over
        the run, from its counters (warm-ups and any other client's requests included);
        None where the page did not count both, or a counter went back (a restart)."""
        if not self.available:
            return None
        hits, queries = self.counters.get("prefix_cache_hits_tokens"), self.counters.get("prefix_cache_queries_tokens")
        return None if hits is None or queries is None else (int(hits), int(queries))

    def to_json(self) -> dict[str, Any]:
        if not self.available:
            return {"available": False, "reason": self.reason}
        return {
            "available": True,
            **({"reason": self.reason} if self.reason else {}),
            "server": self.server,
            "samples": self.samples,
            "counters": dict(self.counters),
            "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
            "gauges": {k: {"mean": g.mean, "max": g.max} for k, g in self.gauges.items()},
            "histograms": {k: _hist_json(h) for k, h in self.histograms.items()},
            "missing": list(self.missing),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ServerMetrics:
        if not d.get("available"):
            return cls(False, d.get("reason"))
        return cls(
            True,
            reason=d.get("reason"),
            server=d.get("server"),
            samples=int(d.get("samples", 0)),
            counters=dict(d.get("counters", {})),
            prefix_cache_hit_rate=d.get("prefix_cache_hit_rate"),
            gauges={k: GaugeStats(float(g["mean"]), float(g["max"])) for k, g in d.get("gauges", {}).items()},
            histograms={k: HistogramDelta(**h) for k, h in d.get("histograms", {}).items()},
            missing=tuple(d.get("missing", ())),
        )


def _hist_json(h: HistogramDelta) -> dict[str, Any]:
    return {"count": h.count, "mean_ms": h.mean_ms, "p50_ms": h.p50_ms, "p90_ms": h.p90_ms, "p99_ms": h.p99_ms}


def not_available(reason: str) -> ServerMetrics:
    return ServerMetrics(False, reason)


def server_metrics(before: Snapshot, during: Sequence[Snapshot], after: Snapshot) -> ServerMetrics:
    """The run's telemetry from the page before it, the pages sampled during it and the
    page after: counter deltas (from 0 for one the page before did not show), the gauges
    over the pages sampled during the run (none
    when it ended before the first sample: the pages before and after show an idle
    server, not the run), the histograms' observations in between."""
    counters: dict[str, float | None] = {}
    for name in COUNTERS:
        if name in after.values:
            # (a counter first shown during the run started at 0, as a histogram does:
            # SGLang shows a labelled counter from its first event, its retractions too)
            d = after.values[name] - before.values.get(name, 0.0)
            counters[name] = d if d >= 0 else None
    gauges: dict[str, GaugeStats] = {}
    for name in GAUGES:
        vals = [p.values[name] for p in during if name in p.values and math.isfinite(p.values[name])]
        if vals:
            gauges[name] = GaugeStats(math.fsum(vals) / len(vals), max(vals))
    hists: dict[str, HistogramDelta] = {}
    for name in HISTOGRAMS:
        a, b = before.histograms.get(name), after.histograms.get(name)
        if b is None:
            continue
        delta = _hist_delta(a, b)
        if delta is not None:
            hists[name + "_ms"] = delta
    queries, hits = counters.get("prefix_cache_queries_tokens"), counters.get("prefix_cache_hits_tokens")
    hit_rate = hits / queries if queries and hits is not None else None
    if hit_rate is None:  # (the server's own cumulative rate, where it has no counters)
        hit_rate = after.values.get("prefix_cache_hit_rate")
    # (a name the summary has from other names is not missing: vLLM's hit rate comes from
    # its query and hit counters, not the gauge SGLang exposes under that name)
    derived = {"prefix_cache_hit_rate"} if hit_rate is not None else set()
    missing = tuple(n for n in VOCABULARY if n not in after.values and n not in after.histograms and n not in derived)
    return ServerMetrics(
        True, None, after.server or before.server, len(during), counters, hit_rate, gauges, hists, missing,
    )


def _hist_delta(a: HistogramCounts | None, b: HistogramCounts) -> HistogramDelta | None:
    if a is not None and a.bounds == b.bounds:
        cumulative = tuple(y - x for x, y in zip(a.cumulative, b.cumulative, strict=True))
        total, count = b.sum - a.sum, b.count - a.count
    elif a is None:
        cumulative, total, count = b.cumulative, b.sum, b.count
    else:  # the buckets changed: a restart; nothing to subtract
        return None
    if count <= 0 or any(c < 0 for c in cumulative):
        return None

    def ms(q: float) -> float | None:
        v = quantile_bound(q, b.bounds, cumulative)
        return None if v is None else v * 1e3

    return HistogramDelta(round(count), total / count * 1e3, ms(0.5), ms(0.9), ms(0.99))


#: inferlab gateway's own metrics (``gateway.metrics``) that say what its queue held up:
#: each admission's wait for room (only admitted requests: one that timed out waiting is
#: not observed there), and the requests refused, by reason.
GATEWAY_QUEUE_WAIT = "inferlab_gateway_queue_wait_seconds"
GATEWAY_REJECTIONS = "inferlab_gateway_rejections_total"
#: The refusals of the gateway's queue (``GATEWAY_REJECTIONS``' ``reason``).
QUEUE_REFUSALS = ("queue_full", "queue_timeout")
#: What ``GatewayQueue`` counts, in words (its ``scope``).
GATEWAY_WIDE = ("gateway-wide over the run: every request the gateway admitted between the page read before the run "
                "and the one after, this run's warm-up requests and any other client's included")


@dataclass(frozen=True)
class GatewayQueue:
    """What inferlab gateway's admission queue held up over a run, from its own
    ``/metrics`` before and after the run (``gateway_queue``): gateway-wide, so another
    client's requests in that time are in it (``scope``). ``admitted``: the admissions it
    observed (one per admission to an upstream: a request retried on another upstream is
    admitted, and waits, again); ``queued``: those that waited at all (admitted at once: a
    wait of 0); ``wait``: the admitted requests' waits, in ms (mean, and the bucket bounds
    p50, p90, p99 fell at or below), the part of their TTFT spent in the queue;
    ``queued_mean_ms``: the mean wait of those that waited; ``refused``: requests the
    queue refused and never admitted, by reason (``queue_full``: no wait;
    ``queue_timeout``: after waiting the queue's whole timeout), in none of the above.
    ``available`` false: ``reason`` says why not."""

    available: bool
    reason: str | None = None
    admitted: int = 0
    queued: int | None = None
    wait: HistogramDelta | None = None
    queued_mean_ms: float | None = None
    refused: dict[str, int] = field(default_factory=dict)
    scope: str = GATEWAY_WIDE

    def to_json(self) -> dict[str, Any]:
        if not self.available:
            return {"available": False, "reason": self.reason}
        return {"available": True, "scope": self.scope, "admitted": self.admitted, "queued": self.queued,
                "wait_ms": None if self.wait is None else _hist_json(self.wait), "queued_mean_ms": self.queued_mean_ms,
                "refused": dict(self.refused)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> GatewayQueue:
        if not d.get("available"):
            return cls(False, d.get("reason"))
        wait = d.get("wait_ms")
        admitted = d.get("admitted", d.get("waits", 0))  # ("waits" before 2026-12-07, timed-out waits in it)
        return cls(True, None, int(admitted), d.get("queued"), None if wait is None else HistogramDelta(**wait),
                   d.get("queued_mean_ms"), {str(k): int(v) for k, v in (d.get("refused") or {}).items()},
                   str(d.get("scope", GATEWAY_WIDE)))


def gateway_queue(before: Samples, after: Samples) -> GatewayQueue:
    """The gateway's queue over a run from its pages before and after it (parsed with
    ``GATEWAY_QUEUE_WAIT`` and ``GATEWAY_REJECTIONS`` at least): the delta of its wait
    histogram, summed over models and keys, and of its queue's refusals. A wait of 0
    (admitted at once) falls in the histogram's bucket of bound 0, so the waits above it
    are the ones that queued."""
    b = _histogram(after, GATEWAY_QUEUE_WAIT)
    if b is None:
        return GatewayQueue(False, f"the gateway's /metrics has no {GATEWAY_QUEUE_WAIT}")
    a = _histogram(before, GATEWAY_QUEUE_WAIT)
    if a is not None and (a.bounds != b.bounds or b.count < a.count):
        return GatewayQueue(False, "the gateway's counters went back during the run (a restart): nothing to subtract")
    admitted = round(b.count - (a.count if a else 0.0))
    refused = {r: round(_reason_total(after, r) - _reason_total(before, r)) for r in QUEUE_REFUSALS}
    if admitted <= 0:
        return GatewayQueue(True, admitted=0, queued=0, refused=refused)
    delta = _hist_delta(a, b)
    queued = None
    if 0.0 in b.bounds:  # (the bucket of no wait)
        at = b.bounds.index(0.0)
        queued = admitted - round(b.cumulative[at] - (a.cumulative[at] if a else 0.0))
    total_ms = (b.sum - (a.sum if a else 0.0)) * 1e3
    return GatewayQueue(True, admitted=admitted, queued=queued, wait=delta,
                        queued_mean_ms=total_ms / queued if queued else None, refused=refused)


def _reason_total(samples: Samples, reason: str) -> float:
    return math.fsum(v for labels, v in samples.get(GATEWAY_REJECTIONS, []) if labels.get("reason") == reason)
