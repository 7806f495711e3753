"""The typed run summary: aggregates, warnings, the server comparison, and the JSON
form that ``summary.json`` is written from and read back into."""

import dataclasses
import json
import re
from pathlib import Path

import pytest
from record_factory import MS, rec

from inferlab.results.clientload import ProcessLoad, client_load
from inferlab.results.metrics import SLO
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.results.summary import (
    OMITTED,
    Summary,
    SummaryExtras,
    TraceComparison,
    key_docs,
    summarize,
    with_percentiles,
)
from inferlab.results.telemetry import GatewayQueue, GaugeStats, HistogramDelta, ServerMetrics

ROOT = Path(__file__).resolve().parents[2]



def test_aggregates_exclude_warmup_and_count_failures() -> None:
    records = [
        rec(0, 0, [5, 6], 7, out=2, warmup=True),  # left out entirely
        rec(1, 1000, [1100, 1150], 1200, out=2, inp=100),
        rec(2, 1500, [1600, 1700, 1800], 3000, out=4, inp=50),
        RequestRecord(index=3, send_ns=2000 * MS, status=500, error_kind=ErrorKind.HTTP_STATUS, error="HTTP 500: boom"),
        RequestRecord(index=4, send_ns=2100 * MS, error_kind=ErrorKind.CANCELLED),
    ]
    s = summarize(records, slo=SLO(e2e_ms=1000))
    c = s.counts
    assert (c.total, c.completed, c.failed, c.cancelled, c.warmup) == (4, 2, 1, 1, 1)
    assert c.errors == {"http_status": 1}
    assert s.duration_s == pytest.approx(2.0)  # first measured send 1.0 s → last end 3.0 s
    assert s.request_throughput_rps == pytest.approx(1.0)
    assert s.output_token_throughput_tps == pytest.approx(3.0)
    assert s.total_token_throughput_tps == pytest.approx(78.0)
    assert s.output_tpm == pytest.approx(180.0)
    assert s.goodput_rps == pytest.approx(0.5)  # only request 1 (e2e 200 ms) meets 1 s
    assert s.ttft_ms is not None and s.ttft_ms.max == pytest.approx(100)
    assert s.error_examples == {"http_status": "HTTP 500: boom"}
    for key in ("ttft_ms", "ttfb_ms", "e2e_ms", "tpot_ms", "itl_ms", "decode_tps"):
        assert set(s.to_json()[key]) == {"mean", "std", "min", "p50", "p90", "p95", "p99", "max"}


def test_requests_a_response_cache_answered_are_counted_and_warned_of() -> None:
    records = [rec(i, 0, [5, 6], 7, out=2, response_cache_hit=hit) for i, hit in enumerate((True, True, False, None))]
    s = summarize([*records, rec(4, 0, [5, 6], 7, out=2, warmup=True, response_cache_hit=True)])
    assert s.counts.response_cache_hits == 2
    assert any(w.startswith("2 of 4 completed requests were answered by a response cache") for w in s.warnings)
    assert Summary.from_json(json.loads(json.dumps(s.to_json()))).counts.response_cache_hits == 2
    old = s.to_json()
    del old["counts"]["response_cache_hits"]  # (a summary.json from before the count)
    assert Summary.from_json(old).counts.response_cache_hits == 0
    assert summarize(records[2:]).counts.response_cache_hits == 0
    assert not any("response cache" in w for w in summarize(records[2:]).warnings)


def test_goodput_counts_only_requests_meeting_every_slo() -> None:
    fast = rec(0, 0, [50, 60], 70, out=2)
    slow_decode = rec(1, 0, [50, 400], 410, out=2)
    s = summarize([fast, slow_decode], slo=SLO(ttft_ms=100, tpot_ms=100))
    assert s.goodput_rps == pytest.approx(1 / 0.41)


def test_warns_when_client_falls_behind_and_when_lengths_differ() -> None:
    late = rec(0, 50, [60, 70], 80, out=2, intended_send_ns=0, requested_output_tokens=3)
    s = summarize([late])
    assert any("fell behind" in w for w in s.warnings)
    assert any("exactly the requested" in w for w in s.warnings)
    on_time = rec(0, 1, [60, 70], 80, out=3, intended_send_ns=0, requested_output_tokens=3)
    assert summarize([on_time]).warnings == ()


