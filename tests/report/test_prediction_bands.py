"""A ``sim run``'s numbers carry their error bands wherever they are shown again: the
report's summary table (each predicted headline value with its ± and, in its tooltip and
below the table, the basis), ``export --format csv-summary`` (band columns after
``inferlab_source``) and ``--format vllm`` / ``--save-result`` (``inferlab_error_bands``,
by vLLM's keys), which ``sim run --trace`` still reads."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest

from inferlab.sim.engine.bands import headline_prediction, shown_pct

SIM = [sys.executable, "-m", "inferlab", "sim", "run", "--no-history", "-n", "40", "-c", "8",
       "--input-tokens", "uniform:100:400", "--output-tokens", "16"]


def inferlab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferlab", *args], capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bands")
    for name, seed in (("a", "1"), ("b", "2")):
        p = subprocess.run([*SIM, "--seed", seed, "-o", str(d / name)], capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, p.stderr
    return d


def recorded(run: Path) -> dict[str, dict[str, object]]:
    """The bands sim run wrote into the run's summary.json (what its console printed)."""
    return json.loads((run / "summary.json").read_text())["prediction"]["error_bands"]


def cell(html: str, row: str, column: int) -> tuple[str, str]:
    """(title, text) of the summary table's cell of ``row`` in run ``column`` (0-based)."""
    tr = re.search(rf"<tr><td>{re.escape(row)}</td>(.*?)</tr>", html)
    assert tr is not None, row
    cells = re.findall(r'<td(?: title="([^"]*)")?>([^<]*)</td>', tr.group(1))
    return unescape(cells[column][0]), unescape(cells[column][1])


def test_the_report_shows_each_predicted_headline_value_with_its_band_and_basis(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "ab.html"
    p = inferlab("report", str(runs / "a"), str(runs / "b"), "-o", str(out))
    assert p.returncode == 0, p.stderr
    html = out.read_text()
    for i, run in enumerate(("a", "b")):
        bands = recorded(runs / run)
        for row, key in (("TTFT p50 (ms)", "ttft_ms"), ("TPOT p50 (ms)", "tpot_ms"), ("E2E p50 (ms)", "e2e_ms"),
                         ("output tok/s (tok/s)", "output_token_throughput_tps")):
            title, text = cell(html, row, i)
            assert text.endswith(f" ±{shown_pct(float(bands[key]['pct']))} %") and title == bands[key]["text"], (row, text)
        for row in ("TTFT p99 (ms)", "TPOT p99 (ms)", "E2E p99 (ms)", "requests/s (req/s)"):
            title, text = cell(html, row, i)
            assert " ±" in text and "held-out" in title, (row, text, title)  # (p99s: validation's p99 bands)
        assert "p99s of" in cell(html, "TTFT p99 (ms)", i)[0]
        assert cell(html, "TTFT mean (ms)", i)[1].endswith("(not validated)")  # (no band is invented for it)
        assert not cell(html, "failed (%)", i)[1].endswith("%")
        # the basis in full below the table too (a printout has no tooltips)
        assert f"{run} (vllm, closed loop): TTFT p50 {bands['ttft_ms']['text']}" in unescape(html)


def test_csv_summary_carries_the_bands_in_columns_of_their_own(runs: Path) -> None:
    p = inferlab("export", str(runs / "a"), "--format", "csv-summary")
    assert p.returncode == 0, p.stderr
    rows = {r["metric"]: r for r in csv.DictReader(io.StringIO(p.stdout))}
    header = p.stdout.splitlines()[0].split(",")
    assert header[header.index("inferlab_source") + 1:] == ["inferlab_error_band_pct", "inferlab_error_band_basis",
                                                             "inferlab_error_band_p99_pct", "inferlab_error_band_p99_basis"]
    bands = recorded(runs / "a")
    for metric, key in (("ttft_ms", "ttft_ms"), ("tpot_ms", "tpot_ms"), ("e2e_ms", "e2e_ms"),
                        ("output_token_throughput_tps", "output_token_throughput_tps")):
        r = rows[metric]
        assert (float(r["inferlab_error_band_pct"]), r["inferlab_error_band_basis"]) == (bands[key]["pct"], bands[key]["text"])
    assert "p99s of" in rows["ttft_ms"]["inferlab_error_band_p99_basis"] and rows["ttft_ms"]["inferlab_error_band_p99_pct"]
    assert rows["request_throughput_rps"]["inferlab_error_band_pct"]
    assert rows["counts.completed"]["inferlab_error_band_pct"] == rows["counts.completed"]["inferlab_error_band_basis"] == ""


def test_the_vllm_export_carries_the_bands_by_vllms_keys_and_still_replays(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    p = inferlab("export", str(runs / "a"), "--format", "vllm", "-o", str(out))
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    bands = r["inferlab_error_bands"]
    rec = recorded(runs / "a")
    assert bands["median_ttft_ms"] == {"pct": rec["ttft_ms"]["pct"], "text": rec["ttft_ms"]["text"]}
    assert bands["output_throughput"]["text"] == rec["output_token_throughput_tps"]["text"]
    assert {"p99_ttft_ms", "median_tpot_ms", "p99_e2el_ms", "request_throughput"} <= set(bands)
    assert set(bands) <= set(r)  # (each names a key of vLLM's own)
    assert not any(k.startswith("inferlab_") and k.endswith("_ms") for k in r)  # (no new *_ms key for readers of vLLM's)
    p = subprocess.run([*SIM[:6], "--trace", str(out), "-o", str(tmp_path / "replay")], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    # what sim run --save-result writes carries them as the export does
    p = subprocess.run([*SIM, "--save-result", "--result-dir", str(tmp_path), "--result-filename", "s.json"],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "s.json").read_text())["inferlab_error_bands"]["median_ttft_ms"]["text"] == rec["ttft_ms"]["text"]


def test_a_run_keeps_the_bands_its_summary_recorded() -> None:
    """The report of an old run shows what sim run printed for it, not what today's
    bands file would say (the p99s, which the summary does not record, come from it)."""
    band = {"pct": 77.0, "rows": 5, "split": "holdout", "family": "vllm", "regime": "closed loop", "text": "±77 % on 5 rows"}
    pred = headline_prediction({"engine_family": "vllm", "regime": "closed loop",
                                "error_bands": {"ttft_ms": band, "output_token_throughput_tps": None}})
    assert pred is not None
    assert pred["error_bands"]["ttft_p50_ms"] == band
    assert pred["error_bands"]["output_tok_s"] is None and pred["error_bands"]["req_s"] is None
    assert "p99s of" in pred["error_bands"]["ttft_p99_ms"]["text"]


def test_a_sim_run_read_without_its_summary_says_its_bands_are_not_there(runs: Path, tmp_path: Path) -> None:
    """Recomputed from requests.jsonl, a sim run has no prediction block: the page says
    where its bands were, not that it ran over HTTP."""
    cut = tmp_path / "cut"
    cut.mkdir()
    for name in ("requests.jsonl", "config.json"):
        (cut / name).write_bytes((runs / "a" / name).read_bytes())
    out = tmp_path / "cut.html"
    p = inferlab("report", str(cut), "-o", str(out))
    assert p.returncode == 0, p.stderr
    html = unescape(out.read_text())
    assert "cut: no error bands: they are in the summary.json sim run wrote" in html and "over HTTP" not in html
