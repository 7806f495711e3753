"""The sweep's pure parts: the saturation rules, the goodput search's bracketing and
bisection (against a stand-in probe with a known threshold), and the t interval."""

from __future__ import annotations

import asyncio
import random
import statistics

import pytest

from inferlab.sweep.goodput import Probe, find_max_rate
from inferlab.sweep.saturation import SaturationRules, check
from inferlab.sweep.stats import t975, t_interval


def head(tps: float, ttft: float = 100.0, failed: int = 0) -> dict[str, float]:
    return {"output_tok_s": tps, "ttft_p50_ms": ttft, "failed": failed, "total": 10}


def test_throughput_still_rising_does_not_stop_and_flat_throughput_names_the_previous_load_as_knee() -> None:
    rules = SaturationRules()
    assert check(rules, "concurrency", (8, head(1000)), (16, head(1100))) is None  # +10 %
    stop = check(rules, "concurrency", (16, head(1000)), (32, head(1030)))  # +3 %
    assert stop is not None and stop.rule == "throughput" and (stop.at, stop.knee) == (32, 16)
    assert "+3.0%" in stop.reason and "c=16" in stop.reason and "to 32" in stop.reason


def test_the_gain_threshold_is_the_flag() -> None:
    assert check(SaturationRules(min_gain=0.02), "concurrency", (16, head(1000)), (32, head(1030))) is None
    assert check(SaturationRules(min_gain=0.2), "rate", (1, head(1000)), (2, head(1150))) is not None


def test_errors_stop_first_even_while_throughput_rises_and_at_the_first_load_there_is_no_knee() -> None:
    stop = check(SaturationRules(), "rate", (1, head(100)), (2, head(190, failed=3)))
    assert stop is not None and stop.rule == "errors" and stop.knee == 1
    first = check(SaturationRules(), "rate", None, (1, head(100, failed=1)))
    assert first is not None and first.knee is None
    assert check(SaturationRules(on_errors=False), "rate", None, (1, head(100, failed=1))) is None


def test_ttft_exploding_stops_even_while_throughput_rises() -> None:
    stop = check(SaturationRules(max_ttft_growth=4), "rate", (10, head(1000, ttft=100)), (20, head(1500, ttft=900)))
    assert stop is not None and stop.rule == "ttft" and stop.knee == 10
    assert check(SaturationRules(max_ttft_growth=10), "rate", (10, head(1000, ttft=100)), (20, head(1500, ttft=900))) is None


def test_ttft_growing_with_the_throughput_it_bought_is_no_stop() -> None:
    """One user to eight: TTFT 5x (eight prefills queue) for 6.6x the throughput is a
    load step that paid; 5x for 1.1x is not."""
    assert check(SaturationRules(), "concurrency", (1, head(137, ttft=40)), (8, head(902, ttft=203))) is None
    stop = check(SaturationRules(), "concurrency", (8, head(902, ttft=40)), (16, head(990, ttft=203)))
    assert stop is not None and stop.rule == "ttft" and "for 1.1x the output tok/s" in stop.reason


def test_a_missing_metric_fires_no_rule() -> None:
    none = {"output_tok_s": None, "ttft_p50_ms": None, "failed": 0}
    assert check(SaturationRules(), "concurrency", (1, none), (2, none)) is None


def _threshold_probe(limit: float, seen: list[float]):  # type: ignore[no-untyped-def]
    async def probe(rate: float) -> Probe:
        seen.append(rate)
        return Probe(rate, 1.0 if rate <= limit else 0.0, rate <= limit)

    return probe


@pytest.mark.parametrize("limit,start", [(37.0, 1.0), (0.3, 5.0), (5.0, 5.0), (1000.0, 3.0)])
def test_the_search_returns_a_passing_rate_whose_next_step_up_fails(limit: float, start: float) -> None:
    seen: list[float] = []
    result = asyncio.run(find_max_rate(_threshold_probe(limit, seen), start))
    assert result.max_rate is not None and result.fails_at is not None
    assert result.max_rate <= limit < result.fails_at
    assert result.fails_at == pytest.approx(result.max_rate * 1.1)
    assert result.max_rate > limit / 1.1  # within the step of the true limit
    assert [p.rate_rps for p in result.probes] == seen  # every probe recorded, in order
    assert len(seen) < 25


def test_a_search_where_no_rate_meets_the_slos_says_so() -> None:
    result = asyncio.run(find_max_rate(_threshold_probe(0.0, []), 1.0))
    assert result.max_rate is None and result.note is not None and "no rate" in result.note


def test_halving_stops_where_requests_that_barely_overlap_still_miss() -> None:
    """An SLO no request meets even alone: each halving (at least twice the wall time over
    HTTP) cannot help once the requests barely overlap; the search stops there and says
    so, where without that measure it halves sixteen times."""
    async def probe(rate: float) -> Probe:
        return Probe(rate, 0.0, False, in_flight=rate * 0.8)  # (0.8 s a request: 0.8 in flight at 1 req/s)

    result = asyncio.run(find_max_rate(probe, 8.0))
    assert [p.rate_rps for p in result.probes] == [8.0, 4.0, 2.0, 1.0]
    assert result.max_rate is None and result.note is not None and "barely overlapped (0.80 in flight" in result.note
    unmeasured = asyncio.run(find_max_rate(_threshold_probe(0.0, []), 8.0))
    assert len(unmeasured.probes) == 17 and "no rate down to" in (unmeasured.note or "")


def test_an_interrupted_probe_ends_the_search_with_what_passed() -> None:
    async def probe(rate: float) -> Probe:
        return Probe(rate, 1.0, True, stopped=rate >= 4)

    result = asyncio.run(find_max_rate(probe, 1.0))
    assert (result.max_rate, result.fails_at, result.note) == (2.0, None, "interrupted")


def test_t_quantiles_the_table_and_the_expansion_agree_where_they_meet() -> None:
    assert t975(30) == pytest.approx(t975(31), rel=0.01)
    assert t975(1) > t975(2) > t975(10) > t975(100) > 1.959


def test_the_95_percent_interval_covers_the_true_mean_about_95_percent_of_the_time() -> None:
    rng = random.Random(7)
    trials, hits = 2000, 0
    for _ in range(trials):
        sample = [rng.gauss(10.0, 2.0) for _ in range(5)]
        iv = t_interval(sample)
        assert iv.low is not None and iv.high is not None
        hits += iv.low <= 10.0 <= iv.high
    assert 0.93 <= hits / trials <= 0.97


def test_one_repeat_has_a_mean_and_no_interval() -> None:
    iv = t_interval([3.0])
    assert (iv.mean, iv.low, iv.high, iv.n) == (3.0, None, None, 1)
    assert t_interval([1.0, 3.0]).mean == statistics.fmean([1.0, 3.0])


def test_a_probe_that_cannot_run_ends_the_search_with_its_reason() -> None:
    async def probe(rate: float) -> Probe:
        return Probe(rate, None, False, error="weights do not fit")

    result = asyncio.run(find_max_rate(probe, 1.0))
    assert (result.max_rate, result.note, len(result.probes)) == (None, "weights do not fit", 1)
