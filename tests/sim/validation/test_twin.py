"""``sim calibrate``: a twin fitted on concurrency-1 runs of a "server" whose constants
are known (the simulator itself, run with other constants than the defaults the fit
starts from, its directories rewritten as ``bench`` writes a server's: calibrate
refuses a ``sim run``'s as it is, a prediction) recovers them and predicts held-out
runs at higher concurrency."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
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


#: Where the tests' "server" is (as_measured)
SERVER_URL = "http://server.test:8000"


def as_measured(run: str) -> str:
    """``run``, a sim run's directory, rewritten as ``bench`` writes a run of a server
    that is not inferlab's (no command or engine: the URL and the model it served)."""
    folder = Path(run)
    config = json.loads((folder / "config.json").read_text())
    engine = config.pop("engine")
    config.pop("command", None)
    config.update(url=SERVER_URL, model=None)
    config["resolved"] = {"url": f"{SERVER_URL}/v1", "model": engine["model"], "server_software": None}
    (folder / "config.json").write_text(json.dumps(config))
    summary = json.loads((folder / "summary.json").read_text())
    summary.update(config=config, server={"simulated": False, "kind": "server", "url": f"{SERVER_URL}/v1",
                                          "engine_family": None})
    summary.pop("prediction", None)
    (folder / "summary.json").write_text(json.dumps(summary))
    return run


def measured_run(out: Path, *args: str) -> str:
    """A run of the tests' "server" (``sim_run``), as ``bench`` writes it (``as_measured``)."""
    return as_measured(sim_run(out, *args))


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[str]]:
    d = tmp_path_factory.mktemp("server")
    truth = d / "truth.json"
    truth.write_text(json.dumps(TRUTH))
    eff = ["--efficiencies", str(truth)]
    fit = [measured_run(d / f"c1-in{n}", "-c", "1", "-n", "6", "--input-tokens", str(n), "--output-tokens", "32", *eff)
           for n in (128, 1024, 3000)]
    held = [measured_run(d / f"c{c}", "-c", str(c), "-n", str(4 * c), "--input-tokens", "1024", "--output-tokens", "64",
                         *eff) for c in (4, 16)]
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
    # (the band says its basis: how many held-out runs, at what loads)
    assert "on 2 held-out runs (c 4–16, prompts 1,024 tokens) of the calibration in twin.json" in band["text"]
    assert "beyond_validated" not in what_if["prediction"]
    shown = CliRunner().invoke(main, ["sim", "run", *ENGINE, "-c", "4", "-n", "8", "--efficiencies", str(eff)])
    assert "held-out runs (c 4–16, prompts 1,024 tokens) of the calibration in twin.json" in words(shown.stdout)
    assert "beyond the loads" not in words(shown.stdout)
    # a run at a load none of its runs ran: said next to the band
    shown = CliRunner().invoke(main, ["sim", "run", *ENGINE, "-c", "32", "-n", "32", "--input-tokens", "6000",
                                      "--efficiencies", str(eff)])
    assert shown.exit_code == 0, shown.stderr
    assert ("this run (c 32, prompts 6,000 tokens) is beyond the loads the twin was checked on: c 1–16, prompts "
            "128–3,000 tokens; its error band was measured within them only") in words(shown.stdout)
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


def rewritten(runs: list[str], into: Path, *changes: Callable[[dict[str, Any]], None]) -> list[str]:
    """Copies of ``runs`` in ``into``, each config.json changed in place by its ``changes``
    (one each)."""
    out = []
    for run, change in zip(runs, changes, strict=True):
        copy = into / Path(run).name
        shutil.copytree(run, copy)
        config = json.loads((copy / "config.json").read_text())
        change(config)
        (copy / "config.json").write_text(json.dumps(config))
        out.append(str(copy))
    return out


def said(runs: list[str], into: Path, *software: dict[str, Any] | None) -> list[str]:
    """Copies of ``runs`` whose config.json records that their server said ``software``
    (one each, as bench records it; None: it said nothing inferlab knows)."""
    def saying(sw: dict[str, Any] | None) -> Callable[[dict[str, Any]], None]:
        return lambda config: config.update(resolved={**(config.get("resolved") or {}), "server_software": sw})

    return rewritten(runs, into, *map(saying, software))


def vllm(version: str) -> dict[str, Any]:
    return {"name": "vLLM", "version": version, "source": "GET /version"}


def calibrate_cli(runs: list[str], out: Path, *flags: str) -> Any:
    return CliRunner().invoke(main, ["sim", "calibrate", *ENGINE, *flags, *runs, "--fit", "gemm_compute",
                                     "--max-evaluations", "3", "-o", str(out)])


def words(text: str) -> str:
    return " ".join(text.split())  # (the console wraps long lines)


def engine_of(run_dir: Path) -> dict[str, Any]:
    engine: dict[str, Any] = json.loads((run_dir / "config.json").read_text())["engine"]
    return engine


SWITCHES = ("overlap_schedule", "scheduler_reserve_full_isl", "evict_unhashed_first")


