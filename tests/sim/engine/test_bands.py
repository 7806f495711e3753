"""Error bands: the validation error shown beside every simulated headline metric."""

import json
from pathlib import Path

import pytest

from inferlab.sim.engine import bands
from inferlab.sim.engine.bands import BANDS_FILE, error_band, prediction_block, regime_of


def write(tmp_path: Path, rows: list[tuple[str, str, str, str, float, int]]) -> Path:
    path = tmp_path / "bands.json"
    keys = ("family", "regime", "split", "metric", "median_abs_pct", "rows")
    path.write_text(json.dumps({"bands": [dict(zip(keys, r, strict=True)) for r in rows]}))
    return path


def test_held_out_rows_in_the_regime_come_first_then_fit_then_every_regime(tmp_path: Path) -> None:
    path = write(tmp_path, [
        ("vllm", "Poisson", "holdout", "TTFT", 25.0, 6),
        ("vllm", "Poisson", "fit", "TTFT", 10.0, 9),
        ("vllm", "closed loop", "holdout", "TTFT", 40.0, 2),  # too few rows
        ("vllm", "closed loop", "fit", "TTFT", 12.0, 5),
        ("vllm", "all", "holdout", "E2E", 30.0, 4),
    ])
    poisson = error_band("vllm", "Poisson", "TTFT", path)
    assert poisson is not None and (poisson.pct, poisson.split) == (25.0, "holdout")
    assert poisson.describe() == "±25 % on 6 held-out vLLM V1 Poisson rows"
    closed = error_band("vllm", "closed loop", "TTFT", path)
    assert closed is not None and (closed.pct, closed.split) == (12.0, "fit")
    assert "in-sample" in closed.describe()
    e2e = error_band("vllm", "saturated", "E2E", path)
    assert e2e is not None and e2e.regime == "all" and "saturated" not in e2e.describe()
    assert error_band("sglang", "Poisson", "TTFT", path) is None  # never validated


def test_the_prediction_block_names_every_headline_metric(tmp_path: Path) -> None:
    path = write(tmp_path, [("trtllm", "offline", "holdout", "throughput", 5.7, 30)])
    block = prediction_block("trtllm", "offline", path)
    assert block["label"].startswith("prediction")
    assert block["error_bands"]["output_token_throughput_tps"]["pct"] == 5.7
    assert block["error_bands"]["ttft_ms"] is None


def test_regimes() -> None:
    assert regime_of(offline=True, closed_loop=True, burst=False) == "offline"
    assert regime_of(offline=False, closed_loop=True, burst=False) == "closed loop"
    assert regime_of(offline=False, closed_loop=False, burst=True) == "saturated"
    assert regime_of(offline=False, closed_loop=False, burst=False) == "Poisson"
    # past the engine's capacity, open or closed, the latency is the queue's
    assert regime_of(offline=False, closed_loop=False, burst=False, overloaded=True) == "saturated"
    assert regime_of(offline=False, closed_loop=True, burst=False, overloaded=True) == "saturated"


def test_the_shipped_bands_were_generated_and_agree_with_validation() -> None:
    """The file comes from the validation script (its command is in it), its regimes are
    validation's, and vLLM V1, the default, has held-out bands."""
    from inferlab.sim.validation.scenario import REGIMES

    assert bands.REGIMES == REGIMES
    data = json.loads(BANDS_FILE.read_text())
    assert data["generated_by"] == "python bench/validate_sim.py --all --write-bands"
    assert {b["regime"] for b in data["bands"]} <= {*REGIMES, "all"}
    assert any(b["family"] == "vllm" and b["split"] == "holdout" for b in data["bands"])
    band = error_band("vllm", "saturated", "TTFT")
    assert band is not None and band.pct > 0


@pytest.mark.parametrize("family", ["vllm", "sglang", "trtllm"])
def test_every_validated_family_has_a_band_for_offline_throughput_or_broader(family: str) -> None:
    assert error_band(family, "offline", "throughput") is not None


