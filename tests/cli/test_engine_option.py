"""``sweep --engine`` and ``profile --engine``: the engine a config describes (here the
simulator, ``engine = "sim"``: a real process serving real HTTP on loopback) started,
measured, and stopped on every way out; unusable configs and flag mixes refused before
anything starts."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from inferlab.cli.main import main

SIM = 'engine = "sim"\nmodel = "Llama-3.2-1B"\nmax_model_len = 8192\nmax_num_seqs = 4\n'
SHORT = ["-n", "2", "--input-tokens", "64", "--output-tokens", "4", "--api", "completions"]


def _config(tmp_path: Path, text: str = SIM, name: str = "sim.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def invoke(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def _serving(port: int) -> list[int]:
    """Live processes whose command line serves on ``port`` (an engine left behind)."""
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            words = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--port" in words and str(port).encode() in words:
            pids.append(int(d.name))
    return pids


def assert_stopped(url: str) -> None:
    """Nothing answers at ``url`` any more, and no process serves its port."""
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "/health", timeout=5)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    if Path("/proc").is_dir():
        assert _serving(port) == []


def _point_urls(out: Path, index: dict[str, Any]) -> list[str]:
    return [json.loads((out / p["dir"] / "config.json").read_text())["url"] for p in index["points"] if p["dir"]]


def test_sweep_starts_the_engine_once_measures_it_over_http_and_stops_it(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    # (one value of a config's setting, and a setting's switch: put in the config)
    r = invoke("sweep", "--engine", _config(tmp_path), "-c", "1,2", "--no-saturation-stop", "--max-num-batched-tokens",
               "2048", "--no-enable-prefix-caching", *SHORT, "-o", str(out))
    assert r.exit_code == 0, r.output
    index = json.loads((out / "sweep.json").read_text())
    # (an engine config of kind sim is inferlab's simulator: its numbers are predictions)
    assert index["prediction"] is True and index["target"]["kind"] == "server"
    assert "prediction: sim serving" in r.output and "measured" not in r.output
    spec = index["target"]["engine"]
    assert (spec["engine"], spec["max_num_seqs"], spec["max_num_batched_tokens"], spec["enable_prefix_caching"]) == (
        "sim", 4, 2048, False)
    assert [p["status"] for p in index["points"]] == ["done", "done"]
    urls = _point_urls(out, index)
    assert len(set(urls)) == 1 and urls[0].startswith("http://127.0.0.1:")  # one engine, measured over HTTP
    for p in index["points"]:
        run = out / p["dir"]
        assert json.loads((run / "summary.json").read_text())["counts"]["completed"] == 2
        # the server measured is the one the config describes (the simulator says its engine)
        engine = json.loads((run / "config.json").read_text())["resolved"]["engine"]
        assert (engine["max_num_seqs"], engine["max_num_batched_tokens"], engine["enable_prefix_caching"]) == (4, 2048, False)
    assert "serving http://127.0.0.1:" in (out / "engine.log").read_text()
    assert_stopped(urls[0])


def test_an_engine_setting_on_an_axis_starts_the_engine_once_per_value(tmp_path: Path) -> None:
    """--max-model-len 10000000,2048 --max-num-seqs 2,8 (and two prompt lengths): the
    engine refuses the first length (its groups fail, said why, the sweep goes on), then
    runs with each number of sequences, started once for each, the engine's settings
    varying slowest."""
    out = tmp_path / "sweep"
    r = invoke("sweep", "--engine", _config(tmp_path), "-c", "1", "--input-tokens", "64,128", "--max-num-seqs", "2,8",
               "--max-model-len", "10000000,2048", "-n", "2", "--output-tokens", "4", "--api", "completions",
               "-o", str(out))
    assert r.exit_code == 0, r.output
    index = json.loads((out / "sweep.json").read_text())
    points = index["points"]
    order = [(p["params"]["max_model_len"], p["params"]["max_num_seqs"], p["params"]["input_tokens"]) for p in points]
    assert order == [(m, s, i) for m in (10000000, 2048) for s in (2, 8) for i in ("64", "128")]
    refused, ran = points[:4], points[4:]
    assert all(p["status"] == "failed" and "the engine did not start" in p["reason"] for p in refused)
    assert "max_position_embeddings" in refused[0]["reason"]  # the engine's own words, from its log
    assert all(p["status"] == "done" for p in ran)
    # (sweep.json's target: the config, its settings the axes vary named, not given a value no point ran)
    target = index["target"]
    assert sorted(target["varied"]) == ["max_model_len", "max_num_seqs"]
    assert "max_num_seqs" not in target["engine"] and "max_model_len" not in target["engine"]
    urls: dict[int, set[str]] = {}
    for p in ran:
        config = json.loads((out / p["dir"] / "config.json").read_text())
        engine = config["resolved"]["engine"]
        assert (engine["max_num_seqs"], engine["max_model_len"]) == (p["params"]["max_num_seqs"], 2048)
        urls.setdefault(p["params"]["max_num_seqs"], set()).add(config["url"])
    assert all(len(u) == 1 for u in urls.values()) and urls[2] != urls[8]  # started once per setting
    logs = sorted(f.name for f in out.glob("engine_*.log"))
    assert len(logs) == 4 and all("max_model_len" in name for name in logs)  # a refused setting: started once
    for u in urls.values():
        assert_stopped(next(iter(u)))


def test_a_sweep_over_an_engine_asks_the_chat_api_by_default_as_its_help_says(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    r = invoke("sweep", "--engine", _config(tmp_path), "-c", "1", "-n", "2", "--input-tokens", "64", "--output-tokens", "4",
               "-o", str(out))
    assert r.exit_code == 0, r.output
    index = json.loads((out / "sweep.json").read_text())
    (point,) = index["points"]
    assert json.loads((out / point["dir"] / "config.json").read_text())["api"] == "chat"


def test_an_engine_that_does_not_start_ends_a_sweep_without_axes_exit_1(tmp_path: Path) -> None:
    bad = _config(tmp_path, SIM.replace("8192", "10000000"))
    out = tmp_path / "sweep"
    r = invoke("sweep", "--engine", bad, "-c", "1", *SHORT, "-o", str(out))
    assert r.exit_code == 1 and "exited" in r.output and "max_position_embeddings" in r.output, r.output
    assert not (out / "sweep.json").exists() and (out / "engine.log").exists()  # (the log says why)


def test_profile_starts_the_engine_profiles_it_records_its_config_and_stops_it(tmp_path: Path) -> None:
    out = tmp_path / "profile"
    r = invoke("profile", "--engine", _config(tmp_path), "--budget", "10", "--factors", "prefill", "--api",
               "completions", "-o", str(out))
    assert r.exit_code == 0, r.output
    p = json.loads((out / "profile.json").read_text())
    assert p["url"] is not None and p["url"].startswith("http://127.0.0.1:")
    assert p["engine_config"]["engine"] == "sim" and p["engine_config"]["max_num_seqs"] == 4
    assert p["engine"]["max_num_seqs"] == 4  # what the server profiled says it runs
    # inferlab's simulator: predictions, said in profile.json as in summary.json, and in the table
    assert p["server"] == {"simulated": True, "kind": "sim serve", "url": p["url"], "engine_family": "vllm"}
    assert "predicted cost here" in r.output and "measured cost here" not in r.output
    assert p["max_model_len"] == 8192 and p["factors"][0]["name"] == "prefill" and p["factors"][0]["measured"]
    run = out / p["factors"][0]["runs"][0]
    assert json.loads((run / "config.json").read_text())["url"] == p["url"]
    assert "serving http://127.0.0.1:" in (out / "engine.log").read_text()
    assert_stopped(p["url"])


def test_profile_refuses_a_folder_holding_a_profile_before_starting(tmp_path: Path) -> None:
    out = tmp_path / "profile"
    out.mkdir()
    (out / "profile.json").write_text("{}")
    r = invoke("profile", "--engine", _config(tmp_path), "--budget", "10", "-o", str(out))
    assert r.exit_code == 2 and "already holds a profile" in r.output
    assert not (out / "engine.log").exists()


LLAMA_TP = 'engine = "llamacpp"\nmodel = "m.gguf"\nexecutable = "/nonexistent/llama-server"\ntensor_parallel_size = 2\n'


@pytest.mark.parametrize(("args", "needle"), [
    (["sweep", "--engine", "{sim}", "--url", "http://127.0.0.1:9"], "not both"),
    (["sweep", "--engine", "{sim}", "--gpu", "L40S"], "--gpu: flags of the simulated engine"),
    (["sweep", "--engine", "{sim}", "--quantization", "fp8"], "--quantization: flags of the simulated engine"),
    (["sweep", "--engine", "{sim}", "--model", "a,b"], "requests one"),
    (["sweep", "--engine", "{bad}"], "unknown setting 'gpu'"),
    (["sweep", "--engine", "{llama}"], "llama.cpp has no setting for tensor_parallel_size"),
    (["sweep", "--engine", "{missing}"], "No such file"),
    (["profile", "--engine", "{sim}", "--url", "http://127.0.0.1:9"], "not both"),
    (["profile", "--engine", "{bad}"], "unknown setting 'gpu'"),
    (["profile", "--engine", "{llama}"], "llama.cpp has no setting for tensor_parallel_size"),
])
def test_unusable_configs_and_flag_mixes_are_refused_before_anything_starts(tmp_path: Path, args: list[str], needle: str) -> None:
    paths = {
        "sim": _config(tmp_path), "bad": _config(tmp_path, SIM + 'gpu = "H100"\n', "bad.toml"),
        "llama": _config(tmp_path, LLAMA_TP, "llama.toml"), "missing": str(tmp_path / "missing.toml"),
    }
    out = tmp_path / "out"
    r = invoke(*(a.format(**paths) for a in args), "-o", str(out))
    assert r.exit_code == 2 and needle in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert not out.exists()  # (an engine started would have left its log there)


def test_a_listed_value_no_engine_takes_is_refused_as_the_flags_are_read(tmp_path: Path) -> None:
    """A sweep axis with a value no engine takes (0 sequences) is refused while the flags
    are read, one line, exit 2, before an engine starts (it was a failed point after)."""
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "inferlab", "sweep", "--engine", _config(tmp_path), "--max-num-seqs", "4,0",
                        "-o", str(out), "--no-history"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "0 is not in the range x>=1" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not out.exists()


# --- Ctrl-C: finished work kept, the engine stopped -------------------------------------


def _start(args: list[str], cwd: Path) -> tuple[subprocess.Popen[bytes], Path]:
    err = cwd / "stderr.txt"
    with open(err, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "inferlab", *args], stdout=subprocess.DEVNULL, stderr=f, cwd=cwd)
    return proc, err


def _wait_for(check: Any, proc: subprocess.Popen[bytes], what: str, limit_s: float = 90.0) -> Any:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        assert proc.poll() is None, f"exited ({proc.returncode}) before {what}"
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"no {what} within {limit_s:.0f} s")


def _interrupt(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _done_point(out: Path) -> dict[str, Any] | None:
    try:
        index = json.loads((out / "sweep.json").read_text())
    except (OSError, ValueError):
        return None
    return next((p for p in index["points"] if p["status"] == "done"), None)


@pytest.mark.skipif(os.name != "posix", reason="SIGINT to a child process")
def test_ctrl_c_keeps_the_sweeps_finished_points_and_stops_the_engine(tmp_path: Path) -> None:
    """The second group asks for 4,000 tokens a request (seconds each): interrupted
    there, the first group's point is kept and the engine is stopped."""
    out = tmp_path / "sweep"
    proc, _ = _start(["sweep", "--engine", _config(tmp_path), "-c", "1", "-n", "2", "--input-tokens", "64",
                      "--output-tokens", "4,4000", "--api", "completions", "-o", str(out)], tmp_path)
    done = _wait_for(lambda: _done_point(out), proc, "a finished point")
    assert _interrupt(proc) == 130
    index = json.loads((out / "sweep.json").read_text())
    assert index["complete"] is False and index["points"][0]["dir"] == done["dir"]
    assert index["points"][0]["status"] == "done" and index["points"][-1]["status"] in ("stopped", "skipped")
    assert_stopped(json.loads((out / done["dir"] / "config.json").read_text())["url"])


