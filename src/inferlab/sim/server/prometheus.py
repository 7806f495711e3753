"""Prometheus text exposition for the simulated server, with vLLM's metric names, types
and buckets, so dashboards and tools made for vLLM read the simulator unchanged; with
``--engine-family sglang``, SGLang's (``render_sglang_metrics``)."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from typing import Protocol

from inferlab.results.telemetry import EMIT_LAG
from inferlab.sim.engine.engine import RequestTimeline

#: vLLM's buckets (``vllm/v1/metrics/loggers.py``), in seconds or tokens.
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
TOKEN_LATENCY_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)
REQUEST_LATENCY_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def buckets_1_2_5(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, … up to ``max_value`` (vLLM's token-count buckets)."""
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return out
            out.append(m * scale)
        scale *= 10


def escape_label(value: str) -> str:
    """A label value as the text format writes it: backslash, double quote and newline
    escaped (a served model name with a quote in it must not break the page)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def label_text(labels: Mapping[str, str], *, by_name: bool = True) -> str:
    """The inside of a sample's braces: ``name="value"`` pairs, values escaped; by name
    (vLLM's page) or, ``by_name`` false, in the mapping's order (prometheus_client's: the
    order the metric declared its label names, as SGLang's page shows them)."""
    items = sorted(labels.items()) if by_name else labels.items()
    return ",".join(f'{k}="{escape_label(v)}"' for k, v in items)


class Histogram:
    """Cumulative-bucket histogram (Prometheus semantics) of seconds or counts."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = list(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value_s: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value_s)] += 1
        self.sum += value_s
        self.count += 1

    def lines(self, name: str, labels: Mapping[str, str], help_text: str, *, sglang: bool = False) -> list[str]:
        """The histogram's page lines: as the simulated vLLM writes them (labels by name,
        bounds as ``1``) or, ``sglang``, as prometheus_client writes SGLang's (labels in
        their declared order, bounds as ``1.0``)."""
        def text(extra: Mapping[str, str]) -> str:
            return label_text({**labels, **extra}, by_name=not sglang)

        out = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        cumulative = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            cumulative += n
            out.append(f"{name}_bucket{{{text({'le': repr(float(bound)) if sglang else f'{bound:g}'})}}} {cumulative}")
        out.append(f"{name}_bucket{{{text({'le': '+Inf'})}}} {self.count}")
        out.append(f"{name}_sum{{{text({})}}} {self.sum:.9g}")
        out.append(f"{name}_count{{{text({})}}} {self.count}")
        return out


class EngineGauges(Protocol):
    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def kv_usage(self) -> float: ...
    @property
    def prefix_queries_tokens(self) -> int: ...
    @property
    def prefix_hits_tokens(self) -> int: ...
    @property
    def preemptions_total(self) -> int: ...
    @property
    def prompt_tokens_total(self) -> int: ...
    @property
    def generation_tokens_total(self) -> int: ...


class RequestHistograms:
    """vLLM's histograms of finished requests, each observed once per request (the
    inter-token latency once per token after the first), from the engine's timeline."""

    def __init__(self, max_model_len: int) -> None:
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS_S)
        self.itl = Histogram(TOKEN_LATENCY_BUCKETS_S)
        self.tpot = Histogram(TOKEN_LATENCY_BUCKETS_S)
        self.queue = Histogram(REQUEST_LATENCY_BUCKETS_S)
        self.prefill = Histogram(REQUEST_LATENCY_BUCKETS_S)
        self.decode = Histogram(REQUEST_LATENCY_BUCKETS_S)
        self.inference = Histogram(REQUEST_LATENCY_BUCKETS_S)
        self.prompt_tokens = Histogram(buckets_1_2_5(max_model_len))
        self.generation_tokens = Histogram(buckets_1_2_5(max_model_len))
        self.max_tokens = Histogram(buckets_1_2_5(max_model_len))

    def observe(self, tl: RequestTimeline, received_s: float, ready_s: float, max_tokens: int | None) -> None:
        """A finished request: its timeline (with its token times), when the server
        received it and when the engine could first schedule it (after the API's cost:
        vLLM's queue time starts when its engine gets the request), all in seconds on the
        engine's clock; the ``max_tokens`` it asked for, if any."""
        if tl.first_token_s is None or tl.finished_s is None or tl.scheduled_s is None:
            return
        self.ttft.observe(tl.first_token_s - received_s)
        self.e2e.observe(tl.finished_s - received_s)
        times = tl.token_times_s
        for before, after in itertools.pairwise(times):
            self.itl.observe(after - before)
        decode_s = tl.finished_s - tl.first_token_s
        self.tpot.observe(decode_s / (tl.output_tokens - 1) if tl.output_tokens > 1 else 0.0)
        self.queue.observe(max(0.0, tl.scheduled_s - ready_s))
        self.prefill.observe(tl.first_token_s - tl.scheduled_s)
        self.decode.observe(decode_s)
        self.inference.observe(tl.finished_s - tl.scheduled_s)
        self.prompt_tokens.observe(tl.prompt_tokens)
        self.generation_tokens.observe(tl.output_tokens)
        if max_tokens is not None:
            self.max_tokens.observe(max_tokens)

    def lines(self, labels: Mapping[str, str]) -> list[str]:
        out: list[str] = []
        for hist, name, help_text in (
            (self.ttft, "vllm:time_to_first_token_seconds", "Time to first token, engine view."),
            (self.e2e, "vllm:e2e_request_latency_seconds", "End-to-end latency, engine view."),
            (self.itl, "vllm:inter_token_latency_seconds", "Inter-token latency."),
            # vLLM's name for the same observations before 0.11 (hidden since 0.12)
            (self.itl, "vllm:time_per_output_token_seconds", "Time per output token (older name of vllm:inter_token_latency_seconds)."),
            (self.tpot, "vllm:request_time_per_output_token_seconds", "Per request: decode time over its output tokens after the first."),
            (self.queue, "vllm:request_queue_time_seconds", "Time spent in the WAITING phase."),
            (self.prefill, "vllm:request_prefill_time_seconds", "Time spent in the PREFILL phase."),
            (self.decode, "vllm:request_decode_time_seconds", "Time spent in the DECODE phase."),
            (self.inference, "vllm:request_inference_time_seconds", "Time spent in the RUNNING phase."),
            (self.prompt_tokens, "vllm:request_prompt_tokens", "Prompt tokens per request."),
            (self.generation_tokens, "vllm:request_generation_tokens", "Generated tokens per request."),
            (self.max_tokens, "vllm:request_params_max_tokens", "The max_tokens request parameter."),
        ):
            out += hist.lines(name, labels, help_text)
        return out


