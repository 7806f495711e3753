"""``inferlab report``: one self-contained HTML file (styles inline, no script, nothing
fetched) of the plots people read a serving benchmark by.

Sources are run directories and sweep directories (``results.sources``). Across runs or
sweep points: latency against throughput and the Pareto front. For one run (the first
given; for a sweep, its knee point, else its highest-throughput point): TTFT against
prompt length with the fitted prefill line, output tokens/s and requests in flight
over time, the request timeline and, when present, the client's self-monitoring. CDFs
overlay every run. Each plot is a ``<figure class="plot" id=...>``.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from inferlab.report.compare import Comparison, Side, fmt, render_html_table
from inferlab.report.svg import (
    FAILED,
    PALETTE,
    Bar,
    Series,
    color_scale,
    timeline_chart,
    xy_chart,
)
from inferlab.report.sweep import COLUMNS as SWEEP_COLUMNS
from inferlab.report.sweep import (
    band_lines,
    band_pct,
    bands_full,
    bands_short,
    met_text,
    tune_text,
    unstopped_text,
)
from inferlab.results.compare import FAILED as FAILED_SHARE
from inferlab.results.compare import METRICS, Metric, summary_value
from inferlab.results.metrics import left_ns, request_metrics
from inferlab.results.provenance import (
    VIRTUAL,
    describe_software,
    http_server_info,
    simulated_engine,
)
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.results.sources import Run, Sweep
from inferlab.sim.engine.bands import HEADLINE_METRICS, headline_prediction, unvalidated_why

#: Most requests the timeline draws (the first ones sent); the heading says when cut.
TIMELINE_MAX = 400
#: Most points the TTFT-against-prompt-length scatter draws (the fit uses all).
SCATTER_MAX = 2000
#: Most steps the requests-in-flight line draws.
INFLIGHT_MAX = 800
#: Most steps a CDF line draws (every k-th request's value, and the last).
CDF_STEPS = 400
#: A series' name's ending, in a report of measured and predicted runs, for the predicted.
PREDICTED = " (prediction)"
#: Most points of several runs or sweep groups named beside them (more: in the tooltips).
NAMES_MAX = 6
#: Points in a time series.
TIME_BINS = 80
LOAD_AXES = ("concurrency", "rate", "request_rate", "max_concurrency")
RUNS_GROUP = "runs given"
#: The timeline's colour for time in the server's queue (when the server says).
SERVER_QUEUE = "#e8a0a0"
#: The time axis of the focus run's plots (``time_zero``).
XLABEL_TIME = "seconds since the first measured request"


@dataclass
class Figure:
    """One plot as data: ``series`` on x/y axes, or ``bars`` (the request timeline);
    ``body`` draws it (empty when there is nothing to draw)."""

    id: str
    title: str
    series: list[Series]
    xlabel: str = ""
    ylabel: str = ""
    note: str = ""
    bars: list[Bar] | None = None
    legend: str = ""  # HTML, for bars

    @property
    def body(self) -> str:
        if self.bars is not None:
            return timeline_chart("", self.bars, xlabel=self.xlabel, legend=self.legend) if self.bars else ""
        if not any(math.isfinite(x) and math.isfinite(y) for s in self.series for x, y in s.xy):
            return ""
        return xy_chart("", self.series, xlabel=self.xlabel, ylabel=self.ylabel)


@dataclass
class Point:
    """A run as a point on the curves: its group (the sweep parameters other than load),
    and for a sweep's point its parameters (None: a run given by itself)."""

    run: Run
    group: str
    load: float | None
    params: dict[str, Any] | None = None


@dataclass
class Report:
    title: str
    sources: list[Run | Sweep]
    gpus: int | None = None  # --gpus: GPUs behind the target, when the config cannot say
    figures: list[Figure] = field(default_factory=list)
    comparison: Comparison | None = None


def gpu_count(run: Run, override: int | None) -> tuple[int, str]:
    """GPUs serving ``run`` and where that number came from."""
    if override is not None:
        return override, "--gpus"
    engine = simulated_engine(run.config)
    if engine is not None and isinstance(engine.get("tensor_parallel_size"), int):
        pp = engine.get("pipeline_parallel_size") or 1
        dp = engine.get("data_parallel_size") or 1
        return int(engine["tensor_parallel_size"]) * int(pp) * int(dp), "the engine's tensor-parallel size"
    return 1, "assumed 1 (the run does not say; give --gpus N)"


def points_of(sources: Sequence[Run | Sweep]) -> list[Point]:
    out = []
    for src in sources:
        if isinstance(src, Sweep):
            axes = (src.index["load_axis"],) if isinstance(src.index.get("load_axis"), str) else LOAD_AXES
            for p in src.points:
                if p.run is None or p.status != "done":  # (a stopped point was cut short)
                    continue
                load = next((p.params[k] for k in axes if isinstance(p.params.get(k), (int, float))), None)
                group = " ".join(f"{k}={v}" for k, v in p.params.items() if k not in axes) or src.path.name
                out.append(Point(p.run, group, float(load) if load is not None else None, p.params))
        else:
            out.append(Point(src, RUNS_GROUP, None))
    return out


