"""How to draw ``inferlab report``'s plots: inline SVG written by Python (what the report
does) next to the two usual JavaScript choices, plotly.js and uPlot, inlined into the
same kind of self-contained page, with the same data.

For each: the HTML file's size, the time headless Chromium takes from navigation start
until every chart is drawn (the load event for SVG; the charts' own promise or
constructor for the libraries), and what it adds to an install. Rounds are interleaved;
the medians and their ratios to SVG are printed.

    python bench/report_plotting.py --plotly-js plotly.min.js --uplot-js uPlot.iife.min.js --uplot-css uPlot.min.css

The library files are not in the repository (nothing here depends on them): get them
with ``pip install plotly`` (``plotly/package_data/plotly.min.js``) and ``npm pack uplot``
(``package/dist/``). A library not given is left out. Needs Chromium (``apt-get install
chromium``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from inferlab.report.browser import find_browser, open_page
from inferlab.report.html import Figure, Report, render
from inferlab.results.history import headline
from inferlab.results.sources import load_sweep

LEVELS = (1, 4, 16, 64)
#: Resolves when every chart is drawn: the page's own mark, else its load event.
DRAWN_JS = """new Promise(done => { const t0 = performance.getEntriesByType('navigation')[0];
  const check = () => { if (window.__drawn !== undefined) done(window.__drawn);
    else if (window.__drawn_pending) setTimeout(check, 5);
    else done(t0.loadEventEnd || performance.now()); }; check(); })"""


def make_sweep(d: Path, n: int) -> Path:
    procs = [subprocess.Popen([sys.executable, "-m", "inferlab", "sim", "run", "--no-history", "-n", str(n), "-c", str(c),
                               "--input-tokens", "uniform:200:3000", "--output-tokens", "128", "-o", str(d / f"c{c}")],
                              stdout=subprocess.DEVNULL) for c in LEVELS]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit("sim run failed")
    points = [{"dir": f"c{c}", "params": {"concurrency": c}, "repeat": 0, "status": "done",
               "headline": headline(json.loads((d / f"c{c}" / "summary.json").read_text()))} for c in LEVELS]
    (d / "sweep.json").write_text(json.dumps({"format": "inferlab.sweep/1", "command": "bench", "axes": {"concurrency": list(LEVELS)},
                                              "points": points, "groups": [], "goodput_search": None, "complete": True}))
    return d


def plotly_page(figs: list[Figure], js: str) -> str:
    divs, calls = [], []
    for i, f in enumerate(figs):
        traces: list[dict[str, Any]] = []
        if f.bars is not None:
            by_color: dict[str, dict[str, list[Any]]] = {}
            for b in f.bars:
                for start, end, color, _ in b.segments:
                    t = by_color.setdefault(color[:7] + ("a" if len(color) > 7 else ""), {"y": [], "x": [], "base": [], "c": []})
                    t["y"].append(b.row)
                    t["x"].append(end - start)
                    t["base"].append(start)
                    t["c"].append(color)
            traces = [{"type": "bar", "orientation": "h", "y": t["y"], "x": t["x"], "base": t["base"], "marker": {"color": t["c"]}} for t in by_color.values()]
        for s in f.series:
            mode = "markers" if s.kind == "points" else ("lines+markers" if s.kind == "line" else "lines")
            line = {"shape": "hv"} if s.kind == "step" else ({"dash": "dash"} if s.kind == "dash" else {})
            traces.append({"type": "scatter", "mode": mode, "name": s.name, "x": [x for x, _ in s.xy], "y": [y for _, y in s.xy], "line": line})
        divs.append(f'<div id="p{i}" style="width:640px;height:340px"></div>')
        layout = {"title": {"text": f.title}, "xaxis": {"title": {"text": f.xlabel}}, "yaxis": {"title": {"text": f.ylabel}}, "margin": {"t": 30}}
        calls.append(f"Plotly.newPlot('p{i}', {json.dumps(traces)}, {json.dumps(layout)}, {{staticPlot: false}})")
    script = f"window.__drawn_pending = true; Promise.all([{', '.join(calls)}]).then(() => {{ window.__drawn = performance.now(); }});"
    return f"<!DOCTYPE html><html><head><meta charset='utf-8'><script>{js}</script></head><body>{''.join(divs)}<script>{script}</script></body></html>"


def uplot_page(figs: list[Figure], js: str, css: str) -> str:
    divs, calls = [], []
    for i, f in enumerate(figs):
        if f.bars is not None or not f.series:
            continue  # uPlot draws no range bars without a plugin: the timeline is left out
        tables = []
        for s in f.series:
            pts = sorted(s.xy)
            tables.append([[x for x, _ in pts], [y for _, y in pts]])
        series = [{}] + [{"label": s.name, "stroke": "#0072B2", "points": {"show": s.kind in ("points", "line")},
                          **({"paths": "__stepped__"} if s.kind == "step" else {})} for s in f.series]
        opts = json.dumps({"title": f.title, "width": 640, "height": 340, "scales": {"x": {"time": False}}, "series": series})
        opts = opts.replace('"__stepped__"', "uPlot.paths.stepped({align: 1})")
        divs.append(f'<div id="u{i}"></div>')
        calls.append(f"new uPlot({opts}, uPlot.join({json.dumps(tables)}), document.getElementById('u{i}'));")
    script = "".join(calls) + "requestAnimationFrame(() => { window.__drawn = performance.now(); });"
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><style>{css}</style><script>{js}</script></head>"
            f"<body>{''.join(divs)}<script>window.__drawn_pending = true; {script}</script></body></html>")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plotly-js", type=Path)
    ap.add_argument("--uplot-js", type=Path)
    ap.add_argument("--uplot-css", type=Path)
    ap.add_argument("--requests", type=int, default=400, help="requests per sweep point (the timeline draws up to 400)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if (args.uplot_js is None) != (args.uplot_css is None):
        ap.error("uPlot needs both --uplot-js and --uplot-css")
    browser = find_browser()
    if browser is None:
        raise SystemExit("no Chromium (apt-get install chromium, or set INFERLAB_CHROMIUM)")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        sweep = load_sweep(make_sweep(d / "sweep", args.requests))
        report = Report("bench", [sweep])
        pages = {"inline SVG (inferlab)": render(report)}
        figs = report.figures
        extra = {"inline SVG (inferlab)": "0 (Python standard library)"}
        if args.plotly_js:
            pages["plotly.js"] = plotly_page(figs, args.plotly_js.read_text())
            extra["plotly.js"] = f"{args.plotly_js.stat().st_size / 1e6:.1f} MB of JS (the plotly wheel installs ~64 MB)"
        if args.uplot_js and args.uplot_css:
            pages["uPlot"] = uplot_page(figs, args.uplot_js.read_text(), args.uplot_css.read_text())
            extra["uPlot"] = f"{(args.uplot_js.stat().st_size + args.uplot_css.stat().st_size) / 1e3:.0f} kB of JS+CSS, vendored (no timeline)"
        paths = {}
        for k, (name, html) in enumerate(pages.items()):
            paths[name] = d / f"page{k}.html"
            paths[name].write_text(html)
        times: dict[str, list[float]] = {name: [] for name in pages}
        for r in range(args.rounds):
            order = list(pages)[r % len(pages):] + list(pages)[:r % len(pages)]
            for name in order:
                load = open_page(paths[name], [DRAWN_JS], browser=browser)
                if load.console_errors or load.exceptions:
                    raise SystemExit(f"{name}: {load.console_errors or load.exceptions}")
                times[name].append(float(load.values[0]))
    base_size = len(pages["inline SVG (inferlab)"].encode())
    base_ms = statistics.median(times["inline SVG (inferlab)"])
    print(f"{len(figs)} plots, {len(LEVELS)} sweep points x {args.requests} requests, {args.rounds} rounds, Chromium headless")
    print(f"{'drawing':<24}{'HTML bytes':>12}{'x SVG':>8}{'render ms (median)':>20}{'x SVG':>8}  install")
    for name, html in pages.items():
        size = len(html.encode())
        ms = statistics.median(times[name])
        print(f"{name:<24}{size:>12,}{size / base_size:>8.1f}{ms:>20.0f}{ms / base_ms:>8.2f}  {extra[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
