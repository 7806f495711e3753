"""A run in other tools' formats: the result file of ``vllm bench serve --save-result``
(``--save-detailed``: its per-request lists too), and CSV, of the summary (one row per
metric) or of the requests (one row per request, its derived metrics beside its raw
times). Pure functions of a ``Summary`` and its records; the caller writes the text.

vLLM's result follows vLLM's definitions, not inferlab's, so that its numbers are those
``vllm bench serve`` would have printed for the same token times: E2EL runs to the last
content chunk (inferlab's ``e2e`` to the end of the stream), TPOT is
(E2EL − TTFT) / (output tokens − 1), its ITL is every gap between content chunks (as
inferlab's ``itl``), the per-request lists are in seconds and the summary in ms, an empty
metric is 0.0, and a failed request is in the lists with zeros and its error.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from inferlab.results.metrics import (
    DISTRIBUTION_KEYS,
    NS_PER_MS,
    NS_PER_S,
    Distribution,
    itl_ns,
    output_token_count,
    percentile,
    percentile_key,
    queue_delay_ms,
    request_metrics,
)
from inferlab.results.provenance import VIRTUAL
from inferlab.results.records import RequestRecord
from inferlab.results.summary import Summary

#: The metrics vLLM's result summarizes (``--percentile-metrics ttft,tpot,itl,e2el``).
VLLM_METRICS = ("ttft", "tpot", "itl", "e2el")
#: vLLM's default ``--metric-percentiles``.
VLLM_PERCENTILES = (99.0,)
#: The per-request lists ``--save-detailed`` adds, in vLLM's order.
VLLM_DETAILED_KEYS = (
    "input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times",
    "generated_texts", "errors",
)


@dataclass(frozen=True)
class _VllmRequest:
    """One request as vLLM's client records it (``RequestFuncOutput``): times in s from
    its send; zeros for a failed request, as vLLM leaves them."""

    success: bool
    prompt_len: int
    output_len: int
    ttft_s: float
    itl_s: list[float]
    latency_s: float
    start_s: float
    queue_s: float
    error: str


def _vllm_request(r: RequestRecord) -> _VllmRequest:
    prompt_len = r.input_tokens if r.input_tokens is not None else (r.requested_input_tokens or 0)
    start_s = (r.send_ns or 0) / NS_PER_S
    if not r.ok or r.send_ns is None:
        error = f"{r.error_kind.value}: {r.error or ''}" if r.error_kind else "no response"
        return _VllmRequest(False, prompt_len, 0, 0.0, [], 0.0, start_s, 0.0, error)
    send = r.send_ns
    chunks = r.content_ns
    # vLLM's latency ends at the last chunk carrying a token; a response without streamed
    # content (no streaming) has no TTFT, which vLLM leaves at 0.0
    last = chunks[-1] if chunks else (r.end_ns or send)
    return _VllmRequest(
        success=True,
        prompt_len=prompt_len,
        output_len=output_token_count(r) or 0,
        ttft_s=(chunks[0] - send) / NS_PER_S if chunks else 0.0,
        itl_s=[gap / NS_PER_S for gap in itl_ns(chunks)],
        latency_s=(last - send) / NS_PER_S,
        start_s=start_s,
        queue_s=(queue_delay_ms(r) or 0.0) / 1e3,
        error="",
    )


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
) -> dict[str, Any]:
    """The run as ``vllm bench serve --save-result`` writes it (with ``--save-detailed``
    when ``detailed``): vLLM's keys, types and units, its metrics computed its way from
    the measured (not warm-up) ``records`` in send order. ``date`` is vLLM's stamp
    (``%Y%m%d-%H%M%S``, when the run ended); ``percentiles`` are its
    ``--metric-percentiles`` (keys ``p99_ttft_ms``, ``p99.9_ttft_ms``); ``source``, when
    given, is kept as ``inferlab_source`` (as vLLM's ``--metadata`` keys are), so that a
    simulated run is not taken for a measurement. ``generated_texts`` are empty: inferlab
    keeps no generated text. ``ValueError`` for a percentile outside 0–100."""
    for q in percentiles:
        percentile_key(q)  # (checks the range)
    config = summary.config
    measured = sorted((r for r in records if not r.warmup), key=lambda r: r.index)
    reqs = [_vllm_request(r) for r in measured]
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

    duration = summary.duration_s
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
    if detailed:
        out |= {
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
    peak_tps, peak_concurrency = _vllm_peaks(ok)
    out |= {"max_output_tokens_per_s": peak_tps, "max_concurrent_requests": peak_concurrency, "rtfx": 0.0}
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        mean, std, median, pcts = _stats(values, percentiles)
        out[f"mean_{name}_ms"] = mean * 1e3
        out[f"median_{name}_ms"] = median * 1e3
        out[f"std_{name}_ms"] = std * 1e3
        for q, v in pcts:
            out[f"p{vllm_percentile_word(q)}_{name}_ms"] = v * 1e3
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


def _vllm_peaks(ok: Sequence[_VllmRequest]) -> tuple[float, int]:
    """vLLM's ``max_output_tokens_per_s`` and ``max_concurrent_requests``, both counted
    in whole seconds from the first completed request's send: the most content chunks
    in one second, and the most completed requests active in one second (a request
    counts in every second from the one it was sent in to the one it ended in, both
    included: more than were ever in flight at one instant)."""
    if not ok:
        return 0.0, 0
    t0 = min(q.start_s for q in ok)
    end = max(q.start_s + q.latency_s for q in ok)
    tokens = [0] * (math.ceil(end - t0) + 1)
    active = [0] * len(tokens)
    for q in ok:
        t = q.start_s + q.ttft_s
        for gap in (0.0, *q.itl_s):
            t += gap
            b = int(t - t0)
            if 0 <= b < len(tokens):
                tokens[b] += 1
        for b in range(int(q.start_s - t0), min(int(q.start_s + q.latency_s - t0) + 1, len(active))):
            active[b] += 1
    return float(max(tokens)), max(active)


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
    ("decode_tps", "tok/s"), ("queue_delay_ms", "ms"),
)


def _cell(v: object) -> object:
    """A CSV cell: empty for unknown (``None``), a float as Python writes it (shortest
    round trip), ``inf`` as ``inf``."""
    return "" if v is None else v


def summary_csv(summary: Summary) -> str:
    """The summary as CSV, one row per metric: ``metric`` (its key in summary.json, a
    dotted path when nested), ``unit``, then ``value`` for a single number, or ``mean std
    min p50 p90 p95 p99 max`` and any added percentile (``p99_9``) for a distribution.
    An empty cell is unknown (null in the JSON). Every row ends with ``inferlab_source``
    (``run_source``: measured, or a prediction), as the vllm format carries it."""
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
    w.writerow(["metric", "unit", "value", *stat_keys, "inferlab_source"])
    source = run_source(summary)
    counts = summary.counts
    for key, unit in _SCALARS:
        value = getattr(counts, key.split(".", 1)[1]) if key.startswith("counts.") else getattr(summary, key)
        w.writerow([key, unit, _cell(value), *([""] * len(stat_keys)), source])
    for key, unit, d in dists:
        stats = d.to_json() if d is not None else {}
        w.writerow([key, unit, "", *(_cell(stats.get(k)) for k in stat_keys), source])
    return buf.getvalue()


#: ``requests_csv``'s columns, in order.
REQUEST_COLUMNS = (
    "index", "warmup", "ok", "error_kind", "status", "error", "session", "turn", "key",
    "intended_send_ms", "send_ms", "end_ms",
    "ttfb_ms", "ttft_ms", "tpot_ms", "e2e_ms", "decode_tps", "queue_delay_ms",
    "chunks", "itl_mean_ms", "itl_max_ms",
    "input_tokens", "output_tokens", "cached_tokens", "requested_input_tokens", "requested_output_tokens",
    "usage_source", "finish_reason", "output_chars", "inferlab_source",
)


def requests_csv(records: Iterable[RequestRecord], source: str) -> str:
    """The records as CSV, one row per request (warm-up ones too, marked), in send
    order: the raw times in ms from the run's start (``intended_send_ms``, ``send_ms``,
    ``end_ms``), the derived metrics of docs/design.md (``ttfb_ms`` ... ``queue_delay_ms``),
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
            "decode_tps": m.decode_tps, "queue_delay_ms": m.queue_delay_ms,
            "chunks": len(r.content_ns),
            "itl_mean_ms": math.fsum(gaps) / len(gaps) if gaps else None, "itl_max_ms": max(gaps, default=None),
            "input_tokens": r.input_tokens, "output_tokens": m.output_tokens, "cached_tokens": r.cached_tokens,
            "requested_input_tokens": r.requested_input_tokens, "requested_output_tokens": r.requested_output_tokens,
            "usage_source": r.usage_source, "finish_reason": r.finish_reason, "output_chars": r.output_chars,
            "inferlab_source": source,
        }
        w.writerow([_cell(row[c]) for c in REQUEST_COLUMNS])
    return buf.getvalue()