def focus_run(sources: Sequence[Run | Sweep]) -> tuple[Run | None, str]:
    """The run the single-run plots show, and why that one."""
    src = sources[0]
    if isinstance(src, Run):
        return src, src.label
    runs = src.runs
    if not runs:
        return None, ""
    for g in src.index.get("groups") or []:
        knee = (g.get("stopped") or {}).get("knee") if isinstance(g, dict) else None
        if knee is None:
            continue
        axis = g.get("load_axis") or src.index.get("load_axis")
        fixed = g.get("params") or {}
        for p in src.points:
            if p.run is None or p.status != "done" or any(p.params.get(k) != v for k, v in fixed.items()):
                continue
            if p.dir == knee or (axis is not None and p.params.get(axis) == knee) or (axis is None and knee in p.params.values()):
                return p.run, f"{p.run.label} (the sweep's knee)"
    search = src.index.get("goodput_search")
    for g in (search.get("groups") or []) if isinstance(search, dict) else []:
        best_dir = next((pr.get("dir") for pr in g.get("probes") or [] if pr.get("meets") and pr.get("rate") == g.get("max_rate")), None)
        for p in src.points:
            if p.run is not None and best_dir and p.dir == best_dir:
                return p.run, f"{p.run.label} (the highest rate meeting the SLOs)"
    tuned = (src.index.get("tune") or {}).get("best") if isinstance(src.index.get("tune"), dict) else None
    if isinstance(tuned, dict):
        for p in src.points:
            if p.run is not None and p.params == tuned.get("params"):
                return p.run, f"{p.run.label} (the tune's best)"
    best = max(runs, key=lambda r: _num(r.summary.get("output_token_throughput_tps")))
    return best, f"{best.label} (the sweep's highest output throughput)"


def _short(run: Run) -> str:
    """A point's label on a curve: its load (c=16, 4 req/s), else the run's name."""
    load = (run.config.get("load") or {}).get("schedule") or {}
    if load.get("kind") == "ClosedLoop" and load.get("concurrency") is not None:
        return f"c={load['concurrency']}"
    rate = load.get("rate_rps")
    if load.get("kind") == "OpenLoop" and rate is not None:
        return f"{rate:.3g} req/s" if isinstance(rate, (int, float)) else f"{rate} req/s"
    return run.label


def _values(point: Point) -> str:
    """A short name for a point among others: a sweep point's values (32/2048), else its
    run's label. Taken from the parameters the sweep recorded, never from a folder's
    name: the sweep names its folders 001_c32_in2048, and a name a person gave a folder
    ("vllm tp=2", "run-ms=256") is theirs to keep whole."""
    if not point.params:
        return point.run.label
    return "/".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in point.params.values())


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) else math.nan


def _dist(run: Run, key: str, stat: str) -> float:
    d = run.summary.get(key)
    return _num(d.get(stat)) if isinstance(d, dict) else math.nan


def curves(points: list[Point]) -> list[Figure]:
    """Latency against throughput across points, one line per group (ordered by load:
    past saturation throughput falls as load rises, and the line turns back)."""
    groups: dict[str, list[Point]] = {}
    for p in points:
        groups.setdefault(p.group, []).append(p)
    if len(groups) > 1 and all(len({q.load for q in ps}) == 1 for ps in groups.values()):
        groups = {RUNS_GROUP: points}  # no load axis (a tune over engine flags): points, unjoined
    many = len(groups) > 1
    if len({p.run.simulated for p in points}) > 1:  # measured and predicted: each its own series, named so
        groups = {f"{g}{kind}": sub for g, ps in groups.items() for kind, sub in _by_kind(ps)}
    figs = []
    for latency, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
        for xkey, xlabel, xid in (("output_token_throughput_tps", "output tokens/s", "tok"), ("request_throughput_rps", "requests/s", "req")):
            series = []
            for g, ps in groups.items():
                given = ps[0].group == RUNS_GROUP
                # repeats of one load level: one point, their mean (points drawn unjoined
                # are not levels of one load: each its own)
                levels: dict[object, list[Point]] = {}
                for p in ps:
                    levels.setdefault(p.load if p.load is not None and not given else id(p), []).append(p)
                # by load, those without one after them as given
                ordered = sorted(levels.values(), key=lambda qs: (qs[0].load is None, qs[0].load or 0.0))
                order = [[q.run for q in qs] for qs in ordered]
                for stat in ("p50", "p99"):
                    xy = [(statistics.fmean(_num(r.summary.get(xkey)) for r in rs), statistics.fmean(_dist(r, latency, stat) for r in rs)) for rs in order]
                    titles = [f"{rs[0].label}{f' (mean of {len(rs)} repeats)' if len(rs) > 1 else ''}: {x:,.1f} {xlabel}, {label} {stat} {y:,.1f} ms"
                              for rs, (x, y) in zip(order, xy, strict=True)]
                    kind = PREDICTED if g.endswith(PREDICTED) else ""
                    name = f"{label} {stat}" + (f" ({g.removesuffix(kind)})" if many else "") + kind
                    # runs given one by one are not a curve: points, unjoined
                    # runs given one by one: their names while few enough to read (else in the tooltips)
                    labels = ([_short(rs[0]) for rs in order] if not given else
                              [_values(qs[0]) for qs in ordered] if len(order) <= NAMES_MAX else []) if stat == "p99" else []
                    series.append(Series(name, xy, "points" if given else "line", titles=titles, labels=labels))
            figs.append(Figure(f"{latency.split('_')[0]}_vs_{xid}", f"{label} (ms) against {xlabel}", series, xlabel, f"{label} ms"))
    return figs


def _by_kind(points: list[Point]) -> list[tuple[str, list[Point]]]:
    """``points`` as (name suffix, points): the measured ones, then the predicted ones
    (their suffix ``PREDICTED``), each when there are any."""
    return [(kind, sub) for kind, sub in (("", [p for p in points if not p.run.simulated]),
                                          (PREDICTED, [p for p in points if p.run.simulated])) if sub]


