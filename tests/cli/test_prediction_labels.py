"""A simulated run is labelled a prediction wherever it is shown, and names its server
(``results.provenance``): ``bench`` without ``--url`` (the embedded simulated server),
``bench`` and ``sweep`` against ``sim serve``, ``sim run``; in the console, summary.json,
``runs``, ``compare``, ``report`` and ``export``."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inferlab.sim.server.launch import ChildServer

SHORT = ["-n", "6", "-c", "2", "--input-tokens", "64", "--output-tokens", "4", "--api", "completions"]


def inferlab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferlab", *args], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "COLUMNS": "250"})


def words(text: str) -> str:
    """The text with its line breaks and runs of spaces as one space (rich wraps a title
    to its table's width)."""
    return " ".join(text.split())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], str]:
    """Runs of each simulated kind, their console output, and sim serve's URL (its
    process gone by the time the tests read them: they read what was written)."""
    d = tmp_path_factory.mktemp("labels")
    hist = ["--history", str(d / "h.sqlite")]  # (a module fixture: set up before the per-test history)
    out: dict[str, str] = {}
    p = inferlab("bench", *SHORT, *hist, "-o", str(d / "emb"))
    assert p.returncode == 0, p.stderr
    out["emb"] = p.stdout
    with ChildServer([]) as server:
        p = inferlab("bench", "--url", server.url, *SHORT, *hist, "-o", str(d / "serve"))
        assert p.returncode == 0, p.stderr
        out["serve"] = p.stdout
        p = inferlab("sweep", "--url", server.url, "-c", "1,2", "-n", "4", "--input-tokens", "64", "--output-tokens", "4",
                     "--api", "completions", *hist, "-o", str(d / "sweep"))
        assert p.returncode == 0, p.stderr
        out["sweep"] = p.stdout + p.stderr
        url = server.url
    p = inferlab("sim", "run", *SHORT, *hist, "-o", str(d / "sim"))
    assert p.returncode == 0, p.stderr
    out["sim"] = p.stdout
    return d, out, url


def test_bench_without_url_names_the_embedded_server_and_says_prediction(runs: tuple[Path, dict[str, str], str]) -> None:
    d, out, _ = runs
    assert "@ the embedded simulated server (prediction)" in words(out["emb"])
    assert "127.0.0.1" not in out["emb"]  # (the embedded server's port was a throwaway)
    summary = json.loads((d / "emb" / "summary.json").read_text())
    assert summary["server"] == {"simulated": True, "kind": "embedded", "url": None, "engine_family": "vllm"}
    assert list(summary)[:3] == ["schema", "config", "server"]


def test_bench_against_sim_serve_names_it_and_says_prediction(runs: tuple[Path, dict[str, str], str]) -> None:
    d, out, url = runs
    summary = json.loads((d / "serve" / "summary.json").read_text())
    assert summary["server"] == {"simulated": True, "kind": "sim serve", "url": url + "/v1", "engine_family": "vllm"}
    assert f"@ inferlab sim serve at {url}/v1 (prediction)" in words(out["serve"])
    assert "virtual time (prediction)" in words(out["sim"])
    assert json.loads((d / "sim" / "summary.json").read_text())["server"]["kind"] == "virtual time"


def test_a_sweep_against_sim_serve_is_a_prediction_without_bands(runs: tuple[Path, dict[str, str], str]) -> None:
    d, out, url = runs
    assert f"prediction (inferlab sim serve at {url}/v1, over HTTP)" in out["sweep"]
    # the progress says so too, once the first point found the server to be the simulator
    assert f"the server is inferlab sim serve at {url}/v1: every number is a prediction" in out["sweep"]
    points = [line for line in out["sweep"].splitlines() if line.startswith("  c=")]
    assert len(points) == 2 and all(line.endswith(" (prediction)") for line in points)
    assert "measured" not in out["sweep"] and "±" not in out["sweep"]
    index = json.loads((d / "sweep" / "sweep.json").read_text())
    assert index["prediction"] is True and all(p["prediction"] is None for p in index["points"])


