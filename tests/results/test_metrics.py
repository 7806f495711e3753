import dataclasses
import itertools
import random

import pytest

from inferlab.results.metrics import (
    SLO,
    counted_distribution,
    distribution,
    itl_ms_counts,
    percentile,
    request_metrics,
    summarize,
)
from inferlab.results.records import ErrorKind, RequestRecord

MS = 1_000_000


def rec(index: int, send_ms: float, content_ms: list[float], end_ms: float, out: int | None, inp: int = 10, **kw: object) -> RequestRecord:
    return RequestRecord(
        index=index,
        send_ns=int(send_ms * MS),
        ttfb_ns=int(content_ms[0] * MS) if content_ms else None,
        content_ns=[int(t * MS) for t in content_ms],
        end_ns=int(end_ms * MS),
        input_tokens=inp,
        output_tokens=out,
        usage_source="server" if out is not None else "none",
        **kw,  # type: ignore[arg-type]
    )


def test_per_request_definitions() -> None:
    # sent at 100 ms; content at 150, 160, 180, 200 ms; stream ends at 205 ms; 5 tokens
    r = rec(0, 100, [150, 160, 180, 200], 205, out=5, intended_send_ns=int(97 * MS))
    m = request_metrics(r)
    assert m.ttfb_ms == pytest.approx(50)
    assert m.ttft_ms == pytest.approx(50)
    assert m.e2e_ms == pytest.approx(105)
    assert m.itl_ms == pytest.approx([10, 20, 20])
    assert m.tpot_ms == pytest.approx((105 - 50) / 4)  # (e2e - ttft) / (out - 1)
    assert m.decode_tps == pytest.approx(4 / 0.055)
    assert m.queue_delay_ms == pytest.approx(3)


def test_tpot_undefined_for_one_token_and_fallback_to_chunk_count() -> None:
    one = request_metrics(rec(0, 0, [10], 12, out=1))
    assert one.tpot_ms is None and one.decode_tps is None
    no_usage = request_metrics(rec(0, 0, [10, 20, 30], 31, out=None))
    assert no_usage.output_tokens == 3
    assert no_usage.tpot_ms == pytest.approx(21 / 2)


def test_percentiles_interpolate_like_numpy() -> None:
    xs = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(xs, 50) == 3.0
    assert percentile(xs, 90) == pytest.approx(4 + 0.6 * 6)  # numpy.percentile(xs, 90) == 7.6
    d = distribution([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])
    assert d is not None
    assert d["mean"] == 5.0 and d["std"] == 2.0 and d["min"] == 2.0 and d["max"] == 9.0
    assert distribution([]) is None


def test_counted_distribution_gives_exactly_the_listed_one() -> None:
    # bit-for-bit, not approx: summary.json must not change with the algorithm
    rng = random.Random(7)
    draws = [
        lambda: rng.randrange(10**9) / 1e6,  # ITL-like: integer ns over 1e6
        lambda: rng.uniform(-1, 1) * 10 ** rng.randint(-12, 12),  # magnitudes that cancel
        lambda: rng.choice([0.1, 0.2, 0.3, 1e16, -1e16, 1.0, 2.0**-30]),  # rounding ties
    ]
    for trial in range(600):
        draw = draws[trial % len(draws)]
        distinct = list(dict.fromkeys(draw() for _ in range(rng.randint(1, 20))))
        counts = {x: rng.choice([1, 2, 3, 10, 997]) for x in distinct}
        listed = list(itertools.chain.from_iterable(itertools.repeat(x, k) for x, k in counts.items()))
        rng.shuffle(listed)
        assert counted_distribution(counts) == distribution(listed)
    assert counted_distribution({}) is None


def test_itl_counts_are_the_per_request_gaps() -> None:
    records = [rec(0, 0, [10, 20, 35, 45], 50, out=4), rec(1, 0, [5, 15], 20, out=2), rec(2, 0, [], 1, out=None)]
    gaps = [g for r in records for g in request_metrics(r).itl_ms]
    assert itl_ms_counts(records) == {10.0: 3, 15.0: 1} and sum(itl_ms_counts(records).values()) == len(gaps)
    assert counted_distribution(itl_ms_counts(records)) == distribution(gaps)