def test_answers_a_context_ended_are_not_blamed_on_ignore_eos() -> None:
    """2,010-token prompts for 100 tokens on 2,048-token slots stop at 38 with
    finish_reason "length": the server honoured ignore_eos, its context ended them. The
    warning said "the server may ignore ignore_eos/min_tokens"; it names the context
    now, and an answer ended at end-of-sequence ("stop") still gets the other one."""
    cut = [rec(i, 0, [10, 20], 30, out=38, inp=2010, requested_output_tokens=100, finish_reason="length") for i in range(3)]
    warnings = summarize(cut).warnings
    assert any("3 of 3 requests stopped at a length limit" in w and "up to 2,048 tokens" in w for w in warnings), warnings
    assert not any("ignore_eos" in w for w in warnings)
    eos = rec(3, 0, [10, 20], 30, out=5, requested_output_tokens=100, finish_reason="stop")
    warnings = summarize([*cut, eos]).warnings
    assert any("1 of 4 requests did not generate exactly" in w and "ignore_eos" in w for w in warnings)


def test_outputs_the_server_cut_short_are_warned_of_without_exact_output_too() -> None:
    """runs/long3: --no-exact-output, 2,010-token prompts for 100 tokens on a 2,048-token
    server: vLLM lowered max_tokens to 38 and every request got 38 of 100 with
    finish_reason "length", and the summary said nothing (the length warning was for
    exact runs alone). A cut by the server is no end-of-sequence: it is warned of, with
    the median received and requested; answers that stopped ("stop") are not."""
    no_exact = {"workload": {"exact_output": False}}
    cut = [rec(i, 0, [10, 20], 30, out=38, inp=2010, requested_output_tokens=100, finish_reason="length") for i in range(4)]
    warnings = summarize(cut, config=no_exact).warnings
    assert any("4 of 4 requests stopped at a length limit" in w and "median 38 received of 100 requested" in w
               for w in warnings), warnings
    eos = [rec(i, 0, [10, 20], 30, out=5, requested_output_tokens=100, finish_reason="stop") for i in range(2)]
    assert summarize(eos, config=no_exact).warnings == ()


def test_server_timeline_comparison() -> None:
    r = rec(0, 0, [12, 20], 30, out=2, server_timeline={"first_token_ms": 10.5, "scheduled_ms": 2.0})
    sv = summarize([r]).server_timeline
    assert sv is not None
    assert sv.ttft_error_ms.p50 == pytest.approx(1.5)
    assert sv.server_ttft_ms.p50 == pytest.approx(10.5)
    assert summarize([rec(0, 0, [12], 30, out=1)]).server_timeline is None


def overloaded(n: int = 20, every_ms: float = 50, service_ms: float = 400) -> list[RequestRecord]:
    """Open loop: one request every ``every_ms``, served one at a time in ``service_ms``
    each, so each waits longer than the one before (first token when its turn comes)."""
    out = []
    for i in range(n):
        start = i * service_ms
        out.append(rec(i, i * every_ms, [start + 10, start + service_ms], start + service_ms, out=2, intended_send_ns=int(i * every_ms * MS)))
    return out


def test_warns_when_an_open_loop_server_cannot_keep_up() -> None:
    s = summarize(overloaded())
    (w,) = [w for w in s.warnings if "keep up" in w]
    assert w.startswith("the server could not keep up: offered 20.0 req/s, completed 2.5 req/s; queues grew through the run")
    # answers came out every 400 ms (ends 400 ... 8,000 ms); TTFT of request i is
    # 400i + 10 − 50i: the first three 10, 360, 710 ms, the last three 5,960, 6,310, 6,660
    assert "TTFT median 360 ms over the first 3 requests, 6,310 ms over the last 3" in w