def test_a_regime_the_family_lacks_borrows_the_wider_of_its_other_loads_and_other_engines(tmp_path: Path) -> None:
    """Neither every engine in this regime nor the family in every regime is the
    prediction's own error: the wider is shown, and its words say which it is."""
    path = write(tmp_path, [
        ("vllm", "all", "holdout", "throughput", 38.0, 44),  # its bursts, not its offline rows
        ("all", "offline", "holdout", "throughput", 6.0, 30),
        ("sglang", "all", "holdout", "throughput", 4.0, 20),
        ("all", "all", "holdout", "throughput", 9.0, 300),
    ])
    band = error_band("vllm", "offline", "throughput", path)
    assert band is not None and band.pct == 38.0
    assert band.describe() == "±38 % on 44 held-out vLLM V1 rows of every load"
    band = error_band("sglang", "offline", "throughput", path)
    assert band is not None and band.describe() == "±6 % on 30 held-out offline rows of every engine"
    band = error_band("lmdeploy", "closed loop", "throughput", path)  # (neither: every row)
    assert band is not None and band.describe() == "±9 % on 300 held-out rows of every engine and load"


def test_a_statistic_takes_its_own_band_before_the_headlines_at_each_level(tmp_path: Path) -> None:
    path = tmp_path / "bands.json"
    bands_ = [
        {"family": "vllm", "regime": "Poisson", "split": "holdout", "metric": "TTFT", "median_abs_pct": 28.0, "rows": 16},
        {"family": "vllm", "regime": "Poisson", "split": "holdout", "metric": "TTFT", "median_abs_pct": 34.0, "rows": 16,
         "stat": "median"},
        {"family": "vllm", "regime": "Poisson", "split": "holdout", "metric": "TTFT", "median_abs_pct": 24.0, "rows": 2,
         "stat": "p99"},  # too few rows: the headline band of the same level, not a broader p99 one
        {"family": "all", "regime": "Poisson", "split": "holdout", "metric": "TTFT", "median_abs_pct": 9.0, "rows": 40,
         "stat": "p99"},
    ]
    path.write_text(json.dumps({"bands": bands_}))
    median = error_band("vllm", "Poisson", "TTFT", path, stat="median")
    assert median is not None and (median.pct, median.stat) == (34.0, "median")
    assert median.describe() == "±34 % on the medians of 16 held-out vLLM V1 Poisson rows"
    assert median.to_json()["stat"] == "median"
    p99 = error_band("vllm", "Poisson", "TTFT", path, stat="p99")
    assert p99 is not None and (p99.pct, p99.stat) == (28.0, "")
    headline = error_band("vllm", "Poisson", "TTFT", path)
    assert headline is not None and headline.pct == 28.0 and "stat" not in headline.to_json()
    assert error_band("sglang", "Poisson", "TTFT", path, stat="p99").describe() == (
        "±9 % on the p99s of 40 held-out Poisson rows of every engine")


def test_the_shipped_bands_hold_medians_and_p99s_apart_and_sim_run_shows_the_p50s() -> None:
    data = json.loads(BANDS_FILE.read_text())
    stats = {b.get("stat") for b in data["bands"]}
    assert stats == {None, "median", "p99"}
    block = prediction_block("vllm", "Poisson")
    assert block["error_bands"]["ttft_ms"]["stat"] == "median"
    assert "stat" not in block["error_bands"]["output_token_throughput_tps"]


def test_a_statistic_reported_by_few_of_the_rows_does_not_speak_for_the_rest(tmp_path: Path) -> None:
    """TensorRT-LLM's 15 held-out TTFT rows, 6 of which reported medians: those 6 are
    another population (one lab's bursts), so the p50 keeps the band of all 15; and a
    held-out headline band comes before an in-sample statistic's."""
    path = tmp_path / "bands.json"
    path.write_text(json.dumps({"bands": [
        {"family": "trtllm", "regime": "all", "split": "holdout", "metric": "TTFT", "median_abs_pct": 21.0, "rows": 15},
        {"family": "trtllm", "regime": "all", "split": "holdout", "metric": "TTFT", "median_abs_pct": 39.0, "rows": 6,
         "stat": "median"},
        {"family": "vllm", "regime": "all", "split": "holdout", "metric": "E2E", "median_abs_pct": 11.0, "rows": 10},
        {"family": "vllm", "regime": "all", "split": "fit", "metric": "E2E", "median_abs_pct": 3.0, "rows": 10, "stat": "p99"},
    ]}))
    band = error_band("trtllm", "saturated", "TTFT", path, stat="median")
    assert band is not None and (band.pct, band.rows, band.stat) == (21.0, 15, "")
    e2e = error_band("vllm", "closed loop", "E2E", path, stat="p99")
    assert e2e is not None and (e2e.pct, e2e.split, e2e.stat) == (11.0, "holdout", "")


