"""At home for ``vllm bench serve`` users: its flag names run the same load as ours, the
flags with no faithful meaning are refused with a pointer, ``--metric-percentiles``
chooses the table's and summary.json's percentiles, ``--save-result`` and
``inferlab export`` write vLLM's result file, which vLLM-result readers (our own
``--trace`` reader) read back, and CSV. Virtual time: fast and exact."""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from inferlab.cli.common import expand_goodput
from inferlab.cli.main import main
from inferlab.results.export import CSV_BAND_COLUMNS
from inferlab.results.runfiles import read_records, read_summary
from inferlab.workload.traces import read_rows


def invoke(*args: str) -> tuple[int, str, str]:
    """Exit code, stdout and the last line of stderr (the one-line error)."""
    res = CliRunner().invoke(main, expand_goodput(list(args)))
    err = res.stderr.strip().splitlines()
    return res.exit_code, res.stdout, err[-1] if err else ""


def summary_of(*args: str) -> dict[str, Any]:
    code, out, err = invoke("sim", "run", "--json", *args)
    assert code == 0, err
    return dict(json.loads(out))


def test_vllm_flag_names_run_the_same_load_as_ours() -> None:
    ours = summary_of("--rate", "8", "-n", "12", "--input-tokens", "64", "--output-tokens", "6", "--warmup", "2",
                      "--slo-ttft-ms", "500", "--slo-tpot-ms", "50", "--slo-e2e-ms", "900")
    vllm = summary_of("--request-rate", "8", "--num-prompts", "12", "--random-input-len", "64", "--random-output-len", "6",
                      "--num-warmups", "2", "--ignore-eos", "--goodput", "ttft:500", "tpot:50", "e2el:900")
    assert vllm == ours
    general = summary_of("--request-rate", "8", "--num-prompts", "12", "--input-len", "64", "--output-len", "6",
                         "--num-warmups", "2", "--goodput", "ttft:500,tpot:50", "--goodput", "e2el:900")
    assert general == ours
    assert ours["slo"] == {"ttft_ms": 500.0, "tpot_ms": 50.0, "e2e_ms": 900.0}
    assert ours["config"]["workload"]["exact_output"] is True  # --ignore-eos is the default
    assert summary_of("-n", "2", "--no-exact-output")["config"]["workload"]["exact_output"] is False


def test_vllms_async_scheduling_flag_is_overlap_scheduling_and_on_by_default_for_vllm() -> None:
    """vLLM's --async-scheduling (on by default from 0.14) is the simulator's overlap
    scheduling: the default vllm run has it, --no-async-scheduling turns it off as
    --no-overlap-schedule does, and an arrival during a step then no longer waits a step."""
    load = ("--rate", "20", "-n", "40", "--input-tokens", "400", "--output-tokens", "40", "--seed", "3")
    default = summary_of(*load)
    assert default["config"]["engine"]["overlap_schedule"] is True
    assert summary_of(*load, "--async-scheduling")["ttft_ms"] == default["ttft_ms"]
    off = summary_of(*load, "--no-async-scheduling")
    assert off["config"]["engine"]["overlap_schedule"] is False
    assert off["ttft_ms"] == summary_of(*load, "--no-overlap-schedule")["ttft_ms"]
    assert off["ttft_ms"]["p50"] < default["ttft_ms"]["p50"]
    generic = summary_of(*load, "--engine-family", "generic")  # vLLM's own, not another engine's
    assert generic["config"]["engine"]["overlap_schedule"] is False


def test_an_engine_version_runs_that_releases_defaults_and_says_so() -> None:
    """--engine-version 0.13: vLLM before async scheduling, recorded and named on the
    engine line; a release the rules cannot follow exits 2 with one line."""
    load = ("--rate", "20", "-n", "40", "--input-tokens", "400", "--output-tokens", "40", "--seed", "3")
    old = summary_of(*load, "--engine-version", "0.13")
    assert old["config"]["engine"]["engine_version"] == "0.13"
    assert old["config"]["engine"]["overlap_schedule"] is False
    assert old["config"]["engine"]["scheduler_reserve_full_isl"] is False
    assert old["ttft_ms"] == summary_of(*load, "--no-async-scheduling", "--no-scheduler-reserve-full-isl",
                                        "--no-evict-unhashed-first")["ttft_ms"]
    code, out, _ = invoke("sim", "run", *load, "--engine-version", "0.15")
    assert code == 0 and "release 0.15" in " ".join(out.split())
    code, _, err = invoke("sim", "run", *load, "--engine-version", "0.6")
    assert code == 2 and "vllm-v0" in err