def test_no_overload_warning_when_keeping_up_for_closed_loops_or_without_spread() -> None:
    def keep_up_warned(records: list[RequestRecord], **kw: object) -> bool:
        return any("keep up" in w for w in summarize(records, **kw).warnings)  # type: ignore[arg-type]

    assert keep_up_warned(overloaded())
    # served as fast as offered
    assert not keep_up_warned(overloaded(every_ms=400))
    # a closed loop sends when a request ends: it cannot outrun the server
    assert not keep_up_warned(overloaded(), config={"load": {"schedule": {"kind": "ClosedLoop"}}})
    assert not keep_up_warned([dataclasses.replace(r, session=0, turn=r.index) for r in overloaded()])
    # all sent at once (--rate inf): no offered rate
    assert not keep_up_warned([dataclasses.replace(r, intended_send_ns=0, send_ns=0) for r in overloaded()])
    # a short run's tail lowers the completion rate, but latency did not grow: no warning
    flat = [rec(i, i * 50, [i * 50 + 10, i * 50 + 2000], i * 50 + 2000, out=2, intended_send_ns=i * 50 * MS) for i in range(10)]
    assert not keep_up_warned(flat)
    # a short run of long and short answers (the whole run's rate, with the long answers'
    # drain in it, well under the offered one) whose last three TTFTs doubled by a burst's
    # luck, not through the run: no warning
    ttft = [60, 70, 55, 65, 120, 60, 58, 62, 66, 59, 61, 64, 57, 63, 60, 58, 62, 125, 130, 120]
    lucky = [rec(i, i * 200, [i * 200 + t, i * 200 + (3000 if i % 2 else 500)], i * 200 + (3000 if i % 2 else 500),
                 out=2, intended_send_ns=i * 200 * MS) for i, t in enumerate(ttft)]
    assert summarize(lucky).request_throughput_rps < 0.8 * 5 and not keep_up_warned(lucky)
    # too few requests to tell a trend from one burst (three at each end, at least): none
    assert not keep_up_warned(overloaded(n=5))
    # an engine that only got busier: 20 requests over 3.4 s, each answering for 3 s (the
    # run's rate, drain included, well under the offered one), TTFT rising steadily from
    # 30 to 106 ms as the decode batch grows: more than twice, through the run, but by
    # 76 ms, where a queue that let completions fall behind would have grown by hundreds
    busier = [rec(i, i * 180, [i * 180 + 30 + 4 * i, i * 180 + 3000], i * 180 + 3000, out=2, intended_send_ns=i * 180 * MS)
              for i in range(20)]
    assert summarize(busier).request_throughput_rps < 0.8 * (1000 / 180) and not keep_up_warned(busier)
    # the same rise over a tenth of the time the sends spanned is a queue: warned
    queued = [rec(i, i * 180, [i * 180 + 30 + 25 * i, i * 180 + 3000], i * 180 + 3000, out=2, intended_send_ns=i * 180 * MS)
              for i in range(20)]
    assert keep_up_warned(queued)


def test_a_wait_for_a_concurrency_slot_is_not_called_falling_behind() -> None:
    waited = rec(0, 50, [60, 70], 80, out=2, intended_send_ns=0)
    config = {"load": {"schedule": {"kind": "Replay", "max_concurrency": 4}}}
    ws = summarize([waited], config=config).warnings
    assert any("4 --max-concurrency slots" in w for w in ws)
    assert not any("fell behind" in w for w in ws)


def _full_summary() -> Summary:
    records = [
        rec(0, 0, [12, 20, 31], 40, out=3, server_timeline={"first_token_ms": 10.0, "scheduled_ms": 1.0, "gateway_queue_ms": 0.5}),
        rec(1, 50, [60, 71], 80, out=2, intended_send_ns=0),  # 50 ms late
        RequestRecord(index=2, send_ns=7 * MS, status=429, error_kind=ErrorKind.HTTP_STATUS, error="HTTP 429: slow down"),
    ]
    trace = {"ttft_ms": TraceComparison(2, 20.0, 25.0, -20.0, 20.0, 24.0, None)}
    extras = SummaryExtras(
        trace_comparison=trace, prompt_overhead_tokens=None, input_length_source="exact (server /tokenize)",
        preflight={"accepts_exact_output": True, "warnings": []}, warnings_first=("first",), warnings_last=("last",),
        client=client_load([ProcessLoad("client", [0.25, 0.5, 4.0], 0.5, 1.0, [(4.0, 0.5)])]),
        server_metrics=ServerMetrics(
            True, server="vllm", samples=2, counters={"prompt_tokens": 100.0, "preemptions": None},
            prefix_cache_hit_rate=0.5, gauges={"running": GaugeStats(1.5, 3.0)},
            histograms={"ttft_ms": HistogramDelta(2, 12.5, 10.0, 20.0, None)}, missing=("prompt_seconds",),
        ),
        gateway_queue=GatewayQueue(True, admitted=3, queued=1, wait=HistogramDelta(3, 4.0, 0.0, 20.0, 20.0),
                                   queued_mean_ms=12.0, refused={"queue_full": 0, "queue_timeout": 1}),
    )
    config = {"load": {"schedule": {"kind": "OpenLoop"}}, "admission": {"mode": "tokens"}}  # (sim run --admission)
    summary = summarize(records, config=config, slo=SLO(ttft_ms=15), extras=extras)
    # (sim run adds its prediction block after summarizing)
    band = {"pct": 25.0, "rows": 6, "split": "holdout", "family": "vllm", "regime": "Poisson", "text": "±25 %"}
    return dataclasses.replace(summary, prediction={"label": "prediction", "error_bands": {"ttft_ms": band, "e2e_ms": None}})


