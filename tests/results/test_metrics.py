import itertools
import random

import pytest
from record_factory import MS, rec

from inferlab.results.metrics import (
    DISTRIBUTION_KEYS,
    SLO,
    Distribution,
    counted_distribution,
    distribution,
    itl_ms_counts,
    key_percentile,
    percentile,
    percentile_key,
    request_metrics,
)
from inferlab.results.records import ErrorKind, RequestRecord


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


def test_a_one_token_answer_meets_any_tpot_slo_as_vllms_goodput_counts_it() -> None:
    # (it has no TPOT; goodput counted it as missing every TPOT limit, while --save-result's
    # vLLM goodput, from the same records, counted it as meeting it)
    one = request_metrics(rec(0, 0, [10], 12, out=1))
    assert SLO(tpot_ms=1.0).met_by(one)
    assert SLO(ttft_ms=20.0, tpot_ms=1.0).met_by(one) and not SLO(ttft_ms=5.0, tpot_ms=1.0).met_by(one)
    slow = request_metrics(rec(0, 0, [10, 30], 31, out=2))
    assert not SLO(tpot_ms=1.0).met_by(slow)


def test_percentiles_interpolate_like_numpy() -> None:
    xs = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(xs, 50) == 3.0
    assert percentile(xs, 90) == pytest.approx(4 + 0.6 * 6)  # numpy.percentile(xs, 90) == 7.6
    d = distribution([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])
    assert d is not None
    assert (d.mean, d.std, d.min, d.max) == (5.0, 2.0, 2.0, 9.0)
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


def test_record_json_round_trip() -> None:
    r = rec(3, 1, [2, 3], 4, out=2, error_kind=None)
    assert RequestRecord.from_json(r.to_json()) == r
    f = RequestRecord(index=1, error_kind=ErrorKind.IDLE_TIMEOUT, error="no data")
    assert RequestRecord.from_json(f.to_json()) == f


def test_chosen_percentiles_are_added_after_the_fixed_keys() -> None:
    xs = [float(x) for x in range(1, 1001)]
    d = distribution(xs, [50, 99.9, 99, 0.5])
    assert d is not None
    assert d.extra == ((0.5, percentile(xs, 0.5)), (99.9, percentile(xs, 99.9)))  # fixed ones once
    j = d.to_json()
    assert list(j) == ["mean", "std", "min", "p50", "p90", "p95", "p99", "max", "p0_5", "p99_9"]
    assert Distribution.from_json(j) == d
    assert d.percentile(99.9) == j["p99_9"] and d.percentile(90) == d.p90
    plain = distribution(xs)
    assert plain is not None and list(plain.to_json()) == list(DISTRIBUTION_KEYS)  # the contract
    counts: dict[float, int] = {1.0: 3, 2.5: 1, 7.0: 996}
    listed = [x for x, k in counts.items() for _ in range(k)]
    assert counted_distribution(counts, [99.9]) == distribution(listed, [99.9])


def test_percentile_keys_are_plain_identifiers_that_read_back() -> None:
    for q, key in ((99, "p99"), (99.9, "p99_9"), (0.5, "p0_5"), (99.99, "p99_99"), (100, "p100"), (0, "p0")):
        assert percentile_key(q) == key and key_percentile(key) == q
    assert key_percentile("mean") is None and key_percentile("p99.9") is None
    with pytest.raises(ValueError, match="between 0 and 100"):
        percentile_key(100.5)