def test_each_shown_statistic_gets_its_band_and_a_twins_p50_errors_never_stand_for_a_p99(tmp_path: Path) -> None:
    from inferlab.sim.engine.bands import band_of, headline_prediction

    block = prediction_block("vllm", "closed loop")
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):  # sim run shows p50s
        assert block["error_bands"][key]["stat"] == "median", key
    sweep = headline_prediction(block)
    assert sweep is not None
    for key in ("ttft_p99_ms", "tpot_p99_ms", "e2e_p99_ms"):
        assert sweep["error_bands"][key]["stat"] == "p99", key
    assert sweep["error_bands"]["ttft_p50_ms"] == block["error_bands"]["ttft_ms"]
    assert "stat" not in sweep["error_bands"]["req_s"]
    # a calibrated twin measured p50s and throughput on its own runs: no p99 band
    twin = tmp_path / "twin.json"
    twin.write_text(json.dumps({"cpu_step_s": 0.001, "calibration": {
        "split": "holdout", "runs": 4, "errors": {"TTFT": {"median_abs_pct": 5.0, "runs": 4}}}}))
    twin_block = prediction_block("vllm", "closed loop", efficiencies=str(twin))
    assert twin_block["error_bands"]["ttft_ms"]["stat"] == "median"
    assert band_of(twin_block, "TTFT", stat="median") is not None
    assert band_of(twin_block, "TTFT", stat="p99") is None
    assert (headline_prediction(twin_block) or {})["error_bands"]["ttft_p99_ms"] is None


def test_write_bands_counts_each_row_once_per_statistic(tmp_path: Path) -> None:
    """validate_sim.py --write-bands: a row's headline median counts among the medians; a
    row with a TPOT and an ITL median counts once in TPOT/ITL; means never enter them."""
    import runpy

    from inferlab.sim.validation.calibration import parse_row
    from inferlab.sim.validation.validate import Comparison

    script = runpy.run_path(str(Path(__file__).resolve().parents[3] / "bench" / "validate_sim.py"))
    base = {"row_id": "a", "engine": "vLLM", "engine_version": "0.9.2", "model": "meta-llama/Llama-3.1-8B-Instruct",
            "gpu": "H100-SXM-80GB", "tp": "1", "scenario": "poisson", "request_rate_rps": "2", "num_requests": "10",
            "input_len": "100", "output_len": "10", "ttft_ms": "50", "metric_stat": "median", "split": "holdout"}
    a = parse_row(base)
    b = parse_row({**base, "row_id": "b", "metric_stat": "mean"})
    headline = [Comparison(a, "ttft_ms", "median", 100.0, 110.0), Comparison(b, "ttft_ms", "mean", 100.0, 150.0)]
    spread = [Comparison(b, "ttft_ms", "median", 100.0, 130.0), Comparison(b, "tpot_ms", "median", 10.0, 12.0),
              Comparison(b, "itl_ms", "median", 10.0, 14.0), Comparison(b, "ttft_ms", "p99", 100.0, 90.0)]
    path = tmp_path / "bands.json"
    script["write_bands"](headline, path, spread)
    got = {(x["family"], x["regime"], x["metric"], x.get("stat")): (x["median_abs_pct"], x["rows"])
           for x in json.loads(path.read_text())["bands"] if x["split"] == "holdout"}
    assert got["vllm", "Poisson", "TTFT", None] == (30.0, 2)  # |+10|, |+50|: their median
    assert got["vllm", "Poisson", "TTFT", "median"] == (20.0, 2)  # a's headline 10, b's distribution 30
    assert got["vllm", "Poisson", "TPOT/ITL", "median"] == (30.0, 1)  # b's 20 and 40, one row
    assert got["vllm", "Poisson", "TTFT", "p99"] == (10.0, 1)
    assert ("vllm", "Poisson", "TPOT/ITL", None) not in got


