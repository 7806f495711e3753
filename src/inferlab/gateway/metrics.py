"""The gateway's Prometheus metrics (``/metrics``), on a registry of its own.

Names follow the OpenTelemetry GenAI semantic conventions in Prometheus form (dots
become underscores, the unit a suffix): ``gen_ai_server_request_duration_seconds``,
``gen_ai_server_time_to_first_token_seconds``,
``gen_ai_server_time_per_output_token_seconds`` and ``gen_ai_client_token_usage``
(the gateway is the engine's client: a counter here, by ``gen_ai_token_type`` input or
output, so TPM is ``rate(...[1m]) * 60``). Their labels: ``gen_ai_request_model``,
``server_address`` (the upstream, ``host:port``) and ``key`` (the client key's name
from the config). ``gen_ai_server_inter_token_latency_seconds`` and the
``inferlab_gateway_*`` metrics (in flight, queue, rejections, cache, and the load each
engine reported on its own ``/metrics``) are the gateway's own. Latency buckets start at 0.5 ms, so per-token latencies under 10 ms resolve.

The inter-token gaps are observed once per streamed chunk, so their histogram is
``ChunkHistogram``, exported in the same form at a fraction of the cost.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

LABELS = ("gen_ai_request_model", "server_address", "key")

#: Per-token latencies (TPOT, ITL): sub-10 ms resolved, up to 2.5 s.
TOKEN_BUCKETS_S = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
    0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5,
)
#: TTFT: the OpenTelemetry GenAI buckets, with finer steps below 10 ms.
TTFT_BUCKETS_S = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
    5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)
#: Request duration and queue wait.
DURATION_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
    40.96, 81.92,
)


class ChunkHistogram:
    """A Prometheus histogram by labels for what is observed per streamed chunk:
    ``labels(*values).observe(seconds)`` is a bisection and two additions, without
    prometheus_client's lock, checks and walk over the buckets (0.2 against 1.1 µs on
    the dev machine). The event loop's one thread both observes and renders ``/metrics``,
    so nothing needs a lock. Exported as prometheus_client's ``Histogram`` exports one
    (``_bucket`` by ``le``, ``_count``, ``_sum``; no ``_created``)."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._bounds = (*buckets, math.inf)
        # (prometheus_client's own formatting of ``le``, so the labels are Histogram's)
        self._les = [floatToGoString(b) for b in self._bounds]  # type: ignore[no-untyped-call]
        self._children: dict[tuple[str, ...], Bins] = {}
        registry.register(self)

    def labels(self, *values: str) -> Bins:
        """The histogram of these label values (made at its first use)."""
        assert len(values) == len(self.labelnames)
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = Bins(self._bounds)
        return child

    def collect(self) -> list[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self._children.items():
            counts = [(le, float(n)) for le, n in zip(self._les, accumulate(child.counts), strict=True)]
            family.add_metric(list(values), counts, child.sum)
        return [family]


class Bins:
    """One labelled histogram of a ``ChunkHistogram``: a count per bucket, as observed
    (``counts[i]``: values in (``bounds[i-1]``, ``bounds[i]``]), and their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class Series:
    """The children of one (model, upstream, key) that every answered request observes,
    looked up once (``GatewayMetrics.series``) rather than by ``labels`` at each use."""

    __slots__ = ("duration", "input_tokens", "itl", "labels", "output_tokens", "tpot", "ttft")

    def __init__(self, m: GatewayMetrics, labels: tuple[str, str, str]) -> None:
        self.labels = labels
        self.duration = m.duration.labels(*labels, "")  # (no error_type: a success)
        self.ttft = m.ttft.labels(*labels)
        self.tpot = m.tpot.labels(*labels)
        self.itl = m.itl.labels(*labels)
        self.input_tokens = m.tokens.labels(*labels, "input")
        self.output_tokens = m.tokens.labels(*labels, "output")


class GatewayMetrics:
    """Every metric the gateway exports; ``render()`` is the ``/metrics`` body."""

    def __init__(self) -> None:
        self._series: dict[tuple[str, str, str], Series] = {}
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.duration = Histogram(
            "gen_ai_server_request_duration_seconds", "Time from the gateway receiving a request to its last byte.",
            (*LABELS, "error_type"), registry=r, buckets=DURATION_BUCKETS_S)
        self.ttft = Histogram(
            "gen_ai_server_time_to_first_token_seconds", "Time from the gateway receiving a request to the first generated token, queue included.",
            LABELS, registry=r, buckets=TTFT_BUCKETS_S)
        self.tpot = Histogram(
            "gen_ai_server_time_per_output_token_seconds", "Per request: (last token - first token) / (output tokens - 1).",
            LABELS, registry=r, buckets=TOKEN_BUCKETS_S)
        self.itl = ChunkHistogram(
            "gen_ai_server_inter_token_latency_seconds", "Time between consecutive streamed chunks that carry generated content.",
            LABELS, TOKEN_BUCKETS_S, r)
        self.tokens = Counter(
            "gen_ai_client_token_usage", "Tokens the upstreams counted (usage), by gen_ai_token_type: input or output.",
            (*LABELS, "gen_ai_token_type"), registry=r)
        self.in_flight = Gauge(
            "inferlab_gateway_requests_in_flight", "Requests sent to an upstream and not yet finished.",
            ("server_address",), registry=r)
        self.tokens_in_flight = Gauge(
            "inferlab_gateway_tokens_in_flight", "Tokens reserved on an upstream by the requests in flight.",
            ("server_address",), registry=r)
        self.others_in_flight = Gauge(
            "inferlab_gateway_other_instances_requests_in_flight",
            "Requests the other gateway instances sharing the admission budget through Redis had in flight on an "
            "upstream, when Redis last said; absent without [redis] admission.",
            ("server_address",), registry=r)
        self.others_tokens_in_flight = Gauge(
            "inferlab_gateway_other_instances_tokens_in_flight",
            "Tokens the other gateway instances sharing the admission budget through Redis held on an upstream, "
            "when Redis last said; absent without [redis] admission.",
            ("server_address",), registry=r)
        self.engine_requests = Gauge(
            "inferlab_gateway_upstream_reported_requests",
            "Requests the upstream's engine reported on its own /metrics, by state: running or waiting; "
            "absent without a current report.",
            ("server_address", "state"), registry=r)
        self.engine_foreign = Gauge(
            "inferlab_gateway_upstream_foreign_requests",
            "Requests the engine reported that this gateway did not send: what routing adds to its own count.",
            ("server_address",), registry=r)
        self.engine_kv_usage = Gauge(
            "inferlab_gateway_upstream_reported_kv_usage",
            "KV-cache usage (0 to 1) the upstream's engine reported, where it does.",
            ("server_address",), registry=r)
        self.queue_length = Gauge(
            "inferlab_gateway_queue_length", "Requests waiting for room on an upstream.", registry=r)
        self.queue_wait = Histogram(
            "inferlab_gateway_queue_wait_seconds", "Time a request waited for room on an upstream before it was "
            "admitted (one observation per admission; 0: let in at once). A request that timed out waiting is not "
            "in it: inferlab_gateway_rejections_total{reason=\"queue_timeout\"} counts those.",
            ("gen_ai_request_model", "key"), registry=r, buckets=(0.0, *DURATION_BUCKETS_S))
        self.rejections = Counter(
            "inferlab_gateway_rejections", "Requests refused, by reason.", ("reason", "key"), registry=r)
        self.prompt_counts = Counter(
            "inferlab_gateway_prompt_counts", "Requests whose prompt tokens were counted, by what counted them "
            "([admission] tokenizer: a tokenizer, the upstream's /tokenize, or the estimate).", ("source",), registry=r)
        self.cache_hits = Counter(
            "inferlab_gateway_cache_hits", "Requests answered from the response cache.", ("gen_ai_request_model", "key"), registry=r)
        self.cache_misses = Counter(
            "inferlab_gateway_cache_misses", "Cacheable requests the cache could not answer.", ("gen_ai_request_model", "key"), registry=r)
        self.cache_tokens_saved = Counter(
            "inferlab_gateway_cache_tokens_saved", "Input plus output tokens the cache answered without an upstream.",
            ("gen_ai_request_model", "key"), registry=r)
        self.upstream_errors = Counter(
            "inferlab_gateway_upstream_errors", "Upstream failures, by kind (connect, status, disconnect, timeout, "
            "malformed), and its answers that it cannot take a request (kind refused: a 500 or 501 with an OpenAI "
            "error body, relayed; not a failure of the upstream).",
            ("server_address", "kind"), registry=r)
        self.ejected = Gauge(
            "inferlab_gateway_upstream_ejected", "1 while the upstream is ejected (it failed three requests in a row "
            "and is tried only where no other can take a request), else 0.", ("server_address",), registry=r)

    def series(self, model: str, upstream: str, key: str) -> Series:
        labels = (model, upstream, key)
        found = self._series.get(labels)
        if found is None:
            found = self._series[labels] = Series(self, labels)
        return found

    def render(self) -> bytes:
        return generate_latest(self.registry)