def test_a_replay_given_another_release_or_family_takes_its_switches_from_it(tmp_path: Path) -> None:
    """Replaying a run (--trace requests.jsonl) takes its engine as it ran, but a release
    given takes the release-dated switches from that release, and another family its own."""
    base = ("-n", "12", "--rate", "20", "--input-tokens", "200", "--output-tokens", "8")
    code, _, err = invoke("sim", "run", *base, "--engine-version", "0.13", "-o", str(tmp_path / "old"))
    assert code == 0, err
    trace = str(tmp_path / "old" / "requests.jsonl")

    def engine(*args: str) -> dict[str, Any]:
        code, out, err = invoke("sim", "run", "--trace", trace, "--json", *args)
        assert code == 0, err
        return dict(json.loads(out)["config"]["engine"])

    switches = ("engine_version", "overlap_schedule", "scheduler_reserve_full_isl", "evict_unhashed_first")
    assert [engine()[k] for k in switches] == ["0.13", False, False, False]  # as it ran
    assert [engine("--engine-version", "0.24")[k] for k in switches] == ["0.24", True, True, True]
    assert [engine("--engine-version", "0.19")[k] for k in switches] == ["0.19", True, True, False]
    trt = engine("--engine-family", "trtllm")  # not vLLM's release, nor its switches
    assert trt["engine_version"] is None and trt["overlap_schedule"] is False and trt["mixed_batches"] is True


def test_no_exact_output_is_simulated_and_recorded_as_it_ran(tmp_path: Path) -> None:
    args = ("-n", "12", "-c", "4", "--input-tokens", "100", "--output-tokens", "300")
    exact = summary_of(*args)
    assert exact["output_tokens"] == 12 * 300 and exact["config"]["workload"]["exact_output"] is True
    code, _, err = invoke("sim", "run", *args, "--no-exact-output", "-o", str(tmp_path / "run"))
    assert code == 0, err
    free = read_summary(tmp_path / "run" / "summary.json")
    records = list(read_records(tmp_path / "run" / "requests.jsonl"))
    assert free.config["workload"]["exact_output"] is False
    # the simulated model stopped on its own before max_tokens (finish reason stop), as
    # sim serve's does; the summary counts what was generated and does not warn of it
    assert free.output_tokens == sum(r.output_tokens or 0 for r in records) < 12 * 300
    assert {r.finish_reason for r in records if (r.output_tokens or 0) < 300} == {"stop"}
    assert not any("did not generate exactly" in w for w in free.warnings)


def test_goodput_words_after_one_flag_are_taken_as_vllm_takes_them() -> None:
    assert expand_goodput(["--goodput", "ttft:500", "tpot:50", "e2el:1e3", "-n", "3", "x:1"]) == [
        "--goodput", "ttft:500", "--goodput", "tpot:50", "--goodput", "e2el:1e3", "-n", "3", "x:1"]
    assert expand_goodput(["--prompt", "a:1", "b:2"]) == ["--prompt", "a:1", "b:2"]


def test_the_console_script_takes_vllms_goodput_form() -> None:
    cmd = [sys.executable, "-m", "inferlab", "sim", "run", "-n", "3", "--input-tokens", "20", "--output-tokens", "3",
           "--json", "--goodput", "ttft:5000", "tpot:100"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["slo"] == {"ttft_ms": 5000.0, "tpot_ms": 100.0, "e2e_ms": None}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--goodput", "itl:5"], "KEY one of ttft, tpot, e2el"),
        (["--goodput", "ttft:0"], "positive number of ms"),
        (["--goodput", "ttft:5", "--slo-ttft-ms", "5"], "given twice"),
        (["--metric-percentiles", "50,101"], "from 0 to 100"),
        (["--save-detailed"], "--save-detailed needs --save-result"),
        (["--result-dir", "x"], "--result-dir needs --save-result"),
        (["--dataset-name", "sharegpt"], "--dataset FILE"),
        (["--random-range-ratio", "0.5"], "uniform:LO:HI"),
        (["--random-range-ratio", "0"], "sglang.bench_serving from len x ratio to len"),
        (["--random-prefix-len", "100"], "--prefix-tokens"),
        (["--percentile-metrics", "ttft"], "--metric-percentiles"),
        (["--append-result"], "--result-filename"),
        # (an empty name fell back to vLLM's default file name)
        (["--save-result", "--result-filename", ""], "--result-filename is empty"),
        (["--save-result", "--result-filename", "  "], "--result-filename is empty"),
        (["--backend", "openai-chat"], "--api chat"),
        (["--endpoint", "/v1/completions"], "--api completions"),
        (["--temperature", "0"], "sim run's simulated model does not sample"),
        (["--extra-body", "{}"], "sim run sends no request bodies"),
    ],
)
def test_vllm_flags_without_a_faithful_meaning_are_refused_with_a_pointer(args: list[str], needle: str) -> None:
    code, _, err = invoke("sim", "run", "-n", "2", *args)
    assert code == 2 and needle in err, err