def test_the_json_form_reads_back_into_the_same_summary() -> None:
    s = _full_summary()
    d = json.loads(json.dumps(s.to_json()))
    assert list(d) == [name for name, _ in key_docs()]  # every key, in the documented order
    assert Summary.from_json(d) == s
    assert Summary.from_json(d).to_json() == d
    assert d["slo"] == {"ttft_ms": 15, "tpot_ms": None, "e2e_ms": None}
    assert d["trace_comparison"]["ttft_ms"]["median_error_pct"] is None
    assert d["server_timeline"]["ttft_error_ms"]["p50"] == pytest.approx(2.0)


def test_extras_warnings_stand_before_and_after_the_records_own() -> None:
    w = _full_summary().warnings
    assert w[0] == "first" and w[-1] == "last" and len(w) > 2  # (the late request's own in between)


def test_keys_a_run_does_not_have_are_left_out_not_null() -> None:
    plain = summarize([rec(0, 0, [10, 20], 30, out=2)]).to_json()
    for key in ("trace_comparison", "prompt_overhead_tokens", "input_length_source", "preflight"):
        assert key not in plain
    assert Summary.from_json(plain).preflight is OMITTED
    none = summarize([], extras=SummaryExtras(trace_comparison=None, prompt_overhead_tokens=None, preflight=None)).to_json()
    assert none["trace_comparison"] is None and none["preflight"] is None and "input_length_source" not in none


def test_reading_back_refuses_another_format() -> None:
    d = _full_summary().to_json()
    with pytest.raises(ValueError, match="not an inferlab summary"):
        Summary.from_json({**d, "schema": "something/2"})
    with pytest.raises(KeyError):
        Summary.from_json({k: v for k, v in d.items() if k != "counts"})