@pytest.mark.skipif(os.name != "posix", reason="SIGINT to a child process")
def test_ctrl_c_during_a_profile_stops_the_engine(tmp_path: Path) -> None:
    proc, err = _start(["profile", "--engine", _config(tmp_path), "--budget", "120", "--factors", "decode",
                        "-o", str(tmp_path / "profile")], tmp_path)

    def url() -> str | None:
        m = re.search(r"ready at (http://\S+)", err.read_text())
        return m.group(1) if m and "profile: decode" in err.read_text() else None

    at = _wait_for(url, proc, "the profile's first measurement")
    assert _interrupt(proc) == 130
    assert "Traceback" not in err.read_text()
    assert_stopped(at)


@pytest.mark.skipif(os.name != "posix", reason="SIGHUP to a child process")
def test_a_hangup_ends_bench_gracefully_and_stops_the_engine_unless_nohup_ignores_it(tmp_path: Path) -> None:
    """The terminal closed (SIGHUP): bench keeps what completed and stops its engine, as
    on Ctrl-C (by default SIGHUP ended bench and left the engine running); under nohup
    (SIGHUP ignored) the run goes on."""
    args = ["bench", "--engine", _config(tmp_path), "-c", "1", "-n", "400", "--input-tokens", "16",
            "--output-tokens", "64", "--api", "completions", "--no-history"]

    def ready(err: Path) -> str | None:
        m = re.search(r"ready at (http://\S+)", err.read_text())
        return m.group(1) if m else None

    for nohup in (False, True):
        run_dir = tmp_path / f"run-{nohup}"
        err = tmp_path / f"stderr-{nohup}.txt"
        with open(err, "wb") as f:
            proc = subprocess.Popen(
                [sys.executable, "-m", "inferlab", *args, "-o", str(run_dir)], stdout=subprocess.DEVNULL, stderr=f,
                # (SIGHUP's disposition set either way: a test run under nohup hands its ignore down)
                cwd=tmp_path, preexec_fn=lambda n=nohup: signal.signal(signal.SIGHUP, signal.SIG_IGN if n else signal.SIG_DFL),
            )
        try:
            url = _wait_for(lambda e=err: ready(e), proc, "the engine")  # type: ignore[misc]
            records = run_dir / "requests.jsonl"  # (written as requests complete: the run, and its handlers, are on)
            _wait_for(lambda r=records: r.exists() and r.read_text().count("\n") >= 2, proc, "a completed request")  # type: ignore[misc]
            proc.send_signal(signal.SIGHUP)
            if nohup:
                time.sleep(2.0)
                assert proc.poll() is None, err.read_text()[-2000:]  # still measuring
                proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
            assert "Traceback" not in err.read_text()
            summary = json.loads((run_dir / "summary.json").read_text())
            assert 0 < summary["counts"]["completed"] < 400
            assert_stopped(url)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_each_setting_of_an_engine_axis_is_recorded_as_the_engine_its_runs_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep's (or tune's) target for one setting carries the config with that
    setting's values put in (each point's config.json records it as ``engine_config``,
    as bench --engine does): not the base file's, which calibrate would take for the
    server's."""
    import asyncio

    from rich.console import Console

    from inferlab.cli import engine as cli_engine
    from inferlab.engines.launch import load_spec

    class Started:
        url = "http://127.0.0.1:1/v1"

        def __init__(self, spec: Any, log: Path) -> None:
            self.command = type("C", (), {"shell": lambda _: "engine"})()

        def stop(self) -> None:
            pass

    monkeypatch.setattr(cli_engine, "EngineProcess", Started)
    monkeypatch.setattr(cli_engine, "start_ready", lambda proc, stop: None)
    trials = cli_engine.EngineTrials(load_spec(_config(tmp_path)), Console(stderr=True))

    async def target_of(seqs: int) -> Any:
        async with trials.open({"max_num_seqs": seqs}, str(tmp_path / "engine.log")) as target:
            return target

    for seqs in (2, 8):
        recorded = asyncio.run(target_of(seqs)).engine_config
        assert recorded is not None and (recorded["engine"], recorded["max_num_seqs"], recorded["max_model_len"]) == (
            "sim", seqs, 8192)


def test_a_sweep_whose_engine_starts_with_no_setting_of_its_axis_exits_1(tmp_path: Path) -> None:
    """Every value of --max-model-len refused by the engine: each point failed, none ran,
    and the sweep exited 0 as if it had measured something. Now exit 1, saying so."""
    out = tmp_path / "sweep"
    r = invoke("sweep", "--engine", _config(tmp_path), "-c", "1", "--max-model-len", "10000000,20000000", *SHORT,
               "-o", str(out))
    assert r.exit_code == 1, r.output
    assert "no point ran" in r.stderr
    points = json.loads((out / "sweep.json").read_text())["points"]
    assert points and all(p["status"] == "failed" and p["dir"] is None for p in points)