#: vLLM's ``finished_reason`` labels of ``vllm:request_success_total``, in its order: each
#: is shown, at 0 until a request ends so (the simulated model never errs or repeats
#: itself; ``abort``: the client went away first).
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


def render_metrics(
    model: str,
    engine: EngineGauges,
    requests: RequestHistograms,
    iteration_tokens: Histogram,
    lag: Histogram,
    finished: Mapping[str, int],
) -> str:
    """The ``/metrics`` page: the engine's gauges and counters, the requests ended by
    each ``finished`` reason (``FINISHED_REASONS``), the request histograms, the tokens
    per engine step, and inferlab's own lag of the engine loop. Every sample is labelled
    as vLLM V1 labels its engine's: ``model_name`` (the served name) and ``engine``
    (its index; one engine here)."""
    labels = {"engine": "0", "model_name": model}
    plain = label_text(labels)
    lines: list[str] = []

    def metric(name: str, kind: str, value: float, help_text: str) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name}{{{plain}}} {value:.9g}")

    metric("vllm:num_requests_running", "gauge", engine.num_running, "Requests in the running batch.")
    metric("vllm:num_requests_waiting", "gauge", engine.num_waiting, "Requests waiting to be scheduled.")
    metric("vllm:kv_cache_usage_perc", "gauge", engine.kv_usage, "KV-cache usage, 0 to 1.")
    metric("vllm:gpu_cache_usage_perc", "gauge", engine.kv_usage, "KV-cache usage, 0 to 1 (older name).")
    metric("vllm:prefix_cache_queries_total", "counter", engine.prefix_queries_tokens, "Prompt tokens looked up in the prefix cache.")
    metric("vllm:prefix_cache_hits_total", "counter", engine.prefix_hits_tokens, "Prompt tokens found in the prefix cache.")
    metric("vllm:num_preemptions_total", "counter", engine.preemptions_total, "Preemptions (recompute).")
    metric("vllm:prompt_tokens_total", "counter", engine.prompt_tokens_total, "Prefill tokens processed.")
    metric("vllm:generation_tokens_total", "counter", engine.generation_tokens_total, "Tokens generated.")
    name = "vllm:request_success_total"
    lines += [f"# HELP {name} Requests finished, by finish reason.", f"# TYPE {name} counter"]
    lines += [f"{name}{{{label_text({**labels, 'finished_reason': reason})}}} {finished.get(reason, 0)}"
              for reason in FINISHED_REASONS]
    lines += requests.lines(labels)
    lines += iteration_tokens.lines("vllm:iteration_tokens_total", labels, "Tokens per engine step.")
    lines += lag.lines(
        EMIT_LAG, labels,
        "How late each step's tokens left the engine loop, wall time versus simulated time.",
    )
    return "\n".join(lines) + "\n"