def pareto(points: list[Point], gpus: int | None) -> Figure:
    """Output tokens/s per GPU (y) against tokens/s per user (x; 1000 / median TPOT: the
    decode speed one stream sees), as vLLM's ``plot_pareto`` and InferenceMAX draw it;
    the front joins the points no other beats on both."""
    xy, titles, labels, assumed = [], [], [], set()
    for p in points:
        n, why = gpu_count(p.run, gpus)
        assumed.add(f"{n} GPU{'s' if n > 1 else ''} ({why})")
        tpot = _dist(p.run, "tpot_ms", "p50")
        y = _num(p.run.summary.get("output_token_throughput_tps")) / n
        x = 1000 / tpot if tpot > 0 else math.nan
        xy.append((x, y))
        titles.append(f"{p.run.label}: {x:,.1f} tok/s/user, {y:,.0f} tok/s/GPU")
    # one sweep group's points differ by load alone; points of several runs or groups,
    # labelled by load, read alike ("c=16" three times): their names, while few enough
    if len({p.group for p in points}) == 1 and points[0].group != RUNS_GROUP:
        labels = [_short(p.run) for p in points]
    elif len(points) <= NAMES_MAX:
        labels = [_values(p) for p in points]
    front = pareto_front(xy)
    series = [Series("runs", xy, "points", titles=titles, labels=labels)]
    if len({p.run.simulated for p in points}) > 1:  # measured and predicted: a series each, named so
        at = {id(p): i for i, p in enumerate(points)}
        series = [Series(f"runs{kind}", [xy[i] for i in keep], "points", PALETTE[2] if kind else PALETTE[0],  # (not the front's)
                         titles=[titles[i] for i in keep], labels=[labels[i] for i in keep] if labels else [])
                  for kind, sub in _by_kind(points) for keep in [[at[id(p)] for p in sub]]]
    series.append(Series("Pareto front", front, "line", color="#D55E00"))
    return Figure("pareto", "Pareto front: tokens/s per GPU against tokens/s per user", series,
                  "tokens/s per user (1000 / TPOT p50)", "output tokens/s per GPU",
                  "GPUs: " + "; ".join(sorted(assumed)) + ". Per user: 1000 / median TPOT, the decode speed one stream sees.")


