"""The sweep's error-band lines: one band per metric class where its columns share it,
one per column where validation measured each statistic apart."""

from inferlab.report.sweep import band_lines, bands_short


def _index(bands: dict) -> dict:
    pred = {"engine_family": "vllm", "regime": "closed loop", "error_bands": bands}
    return {"points": [{"params": {"concurrency": 1}, "headline": {"ttft_p50_ms": 1.0}, "prediction": pred}]}


def _band(pct: float, text: str) -> dict:
    return {"pct": pct, "rows": 9, "split": "holdout", "family": "vllm", "regime": "closed loop", "text": text}


def test_columns_sharing_a_band_show_it_once_and_columns_measured_apart_show_each() -> None:
    shared = _band(16.0, "±16 % on 9 rows")
    old = _index({"ttft_p50_ms": shared, "ttft_p99_ms": shared})  # a file without per-statistic bands
    assert "TTFT ±16 % on 9 rows" in band_lines(old)[0] and "TTFT p50" not in band_lines(old)[0]
    assert bands_short(old["points"][0]["prediction"]).startswith("TTFT ±16 %")
    apart = _index({"ttft_p50_ms": _band(23.0, "±23 % on the medians of 9 rows"),
                    "ttft_p99_ms": _band(9.0, "±9 % on the p99s of 9 rows")})
    line = band_lines(apart)[0]
    assert "TTFT p50 ±23 % on the medians of 9 rows; TTFT p99 ±9 % on the p99s of 9 rows" in line
    assert bands_short(apart["points"][0]["prediction"]).startswith("TTFT ±23/9 % (p50/p99), TPOT not validated")
    assert "TPOT not validated" in line  # (no band for it in this index)


def test_an_advisors_gain_takes_the_band_of_its_statistic() -> None:
    from inferlab.analysis.advise import _band_stat

    assert [_band_stat(m) for m in ("TPOT p50 ms", "short requests' p99 TTFT ms", "median TTFT ms of the prompts",
                                    "mean TTFT ms", "p90 E2E ms", "output tok/s")] == ["median", "p99", "median", None, None, None]