# -- SGLang's page (--engine-family sglang) -------------------------------------------
# Names, types, label names and default buckets as SGLang 0.5.11 defines them
# (python/sglang/srt/observability/metrics_collector.py: SchedulerMetricsCollector,
# TokenizerMetricsCollector; 0.4.6's python/sglang/srt/metrics/collector.py has the same
# names, with fewer labels and shorter TTFT/E2E buckets and no queue-time histogram).
SGLANG_TTFT_BUCKETS_S = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
SGLANG_ITL_BUCKETS_S = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
    0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)
SGLANG_E2E_BUCKETS_S = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400,
)
SGLANG_QUEUE_BUCKETS_S = (
    0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200, 300, 400, 500,
    600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000,
)


class SGLangRequests:
    """SGLang's per-request observations of finished requests: its tokenizer's TTFT,
    inter-token latency and end-to-end histograms and token counters, and its scheduler's
    queue time (from entering the waiting queue to the first schedule)."""

    def __init__(self) -> None:
        self.ttft = Histogram(SGLANG_TTFT_BUCKETS_S)
        self.itl = Histogram(SGLANG_ITL_BUCKETS_S)
        self.e2e = Histogram(SGLANG_E2E_BUCKETS_S)
        self.queue = Histogram(SGLANG_QUEUE_BUCKETS_S)
        self.prompt_tokens = 0  # every prompt token, cached ones included (SGLang's len(origin_input_ids))
        self.generation_tokens = 0
        self.cached_tokens = 0
        self.finished = 0

    def observe(self, tl: RequestTimeline, received_s: float, ready_s: float, max_tokens: int | None) -> None:
        """A finished request, as ``RequestHistograms.observe`` takes it (``max_tokens``:
        SGLang has no histogram of it)."""
        if tl.first_token_s is None or tl.finished_s is None or tl.scheduled_s is None:
            return
        self.ttft.observe(tl.first_token_s - received_s)
        self.e2e.observe(tl.finished_s - received_s)
        for before, after in itertools.pairwise(tl.token_times_s):
            self.itl.observe(after - before)
        self.queue.observe(max(0.0, tl.scheduled_s - ready_s))
        self.prompt_tokens += tl.prompt_tokens
        self.generation_tokens += tl.output_tokens
        self.cached_tokens += tl.cached_tokens
        self.finished += 1