def test_the_twin_takes_the_release_the_runs_server_said_and_runs_of_it_run_as_it_was_calibrated(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    runs = said(measured[0], tmp_path, vllm("0.13.0"), vllm("0.13.0"), None)  # (one run from before the record)
    twin = tmp_path / "twin.json"
    res = calibrate_cli(runs, twin)
    assert res.exit_code == 0, res.stderr
    assert "release 0.13.0, as 2 of 3 runs' server said (GET /version)" in words(res.stderr)
    record = json.loads(twin.read_text())["calibration"]
    # 0.13: before async scheduling (0.14), full-sequence admission (0.19) and the free queue's order (0.24)
    assert record["engine_version"] == "0.13.0"
    assert tuple(record["served_by"][k] for k in SWITCHES) == (False, False, False)
    # sim run with the twin and no release: the twin's, said, and its bands hold
    run = ["sim", "run", *ENGINE, "-c", "2", "-n", "4", "--efficiencies", str(twin)]
    res = CliRunner().invoke(main, [*run, "--json", "-o", str(tmp_path / "r")])
    assert res.exit_code == 0, res.stderr
    assert "as twin.json was calibrated: release 0.13.0, async scheduling off" in words(res.stderr)
    block = json.loads(res.stdout)["prediction"]
    assert "mismatch" not in block and block["error_bands"]["ttft_ms"] is not None
    ran = engine_of(tmp_path / "r")
    assert ran["engine_version"] == "0.13.0" and tuple(ran[k] for k in SWITCHES) == (False, False, False)
    # a release or a switch given wins, and is another server (no bands, the reason said)
    for flags in (["--engine-version", "0.19"], ["--async-scheduling"]):
        res = CliRunner().invoke(main, [*run, *flags, "--json"])
        assert res.exit_code == 0, res.stderr
        assert "calibrated:" not in res.stderr and "mismatch" in json.loads(res.stdout)["prediction"], flags
    # so does another family (the twin's release is not taken for it)
    res = CliRunner().invoke(main, [*run, "--engine-family", "sglang", "--json"])
    assert res.exit_code == 0, res.stderr
    assert "calibrated:" not in res.stderr
    # a sweep of the twin runs every point as it was calibrated
    res = CliRunner().invoke(main, ["sweep", *ENGINE, "--concurrency", "1,2", "-n", "4", "--efficiencies", str(twin),
                                    "-o", str(tmp_path / "sweep")])
    assert res.exit_code == 0, res.stderr
    assert "as twin.json was calibrated: release 0.13.0" in words(res.stderr)
    points = [p.parent for p in (tmp_path / "sweep").rglob("config.json")]
    assert len(points) == 2
    for point in points:
        ran = engine_of(point)
        assert ran["engine_version"] == "0.13.0" and tuple(ran[k] for k in SWITCHES) == (False, False, False), point
    # ...and so does tune's search, unless it searches the release itself
    res = CliRunner().invoke(main, ["tune", *ENGINE, "--param", "max-num-seqs=2,4", "-c", "2", "-n", "4",
                                    "--efficiencies", str(twin), "--max-trials", "2", "--slo-ttft-ms", "500",
                                    "-o", str(tmp_path / "tune")])
    assert res.exit_code == 0, res.stderr
    trials = [p.parent for p in (tmp_path / "tune").rglob("config.json")]
    assert trials and all(engine_of(t)["engine_version"] == "0.13.0" for t in trials)
    assert all(engine_of(t)["overlap_schedule"] is False for t in trials)
    res = CliRunner().invoke(main, ["tune", *ENGINE, "--param", "engine-family=vllm,sglang", "-c", "2", "-n", "4",
                                    "--efficiencies", str(twin), "--max-trials", "2", "--slo-ttft-ms", "500",
                                    "-o", str(tmp_path / "tune2")])
    assert res.exit_code == 0, res.stderr
    assert "they are not taken from twin.json" in words(res.stderr)
    trials = [p.parent for p in (tmp_path / "tune2").rglob("config.json")]
    assert trials and all(engine_of(t)["engine_version"] is None for t in trials)


def test_a_replay_runs_as_its_run_ran_not_as_the_twin_was(measured: tuple[list[str], list[str]], tmp_path: Path) -> None:
    twin = tmp_path / "twin.json"
    assert calibrate_cli(said(measured[0], tmp_path, *[vllm("0.13.0")] * 3), twin).exit_code == 0
    recorded = tmp_path / "recorded"
    assert CliRunner().invoke(main, ["sim", "run", *ENGINE, "-c", "2", "-n", "4", "-o", str(recorded)]).exit_code == 0
    res = CliRunner().invoke(main, ["sim", "run", "--trace", str(recorded / "requests.jsonl"), "--efficiencies", str(twin),
                                    "-o", str(tmp_path / "replay"), "--json"])
    assert res.exit_code == 0, res.stderr
    assert "calibrated:" not in res.stderr
    ran = engine_of(tmp_path / "replay")
    assert ran["engine_version"] is None and ran["overlap_schedule"] is True  # (the recorded run's, a current vLLM)
    assert "mismatch" in json.loads(res.stdout)["prediction"]  # (so the 0.13 twin's bands do not hold)


@pytest.mark.parametrize(("flags", "overlap"), [((), False), (("--async-scheduling",), True)])
def test_a_twin_of_llama_cpp_is_calibrated_and_run_without_async_scheduling_unless_told(
    measured: tuple[list[str], list[str]], tmp_path: Path, flags: tuple[str, ...], overlap: bool
) -> None:
    # (its slots and a slot's context, as llama-server's /props states them)
    llama = {"name": "llama.cpp", "version": "b0-unknown", "source": "GET /props",
             "settings": {"max_num_seqs": 4, "max_model_len": 4096}}
    twin = tmp_path / "twin.json"
    res = calibrate_cli(said(measured[0], tmp_path, llama, llama, llama), twin, *flags)
    assert res.exit_code == 0, res.stderr
    assert ("schedules no step ahead" in words(res.stderr)) == (not overlap)
    assert "as the runs' server states its engine: --max-model-len 4096, --max-num-seqs 4" in words(res.stderr)
    record = json.loads(twin.read_text())["calibration"]
    assert record["served_by"]["overlap_schedule"] is overlap and record["engine_version"] is None
    # its KV cache from its slots (4 x 4,096 tokens in blocks of 16, and vLLM's null block), not from memory
    assert "the KV cache is simulated as 16,384 tokens (4 x 4,096;" in words(res.stderr)
    assert record["server_settings"] == {"max_num_seqs": 4, "max_model_len": 4096,
                                         "num_gpu_blocks_override": 1025, "block_size": 16}
    # a run of the twin runs as it was calibrated, and keeps its bands
    res = CliRunner().invoke(main, ["sim", "run", *ENGINE, "-c", "2", "-n", "4", "--efficiencies", str(twin), "--json"])
    assert res.exit_code == 0, res.stderr
    assert f"as twin.json was calibrated: async scheduling {'on' if overlap else 'off'}" in words(res.stderr)
    ran = json.loads(res.stdout)["config"]["engine"]
    assert (ran["overlap_schedule"], ran["max_num_seqs"], ran["max_model_len"]) == (overlap, 4, 4096)
    assert ran["num_gpu_blocks_override"] == 1025
    assert "mismatch" not in json.loads(res.stdout)["prediction"]


def test_a_llama_cpp_pool_is_the_servers_slots_whatever_context_is_given(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """--max-model-len 3500 against slots of 4,096: a what-if on the same server, whose
    cache still holds 4 x 4,096 tokens."""
    llama = {"name": "llama.cpp", "version": "b0-unknown", "source": "GET /props",
             "settings": {"max_num_seqs": 4, "max_model_len": 4096}}
    twin = tmp_path / "twin.json"
    res = calibrate_cli(said(measured[0], tmp_path, llama, llama, llama), twin, "--max-model-len", "3500")
    assert res.exit_code == 0, res.stderr
    assert "simulated as 16,384 tokens (4 x 4,096;" in words(res.stderr)
    assert json.loads(twin.read_text())["calibration"]["server_settings"]["num_gpu_blocks_override"] == 1025


def test_a_llama_cpp_pool_is_not_derived_where_a_flag_sizes_the_cache(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    llama = {"name": "llama.cpp", "version": "b0-unknown", "source": "GET /props",
             "settings": {"max_num_seqs": 4, "max_model_len": 4096}}
    twin = tmp_path / "twin.json"
    res = calibrate_cli(said(measured[0], tmp_path, llama, llama, llama), twin, "--gpu-memory-utilization", "0.5")
    assert res.exit_code == 0, res.stderr
    assert "simulated as" not in words(res.stderr)
    assert "num_gpu_blocks_override" not in json.loads(twin.read_text())["calibration"]["server_settings"]


@pytest.mark.parametrize(("given", "server", "said_line"), [
    ((), "0.13.0", None),
    (("--engine-version", "0.13"), "0.13.0", None),  # (the same release, written otherwise)
    (("--engine-version", "0.19"), "0.13.0", "the runs' server said vLLM 0.13.0; calibrating as release 0.19"),
])
def test_a_release_given_to_calibrate_wins_over_the_servers_with_a_word_where_they_differ(
    measured: tuple[list[str], list[str]], tmp_path: Path, given: tuple[str, ...], server: str, said_line: str | None
) -> None:
    runs = said(measured[0], tmp_path, *[vllm(server)] * 3)
    res = calibrate_cli(runs, tmp_path / "twin.json", *given)
    assert res.exit_code == 0, res.stderr
    assert ("calibrating as release" in words(res.stderr)) == (said_line is not None)
    if said_line:
        assert said_line in words(res.stderr)
    expected = given[1] if given else server
    assert json.loads((tmp_path / "twin.json").read_text())["calibration"]["engine_version"] == expected


@pytest.mark.parametrize(("software", "needle"), [
    ((vllm("0.13.0"), vllm("0.15.1"), vllm("0.13.0")), "different releases of vLLM (0.13.0, 0.15.1)"),
    ((vllm("0.13.0"), {"name": "llama.cpp", "version": "b1", "source": "GET /props"}, None),
     "different servers (llama.cpp, vLLM)"),
])
def test_runs_of_two_servers_or_releases_are_refused(
    measured: tuple[list[str], list[str]], tmp_path: Path, software: tuple[dict[str, Any] | None, ...], needle: str
) -> None:
    res = calibrate_cli(said(measured[0], tmp_path, *software), tmp_path / "twin.json")
    assert res.exit_code == 2 and needle in words(res.stderr), res.stderr
    assert not (tmp_path / "twin.json").exists()


def test_two_builds_of_one_release_are_one_release(measured: tuple[list[str], list[str]], tmp_path: Path) -> None:
    runs = said(measured[0], tmp_path, vllm("0.13.0"), vllm("0.13.0+cu128"), vllm("0.13.1"))
    res = calibrate_cli(runs, tmp_path / "twin.json")
    assert res.exit_code == 0, res.stderr
    assert json.loads((tmp_path / "twin.json").read_text())["calibration"]["engine_version"] == "0.13.0"


@pytest.mark.parametrize(("software", "flags", "family", "release", "needle"), [
    # the family the server's release is: vLLM before 0.8 is V0's, SGLang its own
    # (V0 chunks prompts only when told: the runs' 3,000-token prompts need it under a 2,048 budget)
    (vllm("0.7.3"), ("--enable-chunked-prefill",), "vllm-v0", None, "the vllm-v0 family, as the runs' server said vLLM 0.7.3"),
    ({"name": "SGLang", "version": "0.5.2", "source": "GET /server_info"}, (), "sglang", "0.5.2",
     "the sglang family, as the runs' server said SGLang 0.5.2"),
    # a family given wins, with a word, at its current release
    (vllm("0.7.3"), ("--engine-family", "vllm"), "vllm", None,
     "said vLLM 0.7.3, which the vllm-v0 family models; calibrating as the vllm family, as --engine-family says"),
    # named without a release (a proxy passing its cards on): said, the current release
    ({"name": "vLLM", "version": None, "source": None}, (), "vllm", None, "said vLLM but not its release"),
])
def test_the_family_is_the_one_the_servers_release_is_unless_given(
    measured: tuple[list[str], list[str]], tmp_path: Path, software: dict[str, Any], flags: tuple[str, ...],
    family: str, release: str | None, needle: str
) -> None:
    res = calibrate_cli(said(measured[0], tmp_path, *[software] * 3), tmp_path / "twin.json", *flags)
    assert res.exit_code == 0, res.stderr
    assert needle in words(res.stderr), res.stderr
    record = json.loads((tmp_path / "twin.json").read_text())["calibration"]
    assert (record["served_by"]["engine_family"], record["engine_version"]) == (family, release)


@pytest.mark.parametrize(("release", "flags", "overlap", "needle"), [
    ("0.15.0", (), True, "vLLM's CPU backend does not: add --no-async-scheduling"),
    ("0.15.0", ("--no-async-scheduling",), False, None),
    ("0.13.0", (), False, None),
    # a build that says it is vLLM's CPU build runs without async scheduling
    ("0.15.0+cpu", (), False, "vLLM 0.15.0+cpu is vLLM's CPU build, which keeps async scheduling off"),
    ("0.15.0+cpu", ("--async-scheduling",), True, None),
])
def test_vllms_cpu_build_schedules_no_step_ahead(
    measured: tuple[list[str], list[str]], tmp_path: Path, release: str, flags: tuple[str, ...], overlap: bool,
    needle: str | None
) -> None:
    res = calibrate_cli(said(measured[0], tmp_path, *[vllm(release)] * 3), tmp_path / "twin.json", *flags)
    assert res.exit_code == 0, res.stderr
    assert ("CPU" in words(res.stderr)) == (needle is not None)
    if needle:
        assert needle in words(res.stderr)
    assert json.loads((tmp_path / "twin.json").read_text())["calibration"]["served_by"]["overlap_schedule"] is overlap


def test_a_release_that_cannot_be_read_is_said_and_left_out(measured: tuple[list[str], list[str]], tmp_path: Path) -> None:
    res = calibrate_cli(said(measured[0], tmp_path, *[vllm("nightly-2026")] * 3), tmp_path / "twin.json")
    assert res.exit_code == 0, res.stderr
    assert "said vLLM nightly-2026, which is not a release inferlab can read" in words(res.stderr)
    assert json.loads((tmp_path / "twin.json").read_text())["calibration"]["engine_version"] is None


def stating(version: str, **settings: Any) -> dict[str, Any]:
    return {**vllm(version), "settings": settings}


KV = {"block_size": 32, "enable_prefix_caching": False, "kv_cache_dtype": "auto", "max_model_len": 8192,
      "num_gpu_blocks_override": 900}
FP8 = {**KV, "kv_cache_dtype": "fp8"}


@pytest.fixture(scope="module")
def twins(measured: tuple[list[str], list[str]], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Twins of a vLLM 0.19 server that stated its cache: 900 blocks of 32 tokens, bf16 or fp8."""
    out: dict[str, Any] = {}
    for name, kv in (("auto", KV), ("fp8", FP8)):
        d = tmp_path_factory.mktemp(f"twin-{name}")
        res = calibrate_cli(said(measured[0], d, *[stating("0.19.0", **kv)] * 3), d / "twin.json")
        assert res.exit_code == 0, res.stderr
        out[name] = d / "twin.json"
        out[name + "-stderr"] = words(res.stderr)
    return out


def run_twin(twin: Path, out: Path, *flags: str) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """``sim run`` of the twin (ENGINE's flags, then ``flags``): the engine it ran, its
    stderr, its prediction block."""
    res = CliRunner().invoke(main, ["sim", "run", *ENGINE, "-c", "2", "-n", "4", "--efficiencies", str(twin),
                                    *flags, "-o", str(out), "--json"])
    assert res.exit_code == 0, res.stderr
    return engine_of(out), words(res.stderr), json.loads(res.stdout)["prediction"]


@pytest.mark.parametrize(("kind", "kv"), [("auto", KV), ("fp8", FP8)])
def test_the_twin_takes_the_engine_its_server_states_and_runs_of_it_run_that_engine(
    twins: dict[str, Any], tmp_path: Path, kind: str, kv: dict[str, Any]
) -> None:
    said_ = twins[kind + "-stderr"]
    assert (f"as the runs' server states its engine: --block-size 32, --no-enable-prefix-caching, --kv-cache-dtype "
            f"{kv['kv_cache_dtype']}, --max-model-len 8192, --num-gpu-blocks-override 900") in said_
    record = json.loads(twins[kind].read_text())["calibration"]
    assert record["server_settings"] == kv
    assert record["sized_with"]["max_num_batched_tokens"] == 2048
    # a run of the twin runs that engine, and keeps its bands
    ran, err, prediction = run_twin(twins[kind], tmp_path / "r")
    assert {k: ran[k] for k in kv} == kv and "mismatch" not in prediction
    assert "--num-gpu-blocks-override 900" in err and "--no-enable-prefix-caching" in err
    # a flag given as the twin's own is the same cache
    ran, err, _ = run_twin(twins[kind], tmp_path / "r2", "--block-size", "32", "--kv-cache-dtype", kv["kv_cache_dtype"])
    assert ran["num_gpu_blocks_override"] == 900 and "sized from memory" not in err


@pytest.mark.parametrize(("flags", "what"), [
    (("--gpu-memory-utilization", "0.8"), "--gpu-memory-utilization"),
    (("--block-size", "16"), "--block-size"),
])
def test_a_run_sized_otherwise_sizes_its_cache_from_memory_and_says_so(
    twins: dict[str, Any], tmp_path: Path, flags: tuple[str, ...], what: str
) -> None:
    ran, err, _ = run_twin(twins["auto"], tmp_path / "r", *flags)
    assert ran["num_gpu_blocks_override"] is None
    assert (f"{what} not as twin.json was calibrated: the KV cache is sized from the simulated GPU's memory, not "
            "from the 900 blocks of 32 tokens (28,800 tokens) its server had") in err
    assert ran["max_model_len"] == 8192  # (the rest of what the server stated is still taken)


@pytest.mark.parametrize(("flags", "what"), [
    (("--max-num-batched-tokens", "8192"), "--max-num-batched-tokens"),  # (another activation reserve)
    (("--max-num-seqs", "64"), "--max-num-seqs"),
    (("--enforce-eager",), "--enforce-eager"),
])
def test_a_run_of_another_budget_or_cap_keeps_the_kv_cache_its_server_had_and_says_so(
    twins: dict[str, Any], tmp_path: Path, flags: tuple[str, ...], what: str
) -> None:
    """The server might have had somewhat another count with another budget, but the
    simulated GPU's memory may be nothing like its (a CPU server's twin on an H100 held
    millions of tokens where the server had thousands): the server's blocks are kept."""
    ran, err, _ = run_twin(twins["auto"], tmp_path / "r", *flags)
    assert ran["num_gpu_blocks_override"] == 900 and ran["block_size"] == 32
    assert (f"{what} not as twin.json was calibrated: its server might have sized its KV cache otherwise with them; "
            "kept at the 900 blocks of 32 tokens (28,800 tokens) it had") in err


def test_the_blocks_a_vllm_server_had_are_the_twins_kv_cache_not_an_override_it_was_given(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """vLLM states the blocks it had (``num_gpu_blocks``), however sized: the twin holds
    that many, said as the server's cache, not as an override the server was given."""
    kv = {k: v for k, v in KV.items() if k != "num_gpu_blocks_override"}
    res = calibrate_cli(said(measured[0], tmp_path, *[stating("0.19.0", num_gpu_blocks=900, **kv)] * 3),
                        tmp_path / "twin.json")
    assert res.exit_code == 0, res.stderr
    err = words(res.stderr)
    assert ("its KV cache as the runs' server had it: 900 blocks of 32 tokens (28,800 tokens), simulated with "
            "--num-gpu-blocks-override 900, not sized from the simulated GPU's memory") in err
    assert "as the runs' server states its engine: --block-size 32, --no-enable-prefix-caching, --kv-cache-dtype auto, --max-model-len 8192 (" in err
    record = json.loads((tmp_path / "twin.json").read_text())["calibration"]
    assert record["server_settings"]["num_gpu_blocks_override"] == 900
    ran, _, _ = run_twin(tmp_path / "twin.json", tmp_path / "r")
    assert ran["num_gpu_blocks_override"] == 900


def served_twin(measured: tuple[list[str], list[str]], tmp_path: Path) -> list[str]:
    """A twin (tmp_path/twin.json) of a vLLM server that stated its cache, calibrated at
    the served default budget (no --max-num-batched-tokens); the engine flags it has."""
    engine = ["--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "L40S"]
    res = CliRunner().invoke(main, ["sim", "calibrate", *engine, *said(measured[0], tmp_path, *[stating("0.19.0", **KV)] * 3),
                                    "--fit", "gemm_compute", "--max-evaluations", "3", "-o", str(tmp_path / "twin.json")])
    assert res.exit_code == 0, res.stderr
    return engine


def test_a_twin_at_rate_inf_runs_served_as_its_server_did(measured: tuple[list[str], list[str]], tmp_path: Path) -> None:
    # (a sweep's --rate inf point too: the twin is of a server, not of vLLM's offline class)
    engine = served_twin(measured, tmp_path)
    res = CliRunner().invoke(main, ["sweep", *engine, "--rate", "1,inf", "-n", "4", "--efficiencies",
                                    str(tmp_path / "twin.json"), "-o", str(tmp_path / "s")])
    assert res.exit_code == 0, res.stderr
    ran = [engine_of(p.parent) for p in (tmp_path / "s").rglob("config.json")]
    assert len(ran) == 2 and all((p["offline"], p["num_gpu_blocks_override"], p["max_num_batched_tokens"]) ==
                                 (False, 900, 2048) for p in ran)
    assert "--rate inf runs served, as twin.json's server was (--offline for vLLM's offline class)" in words(res.stderr)
    # a what-if of another family with the twin's constants: served too, and said
    res = CliRunner().invoke(main, ["sim", "run", *engine, "--engine-family", "sglang", "--rate", "inf", "-n", "4",
                                    "--efficiencies", str(tmp_path / "twin.json"), "-o", str(tmp_path / "f")])
    assert res.exit_code == 0, res.stderr
    assert engine_of(tmp_path / "f")["offline"] is False and "--rate inf runs served" in words(res.stderr)
    # without a twin's record (the constants alone), --rate inf is vLLM's offline class as before
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({k: v for k, v in json.loads((tmp_path / "twin.json").read_text()).items()
                                 if k != "calibration"}))
    res = CliRunner().invoke(main, ["sim", "run", *engine, "--rate", "inf", "-n", "4", "--efficiencies", str(plain),
                                    "-o", str(tmp_path / "p")])
    assert res.exit_code == 0, res.stderr
    assert engine_of(tmp_path / "p")["offline"] is True


@pytest.mark.parametrize(("flags", "same"), [
    (("--rate", "inf"), True),  # (a twin's burst is served, as its server's was)
    (("--rate", "inf", "--served"), True),
    (("--rate", "inf", "--max-concurrency", "2"), True),  # (capped: served)
    (("--offline",), False),  # vLLM's offline class: a larger default budget
    (("--rate", "inf", "--offline"), False),
    (("--max-num-batched-tokens", "2048"), True),  # (given as the server's default resolved it)
    (("--max-num-batched-tokens", "4096"), False),
])
def test_an_offline_run_of_a_served_twin_keeps_its_servers_cache_and_says_its_budget_is_another(
    measured: tuple[list[str], list[str]], tmp_path: Path, flags: tuple[str, ...], same: bool
) -> None:
    engine = served_twin(measured, tmp_path)
    res = CliRunner().invoke(main, ["sim", "run", *engine, "-n", "4", "--efficiencies", str(tmp_path / "twin.json"),
                                    *flags, "-o", str(tmp_path / "r")])
    assert res.exit_code == 0, res.stderr
    ran = engine_of(tmp_path / "r")
    assert ran["num_gpu_blocks_override"] == 900
    kept = "not as twin.json was calibrated: its server might have sized its KV cache otherwise with them; kept at the 900 blocks"
    if not same and "--max-num-batched-tokens" in flags:
        assert f"--max-num-batched-tokens {kept}" in words(res.stderr)
    elif not same:
        served = json.loads((tmp_path / "twin.json").read_text())["calibration"]["sized_with"]
        assert served["max_num_batched_tokens"] is None and ran["max_num_batched_tokens"] > 2048
        assert (f"the offline default --max-num-batched-tokens {ran['max_num_batched_tokens']} (2048 on its server) "
                f"{kept}") in words(res.stderr)
    else:
        assert ran["max_num_batched_tokens"] == 2048 and "might have sized" not in res.stderr


@pytest.mark.parametrize("flags", [("--model", "meta-llama/Llama-2-7b-hf"), ("--gpu", "H100"), ("-tp", "2")])
def test_a_run_of_another_server_takes_none_of_what_the_twins_server_stated(
    twins: dict[str, Any], tmp_path: Path, flags: tuple[str, ...]
) -> None:
    # (Llama-2's context is 4,096 tokens: the twin's 8,192 would be refused, a what-if that ran before)
    ran, err, prediction = run_twin(twins["auto"], tmp_path / "r", *flags)
    assert ran["num_gpu_blocks_override"] is None and ran["max_model_len"] != 8192 and ran["block_size"] == 16
    assert "the run is of another model, GPU, precision or tensor-parallel degree than twin.json's" in err
    assert "mismatch" in prediction


def test_a_replay_keeps_its_runs_engine_whatever_the_twins_server_stated(
    twins: dict[str, Any], tmp_path: Path
) -> None:
    recorded = tmp_path / "recorded"
    assert CliRunner().invoke(main, ["sim", "run", *ENGINE, "-c", "2", "-n", "4", "-o", str(recorded)]).exit_code == 0
    res = CliRunner().invoke(main, ["sim", "run", "--trace", str(recorded / "requests.jsonl"), "--efficiencies",
                                    str(twins["auto"]), "-o", str(tmp_path / "replay")])
    assert res.exit_code == 0, res.stderr
    ran = engine_of(tmp_path / "replay")
    assert (ran["num_gpu_blocks_override"], ran["block_size"], ran["enable_prefix_caching"]) == (None, 16, True)
    assert "calibrated:" not in res.stderr


def test_sweeps_and_tunes_of_the_twin_run_its_engine_unless_they_vary_what_sizes_it(
    twins: dict[str, Any], tmp_path: Path
) -> None:
    def points(folder: Path) -> list[dict[str, Any]]:
        return [engine_of(p.parent) for p in folder.rglob("config.json")]

    base = ["--efficiencies", str(twins["auto"]), "-n", "4"]
    res = CliRunner().invoke(main, ["sweep", *ENGINE, "--concurrency", "1,2", *base, "-o", str(tmp_path / "s1")])
    assert res.exit_code == 0, res.stderr
    assert [p["num_gpu_blocks_override"] for p in points(tmp_path / "s1")] == [900, 900]
    # a sweep over the budget: each point keeps the server's cache, said (it might have had another count)
    res = CliRunner().invoke(main, ["sweep", "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "L40S",
                                    "--max-num-batched-tokens", "2048,8192", "--concurrency", "2", *base,
                                    "-o", str(tmp_path / "s2")])
    assert res.exit_code == 0, res.stderr
    ran = points(tmp_path / "s2")
    assert len(ran) == 2 and all(p["num_gpu_blocks_override"] == 900 and p["block_size"] == 32 for p in ran)
    assert "--max-num-batched-tokens not as twin.json was calibrated" in words(res.stderr)
    # a tune searching the sequence cap: the same
    res = CliRunner().invoke(main, ["tune", *ENGINE, "--param", "max-num-seqs=2,4", "-c", "2", *base,
                                    "--max-trials", "2", "--slo-ttft-ms", "500", "-o", str(tmp_path / "t")])
    assert res.exit_code == 0, res.stderr
    ran = points(tmp_path / "t")
    assert ran and all(p["num_gpu_blocks_override"] == 900 and p["max_model_len"] == 8192 for p in ran)


@pytest.mark.parametrize(("flags", "blocks", "needle"), [
    ((), 900, None),
    (("--block-size", "32"), 900, None),  # (the server's own block size)
    (("--block-size", "16"), None, "--block-size given: the KV cache is sized from the flags, not from the 900 blocks"),
    (("--gpu-memory-utilization", "0.85"), None, "--gpu-memory-utilization given"),
    (("--engine-family", "sglang"), None, "calibrating as the sglang family, not vLLM's: what the runs' server states "
                                          "of --num-gpu-blocks-override is vLLM's, not taken"),
])
def test_calibrate_takes_the_servers_blocks_unless_a_flag_sizes_the_cache_otherwise(
    measured: tuple[list[str], list[str]], tmp_path: Path, flags: tuple[str, ...], blocks: int | None, needle: str | None
) -> None:
    res = calibrate_cli(said(measured[0], tmp_path, *[stating("0.19.0", **KV)] * 3), tmp_path / "twin.json", *flags)
    assert res.exit_code == 0, res.stderr
    stated = json.loads((tmp_path / "twin.json").read_text())["calibration"]["server_settings"]
    assert stated.get("num_gpu_blocks_override") == blocks and stated["max_model_len"] == 8192
    if blocks:  # (with the size they are counted in, given or not)
        assert stated["block_size"] == 32
    if needle:
        assert needle in words(res.stderr)


def test_settings_the_runs_disagree_on_are_not_taken(measured: tuple[list[str], list[str]], tmp_path: Path) -> None:
    other = {**KV, "num_gpu_blocks_override": 700}
    runs = said(measured[0], tmp_path, stating("0.19.0", **KV), stating("0.19.0", **other), stating("0.19.0", **KV))
    res = calibrate_cli(runs, tmp_path / "twin.json")
    assert res.exit_code == 0, res.stderr
    assert "stated --num-gpu-blocks-override differently from run to run: not taken" in words(res.stderr)
    stated = json.loads((tmp_path / "twin.json").read_text())["calibration"]["server_settings"]
    assert "num_gpu_blocks_override" not in stated and stated["block_size"] == 32


#: What ``client.serverid.sglang_settings`` reads from an SGLang server's /server_info
SGLANG = {"tensor_parallel_size": 1, "enable_prefix_caching": False, "overlap_schedule": False, "mixed_batches": True,
          "max_num_batched_tokens": 4096, "max_num_seqs": 128, "kv_cache_dtype": "auto", "block_size": 1,
          "kv_cache_tokens": 50_000, "max_model_len": 8192}


def sglang(**settings: Any) -> dict[str, Any]:
    return {"name": "SGLang", "version": "0.5.2", "source": "GET /server_info", "settings": settings}


@pytest.mark.parametrize(("flags", "blocks", "block_size"), [
    ((), 50_000 // 16, 16),  # (a token a page, simulated in blocks of the default size: the same pool)
    (("--block-size", "1"), 50_000, 1),
    (("--block-size", "32"), 50_000 // 32, 32),
])
def test_a_twin_of_sglang_takes_its_arguments_and_pool_and_runs_of_it_run_them(
    measured: tuple[list[str], list[str]], tmp_path: Path, flags: tuple[str, ...], blocks: int, block_size: int
) -> None:
    engine = ["--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "L40S"]
    runs = said(measured[0], tmp_path, *[sglang(**SGLANG)] * 3)
    res = CliRunner().invoke(main, ["sim", "calibrate", *engine, *flags, *runs, "--fit", "gemm_compute",
                                    "--max-evaluations", "3", "-o", str(tmp_path / "twin.json")])
    assert res.exit_code == 0, res.stderr
    err = words(res.stderr)
    assert "the sglang family, as the runs' server said SGLang 0.5.2" in err
    assert "without overlap scheduling, as the runs' server states" in err
    assert ("a token at a time" in err) == (block_size != 1)
    record = json.loads((tmp_path / "twin.json").read_text())["calibration"]
    assert (record["served_by"]["engine_family"], record["served_by"]["overlap_schedule"]) == ("sglang", False)
    # (the overlap scheduler goes with the release; the pool, in tokens, as the flag that holds it)
    stated = {k: v for k, v in SGLANG.items() if k not in ("overlap_schedule", "kv_cache_tokens")}
    stated.update(block_size=block_size, num_gpu_blocks_override=blocks)
    # (given or not, the block size the blocks are counted in is recorded with them)
    assert record["server_settings"] == stated
    # a run of the twin runs that engine: its pool, caps and switches
    # (no --engine-family: the twin's; no --block-size: the twin's blocks are of its own)
    res = CliRunner().invoke(main, ["sim", "run", *engine, "-c", "2", "-n", "4",
                                    "--efficiencies", str(tmp_path / "twin.json"), "-o", str(tmp_path / "r"), "--json"])
    assert res.exit_code == 0, res.stderr
    ran, err, prediction = engine_of(tmp_path / "r"), words(res.stderr), json.loads(res.stdout)["prediction"]
    assert {k: ran[k] for k in ("num_gpu_blocks_override", "block_size", "max_num_batched_tokens", "max_num_seqs",
                                "enable_prefix_caching", "overlap_schedule", "mixed_batches", "max_model_len")} == {
        "num_gpu_blocks_override": blocks, "block_size": block_size, "max_num_batched_tokens": 4096,
        "max_num_seqs": 128, "enable_prefix_caching": False, "overlap_schedule": False, "mixed_batches": True,
        "max_model_len": 8192}
    # the pool the server stated, in tokens (to a block of the twin's size): not 50,000 blocks of 16
    assert 50_000 - block_size < ran["kv_cache_tokens"] <= 50_000
    assert ran["engine_family"] == "sglang" and "as twin.json was calibrated: the sglang family, release 0.5.2" in err
    assert "full-sequence admission" not in err  # (vLLM's switch: unsaid for SGLang)
    assert "mismatch" not in prediction and "sized from memory" not in err
    if not flags:  # a sweep of the twin: each point the same
        res = CliRunner().invoke(main, ["sweep", *engine, "--concurrency", "1,2", "-n", "4", "--efficiencies",
                                        str(tmp_path / "twin.json"), "-o", str(tmp_path / "s")])
        assert res.exit_code == 0, res.stderr
        points = [engine_of(p.parent) for p in (tmp_path / "s").rglob("config.json")]
        assert len(points) == 2 and all((p["engine_family"], p["num_gpu_blocks_override"], p["max_num_seqs"]) ==
                                        ("sglang", blocks, 128) for p in points)
    # another family given: a what-if of another engine, nothing of the twin's taken
    res = CliRunner().invoke(main, ["sim", "run", *engine, "--engine-family", "vllm", "-c", "2", "-n", "4",
                                    "--efficiencies", str(tmp_path / "twin.json"), "-o", str(tmp_path / "v"), "--json"])
    assert res.exit_code == 0, res.stderr
    ran = engine_of(tmp_path / "v")
    assert (ran["engine_family"], ran["num_gpu_blocks_override"]) == ("vllm", None) and ran["max_num_seqs"] != 128
    assert "mismatch" in json.loads(res.stdout)["prediction"]


def test_flags_that_contradict_what_an_sglang_server_states_are_said_and_win(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    runs = said(measured[0], tmp_path, *[sglang(**SGLANG)] * 3)
    # (ENGINE gives --max-num-batched-tokens 2048)
    res = calibrate_cli(runs, tmp_path / "twin.json", "--engine-family", "sglang", "--overlap-schedule", "-tp", "2",
                        "--gpu", "H100")
    assert res.exit_code == 0, res.stderr
    assert ("the runs' server states --max-num-batched-tokens 4096, --no-overlap-schedule, --tensor-parallel-size 1: "
            "calibrating with the flags given instead") in words(res.stderr)
    record = json.loads((tmp_path / "twin.json").read_text())["calibration"]
    served = record["served_by"]
    assert (served["tensor_parallel_size"], served["overlap_schedule"]) == (2, True)
    # (the server's pool was of one GPU and its budget: not this engine's)
    assert ("--tensor-parallel-size, --max-num-batched-tokens given: the KV cache is sized from the flags, not from "
            "the 50,000-token pool") in words(res.stderr)
    assert "simulated as 3,125 blocks" not in words(res.stderr)  # (not said where it is not taken)
    assert not {"tensor_parallel_size", "max_num_batched_tokens", "num_gpu_blocks_override"} & set(record["server_settings"])


def test_an_sglang_pool_is_not_taken_as_vllms_blocks(measured: tuple[list[str], list[str]], tmp_path: Path) -> None:
    runs = said(measured[0], tmp_path, *[sglang(**SGLANG)] * 3)
    res = calibrate_cli(runs, tmp_path / "twin.json", "--engine-family", "vllm")
    assert res.exit_code == 0, res.stderr
    err = words(res.stderr)
    assert ("calibrating as the vllm family, not SGLang's: what the runs' server states of its KV pool, "
            "--max-num-batched-tokens, --overlap-schedule, --mixed-batches is SGLang's, not taken") in err
    assert "a token at a time" not in err
    record = json.loads((tmp_path / "twin.json").read_text())["calibration"]
    stated = record["server_settings"]
    assert not {"num_gpu_blocks_override", "block_size", "max_num_batched_tokens", "mixed_batches"} & set(stated)
    assert stated["max_num_seqs"] == 128 and record["served_by"]["overlap_schedule"] is True  # (the family's own)


def test_a_run_given_the_page_size_an_sglang_server_stated_is_no_what_if(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """calibrate records SGLang's token pages as blocks of 16: a run given --block-size 1,
    the page the server stated, is not called a what-if of a server that stated 16."""
    runs = said(measured[0], tmp_path, *[sglang(**SGLANG)] * 3)
    engine = ["--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "L40S"]
    res = CliRunner().invoke(main, ["sim", "calibrate", *engine, *runs, "--fit", "gemm_compute", "--max-evaluations",
                                    "3", "-o", str(tmp_path / "twin.json")])
    assert res.exit_code == 0, res.stderr
    stated = json.loads((tmp_path / "twin.json").read_text())["calibration"]["server_settings"]
    assert (stated["block_size"], stated["num_gpu_blocks_override"]) == (16, 50_000 // 16)
    res = CliRunner().invoke(main, ["sim", "run", *engine, "-c", "2", "-n", "4", "--efficiencies",
                                    str(tmp_path / "twin.json"), "--block-size", "1", "--max-num-seqs", "64",
                                    "-o", str(tmp_path / "r")])
    assert res.exit_code == 0, res.stderr
    err = words(res.stderr)
    assert "--max-num-seqs 64: a what-if of twin.json's server, which stated --max-num-seqs 128" in err
    assert "--block-size" not in err.split("what-if")[1].split("inferlab:")[0]
    # the engine line says whose step-time constants ran: the twin's, over the family's
    assert "sglang defaults and constants, twin.json's over them" in words(res.stdout)


@pytest.mark.parametrize("pool", [
    {"kv_cache_tokens": 51_200},
    # (a run recorded before the pool was counted in tokens: its pages as vLLM's block count)
    {"kv_cache_tokens": None, "num_gpu_blocks_override": 200},
])
def test_an_sglang_pool_in_pages_the_simulator_does_not_take_is_simulated_in_blocks_of_the_runs_size(
    measured: tuple[list[str], list[str]], tmp_path: Path, pool: dict[str, Any]
) -> None:
    settings = {k: v for k, v in {**SGLANG, "block_size": 256, **pool}.items() if v is not None}
    runs = said(measured[0], tmp_path, *[sglang(**settings)] * 3)
    res = CliRunner().invoke(main, ["sim", "calibrate", "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "L40S", *runs,
                                    "--fit", "gemm_compute", "--max-evaluations", "3", "-o", str(tmp_path / "twin.json")])
    assert res.exit_code == 0, res.stderr
    assert "pages its KV cache 256 tokens at a time: its 51,200 tokens are simulated as 3,200 blocks of 16" in words(res.stderr)
    stated = json.loads((tmp_path / "twin.json").read_text())["calibration"]["server_settings"]
    assert (stated["block_size"], stated["num_gpu_blocks_override"]) == (16, 3200)


def test_runs_of_a_twin_take_the_sizes_it_was_calibrated_with_sim_serves_defaults_included(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    import urllib.request

    from inferlab.sim.server.launch import ChildServer

    engine = served_twin(measured, tmp_path)  # (eager off, the family's budget: not sim serve's defaults)
    twin = str(tmp_path / "twin.json")
    with ChildServer([*engine, "--efficiencies", twin]) as server, urllib.request.urlopen(server.url + "/inferlab/engine") as resp:
        served = json.load(resp)
    assert (served["enforce_eager"], served["max_num_batched_tokens"], served["num_gpu_blocks_override"]) == (False, 2048, 900)
    # a twin calibrated with --enforce-eager and --max-num-seqs 8: runs without them take them
    (tmp_path / "e").mkdir()
    runs = said(measured[0], tmp_path / "e", *[stating("0.19.0", **KV)] * 3)
    res = calibrate_cli(runs, tmp_path / "eager.json", "--enforce-eager", "--max-num-seqs", "8")
    assert res.exit_code == 0, res.stderr
    # (the constant an eager engine fits is named: its header said cpu_step_s)
    named = CliRunner().invoke(main, ["sim", "calibrate", *ENGINE, "--enforce-eager", *runs, "--fit", "gemm_compute,cpu_step_s",
                                      "--max-evaluations", "3", "-o", str(tmp_path / "eager2.json")])
    assert named.exit_code == 0, named.stderr
    assert "fitting gemm_compute, cpu_step_eager_s to" in words(named.stderr)
    ran, err, _ = run_twin(tmp_path / "eager.json", tmp_path / "r")
    assert (ran["enforce_eager"], ran["max_num_seqs"], ran["num_gpu_blocks_override"]) == (True, 8, 900)
    assert "--max-num-seqs 8, --enforce-eager" in err
    # given otherwise: the flag's, and the server's cache kept, said
    ran, err, _ = run_twin(tmp_path / "eager.json", tmp_path / "r2", "--no-enforce-eager")
    assert (ran["enforce_eager"], ran["num_gpu_blocks_override"]) == (False, 900) and "kept at the 900 blocks" in err


def test_a_run_of_a_twin_given_flags_its_server_stated_otherwise_says_it_is_a_what_if(
    twins: dict[str, Any], tmp_path: Path
) -> None:
    """The flag given runs (a what-if), and the run says what the server stated; the same
    value given, or another server's run, says nothing of it."""
    ran, err, _ = run_twin(twins["auto"], tmp_path / "r", "--max-model-len", "4096", "--enable-prefix-caching")
    assert (ran["max_model_len"], ran["enable_prefix_caching"]) == (4096, True)
    assert ("--enable-prefix-caching, --max-model-len 4096: a what-if of twin.json's server, which stated "
            "--no-enable-prefix-caching, --max-model-len 8192") in err
    _, err, _ = run_twin(twins["auto"], tmp_path / "r2", "--max-model-len", "8192", "--kv-cache-dtype", "auto")
    assert "what-if" not in err
    _, err, _ = run_twin(twins["auto"], tmp_path / "r3", "--max-model-len", "4096", "--gpu", "A100")
    assert "what-if" not in err and "another model, GPU" in err


def test_runs_of_a_twin_take_the_other_engine_flags_it_was_calibrated_with(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """Prefix caching, chunked prefill and the front end (API servers, the host's speed)
    change what a step holds and what a request costs: a run of a twin calibrated without
    prefix caching or chunking, on two API servers of a host twice as fast, that says
    none of it runs that engine, not the family's defaults under the fit's bands."""
    engine = ["--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "L40S"]
    runs = said(measured[0], tmp_path, None, None, None)  # (a server that stated nothing of itself)
    res = CliRunner().invoke(main, ["sim", "calibrate", *engine, *runs, "--no-enable-prefix-caching",
                                    "--no-enable-chunked-prefill", "--max-num-batched-tokens", "4096", "--max-model-len",
                                    "4096", "--api-server-count", "2", "--host-speed", "2", "--fit", "gemm_compute",
                                    "--max-evaluations", "3", "-o", str(tmp_path / "twin.json")])
    assert res.exit_code == 0, res.stderr
    keys = ("enable_prefix_caching", "enable_chunked_prefill", "max_num_batched_tokens", "api_server_count", "host_speed")

    def run(twin: str, out: str, *flags: str) -> tuple[list[Any], str]:
        res = CliRunner().invoke(main, ["sim", "run", *engine, "-c", "2", "-n", "4", "--efficiencies",
                                        str(tmp_path / twin), *flags, "-o", str(tmp_path / out)])
        assert res.exit_code == 0, res.stderr
        ran = engine_of(tmp_path / out)
        return [ran[k] for k in keys], words(res.stderr)

    ran, err = run("twin.json", "r")
    assert ran == [False, False, 4096, 2, 2.0]
    said_ = err.split("as twin.json was calibrated: ")[1].split(" (unless")[0].split(", ")
    assert {"--max-model-len 4096", "--max-num-batched-tokens 4096", "--no-enable-prefix-caching",
            "--no-enable-chunked-prefill", "--api-server-count 2", "--host-speed 2.0"} <= set(said_), err
    # flags given win
    assert run("twin.json", "r2", "--enable-prefix-caching", "--host-speed", "1")[0] == [True, False, 4096, 2, 1.0]
    # offline there is no front end to take (it was taken as another server's, and nothing was)
    ran, err = run("twin.json", "r4", "--offline")
    assert ran == [False, False, 4096, 1, 1.0] and "another model" not in err
    # a longer context for the unchunked engine: the twin's budget, below it, is not taken (vLLM would refuse it)
    ran, err = run("twin.json", "r5", "--max-model-len", "8192")
    assert ran[:2] == [False, False] and ran[2] != 4096
    assert "--max-model-len 8192 without chunked prefill: twin.json's --max-num-batched-tokens 4096 is below it" in err
    # a twin from before the record: its runs take the family's defaults, as they did
    old = json.loads((tmp_path / "twin.json").read_text())
    old["calibration"]["sized_with"] = {k: v for k, v in old["calibration"]["sized_with"].items()
                                        if k not in ("enable_prefix_caching", "enable_chunked_prefill",
                                                     "api_server_count", "host_speed")}
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert run("old.json", "r3")[0] == [True, True, 4096, 1, 1.0]


@pytest.mark.parametrize(("param", "needle"), [
    ("tensor-parallel-size=1,2", "the search sets --tensor-parallel-size per trial: the engine its server stated"),
    ("engine-family=vllm,sglang", "the search sets --engine-family per trial: the engine its server stated"),
])
def test_a_tune_over_what_makes_another_server_takes_nothing_the_twins_server_stated(
    twins: dict[str, Any], tmp_path: Path, param: str, needle: str
) -> None:
    res = CliRunner().invoke(main, ["tune", *ENGINE, "--param", param, "-c", "2", "-n", "4", "--efficiencies",
                                    str(twins["auto"]), "--max-trials", "2", "--slo-ttft-ms", "500", "-o", str(tmp_path / "t")])
    assert res.exit_code == 0, res.stderr
    assert needle in words(res.stderr)
    ran = [engine_of(p.parent) for p in (tmp_path / "t").rglob("config.json")]
    assert len(ran) == 2 and all(p["num_gpu_blocks_override"] is None and p["block_size"] == 16 for p in ran)


def test_a_tune_over_the_family_with_a_twin_of_another_family_says_it_takes_nothing(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    runs = said(measured[0], tmp_path, *[sglang(**SGLANG)] * 3)
    res = calibrate_cli(runs, tmp_path / "twin.json")
    assert res.exit_code == 0, res.stderr
    res = CliRunner().invoke(main, ["tune", *ENGINE, "--param", "engine-family=vllm,sglang", "-c", "2", "-n", "4",
                                    "--efficiencies", str(tmp_path / "twin.json"), "--max-trials", "2", "--slo-ttft-ms",
                                    "500", "-o", str(tmp_path / "t")])
    assert res.exit_code == 0, res.stderr
    assert "the search sets the engine's family per trial: nothing of twin.json (a twin of the sglang family) is taken" in words(res.stderr)


def test_a_run_measured_at_rate_inf_is_rerun_as_the_server_it_was_measured_on(tmp_path: Path) -> None:
    from inferlab.sim.validation.twin import Twin

    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps(TRUTH))
    # (a server measured with every request at once: served, with its API costs, not vLLM's offline class)
    run = read_run(sim_run(tmp_path / "inf", "--rate", "inf", "--served", "-n", "8", "--input-tokens", "1024",
                           "--output-tokens", "32", "--efficiencies", str(truth)))
    (tmp_path / "scratch").mkdir()
    twin = Twin(engine(), str(tmp_path / "scratch"))
    got = twin.predict([run], TRUTH)[0]
    assert run.measured and all(got[m] == pytest.approx(v, rel=1e-9) for m, v in run.measured.items()), (got, run.measured)
    # and sim run's own offline run (its engine says so) as that
    off = read_run(sim_run(tmp_path / "off", "--rate", "inf", "-n", "8", "--input-tokens", "1024", "--output-tokens", "32",
                           "--efficiencies", str(truth)))
    got = twin.predict([off], TRUTH)[0]
    assert off.offline and all(got[m] == pytest.approx(v, rel=1e-9) for m, v in off.measured.items()), (got, off.measured)


def test_an_unchunked_run_of_a_twin_takes_no_budget_and_keeps_no_blocks_sized_at_another(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    engine = ["--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "L40S"]
    (tmp_path / "s").mkdir()
    res = CliRunner().invoke(main, ["sim", "calibrate", *engine, *said(measured[0], tmp_path / "s", *[sglang(**SGLANG)] * 3),
                                    "--fit", "gemm_compute", "--max-evaluations", "3", "-o", str(tmp_path / "sg.json")])
    assert res.exit_code == 0, res.stderr
    # (the server's chunk size, stated and sized with, is no budget for an unchunked engine)
    res = CliRunner().invoke(main, ["sim", "run", *engine, "-n", "4", "--efficiencies", str(tmp_path / "sg.json"),
                                    "--no-enable-chunked-prefill", "-o", str(tmp_path / "r")])
    assert res.exit_code == 0, res.stderr
    ran, err = engine_of(tmp_path / "r"), words(res.stderr)
    assert ran["max_num_batched_tokens"] >= ran["max_model_len"] and ran["num_gpu_blocks_override"] is not None
    assert "--max-num-batched-tokens 4096" not in err and "might have sized its KV cache otherwise" in err
    # a vLLM twin: unchunked, the budget resolves otherwise than its server's: its blocks kept, said
    engine = served_twin(measured, tmp_path)
    res = CliRunner().invoke(main, ["sim", "run", *engine, "-n", "4", "--efficiencies", str(tmp_path / "twin.json"),
                                    "--no-enable-chunked-prefill", "-o", str(tmp_path / "u")])
    assert res.exit_code == 0, res.stderr
    assert engine_of(tmp_path / "u")["num_gpu_blocks_override"] == 900 and "kept at the 900 blocks" in words(res.stderr)


def test_eager_mode_given_against_the_servers_keeps_calibrate_from_taking_its_pool(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    runs = said(measured[0], tmp_path, *[sglang(**{**SGLANG, "enforce_eager": False})] * 3)
    res = calibrate_cli(runs, tmp_path / "twin.json", "--enforce-eager", "--max-num-batched-tokens", "4096")
    assert res.exit_code == 0, res.stderr
    assert "--enforce-eager given: the KV cache is sized from the flags" in words(res.stderr)
    assert "num_gpu_blocks_override" not in json.loads((tmp_path / "twin.json").read_text())["calibration"]["server_settings"]


def test_an_sglang_release_inferlab_cannot_read_is_still_the_sglang_family(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    res = calibrate_cli(said(measured[0], tmp_path, *[sglang(**SGLANG) | {"version": "main"}] * 3), tmp_path / "twin.json")
    assert res.exit_code == 0, res.stderr
    record = json.loads((tmp_path / "twin.json").read_text())["calibration"]
    assert record["served_by"]["engine_family"] == "sglang" and record["server_settings"]["max_num_seqs"] == 128


@pytest.mark.parametrize(("flags", "said_"), [
    (("--max-num-seqs", "64"), "--max-num-seqs given: the KV cache is sized from the flags, not from the 50,000-token pool"),
    (("--kv-cache-dtype", "fp8"), "--kv-cache-dtype given: the KV cache is sized from the flags"),
    # the user's own count is not overwritten by the server's pool
    (("--num-gpu-blocks-override", "777"), None),
])
def test_flags_that_size_calibrates_cache_otherwise_keep_it_from_the_sglang_pool(
    measured: tuple[list[str], list[str]], tmp_path: Path, flags: tuple[str, ...], said_: str | None
) -> None:
    runs = said(measured[0], tmp_path, *[sglang(**SGLANG)] * 3)
    res = CliRunner().invoke(main, ["sim", "calibrate", "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "L40S", *flags,
                                    *runs, "--fit", "gemm_compute", "--max-evaluations", "3", "-o", str(tmp_path / "t.json")])
    assert res.exit_code == 0, res.stderr
    err = words(res.stderr)
    if said_:
        assert said_ in err
    assert "simulated as 3,125 blocks" not in err
    record = json.loads((tmp_path / "t.json").read_text())["calibration"]
    assert "num_gpu_blocks_override" not in record["server_settings"]


def test_chunking_as_sglang_states_it_is_not_taken_by_another_family(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    runs = said(measured[0], tmp_path, *[sglang(**{k: v for k, v in SGLANG.items() if k != "max_num_batched_tokens"},
                                                enable_chunked_prefill=False)] * 3)
    res = calibrate_cli(runs, tmp_path / "twin.json", "--engine-family", "vllm")
    assert res.exit_code == 0, res.stderr
    assert "--enable-chunked-prefill" in words(res.stderr) and "is SGLang's, not taken" in words(res.stderr)
    assert "enable_chunked_prefill" not in json.loads((tmp_path / "twin.json").read_text())["calibration"]["server_settings"]


def test_a_block_size_calibrate_was_given_is_the_twins_though_the_servers_blocks_are_not_taken(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    runs = said(measured[0], tmp_path, *[stating("0.19.0", **{**KV, "block_size": 16})] * 3)
    res = calibrate_cli(runs, tmp_path / "twin.json", "--block-size", "32")
    assert res.exit_code == 0, res.stderr
    record = json.loads((tmp_path / "twin.json").read_text())["calibration"]
    assert "num_gpu_blocks_override" not in record["server_settings"] and record["sized_with"]["block_size"] == 32
    ran, err, _ = run_twin(tmp_path / "twin.json", tmp_path / "r")  # (no --block-size: the twin's)
    assert ran["block_size"] == 32 and "--block-size 32" in err


def test_the_same_model_by_another_path_is_the_same_server(
    measured: tuple[list[str], list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
             "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "config.json").write_text(json.dumps(model))
    monkeypatch.chdir(tmp_path)  # (calibrated by a relative path...)
    res = CliRunner().invoke(main, ["sim", "calibrate", "--model", "my-model/config.json", "--gpu", "L40S",
                                    *said(measured[0], tmp_path, *[stating("0.19.0", **KV)] * 3),
                                    "--fit", "gemm_compute", "--max-evaluations", "3", "-o", "twin.json"])
    assert res.exit_code == 0, res.stderr
    monkeypatch.chdir(tmp_path / "my-model")  # (...run from elsewhere by an absolute one)
    res = CliRunner().invoke(main, ["sim", "run", "--model", str(tmp_path / "my-model" / "config.json"), "--gpu", "L40S",
                                    "-c", "2", "-n", "4", "--efficiencies", str(tmp_path / "twin.json"),
                                    "-o", str(tmp_path / "r"), "--json"])
    assert res.exit_code == 0, res.stderr
    assert "another model" not in words(res.stderr) and "mismatch" not in json.loads(res.stdout)["prediction"]
    assert engine_of(tmp_path / "r")["num_gpu_blocks_override"] == 900


def test_a_context_and_eager_mode_calibrate_ran_with_are_the_twins(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    runs = said(measured[0], tmp_path, *[stating("0.19.0", **KV)] * 3)
    res = calibrate_cli(runs, tmp_path / "twin.json", "--max-model-len", "4096")
    assert res.exit_code == 0, res.stderr
    assert json.loads((tmp_path / "twin.json").read_text())["calibration"]["sized_with"]["max_model_len"] == 4096
    ran, err, prediction = run_twin(tmp_path / "twin.json", tmp_path / "r")
    assert ran["max_model_len"] == 4096 and "--max-model-len 4096" in err and "mismatch" not in prediction
    # another eager mode runs on a host cost the twin did not fit: not validated
    _, _, prediction = run_twin(tmp_path / "twin.json", tmp_path / "e", "--enforce-eager")
    assert "mismatch" in prediction and "enforce eager" in json.dumps(prediction)
    # another family given: said, and nothing of the twin's taken
    _, err, _ = run_twin(tmp_path / "twin.json", tmp_path / "f", "--engine-family", "sglang")
    assert "--engine-family sglang: a what-if of another engine than twin.json's (vllm)" in err


def test_a_constant_that_ends_at_its_bound_is_said(tmp_path: Path) -> None:
    from inferlab.sim.validation.twin import at_bounds

    # a server with no API latency at all: fitting the latency alone drives it down to its bound
    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps({"api_overhead_s": 0.0}))  # (the family's constants otherwise)
    runs = [measured_run(tmp_path / f"c1-in{n}", "-c", "1", "-n", "4", "--input-tokens", str(n), "--output-tokens", "8",
                         "--efficiencies", str(truth)) for n in (128, 1024)]
    res = CliRunner().invoke(main, ["sim", "calibrate", *ENGINE, *runs, "--fit", "api_overhead_s", "--max-evaluations",
                                    "60", "-o", str(tmp_path / "twin.json"), "--report", str(tmp_path / "fit.json")])
    assert res.exit_code == 0, res.stderr
    report = json.loads((tmp_path / "fit.json").read_text())
    assert report["at_bounds"] == {"api_overhead_s": "lower"} == at_bounds(report["constants"])
    assert "api_overhead_s ended at its lower bound (1e-06)" in words(res.stderr)
    # a fit that ends inside its bounds says nothing of them
    res = CliRunner().invoke(main, ["sim", "calibrate", *ENGINE, *runs, "--fit", "gemm_compute", "--max-evaluations",
                                    "3", "-o", str(tmp_path / "t2.json"), "--report", str(tmp_path / "f2.json")])
    assert res.exit_code == 0, res.stderr
    assert json.loads((tmp_path / "f2.json").read_text())["at_bounds"] == {} and "bound" not in res.stderr


def test_a_tensorrt_llm_twin_keeps_the_kv_share_it_was_calibrated_with(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """TensorRT-LLM's memory share (of what weights leave) sizes its cache as vLLM's
    --gpu-memory-utilization sizes vLLM's, and its capacity policy decides whether a full
    cache preempts: a twin records both, and its runs take them (a twin fitted with
    MAX_UTILIZATION ran as GUARANTEED_NO_EVICT)."""
    engine = ["--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "L40S", "--engine-family", "trtllm"]
    runs = said(measured[0], tmp_path, None, None, None)
    res = CliRunner().invoke(main, ["sim", "calibrate", *engine, *runs, "--kv-cache-free-gpu-mem-fraction", "0.5",
                                    "--capacity-scheduler-policy", "MAX_UTILIZATION",
                                    "--fit", "gemm_compute", "--max-evaluations", "3", "-o", str(tmp_path / "twin.json")])
    assert res.exit_code == 0, res.stderr
    res = CliRunner().invoke(main, ["sim", "run", *engine, "-c", "2", "-n", "4", "--efficiencies", str(tmp_path / "twin.json"),
                                    "-o", str(tmp_path / "r")])
    assert res.exit_code == 0, res.stderr
    ran = engine_of(tmp_path / "r")
    assert ran["kv_cache_free_fraction"] == 0.5 and ran["capacity_scheduler_policy"] == "MAX_UTILIZATION"


def as_bench_of_sim_serve(runs: list[str], into: Path, **engine: Any) -> list[str]:
    """Copies of ``runs`` as ``bench`` writes a run against ``sim serve``: no command,
    and the engine the simulated server reported (``resolved.engine``), changed by ``engine``."""
    recorded = into / "recorded"  # (the engine a sim run of the runs' flags records)
    sim_run(recorded, "-c", "1", "-n", "1", "--input-tokens", "8", "--output-tokens", "2")
    ran = {**json.loads((recorded / "config.json").read_text())["engine"], **engine}

    def as_bench(config: dict[str, Any]) -> None:
        config.pop("command", None)
        config["resolved"] = {"url": "http://127.0.0.1:8000/v1", "model": ran["model"], "engine": ran,
                              "server_software": None}

    return rewritten(runs, into, *[as_bench] * len(runs))


def test_a_twin_of_the_simulated_server_is_calibrated_as_the_engine_it_ran(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """Runs against ``sim serve --enforce-eager --max-model-len 4096``: the twin is of that
    engine, eager and at that context (it was of an engine without either), flags given
    win, and runs of two different simulated engines are refused."""
    (tmp_path / "a").mkdir()
    runs = as_bench_of_sim_serve(measured[0], tmp_path / "a", enforce_eager=True, max_model_len=4096)
    res = calibrate_cli(runs, tmp_path / "twin.json")
    assert res.exit_code == 0, res.stderr
    assert "the runs' server was inferlab's simulated engine" in words(res.stderr) and "--enforce-eager" in words(res.stderr)
    # (their numbers are the simulator's: the table does not call them measured)
    assert "simulated server: predictions" in words(res.stdout) and "measured" not in res.stdout
    sized = json.loads((tmp_path / "twin.json").read_text())["calibration"]["sized_with"]
    assert (sized["enforce_eager"], sized["max_model_len"]) == (True, 4096)
    res = calibrate_cli(runs, tmp_path / "given.json", "--max-model-len", "8192")
    assert res.exit_code == 0, res.stderr
    sized = json.loads((tmp_path / "given.json").read_text())["calibration"]["sized_with"]
    assert (sized["enforce_eager"], sized["max_model_len"]) == (True, 8192)
    # runs of a server that is not inferlab's: nothing taken from them
    res = calibrate_cli(measured[0], tmp_path / "sim.json")
    assert res.exit_code == 0 and "simulated engine" not in res.stderr
    (tmp_path / "b").mkdir()
    other = as_bench_of_sim_serve(measured[0][1:2], tmp_path / "b", enforce_eager=False)
    res = calibrate_cli([*runs[:1], *other], tmp_path / "mixed.json")
    assert res.exit_code == 2 and "different engines" in res.stderr, res.stderr


def edited(run: str, into: Path, name: str | None = None, **changes: Any) -> str:
    """A copy of ``run`` whose config.json's ``resolved`` and summary.json's ``counts``
    hold ``changes`` (keys ``resolved`` and ``counts``, merged)."""
    copy = into / (name or Path(run).name)
    shutil.copytree(run, copy)
    for file, key in (("config.json", "resolved"), ("summary.json", "counts")):
        if key in changes:
            data = json.loads((copy / file).read_text())
            data[key] = {**data[key], **changes[key]}
            (copy / file).write_text(json.dumps(data))
    with (copy / "requests.jsonl").open("a") as f:  # (records of its own: another run)
        f.write("\n")
    return str(copy)


def test_a_sim_run_directory_is_refused_as_the_prediction_it_is(measured: tuple[list[str], list[str]], tmp_path: Path) -> None:
    """A sim run's numbers are the simulator's: fitted as a measurement, the default
    engine was fitted to another model's predictions and showed ±0.1 % in sample."""
    predicted = sim_run(tmp_path / "sim", "-c", "1", "-n", "4", "--input-tokens", "256", "--output-tokens", "8")
    for runs, flags in (([predicted], ()), (measured[0][:1], ("--holdout", predicted))):
        res = calibrate_cli(runs, tmp_path / "twin.json", *flags)
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert f"{predicted}: a sim run directory, the simulator's prediction, not a measurement" in res.stderr
        assert not (tmp_path / "twin.json").exists()


def test_a_run_both_fitted_and_held_out_or_given_twice_is_refused(measured: tuple[list[str], list[str]], tmp_path: Path) -> None:
    """The same run as a fit run and as --holdout reported its in-sample error as held-out:
    by one path, by another path to it, or as a copy (the same requests.jsonl)."""
    run = measured[0][0]
    other_path = str(Path(run).parent / ".." / Path(run).parent.name / Path(run).name)
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    for fit, held, needle in (
        ([run], [run], "are one directory, fitted on and held out"),
        ([run], [other_path], "are one directory, fitted on and held out"),
        ([run], [str(copy)], "hold the same run (identical requests.jsonl), fitted on and held out"),
        ([run, str(copy)], [], "given twice to fit on"),
    ):
        res = calibrate_cli([*fit, *(a for h in held for a in ("--holdout", h))], tmp_path / "twin.json")
        assert res.exit_code == 2 and needle in words(res.stderr) and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert calibrate_cli([run, "--holdout", measured[1][0]], tmp_path / "twin.json").exit_code == 0


def test_runs_of_different_models_are_refused_and_a_model_not_the_servers_is_said(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """Runs of two servers were mixed without a word where neither said its software: runs
    of different models are refused (a twin is of one); at different URLs they are said
    (one server restarted on another port is still one); a model given or defaulted that
    is not the one the runs' server served is said, and so is a GPU no run states."""
    a, b = measured[0][:2]
    llama = edited(b, tmp_path, resolved={"model": "meta-llama/Llama-3.1-8B-Instruct"})
    res = calibrate_cli([a, llama], tmp_path / "twin.json")
    assert res.exit_code == 2 and "different models (Qwen/Qwen2.5-7B-Instruct, meta-llama/Llama-3.1-8B-Instruct)" in res.stderr
    # (the same model loaded from a local folder is the same model)
    local = edited(b, tmp_path, "local", resolved={"model": "/models/Qwen2.5-7B-Instruct"})
    res = calibrate_cli([a, local], tmp_path / "twin.json")
    assert res.exit_code == 0, res.stderr
    assert "served" not in res.stderr  # (no word of another model)
    moved = edited(b, tmp_path, "moved", resolved={"url": "http://other.test:9000/v1"})
    res = calibrate_cli([a, moved], tmp_path / "twin.json")
    assert res.exit_code == 0, res.stderr
    assert f"measured at different URLs (http://other.test:9000/v1, {SERVER_URL}/v1): calibrated as one server" in words(res.stderr)
    # the runs' server served Llama; the default model is calibrated, and --gpu is the default: said
    runs = [edited(r, tmp_path / "l", resolved={"model": "meta-llama/Llama-3.1-8B-Instruct"}) for r in measured[0][:2]]
    res = CliRunner().invoke(main, ["sim", "calibrate", *runs, "--fit", "gemm_compute", "--max-evaluations", "2",
                                    "-o", str(tmp_path / "twin.json")])
    assert res.exit_code == 0, res.stderr
    said_ = words(res.stderr)
    assert ("the runs' server served meta-llama/Llama-3.1-8B-Instruct, but no --model was given: calibrating the "
            "simulator's default model, Qwen/Qwen2.5-7B-Instruct (give --model meta-llama/Llama-3.1-8B-Instruct)") in said_
    assert "the runs do not say the server's GPU: calibrating on the default --gpu H100 (give --gpu)" in said_
    res = calibrate_cli(runs, tmp_path / "twin.json")  # (--model Qwen 7B given)
    assert res.exit_code == 0 and ("the runs' server served meta-llama/Llama-3.1-8B-Instruct; calibrating --model "
                                   "Qwen/Qwen2.5-7B-Instruct as given") in words(res.stderr), res.stderr
    # runs of sim serve record its model and GPU: a flag that contradicts them is said
    (tmp_path / "s").mkdir()
    served = as_bench_of_sim_serve(measured[0][:1], tmp_path / "s")
    res = calibrate_cli(served, tmp_path / "twin.json", "--gpu", "H100")
    assert res.exit_code == 0 and "the runs' server ran gpu L40S" in words(res.stderr) and \
        "calibrating --gpu H100 as given" in words(res.stderr), res.stderr


def test_runs_with_failed_requests_are_said_and_those_biased_by_them_refused_unless_allowed(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """A run's p50s are over the requests that completed: a timed-out request is one of
    its slowest, left out. Each run with failures is said with its failed share; one
    with a timeout (or over 5 % failed) is refused unless --allow-failures."""
    a, b = measured[0][:2]
    timed_out = edited(b, tmp_path, "timeout", counts={"total": 7, "failed": 1, "errors": {"timeout": 1}})
    res = calibrate_cli([a, timed_out], tmp_path / "twin.json")
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert f"{timed_out}: 1 of 7 requests failed (14%; timeout 1): failures that bias a run's numbers" in res.stderr
    assert "--allow-failures" in res.stderr
    assert not (tmp_path / "twin.json").exists()
    res = calibrate_cli([a, "--holdout", timed_out], tmp_path / "twin.json")  # (held out too: its error would be off)
    assert res.exit_code == 2, res.stderr
    res = calibrate_cli([a, timed_out], tmp_path / "twin.json", "--allow-failures")
    assert res.exit_code == 0 and (f"{timed_out}: 1 of 7 requests failed (14%; timeout 1): its p50s and tok/s are "
                                   "over the requests that completed (taken anyway, --allow-failures)") in words(res.stderr)
    # one stray error in 40 requests: said, not refused
    stray = edited(b, tmp_path, "stray", counts={"total": 40, "failed": 1, "errors": {"http_status": 1}})
    res = calibrate_cli([a, stray], tmp_path / "twin.json")
    assert res.exit_code == 0 and f"{stray}: 1 of 40 requests failed (2%; http_status 1)" in words(res.stderr), res.stderr


def test_a_fit_the_runs_cannot_determine_is_said_and_constants_are_not_read_one_by_one(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """One run fitted five constants to its four numbers without a word (attention 0.03
    against 0.6, a held-out 2,048-token TTFT 38 % off)."""
    res = CliRunner().invoke(main, ["sim", "calibrate", *ENGINE, measured[0][0], "--max-evaluations", "3",
                                    "-o", str(tmp_path / "twin.json")])
    assert res.exit_code == 0, res.stderr
    said_ = words(res.stderr)
    assert "5 constants fitted to 4 measured values (1 run(s)): more unknowns than numbers" in said_
    assert "every fit run has the same prompts (--input-tokens 128): attention_compute (what grows with the context)" in said_
    assert ("every fit run ran the same load (closed loop of 1 user): weight_stream, cpu_step_s (what a batch shares"
            in said_)
    assert "not meaningful one by one" in words(res.stdout)
    # three prompt lengths at one user: the load is said, the lengths and the count are not
    res = calibrate_cli(measured[0], tmp_path / "twin.json")
    assert res.exit_code == 0 and "same prompts" not in res.stderr and "more unknowns" not in res.stderr
    res = calibrate_cli([*measured[0], measured[1][0]], tmp_path / "twin.json")
    assert res.exit_code == 0 and "same load" not in res.stderr


def test_a_search_stopped_at_max_evaluations_says_it_may_not_have_converged(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    twin, report = tmp_path / "twin.json", tmp_path / "fit.json"
    res = calibrate_cli(measured[0], twin, "--report", str(report))  # (--max-evaluations 3)
    assert res.exit_code == 0, res.stderr
    assert "the search stopped at --max-evaluations 3 before it converged" in words(res.stderr)
    assert json.loads(twin.read_text())["calibration"]["converged"] is False
    assert json.loads(report.read_text())["converged"] is False and "not converged" in words(res.stdout)
    fit = calibrate(engine(), [read_run(d) for d in measured[0]], (), ("api_overhead_s",), max_evaluations=400)
    assert fit.converged and fit.evaluations < 400
    assert not calibrate(engine(), [read_run(d) for d in measured[0]], (), ("api_overhead_s",), max_evaluations=1).converged


def started_with(runs: list[str], into: Path, **spec: Any) -> list[str]:
    """Copies of ``runs`` whose config.json records the engine config inferlab started
    their server from (``bench --engine``: ``engine_config``)."""
    started = {"engine": "vllm", "model": "Qwen/Qwen2.5-7B-Instruct", "tensor_parallel_size": None,
               "max_model_len": None, "max_num_batched_tokens": None, "max_num_seqs": None,
               "gpu_memory_utilization": None, "enable_prefix_caching": None, "enforce_eager": None, **spec}
    return rewritten(runs, into, *[lambda config: config.update(engine_config=started)] * len(runs))


def test_calibrate_takes_the_flags_inferlab_started_the_server_with_and_says_what_it_left_at_defaults(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """bench --engine records the config it started the server from: its sequence cap
    and budget are the twin's (what the server states wins; a flag given wins over
    both); where neither says them, calibrate says it left them at the simulator's."""
    def cli(runs: list[str], out: Path, *flags: str) -> Any:
        return CliRunner().invoke(main, ["sim", "calibrate", "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "L40S",
                                         *flags, *runs, "--fit", "gemm_compute", "--max-evaluations", "3", "-o", str(out)])

    (tmp_path / "s").mkdir()
    runs = said(started_with(measured[0], tmp_path / "s", max_num_seqs=16, max_num_batched_tokens=512,
                             max_model_len=8192), tmp_path, *[stating("0.19.0", max_model_len=4096)] * 3)
    res = cli(runs, tmp_path / "twin.json")
    assert res.exit_code == 0, res.stderr
    err = words(res.stderr)
    assert ("as inferlab started the runs' server (config.json's engine_config, from --engine): "
            "--max-num-batched-tokens 512, --max-num-seqs 16") in err
    assert "simulator's defaults" not in err
    record = json.loads((tmp_path / "twin.json").read_text())["calibration"]
    assert (record["sized_with"]["max_num_seqs"], record["sized_with"]["max_num_batched_tokens"]) == (16, 512)
    assert record["sized_with"]["max_model_len"] == 4096  # (what the server states wins)
    res = cli(runs, tmp_path / "twin2.json", "--max-num-seqs", "8")
    assert res.exit_code == 0 and ("the runs' server was started with --max-num-seqs 16: calibrating with the flags "
                                   "given instead") in words(res.stderr)
    # runs of a server inferlab did not start, which states no cap: said, left at the simulator's defaults
    res = cli(measured[0], tmp_path / "twin3.json")
    assert res.exit_code == 0, res.stderr
    assert ("the runs do not say the server's --max-num-batched-tokens or --max-num-seqs: left at the simulator's "
            "defaults (--max-num-batched-tokens") in words(res.stderr)


def warned(run: str, into: Path, name: str, **summary: Any) -> str:
    """A copy of ``run`` whose summary.json holds ``summary``'s keys (``warnings``
    added to its own; ``tpot_p50``: its TPOT p50)."""
    copy = Path(edited(run, into, name))
    data = json.loads((copy / "summary.json").read_text())
    data["warnings"] = [*data.get("warnings", []), *summary.pop("warnings", [])]
    if "tpot_p50" in summary:
        data["tpot_ms"]["p50"] = summary.pop("tpot_p50")
    data.update(summary)
    (copy / "summary.json").write_text(json.dumps(data))
    return str(copy)


def test_runs_their_summary_warns_are_off_are_refused_unless_allowed_and_a_metric_left_out_is_said(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """A run whose client was likely the bottleneck (its delay in the latencies), or
    whose prompts the server served from a cache an earlier run filled (a cached
    prompt's TTFT), is refused unless --allow-unreliable; a TPOT of 0, left out of the
    fit, is said with why."""
    a, b = measured[0][:2]
    slow = warned(b, tmp_path, "slow", client={"bottleneck": True, "inflation_ms": {"p50": 86.4, "p99": 90.0},
                                               "processes": []})
    cached = warned(b, tmp_path, "cached", tpot_p50=0.0, warnings=[
        "the server served 2,048 of 2,480 prompt tokens from its prefix cache, though this run's prompts share no "
        "prefix: TTFT is lower than for fresh prompts (an earlier run with the same --seed, or another client, sent "
        "the same text)"])
    for run, why in ((slow, "the client was likely the bottleneck (its latencies inflated by about 86.4 ms at p50)"),
                     (cached, "the server served 2,048 of 2,480 prompt tokens from its prefix cache filled by an "
                              "earlier run")):
        res = calibrate_cli([a, run], tmp_path / "twin.json")
        assert res.exit_code == 2 and f"{run}: {why}: its summary warns its numbers are off" in words(res.stderr), res.stderr
        assert "--allow-unreliable" in res.stderr and not (tmp_path / "twin.json").exists()
        assert calibrate_cli([a, "--holdout", run], tmp_path / "twin.json").exit_code == 2
    res = calibrate_cli([a, cached], tmp_path / "twin.json", "--allow-unreliable")
    assert res.exit_code == 0, res.stderr
    err = words(res.stderr)
    assert f"{cached}: the server served 2,048 of 2,480 prompt tokens from its prefix cache filled by an earlier run (taken anyway, --allow-unreliable)" in err
    assert f"{cached}: its TPOT p50 is left out of the fit and its error: it measured 0" in err


def test_a_twin_records_the_name_its_server_served_and_answers_to_it(
    measured: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """A server serves its model under a name of its own (--served-model-name, a folder's
    path): the twin did not record it, so sim serve with the twin answered to the preset's
    name and a client of the server asked for a model it did not have. Runs or a trace of
    another name are warned of, not refused."""
    import urllib.request

    from inferlab.sim.server.launch import ChildServer

    def served_as(name: str) -> Callable[[dict[str, Any]], None]:
        return lambda config: config["resolved"].update(model=name)

    engine = ["--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "L40S"]
    (tmp_path / "runs").mkdir()
    runs = rewritten(measured[0], tmp_path / "runs", *[served_as("acme/chat-prod")] * 3)
    twin = tmp_path / "twin.json"
    res = CliRunner().invoke(main, ["sim", "calibrate", *engine, *runs, "--fit", "gemm_compute", "--max-evaluations",
                                    "3", "-o", str(twin)])
    assert res.exit_code == 0, res.stderr
    assert json.loads(twin.read_text())["calibration"]["served_model"] == "acme/chat-prod"

    def ask(args: list[str]) -> tuple[list[str], str]:
        with ChildServer([*args, "--efficiencies", str(twin)]) as server:
            with urllib.request.urlopen(server.url + "/v1/models") as resp:
                ids = [card["id"] for card in json.load(resp)["data"]]
            body = json.dumps({"model": ids[0], "prompt": "hi", "max_tokens": 2}).encode()
            request = urllib.request.Request(server.url + "/v1/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request) as resp:
                return ids, json.load(resp)["model"]

    assert ask(engine) == (["acme/chat-prod"], "acme/chat-prod")
    assert ask([*engine, "--served-model-name", "mine"]) == (["mine"], "mine")  # (a name given wins)
    ids, _ = ask(["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L40S"])  # (another model: not its name)
    assert ids != ["acme/chat-prod"]
    # sim run says which model the twin was fitted on; a trace of a run served as another name is warned of
    res = CliRunner().invoke(main, ["sim", "run", *engine, "-c", "1", "-n", "2", "--efficiencies", str(twin),
                                    "-o", str(tmp_path / "r")])
    assert res.exit_code == 0, res.stderr
    assert "twin.json was fitted on runs of acme/chat-prod" in words(res.stderr) and "warning" not in res.stderr
    (tmp_path / "other").mkdir()
    other = rewritten(measured[0][:1], tmp_path / "other", served_as("acme/other-model"))
    res = CliRunner().invoke(main, ["sim", "run", *engine, "--trace", f"{other[0]}/requests.jsonl", "--efficiencies",
                                    str(twin), "-o", str(tmp_path / "t")])
    assert res.exit_code == 0, res.stderr
    assert ("warning: the trace's run was served as acme/other-model, twin.json as acme/chat-prod") in words(res.stderr)
    # calibrating runs of another name from the twin's constants: warned of, not refused
    (tmp_path / "again").mkdir()
    again = rewritten(measured[0], tmp_path / "again", *[served_as("acme/other-model")] * 3)
    res = CliRunner().invoke(main, ["sim", "calibrate", *engine, *again, "--efficiencies", str(twin), "--fit",
                                    "gemm_compute", "--max-evaluations", "3", "-o", str(tmp_path / "again.json")])
    assert res.exit_code == 0, res.stderr
    assert "warning: the runs were served as acme/other-model, twin.json as acme/chat-prod" in words(res.stderr)
