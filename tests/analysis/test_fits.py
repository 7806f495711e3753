"""The profile's fits on numbers with known answers."""

from __future__ import annotations

import pytest

from inferlab.analysis.fits import MIN_R2, knee, line_quality, linear_fit, prefill_fit


def test_a_straight_line_gives_back_its_overhead_and_rate() -> None:
    # 40 ms fixed + 20,000 tokens/s (0.05 ms per token)
    pts = [(x, 40 + 0.05 * x) for x in (128, 256, 512, 1024, 2048, 4096)]
    f = prefill_fit(pts)
    assert f.overhead_ms == pytest.approx(40)
    assert f.prefill_tps == pytest.approx(20_000)
    assert f.residual_pct == pytest.approx(0, abs=1e-9)
    assert not f.superlinear and f.step_at_tokens is None


def test_quadratic_growth_is_flagged_super_linear() -> None:
    pts = [(x, 40 + 0.02 * x + 4e-6 * x * x) for x in (128, 256, 512, 1024, 2048, 4096, 8192)]
    f = prefill_fit(pts)
    assert f.superlinear and f.growth_ratio is not None and f.growth_ratio > 1.3
    assert f.step_at_tokens is None


def test_one_jump_is_a_step_not_super_linear() -> None:
    # a budget of 2,048 tokens: past it the prompt takes a second step of ~60 ms
    pts = [(x, 40 + 0.02 * x + (60 if x > 2048 else 0)) for x in (256, 512, 1024, 2048, 2560, 3072, 4096)]
    f = prefill_fit(pts)
    assert f.step_at_tokens == 2048
    assert not f.superlinear


def test_a_flat_ttft_has_no_rate() -> None:
    assert prefill_fit([(100, 50.0), (1000, 50.0)]).prefill_tps is None
    with pytest.raises(ValueError):
        linear_fit([1.0, 1.0], [2.0, 3.0])


def test_the_knee_is_where_doubling_stops_paying() -> None:
    c = [1, 2, 4, 8, 16, 32]
    tput = [100, 200, 390, 700, 760, 770]  # 8 → 16 adds 9 %: the knee is at 8
    k = knee(c, tput, [1.0, 2.0, 3.5, 6.0, 5.0, 1.0])
    assert k.knee_concurrency == 8 and k.best_goodput_concurrency == 8
    assert knee(c, [100 * x for x in c], [None] * 6).knee_concurrency is None


def test_a_step_that_paid_little_is_no_knee_while_a_higher_concurrency_pays_over_it() -> None:
    """A real llama-server's ladder: 774, 873, 1,021, 1,408 tokens/s at 1, 2, 4, 8. 1 → 2
    gained 12.8 % (< 15 %), and the knee was put at 1, though 8 nearly doubles it. The
    knee is now where no higher concurrency pays over it, scaled per doubling."""
    c = [1, 2, 4, 8]
    assert knee(c, [774.0, 873.0, 1021.0, 1408.0], [None] * 4).knee_concurrency is None
    # 2 → 16 grows 1.4× where three doublings need 1.52×: past 2 nothing paid for good
    assert knee([1, 2, 4, 8, 16], [100.0, 200.0, 220.0, 240.0, 280.0], [None] * 5).knee_concurrency == 2
    # a dip that the next step more than makes up is no knee either
    assert knee([1, 2, 4, 8], [100.0, 95.0, 200.0, 400.0], [None] * 4).knee_concurrency is None


#: A review's output length points on a vLLM CPU server (max tokens, median E2E ms of 2
#: requests each): 128 tokens took less than 64.
REVIEW_OUTPUT = [(16.0, 62.81), (64.0, 531.38), (128.0, 463.52)]


def test_a_noisy_non_monotonic_line_of_few_requests_is_not_trusted() -> None:
    q = line_quality(REVIEW_OUTPUT, 2, " tokens")
    assert not q.trusted and not q.monotonic and q.requests_per_point == 2
    assert q.r2 is not None and q.r2 < MIN_R2
    assert any("2 requests per point" in c for c in q.caveats)
    assert any("64 tokens 531 ms, then 128 tokens 464 ms" in c for c in q.caveats)
    assert any("R² 0.55" in c for c in q.caveats)
    assert q.words().startswith("not to be trusted: ")


def test_a_clean_line_of_enough_requests_is_trusted_and_a_falling_one_never() -> None:
    q = line_quality([(x, 40 + 0.05 * x) for x in (128.0, 256.0, 512.0, 1024.0)], 5)
    assert q.trusted and q.monotonic and q.caveats == [] and q.words() == ""
    assert q.r2 == pytest.approx(1.0)
    falling = line_quality([(16.0, 500.0), (64.0, 300.0)], 5)
    assert not falling.trusted and "the slope is not positive" in falling.caveats