def test_a_twin_band_counts_its_runs_in_words() -> None:
    """A calibration with one held-out run says "1 held-out run", not "runs"."""
    one = bands.ErrorBand("TTFT", 0.7, 1, "holdout", "vllm", "all", "/x/twin.json")
    two = bands.ErrorBand("TTFT", 0.7, 2, "holdout", "vllm", "all", "/x/twin.json")
    assert one.describe() == "±0.7 % on 1 held-out run of the calibration in twin.json"
    assert two.describe() == "±0.7 % on 2 held-out runs of the calibration in twin.json"


def test_a_twin_calibrated_before_overlap_scheduling_was_recorded_keeps_its_families_old_default(tmp_path: Path) -> None:
    """A twin file whose record does not say whether the host scheduled ahead was
    calibrated with its family's default then: off for vLLM V1 (before async scheduling
    was its default), on for SGLang. A run that differs is another server."""
    from inferlab.sim.engine.config import EngineConfig

    def twin(family: str) -> str:
        path = tmp_path / f"{family}.json"
        on = {k: v for k, v in bands.served_by(EngineConfig(engine_family=family)).items() if k != "overlap_schedule"}
        path.write_text(json.dumps({"calibration": {"split": "fit", "runs": 2, "errors": {}, "served_by": on}}))
        return str(path)

    vllm, sglang = twin("vllm"), twin("sglang")
    current = bands.served_by(EngineConfig())
    assert current["overlap_schedule"] is True
    assert bands.calibration_mismatch(vllm, current) == "overlap schedule on, calibrated off"
    assert bands.calibration_mismatch(vllm, bands.served_by(EngineConfig(overlap_schedule=False))) is None
    assert bands.calibration_mismatch(sglang, bands.served_by(EngineConfig(engine_family="sglang"))) is None


def test_a_run_longer_than_every_validated_row_says_its_bands_were_measured_on_shorter_ones(tmp_path: Path) -> None:
    from inferlab.sim.engine.bands import beyond_validated

    path = tmp_path / "bands.json"
    path.write_text(json.dumps({"bands": [], "lengths": [
        {"family": "vllm", "regime": "closed loop", "input_tokens_max": 8000, "output_tokens_max": 1000},
        {"family": "all", "regime": "all", "input_tokens_max": 32000, "output_tokens_max": 2000},
    ]}))
    said = beyond_validated("vllm", "closed loop", 20000, 200, path)
    assert said == ["its prompts (20,000 tokens on average) are longer than any validated vLLM V1 closed loop row's "
                    "(at most 8,000 on average): the bands were measured on shorter ones"]
    assert beyond_validated("vllm", "closed loop", 8000, 1000, path) == []  # (as long as the longest: inside)
    # no row of the family in the regime: every family's over every regime
    said = beyond_validated("sglang", "Poisson", 100, 3000, path)
    assert len(said) == 1 and "answers (3,000 tokens" in said[0] and "any validated row of any engine's (at most 2,000" in said[0]
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"bands": []}))  # (written before lengths were: nothing to say)
    assert beyond_validated("vllm", "closed loop", 10**6, 10**6, old) == []


def test_the_shipped_bands_say_how_long_the_validated_rows_were() -> None:
    from inferlab.sim.engine.bands import beyond_validated

    assert beyond_validated("vllm", "closed loop", 20000, 200) and not beyond_validated("vllm", "closed loop", 1000, 200)


def test_a_band_reads_the_same_wherever_it_is_shown() -> None:
    """A band of 4.5 % read "±5 %" in its own text and the line under a sweep's table, and
    "±4 %" in each point's line and the report's column (Python's format rounds halves to
    even, and the text was made from the unrounded value)."""
    from inferlab.report.sweep import bands_short
    from inferlab.sim.engine.bands import ErrorBand

    for pct, shown in ((4.5, "5"), (4.52, "5"), (4.4, "4"), (12.5, "13"), (2.5, "3")):
        band = ErrorBand("throughput", pct, 27, "holdout", "vllm", "Poisson").to_json()
        assert band["text"].startswith(f"±{shown} %"), band
        short = bands_short({"error_bands": {"output_tok_s": band, "req_s": band}})
        assert f"±{shown} %" in short, (pct, short)
