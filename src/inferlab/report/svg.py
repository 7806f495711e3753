"""Charts as inline SVG text: axes with round ticks, lines, points, steps and bars.

No JavaScript and no library: the report's plots are drawn here, once, as SVG markup
that any browser renders offline (docs/report.md has the measurements behind that
choice). Every drawn datum has the class ``mark`` and a ``<title>`` (the browser's
tooltip), so a test can count what was drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

WIDTH, HEIGHT = 640, 340
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 64, 16, 12, 44
#: Series colours (colour-blind safe, Okabe–Ito).
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
#: Most characters of a point's label drawn beside it.
LABEL_MAX = 32
#: A failed request's colour on the timeline; its bar is drawn at least FAILED_MIN_PX
#: wide (a request refused at once lasts no time, and at the 0.6 px of others it hid).
FAILED = "#cc3333"
FAILED_MIN_PX = 3.0
#: Sequential scale (low → high), viridis's anchors.
SEQUENTIAL = ("#440154", "#3b528b", "#21918c", "#5ec962", "#fde725")


@dataclass
class Series:
    """``kind``: ``line`` (points joined and marked), ``path`` (joined, unmarked),
    ``points``, ``step`` (a staircase: a CDF, a count over time) or ``dash`` (a dashed
    line, for a fit)."""

    name: str
    xy: list[tuple[float, float]]
    kind: str = "line"
    color: str | None = None
    titles: list[str] = field(default_factory=list)  # one tooltip per point (optional)
    labels: list[str] = field(default_factory=list)  # a short text beside each point (optional)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 2.5, 5 × 10^k steps)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    if ticks[-1] < hi:
        ticks.append(ticks[-1] + step)
    return ticks


def fmt_tick(v: float, step: float | None = None) -> str:
    """A tick or value label: short (12k, 1.5M), with as many decimals as ``step`` (the
    gap between ticks) needs to tell neighbours apart."""
    if step is not None:
        step = float(f"{step:.6g}")  # 17.06 - 17.05 is 0.0099999...
    if v == 0:
        return "0"
    if step is not None and 0 < step < 1e4 and step != int(step):
        decimals = max(0, -math.floor(math.log10(step)) + (0 if step * 10 ** -math.floor(math.log10(step)) in (1, 2, 5) else 1))
        return f"{v:,.{decimals}f}"
    if step is not None and step >= 1e4:
        return f"{v / 1e3:,g}k" if step < 1e6 else f"{v / 1e6:,g}M"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    if a >= 100 or v == int(v):
        return f"{v:,.0f}"
    return f"{v:.3g}"


def color_scale(t: float, anchors: Sequence[str] = SEQUENTIAL) -> str:
    """A colour for ``t`` in [0, 1] along ``anchors`` (interpolated in RGB)."""
    t = min(1.0, max(0.0, t))
    pos = t * (len(anchors) - 1)
    i = min(int(pos), len(anchors) - 2)
    f = pos - i
    a, b = anchors[i], anchors[i + 1]
    rgb = [round(int(a[k:k + 2], 16) * (1 - f) + int(b[k:k + 2], 16) * f) for k in (1, 3, 5)]
    return "#" + "".join(f"{c:02x}" for c in rgb)


class Frame:
    """Maps data to pixels for one chart and draws its axes."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float], *, xlabel: str, ylabel: str,
                 width: int = WIDTH, height: int = HEIGHT, ymin: float | None = 0.0, xmin: float | None = None) -> None:
        self.w, self.h = width, height
        xs = [x for x in xs if math.isfinite(x)] or [0.0, 1.0]
        ys = [y for y in ys if math.isfinite(y)] or [0.0, 1.0]
        self.xt = nice_ticks(min(xs) if xmin is None else min(xmin, *xs), max(xs))
        self.yt = nice_ticks(min(ys) if ymin is None else min(ymin, *ys), max(ys))
        self.xlabel, self.ylabel = xlabel, ylabel

    def x(self, v: float) -> float:
        lo, hi = self.xt[0], self.xt[-1]
        return MARGIN_L + (v - lo) / ((hi - lo) or 1) * (self.w - MARGIN_L - MARGIN_R)

    def y(self, v: float) -> float:
        lo, hi = self.yt[0], self.yt[-1]
        return self.h - MARGIN_B - (v - lo) / ((hi - lo) or 1) * (self.h - MARGIN_T - MARGIN_B)

    def axes(self) -> str:
        out = []
        x0, x1, y0, y1 = MARGIN_L, self.w - MARGIN_R, self.h - MARGIN_B, MARGIN_T
        for t in self.yt:
            py = self.y(t)
            out.append(f'<line class="grid" x1="{x0}" x2="{x1}" y1="{py:.1f}" y2="{py:.1f}"/>'
                       f'<text class="tick" x="{x0 - 6}" y="{py + 4:.1f}" text-anchor="end">{fmt_tick(t, self.yt[1] - self.yt[0])}</text>')
        for t in self.xt:
            px = self.x(t)
            out.append(f'<line class="grid" x1="{px:.1f}" x2="{px:.1f}" y1="{y0}" y2="{y1}"/>'
                       f'<text class="tick" x="{px:.1f}" y="{y0 + 16}" text-anchor="middle">{fmt_tick(t, self.xt[1] - self.xt[0])}</text>')
        out.append(f'<line class="axis" x1="{x0}" x2="{x1}" y1="{y0}" y2="{y0}"/><line class="axis" x1="{x0}" x2="{x0}" y1="{y0}" y2="{y1}"/>')
        out.append(f'<text class="label" x="{(x0 + x1) / 2:.0f}" y="{self.h - 6}" text-anchor="middle">{escape(self.xlabel)}</text>')
        out.append(f'<text class="label" transform="translate(14 {(y0 + y1) / 2:.0f}) rotate(-90)" text-anchor="middle">{escape(self.ylabel)}</text>')
        return "".join(out)


