"""``inferlab report``: the HTML renders offline in headless Chromium with every plot
drawn, no console error and no request but the file itself; on sweeps, on runs, and on
a folder holding only a requests.jsonl."""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest

from inferlab.report.browser import find_browser, open_page
from inferlab.report.html import fit_line, gpu_count, pareto_front
from inferlab.results.history import headline
from inferlab.results.sources import Run

SIM = [sys.executable, "-m", "inferlab", "sim", "run", "--no-history", "--output-tokens", "32"]
#: Every plot a sweep's report has (the client plot needs a run against a server).
SWEEP_PLOTS = {"ttft_vs_tok", "ttft_vs_req", "tpot_vs_tok", "tpot_vs_req", "pareto", "ttft_vs_input",
               "cdf_ttft", "cdf_tpot", "cdf_e2e", "tokens_over_time", "inflight_over_time", "timeline"}
#: What the test asks the page: each plot's id and how many data marks it drew.
PLOTS_JS = "Array.from(document.querySelectorAll('figure.plot')).map(f => [f.id, f.querySelectorAll('.mark').length])"

browser = find_browser()
needs_browser = pytest.mark.skipif(
    browser is None, reason="no Chromium on this machine (Debian: apt-get install -y chromium; or set $INFERLAB_CHROMIUM)"
)


def inferlab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferlab", *args], capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A concurrency sweep as the sweep command leaves it: one run directory per point
    and a sweep.json by its contract (inferlab.sweep/1)."""
    d = tmp_path_factory.mktemp("sweep")
    levels = (1, 4, 16)
    procs = [subprocess.Popen([*SIM, "-n", "48", "-c", str(c), "--input-tokens", "uniform:200:3000", "-o", str(d / f"c{c}")]) for c in levels]
    for p in procs:
        assert p.wait(timeout=120) == 0
    points = [{"dir": f"c{c}", "params": {"concurrency": c}, "repeat": 0, "status": "done",
               "headline": headline(json.loads((d / f"c{c}" / "summary.json").read_text()))} for c in levels]
    points.append({"dir": "c64", "params": {"concurrency": 64}, "repeat": 0, "status": "skipped", "headline": None})
    (d / "sweep.json").write_text(json.dumps({
        "format": "inferlab.sweep/1", "command": "inferlab sweep -c 1,4,16,64", "axes": {"concurrency": [*levels, 64]},
        "points": points, "groups": [{"params": {}, "stopped": {"reason": "throughput rose < 5%", "at": 16, "knee": 4}}],
        "goodput_search": None, "complete": True,
    }))
    return d


def check_page(page: Path) -> dict[str, int]:
    """Open ``page``; assert it fetched nothing and logged no error; each plot's marks."""
    load = open_page(page, [PLOTS_JS], browser=browser)
    assert load.requests == [page.resolve().as_uri()]
    assert load.console_errors == [] and load.exceptions == []
    return dict(load.values[0])


