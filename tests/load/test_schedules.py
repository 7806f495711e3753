import itertools
import math
import random
import statistics

import pytest

from inferlab._errors import UsageError
from inferlab.load.schedules import ClosedLoop, OpenLoop


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def test_constant_arrivals_are_evenly_spaced() -> None:
    times = OpenLoop(4.0, "constant").arrival_times_s(seed=0, num_requests=9, duration_s=None)
    assert times[0] == 0.0
    assert times[-1] == pytest.approx(2.0)
    assert all(g == pytest.approx(0.25) for g in gaps(times))


def test_poisson_gaps_have_exponential_statistics() -> None:
    times = OpenLoop(10.0, "poisson").arrival_times_s(seed=3, num_requests=20001, duration_s=None)
    g = gaps(times)
    mean = statistics.fmean(g)
    assert mean == pytest.approx(0.1, rel=0.03)
    # exponential: coefficient of variation 1, P(gap > mean) = e^-1
    assert statistics.pstdev(g) / mean == pytest.approx(1.0, rel=0.05)
    assert sum(x > 0.1 for x in g) / len(g) == pytest.approx(math.exp(-1), abs=0.015)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_keeps_the_rate_and_sets_the_variability(burstiness: float) -> None:
    times = OpenLoop(5.0, "gamma", burstiness).arrival_times_s(seed=7, num_requests=20001, duration_s=None)
    g = gaps(times)
    mean = statistics.fmean(g)
    assert mean == pytest.approx(0.2, rel=0.04)
    # gamma with shape k has CV = 1/sqrt(k)
    assert statistics.pstdev(g) / mean == pytest.approx(1 / math.sqrt(burstiness), rel=0.06)


def test_same_seed_same_schedule_and_different_seed_differs() -> None:
    s = OpenLoop(3.0, "poisson")
    assert s.arrival_times_s(1, 50, None) == s.arrival_times_s(1, 50, None)
    assert s.arrival_times_s(1, 50, None) != s.arrival_times_s(2, 50, None)


def test_duration_bounds_the_schedule() -> None:
    times = OpenLoop(100.0, "poisson").arrival_times_s(seed=0, num_requests=None, duration_s=2.0)
    assert all(t < 2.0 for t in times)
    assert 150 < len(times) < 250  # ~200 expected; 7 sigma either side


def test_infinite_rate_sends_everything_at_zero() -> None:
    assert OpenLoop(math.inf).arrival_times_s(0, 5, None) == [0.0] * 5
    with pytest.raises(UsageError):
        OpenLoop(math.inf).arrival_times_s(0, None, 10.0)


def test_bad_values_are_usage_errors() -> None:
    with pytest.raises(UsageError):
        ClosedLoop(0)
    with pytest.raises(UsageError):
        OpenLoop(0.0)
    with pytest.raises(UsageError):
        OpenLoop(1.0, "gamma", burstiness=0)
    with pytest.raises(UsageError):
        OpenLoop(1.0).arrival_times_s(0, None, None)


def test_gap_draws_do_not_depend_on_global_random_state() -> None:
    s = OpenLoop(2.0, "gamma", 0.5)
    a = s.arrival_times_s(5, 10, None)
    random.seed(123)
    assert s.arrival_times_s(5, 10, None) == a
