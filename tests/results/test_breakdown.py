"""Where the time went: the parts of each request's latency from the server's timeline,
or the run's from its /metrics histograms."""

from __future__ import annotations

import pytest
from record_factory import MS, rec

from inferlab.results.breakdown import AGGREGATE, PER_REQUEST, LatencyBreakdown, latency_breakdown
from inferlab.results.telemetry import HistogramDelta, ServerMetrics


def timeline(scheduled: float, first: float, finished: float) -> dict[str, float]:
    return {"queued_ms": 0.0, "scheduled_ms": scheduled, "first_token_ms": first, "finished_ms": finished}


def test_per_request_parts_from_the_servers_timeline() -> None:
    # sent at 10 ms (meant for 4 ms), ended at 110 ms: E2E 100 ms, of which the server
    # spent 96 (queue 20, prefill 30, decode 46); 4 ms are the network's and HTTP's
    a = rec(0, 10, [60, 70, 106], 110, out=3, intended_send_ns=4 * MS, server_timeline=timeline(20, 50, 96))
    # sent on time, E2E 50: queue 0, prefill 10, decode 30, other 10
    b = rec(1, 0, [20, 40], 50, out=2, intended_send_ns=0, server_timeline=timeline(0, 10, 40))
    br = latency_breakdown([a, b])
    assert br is not None and br.source == PER_REQUEST and br.requests == 2
    assert br.client_queue_ms is not None and br.client_queue_ms.mean == pytest.approx(3.0)
    assert br.server_queue_ms is not None and br.server_queue_ms.mean == pytest.approx(10.0)
    assert br.prefill_ms is not None and br.prefill_ms.mean == pytest.approx(20.0) and br.prefill_ms.p50 == pytest.approx(20.0)
    assert br.decode_ms is not None and br.decode_ms.mean == pytest.approx(38.0)
    assert br.other_ms is not None and br.other_ms.mean == pytest.approx(7.0)
    assert LatencyBreakdown.from_json(br.to_json()) == br


def test_without_a_timeline_the_servers_histograms_give_the_means() -> None:
    done = [rec(0, 0, [50], 200, out=1, intended_send_ns=0), rec(1, 0, [50], 100, out=1, intended_send_ns=0)]
    m = ServerMetrics(True, histograms={
        "queue_ms": HistogramDelta(2, 10.0, None, None, None),
        "prefill_ms": HistogramDelta(2, 30.0, None, None, None),
        "decode_ms": HistogramDelta(2, 100.0, None, None, None),
    })
    br = latency_breakdown(done, m)
    assert br is not None and br.source == AGGREGATE
    assert br.server_queue_ms is not None and br.server_queue_ms.mean == 10.0 and br.server_queue_ms.p50 is None
    assert br.other_ms is not None and br.other_ms.mean == pytest.approx(150 - 140)


def test_no_source_no_breakdown() -> None:
    assert latency_breakdown([rec(0, 0, [5], 10, out=1)]) is None
    assert latency_breakdown([rec(0, 0, [5], 10, out=1)], ServerMetrics(False, "HTTP 404")) is None