def render_sglang_metrics(
    model: str, engine: EngineGauges, requests: SGLangRequests, cache_hit_rate: float, lag: Histogram, aborted: int,
) -> str:
    """SGLang's ``/metrics`` page for the simulated engine: its scheduler's gauges
    (``cache_hit_rate``: the last prefill batch's, as SGLang's), its tokenizer's counters
    and histograms, the requests aborted, and inferlab's own lag of the engine loop.
    Labels as SGLang's (no ``--enable-priority-scheduling``, no DP or extra labels): the
    scheduler's ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank``,
    the tokenizer's ``model_name``, ``engine_type``. ``sglang:cached_tokens_total``
    (labelled ``cache_source``: the GPU's radix cache is ``device``) appears once a request
    had cached tokens, as SGLang's: it never counts a 0; likewise
    ``sglang:num_retracted_requests_total`` from the first retraction (a preemption). The other samples show from the
    start (SGLang's, from its first batch or request). Not shown: what the simulator does not
    model or count as SGLang does (``gen_throughput``, ``num_used_tokens``, speculative,
    grammar, disaggregation, HiCache and per-stage metrics, the token-count histograms)."""
    scheduler = {"model_name": model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
    tokenizer = {"model_name": model, "engine_type": "unified"}
    lines: list[str] = []

    def metric(name: str, kind: str, value: float, help_text: str, labels: Mapping[str, str], lazy: bool = False) -> None:
        family = name.removesuffix("_total") if kind == "counter" else name  # (prometheus_client's family name)
        lines.append(f"# HELP {family} {help_text}")
        lines.append(f"# TYPE {family} {kind}")
        if value or not lazy:
            lines.append(f"{name}{{{label_text(labels, by_name=False)}}} {float(value)!r}")

    metric("sglang:num_running_reqs", "gauge", engine.num_running, "The number of running requests.", scheduler)
    metric("sglang:num_queue_reqs", "gauge", engine.num_waiting, "The number of requests in the waiting queue.", scheduler)
    metric("sglang:cache_hit_rate", "gauge", cache_hit_rate, "The prefix cache hit rate.", scheduler)
    metric("sglang:token_usage", "gauge", engine.kv_usage, "The token usage.", scheduler)
    # (its scheduler counts each request it retracts when the KV cache runs short, as the
    # simulator counts a preemption; no sample before the first)
    metric("sglang:num_retracted_requests_total", "counter", engine.preemptions_total,
           "Total number of retracted requests.", scheduler, lazy=True)
    metric("sglang:prompt_tokens_total", "counter", requests.prompt_tokens, "Number of prefill tokens processed.", tokenizer)
    metric("sglang:generation_tokens_total", "counter", requests.generation_tokens,
           "Number of generation tokens processed.", tokenizer)
    metric("sglang:cached_tokens_total", "counter", requests.cached_tokens,
           "Number of cached prompt tokens by source (device/host/storage).", {**tokenizer, "cache_source": "device"},
           lazy=True)
    metric("sglang:num_requests_total", "counter", requests.finished, "Number of requests processed.", tokenizer)
    metric("sglang:num_aborted_requests_total", "counter", aborted, "Number of requests aborted.", tokenizer)
    for hist, name, help_text, labels in (
        (requests.queue, "sglang:queue_time_seconds", "Histogram of queueing time in seconds.", scheduler),
        (requests.ttft, "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", tokenizer),
        (requests.itl, "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", tokenizer),
        (requests.e2e, "sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", tokenizer),
    ):
        lines += hist.lines(name, labels, help_text, sglang=True)
    lines += lag.lines(
        EMIT_LAG, tokenizer,
        "How late each step's tokens left the engine loop, wall time versus simulated time.", sglang=True,
    )
    return "\n".join(lines) + "\n"