def test_aggregates_exclude_warmup_and_count_failures() -> None:
    records = [
        rec(0, 0, [5, 6], 7, out=2, warmup=True),  # left out entirely
        rec(1, 1000, [1100, 1150], 1200, out=2, inp=100),
        rec(2, 1500, [1600, 1700, 1800], 3000, out=4, inp=50),
        RequestRecord(index=3, send_ns=2000 * MS, status=500, error_kind=ErrorKind.HTTP_STATUS, error="HTTP 500: boom"),
        RequestRecord(index=4, send_ns=2100 * MS, error_kind=ErrorKind.CANCELLED),
    ]
    s = summarize(records, slo=SLO(e2e_ms=1000))
    c = s["counts"]
    assert (c["total"], c["completed"], c["failed"], c["cancelled"], c["warmup"]) == (4, 2, 1, 1, 1)
    assert c["errors"] == {"http_status": 1}
    assert s["duration_s"] == pytest.approx(2.0)  # first measured send 1.0 s → last end 3.0 s
    assert s["request_throughput_rps"] == pytest.approx(1.0)
    assert s["output_token_throughput_tps"] == pytest.approx(3.0)
    assert s["total_token_throughput_tps"] == pytest.approx(78.0)
    assert s["output_tpm"] == pytest.approx(180.0)
    assert s["goodput_rps"] == pytest.approx(0.5)  # only request 1 (e2e 200 ms) meets 1 s
    assert s["ttft_ms"]["max"] == pytest.approx(100)
    assert s["error_examples"] == {"http_status": "HTTP 500: boom"}
    for key in ("ttft_ms", "ttfb_ms", "e2e_ms", "tpot_ms", "itl_ms", "decode_tps"):
        assert set(s[key]) == {"mean", "std", "min", "p50", "p90", "p95", "p99", "max"}


def test_goodput_counts_only_requests_meeting_every_slo() -> None:
    fast = rec(0, 0, [50, 60], 70, out=2)
    slow_decode = rec(1, 0, [50, 400], 410, out=2)
    s = summarize([fast, slow_decode], slo=SLO(ttft_ms=100, tpot_ms=100))
    assert s["goodput_rps"] == pytest.approx(1 / 0.41)


def test_warns_when_client_falls_behind_and_when_lengths_differ() -> None:
    late = rec(0, 50, [60, 70], 80, out=2, intended_send_ns=0, requested_output_tokens=3)
    s = summarize([late])
    assert any("fell behind" in w for w in s["warnings"])
    assert any("exactly the requested" in w for w in s["warnings"])
    on_time = rec(0, 1, [60, 70], 80, out=3, intended_send_ns=0, requested_output_tokens=3)
    assert summarize([on_time])["warnings"] == []


def test_server_timeline_comparison() -> None:
    r = rec(0, 0, [12, 20], 30, out=2, server_timeline={"first_token_ms": 10.5, "scheduled_ms": 2.0})
    sv = summarize([r])["server_timeline"]
    assert sv["ttft_error_ms"]["p50"] == pytest.approx(1.5)
    assert sv["server_ttft_ms"]["p50"] == pytest.approx(10.5)
    assert summarize([rec(0, 0, [12], 30, out=1)])["server_timeline"] is None


def test_record_json_round_trip() -> None:
    r = rec(3, 1, [2, 3], 4, out=2, error_kind=None)
    assert RequestRecord.from_json(r.to_json()) == r
    f = RequestRecord(index=1, error_kind=ErrorKind.IDLE_TIMEOUT, error="no data")
    assert RequestRecord.from_json(f.to_json()) == f


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
    (w,) = [w for w in s["warnings"] if "keep up" in w]
    assert w.startswith("the server could not keep up: offered 20.0 req/s, completed 2.5 req/s; queues grew through the run")
    # first tenth: TTFT 10 and 410 − 50 ms; last tenth: 7,210 − 900 and 7,610 − 950 ms
    assert "TTFT rose from 185 ms in the first tenth to 6,485 ms in the last" in w


def test_no_overload_warning_when_keeping_up_for_closed_loops_or_without_spread() -> None:
    def keep_up_warned(records: list[RequestRecord], **kw: object) -> bool:
        return any("keep up" in w for w in summarize(records, **kw)["warnings"])  # type: ignore[arg-type]

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


def test_a_wait_for_a_concurrency_slot_is_not_called_falling_behind() -> None:
    waited = rec(0, 50, [60, 70], 80, out=2, intended_send_ns=0)
    config = {"load": {"schedule": {"kind": "Replay", "max_concurrency": 4}}}
    ws = summarize([waited], config=config)["warnings"]
    assert any("4 --max-concurrency slots" in w for w in ws)
    assert not any("fell behind" in w for w in ws)
