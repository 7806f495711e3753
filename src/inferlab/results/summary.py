"""The run summary: a typed object that ``summary.json`` is written from and read back
into, with every key documented once (``Summary``'s fields; docs/design.md's table is
tested against them).

``summarize`` computes it from the records, once: pure, no clock, no I/O; the same
records always give the same summary. What a run knows beyond its records (a replayed
trace's own measurements, what the preflight probe learned, a dataset's caveats)
comes in as ``SummaryExtras``. Keys that only some runs have (``trace_comparison``;
``prompt_overhead_tokens``, ``input_length_source`` and ``preflight`` of runs against a
server) are left out of the JSON, not written as null, when the run has no such thing.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from inferlab.results.breakdown import LatencyBreakdown, latency_breakdown
from inferlab.results.clientload import ClientLoad
from inferlab.results.metrics import (
    NS_PER_MS,
    NS_PER_S,
    SLO,
    Distribution,
    RequestMetrics,
    connect_wait_ms,
    counted_distribution,
    distribution,
    itl_ms_counts,
    queue_delay_ms,
    request_metrics,
)
from inferlab.results.provenance import VIRTUAL, ServerInfo, server_info
from inferlab.results.records import ErrorKind, RequestRecord, unanswered
from inferlab.results.telemetry import GatewayQueue, ServerMetrics

SCHEMA = "inferlab.summary/1"
#: A request whose actual send lagged its intended time by more than this is "late".
LATE_THRESHOLD_MS = 10.0
#: In a closed loop a late send only stretches the time between a user's requests: it
#: is worth a warning past this share of the E2E p50 (a burst of streams ending in one
#: engine step is read one after another, a few ms at 256 streams, beside E2Es of a second).
CLOSED_LOOP_LATE_SHARE = 0.05
#: An open-loop run whose completion rate is below this share of the offered rate, while
#: latency grew, was more than the server could take.
KEEP_UP_RATIO = 0.8
#: ... and "latency grew" means the last requests' median is at least this many times the first's.
LATENCY_GROWTH = 2.0
#: The fewest requests at each end of an open loop whose median latency says whether
#: queues grew (a tenth of the run when that is more): two were one burst's luck.
OVERLOAD_PART = 3
#: ... and the latencies must rise through the run, not jump in one burst: their rank
#: correlation with the send order at least this (a queue that keeps growing is near 1).
OVERLOAD_TREND = 0.6
#: ... and grow by at least this share of the time over which the requests were sent: a
#: server that completes 80 % of the offered rate lets its queue grow by a fifth of that
#: time, where an engine that only got busier (a growing decode batch, a burst near the
#: end) adds tens of ms to a TTFT of tens of ms.
OVERLOAD_WAIT_SHARE = 0.1
#: A closed loop's requests waited for a place in the batch (more users than the server
#: runs at once) when they waited at least this many decode steps: in capacity a request
#: waits for the front end (a few ms, more with hundreds of streams) and the step in
#: flight and the one scheduled ahead, 2 to 5 steps in the simulator's closed loops of
#: 1 to 64 users.
PLACE_WAIT_STEPS = 10


class Omitted(enum.Enum):
    """A key this run has no value for at all (left out of the JSON, unlike ``None``)."""

    OMITTED = "omitted"


OMITTED = Omitted.OMITTED


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


@dataclass(frozen=True)
class Counts:
    """Measured requests (warm-up excluded) by outcome."""

    total: int
    completed: int
    failed: int
    cancelled: int
    warmup: int
    errors: dict[str, int]  # failed requests by error kind
    #: completed requests a response cache in front of the engine answered (a response
    #: header said hit): their latency is the cache's, not the engine's
    response_cache_hits: int = 0
    #: failed requests of the final streak of failures for want of a connection that
    #: stopped the run (the server stopped answering; counted in ``failed`` too)
    after_server_gone: int = 0

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "errors": dict(self.errors)}


@dataclass(frozen=True)
class ServerTimeline:
    """The client's TTFT against the simulated server's own (its ``inferlab_timeline``):
    ``ttft_error_ms`` = client TTFT less its wait for a connection − server TTFT, what
    the network, both HTTP stacks and the client's parsing add, and the simulator's own
    lateness: its timeline is in simulated time, and a step's tokens may leave its loop
    later than that (its /metrics' ``inferlab:token_emit_lag_seconds``)."""

    requests: int
    server_ttft_ms: Distribution
    ttft_error_ms: Distribution
    server_queue_ms: Distribution | None

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "server_ttft_ms": self.server_ttft_ms.to_json(),
            "ttft_error_ms": self.ttft_error_ms.to_json(),
            "server_queue_ms": _dist_json(self.server_queue_ms),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ServerTimeline:
        server_ttft, error = _dist(d["server_ttft_ms"]), _dist(d["ttft_error_ms"])
        assert server_ttft is not None and error is not None
        return cls(int(d["requests"]), server_ttft, error, _dist(d["server_queue_ms"]))


@dataclass(frozen=True)
class TraceComparison:
    """One metric of a replay against the replayed trace's own measurements, over the
    ``requests`` the trace measured it for (ms; errors in % of the measured value)."""

    requests: int
    predicted_mean: float
    measured_mean: float
    error_pct: float | None
    predicted_median: float
    measured_median: float
    median_error_pct: float | None


@dataclass(frozen=True)
class Summary:
    """A run's summary, as ``summary.json`` holds it (the field order is the JSON's).

    Times are ms, rates per second, TPM per minute. The duration runs from the first
    send of a measured request to the last end of a completed one; the rates are
    ``None`` when it is 0, a distribution ``None`` when it has no value."""

    schema: str = field(metadata=_doc(f"the format's version, {SCHEMA!r}"))
    config: dict[str, Any] = field(metadata=_doc("the run's whole configuration as resolved (as in config.json)"))
    server: ServerInfo = field(metadata=_doc("where the numbers come from (results.provenance): simulated (true: inferlab's simulator made them, every number is a prediction), kind (virtual time: sim run, a simulated sweep point, a what-if; embedded: the simulated server bench or profile started without --url; gateway to sim serve: inferlab gateway, every upstream of which is inferlab sim serve (it answered /inferlab/engine for them all); sim serve: a server that answered /inferlab/engine, i.e. inferlab sim serve; server: any other, measured, a gateway with any other upstream included), url (the API root; null in virtual time and for the embedded server), engine_family (the simulated engine's; behind a gateway its upstreams' when they all share one, else null; null for other servers), software (what a measured server said it is, from its model cards' owned_by and its release route: \"vLLM 0.11.0\" (/version), \"SGLang 0.5.2\" (/server_info), \"llama.cpp b6000-1a2b3c4\" (/props' build_info), the name alone where the release route did not answer; absent for any other server and for simulated ones; config.json's resolved.server_software has it as name, version and source, and settings: the engine flags it states (llama.cpp: its slots and a slot's context from /props, calibrate simulating its KV cache as slots x context; vLLM: its KV cache's block size, blocks (num_gpu_blocks: those it had, however sized; num_gpu_blocks_override only where it states an override), dtype and prefix caching from /metrics' vllm:cache_config_info, max_model_len from its model card; SGLang: from /server_info its TP degree, radix cache, overlap scheduler, CUDA graphs, mixed chunks, chunked prefill size, running-request cap, KV dtype, its token pool as kv_cache_tokens (a count of tokens, max_total_num_tokens) in pages of block_size (page_size), context length), which sim calibrate takes for a twin), gateway (inferlab gateway's setup in words, from what it answered at /inferlab/gateway, config.json's resolved.gateway: its upstreams, router, admission, cache, Redis; whatever its upstreams are, the server then reads \"inferlab gateway at URL in front of llama.cpp (...)\"; absent where no gateway answered)"))
    interrupted: bool = field(metadata=_doc("the run ended early (Ctrl-C, a workload that could not make its next request, a --workers process that died, or a server that stopped answering: a warning says which)"))
    counts: Counts = field(metadata=_doc("measured requests: total, completed, failed, cancelled (in flight at an interruption), warmup (left out of everything), errors (failed ones by error kind), response_cache_hits (completed ones a response cache in front of the engine answered), after_server_gone (failed ones of the final streak of failures for want of a connection that stopped the run once the server stopped answering; counted in failed too)"))
    duration_s: float = field(metadata=_doc("first send → last completion of the measured requests (0 when none completed)"))
    request_throughput_rps: float | None = field(metadata=_doc("completed requests / duration"))
    output_token_throughput_tps: float | None = field(metadata=_doc("output tokens of completed requests / duration"))
    total_token_throughput_tps: float | None = field(metadata=_doc("input + output tokens of completed requests / duration (null when the server reported no input tokens)"))
    output_tpm: float | None = field(metadata=_doc("output_token_throughput_tps × 60"))
    total_tpm: float | None = field(metadata=_doc("total_token_throughput_tps × 60"))
    goodput_rps: float | None = field(metadata=_doc("completed requests meeting every SLO given / duration; null without SLOs"))
    slo: SLO | None = field(metadata=_doc("the SLOs goodput counts against: ttft_ms, tpot_ms, e2e_ms (null: no limit)"))
    input_tokens: int | None = field(metadata=_doc("prompt tokens of completed requests, as the server reported them (null: it reported none)"))
    output_tokens: int = field(metadata=_doc("output tokens of completed requests"))
    token_source: str = field(metadata=_doc("where token counts come from: server usage, the engine's own counts, or content chunks"))
    ttfb_ms: Distribution | None = field(metadata=_doc("send → first byte of the response body, per completed request"))
    ttft_ms: Distribution | None = field(metadata=_doc("send → first chunk carrying generated content, per completed request"))
    e2e_ms: Distribution | None = field(metadata=_doc("send → last byte of the response, per completed request"))
    tpot_ms: Distribution | None = field(metadata=_doc("(e2e − ttft) / (output tokens − 1), per completed request with 2 or more"))
    itl_ms: Distribution | None = field(metadata=_doc("every gap between consecutive content chunks of every completed request"))
    decode_tps: Distribution | None = field(metadata=_doc("(output tokens − 1) / (e2e − ttft), tokens/s, per completed request"))
    queue_delay_ms: Distribution | None = field(metadata=_doc("actual send − intended send, per measured request: how late the client started it (the client falling behind its schedule, or a concurrency cap); the wait for a connection to the server is after the send (connect_wait_ms)"))
    connect_wait_ms: Distribution | None = field(metadata=_doc("the wait for a new connection to the server (DNS, TCP, TLS set-up), per completed measured request (as TTFT; a failed request's connect attempts are in its failure, counted by kind), 0 on a pooled keep-alive connection: the server's or the network's time, in TTFT, TTFB and E2E (they run from the request's start, as vLLM's bench counts them), never in queue_delay_ms; null where no request waited for one, or none measured it (records written before it was)"))
    cached_tokens: int | None = field(metadata=_doc("prompt tokens the server reported served from its prefix cache, in its answers (null: they did not say; vLLM says with --enable-prompt-tokens-details; llama.cpp always says, in usage or timings.cache_n; then server_metrics.counters prefix_cache_hits_tokens of prefix_cache_queries_tokens may count them, the server's over the run, warm-ups included, which the console's tokens row quotes)"))
    server_timeline: ServerTimeline | None = field(metadata=_doc("client TTFT against the simulated server's own (null against other servers): requests, server_ttft_ms, ttft_error_ms (client TTFT less its connect wait − the server's: the network, both HTTP stacks, the client's parsing, and the simulator's own lateness, its tokens leaving its loop after their simulated time, inferlab:token_emit_lag_seconds on its /metrics), server_queue_ms"))
    latency_breakdown: LatencyBreakdown | None = field(metadata=_doc("where the time went, in ms (mean, p50, p90): client_queue_ms (send − intended send), gateway_queue_ms (the wait in the gateway's queue: sim run --admission's simulated gateway per request; through inferlab gateway, its admitted requests' mean from its /metrics, taken out of other_ms), server_queue_ms (server received → first scheduled; behind a gateway, the engine received), prefill_ms (→ first token), decode_ms (→ last token), other_ms (E2E less the server's part: network, HTTP); source: the server's timeline per request (the simulated server), the simulated engine's own in virtual time (sim run: exact, the parts add up to each request's E2E; a prediction), else its /metrics histograms (means only); requests; null without either"))
    error_examples: dict[str, str] = field(metadata=_doc("the first message of each error kind"))
    warnings: tuple[str, ...] = field(metadata=_doc("plain-language caveats about how far the numbers can be trusted"))
    trace_comparison: dict[str, TraceComparison] | Omitted | None = field(
        default=OMITTED, metadata=_doc("replays only: this run against the trace's own measurements, per metric (ttft_ms, tpot_ms, e2e_ms)")
    )
    prompt_overhead_tokens: int | Omitted | None = field(
        default=OMITTED, metadata=_doc("runs against a server only: tokens the chat template (or BOS) adds to a prompt of one user message (a multi-turn conversation's prompt holds more: the template's tokens of each of its messages)")
    )
    input_length_source: str | Omitted = field(
        default=OMITTED, metadata=_doc("runs against a server only: how exact the prompt lengths are (local tokenizer, the server's /tokenize, calibrated, or text as given)")
    )
    preflight: dict[str, Any] | Omitted | None = field(
        default=OMITTED, metadata=_doc("runs against a server only: what the probe before the run learned (null: no probe)")
    )
    client: ClientLoad | Omitted | None = field(
        default=OMITTED, metadata=_doc("runs against a server only: was the client the bottleneck? bottleneck (true: it likely inflated the latencies, or the parent of --workers delayed the sends; a warning says by how much; null: no verdict, no process that measures ran long enough for 10 loop timers (half a second; one late timer is no verdict)), inflation_ms (about what the busiest process that measures added to each latency, p50 and p99 (the parent of --workers measures nothing): its event-loop lag, or where the loop stood still for longer, the wait a read met at a moment drawn from the run), processes (each sending process: role, cpu_share of one core, loop_lag_ms, late_share (the share of the run its loop was over 2 ms late, counted in time: a stall of seconds is one late timer but seconds of late reads), inflation_ms (what this process added, as the top-level one; absent in older summaries), timeline: [largest loop lag ms, CPU share] per second)")
    )
    server_metrics: ServerMetrics | Omitted = field(
        default=OMITTED, metadata=_doc("runs against a server only: what its own Prometheus /metrics said (beside the API URL, or the pages --metrics-url named, read as one server's: config.json's resolved.metrics_urls; results.telemetry; vLLM's, SGLang's, llama.cpp's and the simulator's names in one vocabulary), read before, every second during and after the run: available (false: no such page, reason says why), server (whose names), samples, counters (after − before, from 0 for one the page before did not show: prompt_tokens, generation_tokens, prefix_cache_queries_tokens, prefix_cache_hits_tokens, preemptions, requests_finished, prompt_seconds, generation_seconds; null after a restart), prefix_cache_hit_rate, gauges (running, waiting, kv_usage, prefix_cache_hit_rate: mean and max over the pages read during the run; none if it ended before the first, at 1 s), histograms (ttft_ms, tpot_ms, itl_ms, e2e_ms, queue_ms, prefill_ms, decode_ms: the server's own observations during the run: count, mean_ms, and p50_ms, p90_ms, p99_ms as upper bounds: the bucket bound that share of them fell at or below), missing (names it does not expose); server_metrics.jsonl holds what was parsed from each page read (our names' counts, sums and gauges; no buckets), not the pages' text")
    )
    gateway_queue: GatewayQueue | Omitted = field(
        default=OMITTED, metadata=_doc("runs through inferlab gateway only (its own /metrics, read before and after the run): how much of the measured latency was the gateway's admission queue, gateway-wide over the run (scope says so: every request it admitted in that time, the run's warm-ups and another client's too): available (false: reason says why not), admitted (the admissions it observed: one per admission to an upstream, a request retried on another upstream admitted, and waiting, again), queued (those that waited at all; the others were admitted at once), wait_ms (the admitted requests' waits, the part of their TTFT spent in the queue: count, mean_ms, and p50_ms, p90_ms, p99_ms as upper bounds: the bucket bound that share of them fell at or below), queued_mean_ms (the mean wait of those that queued), refused (requests the queue refused, never admitted and in none of the above, by reason: queue_full, at once; queue_timeout, after waiting the queue's timeout)")
    )
    gateway: dict[str, Any] | Omitted = field(
        default=OMITTED, metadata=_doc("sim run --admission only: the simulated gateway's admission in front of the engines (inferlab gateway's own code): mode; admitted (measured requests it sent on to an engine); refused (by reason: queue_full, queue_timeout; answered 503, counted among the failed as http_status); queue_wait_ms (the wait in its queue of each admitted request, a distribution)")
    )
    prediction: dict[str, Any] | Omitted = field(
        default=OMITTED, metadata=_doc("virtual-time runs only (sim run, a simulated sweep point, a what-if): the numbers are simulated, not measured; engine_family, regime (offline, closed loop, Poisson, saturated; an open loop whose queues grew through the run is saturated) and, per headline metric, error_bands: the validation error of that family in that regime (pct: median |error| % over rows of published measurements, rows, split: holdout or fit, text; stat: median when it is the error of the rows' medians, which the p50s shown are, absent when it is their headline statistic's, where too few rows reported medians), null where it was never validated; see docs/validation.md. With sim run --efficiencies FILE (other step-time constants) the stock bands do not apply: efficiencies names the file and the bands (also twin_bands, per metric class) are its sim calibrate record's (median |error| over the calibration's held-out runs, else its fit runs; basis: the loads of those runs in words, in the band's text), null where it has none, and null for every metric where the run is not of the server the file was calibrated on (its record's served_by: engine family, model, GPU, tensor-parallel degree, precision, and the switches a release decides: overlap/async scheduling, which a record written before it was recorded takes as its family's old default, off for vllm, full-sequence admission and the free queue's order; another batch budget or concurrency keeps them): then mismatch says what differs; preemptions: how many times the simulated engine (every replica's) evicted a running request to recompute it, its KV cache full (also a line under the sim run's table where any); beyond_validated (only where it applies; with --efficiencies only a sentence where the run's concurrency, rate or prompt length is beyond those of every run the calibration fitted or held out): a sentence for the run's mean prompt or answer where it is longer than any row validation compared of its family in its regime (else of its family, else of every family in the regime, else of all): the bands were measured on shorter requests; and one for each engine switch validation only ran at the family's default (the capacity policy, output reservation at admission, mixed prefill and decode steps) where the run sets the other, and one for multi-turn sessions, since no validated row is a conversation whose turns wait for their answers (also lines under the sim run's table)")
    )

    def to_json(self) -> dict[str, Any]:
        """The JSON object (omitted keys left out), in field order."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is OMITTED:
                continue
            out[f.name] = _json(value)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Summary:
        """Read a summary back (``ValueError``/``KeyError``/``TypeError`` for another shape)."""
        if d.get("schema") != SCHEMA:
            raise ValueError(f"not an inferlab summary (schema {d.get('schema')!r}, expected {SCHEMA!r})")
        c = d["counts"]
        slo = d["slo"]
        trace = d.get("trace_comparison", OMITTED)
        if isinstance(trace, dict):
            trace = {k: TraceComparison(**v) for k, v in trace.items()}
        return cls(
            schema=d["schema"],
            config=dict(d["config"]),
            # (a summary written before the key: the same rule on its config)
            server=ServerInfo.from_json(d["server"]) if "server" in d else server_info(d["config"]),
            interrupted=bool(d["interrupted"]),
            counts=Counts(c["total"], c["completed"], c["failed"], c["cancelled"], c["warmup"], dict(c["errors"]),
                          int(c.get("response_cache_hits") or 0), int(c.get("after_server_gone") or 0)),
            duration_s=_number(d, "duration_s", optional=False),
            request_throughput_rps=_number(d, "request_throughput_rps"),
            output_token_throughput_tps=_number(d, "output_token_throughput_tps"),
            total_token_throughput_tps=_number(d, "total_token_throughput_tps"),
            output_tpm=_number(d, "output_tpm"),
            total_tpm=_number(d, "total_tpm"),
            goodput_rps=_number(d, "goodput_rps"),
            slo=None if slo is None else SLO(slo["ttft_ms"], slo["tpot_ms"], slo["e2e_ms"]),
            input_tokens=_count(d, "input_tokens"),
            output_tokens=_count(d, "output_tokens", optional=False),
            token_source=str(d["token_source"]),
            ttfb_ms=_dist(d["ttfb_ms"]),
            ttft_ms=_dist(d["ttft_ms"]),
            e2e_ms=_dist(d["e2e_ms"]),
            tpot_ms=_dist(d["tpot_ms"]),
            itl_ms=_dist(d["itl_ms"]),
            decode_tps=_dist(d["decode_tps"]),
            queue_delay_ms=_dist(d["queue_delay_ms"]),
            connect_wait_ms=_dist(d.get("connect_wait_ms")),  # (absent from older summaries)
            cached_tokens=_count(d, "cached_tokens"),
            server_timeline=None if d["server_timeline"] is None else ServerTimeline.from_json(d["server_timeline"]),
            latency_breakdown=None if d.get("latency_breakdown") is None else LatencyBreakdown.from_json(d["latency_breakdown"]),
            error_examples=dict(d["error_examples"]),
            warnings=tuple(d["warnings"]),
            trace_comparison=trace,
            prompt_overhead_tokens=d.get("prompt_overhead_tokens", OMITTED),
            input_length_source=d.get("input_length_source", OMITTED),
            preflight=d.get("preflight", OMITTED),
            client=_client(d.get("client", OMITTED)),
            server_metrics=_server_metrics(d.get("server_metrics", OMITTED)),
            gateway_queue=_gateway_queue(d.get("gateway_queue", OMITTED)),
            gateway=d.get("gateway", OMITTED),
            prediction=d.get("prediction", OMITTED),
        )


def key_docs() -> list[tuple[str, str]]:
    """Every ``summary.json`` key with what it means, in the file's order."""
    return [(f.name, str(f.metadata["doc"])) for f in dataclasses.fields(Summary)]


def _json(value: Any) -> Any:
    if hasattr(value, "to_json"):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    return value


def _number(d: Mapping[str, Any], key: str, *, optional: bool = True) -> Any:
    """``d[key]`` as a summary holds a rate or a time: a finite number, at least 0 (or
    null where ``optional``); ``ValueError`` otherwise (a summary edited by hand: a string,
    NaN), which its readers report rather than carry into a comparison or an export."""
    value = d[key]
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{key}: {value!r} is not a number of at least 0")
    return float(value)


def _count(d: Mapping[str, Any], key: str, *, optional: bool = True) -> Any:
    """``d[key]`` as a summary holds a token count: a whole number, at least 0 (or null
    where ``optional``); ``ValueError`` otherwise."""
    value = d[key]
    if value is None and optional:
        return None
    if type(value) is not int or value < 0:
        raise ValueError(f"{key}: {value!r} is not a count")
    return value


def _dist_json(d: Distribution | None) -> dict[str, float] | None:
    return None if d is None else d.to_json()


def _dist(d: Mapping[str, float] | None) -> Distribution | None:
    return None if d is None else Distribution.from_json(d)


def _server_metrics(d: Mapping[str, Any] | Omitted) -> ServerMetrics | Omitted:
    return d if d is OMITTED else ServerMetrics.from_json(d)


def _gateway_queue(d: Mapping[str, Any] | Omitted) -> GatewayQueue | Omitted:
    return d if d is OMITTED else GatewayQueue.from_json(d)


def _client(d: Mapping[str, Any] | Omitted | None) -> ClientLoad | Omitted | None:
    return d if d is None or d is OMITTED else ClientLoad.from_json(d)


@dataclass(frozen=True)
class SummaryExtras:
    """What a run knows beyond its records: a replayed trace's comparison, what the
    preflight probe learned (runs against a server), and caveats of its own, placed
    before and after the ones the records give."""

    trace_comparison: dict[str, TraceComparison] | Omitted | None = OMITTED
    prompt_overhead_tokens: int | Omitted | None = OMITTED
    input_length_source: str | Omitted = OMITTED
    preflight: dict[str, Any] | Omitted | None = OMITTED
    client: ClientLoad | Omitted | None = OMITTED
    server_metrics: ServerMetrics | Omitted = OMITTED
    gateway_queue: GatewayQueue | Omitted = OMITTED
    warnings_first: tuple[str, ...] = ()
    warnings_last: tuple[str, ...] = ()
    # the run stopped because the server stopped answering (``load.http.ServerGoneError``)
    server_gone: bool = False


def _gateway_wait_ms(q: GatewayQueue | Omitted) -> float | None:
    """The admitted requests' mean wait in inferlab gateway's queue, where it was read."""
    return q.wait.mean_ms if isinstance(q, GatewayQueue) and q.available and q.wait is not None else None


def _present(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def summarize(
    records: Sequence[RequestRecord],
    *,
    config: dict[str, Any] | None = None,
    slo: SLO | None = None,
    interrupted: bool = False,
    extras: SummaryExtras = SummaryExtras(),
    percentiles: Sequence[float] = (),
) -> Summary:
    """The run's summary (docs/design.md's results contract). Warm-up records are
    excluded. Every distribution has the fixed percentiles and ``percentiles`` beyond
    them (``Distribution.extra``)."""
    measured = [r for r in records if not r.warmup]
    done = [r for r in measured if r.ok]
    cancelled = [r for r in measured if r.error_kind is ErrorKind.CANCELLED]
    failed = [r for r in measured if not r.ok and r.error_kind is not ErrorKind.CANCELLED]
    gone = server_gone_streak(measured) if extras.server_gone else []
    per = [request_metrics(r) for r in done]
    dists = _distributions(measured, done, per, percentiles)

    sends = [r.send_ns for r in measured if r.send_ns is not None]
    ends = [r.end_ns for r in done if r.end_ns is not None]
    duration_s = (max(ends) - min(sends)) / NS_PER_S if sends and ends else 0.0

    out_tokens = sum(m.output_tokens or 0 for m in per)
    in_tokens = _known_sum([r.input_tokens for r in done])

    def rate(x: float) -> float | None:
        return x / duration_s if duration_s > 0 else None

    out_tps = rate(out_tokens)
    total_tps = None if in_tokens is None else rate(out_tokens + in_tokens)
    completed_rps = rate(len(done))
    config = config or {}
    queue_delay = dists["queue_delay_ms"]
    token_source = _token_source(done)
    caveats = _warnings(
        config, completed_rps, queue_delay, token_source, done, measured, interrupted, gone
    )
    server = server_info(config)
    return Summary(
        schema=SCHEMA,
        config=config,
        server=server,
        interrupted=interrupted,
        counts=Counts(
            total=len(measured),
            completed=len(done),
            failed=len(failed),
            cancelled=len(cancelled),
            warmup=len(records) - len(measured),
            errors=dict(Counter(r.error_kind.value for r in failed if r.error_kind)),
            response_cache_hits=sum(1 for r in done if r.response_cache_hit),
            after_server_gone=len(gone),
        ),
        duration_s=duration_s,
        request_throughput_rps=completed_rps,
        output_token_throughput_tps=out_tps,
        total_token_throughput_tps=total_tps,
        output_tpm=out_tps * 60 if out_tps is not None else None,
        total_tpm=total_tps * 60 if total_tps is not None else None,
        goodput_rps=rate(sum(1 for m in per if slo.met_by(m))) if slo else None,
        slo=slo,
        input_tokens=in_tokens,
        output_tokens=out_tokens,
        token_source=token_source,
        **dists,
        cached_tokens=_known_sum([r.cached_tokens for r in done]),
        server_timeline=server_comparison(done, per, percentiles),
        latency_breakdown=latency_breakdown(
            done, extras.server_metrics if isinstance(extras.server_metrics, ServerMetrics) else None,
            virtual=server.kind == VIRTUAL, gateway_wait_ms=_gateway_wait_ms(extras.gateway_queue),
        ),
        error_examples=_error_examples(failed),
        warnings=(*extras.warnings_first, *caveats, *extras.warnings_last),
        trace_comparison=extras.trace_comparison,
        prompt_overhead_tokens=extras.prompt_overhead_tokens,
        input_length_source=extras.input_length_source,
        preflight=extras.preflight,
        client=extras.client,
        server_metrics=extras.server_metrics,
        gateway_queue=extras.gateway_queue,
        gateway=gateway_block(measured, config, percentiles),
    )


def gateway_block(measured: Sequence[RequestRecord], config: Mapping[str, Any], percentiles: Sequence[float] = ()) -> dict[str, Any] | Omitted:
    """The summary's ``gateway``: what the simulated gateway's admission did to the
    ``measured`` requests (their ``server_timeline``'s ``gateway_queue_ms`` and
    ``gateway_refused``); omitted for a run without one (``config`` has no ``admission``)."""
    admission = config.get("admission")
    if not isinstance(admission, Mapping):
        return OMITTED
    waits: list[float] = []
    refused = {"queue_full": 0, "queue_timeout": 0}
    for r in measured:
        tl = r.server_timeline or {}
        reason = tl.get("gateway_refused")
        if reason is not None:
            refused[str(reason)] = refused.get(str(reason), 0) + 1
        elif tl.get("gateway_queue_ms") is not None:
            waits.append(float(tl["gateway_queue_ms"]))
    return {
        "mode": admission.get("mode"), "admitted": len(waits), "refused": refused,
        "queue_wait_ms": _dist_json(distribution(waits, percentiles)),
    }


class _Distributions(TypedDict):
    """The summary's distributions, by field name."""

    ttfb_ms: Distribution | None
    ttft_ms: Distribution | None
    e2e_ms: Distribution | None
    tpot_ms: Distribution | None
    itl_ms: Distribution | None
    decode_tps: Distribution | None
    queue_delay_ms: Distribution | None
    connect_wait_ms: Distribution | None


def _distributions(
    measured: Sequence[RequestRecord], done: Sequence[RequestRecord], per: Sequence[RequestMetrics],
    percentiles: Sequence[float],
) -> _Distributions:
    """The summary's distributions by key, in its field order: ``done`` are the measured
    requests that completed, ``per`` their metrics."""
    def dist(values: Iterable[float | None]) -> Distribution | None:
        return distribution(_present(values), percentiles)

    return _Distributions(
        ttfb_ms=dist(m.ttfb_ms for m in per),
        ttft_ms=dist(m.ttft_ms for m in per),
        e2e_ms=dist(m.e2e_ms for m in per),
        tpot_ms=dist(m.tpot_ms for m in per),
        itl_ms=counted_distribution(itl_ms_counts(done), percentiles),
        decode_tps=dist(m.decode_tps for m in per),
        queue_delay_ms=dist(queue_delay_ms(r) for r in measured),
        connect_wait_ms=_connect_waits(done, percentiles),
    )


def _connect_waits(done: Sequence[RequestRecord], percentiles: Sequence[float]) -> Distribution | None:
    """The summary's ``connect_wait_ms``: every completed measured request's that
    measured one (as TTFT, of which it is part: a refused connection's attempts are
    failures, counted by kind), None unless one of them waited at all."""
    waits = _present(connect_wait_ms(r) for r in done)
    return distribution(waits, percentiles) if any(waits) else None


def with_percentiles(summary: Summary, records: Sequence[RequestRecord], percentiles: Sequence[float]) -> Summary:
    """``summary`` with ``percentiles`` added to every distribution, computed from the
    ``records`` it summarizes (the same records give the same fixed values, so only the
    added percentiles are new). For a summary made without them, e.g. by ``run``, which
    takes no percentiles: ``--metric-percentiles`` adds them after the run."""
    measured = [r for r in records if not r.warmup]
    done = [r for r in measured if r.ok]
    per = [request_metrics(r) for r in done]
    return dataclasses.replace(
        summary, **_distributions(measured, done, per, percentiles),
        server_timeline=server_comparison(done, per, percentiles),
        gateway=gateway_block(measured, summary.config, percentiles),
    )


def _known_sum(values: Sequence[int | None]) -> int | None:
    """The sum of the values the server reported; ``None`` when it reported none (unknown
    is not zero)."""
    known = [v for v in values if v is not None]
    return sum(known) if known or not values else None


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
    done: Sequence[RequestRecord], metrics: Sequence[RequestMetrics] | None = None,
    percentiles: Sequence[float] = (),
) -> ServerTimeline | None:
    """Client TTFT against the server's own (from the sim's timeline extension), with
    ``percentiles`` beyond the fixed ones; ``None`` when the server sends no timeline."""
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
        # (the server's clock starts when it received the request: after the connection)
        error.append(m.ttft_ms - (connect_wait_ms(r) or 0.0) - float(tl["first_token_ms"]))
        if tl.get("scheduled_ms") is not None:  # (the engine's: a gateway's wait apart)
            queued.append(float(tl["scheduled_ms"]) - float(tl.get("gateway_queue_ms") or 0.0))
    server, err = distribution(server_ttft, percentiles), distribution(error, percentiles)
    if server is None or err is None:
        return None
    return ServerTimeline(len(server_ttft), server, err, distribution(queued, percentiles))


def _error_examples(failed: Sequence[RequestRecord]) -> dict[str, str]:
    examples: dict[str, str] = {}
    for r in failed:
        if r.error_kind and r.error_kind.value not in examples:
            examples[r.error_kind.value] = r.error or ""
    return examples


def _warnings(
    config: dict[str, Any],
    completed_rps: float | None,
    queue_delay: Distribution | None,
    token_source: str,
    done: Sequence[RequestRecord],
    measured: Sequence[RequestRecord],
    interrupted: bool,
    gone: Sequence[RequestRecord] = (),
) -> list[str]:
    """Plain-language caveats about how far the numbers can be trusted. ``done``: the
    measured requests that completed; ``measured``: all measured requests (for the
    offered rate); ``gone``: the final streak of failures that stopped the run once the
    server stopped answering (``server_gone_streak``), said apart from the rest."""
    out: list[str] = []
    overload = overload_warning(config, completed_rps, done, measured)
    if overload:
        out.append(overload)
    schedule = (config.get("load") or {}).get("schedule") or {}
    cap = schedule.get("max_concurrency")
    if queue_delay is not None and queue_delay.p99 > LATE_THRESHOLD_MS:
        qd = queue_delay
        if schedule.get("kind") == "ClosedLoop" or any(r.session is not None for r in measured):
            # no schedule to fall behind: a user's next request is due when it is free
            e2es = [m for m in (request_metrics(r).e2e_ms for r in done) if m is not None]
            e2e = statistics.median(e2es) if e2es else 0.0
            if not e2e or qd.p99 > CLOSED_LOOP_LATE_SHARE * e2e:
                share = f" ({qd.p99 / e2e:.0%} of the E2E p50)" if e2e else ""
                out.append(
                    f"the client was slow to send: requests left p99 {qd.p99:.1f} ms{share} (max "
                    f"{qd.max:.1f} ms) after their user was ready; the client may be the "
                    "bottleneck, and its delay is in no latency above"
                )
        elif cap:
            out.append(
                f"requests waited for one of the {cap} --max-concurrency slots: p99 queue delay "
                f"{qd.p99:.1f} ms (max {qd.max:.1f} ms); the cap set the offered load"
            )
        else:
            out.append(
                f"the client fell behind its schedule: p99 queue delay {qd.p99:.1f} ms "
                f"(max {qd.max:.1f} ms); the offered load was lower than asked"
            )
    connect = _connect_warning(done, schedule)
    if connect:
        out.append(connect)
    streak = {id(r) for r in gone}
    before = [r for r in measured if id(r) not in streak]
    failures = _failure_warning(before)
    if failures is not None:
        many, line = failures
        # (a share past FAILED_SHARE first: every number above describes the rest alone)
        out.insert(0 if many else len(out), line)
    if gone:  # (first: the run before it is what the rest says of)
        out.insert(0, _gone_line(gone, before, failures is None))
    bound = _bound_note(config, measured, interrupted)
    if bound:
        out.append(bound)
    if config.get("api") == "completions" and done and all(r.requested_output_tokens is None for r in done):
        lengths = [r.output_tokens for r in done if r.output_tokens is not None]
        said = f" ({statistics.median(lengths):g} tokens median here)" if lengths else ""
        out.append(f"completions requests carried no max_tokens (no --output-tokens): the server chose the answers' "
                   f"lengths{said}; vLLM's default, and the simulated server's, is at most 16 tokens; give "
                   "--output-tokens N for another length")
    if done and not token_source.startswith(("server usage", "the engine")):
        out.append(f"token counts: {token_source}")
    for what, values in (("input", [r.input_tokens for r in done]), ("cached", [r.cached_tokens for r in done])):
        known = sum(v is not None for v in values)
        if 0 < known < len(values):
            out.append(f"{what} tokens are known for {known} of {len(values)} completed requests: the sum counts those alone")
    # a "length" finish short of max_tokens is a length limit of the server's (its context,
    # a llama.cpp slot's, or its own cap on max_tokens), not end-of-sequence, with or
    # without --exact-output: vLLM quietly lowers max_tokens to what the context has left
    cut = [r for r in done
           if r.finish_reason == "length" and r.requested_output_tokens is not None
           and r.output_tokens is not None and r.output_tokens < r.requested_output_tokens]
    if cut:
        longest = max((r.input_tokens or 0) + (r.output_tokens or 0) for r in cut)
        got = statistics.median(r.output_tokens or 0 for r in cut)
        asked = statistics.median(r.requested_output_tokens or 0 for r in cut)
        out.append(
            f"{len(cut)} of {len(done)} requests {LENGTH_CUT} (finish_reason length; median {got:,g} received of {asked:,g} requested; prompt and answer up to "
            f"{longest:,} tokens): the server's context, or its own limit, cut them; ask for shorter prompts or "
            "answers, or a larger context"
        )
    # (--no-exact-output asked for no exact length: a server stopping at end-of-sequence
    # before max_tokens is what was asked)
    exact = (config.get("workload") or {}).get("exact_output", True) is not False
    cut_ids = {id(r) for r in cut}
    rest = [
        r for r in done
        if exact
        and r.requested_output_tokens is not None
        and r.output_tokens is not None
        and r.output_tokens != r.requested_output_tokens
        and id(r) not in cut_ids
    ]
    if rest:
        out.append(
            f"{len(rest)} of {len(done)} requests did not generate exactly the requested "
            "output tokens (the server may ignore ignore_eos/min_tokens)"
        )
    hits = sum(1 for r in done if r.response_cache_hit)
    if hits:
        out.append(
            f"{response_cache_share(hits, len(done))} (a response header said hit): their TTFT, E2E and tokens/s are "
            "the cache's, not the engine's; identical deterministic requests hit it (temperature 0 or a fixed seed, "
            "with the same prompt: --seed reuses a run's prompts)"
        )
    if interrupted:
        out.append("the run was interrupted: the summary covers what completed")
    return out


#: The share of TTFT (summed over completed requests) the wait for new connections took
#: at or above which the summary says the server was slow to accept them.
CONNECT_SHARE = 0.1
#: The share of measured requests failed above which the summary's warning of them
#: comes first.
FAILED_SHARE = 0.05


def _connect_warning(done: Sequence[RequestRecord], schedule: Mapping[str, Any]) -> str | None:
    """A warning when the wait for new connections to the server was a material share
    (``CONNECT_SHARE``) of the completed requests' TTFT (E2E without one): the server's
    time, in the latencies, not the client's."""
    waits, spans = [], []
    for r in done:
        wait, m = connect_wait_ms(r), request_metrics(r)
        span = m.ttft_ms if m.ttft_ms is not None else m.e2e_ms
        if wait is not None and span is not None:
            waits.append(wait)
            spans.append(span)
    waited = [w for w in waits if w > 0]
    if not waited or sum(spans) <= 0 or sum(waits) < CONNECT_SHARE * sum(spans):
        return None
    d = distribution(waited)
    assert d is not None
    hint = ""
    if schedule.get("kind") == "OpenLoop" and not schedule.get("max_concurrency"):
        hint = ("; an open loop without --max-concurrency opens one connection before the run and the rest as its "
                "requests need them")
    return (
        f"the server was slow to accept connections: {len(waited):,} of {len(waits):,} completed requests waited for "
        f"a new one, p50 {d.p50:,.1f} ms, p99 {d.p99:,.1f} ms ({sum(waits) / sum(spans):.0%} of their summed TTFT); "
        f"in TTFT and E2E, as a user waits for it, and not in queue_delay_ms: the server's or the network's time, "
        f"not the client's (connect_wait_ms){hint}"
    )


def _failure_warning(measured: Sequence[RequestRecord]) -> tuple[bool, str] | None:
    """Whether more than ``FAILED_SHARE`` of the measured requests failed, and the
    warning that says how many and of which kinds; None when none failed."""
    kinds = Counter(r.error_kind.value for r in measured if r.error_kind not in (None, ErrorKind.CANCELLED))
    failed = sum(kinds.values())
    if not failed:
        return None
    by_kind = ", ".join(f"{n:,} {kind}" for kind, n in kinds.most_common())
    many = failed > FAILED_SHARE * len(measured)
    said = f"{failed:,} of {len(measured):,} measured requests failed ({by_kind}"
    if many:
        return True, (f"{math.floor(100 * failed / len(measured))}% of the requests failed: {said}): every latency and rate above is "
                      "of the requests that completed alone, and the server did not serve the load asked")
    return False, f"{said}): the latencies are of the requests that completed"


def server_gone_streak(measured: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The final streak of failures for want of a connection (``unanswered``) of a run
    the server stopped answering: the measured requests sent after the last that got an
    answer that failed so, in the order they were sent (as the executor's stop rule
    counts them: a timeout or a cancel neither counts nor ends the streak)."""
    sent = sorted((r for r in measured if r.send_ns is not None), key=lambda r: (r.send_ns or 0, r.index))
    streak: list[RequestRecord] = []
    for r in reversed(sent):
        if unanswered(r) is not None:
            streak.append(r)
        elif r.status is not None:
            break
    return streak[::-1]


def _gone_line(gone: Sequence[RequestRecord], before: Sequence[RequestRecord], none_before: bool) -> str:
    """The final streak of failures (``server_gone_streak``) in words, apart from the
    measured requests ``before`` it: its users re-sent at once, so its count is theirs,
    not the load's."""
    kinds = Counter(r.error_kind.value for r in gone if r.error_kind is not None)
    by_kind = ", ".join(f"{n:,} {kind}" for kind, n in kinds.most_common())
    span = ((gone[-1].send_ns or 0) - (gone[0].send_ns or 0)) / NS_PER_S
    before = [r for r in before if r.error_kind is not ErrorKind.CANCELLED]
    failed = sum(1 for r in before if not r.ok)
    rest = (f"before that, {failed:,} of {len(before):,} failed" + (" (the warning below says of which kinds)" if not none_before else ""))
    return (f"{len(gone):,} requests failed for want of a connection ({by_kind}) in the last {span:.1f} s, after the "
            f"server stopped answering (each user or slot sent its next at once, as vLLM's bench does, until the run "
            f"stopped): not the load's failures; {rest}")


def _bound_note(config: Mapping[str, Any], measured: Sequence[RequestRecord], interrupted: bool) -> str | None:
    """Which bound ended a run given both ``-n`` and ``--duration`` (the first reached)."""
    load = config.get("load") or {}
    n, duration = load.get("num_requests"), load.get("duration_s")
    if n is None or duration is None or interrupted:
        return None
    if len(measured) < n:
        return f"stopped at --duration {duration:g} s after {len(measured):,} of the -n {n:,} requests"
    return f"stopped at -n {n:,}, within --duration {duration:g} s"


#: The summary's warning that the server served a run's prompts from a cache another run
#: (or client) filled (``load.run``'s unintended-cache warning): its TTFT is a cached prompt's.
FOREIGN_CACHE = "though this run's prompts share no prefix"
#: The summary's warning that the server's context or limit cut answers short.
LENGTH_CUT = "stopped at a length limit short of the requested output tokens"


def foreign_cache(warnings: Sequence[str]) -> list[str]:
    """The summary ``warnings`` that say the server served the run's prompts from a cache
    an earlier run filled, in a few words each."""
    return [w.split(", " + FOREIGN_CACHE)[0] + " filled by an earlier run" for w in warnings if FOREIGN_CACHE in w]


def client_bottleneck(client: ClientLoad | Omitted | None) -> list[str]:
    """That the client was likely the bottleneck (its latencies inflated by its own
    delay), in words; empty where it was not, or no verdict."""
    if not isinstance(client, ClientLoad) or not client.bottleneck:
        return []
    added = client.inflation_ms[0] if client.inflation_ms else 0.0
    return [f"the client was likely the bottleneck (its latencies inflated by about {added:,.1f} ms at p50)"]


def unfit_to_compare(summary: Mapping[str, Any]) -> list[str]:
    """What a run's own summary (``summary.json`` as read) warns makes its numbers unfit to
    set against another run's, in words: prompts served from a cache an earlier run
    filled (a cached prompt's TTFT), the client as the likely bottleneck (its delay in
    the latencies), answers cut short by the server's context or limit (fewer tokens to
    decode than asked). Empty for none."""
    warnings = [w for w in summary.get("warnings") or () if isinstance(w, str)]
    try:
        client = _client(summary.get("client", OMITTED))
    except (KeyError, TypeError, ValueError):  # (a hand-edited or partial block: no verdict)
        client = None
    cut = [w.split(" (finish_reason")[0] for w in warnings if LENGTH_CUT in w]
    return [*foreign_cache(warnings), *client_bottleneck(client), *cut]


#: How the warning of an open loop that outran the server begins.
OVERLOAD = "the server could not keep up"


def _trend(values: Sequence[float]) -> float:
    """How steadily ``values`` rise in their order: the rank correlation (Spearman's,
    ties at their mean rank) of each value with its position, from −1 to 1."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    if len(set(ranks)) < 2:
        return 0.0
    return statistics.correlation(ranks, [float(x) for x in range(len(values))])


def response_cache_share(hits: int, completed: int) -> str:
    """How many completed requests a response cache in front of the engine answered, in
    words (the summary's warning, and compare's and runs' note of it)."""
    return f"{hits:,} of {completed:,} completed requests were answered by a response cache in front of the engine"


def queue_bound(breakdown: LatencyBreakdown | None, step_ms: float | None) -> bool:
    """Closed loop: were more users waiting than the server runs at once, their time to
    first token the queue's? ``overload_warning``'s judgement for a loop whose sends follow
    its answers, whose queue therefore cannot grow through the run (it holds the users
    past the server's capacity, and every request waits there): the wait in the server's
    queue (the gateway's too, behind one) made the time to first token at least
    ``LATENCY_GROWTH`` times what the rest of it took, as an open loop's last requests
    must show over its first, and it lasted ``PLACE_WAIT_STEPS`` decode steps
    (``step_ms``: the TPOT) or more: a wait for a place in the batch, not the few steps
    an in-capacity loop waits too (the front end's milliseconds, the step in flight and
    the one scheduled ahead), which outweigh a short prompt's prefill. Means of the
    breakdown's parts; False without them."""
    b = breakdown
    if b is None or b.server_queue_ms is None or b.prefill_ms is None or not step_ms:
        return False
    queued = b.server_queue_ms.mean + (b.gateway_queue_ms.mean if b.gateway_queue_ms is not None else 0.0)
    grew = queued + b.prefill_ms.mean >= LATENCY_GROWTH * b.prefill_ms.mean
    return grew and queued >= PLACE_WAIT_STEPS * step_ms


def overload_warning(
    config: dict[str, Any],
    completed_rps: float | None,
    done: Sequence[RequestRecord],
    measured: Sequence[RequestRecord],
) -> str | None:
    """Open loop: did completions fall behind the offered rate while queues grew?

    Offered rate: (n − 1) / (last intended send − first intended send) over ``measured``
    (the intended times must be spread out); completion rate: ``completed_rps``. A short
    run understates the latter (its last requests' latency counts in the duration), hence
    the second condition. A warning when completions < ``KEEP_UP_RATIO`` × offered and
    the median TTFT (E2E if there is no TTFT) of the last requests by send time (a tenth
    of them, at least ``OVERLOAD_PART``) is at least ``LATENCY_GROWTH`` times that of as
    many first ones, rising through the run (``_trend`` at least ``OVERLOAD_TREND``: one
    burst near the end of a short run is no growing queue), by at least
    ``OVERLOAD_WAIT_SHARE`` of the time the sends spanned (a queue's growth, not a busier
    engine's). ``None`` for closed loops and
    sessions (each send follows a completion there, so they cannot outrun the server)."""
    load = config.get("load") or {}
    if (load.get("schedule") or {}).get("kind") == "ClosedLoop" or any(r.session is not None for r in measured):
        return None
    intended = sorted(r.intended_send_ns for r in measured if r.intended_send_ns is not None)
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
    part = max(OVERLOAD_PART, len(values) // 10)
    if len(values) < 2 * part:
        return None
    first = statistics.median(values[:part])
    last = statistics.median(values[-part:])
    if last < LATENCY_GROWTH * first or _trend(values) < OVERLOAD_TREND:
        return None
    if last - first < OVERLOAD_WAIT_SHARE * (intended[-1] - intended[0]) / NS_PER_MS:
        return None
    return (
        f"{OVERLOAD}: offered {offered_rps:.1f} req/s, completed "
        f"{completed_rps:.1f} req/s; queues grew through the run ({label} median "
        f"{first:,.0f} ms over the first {part} requests, {last:,.0f} ms over the last {part})"
    )