def test_chosen_percentiles_in_the_table_and_in_summary_json(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, stdout, err = invoke("sim", "run", "-n", "40", "--rate", "20", "--input-tokens", "100", "--output-tokens", "8",
                               "--metric-percentiles", "50,90,99,99.9", "--out", str(out))
    assert code == 0, err
    header = next(line for line in stdout.splitlines() if "metric" in line)
    assert [c for c in header.replace("┃", " ").split()] == ["metric", "unit", "mean", "p50", "p90", "p99", "p99.9", "max"]
    s = json.loads((out / "summary.json").read_text())
    for key in ("ttfb_ms", "ttft_ms", "e2e_ms", "tpot_ms", "itl_ms", "decode_tps", "queue_delay_ms"):
        assert list(s[key]) == ["mean", "std", "min", "p50", "p90", "p95", "p99", "max", "p99_9"], key
    assert read_summary(out / "summary.json").ttft_ms.percentile(99.9) == s["ttft_ms"]["p99_9"]  # type: ignore[union-attr]
    plain = summary_of("-n", "40", "--rate", "20", "--input-tokens", "100", "--output-tokens", "8")
    assert "p99_9" not in plain["ttft_ms"]


def test_save_result_writes_vllms_file_named_as_vllm_names_it(tmp_path: Path) -> None:
    code, _, err = invoke("sim", "run", "--request-rate", "10", "--max-concurrency", "4", "--num-prompts", "6",
                          "--random-input-len", "50", "--random-output-len", "4", "--save-result", "--result-dir", str(tmp_path))
    assert code == 0, err
    (path,) = tmp_path.glob("*.json")
    assert path.name.startswith("openai-10.0qps-concurrency4-Qwen2.5-7B-Instruct-") and err == f"inferlab: vLLM result: {path}"
    r = json.loads(path.read_text())
    assert (r["num_prompts"], r["completed"], r["request_rate"], r["max_concurrency"]) == (6, 6, 10.0, 4)
    assert "ttfts" not in r and "p99_ttft_ms" in r  # --save-detailed adds the lists
    assert r["inferlab_source"].startswith("inferlab sim run (simulated")
    named = tmp_path / "mine.json"
    args = ("sim", "run", "-n", "3", "--save-result", "--save-detailed", "--result-dir", str(tmp_path), "--result-filename", "mine.json")
    assert invoke(*args)[0] == 0
    assert len(json.loads(named.read_text())["ttfts"]) == 3
    code, _, err = invoke(*args)  # not replaced without --overwrite
    assert code == 2 and "already exists" in err
    assert invoke(*args, "--overwrite")[0] == 0


def test_a_result_file_that_cannot_be_written_is_refused_before_the_run(tmp_path: Path) -> None:
    """--save-result found out at the end that it could not write (--result-dir under a
    file, --result-filename a folder or in a folder that is not there) and exited 2
    with nothing printed or recorded: the whole run lost. Refused before it now."""
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    (tmp_path / "a_folder").mkdir()
    for extra, needle in (
        (["--result-dir", str(a_file)], "is a file"),
        (["--result-dir", str(a_file / "sub")], "cannot write there"),
        (["--result-dir", str(tmp_path), "--result-filename", "a_folder", "--overwrite"], "is a folder"),
        (["--result-dir", str(tmp_path), "--result-filename", "nowhere/r.json"], "no folder"),
    ):
        code, out, err = invoke("sim", "run", "-n", "3", "--no-history", "--save-result", *extra)
        assert (code, out) == (2, ""), (extra, err)
        assert needle in err, (extra, err)
    # a folder not there yet is made (as vLLM makes it)
    assert invoke("sim", "run", "-n", "3", "--no-history", "--save-result", "--result-dir", str(tmp_path / "new" / "deeper"))[0] == 0
    assert len(list((tmp_path / "new" / "deeper").glob("*.json"))) == 1


def test_a_result_file_that_fails_at_the_end_keeps_the_run(tmp_path: Path) -> None:
    """Where writing fails after the run all the same (the folder taken by a file in the
    meantime), the run is shown and recorded in the history, and the exit status is 1."""
    from inferlab.cli.common import finish_run
    from inferlab.load.run import RunResult
    from inferlab.results.history import History

    code, _, _ = invoke("sim", "run", "-n", "3", "--json", "--no-history", "-o", str(tmp_path / "run"))
    assert code == 0
    result = RunResult(read_summary(tmp_path / "run" / "summary.json"), read_records(tmp_path / "run" / "requests.jsonl"), False)
    taken = tmp_path / "taken"
    taken.write_text("x")
    history = tmp_path / "h.sqlite"
    after = finish_run(result, {"save_result": True, "result_dir": str(taken), "history": str(history)})
    assert after.cause is not None and "cannot write the vLLM result" in str(after.cause)
    with History(history) as h:
        assert h.get(1) is not None  # recorded all the same


def test_a_vllm_export_replays_as_the_run_it_came_from(tmp_path: Path) -> None:
    """What a script reading vllm bench serve --save-result files sees, checked with our
    own reader of such files: the export of a run replays in the simulator at the same
    send times and lengths, and predicts exactly what the run measured."""
    run = tmp_path / "run"
    code, _, err = invoke("sim", "run", "--rate", "10", "-n", "30", "--input-tokens", "uniform:100:900",
                          "--output-tokens", "uniform:5:60", "--out", str(run))
    assert code == 0, err
    export = tmp_path / "vllm.json"
    code, _, err = invoke("export", str(run), "--format", "vllm", "-o", str(export))
    assert code == 0, err
    records = sorted(read_records(run / "requests.jsonl"), key=lambda r: r.index)
    rows = read_rows(str(export))
    assert [(r.input_tokens, r.output_tokens) for r in rows] == [(r.input_tokens, r.output_tokens) for r in records]
    assert [r.arrival_s for r in rows] == pytest.approx([(r.send_ns or 0) / 1e9 for r in records])
    replay = summary_of("--trace", str(export))
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
        c = replay["trace_comparison"][metric]
        assert c["requests"] == 30 and abs(c["error_pct"]) < 0.01, (metric, c)


def test_a_vllm_result_replay_says_the_engine_flags_are_the_simulators_defaults(tmp_path: Path) -> None:
    """A vLLM result records no server flags: the replay says what it assumed (a server run
    with --enforce-eager replayed 23 % faster on TPOT without a word), and that a result
    of inferlab's simulated server is itself a prediction."""
    code, _, err = invoke("sim", "run", "-n", "4", "--input-tokens", "50", "--output-tokens", "4", "--save-result",
                          "--save-detailed", "--result-dir", str(tmp_path), "--result-filename", "r.json")
    assert code == 0, err
    res = CliRunner().invoke(main, ["sim", "run", "--trace", str(tmp_path / "r.json")])
    assert res.exit_code == 0 and "a vLLM result records no server flags" in res.stderr, res.stderr
    assert "the result is itself a prediction" in res.stderr
    res = CliRunner().invoke(main, ["sim", "run", "--trace", str(tmp_path / "r.json"), "--enforce-eager"])
    assert res.exit_code == 0 and "records no server flags" not in res.stderr  # (a flag given: the user chose)


def test_export_csv_formats_and_errors(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert invoke("sim", "run", "-n", "5", "--input-tokens", "50", "--output-tokens", "3", "--out", str(run),
                  "--metric-percentiles", "99.9")[0] == 0
    code, out, _ = invoke("export", str(run), "--format", "csv-summary")
    rows = {r["metric"]: r for r in csv.DictReader(io.StringIO(out))}
    assert code == 0 and rows["counts.completed"]["value"] == "5" and rows["ttft_ms"]["p99_9"] != ""
    # a prediction says so on every row, as the vllm format's inferlab_source does
    simulated = "inferlab sim run (simulated in virtual time, not measured)"
    assert {r["inferlab_source"] for r in rows.values()} == {simulated}
    code, out, _ = invoke("export", str(run), "--format", "csv-requests")
    requests = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and len(requests) == 5 and {r["inferlab_source"] for r in requests} == {simulated}
    code, _, err = invoke("export", str(tmp_path), "--format", "vllm")
    assert code == 2 and "neither summary.json nor requests.jsonl" in err
    # a run killed before its summary (or a gateway's access log): computed from its records
    cut = tmp_path / "cut"
    assert invoke("sim", "run", "-n", "6", "--warmup", "2", "--input-tokens", "50", "--output-tokens", "3",
                  "--out", str(cut))[0] == 0
    whole = invoke("export", str(cut), "--format", "csv-summary")[1]
    (cut / "summary.json").unlink()
    code, out, err = invoke("export", str(cut), "--format", "csv-summary")
    assert code == 0 and "computed from its requests.jsonl; its error bands, which sim run wrote there, are not exported" in err
    bands = len(CSV_BAND_COLUMNS)  # (computed from the records, the summary has no prediction block)
    assert [row[:-bands] for row in csv.reader(io.StringIO(out))] == [row[:-bands] for row in csv.reader(io.StringIO(whole))]
    assert {tuple(row[-bands:]) for row in list(csv.reader(io.StringIO(out)))[1:]} == {("",) * bands}
    code, out, _ = invoke("export", str(cut), "--format", "vllm")
    assert code == 0 and json.loads(out)["completed"] == 6
    code, _, err = invoke("export", str(run), "--format", "csv-summary", "--no-detailed")
    assert code == 2 and "--format vllm only" in err
    # (each error names the flag given and the format asked for: it named csv-summary for all)
    code, _, err = invoke("export", str(run), "--format", "csv-requests", "--no-detailed")
    assert code == 2 and err.startswith("inferlab: error: --no-detailed shapes --format vllm only (--format csv-requests"), err
    code, _, err = invoke("export", str(run), "--format", "csv-requests", "--metric-percentiles", "50")
    assert code == 2 and "--metric-percentiles shapes --format vllm only (--format csv-requests" in err, err


def test_export_refuses_records_and_summaries_that_are_not_one_runs(tmp_path: Path) -> None:
    """An emptied requests.jsonl exported as a vLLM result of 0 completed requests and
    TTFT 0.0 beside a summary of 5; values edited into summary.json ("fast", NaN) were
    copied into the CSV. Each is refused, naming the file."""
    run = tmp_path / "run"
    assert invoke("sim", "run", "-n", "5", "--input-tokens", "50", "--output-tokens", "3", "--out", str(run))[0] == 0
    (run / "requests.jsonl").write_text("")
    for fmt in ("vllm", "csv-requests"):
        code, out, err = invoke("export", str(run), "--format", fmt)
        assert (code, out) == (2, "") and "requests.jsonl holds 0 measured requests where summary.json counts 5" in err
    whole = json.loads((run / "summary.json").read_text())
    for key, value, needle in (("output_token_throughput_tps", "fast", "'fast' is not a number"),
                               ("duration_s", float("nan"), "nan is not a number"),
                               ("ttft_ms", {**whole["ttft_ms"], "p99": float("nan")}, "holds NaN")):
        (run / "summary.json").write_text(json.dumps({**whole, key: value}))
        code, out, err = invoke("export", str(run), "--format", "csv-summary")
        assert (code, out) == (2, "") and "not an inferlab summary" in err and needle in err, err


def test_burstiness_inf_is_constant_gaps_as_in_vllm() -> None:
    s = summary_of("--rate", "5", "--burstiness", "inf", "-n", "4", "--input-tokens", "10", "--output-tokens", "2")
    assert s["config"]["load"]["schedule"]["arrival"] == "constant"  # was a crash in random.gammavariate
    code, _, err = invoke("sim", "run", "-n", "2", "--burstiness", "inf")
    assert code == 2 and "give --rate too" in err


def test_a_vllm_result_replayed_on_another_model_says_it_is_a_what_if(tmp_path: Path) -> None:
    code, _, err = invoke("sim", "run", "-n", "4", "--input-tokens", "50", "--output-tokens", "4", "--save-result",
                          "--save-detailed", "--result-dir", str(tmp_path), "--result-filename", "r.json")
    assert code == 0, err
    traced = json.loads((tmp_path / "r.json").read_text())["model_id"]
    res = CliRunner().invoke(main, ["sim", "run", "--trace", str(tmp_path / "r.json"), "--model", "Llama-3.1-8B"])
    assert res.exit_code == 0 and (f"the trace measured a model named {traced}; simulating Llama-3.1-8B, as --model "
                                   "says (a server may serve a model under another name") in " ".join(res.stderr.split())
    for same in (traced.rsplit("/", 1)[-1].lower(), "Qwen2.5-7B"):  # (the same model however spelled or named: no word)
        res = CliRunner().invoke(main, ["sim", "run", "--trace", str(tmp_path / "r.json"), "--model", same])
        assert res.exit_code == 0 and "a what-if" not in res.stderr, (same, res.stderr)


def test_a_run_without_streaming_is_not_written_as_a_vllm_result(tmp_path: Path) -> None:
    """vllm bench serve always streams: a --no-stream run has no TTFT or ITL, and was
    exported with TTFT 0.0 and a TPOT holding queueing and prefill. export refuses it in
    one line (exit 2), pointing at csv-summary; bench refuses --save-result with
    --no-stream before it runs."""
    run = tmp_path / "run"
    assert invoke("sim", "run", "-n", "3", "--input-tokens", "50", "--output-tokens", "3", "--out", str(run))[0] == 0
    summary = json.loads((run / "summary.json").read_text())
    summary["config"]["stream"] = False  # (as bench --no-stream writes it)
    (run / "summary.json").write_text(json.dumps(summary))
    code, out, err = invoke("export", str(run), "--format", "vllm")
    assert (code, out) == (2, "") and "--no-stream" in err and "--format csv-summary" in err, err
    assert invoke("export", str(run), "--format", "csv-summary")[0] == 0
    code, _, err = invoke("bench", "--url", "http://127.0.0.1:9", "--no-stream", "--save-result", "-n", "1", "--no-history")
    assert code == 2 and "needs streaming" in err and "cannot reach" not in err, err


# --- bench: a vllm bench serve line runs as it is typed ------------------------------------


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    from inferlab.sim.engine.engine import EngineConfig
    from inferlab.sim.server.app import ServerConfig
    from inferlab.sim.server.launch import EmbeddedServer

    with EmbeddedServer(ServerConfig(EngineConfig())) as server:
        yield server.url


def bench_line(url: str, *args: str) -> tuple[int, dict[str, Any] | None, str]:
    """Exit code, summary.json (exit 0) and all of stderr."""
    res = CliRunner().invoke(main, ["bench", "--url", url, "-c", "1", "--json", "--no-history", *args])
    return res.exit_code, json.loads(res.stdout) if res.exit_code == 0 else None, res.stderr


def test_a_vllm_line_without_backend_runs_vllms_default_backend_and_says_so(served: str) -> None:
    """vLLM 0.32's default --backend is openai (/v1/completions): a line of its flags ran
    chat (template tokens on every prompt) with no word of it."""
    code, s, err = bench_line(served, "--num-prompts", "2", "--random-input-len", "40", "--random-output-len", "4")
    assert code == 0 and s is not None, err
    assert s["config"]["api"] == "completions"
    assert "--api completions, as vLLM's default --backend openai" in err
    # inferlab's own line keeps inferlab's default, chat
    code, s, err = bench_line(served, "-n", "2", "--input-tokens", "40", "--output-tokens", "4")
    assert code == 0 and s is not None and s["config"]["api"] == "chat" and "vLLM" not in err
    code, s, err = bench_line(served, "--num-prompts", "2", "--random-input-len", "40", "--random-output-len", "4", "--api", "chat")
    assert code == 0 and s is not None and s["config"]["api"] == "chat"


@pytest.mark.parametrize(("args", "api"), [
    (["--backend", "openai-chat", "--endpoint", "/v1/chat/completions"], "chat"),
    (["--backend", "openai-chat"], "chat"),
    (["--backend", "vllm"], "completions"),
    (["--backend", "openai", "--endpoint", "/v1/completions"], "completions"),
    (["--endpoint", "/v1/completions"], "completions"),
])
def test_backend_and_endpoint_choose_the_api(served: str, args: list[str], api: str) -> None:
    code, s, err = bench_line(served, "-n", "2", "--input-tokens", "40", "--output-tokens", "4", *args)
    assert code == 0 and s is not None, err
    assert s["config"]["api"] == api


@pytest.mark.parametrize(("args", "needle"), [
    (["--backend", "openai-embeddings"], "completions and chat APIs"),
    (["--endpoint", "/v1/responses"], "/v1/completions or /v1/chat/completions"),
    (["--endpoint", "/v1/chat/completions"], "add --backend openai-chat"),
    (["--backend", "openai", "--endpoint", "/v1/chat/completions"], "is the chat API"),
    (["--backend", "openai", "--api", "chat"], "give one"),
    (["--dataset-name", "sharegpt"], "--dataset FILE"),
    (["--dataset-name", "random", "--prompt", "hi"], "give one workload"),
    (["--percentile-metrics", "ttft,goodput"], "expected some of ttft"),
])
def test_what_bench_cannot_run_as_typed_is_refused(served: str, args: list[str], needle: str) -> None:
    code, _, err = bench_line(served, "-n", "2", *args)
    assert code == 2 and needle in err, err


def test_dataset_name_random_is_vllms_random_dataset(served: str) -> None:
    code, s, err = bench_line(served, "--dataset-name", "random", "--num-prompts", "2", "--random-output-len", "3")
    assert code == 0 and s is not None, err
    assert (s["config"]["workload"]["input_tokens"], s["config"]["workload"]["output_tokens"]) == ("1024", "3")
    assert s["output_tokens"] == 2 * 3 and "vLLM's random dataset: 1024 input" in err


def test_percentile_metrics_choose_the_result_files_metrics(served: str, tmp_path: Path) -> None:
    code, _, err = bench_line(served, "-n", "3", "--input-tokens", "40", "--output-tokens", "4", "--percentile-metrics", "ttft,e2el",
                              "--metric-percentiles", "50,99", "--save-result", "--result-dir", str(tmp_path), "--result-filename", "r.json")
    assert code == 0, err
    r = json.loads((tmp_path / "r.json").read_text())
    assert sorted(k for k in r if k.endswith("_ms")) == sorted(
        f"{s}_{m}_ms" for m in ("ttft", "e2el") for s in ("mean", "median", "std", "p50", "p99"))
    assert "--percentile-metrics ttft,e2el: --save-result's file has statistics of these only" in err


def test_a_models_config_json_is_the_model_its_folder_names() -> None:
    """--model <folder>/config.json is the model its folder names: a trace of that name
    is no what-if of another model."""
    from inferlab.cli.sim import _same_model

    assert _same_model("tiny-llama-hf", "/models/tiny-llama-hf/config.json")
    assert _same_model("org/Tiny-Llama-HF", "/models/tiny-llama-hf/")
    assert not _same_model("tiny", "/models/tiny-llama-hf/config.json")


# --- vLLM's random dataset: --random-range-ratio, --random-prefix-len ----------------------


def vllm_range(length: int, ratio: float) -> tuple[int, int]:
    """vLLM's RandomDataset.get_sampling_params (vllm/benchmarks/datasets/random.py): its
    lengths are drawn from floor(L x (1 - R)) to ceil(L x (1 + R)), both included."""
    return math.floor(length * (1 - ratio)), math.ceil(length * (1 + ratio))


def vllm_bench(url: str, *args: str) -> tuple[int, str]:
    """Exit code and stderr of a bench line as typed (no -c)."""
    res = CliRunner().invoke(main, ["bench", "--url", url, "--json", "--no-history", *args])
    return res.exit_code, " ".join(res.stderr.split())


def said(*args: str) -> tuple[int, str]:
    """Exit code and stderr of a bench line against a port nothing listens on (what
    was mapped is said before the server is reached)."""
    res = CliRunner().invoke(main, ["bench", "--url", "http://127.0.0.1:9", "--no-history", *args])
    return res.exit_code, " ".join(res.stderr.split())


def test_random_range_ratio_draws_vllms_lengths(served: str, tmp_path: Path) -> None:
    """InferenceMAX's line's --random-range-ratio was refused; it draws each request's
    prompt and output lengths from vLLM's ranges, both ends included, and says so."""
    code, err = vllm_bench(served, "--num-prompts", "300", "--max-concurrency", "64", "--random-input-len", "45",
                              "--random-output-len", "9", "--random-range-ratio", "0.3", "--ignore-eos",
                              "-o", str(tmp_path / "run"))
    assert code == 0, err
    (in_lo, in_hi), (out_lo, out_hi) = vllm_range(45, 0.3), vllm_range(9, 0.3)
    assert (in_lo, in_hi, out_lo, out_hi) == (31, 59, 6, 12)  # (floor and ceil, not rounding)
    records = list(read_records(tmp_path / "run" / "requests.jsonl"))
    drawn_in = [r.requested_input_tokens or 0 for r in records]
    drawn_out = [r.output_tokens or 0 for r in records]
    assert (min(drawn_in), max(drawn_in), len(set(drawn_in))) == (in_lo, in_hi, in_hi - in_lo + 1)
    assert (min(drawn_out), max(drawn_out), len(set(drawn_out))) == (out_lo, out_hi, out_hi - out_lo + 1)
    summary = read_summary(tmp_path / "run" / "summary.json")
    overhead = summary.prompt_overhead_tokens
    assert isinstance(overhead, int)
    assert {(r.input_tokens or 0) - overhead for r in records} == set(drawn_in)  # (as the server counted them)
    assert f"--random-range-ratio 0.3: --input-tokens uniform:{in_lo}:{in_hi} --output-tokens uniform:{out_lo}:{out_hi}" in err


def test_random_range_ratio_takes_vllms_default_lengths_and_its_tokenizers_special_tokens(
        tokenizer_path: str, tmp_path: Path) -> None:
    """Without lengths vLLM's 1,024/128 are drawn around; vLLM takes the tokenizer's
    special tokens (a BOS) off --random-input-len first, and so does bench, given the
    tokenizer; without one it says it took none off."""
    (in_lo, in_hi), (out_lo, out_hi) = vllm_range(1024, 0.8), vllm_range(128, 0.8)
    code, err = said("--random-range-ratio", "0.8", "--num-prompts", "640")
    assert code == 1, err  # (nothing listens)
    assert f"--input-tokens uniform:{in_lo}:{in_hi} --output-tokens uniform:{out_lo}:{out_hi}" in err, err
    assert "less 0 special tokens (no --tokenizer" in err
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(tokenizer_path)
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", tok.token_to_id("<|endoftext|>"))])
    bos = tmp_path / "tokenizer.json"
    tok.save(str(bos))
    (in_lo, in_hi), (out_lo, out_hi) = vllm_range(100 - 1, 0.5), vllm_range(20, 0.5)
    code, err = said("--random-input-len", "100", "--random-output-len", "20", "--random-range-ratio", "0.5",
                     "--tokenizer", str(bos))
    assert f"--input-tokens uniform:{in_lo}:{in_hi} --output-tokens uniform:{out_lo}:{out_hi}" in err, err
    assert "less 1 special token;" in err
    code, err = said("--random-input-len", "100", "--random-output-len", "20", "--tokenizer", str(bos))  # (ratio 0)
    assert "--input-tokens 99 --output-tokens 20" in err, err


def test_random_prefix_len_is_one_shared_prefix_before_each_requests_own_tokens(served: str, tmp_path: Path) -> None:
    """vLLM's --random-prefix-len (refused before): one prefix of N tokens before every
    request's own drawn tokens, the range ratio drawing those, not the prefix."""
    code, err = vllm_bench(served, "--num-prompts", "60", "--max-concurrency", "16", "--random-prefix-len", "30",
                              "--random-input-len", "20", "--random-output-len", "3", "--random-range-ratio", "0.5",
                              "-o", str(tmp_path / "run"))
    assert code == 0, err
    lo, hi = vllm_range(20, 0.5)
    workload = read_summary(tmp_path / "run" / "summary.json").config["workload"]
    assert (workload["prefix_tokens"], workload["prefix_groups"], workload["suffix_tokens"]) == (30, None, f"uniform:{lo}:{hi}")
    records = list(read_records(tmp_path / "run" / "requests.jsonl"))
    assert {(r.prefix_group, r.prefix_tokens) for r in records} == {("0", 30)}
    drawn = [r.requested_input_tokens or 0 for r in records]
    assert min(drawn) >= 30 + lo and max(drawn) <= 30 + hi and len(set(drawn)) > 5
    assert f"--prefix-tokens 30 (one prefix shared by every request) --suffix-tokens uniform:{lo}:{hi}" in err


@pytest.mark.parametrize(("args", "needle"), [
    (["--random-range-ratio", "1"], "from 0 up to (not including) 1"),
    (["--random-range-ratio", "-0.1"], "from 0 up to (not including) 1"),
    (["--random-range-ratio", "0.5", "--input-tokens", "uniform:100:200"], "draws around a fixed --random-input-len"),
    (["--random-range-ratio", "0.5", "--random-output-len", "normal:100:10"], "draws around a fixed --random-output-len"),
    (["--random-range-ratio", "0.5", "--dataset", "x.jsonl"], "--dataset is another workload"),
    (["--random-prefix-len", "8", "--prefix-tokens", "8"], "--prefix-tokens is another workload"),
    (["--random-range-ratio", "0.99", "--random-input-len", "50"], "is 0 tokens"),
])
def test_what_vllms_random_dataset_flags_cannot_mean_is_refused(args: list[str], needle: str) -> None:
    code, err = said("--num-prompts", "2", *args)
    assert code == 2 and needle in err, err
    assert "cannot reach" not in err