def svg(frame: Frame, body: str, title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {frame.w} {frame.h}" width="{frame.w}" height="{frame.h}" '
            f'role="img" aria-label="{escape(title)}">{frame.axes()}{body}</svg>')


def xy_chart(title: str, series: Sequence[Series], *, xlabel: str, ylabel: str, ymin: float | None = 0.0) -> str:
    """Lines, points and steps on shared axes, with a legend."""
    xs = [x for s in series for x, _ in s.xy]
    ys = [y for s in series for _, y in s.xy]
    f = Frame(xs, ys, xlabel=xlabel, ylabel=ylabel, ymin=ymin)
    body = []
    for i, s in enumerate(series):
        color = s.color or PALETTE[i % len(PALETTE)]
        pts = [(x, y) for x, y in s.xy if math.isfinite(x) and math.isfinite(y)]
        if not pts:
            continue
        name = escape(s.name)
        if s.kind in ("line", "path", "dash", "step"):
            coords = []
            for k, (x, y) in enumerate(pts):
                if s.kind == "step" and k:
                    coords.append(f"{f.x(x):.1f},{f.y(pts[k - 1][1]):.1f}")
                coords.append(f"{f.x(x):.1f},{f.y(y):.1f}")
            dash = ' stroke-dasharray="6 4"' if s.kind == "dash" else ""
            body.append(f'<polyline class="mark" fill="none" stroke="{color}" stroke-width="2"{dash} points="{" ".join(coords)}"><title>{name}</title></polyline>')
        if s.kind in ("line", "points"):
            r = 3 if s.kind == "line" else 2.5
            for k, (x, y) in enumerate(pts):
                tip = escape(s.titles[k]) if k < len(s.titles) else f"{name}: {fmt_tick(x)}, {fmt_tick(y)}"
                body.append(f'<circle class="mark" cx="{f.x(x):.1f}" cy="{f.y(y):.1f}" r="{r}" fill="{color}" fill-opacity="{0.9 if s.kind == "line" else 0.55}"><title>{tip}</title></circle>')
                if k < len(s.labels) and s.labels[k]:
                    # a long name cut (the tooltip has it whole); one that would pass the
                    # right edge (about 6 px a character) ends at the point, if more fits there
                    text = s.labels[k] if len(s.labels[k]) <= LABEL_MAX else s.labels[k][:LABEL_MAX - 1] + "…"
                    room_right, room_left = f.w - MARGIN_R - f.x(x), f.x(x) - MARGIN_L
                    right = 5 + 6 * len(text) > room_right and room_left > room_right
                    anchor = "end" if right else "start"
                    body.append(f'<text class="tick" x="{f.x(x) + (-5 if right else 5):.1f}" y="{f.y(y) - 5:.1f}" '
                                f'text-anchor="{anchor}">{escape(text)}</text>')
    legend = "".join(
        f'<span class="key"><i style="background:{s.color or PALETTE[i % len(PALETTE)]}"></i>{escape(s.name)}</span>'
        for i, s in enumerate(series)
    )
    return f'{svg(f, "".join(body), title)}<div class="legend">{legend}</div>'


@dataclass
class Bar:
    """One request in the timeline: segments (start, end, colour, what) on its row."""

    row: int
    segments: list[tuple[float, float, str, str]]
    title: str


def timeline_chart(title: str, bars: Sequence[Bar], *, xlabel: str, legend: str) -> str:
    rows = max((b.row for b in bars), default=0) + 1
    height = max(HEIGHT, min(900, MARGIN_T + MARGIN_B + rows * 3))
    xs = [e for b in bars for seg in b.segments for e in seg[:2]]
    f = Frame(xs, [0.0, float(rows)], xlabel=xlabel, ylabel="request (by send time)", height=height, xmin=0.0)
    band = (f.h - MARGIN_T - MARGIN_B) / max(rows, 1)
    body = []
    for b in bars:
        y = f.y(rows - b.row)  # first request on top
        for start, end, color, what in b.segments:
            w = max(f.x(end) - f.x(start), FAILED_MIN_PX if color == FAILED else 0.6)
            body.append(f'<rect class="mark" x="{f.x(start):.1f}" y="{y:.1f}" width="{w:.1f}" height="{max(band * 0.8, 0.8):.2f}" fill="{color}">'
                        f"<title>{escape(b.title)}: {escape(what)} {fmt_tick(start)}–{fmt_tick(end)}</title></rect>")
    return f'{svg(f, "".join(body), title)}<div class="legend">{legend}</div>'
