"""A run in vLLM's result format and as CSV: vLLM's keys, types, units and definitions
(checked against ``vllm/benchmarks/serve.py``), and CSV rows that read back to the
summary and the records."""

from __future__ import annotations

import csv
import dataclasses
import io
import json

import pytest
from record_factory import MS, rec

from inferlab._errors import UsageError
from inferlab.results.export import (
    REQUEST_COLUMNS,
    requests_csv,
    run_source,
    summary_csv,
    vllm_result,
    vllm_result_filename,
)
from inferlab.results.metrics import SLO, request_metrics
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.results.summary import summarize, with_percentiles

#: The keys ``vllm bench serve --save-result --save-detailed`` writes for a generation
#: run, in its order (main_async's result_json, then benchmark()'s result, then
#: process_one_metric for ttft, tpot, itl, e2el, client_queue_time (with
#: --max-concurrency) and e2el_including_client_queue (with --max-concurrency and a
#: finite rate), with the default --metric-percentiles 99).
VLLM_KEYS = [
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
    "request_rate", "burstiness", "max_concurrency",
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
    "input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times",
    "generated_texts", "errors", "max_output_tokens_per_s", "max_concurrent_requests", "rtfx",
    *(f"{stat}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue")
      for stat in ("mean", "median", "std", "p99")),
]
#: What main_async deletes without --save-detailed (latencies and queue_times stay).
DETAILED = ["input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors"]

CONFIG = {
    "load": {"schedule": {"kind": "OpenLoop", "rate_rps": 4.0, "arrival": "gamma", "burstiness": 0.5, "max_concurrency": 8}},
    "workload": {"tokenizer": None}, "api": "chat", "resolved": {"model": "Qwen/Qwen2.5-7B-Instruct"},
}


def records() -> list[RequestRecord]:
    return [
        # sent at 0; chunks at 10, 20, 35 ms; the stream ends at 50 ms; 3 tokens
        rec(0, 0, [10, 20, 35], 50, out=3, inp=100, intended_send_ns=0),
        # sent at 100 (queued 5 ms); one chunk at 140; 1 token
        rec(1, 100, [140], 141, out=1, inp=50, intended_send_ns=95 * MS),
        RequestRecord(2, send_ns=200 * MS, end_ns=210 * MS, status=400, error_kind=ErrorKind.HTTP_STATUS,
                      error="HTTP 400: too long", requested_input_tokens=9000),
        rec(3, 0, [1, 2], 3, out=2, warmup=True),  # left out, as vLLM's warm-ups are
    ]


def result(**kw: object) -> dict[str, object]:
    recs = records()
    return vllm_result(summarize(recs, config=CONFIG, slo=SLO(ttft_ms=30, tpot_ms=20)), recs, date="20250101-120000", **kw)  # type: ignore[arg-type]


def test_keys_and_types_are_vllms() -> None:
    r = result()
    assert list(r) == VLLM_KEYS
    assert json.loads(json.dumps(r, allow_nan=False)) == r  # plain JSON
    assert (r["backend"], r["endpoint_type"], r["model_id"], r["tokenizer_id"]) == ("openai-chat",) * 2 + ("Qwen/Qwen2.5-7B-Instruct",) * 2
    assert (r["num_prompts"], r["completed"], r["failed"]) == (3, 2, 1)
    assert (r["request_rate"], r["burstiness"], r["max_concurrency"]) == (4.0, 0.5, 8)
    for key in ("input_lens", "output_lens"):
        assert all(type(v) is int for v in r[key])  # type: ignore[attr-defined]
    for key in ("ttfts", "latencies", "start_times", "queue_times"):
        assert all(type(v) is float for v in r[key])  # type: ignore[attr-defined]
    assert all(isinstance(v, list) for v in r["itls"])  # type: ignore[attr-defined]
    assert all(isinstance(v, str) for key in ("generated_texts", "errors") for v in r[key])  # type: ignore[attr-defined]
    without = result(detailed=False)
    assert list(without) == [k for k in VLLM_KEYS if k not in DETAILED]  # what --save-result alone writes