@needs_browser
def test_a_sweep_report_renders_offline_with_every_plot_drawn(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    p = inferlab("report", str(sweep), "-o", str(out))
    assert p.returncode == 0, p.stderr
    plots = check_page(out)
    assert set(plots) == SWEEP_PLOTS
    assert all(n > 0 for n in plots.values()), plots
    assert plots["timeline"] >= 48  # a bar (at least one segment) per request of the focus run
    html = out.read_text()
    assert "prediction" in html and "concurrency=4 (the sweep&#x27;s knee)" in html
    assert "stopped at 16 (throughput rose &lt; 5%); knee 4" in html
    assert re.search(r"<td>c64</td><td>concurrency=64</td><td>0</td><td>skipped</td>", html)


@needs_browser
def test_a_bench_run_also_shows_the_client_and_two_runs_a_comparison(tmp_path: Path) -> None:
    run = tmp_path / "bench"
    p = inferlab("bench", "--no-history", "-n", "24", "-c", "4", "--input-tokens", "uniform:100:600", "--output-tokens", "16", "-o", str(run))
    assert p.returncode == 0, p.stderr
    other = tmp_path / "sim"
    assert subprocess.run([*SIM, "-n", "24", "-c", "4", "--input-tokens", "uniform:100:600", "-o", str(other)]).returncode == 0
    out = tmp_path / "r.html"
    p = inferlab("report", str(run), str(other), "-o", str(out), "--png", str(tmp_path / "png"))
    assert p.returncode == 0, p.stderr
    plots = check_page(out)
    assert plots["client"] > 0 and all(n > 0 for n in plots.values()), plots
    assert plots["server_metrics"] > 0  # the server's own gauges, from its /metrics
    html = out.read_text()
    assert "Where the time went (bench)" in html and "server queue" in html
    assert "<h2>Comparison</h2>" in html and ("within noise" in html or "beyond noise" in html)
    pngs = sorted(f.stem for f in (tmp_path / "png").iterdir())
    assert pngs == sorted(plots)
    assert all((tmp_path / "png" / f"{n}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in pngs)


def test_the_file_is_self_contained(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert inferlab("report", str(sweep), "-o", str(out)).returncode == 0
    html = out.read_text()
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)\s*=|@import|url\(""", html, re.I)
    # the only URL is SVG's namespace, an identifier no browser fetches
    assert set(re.findall(r"https?://[^\s\"'<]+", html)) == {"http://www.w3.org/2000/svg"}


@needs_browser
def test_a_folder_with_only_requests_jsonl_is_a_run(sweep: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(sweep / "c4" / "requests.jsonl", bare / "requests.jsonl")
    out = tmp_path / "bare.html"
    p = inferlab("report", str(bare), "-o", str(out))
    assert p.returncode == 0, p.stderr
    plots = check_page(out)
    assert plots["cdf_ttft"] > 0 and plots["timeline"] > 0
    # one GPU is assumed when nothing says, and the report says so
    assert "assumed 1" in out.read_text()


def failed_copy(run: Path, to: Path, config: dict[str, object] | None = None) -> Path:
    """``run``'s requests as if every one had failed (HTTP 500 before any token)."""
    to.mkdir()
    with (to / "requests.jsonl").open("w") as out:
        for line in (run / "requests.jsonl").read_text().splitlines():
            r = json.loads(line)
            r.update(ttfb_ns=None, content_ns=[], end_ns=r["send_ns"] + 10**6, status=500, error_kind="http_status",
                     error="boom", input_tokens=None, output_tokens=None, finish_reason=None, server_timeline=None)
            out.write(json.dumps(r) + "\n")
    if config is not None:
        (to / "config.json").write_text(json.dumps(config))
    return to


def test_runs_with_no_successful_request_still_make_a_report(sweep: Path, tmp_path: Path) -> None:
    failed = failed_copy(sweep / "c4", tmp_path / "failed")
    # a gateway's access log (config.json with "gateway") where every request failed
    log = failed_copy(sweep / "c4", tmp_path / "gwlog", {"gateway": {"upstreams": ["http://127.0.0.1:1"], "keys": ["alice"]}})
    for sources in ([failed], [log], [failed, sweep / "c1"]):
        out = tmp_path / "r.html"
        p = inferlab("report", *map(str, sources), "-o", str(out))
        assert p.returncode == 0, p.stderr
        assert "nothing to draw for" in p.stderr and "ttft_vs_input" in p.stderr
        if browser is not None:
            check_page(out)


def test_bad_sources_are_one_line_errors(tmp_path: Path) -> None:
    p = inferlab("report", str(tmp_path / "nope"), "-o", str(tmp_path / "x.html"))
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "nope" in p.stderr
    (tmp_path / "empty").mkdir()
    p = inferlab("report", str(tmp_path / "empty"), "-o", str(tmp_path / "x.html"))
    assert p.returncode == 2 and "requests.jsonl" in p.stderr
    (tmp_path / "badsweep").mkdir()
    (tmp_path / "badsweep" / "sweep.json").write_text('{"format": "other/9"}')
    p = inferlab("report", str(tmp_path / "badsweep"), "-o", str(tmp_path / "x.html"))
    assert p.returncode == 2 and "inferlab.sweep/1" in p.stderr


def test_an_output_in_a_folder_that_does_not_exist_is_refused_as_export_refuses(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "nonexistent" / "x.html"
    for args in (["report", str(sweep / "c1"), "-o", str(out)], ["export", str(sweep / "c1"), "--format", "csv-summary", "-o", str(out)]):
        p = inferlab(*args)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, (args, p.stderr)
        assert f"cannot write {out}: no folder {out.parent}" in p.stderr
        assert not out.parent.exists()


def test_png_without_a_browser_says_how_to_get_one(sweep: Path, tmp_path: Path) -> None:
    env = {**os.environ, "INFERLAB_CHROMIUM": str(tmp_path / "no-such-browser")}
    p = subprocess.run([sys.executable, "-m", "inferlab", "report", str(sweep / "c1"), "-o", str(tmp_path / "x.html"), "--png", str(tmp_path / "png")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2 and "chromium" in p.stderr.lower()


def test_fit_line() -> None:
    xs = [100.0, 200.0, 400.0, 800.0]
    a, b = fit_line(xs, [5 + 0.02 * x for x in xs]) or (0.0, 0.0)
    assert a == pytest.approx(5) and b == pytest.approx(0.02)
    assert fit_line([3.0, 3.0], [1.0, 2.0]) is None


@needs_browser
def test_the_check_sees_requests_errors_and_missing_marks(tmp_path: Path) -> None:
    """The harness itself: a page that fetches, logs an error and draws nothing is seen
    doing all three."""
    page = tmp_path / "bad.html"
    page.write_text('<html><body><img src="http://example.invalid/x.png"><script>console.error("boom")</script>'
                    '<figure class="plot" id="p"><svg></svg></figure></body></html>')
    load = open_page(page, [PLOTS_JS], browser=browser)
    assert "http://example.invalid/x.png" in load.requests
    assert any("boom" in e for e in load.console_errors)
    assert dict(load.values[0]) == {"p": 0}


def test_repeats_of_a_load_level_are_one_point_on_the_curves(tmp_path: Path) -> None:
    d = tmp_path / "sweep"
    runs = [(c, seed) for c in (1, 4) for seed in (1, 2)]
    procs = [subprocess.Popen([*SIM, "-n", "24", "-c", str(c), "--seed", str(seed), "--input-tokens", "uniform:200:800",
                               "-o", str(d / f"c{c}s{seed}")]) for c, seed in runs]
    for p in procs:
        assert p.wait(timeout=120) == 0
    points = [{"dir": f"c{c}s{seed}", "params": {"concurrency": c}, "repeat": seed - 1, "status": "done", "headline": None} for c, seed in runs]
    (d / "sweep.json").write_text(json.dumps({"format": "inferlab.sweep/1", "command": "x", "axes": {"concurrency": [1, 4]},
                                              "points": points, "groups": [], "goodput_search": None, "complete": False}))
    out = tmp_path / "r.html"
    assert inferlab("report", str(d), "-o", str(out)).returncode == 0
    html = out.read_text()
    figure = html.split('id="ttft_vs_tok"', 1)[1].split("</figure>", 1)[0]
    assert figure.count("<circle") == 4  # p50 and p99, one point per load level, not per repeat
    assert figure.count("mean of 2 repeats") == 4
    pareto = html.split('id="pareto"', 1)[1].split("</figure>", 1)[0]
    assert pareto.count("<circle") >= 4 + 1  # every run is a point; the front has at least one
    assert "did not finish" in html


def test_pareto_front_and_gpus() -> None:
    pts = [(1.0, 10.0), (2.0, 8.0), (1.5, 7.0), (3.0, 1.0), (0.5, 11.0), (float("nan"), 99.0)]
    assert pareto_front(pts) == [(0.5, 11.0), (1.0, 10.0), (2.0, 8.0), (3.0, 1.0)]  # (1.5, 7) is beaten by (2, 8)
    sim = Run(Path("x"), {}, [], {"command": "sim run", "engine": {"tensor_parallel_size": 4}})
    served = Run(Path("y"), {}, [], {"command": "bench", "resolved": {"engine": {"tensor_parallel_size": 2, "data_parallel_size": 2}}})
    other = Run(Path("z"), {}, [], {"command": "bench", "resolved": {"engine": None}})
    assert gpu_count(sim, None)[0] == 4 and gpu_count(served, None)[0] == 4
    assert gpu_count(other, None) == (1, "assumed 1 (the run does not say; give --gpus N)")
    assert gpu_count(other, 8) == (8, "--gpus")


def test_requests_in_flight_keep_their_peak_when_thinned() -> None:
    """1,000 requests sent 0.01 s apart, each in flight for 100 s: all 1,000 in flight from
    10 s to 100 s with no event in between. Thinned to INFLIGHT_MAX steps, the peak and
    the quiet plateau stay."""
    from inferlab.report.html import INFLIGHT_MAX, over_time
    from inferlab.results.records import RequestRecord

    recs = [RequestRecord(index=i, intended_send_ns=i * 10**7, send_ns=i * 10**7, ttfb_ns=i * 10**7 + 10**6,
                          content_ns=[i * 10**7 + 10**6], end_ns=i * 10**7 + 10**11, output_tokens=1) for i in range(1000)]
    run = Run(Path("r"), {}, recs, {})
    inflight = next(f for f in over_time(run) if f.id == "inflight_over_time")
    (series,) = inflight.series
    levels = [y for _, y in series.xy]
    assert len(levels) <= INFLIGHT_MAX and max(levels) == 1000
    plateau = [y for x, y in series.xy if 20 < x < 90]
    assert plateau and min(plateau) == 1000  # slices without an event keep the level


def test_failed_requests_leave_flight_and_show_red_on_the_timeline() -> None:
    """A failed request records no end. It had been left in flight for good (a run with
    29 failures of 40 at -c 8 drew 33 in flight, 29 at the end) and drawn on the
    timeline only up to its first token. Now it leaves when the client gave up: a total
    timeout at send + timeout_s, an idle one at its last byte + idle_timeout_s, any
    other failure at the last thing recorded of it; its bar ends there, red."""
    from inferlab.report.html import over_time, timeline
    from inferlab.results.records import ErrorKind, RequestRecord

    s = 10**9
    ok = RequestRecord(index=0, send_ns=0, ttfb_ns=s // 10, content_ns=[s // 10, s // 5], end_ns=s // 5, output_tokens=2)
    timed_out = RequestRecord(index=1, send_ns=0, ttfb_ns=s // 10, content_ns=[s // 10], error_kind=ErrorKind.TIMEOUT,
                              error="request took over 3 s")
    idle = RequestRecord(index=2, send_ns=s // 2, ttfb_ns=s, content_ns=[s], error_kind=ErrorKind.IDLE_TIMEOUT,
                         error="no data for 1 s")
    refused = RequestRecord(index=3, send_ns=s, status=400, error_kind=ErrorKind.HTTP_STATUS, error="HTTP 400: too long")
    run = Run(Path("r"), {}, [ok, timed_out, idle, refused], {"timeout_s": 3.0, "idle_timeout_s": 1.0})

    inflight = next(f for f in over_time(run) if f.id == "inflight_over_time")
    steps = inflight.series[0].xy
    assert steps[-1][1] == 0  # everything left by the end
    level_at = lambda t: [y for x, y in steps if x <= t][-1]  # noqa: E731
    # ok and timed_out from 0; ok leaves at 0.2 s, idle comes at 0.5 s and leaves at 1 + 1 s,
    # timed_out at 0 + 3 s; refused comes and goes at 1 s
    assert [level_at(t) for t in (0.1, 0.3, 0.6, 1.5, 2.5, 3.0)] == [2, 1, 2, 2, 1, 0]

    bars = {b.title.split(",")[0]: b.segments for b in timeline(run).bars}
    red = {k: [(a, b, what) for a, b, color, what in segs if color == "#cc3333"] for k, segs in bars.items()}
    assert red["request 0"] == []
    assert red["request 1"] == [(0.1, 3.0, "failed (timeout): request took over 3 s")]
    assert red["request 2"] == [(1.0, 2.0, "failed (idle_timeout): no data for 1 s")]
    assert red["request 3"] == [(1.0, 1.0, "failed (http_status): HTTP 400: too long")]


def test_a_goodput_search_focuses_on_the_highest_rate_meeting_the_slos(tmp_path: Path) -> None:
    """sweep.json as `inferlab sweep --find-max-rate` writes it: load_axis rate, the
    probes under goodput_search."""
    d = tmp_path / "search"
    rates = (2.0, 8.0, 5.5)
    procs = [subprocess.Popen([*SIM, "-n", "30", "--rate", str(r), "--input-tokens", "300", "-o", str(d / f"r{r}")]) for r in rates]
    for p in procs:
        assert p.wait(timeout=120) == 0
    probes = [{"rate": r, "share": 1.0 if r < 6 else 0.5, "meets": r < 6, "dir": f"r{r}"} for r in rates]
    search = {"slo": {"ttft_ms": 100.0}, "share": 0.9, "groups": [{"params": {}, "max_rate": 5.5, "fails_at": 8.0, "note": None, "probes": probes}]}
    points = [{"dir": f"r{r}", "params": {"rate": r}, "repeat": 0, "status": "done", "headline": None} for r in rates]
    (d / "sweep.json").write_text(json.dumps({"format": "inferlab.sweep/1", "command": "x", "axes": {"rate": [2.0]}, "load_axis": "rate",
                                              "points": points, "groups": [{"params": {}, "load_axis": "rate", "stopped": None}],
                                              "goodput_search": search, "complete": True}))
    out = tmp_path / "r.html"
    p = inferlab("report", str(d), "-o", str(out))
    assert p.returncode == 0, p.stderr
    html = out.read_text()
    assert "Single-run plots show rate=5.5 (the highest rate meeting the SLOs)" in html
    assert "the highest rate meeting the SLOs 5.5 req/s (fails at 8 req/s), 3 probes" in html
    assert "TTFT against prompt length (rate=5.5)" in html


@needs_browser
def test_the_report_of_an_inferlab_sweep_renders_with_every_plot_drawn(tmp_path: Path) -> None:
    """The issue's check, end to end: `inferlab sweep` (simulator, virtual time, stops at
    saturation by itself), then its report in Chromium."""
    out = tmp_path / "sweep"
    p = inferlab("sweep", "-c", "1,4,16,64", "-n", "64", "--input-tokens", "uniform:200:2000", "--output-tokens", "32", "-o", str(out))
    assert p.returncode == 0, p.stderr
    page = tmp_path / "report.html"
    p = inferlab("report", str(out), "-o", str(page))
    assert p.returncode == 0, p.stderr
    plots = check_page(page)
    assert set(plots) == SWEEP_PLOTS and all(n > 0 for n in plots.values()), plots
    assert "<h2>Sweep:" in page.read_text()


@needs_browser
def test_a_profile_shows_its_factor_table_and_its_runs(tmp_path: Path) -> None:
    prof = tmp_path / "profile"
    p = inferlab("profile", "--budget", "30s", "--factors", "prefill,decode", "-o", str(prof))
    assert p.returncode == 0, p.stderr
    factors = json.loads((prof / "profile.json").read_text())["factors"]
    out = tmp_path / "p.html"
    p = inferlab("report", str(prof), "-o", str(out))
    assert p.returncode == 0, p.stderr
    plots = check_page(out)
    assert plots["cdf_ttft"] > 0 and plots["timeline"] > 0
    html = out.read_text()
    assert f"<h2>Profile: {prof}</h2>" in html
    assert "<th>predicted cost here</th>" in html and "measured cost here" not in html
    for f in factors:  # each factor's row: its title and its cost, as profile.json says
        assert f"<td>{f['title']}</td>" in html.replace("&#x27;", "'")
    runs = sum(len(f["runs"]) for f in factors)
    assert runs > 0 and html.count("(prediction)</th>") == min(runs, 12)


def test_a_profiles_measured_server_is_named_with_what_it_said_it_is(tmp_path: Path) -> None:
    from inferlab.report.html import profile_section
    from inferlab.results.sources import Sweep

    data = {"schema": "inferlab.profile/1", "url": "http://gpu-box:8000/v1", "model": "m", "engine": None,
            "server_software": {"name": "vLLM", "version": "0.11.0", "source": "GET /version"},
            "elapsed_s": 10, "budget_s": 60, "factors": []}
    assert "Server: http://gpu-box:8000/v1 (vLLM 0.11.0); model m" in profile_section(Sweep(tmp_path, {"profile": data}))
    # a profile from before the record, or of a server that said nothing: the URL alone
    data.pop("server_software")
    assert "Server: http://gpu-box:8000/v1; model m" in profile_section(Sweep(tmp_path, {"profile": data}))


def test_a_sweep_report_says_which_groups_did_not_saturate(tmp_path: Path) -> None:
    """Two GPUs, one stopped by the saturation rules and one that never saturated: the
    report says both, as the console does (it named only the stopped one)."""
    out = tmp_path / "sw"
    p = inferlab("sweep", "--gpu", "H100,L40S", "-c", "1,4,16,64,256", "-n", "256", "-o", str(out))
    assert p.returncode == 0, p.stderr
    console = [line for line in p.stdout.splitlines() if line.startswith("gpu=")]
    page = tmp_path / "r.html"
    assert inferlab("report", str(out), "-o", str(page)).returncode == 0
    html = page.read_text()
    said = [line.split(":")[0] for line in console]
    assert any("did not saturate" in line for line in console) and any("stopped at" in line for line in console), console
    for line in console:
        label = line.split(":")[0]
        what = "did not saturate" if "did not saturate" in line else "stopped at"
        assert f"{label}: {what}" in html, (label, what)
    assert len(said) == 2


def test_each_plot_says_when_what_it_draws_is_a_prediction(tmp_path: Path) -> None:
    """A plot's PNG (--png) stands alone, away from the page's heading: each plot's title
    says "(prediction)" when all it draws is the simulator's, "(some runs are
    predictions)" when some is, and nothing for measured runs only."""
    sim = tmp_path / "sim"
    assert subprocess.run([*SIM, "-n", "12", "-c", "2", "--input-tokens", "200", "-o", str(sim)]).returncode == 0
    measured = tmp_path / "measured"  # (the same files, as bench writes a run against a server of its own)
    shutil.copytree(sim, measured)
    config = json.loads((measured / "config.json").read_text())
    config.pop("engine")
    config.pop("command", None)
    config["resolved"] = {"url": "http://127.0.0.1:8000/v1", "engine": None, "server_software": None}
    (measured / "config.json").write_text(json.dumps(config))
    summary = json.loads((measured / "summary.json").read_text())
    summary["config"] = config
    summary.pop("server", None)
    (measured / "summary.json").write_text(json.dumps(summary))

    def titles(*runs: Path) -> dict[str, str]:
        out = tmp_path / "r.html"
        p = inferlab("report", *map(str, runs), "-o", str(out))
        assert p.returncode == 0, p.stderr
        return dict(re.findall(r'<figure class="plot[^"]*" id="([a-z_]+)"><h3>([^<]*)</h3>', out.read_text()))

    only_sim = titles(sim)
    assert only_sim and all(t.endswith("(prediction)") for t in only_sim.values()), only_sim
    only_measured = titles(measured)
    assert not any("prediction" in t for t in only_measured.values()), only_measured
    mixed = titles(measured, sim)  # (the focus: the first, measured)
    assert mixed["cdf_ttft"].endswith("(some runs are predictions)") and "prediction" not in mixed["timeline"]


def test_a_request_refused_at_once_never_takes_in_flight_below_zero() -> None:
    """A request refused with no byte (HTTP 400, no ttfb) leaves at its send time; the
    events were sorted with its departure (t, -1) before its arrival (t, +1), and the line
    dipped to -1. At one instant arrivals count first."""
    from inferlab.report.html import over_time
    from inferlab.results.records import ErrorKind, RequestRecord

    s = 10**9
    refused = [RequestRecord(index=i, send_ns=i * s // 10, status=400, error_kind=ErrorKind.HTTP_STATUS, error="HTTP 400")
               for i in range(3)]
    ok = RequestRecord(index=3, send_ns=0, ttfb_ns=s // 2, content_ns=[s // 2, s], end_ns=s, output_tokens=2)
    run = Run(Path("r"), {}, [*refused, ok], {})
    (series,) = next(f for f in over_time(run) if f.id == "inflight_over_time").series
    # ok is in flight from 0 s to 1 s; each refused one comes and goes at its send (0,
    # 0.1, 0.2 s): up to 2 while one is counted, never below ok's 1 before 1 s
    assert series.xy == [(0.0, 0.0), (0.0, 1.0), (0.0, 2.0), (0.0, 1.0), (0.1, 2.0), (0.1, 1.0), (0.2, 2.0), (0.2, 1.0), (1.0, 0.0)]


def test_time_plots_start_at_the_first_measured_send_not_the_first_warm_up() -> None:
    """The records' clock starts at the first warm-up send: a run whose measured requests
    were sent from 16 s on drew them from 16 s on "seconds since the first send"."""
    from inferlab.report.html import over_time, timeline
    from inferlab.results.records import RequestRecord

    s = 10**9
    # measured requests sent 16 s to 17.5 s into the run's clock, each 2 s long
    recs = [RequestRecord(index=i, intended_send_ns=16 * s + i * s // 2, send_ns=16 * s + i * s // 2,
                          ttfb_ns=17 * s + i * s // 2, content_ns=[17 * s + i * s // 2, 18 * s + i * s // 2],
                          end_ns=18 * s + i * s // 2, output_tokens=2) for i in range(4)]
    run = Run(Path("r"), {}, recs, {})
    tokens, inflight = over_time(run)
    # the first send is at 0, the last end at 3.5 s after it
    assert [x for x, _ in inflight.series[0].xy] == [0.0, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
    xs = [x for x, _ in tokens.series[0].xy]
    assert 0 < xs[0] < 0.1 and 3.4 < xs[-1] < 3.5
    segments = [seg for b in timeline(run).bars for seg in b.segments]
    assert min(a for a, *_ in segments) == 0.0 and max(b for _, b, *_ in segments) == 3.5
    assert "first measured request" in inflight.xlabel and "first measured request" in timeline(run).xlabel
    # the first one due 0.1 s before the client sent it: its grey bar starts at 0, not below
    recs[0].intended_send_ns = 16 * s - s // 10
    first = timeline(run).bars[0].segments
    assert first[0][:3] == (0.0, 0.1, "#bbbbbb") and over_time(run)[1].series[0].xy[:2] == [(0.0, 0.0), (0.1, 1.0)]


def test_the_output_never_replaces_a_file_the_report_reads_nor_unasked_a_file_that_is_not_a_report(sweep: Path, tmp_path: Path) -> None:
    """-o wrote over any file: `report RUN -o RUN/requests.jsonl` replaced the run's own
    records with HTML."""
    run = tmp_path / "run"
    shutil.copytree(sweep / "c1", run)
    records = (run / "requests.jsonl").read_bytes()
    (tmp_path / "link.html").symlink_to(run / "requests.jsonl")
    for out, extra in ((run / "requests.jsonl", []), (run / "requests.jsonl", ["--overwrite"]), (tmp_path / "link.html", ["--overwrite"]),
                       (run / "summary.json", ["--overwrite"])):
        p = inferlab("report", str(run), "-o", str(out), *extra)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert "one of the files the report reads" in p.stderr
    assert (run / "requests.jsonl").read_bytes() == records
    # a sweep's point's file, reached through the sweep
    p = inferlab("report", str(sweep), "-o", str(sweep / "c4" / ".." / "c16" / "config.json"), "--overwrite")
    assert p.returncode == 2 and "one of the files the report reads" in p.stderr

    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    p = inferlab("report", str(run), "-o", str(notes))
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--overwrite" in p.stderr
    assert notes.read_text() == "mine\n"
    assert inferlab("report", str(run), "-o", str(notes), "--overwrite").returncode == 0
    assert notes.read_text().startswith("<!DOCTYPE html>")
    # a report is replaced without asking (report.html, the default, made again), also
    # one written before reports carried their generator tag (its last line says it)
    assert inferlab("report", str(run), "-o", str(notes)).returncode == 0
    old = tmp_path / "old.html"
    old.write_text("<!DOCTYPE html>\n<html><body>" + "x" * 5000 + '<p class="what">Made by inferlab report: one file, nothing fetched.</p>\n</body></html>\n')
    assert inferlab("report", str(run), "-o", str(old)).returncode == 0


def test_run_folders_named_with_an_equals_sign_keep_their_names(sweep: Path, tmp_path: Path) -> None:
    """A folder "vllm tp=2" was an internal error (IndexError: its label split on "=" word
    by word), and "run-ms=256" was labelled "256": a label is cut to its values only for
    a sweep's point, from the parameters its sweep.json records."""
    named = [tmp_path / "vllm tp=2", tmp_path / "run-ms=256"]
    for d, src in zip(named, ("c1", "c4"), strict=True):
        shutil.copytree(sweep / src, d)
    out = tmp_path / "r.html"
    p = inferlab("report", *map(str, named), "-o", str(out))
    assert p.returncode == 0, p.stderr
    html = out.read_text()
    for fig in ("ttft_vs_tok", "pareto"):
        drawn = html.split(f'id="{fig}"', 1)[1].split("</figure>", 1)[0]
        texts = re.findall(r'<text class="tick"[^>]*>([^<]*)</text>', drawn)
        assert [t for t in texts if not re.fullmatch(r"[\d,.]+[kM]?", t)] == ["vllm tp=2", "run-ms=256"], fig  # (not the ticks)


def _point(load: int, tok_s: float, ttft_p50: float, label: str = "", group: str = "input_tokens=512", sweep: bool = True) -> object:
    from inferlab.report.html import Point

    summary = {"output_token_throughput_tps": tok_s, "request_throughput_rps": tok_s / 100,
               "ttft_ms": {"p50": ttft_p50, "p99": 2 * ttft_p50}, "tpot_ms": {"p50": 10.0, "p99": 20.0}}
    config = {"load": {"schedule": {"kind": "ClosedLoop", "concurrency": load}}}
    point = Point(Run(Path(label or f"c{load}"), summary, [], config, label=label or f"c{load}"), group, float(load) if sweep else None)
    point.params = {"concurrency": load, "input_tokens": "512"} if sweep else None
    return point


def test_a_curve_joins_its_points_in_load_order_not_throughput_order() -> None:
    """Past saturation throughput falls as load rises: c=64 made less than c=16. The line
    went c=4, c=64, c=16 (by throughput); the docs say by load."""
    from inferlab.report.html import curves

    points = [_point(64, 1000.0, 750.0), _point(4, 500.0, 60.0), _point(16, 1700.0, 130.0),
              _point(4, 450.0, 200.0, group="input_tokens=2048"), _point(16, 1100.0, 420.0, group="input_tokens=2048")]
    ttft_vs_tok = next(f for f in curves(points) if f.id == "ttft_vs_tok")  # type: ignore[arg-type]
    lines = {s.name: s for s in ttft_vs_tok.series}
    assert lines["TTFT p50 (input_tokens=512)"].xy == [(500.0, 60.0), (1700.0, 130.0), (1000.0, 750.0)]
    assert lines["TTFT p99 (input_tokens=512)"].labels == ["c=4", "c=16", "c=64"]
    assert lines["TTFT p50 (input_tokens=2048)"].xy == [(450.0, 200.0), (1100.0, 420.0)]


def test_pareto_points_of_several_runs_are_named_not_all_c16() -> None:
    from inferlab.report.html import RUNS_GROUP, pareto

    given = [_point(16, t, 100.0, label=name, group=RUNS_GROUP, sweep=False) for name, t in (("vllm", 900.0), ("sglang", 1000.0), ("trt", 1100.0))]
    assert pareto(given, None).series[0].labels == ["vllm", "sglang", "trt"]  # type: ignore[arg-type]
    # two groups of a sweep: each point's values
    groups = [_point(4, 500.0, 60.0), _point(4, 450.0, 200.0, group="input_tokens=2048")]
    groups[1].params["input_tokens"] = "2048"  # type: ignore[attr-defined]
    assert pareto(groups, None).series[0].labels == ["4/512", "4/2048"]  # type: ignore[arg-type]
    # one group: its load
    one = [_point(4, 500.0, 60.0), _point(16, 1700.0, 130.0)]
    assert pareto(one, None).series[0].labels == ["c=4", "c=16"]  # type: ignore[arg-type]


def test_the_clients_own_measurements_are_never_titled_a_prediction() -> None:
    """A bench run against the simulated server is a prediction, but its client's loop lag
    and CPU were measured on the machine that ran it: the plot was titled "(prediction)"."""
    from inferlab.report.html import Report, render
    from inferlab.results.records import RequestRecord

    s = 10**9
    client = {"bottleneck": False, "processes": [{"role": "main", "timeline": [[1.5, 0.02], [0.7, 0.03]]}]}
    config = {"command": "bench", "resolved": {"url": "http://127.0.0.1:1/v1", "engine": {"tensor_parallel_size": 1}}}
    ok = RequestRecord(index=0, send_ns=0, ttfb_ns=s // 10, content_ns=[s // 10, s // 5], end_ns=s // 5, output_tokens=2, input_tokens=10)
    html = render(Report("t", [Run(Path("b"), {"client": client}, [ok], config, label="b")]))
    titles = dict(re.findall(r'<figure class="plot[^"]*" id="([a-z_]+)"><h3>([^<]*)</h3>', html))
    assert titles["timeline"].endswith("(prediction)")  # (the run itself is the simulator's)
    assert "prediction" not in titles["client"]
    drawn = html.split('id="client"', 1)[1].split("</figure>", 1)[0]
    assert "main: loop lag (ms), max per second" in drawn


def test_a_single_run_page_says_how_many_failed_and_why() -> None:
    """A run with 3 of 5 requests failed: the page said so only in the failed (%) row. Now
    compare's warning, the failures by kind, CDFs over "completed requests (3 failed left
    out)", and a legend entry and a visible mark on the timeline for a failure at once."""
    from inferlab.report.html import Report, render
    from inferlab.results.records import ErrorKind, RequestRecord

    s = 10**9
    ok = [RequestRecord(index=i, send_ns=i * s, ttfb_ns=i * s + s // 10, content_ns=[i * s + s // 10, i * s + s // 5],
                        end_ns=i * s + s // 5, output_tokens=2, input_tokens=10) for i in range(2)]
    refused = [RequestRecord(index=2 + i, send_ns=(2 + i) * s, status=400, error_kind=ErrorKind.HTTP_STATUS, error="HTTP 400: too long")
               for i in range(2)]
    timed_out = RequestRecord(index=4, send_ns=4 * s, ttfb_ns=4 * s + s // 10, content_ns=[4 * s + s // 10],
                              error_kind=ErrorKind.TIMEOUT, error="request took over 3 s")
    html = render(Report("t", [Run(Path("f"), {}, [*ok, *refused, timed_out], {"timeout_s": 3.0}, label="f")]))
    assert "warning: f: 3 of 5 requests failed; its latencies and tokens/s are over the 2 that completed" in html
    assert "<tr><td>failed, by kind</td><td>http_status 2, timeout 1</td></tr>" in html
    for cdf in ("cdf_ttft", "cdf_e2e"):
        assert "share of completed requests (3 failed left out)" in html.split(f'id="{cdf}"', 1)[1].split("</figure>", 1)[0]
    timeline = html.split('id="timeline"', 1)[1].split("</figure>", 1)[0]
    assert "#cc3333" in timeline.split('<div class="legend">', 1)[1] and "failed" in timeline.split('<div class="legend">', 1)[1]
    # the two refused at once last no time; drawn 3 px wide
    widths = [float(w) for w, what in re.findall(r'<rect class="mark" x="[^"]*" y="[^"]*" width="([^"]*)"[^>]*><title>([^<]*)</title>', timeline)
              if "HTTP 400" in what]
    assert len(widths) == 2 and min(widths) >= 3


def test_a_summary_json_that_is_not_the_records_is_recomputed_and_said(sweep: Path, tmp_path: Path) -> None:
    """summary.json was never checked against requests.jsonl: with the records emptied
    the table showed the summary's 48 requests; with summary.json {} it showed "? / ?"
    and nan beside 48 records."""
    lines = (sweep / "c4" / "requests.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    done = [r for r in records if r["error_kind"] is None and r["end_ns"] is not None]
    ttft_p50 = statistics.median((r["content_ns"][0] - r["send_ns"]) / 1e6 for r in done)

    def table(html: str) -> dict[str, str]:
        rows = re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td></tr>", html.split('<table class="summary">', 1)[1].split("</table>", 1)[0])
        return dict(rows)

    blank = tmp_path / "blank"
    shutil.copytree(sweep / "c4", blank)
    (blank / "summary.json").write_text("{}")
    out = tmp_path / "blank.html"
    assert inferlab("report", str(blank), "-o", str(out)).returncode == 0
    html = out.read_text()
    assert table(html)["requests completed / failed"] == f"{len(done)} / 0"
    shown = float(table(html)["TTFT p50 (ms)"].replace(",", ""))  # 2 decimals under 100 ms, 1 above
    assert shown == pytest.approx(ttft_p50, abs=0.01 if ttft_p50 < 100 else 0.1)
    assert f"summary.json has no request counts (requests.jsonl holds {len(records)}: {len(done)} completed, 0 failed)" in html

    emptied = tmp_path / "emptied"
    shutil.copytree(sweep / "c4", emptied)
    (emptied / "requests.jsonl").write_text("")
    out = tmp_path / "emptied.html"
    assert inferlab("report", str(emptied), "-o", str(out)).returncode == 0
    html = out.read_text()
    assert table(html)["requests completed / failed"] == "0 / 0"
    assert f"summary.json counts {len(records)} requests, {len(done)} completed, 0 failed; requests.jsonl holds 0, 0 completed, 0 failed" in html


def _runs(n: int, *, simulated: bool = False, prefix: str = "r", requests: int = 1) -> list[Run]:
    """``n`` runs of ``requests`` completed requests each, run i's TTFT (i + 1) × 10 ms."""
    from inferlab.results.records import RequestRecord

    config = {"command": "sim run", "engine": {"tensor_parallel_size": 1}} if simulated else {}
    runs = []
    for i in range(n):
        ttft = (i + 1) * 10**7
        recs = [RequestRecord(index=k, send_ns=k * 10**9, ttfb_ns=k * 10**9 + ttft + k, content_ns=[k * 10**9 + ttft + k, k * 10**9 + 2 * ttft],
                              end_ns=k * 10**9 + 2 * ttft, output_tokens=2, input_tokens=10) for k in range(requests)]
        summary = {"output_token_throughput_tps": float(i), "tpot_ms": {"p50": 10.0}, "ttft_ms": {"p50": 10.0 * (i + 1)}}
        runs.append(Run(Path(f"{prefix}{i}"), summary, recs, config, label=f"{prefix}{i}"))
    return runs


def _figure(html: str, fig: str) -> str:
    return html.split(f'id="{fig}"', 1)[1].split("</figure>", 1)[0]


def _legend(html: str, fig: str) -> list[str]:
    return re.findall(r'<span class="key"><i [^>]*></i>([^<]*)</span>', _figure(html, fig).split('<div class="legend">', 1)[1])


def test_the_cdfs_always_draw_the_focus_run() -> None:
    """A sweep of 10 points whose focus (the highest throughput) is the last: the CDFs,
    cut to the first 8 runs, left out the run the page says its plots show."""
    from inferlab.report.html import Report, render
    from inferlab.results.sources import Sweep, SweepPoint

    runs = _runs(10)
    sweep = Sweep(Path("s"), {"points": []}, [SweepPoint({"concurrency": i}, 0, "done", r, f"c{i}") for i, r in enumerate(runs)])
    html = render(Report("t", [sweep]))
    assert "Single-run plots show r9 (the sweep&#x27;s highest output throughput)" in html
    names = _legend(html, "cdf_ttft")
    assert names == ["r0", "r1", "r2", "r3", "r4", "r5", "r6", "r9"]
    assert "CDF of TTFT (ms) (first 7 of 10 runs, and r9)" in html


def test_the_page_says_where_lines_are_thinned() -> None:
    """The in-flight line over 800 sends and ends draws per-slice peaks, and a CDF over
    800 requests or more draws every k-th: the captions say so."""
    from inferlab.report.html import Report, render

    html = render(Report("t", _runs(1, requests=1000)))
    assert "2,000 sends and ends, more than the 800 drawn one by one: each step is the most in flight in one of 400 slices" in _figure(html, "inflight_over_time")
    assert "Each line is drawn from about 400 of its values (one in 2 at most, and the largest)" in _figure(html, "cdf_ttft")
    few = render(Report("t", _runs(1, requests=10)))
    assert "<figcaption>" not in _figure(few, "cdf_ttft") and "<figcaption>" not in _figure(few, "inflight_over_time")


def test_a_mixed_report_names_the_predicted_series() -> None:
    """Measured and simulated runs side by side: the plots' titles said "some runs are
    predictions", and no legend said which."""
    from inferlab.report.html import Report, render

    measured, sim = _runs(1, prefix="m")[0], _runs(1, simulated=True, prefix="s")[0]
    sim.summary["latency_breakdown"] = {"source": "the server's timeline", "prefill_ms": {"mean": 5.0, "p50": 5.0, "p90": 6.0}}
    html = render(Report("t", [measured, sim]))
    assert _legend(html, "cdf_ttft") == ["m0", "s0 (prediction)"]
    assert _legend(html, "pareto") == ["runs", "runs (prediction)", "Pareto front"]
    assert _legend(html, "ttft_vs_tok") == ["TTFT p50", "TTFT p99", "TTFT p50 (prediction)", "TTFT p99 (prediction)"]
    assert "(prediction)" not in "".join(_legend(render(Report("t", [measured, _runs(1, prefix="n")[0]])), "cdf_ttft"))
    # a simulated focus run's breakdown is the simulator's
    assert "<h2>Where the time went (s0) (prediction)</h2>" in render(Report("t", [sim, measured]))


def test_no_value_is_a_dash_not_nan_and_long_names_are_not_clipped(tmp_path: Path) -> None:
    """A run with no duration or TPM showed "nan" in the table; a long run name ran out of
    its plot's legend (one unbreakable line) and beside a point past the plot's edge."""
    from inferlab.report.html import Report, render

    long = "meta-llama_Llama-3.1-405B-Instruct-FP8-dynamic-tp8-pp2-maxnumseqs1024-chunked-prefill-8192-" * 2
    runs = _runs(2)
    runs[0].label = long
    runs[0].summary.update(duration_s=None, output_tpm=None)
    html = render(Report("t", runs))
    table = html.split('<table class="summary">', 1)[1].split("</table>", 1)[0]
    assert "nan" not in table
    assert "<tr><td>duration (s)</td><td>—</td>" in table and "<tr><td>output tokens/min (TPM)</td><td>—</td>" in table
    # beside its Pareto point: its first 31 characters and an ellipsis (the tooltip has it whole)
    assert f">{long[:31]}…</text>" in _figure(html, "pareto") and f"<title>{long}:" in _figure(html, "pareto")
    if browser is None:
        return
    page = tmp_path / "long.html"
    page.write_text(html)
    # every legend key within its plot's box
    out = open_page(page, ["Array.from(document.querySelectorAll('figure.plot')).flatMap(f => Array.from(f.querySelectorAll('.key'))"
                           ".map(k => [f.id, Math.round(k.getBoundingClientRect().right - f.getBoundingClientRect().right)]))"],
                    browser=browser)
    overflow = [(fig, px) for fig, px in out.values[0] if px > 0]
    assert out.values[0] and overflow == []


def _row(html: str, first_cell: str) -> list[str]:
    """The cells of the sweep table's row whose first cell starts with ``first_cell``."""
    row = re.search(rf"<tr><td>{re.escape(first_cell)}[^<]*</td>(.*?)</tr>", html)
    assert row is not None, first_cell
    return [first_cell, *re.findall(r"<td>(.*?)</td>", row.group(1))]


def test_a_tunes_report_shows_the_slos_and_each_trials_goodput_and_whether_it_met_them(tmp_path: Path) -> None:
    """The README's tune at a 400 ms TTFT SLO (the README's was 400 ms until the GEMMs' share of
    peak was fitted): the report named trial 0 "the tune's best", but goodput, the objective
    that chose it, was in no table and the SLOs only inside the command line; the fastest
    trial (the most tok/s, some of its requests over the SLOs) read as at least as good."""
    out = tmp_path / "tune1"
    p = inferlab("tune", "--param", "max-num-batched-tokens=256,512,1024,2048,4096,8192", "--param", "max-num-seqs=8,16,32,64,128,256",
                 "--rate", "12", "-n", "150", "--input-tokens", "2000", "--output-tokens", "200", "--slo-ttft-ms", "400",
                 "--slo-tpot-ms", "26", "-o", str(out), "--no-history")
    assert p.returncode == 0, p.stderr
    page = tmp_path / "tune.html"
    assert inferlab("report", str(out), "-o", str(page)).returncode == 0
    html = unescape(page.read_text())
    index = json.loads((out / "sweep.json").read_text())
    assert "SLOs, per request: TTFT ≤ 400 ms, TPOT ≤ 26 ms" in html and "objective goodput" in html
    head = re.search(r'<table class="sweep"><tr>(.*?)</tr>', html)
    assert head is not None
    columns = re.findall(r"<th>(.*?)</th>", head.group(1))
    goodput, within = columns.index("goodput req/s (objective)"), columns.index("requests within the SLOs")
    done = [pt for pt in index["points"] if pt["status"] == "done"]
    best = next(pt for pt in done if pt["params"] == index["tune"]["best"]["params"])
    fastest = max(done, key=lambda pt: pt["headline"]["output_tok_s"])
    assert fastest is not best  # (the case the review found)
    best_row, fastest_row = _row(html, best["dir"]), _row(html, fastest["dir"])
    assert best_row[3] == "done (the tune's best)" and fastest_row[3] == "done"
    assert float(best_row[goodput]) > float(fastest_row[goodput])  # the objective that chose it, in the table
    assert float(fastest_row[goodput]) < float(fastest_row[columns.index("req/s")])  # (its misses cost it goodput)
    assert best_row[within] == f"all {best['headline']['total']} requests"
    assert fastest_row[within].endswith("missed)")


def test_the_sweep_tables_req_s_has_the_consoles_digits(tmp_path: Path) -> None:
    """0.18 req/s was shown "0.2" (every column to one decimal); the console shows 0.19."""
    out = tmp_path / "sw"
    p = inferlab("sweep", "--rate", "0.18,0.36", "-n", "12", "--input-tokens", "100", "--output-tokens", "8", "-o", str(out), "--no-history")
    assert p.returncode == 0, p.stderr
    console = {cells[0]: cells[3] for line in p.stdout.splitlines() if line.startswith("│")
               for cells in [[c.strip() for c in line.strip("│").split("│")]]}
    page = tmp_path / "sw.html"
    assert inferlab("report", str(out), "-o", str(page)).returncode == 0
    html = page.read_text()
    index = json.loads((out / "sweep.json").read_text())
    for pt in index["points"]:
        cells = _row(html, pt["dir"])
        assert cells[5] == console[f"{pt['params']['rate']:g}"], (cells, console)  # (dir, params, repeat, status, out tok/s, req/s)
    assert "<td>0.2</td>" not in html


def test_the_clients_send_lag_has_the_consoles_name_in_the_report() -> None:
    """The console's "Client send lag" was the report's "client queue delay" and the
    breakdown's "client queue": one metric, three names."""
    from inferlab.report.html import Report, render

    run = _runs(1)[0]
    run.summary["latency_breakdown"] = {"source": "the server's timeline", "requests": 1,
                                        "client_queue_ms": {"mean": 1.0, "p50": 1.0, "p90": 1.0}}
    page = unescape(render(Report("t", [run])))
    assert "client send lag p99" in page and "client send lag (sent late)" in page
    assert "client queue" not in page