def test_runs_names_the_simulated_server_and_marks_its_rows(runs: tuple[Path, dict[str, str], str]) -> None:
    d, _, url = runs
    p = inferlab("runs", "--history", str(d / "h.sqlite"), "--json")
    assert p.returncode == 0, p.stderr
    rows = {json.loads(line)["path"]: json.loads(line) for line in p.stdout.splitlines()}
    assert rows[str(d / "emb")]["target"] == "the embedded simulated server"
    assert rows[str(d / "serve")]["target"] == f"inferlab sim serve at {url}/v1"
    assert rows[str(d / "sim")]["target"] == "simulator (virtual time)"
    assert all(r["simulated"] for r in rows.values())
    p = inferlab("runs", "--history", str(d / "h.sqlite"))
    lines = {line.rstrip().rsplit(" ", 1)[-1]: line for line in p.stdout.splitlines() if line.rstrip().endswith(str(d / "emb"))}
    assert "the embedded simulated server (prediction)" in lines[str(d / "emb")]
    assert sum("(prediction)" in line for line in p.stdout.splitlines()) == len(rows)  # (every one of them simulated)


def test_compare_and_report_name_the_simulated_servers(runs: tuple[Path, dict[str, str], str], tmp_path: Path) -> None:
    d, _, url = runs
    p = inferlab("compare", str(d / "emb"), str(d / "serve"), str(d / "sim"))
    assert p.returncode == 0, p.stderr
    text = words(p.stdout)
    assert "emb: Qwen/Qwen2.5-7B-Instruct (vllm on 1x H100-SXM-80GB) @ the embedded simulated server, 6 requests (prediction)" in text
    assert f"@ inferlab sim serve at {url}/v1, 6 requests (prediction)" in text
    assert "@ the simulator (virtual time), 6 requests (prediction)" in text
    html = tmp_path / "r.html"
    p = inferlab("report", str(d / "emb"), str(d / "serve"), "-o", str(html))
    assert p.returncode == 0, p.stderr
    page = html.read_text()
    assert "<li>emb: Qwen/Qwen2.5-7B-Instruct (vllm on 1x H100-SXM-80GB) @ the embedded simulated server, 6 requests (prediction)</li>" in page
    assert f"@ inferlab sim serve at {url}/v1, 6 requests (prediction)</li>" in page
    # over HTTP no error bands (real time), and the page says so rather than leave them out unsaid
    assert "emb: a prediction over HTTP against inferlab&#x27;s simulated server: no error bands" in page and " ±" not in page
    p = inferlab("report", str(d / "sweep"), "-o", str(html))
    assert p.returncode == 0, p.stderr
    page = html.read_text()
    assert " (prediction)</h2>" in page and "Run over HTTP against inferlab's simulated server" in page
    assert "Simulated in virtual time" not in page  # (nor its error bands)


def test_export_says_a_run_against_a_simulated_server_was_simulated(runs: tuple[Path, dict[str, str], str]) -> None:
    d, _, url = runs
    sources = {}
    for name in ("emb", "serve", "sim"):
        p = inferlab("export", str(d / name), "--format", "vllm")
        assert p.returncode == 0, p.stderr
        sources[name] = json.loads(p.stdout)["inferlab_source"]
        assert ("inferlab_error_bands" in json.loads(p.stdout)) == (name == "sim")  # (bands: virtual time only)
    assert sources["emb"] == "inferlab bench against the embedded simulated server (simulated, not measured)"
    assert sources["serve"] == f"inferlab bench against inferlab sim serve at {url}/v1 (simulated, not measured)"
    assert sources["sim"] == "inferlab sim run (simulated in virtual time, not measured)"
    for fmt in ("csv-summary", "csv-requests"):  # the CSVs say it on every row
        p = inferlab("export", str(d / "serve"), "--format", fmt)
        assert p.returncode == 0, p.stderr
        assert {r["inferlab_source"] for r in csv.DictReader(io.StringIO(p.stdout))} == {sources["serve"]}