def test_units_and_definitions_are_vllms() -> None:
    r = result()
    # per request: seconds; ITL every chunk gap; E2EL (latency) to the last chunk, not the stream's end
    assert r["ttfts"] == pytest.approx([0.010, 0.040, 0.0])
    assert r["itls"] == [pytest.approx([0.010, 0.015]), [], []]
    assert r["latencies"] == pytest.approx([0.035, 0.040, 0.0])
    assert r["start_times"] == pytest.approx([0.0, 0.1, 0.2]) and r["queue_times"] == pytest.approx([0.0, 0.005, 0.0])
    # a failed request: zeros, its requested length, its error (as vLLM leaves them)
    assert (r["input_lens"], r["output_lens"]) == ([100, 50, 9000], [3, 1, 0])
    assert r["errors"] == ["", "", "http_status: HTTP 400: too long"]
    # the summary: ms; TPOT (E2EL − TTFT) / (out − 1) over requests of 2 or more tokens
    assert r["mean_ttft_ms"] == pytest.approx(25.0) and r["median_ttft_ms"] == pytest.approx(25.0)
    assert r["std_ttft_ms"] == pytest.approx(15.0)  # population
    assert r["p99_ttft_ms"] == pytest.approx(10 + 0.99 * 30)
    assert r["mean_tpot_ms"] == pytest.approx((35 - 10) / 2)
    assert r["mean_itl_ms"] == pytest.approx(12.5) and r["mean_e2el_ms"] == pytest.approx(37.5)
    # totals over completed requests, rates over vLLM's duration: first send → the last
    # request's return, the failed one's included (it answered at 210 ms)
    assert (r["total_input_tokens"], r["total_output_tokens"]) == (150, 4)
    assert r["duration"] == pytest.approx(0.210)
    assert r["request_throughput"] == pytest.approx(2 / 0.210)
    assert r["total_token_throughput"] == pytest.approx(154 / 0.210)
    # goodput as vLLM counts it: TTFT ≤ 30 ms and TPOT ≤ 20 ms, one token meeting any TPOT
    assert r["request_goodput"] == pytest.approx(1 / 0.210)
    # peak tokens in whole seconds from the first send; the completed requests (0-35 ms
    # and 100-140 ms) were never in flight at the same instant
    assert (r["max_concurrent_requests"], r["max_output_tokens_per_s"]) == (1, 4.0)


def test_chosen_percentiles_are_written_as_vllm_writes_them() -> None:
    r = result(percentiles=(50, 99.9))
    assert "p50_ttft_ms" in r and "p99.9_e2el_ms" in r and "p99_ttft_ms" not in r
    assert r["p50_ttft_ms"] == r["median_ttft_ms"]


def test_loads_as_vllm_flags_would_set_them() -> None:
    def traffic(schedule: dict[str, object]) -> tuple[object, object, object]:
        recs = records()
        r = vllm_result(summarize(recs, config={**CONFIG, "load": {"schedule": schedule}}), recs, date="d")
        return r["request_rate"], r["burstiness"], r["max_concurrency"]

    assert traffic({"kind": "ClosedLoop", "concurrency": 16}) == ("inf", 1.0, 16)  # vLLM: rate inf, cap 16
    assert traffic({"kind": "OpenLoop", "rate_rps": "inf", "arrival": "poisson", "burstiness": 1.0, "max_concurrency": None}) == ("inf", 1.0, None)
    assert traffic({"kind": "OpenLoop", "rate_rps": 2.0, "arrival": "constant", "burstiness": 1.0, "max_concurrency": None}) == (2.0, "inf", None)
    # a replay sent at its own times: their mean rate (two sends 95 ms apart), not a burst
    rate, burst, cap = traffic({"kind": "Replay", "max_concurrency": 4})
    assert rate == pytest.approx(1000 / 95) and (burst, cap) == (1.0, 4)
    # ... and sent all at once, a burst
    recs = [dataclasses.replace(r, intended_send_ns=0) for r in records()]
    r = vllm_result(summarize(recs, config={**CONFIG, "load": {"schedule": {"kind": "Replay"}}}), recs, date="d")
    assert r["request_rate"] == "inf"


