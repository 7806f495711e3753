"""``inferlab sweep --url``: the same sweep over HTTP against ``sim serve`` agrees with
the simulator in virtual time; engine flags against a URL are refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from inferlab.cli.main import main
from inferlab.sim.server.launch import ChildServer

#: `sim serve` sized to saturate early, on a GPU slow enough (~20 ms a decode step) that a
#: busy machine's lateness in the real-time server is a small share of each step; the
#: virtual sweep is given the same engine
SERVE = ["--max-num-seqs", "16", "--gpu", "L40S"]
SAME_ENGINE = [*SERVE, "--max-model-len", "4096", "--max-num-batched-tokens", "8192", "--enforce-eager"]
WORKLOAD = ["--input-tokens", "256", "--output-tokens", "8", "--api", "completions"]


def sweep(args: list[str]) -> Any:
    return CliRunner().invoke(main, ["sweep", *args], catch_exceptions=False)


def test_a_short_http_sweep_agrees_with_the_virtual_one_at_the_points_both_ran(tmp_path: Path) -> None:
    virtual, http = tmp_path / "virtual", tmp_path / "http"
    r = sweep(["-c", "1,2,4,8,16,32,64,128,256", *SAME_ENGINE, *WORKLOAD, "-o", str(virtual)])
    assert r.exit_code == 0, r.output
    with ChildServer(SERVE) as server:
        r = sweep(["--url", server.url, "-c", "2,4", *WORKLOAD, "-o", str(http)])
    assert r.exit_code == 0, r.output
    # sim serve's numbers are predictions, made in real time: labelled so, with no error band
    # (bands are the simulator's validation error in virtual time)
    assert f"prediction (inferlab sim serve at {server.url}/v1, over HTTP)" in r.output
    assert "measured" not in r.output and "±" not in r.output
    assert all(p["prediction"] is None for p in json.loads((http / "sweep.json").read_text())["points"])
    assert json.loads((http / "sweep.json").read_text())["prediction"] is True
    v = {p["params"]["concurrency"]: p["headline"] for p in json.loads((virtual / "sweep.json").read_text())["points"]
         if p["status"] == "done"}
    h = {p["params"]["concurrency"]: p["headline"] for p in json.loads((http / "sweep.json").read_text())["points"]}
    assert set(h) == {2, 4} <= set(v)
    for c in h:
        for key in ("output_tok_s", "ttft_p50_ms"):
            assert h[c][key] == pytest.approx(v[c][key], rel=0.15), (c, key, h[c][key], v[c][key])
    # the server's engine was the one simulated
    engine = json.loads((http / "001_c2" / "config.json").read_text())["resolved"]["engine"]
    assert (engine["max_num_seqs"], engine["max_num_batched_tokens"], engine["enforce_eager"], engine["gpu"]) == (16, 8192, True, "L40S")


@pytest.mark.parametrize("flags", [["--max-num-batched-tokens", "2048,8192"], ["--quantization", "fp8"],
                                   ["--gpu", "L40S"], ["--tensor-parallel-size", "1,2"], ["--enforce-eager"],
                                   # (flags whose setting has another name: named as given)
                                   ["--api-latency-ms", "3"], ["--efficiencies", "x.json"]])
def test_engine_flags_with_a_url_are_refused_before_anything_runs(tmp_path: Path, flags: list[str]) -> None:
    r = sweep(["--url", "http://127.0.0.1:9", *flags, "-o", str(tmp_path / "x")])
    assert r.exit_code == 2
    assert "engine flags apply to the simulator" in r.output and flags[0] in r.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("url", ["ftp://x", "127.0.0.1:8000", "http://"])
def test_a_url_bench_would_refuse_is_refused_before_any_point_runs(tmp_path: Path, url: str) -> None:
    # (it ran every point into the same error and exited 0)
    r = sweep(["--url", url, "-c", "1,2", "-n", "2", "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--url: not an http(s) URL" in r.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(("flags", "named"), [(["--timeout", "5"], "--timeout"), (["-H", "X-A: b"], "--header"),
                                              (["--metrics-url", "http://127.0.0.1:9/metrics"], "--metrics-url"),
                                              (["--no-server-metrics"], "--[no-]server-metrics")])
def test_server_flags_without_a_url_are_refused(tmp_path: Path, flags: list[str], named: str) -> None:
    r = sweep([*flags, "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and f"error: {named}: only for runs against --url" in r.output, r.output


def test_every_point_reads_the_metrics_pages_named(tmp_path: Path) -> None:
    """``--metrics-url`` (the engines behind a gateway, a metrics port of their own):
    every point reads the pages named, not the one beside --url; refused as bench refuses
    it, and beside --engine (whose server's own page is read)."""
    with ChildServer(SERVE) as server:
        page = f"{server.url}/metrics"
        r = sweep(["--url", server.url, "--metrics-url", page, "-c", "1,2", "-n", "4", "--no-saturation-stop",
                   *WORKLOAD, "-o", str(tmp_path / "s")])
        assert r.exit_code == 0, r.output
        for point in ("001_c1", "002_c2"):
            config = json.loads((tmp_path / "s" / point / "config.json").read_text())
            assert config["metrics_urls"] == [page] == config["resolved"]["metrics_urls"]
            summary = json.loads((tmp_path / "s" / point / "summary.json").read_text())
            assert summary["server_metrics"]["available"] and summary["server_metrics"]["counters"]["requests_finished"] >= 4
        for flags, said in ((["--metrics-url", page, "--no-server-metrics"], "--no-server-metrics reads none"),
                            (["--metrics-url", "ftp://127.0.0.1/metrics"], "not an http(s) URL"),
                            (["--metrics-url", page, "--metrics-url", page.replace("127.0.0.1", "localhost")],
                             "name each server once")):
            r = sweep(["--url", server.url, *flags, "-c", "1", "-n", "2", "-o", str(tmp_path / "x")])
            assert r.exit_code == 2 and said in r.output, r.output
            assert not (tmp_path / "x").exists()
    r = sweep(["--engine", str(tmp_path / "engine.toml"), "--metrics-url", "http://127.0.0.1:9/metrics",
               "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--metrics-url needs --url" in r.output


def test_no_server_there_exits_1_and_leaves_no_empty_sweep(tmp_path: Path) -> None:
    r = sweep(["--url", "http://127.0.0.1:9", "-c", "1", "-o", str(tmp_path / "x")])
    assert r.exit_code == 1 and "cannot reach" in r.output
    assert not (tmp_path / "x").exists()
