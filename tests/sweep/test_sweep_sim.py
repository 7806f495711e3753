"""``inferlab sweep`` against the simulator in virtual time: the saturation stop, the
goodput search, repeats, an interrupted sweep, and the index every point leaves."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from html import escape
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from inferlab.cli.main import main
from inferlab.load.run import RunConfig, SimTarget, run
from inferlab.load.schedules import ClosedLoop, LoadConfig, OpenLoop
from inferlab.results.metrics import SLO
from inferlab.results.records import RequestRecord
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sweep.goodput import slo_share
from inferlab.sweep.grid import Grid
from inferlab.sweep.runner import SweepConfig, run_sweep
from inferlab.workload.config import WorkloadConfig

#: the engine `sim serve` starts (its defaults) with room for 16 sequences: it saturates early
ENGINE_FLAGS = ["--max-num-seqs", "16", "--max-model-len", "4096", "--max-num-batched-tokens", "8192", "--enforce-eager"]
WORKLOAD_FLAGS = ["--input-tokens", "512", "--output-tokens", "16", "--api", "completions"]


def sweep(args: list[str]) -> Any:
    return CliRunner().invoke(main, ["sweep", *args], catch_exceptions=False)


def index(d: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((d / "sweep.json").read_text())
    return data


def test_a_concurrency_sweep_stops_by_itself_at_saturation_and_names_the_knee(tmp_path: Path) -> None:
    out = tmp_path / "s"
    r = sweep(["-c", "1,2,4,8,16,32,64,128,256", *ENGINE_FLAGS, *WORKLOAD_FLAGS, "-o", str(out)])
    assert r.exit_code == 0, r.output
    ix = index(out)
    assert ix["format"] == "inferlab.sweep/1" and ix["complete"] is True and ix["prediction"] is True
    (group,) = ix["groups"]
    stop = group["stopped"]
    assert stop is not None and stop["knee"] is not None
    # 16 sequences run at once: the knee is where that many are kept busy, not far past,
    # and the sweep stops within a doubling or two of it
    assert 16 <= stop["knee"] <= 32 and stop["knee"] < stop["at"] <= 64
    skipped = [p["params"]["concurrency"] for p in ix["points"] if p["status"] == "skipped"]
    assert 256 in skipped and all(c > stop["at"] for c in skipped)
    assert f"knee: c={stop['knee']}" in r.output and "prediction (simulated, virtual time)" in r.output
    # every point run is a normal run directory whose summary the headline is taken from
    done = [p for p in ix["points"] if p["status"] == "done"]
    for p in done:
        s = json.loads((out / p["dir"] / "summary.json").read_text())
        assert p["headline"]["output_tok_s"] == s["output_token_throughput_tps"]
        assert (out / p["dir"] / "requests.jsonl").exists() and (out / p["dir"] / "config.json").exists()
    # saturated indeed: the last load, never run by the sweep, buys no more throughput
    knee = next(p for p in done if p["params"]["concurrency"] == stop["knee"])
    far = asyncio.run(run(
        RunConfig(LoadConfig(ClosedLoop(256), 1024), WorkloadConfig(512, 16), "completions"),
        SimTarget(EngineConfig(max_num_seqs=16, max_model_len=4096, max_num_batched_tokens=8192, enforce_eager=True)),
    ))
    assert far.summary.output_token_throughput_tps is not None
    assert far.summary.output_token_throughput_tps < 1.1 * knee["headline"]["output_tok_s"]


def test_engine_flags_are_axes_in_the_simulator(tmp_path: Path) -> None:
    out = tmp_path / "e"
    r = sweep(["-c", "8", "--gpu", "H100,L40S", "--quantization", "none,fp8", "--input-tokens", "256",
               "--output-tokens", "32", "-o", str(out)])
    assert r.exit_code == 0, r.output
    ix = index(out)
    assert ix["axes"] == {"concurrency": [8], "gpu": ["H100", "L40S"], "quantization": ["none", "fp8"]}
    engines = {(p["params"]["gpu"], p["params"]["quantization"]): json.loads((out / p["dir"] / "config.json").read_text())["engine"]
               for p in ix["points"]}
    assert set(engines) == {("H100", "none"), ("H100", "fp8"), ("L40S", "none"), ("L40S", "fp8")}
    assert engines["L40S", "fp8"]["gpu"] == "L40S" and engines["L40S", "fp8"]["quantization"] == "fp8"
    tps = {k: p["headline"]["output_tok_s"] for k, p in zip(engines, ix["points"], strict=True)}
    assert tps["H100", "none"] > tps["L40S", "none"]  # the faster GPU is faster


def test_the_index_target_names_the_engine_axes_varied_not_a_base_value_no_point_ran(tmp_path: Path) -> None:
    """--max-num-seqs 2,4: sweep.json's target.engine holds no max_num_seqs (no point ran
    the base's), names it in ``varied``, and every setting it does hold is what every
    point ran with."""
    out = tmp_path / "v"
    r = sweep(["-c", "8", "--max-num-seqs", "2,4", "--max-model-len", "4096", "--input-tokens", "256",
               "--output-tokens", "16", "-n", "16", "-o", str(out)])
    assert r.exit_code == 0, r.output
    target = index(out)["target"]
    assert target["varied"] == ["max_num_seqs"] and "max_num_seqs" not in target["engine"]
    assert target["engine"]["max_model_len"] == 4096
    for p in index(out)["points"]:
        ran = json.loads((out / p["dir"] / "config.json").read_text())["engine"]
        assert {k: ran[k] for k, v in target["engine"].items() if v is not None} == {
            k: v for k, v in target["engine"].items() if v is not None}, p["dir"]
    # without an engine axis nothing is varied
    r = sweep(["-c", "8", "--max-num-seqs", "2", "--input-tokens", "256", "--output-tokens", "16", "-n", "16",
               "-o", str(tmp_path / "one")])
    assert r.exit_code == 0, r.output
    target = index(tmp_path / "one")["target"]
    assert target["varied"] == [] and target["engine"]["max_num_seqs"] == 2
    # a quantization axis: neither it nor the name it was given by (the first value's) is
    # the target's, and each point records the name it ran by, marlin beside the AWQ it runs
    q = tmp_path / "q"
    r = sweep(["--model", "Qwen/Qwen2.5-7B-Instruct-AWQ", "-q", "awq_marlin,marlin", "-c", "2", "--input-tokens", "50",
               "--output-tokens", "4", "-n", "4", "-o", str(q)])
    assert r.exit_code == 0, r.output
    target = index(q)["target"]
    assert target["varied"] == ["quantization"]
    assert "quantization" not in target["engine"] and "quantization_name" not in target["engine"]
    ran = [json.loads((q / p["dir"] / "config.json").read_text())["engine"] for p in index(q)["points"]]
    assert [(e["quantization"], e["quantization_name"]) for e in ran] == [("awq", "awq_marlin"), ("awq", "marlin")]


def test_goodput_search_returns_a_rate_that_meets_the_slos_and_ten_percent_more_that_does_not(tmp_path: Path) -> None:
    out = tmp_path / "g"
    r = sweep(["--find-max-rate", "--slo-ttft-ms", "200", "--slo-tpot-ms", "15", "--input-tokens", "512",
               "--output-tokens", "64", "-o", str(out)])
    assert r.exit_code == 0, r.output
    (found,) = index(out)["goodput_search"]["groups"]
    rate, above = found["max_rate"], found["fails_at"]
    assert rate is not None and above == pytest.approx(1.1 * rate)
    assert len(found["probes"]) >= 3 and all((out / p["dir"] / "summary.json").exists() for p in found["probes"])
    # the table says of each probe what share met the SLOs, and whether that was enough
    # (its status is "done" either way)
    for p in found["probes"]:
        assert f"{p['share'] * 100:.0f} % {'yes' if p['meets'] else 'no'}" in r.output
    # checked apart from the search: the same run at each rate, share of requests within both SLOs
    slo = SLO(ttft_ms=200, tpot_ms=15)

    def share(rps: float) -> float:
        n = max(32, int(10 * rps + 0.999))  # the sweep's default: ten seconds of arrivals
        res = asyncio.run(run(RunConfig(LoadConfig(OpenLoop(rps), n), WorkloadConfig(512, 64), "completions", slo), SimTarget()))
        got = slo_share(res.records, slo)
        assert got is not None
        return got

    assert share(rate) >= 0.9 > share(rate * 1.1)
    assert "max rate meeting the SLOs" in r.output


def test_repeats_give_each_headline_metric_an_interval_around_its_runs(tmp_path: Path) -> None:
    out = tmp_path / "r"
    r = sweep(["-r", "4,8", "--repeats", "3", "--no-saturation-stop", "--input-tokens", "256", "--output-tokens", "32",
               "-n", "40", "-o", str(out)])
    assert r.exit_code == 0, r.output
    ix = index(out)
    assert [p["repeat"] for p in ix["points"]] == [0, 1, 2, 0, 1, 2]
    # (no stop was looked for: not "did not saturate", which would say one was)
    assert "saturation not looked for (--no-saturation-stop)" in r.output and "did not saturate" not in r.output
    seeds = {json.loads((out / p["dir"] / "config.json").read_text())["load"]["seed"] for p in ix["points"][:3]}
    assert seeds == {0, 1, 2}  # repeats draw anew
    for agg in ix["aggregates"]:
        runs = [p["headline"]["ttft_p50_ms"] for p in ix["points"] if p["dir"] in agg["dirs"]]
        ci = agg["headline"]["ttft_p50_ms"]
        assert ci["n"] == 3 and ci["ci95_low"] < ci["mean"] < ci["ci95_high"]
        assert min(runs) < ci["mean"] < max(runs)
    assert "±" in r.output


class _StopAfter:
    """A listener that sets ``stop`` after ``records`` requests of the third point."""

    def __init__(self, stop: asyncio.Event, records: int) -> None:
        self.stop, self.records, self.points, self.seen = stop, records, 0, 0

    def point_started(self, entry: dict[str, Any], number: int) -> None:
        self.points = number

    def record(self, r: RequestRecord) -> None:
        if self.points == 3:
            self.seen += 1
            if self.seen == self.records:
                self.stop.set()

    def point_done(self, entry: dict[str, Any]) -> None:
        pass

    def group_done(self, group: dict[str, Any]) -> None:
        pass


def test_a_sweep_stopped_mid_point_keeps_finished_points_and_a_valid_index(tmp_path: Path) -> None:
    out = tmp_path / "x"
    config = SweepConfig(
        RunConfig(LoadConfig(ClosedLoop(1), 400), WorkloadConfig(128, 64), "completions"), SimTarget(),
        Grid("concurrency", (1, 2, 4, 8, 16)), str(out), saturation=None, auto_requests=False,
    )

    async def go() -> Any:
        stop = asyncio.Event()
        return await run_sweep(config, listener=_StopAfter(stop, 5), stop=stop)

    result = asyncio.run(go())
    assert result.interrupted
    ix = index(out)
    assert ix == result.index and ix["complete"] is False
    assert [p["status"] for p in ix["points"]] == ["done", "done", "stopped", "skipped", "skipped"]
    for p in ix["points"][:2]:
        s = json.loads((out / p["dir"] / "summary.json").read_text())
        assert s["interrupted"] is False and s["counts"]["completed"] == 400
    cut = json.loads((out / ix["points"][2]["dir"] / "summary.json").read_text())
    assert cut["interrupted"] is True and 5 <= cut["counts"]["completed"] < 400


def test_ctrl_c_mid_sweep_exits_130_with_the_index_valid(tmp_path: Path) -> None:
    out = tmp_path / "c"
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferlab", "sweep", "-c", "1,2,4,8,16,32,64", "--no-saturation-stop", "-n", "1000",
         "--input-tokens", "128", "--output-tokens", "64", "-o", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 120  # bounded wait for the first finished point
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / "sweep.json").exists() and index(out)["points"]:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    ix = index(out)
    assert ix["complete"] is False
    statuses = [p["status"] for p in ix["points"]]
    assert statuses[0] == "done" and "skipped" in statuses and len(statuses) == 7
    for p in ix["points"]:
        if p["status"] in ("done", "stopped"):  # (a point stopped as it began may have none done)
            s = json.loads((out / p["dir"] / "summary.json").read_text())
            assert s["interrupted"] is (p["status"] == "stopped")
            assert (s["counts"]["completed"] == 1000) is (p["status"] == "done")


def test_a_sweep_does_not_replace_another(tmp_path: Path) -> None:
    out = tmp_path / "d"
    assert sweep(["-c", "1", "-n", "2", "-o", str(out)]).exit_code == 0
    r = sweep(["-c", "1", "-n", "2", "-o", str(out)])
    assert r.exit_code == 2 and "holds a sweep already" in r.output


def test_a_folder_that_cannot_be_made_is_a_usage_error(tmp_path: Path) -> None:
    """--out under a file was an "internal error" (NotADirectoryError), for sweep and
    tune alike; bench and profile said it in one line."""
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    r = sweep(["-c", "1", "-n", "2", "-o", str(a_file / "sub")])
    assert r.exit_code == 2 and "cannot make that folder" in r.output, r.output
    r = CliRunner().invoke(main, ["tune", "--param", "max-num-seqs=8,16", "-c", "2", "-n", "4", "--slo-ttft-ms", "100",
                                  "-o", str(a_file / "sub")])
    assert r.exit_code == 2 and "cannot make that folder" in r.output, r.output


def test_a_point_of_more_users_than_requests_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """A closed loop of 32 users sending 16 requests runs 16 at once: such a point would
    repeat the one below it under another label (and end the sweep at a false knee)."""
    r = sweep(["-c", "1,8,32", "-n", "16", "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and "-n 16 sends fewer requests than the closed loop's 32 users" in r.output, r.output
    assert not (tmp_path / "x").exists()
    assert sweep(["-c", "1,8,32", "-n", "16", "--warmup", "16", "--output-tokens", "8", "-o", str(tmp_path / "y")]).exit_code == 0


@pytest.mark.parametrize("flags,needle", [(["--gpu", "H100,NOPE"], "unknown GPU 'NOPE'"),
                                          (["--input-tokens", "128,lots"], "--input-tokens 'lots'"),
                                          (["-c", "4,2"], "ascending"),
                                          (["-c", "4,0", "--no-saturation-stop"], "--concurrency values must be at least 1, not 0"),
                                          (["-c", "1,0,4"], "--concurrency values must be at least 1, not 0"),
                                          (["--trace", "x.jsonl"], "--trace"),
                                          (["--no-saturation-stop", "--saturation-gain", "0.1"], "turns off"),
                                          (["--find-max-rate", "--slo-ttft-ms", "100", "--ttft-growth", "3"], "not to --find-max-rate"),
                                          (["--find-max-rate"], "needs an SLO"),
                                          (["--slo-share", "0.5"], "needs --find-max-rate")])
def test_settings_no_point_can_run_with_fail_before_anything_runs(tmp_path: Path, flags: list[str], needle: str) -> None:
    r = sweep([*flags, "-n", "256", "-o", str(tmp_path / "x")])  # (a request per user of the default axis)
    assert r.exit_code == 2 and needle in r.output, r.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("flags", [["--rate", "8", "--max-num-batched-tokens", "512"],
                                   ["-c", "1,2", "--model", "Mixtral-8x7B"],
                                   ["-c", "1", "--model", "Mixtral-8x7B", "--input-tokens", "64,128"]])
def test_fixed_engine_flags_no_point_can_run_with_are_refused_as_sim_run_refuses_them(
    tmp_path: Path, flags: list[str]
) -> None:
    """Not a sweep of failed points that exits 0: exit 2 before anything runs, with the
    one-line reason sim run gives for the same flags."""
    single = [f.split(",")[0] for f in flags]
    sim = CliRunner().invoke(main, ["sim", "run", *single, "-n", "20"])
    assert sim.exit_code == 2
    (reason,) = sim.stderr.strip().splitlines()
    r = CliRunner().invoke(main, ["sweep", *flags, "-n", "20", "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [reason]
    assert not (tmp_path / "x").exists()


def test_a_sweep_whose_every_engine_setting_cannot_run_is_refused_naming_one(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["sweep", "-c", "1", "-n", "4", "--model", "Mixtral-8x7B",
                                  "--gpu-memory-utilization", "0.5,0.6", "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and not (tmp_path / "x").exists()
    (line,) = r.stderr.strip().splitlines()
    assert "no engine setting of the sweep can run; with --gpu-memory-utilization 0.5: Mixtral-8x7B weights need" in line


def test_no_exact_output_lets_every_simulated_point_stop_at_the_models_end(tmp_path: Path) -> None:
    out = tmp_path / "free"
    r = sweep(["-c", "2,4", "-n", "8", "--input-tokens", "100", "--output-tokens", "300", "--no-exact-output",
               "--no-saturation-stop", "-o", str(out)])
    assert r.exit_code == 0, r.output
    for p in index(out)["points"]:
        summary = json.loads((out / p["dir"] / "summary.json").read_text())
        assert summary["config"]["workload"]["exact_output"] is False
        assert summary["counts"]["completed"] == 8 and summary["output_tokens"] < 8 * 300


def test_an_engine_that_cannot_hold_the_model_fails_its_group_and_the_others_go_on(tmp_path: Path) -> None:
    out = tmp_path / "tp"
    r = sweep(["--model", "Llama-3.1-70B", "-tp", "1,4", "-c", "1,2", "-n", "4", "-o", str(out)])
    assert r.exit_code == 0, r.output
    ix = index(out)
    by = {(p["params"]["tensor_parallel_size"], p["params"]["concurrency"]): p for p in ix["points"]}
    assert by[1, 1]["status"] == "failed" and by[1, 1]["dir"] is None and "weights need" in by[1, 1]["reason"]
    assert by[1, 2]["status"] == "skipped"
    assert by[4, 1]["status"] == by[4, 2]["status"] == "done"
    assert by[4, 1]["headline"]["output_tok_s_per_gpu"] == pytest.approx(by[4, 1]["headline"]["output_tok_s"] / 4)
    assert ix["groups"][0]["stopped"]["rule"] == "failed" and ix["complete"] is True


def test_each_finished_run_and_the_sweep_reach_the_history_and_rows_show_as_points_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inferlab.results.history import History

    hist = tmp_path / "history.sqlite"
    monkeypatch.setenv("INFERLAB_HISTORY", str(hist))
    out = tmp_path / "h"
    r = sweep(["-c", "1,2,4", "-n", "4", "--no-saturation-stop", "-o", str(out)])
    assert r.exit_code == 0, r.output
    dirs = [str((out / p["dir"]).resolve()) for p in index(out)["points"]]
    with History(hist) as h:
        rows_in_history = list(reversed(h.find()))  # oldest first
    assert [(e.kind, e.path) for e in rows_in_history] == [*(("run", d) for d in dirs), ("sweep", str(out.resolve()))]
    rows = [line.strip() for line in r.output.splitlines() if line.startswith("  c=")]
    assert [row.split()[0] for row in rows] == ["c=1", "c=2", "c=4"] and all("done" in row for row in rows)
    # a prediction, said on the start line and on each point's, as in the table's title
    assert all(" prediction: " in row and not row.endswith("(prediction)") for row in rows)  # (bands say it once)
    assert "in virtual time (prediction) →" in r.output


def test_each_simulated_point_carries_the_error_bands_of_its_family_and_load_regime(tmp_path: Path) -> None:
    """The regime follows each point's load (arrivals at a rate: Poisson; --rate inf:
    offline, no API server; users: closed loop), the family its engine; each headline
    metric's band is the one validation holds for them, the same one the point's own
    summary.json shows, and the console and the report name it."""
    from inferlab.report.html import sweep_section
    from inferlab.results.sources import load_sweep
    from inferlab.sim.engine.bands import HEADLINE_METRICS, error_band

    rates, users = tmp_path / "rates", tmp_path / "users"
    r = sweep(["--rate", "4,inf", "--no-saturation-stop", "-n", "12", "--input-tokens", "256", "--output-tokens", "16",
               "-o", str(rates)])
    assert r.exit_code == 0, r.output
    r2 = sweep(["-c", "2", "-n", "8", "--engine-family", "sglang", "--input-tokens", "256", "--output-tokens", "16",
                "-o", str(users)])
    assert r2.exit_code == 0, r2.output
    expected = {(rates, 4.0): ("vllm", "Poisson"), (rates, "inf"): ("vllm", "offline"), (users, 2): ("sglang", "closed loop")}
    for (where, load), (family, regime) in expected.items():
        point = next(p for p in index(where)["points"] if str(p["params"].get("rate", p["params"].get("concurrency"))) == str(load))
        pred = point["prediction"]
        assert (pred["engine_family"], pred["regime"]) == (family, regime), point["params"]
        assert set(pred["error_bands"]) == set(HEADLINE_METRICS) and set(HEADLINE_METRICS) <= set(point["headline"])
        for key, (cls, stat) in HEADLINE_METRICS.items():
            band = error_band(family, regime, cls, stat=stat)
            assert pred["error_bands"][key] == (None if band is None else band.to_json()), key
        own = json.loads((where / point["dir"] / "summary.json").read_text())["prediction"]
        assert pred["error_bands"]["ttft_p50_ms"] == own["error_bands"]["ttft_ms"]
        assert pred["error_bands"]["output_tok_s"] == own["error_bands"]["output_token_throughput_tps"]
        # the console: the row's point line, and the band in full under the table
        out = r.output if where == rates else r2.output
        ttft, ttft99 = pred["error_bands"]["ttft_p50_ms"], pred["error_bands"]["ttft_p99_ms"]
        if ttft == ttft99:
            assert f"TTFT {ttft['text']}" in out
        else:  # validation measured the two statistics apart: each its own band
            assert f"TTFT p50 {ttft['text']}" in out and f"TTFT p99 {ttft99['text']}" in out
        if (where, load) == (rates, 4.0):  # vLLM V1's held-out Poisson rows report both
            assert (ttft["stat"], ttft99["stat"]) == ("median", "p99") and ttft["pct"] != ttft99["pct"]
        assert f"{family}, {regime}" in out
        html = sweep_section(load_sweep(where))
        assert "(prediction)</h2>" in html and escape(ttft["text"]) in html
    assert "prediction (simulated, virtual time)" in r.output and "error bands (every number above is a prediction" in r.output
    # a measured sweep (sweep.json as --url leaves it) shows none
    measured = json.loads((users / "sweep.json").read_text())
    # (the command as a sweep against a URL records it: under CliRunner it is pytest's own
    # command line, which names test files such as test_prediction_labels.py)
    measured.update(prediction=False, target={"kind": "server", "virtual_time": False, "url": "http://x", "model": None},
                    command="inferlab sweep --url http://x")
    for p in measured["points"]:
        p["prediction"] = None
        if p["dir"]:  # (and its runs' config.json as a run against that server leaves it)
            config = json.loads((users / p["dir"] / "config.json").read_text())
            config = {k: v for k, v in config.items() if k not in ("command", "engine")}
            config.update(url="http://x", resolved={"url": "http://x/v1", "model": "m", "engine": None})
            (users / p["dir"] / "config.json").write_text(json.dumps(config))
    (users / "sweep.json").write_text(json.dumps(measured))
    html = sweep_section(load_sweep(users))
    assert "prediction" not in html and "±" not in html


def test_repeats_that_cannot_differ_say_their_interval_is_no_measure_of_noise(tmp_path: Path) -> None:
    """Three repeats of a closed loop of fixed lengths in virtual time are one run three
    times (seeds 0, 1, 2 draw nothing): "264 ± 0" read as a precise measurement. The
    table now says so below it; repeats that draw their lengths differ and say nothing."""
    fixed = sweep(["-c", "2", "-n", "12", "--repeats", "3", "--input-tokens", "300", "--output-tokens", "16",
                   "-o", str(tmp_path / "fixed")])
    assert fixed.exit_code == 0, fixed.output
    assert "repeats identical (c=2)" in " ".join(fixed.output.split())
    drawn = sweep(["-c", "2", "-n", "12", "--repeats", "3", "--input-tokens", "uniform:200:400", "--output-tokens", "16",
                   "-o", str(tmp_path / "drawn")])
    assert drawn.exit_code == 0 and "repeats identical" not in drawn.output