def test_file_name_is_vllms() -> None:
    assert vllm_result_filename(result()) == "openai-chat-4.0qps-concurrency8-Qwen2.5-7B-Instruct-20250101-120000.json"


def test_summary_csv_has_one_row_per_metric_that_reads_back() -> None:
    recs = records()
    s = with_percentiles(summarize(recs, config=CONFIG), recs, [99.9])
    rows = list(csv.DictReader(io.StringIO(summary_csv(s))))
    by = {r["metric"]: r for r in rows}
    assert len(by) == len(rows)
    assert float(by["duration_s"]["value"]) == s.duration_s and by["goodput_rps"]["value"] == ""  # null: no SLO
    assert int(by["counts.failed"]["value"]) == 1
    assert s.ttft_ms is not None
    assert {k: float(by["ttft_ms"][k]) for k in ("mean", "p50", "p99", "max", "p99_9")} == {
        "mean": s.ttft_ms.mean, "p50": s.ttft_ms.p50, "p99": s.ttft_ms.p99, "max": s.ttft_ms.max, "p99_9": s.ttft_ms.percentile(99.9)}
    assert by["ttft_ms"]["value"] == "" and by["ttft_ms"]["unit"] == "ms"
    assert {r["inferlab_source"] for r in rows} == {run_source(s)}


def test_requests_csv_has_one_row_per_request_with_its_metrics() -> None:
    recs = records()
    rows = list(csv.DictReader(io.StringIO(requests_csv(reversed(recs), "inferlab bench"))))
    assert [int(r["index"]) for r in rows] == [0, 1, 2, 3] and list(rows[0]) == list(REQUEST_COLUMNS)
    m = request_metrics(recs[0])
    assert float(rows[0]["tpot_ms"]) == m.tpot_ms and float(rows[0]["e2e_ms"]) == m.e2e_ms
    assert (rows[0]["chunks"], float(rows[0]["itl_mean_ms"]), float(rows[0]["itl_max_ms"])) == ("3", 12.5, 15.0)
    assert (rows[2]["ok"], rows[2]["error_kind"], rows[2]["ttft_ms"], rows[2]["input_tokens"]) == ("False", "http_status", "", "")
    assert rows[3]["warmup"] == "True" and {r["inferlab_source"] for r in rows} == {"inferlab bench"}


def test_a_gateways_access_log_is_named_as_what_made_it() -> None:
    """An export of a gateway's access log said "inferlab bench": its requests are its
    clients', as the gateway saw them."""
    from inferlab.results.export import run_source

    recs = records()
    gateway_config = {**CONFIG, "gateway": {"upstreams": ["http://127.0.0.1:8001"]}}
    assert run_source(summarize(recs, config=gateway_config)).startswith("inferlab gateway's access log")
    assert run_source(summarize(recs, config=CONFIG)).startswith("inferlab bench")


# --- what vLLM means by each field (vllm/benchmarks/serve.py), checked on records where
# inferlab's own definition gives another number. Expected values are worked out from
# the records by vLLM's definition, written out here, never by the code under test.


def test_duration_runs_until_every_request_returned_failed_ones_included() -> None:
    """vLLM's duration ends when asyncio.gather has every request back, failed ones
    included, and it divides the completed requests and tokens by it. Ending at the last
    completed request made the rates of a run whose time-outs ended last far too high."""
    recs = [
        rec(0, 0, [100, 200], 210, out=2, inp=10),
        rec(1, 50, [150, 250, 290], 300, out=3, inp=20),
        # timed out: the client gave up 2 s (timeout_s) after its send, at 2100 ms
        RequestRecord(2, send_ns=100 * MS, error_kind=ErrorKind.TIMEOUT, error="timed out", requested_input_tokens=5),
        # stalled mid-stream: given up 1 s (idle_timeout_s) after its last byte, at 1400 ms
        RequestRecord(3, send_ns=150 * MS, ttfb_ns=400 * MS, content_ns=[400 * MS], error_kind=ErrorKind.IDLE_TIMEOUT,
                      error="idle", requested_input_tokens=5),
    ]
    config = {**CONFIG, "timeout_s": 2.0, "idle_timeout_s": 1.0}
    s = summarize(recs, config=config)
    r = vllm_result(s, recs, date="d")
    # vLLM: benchmark_duration = the last return (2100 ms) − the start (the first send, 0)
    duration = (2100 - 0) / 1000
    assert r["duration"] == pytest.approx(duration)
    # request_throughput = completed / duration; output_throughput = Σ output tokens of
    # completed requests / duration; total = (Σ input + Σ output) / duration
    assert r["request_throughput"] == pytest.approx(2 / duration)
    assert r["output_throughput"] == pytest.approx((2 + 3) / duration)
    assert r["total_token_throughput"] == pytest.approx((10 + 20 + 2 + 3) / duration)
    assert s.duration_s == pytest.approx(0.300)  # inferlab's own summary keeps its definition


