"""``sim calibrate``: a twin fitted on concurrency-1 runs of a "server" whose constants
are known (the simulator itself, run with other constants than the defaults the fit
starts from) recovers them and predicts held-out runs at higher concurrency."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from inferlab.cli.main import main
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.validation.twin import calibrate, median_abs_error, read_run

# the "server": another host cost per step, another compute efficiency and a slower API
TRUTH = {"gemm_compute": 0.35, "cpu_step_s": 0.004, "api_overhead_s": 0.012}
FIT = ("gemm_compute", "cpu_step_s", "api_overhead_s")
ENGINE = ["--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "L40S", "--max-num-batched-tokens", "2048"]


def sim_run(out: Path, *args: str) -> str:
    res = CliRunner().invoke(main, ["sim", "run", *ENGINE, "--api", "completions", "-o", str(out), *args])
    assert res.exit_code == 0, res.stderr
    return str(out)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[str]]:
    d = tmp_path_factory.mktemp("server")
    truth = d / "truth.json"
    truth.write_text(json.dumps(TRUTH))
    eff = ["--efficiencies", str(truth)]
    fit = [sim_run(d / f"c1-in{n}", "-c", "1", "-n", "6", "--input-tokens", str(n), "--output-tokens", "32", *eff)
           for n in (128, 1024, 3000)]
    held = [sim_run(d / f"c{c}", "-c", str(c), "-n", str(4 * c), "--input-tokens", "1024", "--output-tokens", "64", *eff)
            for c in (4, 16)]
    return fit, held


def engine() -> EngineConfig:
    return EngineConfig(model="Qwen/Qwen2.5-7B-Instruct", gpu="L40S", max_num_batched_tokens=2048)


def test_the_fit_recovers_the_servers_constants_and_predicts_held_out_runs(measured: tuple[list[str], list[str]]) -> None:
    fit_dirs, held_dirs = measured
    fit = calibrate(engine(), [read_run(d) for d in fit_dirs], [read_run(d) for d in held_dirs], FIT)
    for name, value in TRUTH.items():
        assert fit.constants[name] == pytest.approx(value, rel=0.15), name
    for metric in ("ttft_p50_ms", "e2e_p50_ms", "tpot_p50_ms", "output_tok_s"):
        held = median_abs_error(fit.holdout_runs, metric)
        assert held is not None and held < 0.05, (metric, held)
    # the defaults it started from predict the held-out runs worse
    start = calibrate(engine(), [read_run(d) for d in fit_dirs], [read_run(d) for d in held_dirs], FIT, max_evaluations=1)
    assert median_abs_error(start.holdout_runs, "ttft_p50_ms") > 3 * (median_abs_error(fit.holdout_runs, "ttft_p50_ms") or 0)  # type: ignore[operator]


def test_cli_writes_an_efficiencies_file_sim_run_takes(measured: tuple[list[str], list[str]], tmp_path: Path) -> None:
    fit_dirs, held_dirs = measured
    eff = tmp_path / "twin.json"
    report = tmp_path / "report.json"
    args = ["sim", "calibrate", *ENGINE, *fit_dirs, "--fit", ",".join(FIT), "-o", str(eff), "--report", str(report)]
    for h in held_dirs:
        args += ["--holdout", h]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.stderr
    assert "held out" in res.stdout and "prediction" in res.stdout
    # (the header says what the fit matched, TPOT among them)
    said = " ".join(res.stderr.split())  # (the console wraps long lines)
    assert all(m in said for m in ("TTFT p50", "TPOT p50", "E2E p50", "out tok/s")), res.stderr
    written = json.loads(eff.read_text())
    assert set(written) == {*FIT, "calibration"}
    reported = json.loads(report.read_text())
    assert reported["prediction"] is True
    # the twin's what-if: sim run with the file predicts the held-out run it was not fitted on
    held = json.loads((Path(held_dirs[0]) / "summary.json").read_text())
    res = CliRunner().invoke(main, ["sim", "run", *ENGINE, "--api", "completions", "-c", "4", "-n", "16",
                                    "--input-tokens", "1024", "--output-tokens", "64", "--efficiencies", str(eff), "--json"])
    assert res.exit_code == 0, res.stderr
    what_if = json.loads(res.stdout)
    assert what_if["ttft_ms"]["p50"] == pytest.approx(held["ttft_ms"]["p50"], rel=0.05)
    # its error bands are the twin's own held-out error (the stock constants' bands say
    # nothing about other constants), read from the report's held-out runs here
    errors = sorted(abs(r["error"]["ttft_p50_ms"]) for r in reported["holdout"])
    band = what_if["prediction"]["error_bands"]["ttft_ms"]
    assert (band["split"], band["rows"], band["twin"]) == ("holdout", 2, str(eff))
    assert band["pct"] == pytest.approx(100 * (errors[0] + errors[1]) / 2, abs=0.06)
    assert "on 2 held-out runs of the calibration in twin.json" in band["text"]
    shown = CliRunner().invoke(main, ["sim", "run", *ENGINE, "-c", "4", "-n", "8", "--efficiencies", str(eff)])
    assert "held-out runs of the calibration in twin.json" in " ".join(shown.stdout.split())
    # the bands hold for the server it was calibrated on: a flag asked about keeps them,
    # another GPU or model is another server and gets none (with the reason)
    on = written["calibration"]["served_by"]
    assert "L40S" in on["gpu"] and "Qwen2.5-7B" in on["model"] and on["tensor_parallel_size"] == 1
    for other, kept in ((["--max-num-batched-tokens", "4096"], True), (["--gpu", "H100"], False),
                        (["--model", "meta-llama/Llama-3.1-8B-Instruct"], False), (["--tensor-parallel-size", "2"], False),
                        (["--no-async-scheduling"], False),  # (calibrated with it on: a vLLM of 0.14 on)
                        (["--engine-version", "0.18"], False)):  # (0.19's admission, 0.24's free queue)
        res = CliRunner().invoke(main, ["sim", "run", *ENGINE, *other, "-c", "4", "-n", "8", "--efficiencies", str(eff), "--json"])
        assert res.exit_code == 0, res.stderr
        block = json.loads(res.stdout)["prediction"]
        assert (block["error_bands"]["ttft_ms"] is not None) == kept, other
        assert ("mismatch" in block) != kept, other
    shown = CliRunner().invoke(main, ["sim", "run", *ENGINE, "--gpu", "H100", "-c", "4", "-n", "8", "--efficiencies", str(eff)])
    assert "twin.json was calibrated on another server (gpu" in " ".join(shown.stdout.split())
    # a later calibration starts from this file's constants (its record set aside)
    from inferlab.sim.validation.twin import _overridden
    assert set(_overridden(EngineConfig(model="Qwen/Qwen2.5-7B-Instruct", efficiencies_path=str(eff)))) == set(FIT)


def test_constants_no_calibration_validated_get_no_stock_bands(tmp_path: Path) -> None:
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps({"gemm_compute": 0.3}))
    runs = {}
    for name, extra in (("stock", []), ("edited", ["--efficiencies", str(edited)])):
        res = CliRunner().invoke(main, ["sim", "run", *ENGINE, "-c", "4", "-n", "8", "--json", *extra])
        assert res.exit_code == 0, res.stderr
        runs[name] = json.loads(res.stdout)["prediction"]
    assert runs["stock"]["error_bands"]["ttft_ms"] is not None and "efficiencies" not in runs["stock"]
    assert runs["edited"]["efficiencies"] == str(edited)
    assert all(v is None for v in runs["edited"]["error_bands"].values())
    shown = CliRunner().invoke(main, ["sim", "run", *ENGINE, "-c", "4", "-n", "8", "--efficiencies", str(edited)])
    assert "not validated: constants from edited.json" in " ".join(shown.stdout.split())


@pytest.mark.parametrize(("args", "needle"), [
    (["--fit", "warp_factor"], "not a step-time constant"),
    (["--fit", "moe_gemm_factor"], "not one the twin fits"),
    # a stated latency would replace the fitted one in every evaluation: the fit moot
    (["--api-latency-ms", "3"], "--api-latency-ms sets api_overhead_s"),
])
def test_cli_refuses_constants_it_cannot_fit(measured: tuple[list[str], list[str]], tmp_path: Path, args: list[str], needle: str) -> None:
    res = CliRunner().invoke(main, ["sim", "calibrate", *ENGINE, measured[0][0], "-o", str(tmp_path / "x.json"), *args])
    assert res.exit_code == 2 and needle in res.stderr


def test_a_folder_without_a_run_is_refused(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["sim", "calibrate", str(tmp_path), "-o", str(tmp_path / "x.json")])
    assert res.exit_code == 2 and "not a run directory" in res.stderr


@pytest.mark.parametrize("flag", ["-o", "--report"])
def test_an_output_in_a_missing_folder_is_refused_before_the_fit(
    measured: tuple[list[str], list[str]], tmp_path: Path, flag: str
) -> None:
    # (it was an internal error after the whole fit had run)
    files = {"-o": str(tmp_path / "x.json"), flag: str(tmp_path / "no" / "x.json")}
    res = CliRunner().invoke(main, ["sim", "calibrate", *ENGINE, measured[0][0], *(a for kv in files.items() for a in kv)])
    assert res.exit_code == 2 and "no folder" in res.stderr, res.stderr
    assert "fitting" not in res.stderr


def test_an_eager_engine_fits_the_eager_step_cost(measured: tuple[list[str], list[str]]) -> None:
    eager = EngineConfig(model="Qwen/Qwen2.5-7B-Instruct", gpu="L40S", max_num_batched_tokens=2048, enforce_eager=True)
    fit = calibrate(eager, [read_run(measured[0][0])], (), FIT, max_evaluations=1)
    assert set(fit.constants) == {"gemm_compute", "cpu_step_eager_s", "api_overhead_s"}


def test_a_stated_latency_goes_into_the_twin_and_a_different_one_is_refused_with_it(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """``--api-latency-ms`` with a fit that leaves the latency out: the twin file keeps
    it, so ``sim run --efficiencies`` predicts what the fit saw; stating another latency
    beside a file that sets one is refused (its band measured the file's)."""
    fit_dirs, _ = measured
    eff = tmp_path / "twin.json"
    res = CliRunner().invoke(main, ["sim", "calibrate", *ENGINE, *fit_dirs, "--fit", "gemm_compute,cpu_step_s",
                                    "--api-latency-ms", "12", "--max-evaluations", "60", "-o", str(eff)])
    assert res.exit_code == 0, res.stderr
    assert json.loads(eff.read_text())["api_overhead_s"] == pytest.approx(0.012)
    run = ["sim", "run", *ENGINE, "-c", "1", "-n", "4", "--input-tokens", "128", "--output-tokens", "8", "--json"]
    with_file = CliRunner().invoke(main, [*run, "--efficiencies", str(eff)])
    stated = CliRunner().invoke(main, [*run, "--efficiencies", str(eff), "--api-latency-ms", "12"])
    assert with_file.exit_code == 0 and stated.exit_code == 0, with_file.stderr + stated.stderr
    assert json.loads(with_file.stdout)["config"]["engine"]["api_overhead_s"] == pytest.approx(0.012)
    other = CliRunner().invoke(main, [*run, "--efficiencies", str(eff), "--api-latency-ms", "3"])
    assert other.exit_code == 2 and "sets it" in other.stderr
    # an offline run of the twin records latency 0 (no API server): its replay takes the
    # file and that 0 without a conflict
    off = tmp_path / "offline"
    res = CliRunner().invoke(main, ["sim", "run", *ENGINE, "-n", "4", "--rate", "inf", "--input-tokens", "128",
                                    "--output-tokens", "8", "--efficiencies", str(eff), "-o", str(off)])
    assert res.exit_code == 0, res.stderr
    again = CliRunner().invoke(main, ["sim", "run", "--trace", str(off / "requests.jsonl"), "--offline", "--json"])
    assert again.exit_code == 0, again.stderr


def test_the_fit_is_judged_on_tpot_where_the_run_measured_one() -> None:
    """TPOT is fitted, not only reported: a prediction off on TPOT alone costs the fit,
    as much as one off on TTFT by the same factor; a run whose requests had one output
    token each measured no TPOT, and whatever the twin predicts for it costs nothing."""
    from inferlab.sim.validation.twin import MeasuredRun, loss

    measured = {"ttft_p50_ms": 40.0, "tpot_p50_ms": 12.0, "e2e_p50_ms": 800.0, "output_tok_s": 900.0}
    run = MeasuredRun("r", None, measured)  # type: ignore[arg-type]  # (the loss reads what was measured only)
    assert loss([dict(measured)], [run]) == 0.0
    slow_decode = loss([{**measured, "tpot_p50_ms": 24.0}], [run])
    assert slow_decode > 0.0 and slow_decode == pytest.approx(loss([{**measured, "ttft_p50_ms": 80.0}], [run]))
    one_token = MeasuredRun("r1", None, {m: v for m, v in measured.items() if m != "tpot_p50_ms"})  # type: ignore[arg-type]
    assert loss([{**measured, "tpot_p50_ms": 24.0}], [one_token]) == 0.0


def test_runs_of_one_output_token_calibrate_without_a_tpot(tmp_path: Path) -> None:
    """Runs that measured no TPOT (one output token a request) still calibrate, and the
    twin's record names no TPOT error it never had."""
    runs = [read_run(sim_run(tmp_path / f"c1-in{n}", "-c", "1", "-n", "4", "--input-tokens", str(n), "--output-tokens", "1"))
            for n in (256, 2048)]
    assert all("tpot_p50_ms" not in r.measured for r in runs)
    fit = calibrate(engine(), runs, [], ("gemm_compute", "api_overhead_s"), max_evaluations=8)
    from inferlab.sim.validation.twin import calibration_record

    record = calibration_record(fit)
    assert "TTFT" in record["errors"] and "TPOT/ITL" not in record["errors"]


def said(runs: list[str], into: Path, *software: dict[str, Any] | None) -> list[str]:
    """Copies of ``runs`` whose config.json records that their server said ``software``
    (one each, as bench records it; None: it said nothing inferlab knows)."""
    out = []
    for run, sw in zip(runs, software, strict=True):
        copy = into / Path(run).name
        shutil.copytree(run, copy)
        config = json.loads((copy / "config.json").read_text())
        config["resolved"] = {**(config.get("resolved") or {}), "server_software": sw}
        (copy / "config.json").write_text(json.dumps(config))
        out.append(str(copy))
    return out


def vllm(version: str) -> dict[str, Any]:
    return {"name": "vLLM", "version": version, "source": "GET /version"}


def calibrate_cli(runs: list[str], out: Path, *flags: str) -> Any:
    return CliRunner().invoke(main, ["sim", "calibrate", *ENGINE, *flags, *runs, "--fit", "gemm_compute",
                                     "--max-evaluations", "3", "-o", str(out)])


def test_the_twin_takes_the_release_the_runs_server_said_and_sim_run_takes_it_from_the_twin(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    runs = said(measured[0], tmp_path, vllm("0.13.0"), vllm("0.13.0"), None)  # (one run from before the record)
    twin = tmp_path / "twin.json"
    res = calibrate_cli(runs, twin)
    assert res.exit_code == 0, res.stderr
    assert "release 0.13.0, as 2 of 3 runs' server said (GET /version)" in " ".join(res.stderr.split())
    record = json.loads(twin.read_text())["calibration"]
    # 0.13: before async scheduling (0.14), full-sequence admission (0.19) and the free queue's order (0.24)
    assert record["engine_version"] == "0.13.0"
    assert (record["served_by"]["overlap_schedule"], record["served_by"]["scheduler_reserve_full_isl"],
            record["served_by"]["evict_unhashed_first"]) == (False, False, False)
    # sim run with the twin and no release: the twin's, said, and its bands hold
    run = ["sim", "run", *ENGINE, "-c", "2", "-n", "4", "--efficiencies", str(twin)]
    res = CliRunner().invoke(main, [*run, "--json"])
    assert res.exit_code == 0, res.stderr
    assert "release 0.13.0, the one twin.json was calibrated as" in " ".join(res.stderr.split())
    block = json.loads(res.stdout)["prediction"]
    assert "mismatch" not in block and block["error_bands"]["ttft_ms"] is not None
    assert json.loads(res.stdout)["config"]["engine"]["engine_version"] == "0.13.0"
    # a release given wins, and is another server (no bands, the reason said)
    res = CliRunner().invoke(main, [*run, "--engine-version", "0.19", "--json"])
    assert res.exit_code == 0, res.stderr
    assert "calibrated as" not in res.stderr and "mismatch" in json.loads(res.stdout)["prediction"]
    # so does another family (the twin's release is not taken for it)
    res = CliRunner().invoke(main, [*run, "--engine-family", "sglang", "--json"])
    assert res.exit_code == 0, res.stderr
    assert "calibrated as" not in res.stderr
    # a sweep with the twin takes it too
    res = CliRunner().invoke(main, ["sweep", *ENGINE, "--concurrency", "1,2", "-n", "4", "--efficiencies", str(twin),
                                    "-o", str(tmp_path / "sweep")])
    assert res.exit_code == 0, res.stderr
    assert "release 0.13.0, the one twin.json was calibrated as" in " ".join(res.stderr.split())
    # ...and so does tune's search on it
    res = CliRunner().invoke(main, ["tune", *ENGINE, "--param", "max-num-seqs=2,4", "-c", "2", "-n", "4",
                                    "--efficiencies", str(twin), "--max-trials", "2", "--slo-ttft-ms", "500"])
    assert res.exit_code == 0, res.stderr
    assert "release 0.13.0, the one twin.json was calibrated as" in " ".join(res.stderr.split())


def test_a_release_given_to_calibrate_wins_over_the_servers_with_a_word(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    runs = said(measured[0], tmp_path, vllm("0.13.0"), vllm("0.13.0"), vllm("0.13.0"))
    res = calibrate_cli(runs, tmp_path / "twin.json", "--engine-version", "0.19")
    assert res.exit_code == 0, res.stderr
    assert "the runs' server said vLLM 0.13.0; calibrating as release 0.19" in " ".join(res.stderr.split())
    assert json.loads((tmp_path / "twin.json").read_text())["calibration"]["engine_version"] == "0.19"


@pytest.mark.parametrize(("software", "needle"), [
    ((vllm("0.13.0"), vllm("0.15.1"), vllm("0.13.0")), "different releases of vLLM (0.13.0, 0.15.1)"),
    ((vllm("0.13.0"), {"name": "llama.cpp", "version": "b1", "source": "GET /props"}, None),
     "different servers (llama.cpp, vLLM)"),
])
def test_runs_of_two_servers_or_releases_are_refused(
    measured: tuple[list[str], list[str]], tmp_path: Path, software: tuple[dict[str, Any] | None, ...], needle: str
) -> None:
    res = calibrate_cli(said(measured[0], tmp_path, *software), tmp_path / "twin.json")
    assert res.exit_code == 2 and needle in " ".join(res.stderr.split()), res.stderr
    assert not (tmp_path / "twin.json").exists()


def test_a_release_the_simulator_cannot_follow_is_said_and_left_out(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    # vLLM 0.7 is V0, another family: the twin is calibrated as the family's current release
    res = calibrate_cli(said(measured[0], tmp_path, vllm("0.7.3"), vllm("0.7.3"), vllm("0.7.3")), tmp_path / "twin.json")
    assert res.exit_code == 0, res.stderr
    assert "said vLLM 0.7.3, which the simulator cannot follow" in " ".join(res.stderr.split())
    record = json.loads((tmp_path / "twin.json").read_text())["calibration"]
    assert record["engine_version"] is None and record["served_by"]["overlap_schedule"] is True


@pytest.mark.parametrize(("flags", "overlap"), [((), False), (("--async-scheduling",), True)])
def test_a_twin_of_llama_cpp_is_calibrated_without_async_scheduling_unless_told(
    measured: tuple[list[str], list[str]], tmp_path: Path, flags: tuple[str, ...], overlap: bool
) -> None:
    llama = {"name": "llama.cpp", "version": "b0-unknown", "source": "GET /props"}
    res = calibrate_cli(said(measured[0], tmp_path, llama, llama, llama), tmp_path / "twin.json", *flags)
    assert res.exit_code == 0, res.stderr
    assert ("schedules no step ahead" in " ".join(res.stderr.split())) == (not overlap)
    record = json.loads((tmp_path / "twin.json").read_text())["calibration"]
    assert record["served_by"]["overlap_schedule"] is overlap and record["engine_version"] is None


@pytest.mark.parametrize(("release", "flags", "warned"), [
    ("0.15.0", (), True), ("0.15.0", ("--no-async-scheduling",), False), ("0.13.0", (), False)])
def test_a_twin_of_a_release_that_schedules_ahead_says_vllms_cpu_backend_does_not(
    measured: tuple[list[str], list[str]], tmp_path: Path, release: str, flags: tuple[str, ...], warned: bool
) -> None:
    # (its /version does not say CPU or GPU: the user is told, the release's GPU default kept)
    runs = said(measured[0], tmp_path, vllm(release), vllm(release), vllm(release))
    res = calibrate_cli(runs, tmp_path / "twin.json", *flags)
    assert res.exit_code == 0, res.stderr
    assert ("vLLM's CPU backend does not: add --no-async-scheduling" in " ".join(res.stderr.split())) == warned
    on = json.loads((tmp_path / "twin.json").read_text())["calibration"]["served_by"]
    assert on["overlap_schedule"] is (release == "0.15.0" and not flags)