def pareto_front(xy: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both coordinates (higher is better), by x."""
    pts = [(x, y) for x, y in xy if math.isfinite(x) and math.isfinite(y)]
    return sorted({(x, y) for x, y in pts if not any(x2 >= x and y2 >= y and (x2, y2) != (x, y) for x2, y2 in pts)})


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """Least squares ``y = a + b·x``; None without two distinct x."""
    if len(xs) < 2 or len(set(xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b


def ttft_vs_input(run: Run) -> Figure:
    pts = []
    for r in run.records:
        m = request_metrics(r)
        if r.ok and m.ttft_ms is not None and r.input_tokens is not None:
            pts.append((float(r.input_tokens), m.ttft_ms))
    note = ""
    step = max(1, -(-len(pts) // SCATTER_MAX))  # every request up to SCATTER_MAX, else every step-th
    series = [Series("requests" if step == 1 else f"every {step}th of {len(pts):,} requests", pts[::step], "points")]
    fit = fit_line([x for x, _ in pts], [y for _, y in pts])  # over all of them
    if fit is not None:
        a, b = fit
        lo, hi = min(x for x, _ in pts), max(x for x, _ in pts)
        series.append(Series(f"fit: {a:,.1f} ms + {b * 1000:,.2f} ms per 1k tokens", [(lo, a + b * lo), (hi, a + b * hi)], "dash", color="#D55E00"))
        rate = f", a prefill rate of about {1000 / b:,.0f} tokens/s" if b > 0 else ""
        note = (f"Least-squares line: TTFT ≈ {a:,.1f} ms + {b * 1000:,.2f} ms per 1,000 prompt tokens{rate}. "
                "Under load, TTFT above the line is queueing and interference, not prefill.")
    else:
        note = "Every prompt had the same length: no line to fit (vary --input-tokens to see prefill cost)."
    return Figure("ttft_vs_input", f"TTFT against prompt length ({run.label})", series, "input tokens", "TTFT ms", note)


def failed_of(run: Run) -> list[RequestRecord]:
    """Its failed requests as the summary counts them (cancelled ones, in flight at an
    interruption, left out)."""
    return [r for r in run.records if not r.ok and r.error_kind is not ErrorKind.CANCELLED]


def error_kinds(run: Run) -> str:
    """Its failed requests by kind, most first ("timeout 35, http_status 20"), else "—"."""
    kinds = Counter(r.error_kind.value if r.error_kind else "no end recorded" for r in failed_of(run))
    return ", ".join(f"{kind} {n:,}" for kind, n in kinds.most_common()) or "—"


def cdfs(runs: Sequence[Run], focus: Run | None = None) -> list[Figure]:
    """One line per run, the first 8; the focus run always among them (the page says
    its plots show it)."""
    drawn = list(runs[:len(PALETTE)])
    cut = f" (first {len(drawn)} of {len(runs)} runs)" if len(runs) > len(drawn) else ""
    if focus is not None and cut and all(r is not focus for r in drawn):
        drawn[-1] = focus
        cut = f" (first {len(drawn) - 1} of {len(runs)} runs, and {focus.label})"
    mixed = len({r.simulated for r in drawn}) > 1
    # over completed requests: a run that failed its slowest reads faster, so say how many
    failed = sum(len(failed_of(r)) for r in drawn)
    ylabel = f"share of completed requests ({failed:,} failed left out)" if failed else "share of requests"
    figs = []
    for name, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E")):
        series, thinned = [], 0
        for run in drawn:
            xs = sorted(v for r in run.records if r.ok and (v := getattr(request_metrics(r), name)) is not None)
            if xs:
                step = max(1, len(xs) // CDF_STEPS)  # at most ~CDF_STEPS steps drawn
                thinned = max(thinned, step)
                keep = [*range(0, len(xs), step), len(xs) - 1]
                series.append(Series(run.label + (PREDICTED if mixed and run.simulated else ""),
                                     [(xs[i], (i + 1) / len(xs)) for i in sorted(set(keep))], "step"))
        note = (f"Each line is drawn from about {CDF_STEPS} of its values (one in {thinned} at most, and the largest): "
                "a step between two of them is not drawn." if thinned > 1 else "")
        figs.append(Figure(f"cdf_{name.split('_')[0]}", f"CDF of {label} (ms){cut}", series, f"{label} ms", ylabel, note))
    return figs


def time_zero(records: Sequence[RequestRecord]) -> int:
    """Where the focus run's plots over time start: its first measured send, or the
    earlier time one was due (the client sent it late; its grey bar starts there). The
    records' clock starts at the first warm-up send: from there, a run with warm-ups
    drew its measured requests from 16 s on."""
    return min((min(r.send_ns, r.intended_send_ns if r.intended_send_ns is not None else r.send_ns)
                for r in records if r.send_ns is not None), default=0)


def over_time(run: Run) -> list[Figure]:
    """Output tokens/s and requests in flight, on seconds since ``time_zero``."""
    done = [r for r in run.records if r.send_ns is not None]
    if not done:
        return [Figure("tokens_over_time", "Output tokens/s over time", []), Figure("inflight_over_time", "Requests in flight over time", [])]
    left = {id(r): left_ns(r, run.config) for r in done}
    end = max((left[id(r)] or r.send_ns or 0) for r in done)
    start = time_zero(done)
    width = max((end - start) / TIME_BINS, 1)
    tokens = [0.0] * TIME_BINS
    for r in done:
        if r.content_ns:
            per = (r.output_tokens or len(r.content_ns)) / len(r.content_ns)
            for t in r.content_ns:
                tokens[min(max(int((t - start) / width), 0), TIME_BINS - 1)] += per
    xs = [(i + 0.5) * width / 1e9 for i in range(TIME_BINS)]
    tok = Series("output tokens/s", [(x, v / (width / 1e9)) for x, v in zip(xs, tokens, strict=True)], "path")
    # at one instant arrivals count before departures: a request refused at once (an HTTP
    # 400, no byte) leaves at its send time, and counted first it took the level below 0
    events = sorted([(r.send_ns or 0, 0, 1) for r in done] + [(gone, 1, -1) for r in done if (gone := left[id(r)]) is not None])
    level, steps = 0, [(0.0, 0.0)]
    note = ""
    if len(events) <= INFLIGHT_MAX:  # every change
        for t, _, d in events:
            level += d
            steps.append(((t - start) / 1e9, float(max(level, 0))))
    else:  # the most in flight in each of INFLIGHT_MAX / 2 slices (a peak is never hidden)
        slices = INFLIGHT_MAX // 2
        slice_ns = max((end - start) / slices, 1)
        peaks = [0] * slices  # each slice starts at the level the one before ended with
        k_now = 0
        for t, _, d in events:
            k = min(max(int((t - start) / slice_ns), 0), slices - 1)
            while k_now < k:
                k_now += 1
                peaks[k_now] = level
            level += d
            peaks[k] = max(peaks[k], level)
        steps = [(k * slice_ns / 1e9, float(max(v, 0))) for k, v in enumerate(peaks)]
        note = (f"{len(events):,} sends and ends, more than the {INFLIGHT_MAX} drawn one by one: each step is the most "
                f"in flight in one of {slices} slices of {slice_ns / 1e9:,.3g} s (a peak is never hidden).")
    return [
        Figure("tokens_over_time", f"Output tokens/s over time ({run.label})", [tok], XLABEL_TIME, "output tokens/s"),
        Figure("inflight_over_time", f"Requests in flight over time ({run.label})", [Series("in flight", steps, "step")],
               XLABEL_TIME, "requests in flight", note),
    ]


def failed_text(r: RequestRecord) -> str:
    """A failed request's bar's hover text: why it failed."""
    return f"failed ({r.error_kind}): {r.error}" if r.error else f"failed ({r.error_kind})"


def timeline(run: Run) -> Figure:
    recs = sorted((r for r in run.records if r.send_ns is not None), key=lambda r: (r.send_ns or 0, r.index))
    cut = len(recs) > TIMELINE_MAX
    recs = recs[:TIMELINE_MAX]
    lengths = [r.input_tokens or r.requested_input_tokens or 0 for r in recs]
    lo, hi = (min(lengths), max(lengths)) if lengths else (0, 0)
    zero = time_zero(run.records)  # (over_time's)

    def at(ns: int) -> float:
        return (ns - zero) / 1e9

    bars = []
    for row, (r, n) in enumerate(zip(recs, lengths, strict=True)):
        color = color_scale((n - lo) / (hi - lo) if hi > lo else 0.5)
        send = at(r.send_ns or 0)
        segs = []
        if r.intended_send_ns is not None and (r.send_ns or 0) > r.intended_send_ns:
            segs.append((at(r.intended_send_ns), send, "#bbbbbb", "queued in the client"))
        first = at(r.content_ns[0]) if r.content_ns else None
        end = at(r.end_ns) if r.end_ns is not None else None
        if not r.ok and (gone := left_ns(r, run.config)) is not None:  # (drawn red from its last step on)
            end = at(gone)
        scheduled = (r.server_timeline or {}).get("scheduled_ms")
        if first is not None and isinstance(scheduled, (int, float)) and send < send + scheduled / 1e3 < first:
            # the simulated server said when the engine took the request up
            segs.append((send, send + scheduled / 1e3, SERVER_QUEUE, "in the server's queue (and its API front end)"))
            segs.append((send + scheduled / 1e3, first, color, "prefill"))
        elif first is not None:
            segs.append((send, first, color, "waiting for the first token (queue + prefill)"))
        if first is not None and end is not None:
            segs.append((first, end, FAILED if not r.ok else color + "66", failed_text(r) if not r.ok else "decoding"))
        elif end is not None:
            segs.append((send, end, FAILED if not r.ok else color, failed_text(r) if not r.ok else "no streamed token"))
        if segs:
            bars.append(Bar(row, segs, f"request {r.index}, {n:,} prompt tokens"))
    split = any(isinstance((r.server_timeline or {}).get("scheduled_ms"), (int, float)) for r in recs)
    legend = ('<span class="key"><i style="background:#bbbbbb"></i>queued in the client</span>'
              + (f'<span class="key"><i style="background:{SERVER_QUEUE}"></i>in the server\'s queue (its own timeline)</span>'
                 f'<span class="key"><i style="background:{color_scale(0.5)}"></i>prefill, solid</span>' if split else
                 f'<span class="key"><i style="background:{color_scale(0.5)}"></i>send → first token (queue + prefill), solid</span>')
              + f'<span class="key"><i style="background:{color_scale(0.5)}66"></i>decoding, faint</span>'
              f'<span class="key"><i style="background:linear-gradient(90deg,{color_scale(0)},{color_scale(1)})"></i>'
              f"prompt length {lo:,} → {hi:,} tokens</span>")
    if any(not r.ok for r in recs):
        legend += (f'<span class="key"><i style="background:{FAILED}"></i>failed: from its first token (or its send) to when '
                   "the client gave up; one that failed at once as a thin mark</span>")
    title = f"Request timeline ({run.label}{f', first {TIMELINE_MAX} of {len(run.records)}' if cut else ''})"
    return Figure("timeline", title, [], XLABEL_TIME, "request (by send time)", bars=bars, legend=legend,
                  note="One bar per request. A long solid part under load is waiting (queueing, or a large prefill ahead of it: head-of-line blocking).")


def client_figure(run: Run) -> Figure | None:
    client = run.summary.get("client")
    if not isinstance(client, dict) or not client.get("processes"):
        return None
    lag, cpu = [], []
    for p in client["processes"]:
        tl = p.get("timeline") or []
        name = str(p.get("role") or "process")
        lag.append(Series(f"{name}: loop lag (ms), max per second", [(float(i), _num(v[0])) for i, v in enumerate(tl)]))
        cpu.append(Series(f"{name}: CPU share ×100", [(float(i), _num(v[1]) * 100) for i, v in enumerate(tl)]))
    verdict = "the client was likely the bottleneck" if client.get("bottleneck") else "the client kept up"
    if client.get("bottleneck") is None:
        verdict = "no verdict on the client: the run was too short to tell"
    return Figure("client", f"The client watching itself: event-loop lag and CPU per second ({verdict})",
                  [*lag, *cpu], "second of the run", "ms / % of a core",
                  "Measured on this client, also against a simulated server. Loop lag is how late a 50 ms timer fired, "
                  "the largest in each second: what every timestamp taken then also waited. CPU share 100 = one core busy.")


def server_figure(run: Run) -> Figure | None:
    """The server's own gauges over the run, from its ``/metrics`` sampled each second
    (``server_metrics.jsonl``): requests running and waiting, KV-cache usage."""
    rows = run.server_series
    if not rows:
        return None
    series = []
    for key, label, scale in (("running", "running requests", 1.0), ("waiting", "waiting requests", 1.0),
                              ("kv_usage", "KV cache used (%)", 100.0)):
        xy = [(_num(r.get("t_s")), _num(r.get(key)) * scale) for r in rows if isinstance(r.get(key), (int, float))]
        if xy:
            series.append(Series(label, xy, "path"))
    return Figure("server_metrics", f"The server's own gauges over time ({run.label}; its /metrics, sampled each second)",
                  series, "seconds since the run started", "requests / % of the KV cache",
                  "What the server said of itself while the run went on: a waiting queue that grows, or a KV cache near 100 %, is where latency comes from.")


#: The parts of a request's latency ``summary.json``'s ``latency_breakdown`` splits it into.
BREAKDOWN_PARTS = (("client_queue_ms", "client send lag (sent late)"), ("server_queue_ms", "server queue"),
                   ("prefill_ms", "prefill"), ("decode_ms", "decode"), ("other_ms", "the rest (network, API)"))


def breakdown_table(run: Run) -> str:
    """Where a request's time went (``latency_breakdown``), or nothing without one."""
    b = run.summary.get("latency_breakdown")
    if not isinstance(b, dict):
        return ""
    rows = []
    for key, label in BREAKDOWN_PARTS:
        d = b.get(key)
        if isinstance(d, dict):
            cells = "".join(f"<td>{fmt(d.get(stat), 'ms')}</td>" for stat in ("mean", "p50", "p90"))
            rows.append(f"<tr><td>{escape(label)}</td>{cells}</tr>")
    if not rows:
        return ""
    return (f"<h2>Where the time went ({escape(run.label)}){PREDICTED if run.simulated else ''}</h2>"
            f"<p>From {escape(str(b.get('source') or '?'))}.</p>"
            f'<table class="summary"><tr><th>part (ms)</th><th>mean</th><th>p50</th><th>p90</th></tr>{"".join(rows)}</table>')


def profile_section(sweep: Sweep) -> str:
    """A profile's table: each factor, what it costs on this server, and the evidence."""
    data = sweep.index.get("profile") or {}
    rows = []
    for f in data.get("factors") or []:
        if not isinstance(f, dict):
            continue
        cost = str(f.get("cost") or "")
        if not f.get("measured", True) and not cost.startswith("not measured"):
            cost = f"not measured: {cost}"
        rows.append(f"<tr><td>{escape(str(f.get('title') or f.get('name')))}</td><td>{escape(cost)}</td>"
                    f"<td>{escape(str(f.get('evidence') or ''))}</td></tr>")
    url, engine = data.get("url"), data.get("engine")
    server = http_server_info(None if url is None else str(url), engine if isinstance(engine, dict) else None,
                              describe_software(data.get("server_software")))
    where, cost = server.label, "predicted cost here" if server.simulated else "measured cost here"
    return (f"<h2>Profile: {escape(str(sweep.path))}</h2><p>Server: {escape(str(where))}; model {escape(str(data.get('model')))}; "
            f"{_cell(_num(data.get('elapsed_s')), ',.0f')} s of a {_cell(_num(data.get('budget_s')), ',.0f')} s budget.</p>"
            f'<table class="profile"><tr><th>factor</th><th>{cost}</th><th>evidence</th></tr>{"".join(rows)}</table>')


def _cell(v: float, spec: str) -> str:
    """A number for a table cell, "—" for none (NaN was printed "nan")."""
    return format(v, spec) if math.isfinite(v) else "—"


def summary_table(runs: Sequence[Run]) -> str:
    head = "".join(f"<th>{escape(r.label)}{' (prediction)' if r.simulated else ''}</th>" for r in runs)
    rows = []
    counts = [r.summary.get("counts") or {} for r in runs]
    rows.append("<tr><td>requests completed / failed</td>" + "".join(f"<td>{c.get('completed', '?')} / {c.get('failed', '?')}</td>" for c in counts) + "</tr>")
    if any(failed_of(r) for r in runs):
        rows.append("<tr><td>failed, by kind</td>" + "".join(f"<td>{escape(error_kinds(r))}</td>" for r in runs) + "</tr>")
    rows.append("<tr><td>duration (s)</td>" + "".join(f"<td>{_cell(_num(r.summary.get('duration_s')), ',.2f')}</td>" for r in runs) + "</tr>")
    bands = [headline_prediction(r.summary.get("prediction")) for r in runs]
    for m in METRICS:
        rows.append(f"<tr><td>{escape(m.label)} ({m.unit})</td>" + "".join(
            _value_cell(fmt(summary_value(r.summary, m), m.unit), r, pred, m) for r, pred in zip(runs, bands, strict=True)) + "</tr>")
    for key, label, unit in (("itl_ms", "ITL p50", "ms"), ("queue_delay_ms", "client send lag p99", "ms")):
        stat = "p99" if "queue" in key else "p50"
        rows.append(f"<tr><td>{label} ({unit})</td>" + "".join(f"<td>{fmt(_dist(r, key, stat), unit)}</td>" for r in runs) + "</tr>")
    rows.append("<tr><td>output tokens/min (TPM)</td>" + "".join(f"<td>{_cell(_num(r.summary.get('output_tpm')), ',.0f')}</td>" for r in runs) + "</tr>")
    return f'<table class="summary"><tr><th>metric (unit)</th>{head}</tr>{"".join(rows)}</table>' + _bands_note(runs, bands)


def _band_key(m: Metric) -> str | None:
    """``m``'s key among a prediction's headline bands (``HEADLINE_METRICS``: output
    tok/s, req/s, the p50s and p99s); None for one never validated (TTFT mean, failed)."""
    key = m.name if m.stat is None else f"{m.name}_ms"
    return key if key in HEADLINE_METRICS else None


def _value_cell(text: str, run: Run, pred: dict[str, Any] | None, m: Metric) -> str:
    """A summary cell; a prediction's with its error band beside it ('30.90 ±8 %', its
    basis in the tooltip), or '(not validated)' with why."""
    if pred is None or m is FAILED_SHARE or text == "—":
        return f"<td>{text}</td>"
    key = _band_key(m)
    band = (pred.get("error_bands") or {}).get(key) if key else None
    if band:
        return f'<td title="{escape(band["text"])}">{text} {band_pct(band)}</td>'
    why = unvalidated_why(run.summary["prediction"]) if key else "not validated: validation compares medians, p99s and throughput"
    return f'<td title="{escape(why)}">{text} (not validated)</td>'


def _bands_note(runs: Sequence[Run], bands: Sequence[dict[str, Any] | None]) -> str:
    """Below the summary table: what the ± beside a prediction is, each predicted run's
    bands in full, and the predicted runs that have none (over HTTP: real time)."""
    lines = [f"{r.label} ({pred.get('engine_family')}, {pred.get('regime')}): "
             + "; ".join(bands_full(pred, unvalidated_why(r.summary["prediction"])))
             for r, pred in zip(runs, bands, strict=True) if pred is not None]
    lines += [f"{r.label}: " + (
        "no error bands: they are in the summary.json sim run wrote, and this one was recomputed from requests.jsonl"
        if r.server.kind == VIRTUAL else "a prediction over HTTP against inferlab's simulated server: no error bands (they "
        "are the simulator's validation error in virtual time)") for r, pred in zip(runs, bands, strict=True) if pred is None and r.simulated]
    if not lines:
        return ""
    return ("<p>± beside a prediction: the simulator's validation error for its engine family in the run's load regime "
            "(median |error| over published measurements, docs/validation.md); hover a value for its basis.</p>"
            "<ul>" + "".join(f"<li>{escape(line)}</li>" for line in lines) + "</ul>")


def sweep_section(sweep: Sweep) -> str:
    """The sweep's index: every point with its status and headline, why each group
    stopped, the goodput search."""
    # (the console's columns and digits: req/s 0.18, not 0.2)
    cols = [(key, name + ("" if name.startswith(("out", "req")) else " ms"), digits) for name, key, digits in SWEEP_COLUMNS]
    raw = {str(p.get("dir")): p for p in sweep.index.get("points") or [] if isinstance(p, dict)}
    tune = sweep.index.get("tune") if isinstance(sweep.index.get("tune"), dict) else None
    best = (tune or {}).get("best")
    best = best if isinstance(best, dict) else {}
    # simulated: every number a prediction; in virtual time each point with its
    # validation error (over HTTP against the simulated server: none)
    target = sweep.index.get("target")
    virtual = isinstance(target, dict) and bool(target.get("virtual_time"))
    simulated = bool(sweep.index.get("prediction")) or any(r.simulated for r in sweep.runs)
    predicted = simulated and virtual
    rows = []
    for p in sweep.points:
        h = raw.get(p.dir, {}).get("headline") or {}
        cells = "".join(f"<td>{_cell(_num(h.get(k)), f',.{d}f')}</td>" for k, _, d in cols)
        if tune is not None:  # (what chose the best: each trial's score and its requests within the SLOs)
            score = raw.get(p.dir, {}).get("score")
            cells += (f"<td>{_cell(_num(score), ',.2f') if h and p.status == 'done' else '—'}</td>"
                      f"<td>{escape(met_text(raw.get(p.dir, {}))) if h else '—'}</td>")
        if predicted:
            pred = raw.get(p.dir, {}).get("prediction")
            cells += f"<td>{escape(bands_short(pred)) if isinstance(pred, dict) and h else '—'}</td>"
        params = escape(" ".join(f"{k}={v}" for k, v in p.params.items()))
        reason = raw.get(p.dir, {}).get("reason") if p.dir else None
        status = f"{p.status} ({reason})" if reason else p.status
        if tune is not None and best.get("params") == p.params and p.status == "done":
            status += " (the tune's best)"
        rows.append(f"<tr><td>{escape(p.dir or '—')}</td><td>{params}</td><td>{p.repeat}</td><td>{escape(status)}</td>{cells}</tr>")
    objective = {"goodput": "goodput req/s (objective)", "throughput": "objective: out tok/s within the SLO share"}
    head = ("<tr><th>dir</th><th>parameters</th><th>repeat</th><th>status</th>" + "".join(f"<th>{label}</th>" for _, label, _ in cols)
            + ("" if tune is None else f"<th>{escape(objective.get(str(tune.get('objective')), 'objective'))}</th>"
               "<th>requests within the SLOs</th>")
            + ("<th>prediction: validation error</th>" if predicted else "") + "</tr>")
    notes = []
    for g in sweep.index.get("groups") or []:
        stopped = g.get("stopped") if isinstance(g, dict) else None
        params = " ".join(f"{k}={v}" for k, v in (g.get("params") or {}).items()) or "the load axis"
        if isinstance(stopped, dict):
            notes.append(f"{params}: stopped at {stopped.get('at')} ({stopped.get('reason')}); knee {stopped.get('knee')}")
        elif isinstance(g, dict) and g.get("goodput") is None and sweep.index.get("complete"):  # (as the console says it)
            notes.append(f"{params}: {unstopped_text(sweep.index)}")
    search = sweep.index.get("goodput_search")
    for g in (search.get("groups") or []) if isinstance(search, dict) else []:
        params = " ".join(f"{k}={v}" for k, v in (g.get("params") or {}).items()) or "goodput search"
        found = g.get("max_rate")
        notes.append(f"{params}: the highest rate meeting the SLOs "
                     + (f"{found:.3g} req/s" if isinstance(found, (int, float)) else "not found")
                     + (f" (fails at {g['fails_at']:.3g} req/s)" if isinstance(g.get("fails_at"), (int, float)) else "")
                     + f", {len(g.get('probes') or [])} probes" + (f"; {g['note']}" if g.get("note") else ""))
    if sweep.index.get("complete") is False:
        notes.append("the sweep did not finish (interrupted): the points above are those it ran")
    out = [f"<h2>Sweep: {escape(str(sweep.path))} ({escape(str(sweep.index.get('command') or 'sweep'))})"
           + (" (prediction)" if simulated else "") + "</h2>"]
    if simulated and not virtual:
        out.append("<p>Run over HTTP against inferlab's simulated server: every number in this sweep is a "
                   "<b>prediction</b> of the simulator, not a measurement. No error bands: those are the simulator's "
                   "validation error in virtual time, and the real-time server adds a lateness of its own.</p>")
    if predicted:
        out.append("<p>Simulated in virtual time: every number in this sweep is a <b>prediction</b> of the simulator, "
                   "not a measurement. Error bands: the simulator's validation error for the engine family in each point's "
                   "load regime (median |error| over published measurements; docs/validation.md):</p>")
        lines = band_lines(sweep.index) or ["none recorded (a sweep.json written before points carried them)"]
        out.append("<ul>" + "".join(f"<li>{escape(line)}</li>" for line in lines) + "</ul>")
    if tune is not None:
        out.append(f"<p>Tune: {escape(tune_text(tune))}.</p>")
    out.append(f'<table class="sweep">{head}{"".join(rows)}</table>')
    if notes:
        out.append("<ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>")
    for key, label in (("goodput_search", "goodput search"), ("tune", "tune")):
        block = sweep.index.get(key)
        if block:
            out.append(f"<details open><summary>{label}</summary><pre>{escape(json.dumps(block, indent=2, default=str))}</pre></details>")
    return "".join(out)


def render(report: Report) -> str:
    points = points_of(report.sources)
    runs = [p.run for p in points]
    figs: list[Figure] = []
    if len(points) >= 2:
        figs += curves(points)
    if points:
        figs.append(pareto(points, report.gpus))
    focus, why = focus_run(report.sources)
    if focus is not None:
        figs.append(ttft_vs_input(focus))
    figs += cdfs(runs, focus)
    if focus is not None:
        figs += over_time(focus)
        figs.append(timeline(focus))
        client = client_figure(focus)
        if client is not None:
            figs.append(client)
        server = server_figure(focus)
        if server is not None:
            figs.append(server)
    report.figures = figs
    # each plot says when what it draws is the simulator's (its PNG, --png, stands alone):
    # the focus run's plots by that run, the others by every run they draw; the client's
    # own lag and CPU are measured on this machine, whatever server it ran against
    focus_ids = {"ttft_vs_input", "tokens_over_time", "inflight_over_time", "timeline", "server_metrics"}
    measured_ids = {"client"}
    drawn_sim = [r.simulated for r in runs]
    sections = []
    for f in figs:
        body = f.body or '<p class="empty">nothing to draw (no such values in this run)</p>'
        note = f'<figcaption>{escape(f.note)}</figcaption>' if f.note else ""
        of = [] if f.id in measured_ids else [focus.simulated] if focus is not None and f.id in focus_ids else drawn_sim
        label = " (prediction)" if of and all(of) else " (some runs are predictions)" if any(of) else ""
        sections.append(f'<figure class="plot{"" if f.body else " empty"}" id="{f.id}"><h3>{escape(f.title + label)}</h3>{body}{note}</figure>')
    warnings = [w for r in runs[:8] for w in (r.summary.get("warnings") or [])]
    simulated = any(r.simulated for r in runs)
    parts = [
        f"<h1>{escape(report.title)}</h1>",
        f'<p class="what">{len(runs)} run{"s" if len(runs) != 1 else ""} from {", ".join(escape(str(getattr(s, "path", ""))) for s in report.sources)}'
        + (". Simulated runs: every number is a <b>prediction</b> of the simulator, not a measurement." if simulated else ".")
        + (f" Single-run plots show {escape(why)}." if focus is not None and len(runs) > 1 else "") + "</p>",
        "<h2>Summary</h2>", summary_table(runs[:12]),
        *([f"<p>Table: first 12 of {len(runs)} runs.</p>"] if len(runs) > 12 else []),
    ]
    lines = [note for r in runs for note in r.notes]  # (a summary.json not the records': recomputed)
    if report.comparison is None:  # (its section says these of each run it compares)
        said = Comparison([Side(r.label, [r]) for r in runs[:12]])
        lines += [*said.failure_lines(), *said.cache_lines()]
    if lines:
        parts.append("<ul>" + "".join(f'<li class="worse">warning: {escape(line)}</li>' for line in lines) + "</ul>")
    for src in report.sources:
        if isinstance(src, Sweep):
            parts.append(profile_section(src) if "profile" in src.index else sweep_section(src))
    if focus is not None:
        parts.append(breakdown_table(focus))
    if report.comparison is not None:
        parts += ["<h2>Comparison</h2>", render_html_table(report.comparison)]
    parts += ["<h2>Plots</h2>", '<div class="plots">', *sections, "</div>"]
    if warnings:
        parts += ["<h2>Warnings</h2>", "<ul>" + "".join(f"<li>{escape(str(w))}</li>" for w in dict.fromkeys(warnings)) + "</ul>"]
    if focus is not None:
        parts += [f"<h2>Configuration ({escape(focus.label)})</h2>",
                  f"<pre>{escape(json.dumps(focus.config, indent=2, default=str))}</pre>"]
    return DOC.format(title=escape(report.title), style=STYLE, body="\n".join(parts), generator=GENERATOR, footer=FOOTER)


STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}h3{font-size:14px;margin:0 0 6px}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(600px,1fr));gap:18px;align-items:start}figure.plot{margin:0;padding:10px;border:1px solid #e3e3e3;border-radius:6px;background:#fff}
figcaption{max-width:640px;color:#555;font-size:12px;margin-top:4px}
svg{display:block;max-width:100%;height:auto}.grid{stroke:#eee}.axis{stroke:#888}.tick{font-size:11px;fill:#555}.label{font-size:12px;fill:#333}
.legend{font-size:12px;max-width:640px}.key{display:inline-block;max-width:100%;margin-right:12px;overflow-wrap:anywhere}.key i{display:inline-block;width:18px;height:10px;margin-right:4px;vertical-align:middle}
table{border-collapse:collapse;font-variant-numeric:tabular-nums}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}
table.profile td,table.profile th{text-align:left;vertical-align:top;max-width:560px}
.worse{color:#b00020}.better{color:#1b7f3b}pre{background:#f6f6f6;padding:8px;overflow:auto;max-height:480px;font-size:12px}
.empty{color:#888}.what{color:#444}
"""

#: The ``<meta name="generator">`` of a report, which ``is_report`` looks for.
GENERATOR = "inferlab report"
#: The last line of a report (also in those written before the generator tag).
FOOTER = "Made by inferlab report: one file, nothing fetched."


def is_report(path: Path) -> bool:
    """Whether the file at ``path`` is a report this command wrote (its generator tag
    near the start, or its footer at the end): ``-o`` replaces one without asking."""
    try:
        with path.open("rb") as f:
            head = f.read(2048)
            f.seek(max(0, f.seek(0, 2) - 2048))
            tail = f.read()
    except OSError:
        return False
    return f'<meta name="generator" content="{GENERATOR}">'.encode() in head or FOOTER.encode() in tail


DOC = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<meta name="generator" content="{generator}">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<title>{title}</title><style>{style}</style></head>
<body>
{body}
<p class="what">{footer}</p>
</body></html>
"""