def test_closed_loop_queue_times_run_from_the_start() -> None:
    """A closed loop of N users is written as vLLM's rate inf with --max-concurrency N,
    where every request arrives at the start and waits for a slot: its client_queue_time
    is its send − the run's start. The wait after its intended send (0 in a closed loop)
    was written instead."""
    recs = [
        rec(0, 0, [5], 40, out=1, warmup=True, intended_send_ns=0),  # warm-ups: before the measured run
        rec(1, 0, [5], 50, out=1, warmup=True, intended_send_ns=0),
        rec(2, 40, [60, 80], 100, out=2, intended_send_ns=40 * MS),
        rec(3, 50, [70, 90], 150, out=2, intended_send_ns=50 * MS),
        rec(4, 100, [120, 140], 200, out=2, intended_send_ns=100 * MS),
        RequestRecord(5, send_ns=150 * MS, intended_send_ns=150 * MS, end_ns=160 * MS, status=500,
                      error_kind=ErrorKind.HTTP_STATUS, error="HTTP 500"),
    ]
    config = {**CONFIG, "load": {"schedule": {"kind": "ClosedLoop", "concurrency": 2}}}
    r = vllm_result(summarize(recs, config=config), recs, date="d")
    assert (r["request_rate"], r["max_concurrency"]) == ("inf", 2)
    # vLLM: client_queue_time = start_time − request_arrival_time, every measured request
    # arriving at the start (the first measured send, 40 ms); a failed one too
    sends_ms = [40, 50, 100, 150]
    queue = [(t - 40) / 1000 for t in sends_ms]
    assert r["queue_times"] == pytest.approx(queue)
    # ... and its statistics over those lists, the failed request too (--max-concurrency given)
    assert r["mean_client_queue_time_ms"] == pytest.approx(sum(queue) / 4 * 1000)
    assert r["median_client_queue_time_ms"] == pytest.approx(35.0)  # (0, 10, 60, 110 ms)
    assert "mean_e2el_including_client_queue_ms" not in r  # (vLLM: only at a finite rate)


def test_a_request_that_failed_mid_stream_keeps_what_it_received() -> None:
    """vLLM's client sets ttft at the first chunk and appends an ITL at each later one
    before the failure; only latency (set once the stream ended) stays 0.0, and its
    output length is 0. They were all zeros. The statistics still count completed
    requests only."""
    recs = [
        rec(0, 0, [10, 20], 30, out=2),
        RequestRecord(1, send_ns=100 * MS, ttfb_ns=130 * MS, content_ns=[130 * MS, 150 * MS, 180 * MS],
                      error_kind=ErrorKind.DISCONNECT, error="closed", requested_input_tokens=7),
    ]
    r = vllm_result(summarize(recs, config=CONFIG), recs, date="d")
    # ttft = first chunk − send = 30 ms; itl = the gaps 20 ms and 30 ms
    assert r["ttfts"] == pytest.approx([0.010, 0.030])
    assert r["itls"] == [pytest.approx([0.010]), pytest.approx([0.020, 0.030])]
    assert r["latencies"] == pytest.approx([0.020, 0.0]) and r["output_lens"] == [2, 0]
    assert r["errors"][1] == "disconnect: closed"
    assert r["mean_ttft_ms"] == pytest.approx(10.0) and r["mean_itl_ms"] == pytest.approx(10.0)


