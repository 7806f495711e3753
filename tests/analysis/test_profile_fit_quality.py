"""A profile's straight-line costs say how far they can be trusted: the output length
factor built from a review's points (a vLLM CPU server, 2 requests per length, 16 → 63
ms, 64 → 531 ms, 128 → 464 ms) reported "3.33 ms per output token" without a word."""

from __future__ import annotations

from inferlab.analysis.profile import Factor, note_short_budget, output_length_factor

REVIEW_POINTS = [(16, 62.81), (64, 531.38), (128, 463.52)]


def test_the_reviews_output_length_slope_comes_with_its_caveats() -> None:
    f = output_length_factor(REVIEW_POINTS, 2, 4.24, ["output/16", "output/64", "output/128"])
    assert f.cost.startswith("3.33 ms per output token (not to be trusted: 2 requests per point")
    assert "not monotonic: 64 tokens 531 ms, then 128 tokens 464 ms" in f.cost
    assert "R² 0.55" in f.cost and "line fit R² 0.55" in f.evidence
    q = f.data["quality"]
    assert q["trusted"] is False and q["monotonic"] is False and q["requests_per_point"] == 2
    assert 0.5 < q["r2"] < 0.6


def test_a_slope_that_is_not_positive_is_not_determined() -> None:
    f = output_length_factor([(16, 500.0), (64, 300.0), (128, 250.0)], 5, 4.24, [])
    assert f.cost.startswith("not determined: E2E did not grow with the output length")
    assert f.data["ms_per_token"] is None and f.data["linear"] is None


def test_a_clean_line_says_no_caveat() -> None:
    f = output_length_factor([(16, 100.0), (64, 300.0), (128, 560.0)], 5, 4.2, [])
    assert f.cost == "4.10 ms per output token; matches TPOT at concurrency 1 (4.20 ms)"
    assert f.data["quality"]["trusted"] is True


def test_a_profile_well_short_of_its_budget_says_why_it_took_no_more_requests() -> None:
    few = output_length_factor(REVIEW_POINTS, 2, None, [])
    enough = output_length_factor([(16, 100.0), (64, 300.0), (128, 560.0)], 5, None, [])
    skipped = Factor("prefill", "prefill", "not measured", "", measured=False)
    note_short_budget([few, enough, skipped], 19.17, 150.0, 0.5)
    assert "the profile took 19 s of its 150 s budget" in few.evidence
    assert "0.5× the default sizes" in few.data["quality"]["budget_note"]
    assert "budget" not in enough.evidence and "budget_note" not in enough.data["quality"]
    late = output_length_factor(REVIEW_POINTS, 2, None, [])
    note_short_budget([late], 140.0, 150.0, 0.5)
    assert "budget" not in late.evidence
