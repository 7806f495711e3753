"""A run in other tools' formats: the result file of ``vllm bench serve --save-result``
(``--save-detailed``: its per-request lists too), and CSV, of the summary (one row per
metric) or of the requests (one row per request, its derived metrics beside its raw
times). Pure functions of a ``Summary`` and its records; the caller writes the text.

vLLM's result follows vLLM's definitions (vllm/benchmarks/serve.py: ``benchmark``,
``calculate_metrics``, ``main_async``), not inferlab's, so that its numbers are those
``vllm bench serve`` would have printed for the same token times:

- ``duration`` runs from the first send until every request has returned, failed ones
  included (a failed one when the client gave up on it), and every throughput divides
  by it; inferlab's own ``duration_s`` ends at the last completed request.
- E2EL runs to the last content chunk (inferlab's ``e2e`` to the end of the stream),
  TPOT is (E2EL − TTFT) / (output tokens − 1), ITL is every gap between content chunks
  (as inferlab's ``itl``).
- ``queue_times`` is vLLM's ``client_queue_time``: from a request's arrival to when a
  ``--max-concurrency`` slot let it go. A closed loop is written as vLLM's rate inf with
  ``--max-concurrency N``, where every request arrives at the start: its queue time is
  its send − the first measured send. Any other load: its send − its intended send.
- ``max_concurrent_requests`` is the most completed requests in flight at one instant,
  as vLLM's current main computes it (``_vllm_peak_concurrency``).
- A failed request is in the lists with what it received before it failed (its TTFT
  and ITLs), latency 0.0, 0 output tokens and its error; the statistics count completed
  requests only. Per-request lists are in seconds, the statistics in ms, and an empty
  metric is 0.0.
- Chunks: vLLM's client counts every chunk whose ``choices`` is not empty (a role-only
  chunk, one with empty text), inferlab's client only chunks that carry content. Against
  a vLLM server the chat API's role chunk comes with the first token, so TTFT agrees;
  what differs is one more ITL of about 0 per request in vLLM's numbers, and a gap that
  vLLM splits in two where the server held text back (an incomplete UTF-8 character)
  and sent a chunk with empty text, which inferlab sees as one gap.
- A run without streaming (``--no-stream``) is refused: ``vllm bench serve`` always
  streams, and without it a request has no TTFT or ITL and its TPOT holds queueing and
  prefill.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferlab._errors import UsageError
from inferlab.results.metrics import (
    DISTRIBUTION_KEYS,
    NS_PER_MS,
    NS_PER_S,
    Distribution,
    connect_wait_ms,
    itl_ns,
    left_ns,
    output_token_count,
    peak_overlap,
    percentile,
    percentile_key,
    queue_delay_ms,
    request_metrics,
)
from inferlab.results.provenance import VIRTUAL
from inferlab.results.records import RequestRecord
from inferlab.results.summary import Summary

#: The metrics vLLM's result summarizes, as ``--percentile-metrics
#: ttft,tpot,itl,e2el,client_queue_time,e2el_including_client_queue`` would have it:
#: vLLM writes ``client_queue_time`` only with ``--max-concurrency``, and
#: ``e2el_including_client_queue`` only with ``--max-concurrency`` and a finite rate.
VLLM_METRICS = ("ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue")
#: vLLM's default ``--metric-percentiles``.
VLLM_PERCENTILES = (99.0,)
#: The per-request lists, in vLLM's order.
VLLM_REQUEST_KEYS = (
    "input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times",
    "generated_texts", "errors",
)
#: The lists only ``--save-detailed`` keeps (vLLM writes ``latencies`` and
#: ``queue_times`` without it too).
VLLM_DETAILED_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts", "errors")


@dataclass(frozen=True)
class _VllmRequest:
    """One request as vLLM's client records it (``RequestFuncOutput``): times in s from
    its send; a failed request keeps the TTFT and ITLs it received, and its latency is
    0.0, as vLLM leaves them. ``span_ns``: a completed request's send and last content
    chunk, in ns (None for a failed one)."""

    success: bool
    prompt_len: int
    output_len: int
    ttft_s: float
    itl_s: list[float]
    latency_s: float
    start_s: float
    queue_s: float
    error: str
    span_ns: tuple[int, int] | None


def _vllm_request(r: RequestRecord, queue_s: float) -> _VllmRequest:
    prompt_len = r.input_tokens if r.input_tokens is not None else (r.requested_input_tokens or 0)
    send = r.send_ns or 0
    start_s = send / NS_PER_S
    chunks = r.content_ns if r.send_ns is not None else []
    ttft_s = (chunks[0] - send) / NS_PER_S if chunks else 0.0
    itl_s = [gap / NS_PER_S for gap in itl_ns(chunks)]
    if not r.ok or r.send_ns is None:
        error = f"{r.error_kind.value}: {r.error or ''}" if r.error_kind else "no response"
        return _VllmRequest(False, prompt_len, 0, ttft_s, itl_s, 0.0, start_s, queue_s, error, None)
    # vLLM's latency ends at the last chunk carrying a token (a streamed response
    # without any: at its end, and its TTFT stays 0.0)
    last = chunks[-1] if chunks else (r.end_ns or send)
    return _VllmRequest(
        success=True,
        prompt_len=prompt_len,
        output_len=output_token_count(r) or 0,
        ttft_s=ttft_s,
        itl_s=itl_s,
        latency_s=(last - send) / NS_PER_S,
        start_s=start_s,
        queue_s=queue_s,
        error="",
        span_ns=(send, last),
    )


def _queue_times_s(measured: Sequence[RequestRecord], config: Mapping[str, Any]) -> list[float]:
    """vLLM's ``client_queue_time`` of each of ``measured``, in s: from its arrival to
    when a ``--max-concurrency`` slot let it go. A closed loop is vLLM's rate inf with
    ``--max-concurrency N`` (``_traffic``), where every request arrives at the start:
    its send − the first measured send (sessions run by ``-c N`` users are such a loop,
    so a turn's wait for the turn before it and its think time count as queueing, as
    they would for vLLM). Any other load: the wait after its intended send. 0.0 for a
    request never sent."""
    closed = ((config.get("load") or {}).get("schedule") or {}).get("kind") == "ClosedLoop"
    sends = [r.send_ns for r in measured if r.send_ns is not None]
    start = min(sends, default=0)
    out = []
    for r in measured:
        if r.send_ns is None:
            out.append(0.0)
        elif closed:
            out.append((r.send_ns - start) / NS_PER_S)
        else:
            out.append((queue_delay_ms(r) or 0.0) / 1e3)
    return out


def _vllm_duration_s(measured: Sequence[RequestRecord], config: Mapping[str, Any]) -> float:
    """vLLM's benchmark duration: from the first send until every request has returned,
    failed ones included (a failed one, which records no end, when the client gave up
    on it: ``left_ns``); 0.0 when nothing was sent."""
    sends = [r.send_ns for r in measured if r.send_ns is not None]
    gone = [t for r in measured if (t := left_ns(r, config)) is not None]
    return (max(gone) - min(sends)) / NS_PER_S if sends and gone else 0.0


def _traffic(config: dict[str, Any], records: Sequence[RequestRecord] = ()) -> tuple[float | str, float | str, int | None]:
    """``request_rate``, ``burstiness`` and ``max_concurrency`` as vLLM's flags would
    have been set for this load: a closed loop of N users is vLLM's rate inf with
    ``--max-concurrency N``, constant gaps are burstiness inf; a replay sent at its own
    times, which no vLLM flag says: its mean rate over the intended sends of ``records``
    (rate inf, which would say one burst, only where they were all at once); an infinite
    value is written ``"inf"``, as vLLM writes its rate."""
    schedule = (config.get("load") or {}).get("schedule") or {}
    kind = schedule.get("kind")
    if kind == "OpenLoop":
        rate = schedule.get("rate_rps")
        rate_out: float | str = "inf" if rate in ("inf", None) or (isinstance(rate, float) and math.isinf(rate)) else float(rate)
        arrival = schedule.get("arrival")
        burst: float | str = "inf" if arrival == "constant" else float(schedule.get("burstiness") or 1.0)
        return rate_out, burst, schedule.get("max_concurrency")
    if kind == "ClosedLoop":
        return "inf", 1.0, schedule.get("concurrency")
    sends = sorted(r.intended_send_ns for r in records if r.intended_send_ns is not None)
    if len(sends) > 1 and sends[-1] > sends[0]:
        return (len(sends) - 1) / ((sends[-1] - sends[0]) / 1e9), 1.0, schedule.get("max_concurrency")
    return "inf", 1.0, schedule.get("max_concurrency")


def _model(config: dict[str, Any]) -> str | None:
    """The model the run measured (a run against a server) or simulated (``sim run``)."""
    resolved = config.get("resolved") or {}
    engine = config.get("engine") or {}
    model = resolved.get("model") or engine.get("model") or config.get("model")
    return None if model is None else str(model)


def _stats(values: Sequence[float], percentiles: Sequence[float]) -> tuple[float, float, float, list[tuple[float, float]]]:
    """numpy's ``mean``, ``std``, ``median`` and ``percentile`` as vLLM calls them
    (``np.mean(values or 0)``: an empty list gives 0.0 everywhere)."""
    xs = sorted(values) if values else [0.0]
    n = len(xs)
    mean = math.fsum(xs) / n
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / n)
    return mean, std, percentile(xs, 50), [(q, percentile(xs, q)) for q in percentiles]


def vllm_percentile_word(q: float) -> str:
    """How vLLM writes a percentile in its keys: ``99`` for 99.0, ``99.9`` for 99.9."""
    return str(int(q)) if int(q) == q else str(q)


def vllm_result(
    summary: Summary,
    records: Iterable[RequestRecord],
    *,
    date: str,
    percentiles: Sequence[float] = VLLM_PERCENTILES,
    detailed: bool = True,
    source: str | None = None,
    metrics: Sequence[str] | None = None,
    bands: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The run as ``vllm bench serve --save-result`` writes it (with ``--save-detailed``
    when ``detailed``): vLLM's keys, types and units, its metrics computed its way from
    the measured (not warm-up) ``records`` in send order. ``date`` is vLLM's stamp
    (``%Y%m%d-%H%M%S``, when the run ended); ``percentiles`` are its
    ``--metric-percentiles`` (keys ``p99_ttft_ms``, ``p99.9_ttft_ms``); ``source``, when
    given, is kept as ``inferlab_source`` (as vLLM's ``--metadata`` keys are), so that a
    simulated run is not taken for a measurement. ``generated_texts`` are empty: inferlab
    keeps no generated text. ``metrics`` are its ``--percentile-metrics`` (``ttft``,
    ``e2el``, ...): only those get ``mean_``/``median_``/``std_``/``p`` keys; None, every
    one. ``bands`` (a prediction's, by headline key: ``sim.engine.bands.run_bands``) are
    kept as ``inferlab_error_bands``, by the vLLM key they hold for
    (``vllm_error_bands``). ``ValueError`` for a percentile outside 0–100;
    ``UsageError`` for a run without streaming (see the module doc)."""
    for q in percentiles:
        percentile_key(q)  # (checks the range)
    config = summary.config
    if config.get("stream") is False:
        raise UsageError(
            "--format vllm needs a streamed run (vllm bench serve always streams): this one ran with --no-stream, "
            "so it has no TTFT or ITL and its TPOT holds queueing and prefill; use --format csv-summary"
        )
    measured = sorted((r for r in records if not r.warmup), key=lambda r: r.index)
    queue_s = _queue_times_s(measured, config)
    reqs = [_vllm_request(r, q) for r, q in zip(measured, queue_s, strict=True)]
    ok = [q for q in reqs if q.success]
    rate, burstiness, max_concurrency = _traffic(config, measured)
    model = _model(config)
    workload = config.get("workload") or {}
    api = config.get("api")
    backend = "openai-chat" if api == "chat" else "openai"
    out: dict[str, Any] = {
        "date": date,
        "endpoint_type": backend,
        "backend": backend,
        "label": None,
        "model_id": model,
        "tokenizer_id": workload.get("tokenizer") or model,
        "num_prompts": len(measured),
    }
    if source is not None:
        out["inferlab_source"] = source
    out |= {"request_rate": rate, "burstiness": burstiness, "max_concurrency": max_concurrency}

    duration = _vllm_duration_s(measured, config)
    ttfts = [q.ttft_s for q in ok]
    e2els = [q.latency_s for q in ok]
    tpots = [(q.latency_s - q.ttft_s) / (q.output_len - 1) for q in ok if q.output_len > 1]
    itls = [gap for q in ok for gap in q.itl_s]
    total_input = sum(q.prompt_len for q in ok)
    total_output = sum(q.output_len for q in reqs)

    def per_s(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    out |= {
        "duration": duration,
        "completed": len(ok),
        "failed": len(reqs) - len(ok),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": per_s(len(ok)),
        "request_goodput": None if summary.slo is None else per_s(_vllm_good(ok, summary)),
        "output_throughput": per_s(total_output),
        "total_token_throughput": per_s(total_input + total_output),
    }
    lists: dict[str, list[Any]] = {
        "input_lens": [q.prompt_len for q in reqs],
        "output_lens": [q.output_len for q in reqs],
        "ttfts": [q.ttft_s for q in reqs],
        "itls": [q.itl_s for q in reqs],
        "latencies": [q.latency_s for q in reqs],
        "start_times": [q.start_s for q in reqs],
        "queue_times": [q.queue_s for q in reqs],
        "generated_texts": ["" for _ in reqs],
        "errors": [q.error for q in reqs],
    }
    out |= {k: lists[k] for k in VLLM_REQUEST_KEYS if detailed or k not in VLLM_DETAILED_KEYS}
    out |= {
        "max_output_tokens_per_s": _vllm_peak_tokens(ok),
        "max_concurrent_requests": _vllm_peak_concurrency(ok),
        "rtfx": 0.0,
    }
    stats = [("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)]
    if max_concurrency is not None:
        # (vLLM computes both from its per-request lists: every request, a failed one's
        # latency 0.0 included)
        stats.append(("client_queue_time", [q.queue_s for q in reqs]))
        if rate != "inf":
            stats.append(("e2el_including_client_queue", [q.latency_s + q.queue_s for q in reqs]))
    for name, values in stats:
        if metrics is not None and name not in metrics:
            continue
        mean, std, median, pcts = _stats(values, percentiles)
        out[f"mean_{name}_ms"] = mean * 1e3
        out[f"median_{name}_ms"] = median * 1e3
        out[f"std_{name}_ms"] = std * 1e3
        for q, v in pcts:
            out[f"p{vllm_percentile_word(q)}_{name}_ms"] = v * 1e3
    if bands is not None:
        out = _after(out, "inferlab_source", {"inferlab_error_bands": vllm_error_bands(out, bands)})
    return out


#: A vLLM result's key -> the headline metric (``results.sweepindex.headline``) whose
#: error band it carries: its throughputs, and the medians (p50s) and p99s of TTFT, TPOT
#: and E2EL (its means, std and other percentiles were never validated)
_VLLM_BAND_KEYS = {
    "request_throughput": "req_s", "output_throughput": "output_tok_s",
    **{f"{stat}_{vllm}_ms": f"{ours}_{p}_ms" for vllm, ours in (("ttft", "ttft"), ("tpot", "tpot"), ("e2el", "e2e"))
       for stat, p in (("median", "p50"), ("p50", "p50"), ("p99", "p99"))},
}


def vllm_error_bands(result: Mapping[str, Any], bands: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The error band of each of ``result``'s keys that has one (``_VLLM_BAND_KEYS``),
    as ``{"pct": 8.2, "text": "±8 % on the medians of …"}`` (pct null: not validated)."""
    return {key: {"pct": band.get("pct"), "text": band.get("text")}
            for key, ours in _VLLM_BAND_KEYS.items() if key in result and (band := bands.get(ours)) is not None}


def _after(d: dict[str, Any], key: str, more: dict[str, Any]) -> dict[str, Any]:
    """``d`` with ``more`` placed right after ``key`` (at the end without it)."""
    if key not in d:
        return d | more
    out: dict[str, Any] = {}
    for k, v in d.items():
        out[k] = v
        if k == key:
            out |= more
    return out


def _vllm_good(ok: Sequence[_VllmRequest], summary: Summary) -> int:
    """Requests within the summary's SLOs the way vLLM's ``--goodput`` counts them: its
    E2EL and TPOT, and a request of one output token meets any TPOT limit (TPOT 0)."""
    slo = summary.slo
    assert slo is not None
    good = 0
    for q in ok:
        tpot_ms = (q.latency_s - q.ttft_s) * 1e3 / (q.output_len - 1) if q.output_len > 1 else 0.0
        checks = ((slo.ttft_ms, q.ttft_s * 1e3), (slo.tpot_ms, tpot_ms), (slo.e2e_ms, q.latency_s * 1e3))
        good += all(limit is None or v <= limit for limit, v in checks)
    return good


def _vllm_peak_tokens(ok: Sequence[_VllmRequest]) -> float:
    """vLLM's ``max_output_tokens_per_s``: the most content chunks of completed requests
    in one whole second, counted from the first completed request's send."""
    if not ok:
        return 0.0
    t0 = min(q.start_s for q in ok)
    end = max(q.start_s + q.latency_s for q in ok)
    tokens = [0] * (math.ceil(end - t0) + 1)
    for q in ok:
        t = q.start_s + q.ttft_s
        for gap in (0.0, *q.itl_s):
            t += gap
            b = int(t - t0)
            if 0 <= b < len(tokens):
                tokens[b] += 1
    return float(max(tokens))


def _vllm_peak_concurrency(ok: Sequence[_VllmRequest]) -> int:
    """vLLM's ``max_concurrent_requests`` as its current main computes it (serve.py's
    ``calculate_metrics``): the most completed requests in flight at one instant, each
    from its send to its last content chunk, an end coming before a start at the same
    instant. vLLM's releases before that counted a request in every whole second it
    touched (vLLM issue #56653), which gave more than were ever in flight at once (18
    at ``--max-concurrency 8``); main's is the number that can be read against the cap.
    Counted here in ns, so that a request starting as another ends is never taken for
    an overlap by a rounding."""
    return peak_overlap(q.span_ns for q in ok if q.span_ns is not None)


def run_source(summary: Summary) -> str:
    """What made the run, for ``vllm_result``'s ``source``: a measurement (``inferlab
    bench``) or a prediction (``sim run``, or ``bench`` against inferlab's simulated
    server: ``results.provenance``)."""
    server = summary.server
    if server.kind == VIRTUAL:
        return "inferlab sim run (simulated in virtual time, not measured)"
    # (a gateway's access log: its clients' requests as the gateway saw them, not a bench)
    made = "inferlab gateway's access log" if "gateway" in summary.config else "inferlab bench"
    if server.simulated:
        return f"{made} against {server.where} (simulated, not measured)"
    return made


def vllm_result_filename(result: dict[str, Any]) -> str:
    """The name ``vllm bench serve --save-result`` gives its file:
    ``{backend}-{rate}qps[-concurrency{N}]-{model's last part}-{date}.json``."""
    rate = result["request_rate"]
    rate_text = "inf" if rate == "inf" else str(float(rate))
    cap = result.get("max_concurrency")
    model = str(result.get("model_id") or "model").split("/")[-1]
    return f"{result['backend']}-{rate_text}qps{f'-concurrency{cap}' if cap is not None else ''}-{model}-{result['date']}.json"


# --- CSV -------------------------------------------------------------------------------------

#: The summary's scalar rows: (key as in summary.json, unit).
_SCALARS = (
    ("counts.total", "requests"),
    ("counts.completed", "requests"),
    ("counts.failed", "requests"),
    ("counts.cancelled", "requests"),
    ("counts.warmup", "requests"),
    ("duration_s", "s"),
    ("request_throughput_rps", "req/s"),
    ("output_token_throughput_tps", "tok/s"),
    ("total_token_throughput_tps", "tok/s"),
    ("output_tpm", "tok/min"),
    ("total_tpm", "tok/min"),
    ("goodput_rps", "req/s"),
    ("input_tokens", "tokens"),
    ("output_tokens", "tokens"),
    ("cached_tokens", "tokens"),
)
#: The summary's distributions: (key, unit).
_DISTRIBUTIONS = (
    ("ttfb_ms", "ms"), ("ttft_ms", "ms"), ("e2e_ms", "ms"), ("tpot_ms", "ms"), ("itl_ms", "ms"),
    ("decode_tps", "tok/s"), ("queue_delay_ms", "ms"), ("connect_wait_ms", "ms"),
)


def _cell(v: object) -> object:
    """A CSV cell: empty for unknown (``None``), a float as Python writes it (shortest
    round trip), ``inf`` as ``inf``."""
    return "" if v is None else v


#: A summary CSV row -> the headline metrics whose error bands hold for its ``value``
#: (or ``p50``) and its ``p99`` (output tokens/min: output tokens/s × 60, the same
#: relative error)
_CSV_BAND_KEYS = {
    "request_throughput_rps": ("req_s", None), "output_token_throughput_tps": ("output_tok_s", None),
    "output_tpm": ("output_tok_s", None), "ttft_ms": ("ttft_p50_ms", "ttft_p99_ms"),
    "tpot_ms": ("tpot_p50_ms", "tpot_p99_ms"), "e2e_ms": ("e2e_p50_ms", "e2e_p99_ms"),
}
#: The summary CSV's error-band columns, after ``inferlab_source``.
CSV_BAND_COLUMNS = ("inferlab_error_band_pct", "inferlab_error_band_basis",
                    "inferlab_error_band_p99_pct", "inferlab_error_band_p99_basis")


def _csv_bands(key: str, bands: Mapping[str, Mapping[str, Any]] | None) -> list[object]:
    """The error-band cells of row ``key``: the band of its value (a distribution's p50)
    and of its p99, each its pct and text; empty where it has none."""
    cells: list[object] = []
    for ours in _CSV_BAND_KEYS.get(key, (None, None)):
        band = (bands or {}).get(ours) if ours else None
        cells += ["", ""] if band is None else [_cell(band.get("pct")), _cell(band.get("text"))]
    return cells


def summary_csv(summary: Summary, bands: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The summary as CSV, one row per metric: ``metric`` (its key in summary.json, a
    dotted path when nested), ``unit``, then ``value`` for a single number, or ``mean std
    min p50 p90 p95 p99 max`` and any added percentile (``p99_9``) for a distribution.
    An empty cell is unknown (null in the JSON). Every row ends with ``inferlab_source``
    (``run_source``: measured, or a prediction), as the vllm format carries it, then
    ``CSV_BAND_COLUMNS``: a prediction's ``bands`` (by headline key:
    ``sim.engine.bands.run_bands``) for the rows that have one (``_CSV_BAND_KEYS``),
    pct empty and the basis saying why where not validated; empty otherwise."""
    dists: list[tuple[str, str, Distribution | None]] = [
        (key, unit, getattr(summary, key)) for key, unit in _DISTRIBUTIONS
    ]
    tl = summary.server_timeline
    if tl is not None:
        dists += [
            ("server_timeline.server_ttft_ms", "ms", tl.server_ttft_ms),
            ("server_timeline.ttft_error_ms", "ms", tl.ttft_error_ms),
            ("server_timeline.server_queue_ms", "ms", tl.server_queue_ms),
        ]
    extra = sorted({q for _, _, d in dists if d is not None for q, _ in d.extra})
    stat_keys = [*DISTRIBUTION_KEYS, *(percentile_key(q) for q in extra)]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["metric", "unit", "value", *stat_keys, "inferlab_source", *CSV_BAND_COLUMNS])
    source = run_source(summary)
    counts = summary.counts
    for key, unit in _SCALARS:
        value = getattr(counts, key.split(".", 1)[1]) if key.startswith("counts.") else getattr(summary, key)
        w.writerow([key, unit, _cell(value), *([""] * len(stat_keys)), source, *_csv_bands(key, bands)])
    for key, unit, d in dists:
        stats = d.to_json() if d is not None else {}
        w.writerow([key, unit, "", *(_cell(stats.get(k)) for k in stat_keys), source, *_csv_bands(key, bands)])
    return buf.getvalue()


#: ``requests_csv``'s columns, in order.
REQUEST_COLUMNS = (
    "index", "warmup", "ok", "error_kind", "status", "error", "session", "turn", "key",
    "intended_send_ms", "send_ms", "end_ms",
    "ttfb_ms", "ttft_ms", "tpot_ms", "e2e_ms", "decode_tps", "queue_delay_ms", "connect_wait_ms",
    "chunks", "itl_mean_ms", "itl_max_ms",
    "input_tokens", "output_tokens", "cached_tokens", "requested_input_tokens", "requested_output_tokens",
    "usage_source", "finish_reason", "output_chars", "inferlab_source",
)


def requests_csv(records: Iterable[RequestRecord], source: str) -> str:
    """The records as CSV, one row per request (warm-up ones too, marked), in send
    order: the raw times in ms from the run's start (``intended_send_ms``, ``send_ms``,
    ``end_ms``), the derived metrics of docs/design.md (``ttfb_ms`` ... ``connect_wait_ms``),
    the content chunks and their gaps (``itl_mean_ms``, ``itl_max_ms``), and the token
    counts. ``output_tokens`` is the server's count, else the number of content chunks;
    ``inferlab_source`` is ``source`` (``run_source``: measured, or a prediction) on every
    row. An empty cell is unknown or undefined."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(REQUEST_COLUMNS)

    def ms(t: int | None) -> float | None:
        return None if t is None else t / NS_PER_MS

    for r in sorted(records, key=lambda r: r.index):
        m = request_metrics(r)
        gaps = [g / NS_PER_MS for g in itl_ns(r.content_ns)]
        row = {
            "index": r.index, "warmup": r.warmup, "ok": r.ok,
            "error_kind": r.error_kind.value if r.error_kind else None, "status": r.status, "error": r.error,
            "session": r.session, "turn": r.turn, "key": r.key,
            "intended_send_ms": ms(r.intended_send_ns), "send_ms": ms(r.send_ns), "end_ms": ms(r.end_ns),
            "ttfb_ms": m.ttfb_ms, "ttft_ms": m.ttft_ms, "tpot_ms": m.tpot_ms, "e2e_ms": m.e2e_ms,
            "decode_tps": m.decode_tps, "queue_delay_ms": m.queue_delay_ms, "connect_wait_ms": connect_wait_ms(r),
            "chunks": len(r.content_ns),
            "itl_mean_ms": math.fsum(gaps) / len(gaps) if gaps else None, "itl_max_ms": max(gaps, default=None),
            "input_tokens": r.input_tokens, "output_tokens": m.output_tokens, "cached_tokens": r.cached_tokens,
            "requested_input_tokens": r.requested_input_tokens, "requested_output_tokens": r.requested_output_tokens,
            "usage_source": r.usage_source, "finish_reason": r.finish_reason, "output_chars": r.output_chars,
            "inferlab_source": source,
        }
        w.writerow([_cell(row[c]) for c in REQUEST_COLUMNS])
    return buf.getvalue()