def test_docs_list_every_summary_key_as_the_code_documents_it() -> None:
    text = (ROOT / "docs" / "design.md").read_text()
    table = text.split("<!-- summary keys: generated from inferlab.results.summary.key_docs -->", 1)[1].split("<!-- end -->", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (.*) \|$", table, re.M)
    expected = "\n".join(f"| `{k}` | {doc} |" for k, doc in key_docs())
    assert rows == key_docs(), f"docs/design.md's summary table is out of date; it should read:\n{expected}"


def test_every_field_is_documented() -> None:
    assert all(doc.strip() for _, doc in key_docs())
    assert {f.name for f in dataclasses.fields(Summary)} == {k for k, _ in key_docs()}


def test_unknown_token_counts_are_null_not_zero() -> None:
    no_usage = [rec(i, 0, [10, 20], 30, out=2, inp=None) for i in range(3)]  # type: ignore[arg-type]
    s = summarize(no_usage)
    assert s.input_tokens is None and s.total_token_throughput_tps is None and s.cached_tokens is None
    assert s.output_token_throughput_tps is not None
    d = s.to_json()
    assert d["cached_tokens"] is None and d["input_tokens"] is None
    cached = [rec(0, 0, [10, 20], 30, out=2, cached_tokens=16), rec(1, 0, [10, 20], 30, out=2)]
    s = summarize(cached)
    assert s.cached_tokens == 16
    assert any("cached tokens are known for 1 of 2" in w for w in s.warnings)
    assert summarize([rec(0, 0, [10, 20], 30, out=2, cached_tokens=0)]).cached_tokens == 0  # zero when said


def test_a_late_send_in_a_closed_loop_is_the_client_being_slow_not_a_schedule() -> None:
    late = rec(0, 50, [60, 70], 80, out=2, intended_send_ns=0)
    closed = summarize([late], config={"load": {"schedule": {"kind": "ClosedLoop", "concurrency": 1}}}).warnings
    assert any(w.startswith("the client was slow to send: requests left p99 50.0 ms") for w in closed)
    assert not any("fell behind" in w for w in closed)
    opened = summarize([late], config={"load": {"schedule": {"kind": "OpenLoop"}}}).warnings
    assert any("fell behind its schedule" in w for w in opened)


def test_chosen_percentiles_reach_every_distribution_and_read_back() -> None:
    records = [rec(i, i * 10, [i * 10 + 5 + i, i * 10 + 9 + 2 * i], i * 10 + 12 + 2 * i, out=2,
                   intended_send_ns=i * 10 * MS, server_timeline={"first_token_ms": 4.0, "scheduled_ms": 1.0})
               for i in range(50)]
    plain = summarize(records)
    s = summarize(records, percentiles=[99.9, 50])
    assert s.ttft_ms is not None and s.server_timeline is not None and s.queue_delay_ms is not None
    for d in (s.ttfb_ms, s.ttft_ms, s.e2e_ms, s.tpot_ms, s.itl_ms, s.decode_tps, s.queue_delay_ms,
              s.server_timeline.ttft_error_ms):
        assert d is not None and [q for q, _ in d.extra] == [99.9]
    assert dataclasses.replace(s.ttft_ms, extra=()) == plain.ttft_ms  # the fixed values unchanged
    d = json.loads(json.dumps(s.to_json()))
    assert d["ttft_ms"]["p99_9"] == s.ttft_ms.percentile(99.9) and "p99_9" not in plain.to_json()["ttft_ms"]
    assert Summary.from_json(d) == s
    # added after the run (what --metric-percentiles does): the same summary
    assert with_percentiles(plain, records, [50, 99.9]) == s


def test_a_late_send_small_beside_the_latency_is_no_warning_in_a_closed_loop() -> None:
    # 15 ms late against E2Es of a second: the users sent 1.5 % less often, no bottleneck
    # worth a warning (a burst of streams ending in one step is read one after another)
    closed = {"load": {"schedule": {"kind": "ClosedLoop", "concurrency": 4}}}
    slight = [rec(i, 15, [500, 900], 1015, out=2, intended_send_ns=0) for i in range(4)]
    assert not any("slow to send" in w for w in summarize(slight, config=closed).warnings)
    # the same delay against 100 ms E2Es is 15 %: said, with the share
    heavy = [rec(i, 15, [60, 100], 115, out=2, intended_send_ns=0) for i in range(4)]
    warned = [w for w in summarize(heavy, config=closed).warnings if "slow to send" in w]
    assert warned and "(15% of the E2E p50)" in warned[0]


def test_a_closed_loop_is_queue_bound_when_a_wait_of_many_steps_doubles_its_ttft() -> None:
    from inferlab.results.breakdown import VIRTUAL, LatencyBreakdown, Part
    from inferlab.results.summary import queue_bound

    def parts(queue: float, prefill: float) -> LatencyBreakdown:
        return LatencyBreakdown(VIRTUAL, 100, Part(0.0), Part(queue), Part(prefill), Part(700.0), Part(0.0))

    # users past the engine's places: seconds in its queue, beside a prefill of tens of ms
    assert queue_bound(parts(9400.0, 30.0), step_ms=7.0)
    # short prompts in capacity: the front end and a step or two outweigh a short prefill
    assert not queue_bound(parts(21.0, 9.0), step_ms=7.0)
    # a long wait that the prefill still outweighs: the engine's own work
    assert not queue_bound(parts(2000.0, 2500.0), step_ms=50.0)
    assert not queue_bound(None, step_ms=7.0) and not queue_bound(parts(9400.0, 30.0), step_ms=None)


def failed(index: int, kind: ErrorKind) -> RequestRecord:
    return RequestRecord(index=index, send_ns=index * MS, error_kind=kind, error="no")


def test_failed_requests_are_said_by_kind_and_first_when_many() -> None:
    ok = [rec(i, i, [i + 10], i + 20, out=1) for i in range(97)]
    few = summarize([*ok, failed(97, ErrorKind.CONNECT), failed(98, ErrorKind.CONNECT), failed(99, ErrorKind.TIMEOUT)],
                    interrupted=True)
    line = "3 of 100 measured requests failed (2 connect, 1 timeout): the latencies are of the requests that completed"
    assert few.warnings == (line, "the run was interrupted: the summary covers what completed")
    # more than 5 %: its share first, before every other caveat
    cut = [rec(i, i, [i + 10], i + 20, out=1, finish_reason="length", requested_output_tokens=2) for i in range(10)]
    many = summarize([*cut, *(failed(10 + i, ErrorKind.DISCONNECT) for i in range(5))])
    assert any("stopped at a length limit" in w for w in many.warnings)
    assert many.warnings[0].startswith("33% of the requests failed: 5 of 15 measured requests failed (5 disconnect)")
    cancelled = summarize([*ok[:3], failed(3, ErrorKind.CANCELLED)])  # (an interruption's: not a failure)
    assert not any("failed" in w for w in cancelled.warnings)


def test_the_bound_that_ended_a_run_of_both_is_said() -> None:
    load = {"num_requests": 1000, "duration_s": 3.0, "schedule": {"kind": "ClosedLoop", "concurrency": 1}}
    records = [rec(i, i, [i + 1], i + 2, out=1) for i in range(51)]
    s = summarize(records, config={"load": load})
    assert "stopped at --duration 3 s after 51 of the -n 1,000 requests" in s.warnings
    full = summarize(records, config={"load": {**load, "num_requests": 51}})
    assert "stopped at -n 51, within --duration 3 s" in full.warnings
    assert not any("stopped at" in w for w in summarize(records, config={"load": {**load, "duration_s": None}}).warnings)


def test_the_wait_for_connections_is_in_ttft_not_in_queue_delay_and_not_in_the_server_timeline() -> None:
    # sent on time, then 400 ms waiting for the server to take the connection
    r = rec(0, 0, [500], 600, out=1, intended_send_ns=0, connect_wait_ns=400 * MS,
            server_timeline={"first_token_ms": 90.0})
    s = summarize([r])
    assert s.ttft_ms is not None and s.ttft_ms.p50 == 500
    assert s.queue_delay_ms is not None and s.queue_delay_ms.max == 0
    assert s.connect_wait_ms is not None and s.connect_wait_ms.p99 == 400
    assert s.server_timeline is not None and s.server_timeline.ttft_error_ms.p50 == pytest.approx(10.0)
    assert any(w.startswith("the server was slow to accept connections: 1 of 1 completed") for w in s.warnings)
    # a record written before the field reads, and says nothing of it
    old = RequestRecord.from_json({k: v for k, v in r.to_json().items() if k != "connect_wait_ns"})
    assert old.connect_wait_ns is None and summarize([old]).connect_wait_ms is None


def _refused(index: int, send_ms: float, wait_ms: float = 0.2) -> RequestRecord:
    return RequestRecord(index=index, send_ns=int(send_ms * MS), connect_wait_ns=int(wait_ms * MS),
                         error_kind=ErrorKind.CONNECT, error="cannot connect: Connect call failed (connection refused)")


def test_the_streak_that_stopped_a_run_is_said_apart_from_the_run_before_it() -> None:
    done = [rec(i, 10 * i, [10 * i + 5], 10 * i + 9, out=1, status=200) for i in range(24)]
    early = [_refused(24, 245)]  # (refused once, then an answer: not the final streak)
    answered = [rec(25, 250, [255], 259, out=1, status=200)]
    storm = [_refused(26 + i, 300 + i / 10) for i in range(500)]
    records = [*done, *early, *answered, *storm]
    s = summarize(records, interrupted=True, extras=SummaryExtras(server_gone=True))
    assert s.counts.failed == 501 and s.counts.after_server_gone == 500
    assert s.warnings[0].startswith("500 requests failed for want of a connection (500 connect) in the last 0.0 s")
    assert "before that, 1 of 26 failed" in s.warnings[0]
    # the share warning is of the 26 before: 1 failed, under 5 %: not "95% of the requests failed"
    assert not any("% of the requests failed" in w for w in s.warnings)
    assert any(w.startswith("1 of 26 measured requests failed (1 connect)") for w in s.warnings)
    assert Summary.from_json(s.to_json()).counts.after_server_gone == 500
    # without the executor's word the failures are the run's own
    plain = summarize(records, interrupted=True)
    assert plain.counts.after_server_gone == 0 and plain.warnings[0].startswith("95% of the requests failed")


def test_the_connect_wait_is_the_completed_requests_as_the_other_rows() -> None:
    done = [rec(i, 10 * i, [10 * i + 5], 10 * i + 9, out=1, status=200, connect_wait_ns=int(2 * MS)) for i in range(4)]
    s = summarize([*done, _refused(4, 50, wait_ms=900)])
    assert s.connect_wait_ms is not None and s.connect_wait_ms.max == pytest.approx(2.0)