def test_max_concurrent_requests_is_the_most_in_flight_at_one_instant() -> None:
    """vLLM main's sweep over the completed requests' [start, start + latency) spans, an
    end before a start at the same instant. Counting every request in each whole second
    it touched gave 6 here, at a concurrency cap of 2."""
    # two users, each sending its next request as its previous one's last chunk came
    # (so one ends exactly as the next starts): 3 requests each, within one second
    recs = [
        rec(0, 0, [50, 100], 110, out=2),
        rec(1, 100, [150, 200], 210, out=2),
        rec(2, 200, [250, 300], 310, out=2),
        rec(3, 20, [60, 130], 140, out=2),
        rec(4, 130, [180, 260], 270, out=2),
        rec(5, 260, [300, 390], 400, out=2),
    ]
    spans = [(r.send_ns, r.content_ns[-1]) for r in recs]  # vLLM: start_time, start_time + latency
    assert all(a is not None for a, _ in spans)
    # the most spans holding one instant: an instant where the count can rise is a start
    peak = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)  # type: ignore[operator]
    assert peak == 2
    r = vllm_result(summarize(recs, config=CONFIG), recs, date="d")
    assert r["max_concurrent_requests"] == peak


def test_without_save_detailed_latencies_and_queue_times_stay() -> None:
    """main_async deletes input_lens, output_lens, start_times, ttfts, itls,
    generated_texts and errors without --save-detailed, and keeps latencies and
    queue_times; every list went."""
    r = result(detailed=False)
    assert r["latencies"] == pytest.approx([0.035, 0.040, 0.0]) and r["queue_times"] == pytest.approx([0.0, 0.005, 0.0])
    assert not set(DETAILED) & set(r)


def test_client_queue_statistics_as_vllm_writes_them() -> None:
    """With --max-concurrency vLLM adds client_queue_time's statistics, and with a finite
    rate too those of e2el_including_client_queue (latency + client_queue_time), both
    from its per-request lists: over every request, the failed one too (its latency 0.0;
    they were over the completed ones)."""
    r = result()  # rate 4, --max-concurrency 8: request 1 waited 5 ms for a slot
    queue = [0.0, 0.005, 0.0]  # every request's client_queue_time, in s (the failed one sent when due)
    latency = [0.035, 0.040, 0.0]
    mean = sum(queue) / 3
    assert r["mean_client_queue_time_ms"] == pytest.approx(mean * 1000)
    assert r["std_client_queue_time_ms"] == pytest.approx((sum((q - mean) ** 2 for q in queue) / 3) ** 0.5 * 1000)
    assert r["p99_client_queue_time_ms"] == pytest.approx(0.98 * 5.0)  # (sorted 0, 0, 5 ms: rank 1.98)
    both = [a + b for a, b in zip(latency, queue, strict=True)]
    assert r["mean_e2el_including_client_queue_ms"] == pytest.approx(sum(both) / 3 * 1000)
    assert r["median_e2el_including_client_queue_ms"] == pytest.approx(35.0)

    def keys(schedule: dict[str, object]) -> set[str]:
        recs = records()
        out = vllm_result(summarize(recs, config={**CONFIG, "load": {"schedule": schedule}}), recs, date="d")
        return {k for k in out if "client_queue" in k}

    # no cap: neither (vLLM writes them under --max-concurrency only)
    assert keys({"kind": "OpenLoop", "rate_rps": 4.0, "arrival": "poisson", "burstiness": 1.0, "max_concurrency": None}) == set()


def test_a_run_without_streaming_is_refused() -> None:
    """vllm bench serve always streams: a --no-stream run was written with TTFT 0.0 and
    a TPOT holding queueing and prefill."""
    recs = records()
    with pytest.raises(UsageError, match=r"--no-stream.*--format csv-summary"):
        vllm_result(summarize(recs, config={**CONFIG, "stream": False}), recs, date="d")
