"""``inferlab compare`` as a console table and as JSON: the runs side by side, each
metric's change against the first run and whether it exceeds run-to-run noise
(``inferlab.results.compare``)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from inferlab._errors import UsageError
from inferlab.results.compare import (
    MAX_BATCHES,
    METRICS,
    TAIL_MIN,
    Delta,
    compare,
    distribution_tests,
    estimate,
    verdict_words,
)
from inferlab.results.loaddiff import GATEWAY, Difference, engine_differences, load_differences
from inferlab.results.metrics import connect_wait_ms, percentile, request_metrics
from inferlab.results.provenance import PREDICTION, VIRTUAL, simulated_engine
from inferlab.results.records import ErrorKind
from inferlab.results.sentdiff import sent_differences
from inferlab.results.sources import Run, Sweep, load
from inferlab.results.summary import response_cache_share, unfit_to_compare


@dataclass
class Side:
    """One thing compared: a run, or the repeats of one sweep point."""

    label: str
    runs: list[Run]

    @property
    def simulated(self) -> bool:
        return any(r.simulated for r in self.runs)

    @property
    def cache_hits(self) -> tuple[int, int]:
        """(completed requests a response cache answered, completed requests), over its
        runs, warm-up left out: the cache's latency is not the server's."""
        done = [r for run in self.runs for r in run.records if r.ok and not r.warmup]
        return sum(1 for r in done if r.response_cache_hit), len(done)

    def describe(self) -> str:
        run = self.runs[0]
        cfg = run.config
        engine = simulated_engine(cfg) or {}
        model = engine.get("model") or (cfg.get("resolved") or {}).get("model") or "?"
        # a simulated engine's family and card: runs on other engines look alike otherwise
        where = (f" ({engine.get('engine_family', 'vllm')} on {engine.get('tensor_parallel_size', 1)}x "
                 f"{engine.get('gpu_preset') or engine.get('gpu')})" if engine.get("gpu") else "")
        reps = f", {len(self.runs)} repeats" if len(self.runs) > 1 else ""
        kind = f" {PREDICTION}" if self.simulated else ""
        failed = sum(1 for r in run.records if not r.ok and r.error_kind is not ErrorKind.CANCELLED)
        return (f"{self.label}: {model}{where} @ {run.server.where}{reps}, {len(run.records)} requests"
                f"{f' ({failed} failed)' if failed else ''}{kind}")

    @property
    def caveats(self) -> list[str]:
        """What its runs' own summaries warn makes their numbers unfit to set against
        another run's (``unfit_to_compare``: a cache an earlier run filled, the client as
        the bottleneck, answers cut short); a repeat's prefixed with its number."""
        many = len(self.runs) > 1
        return [f"repeat {i + 1}: {w}" if many else w for i, r in enumerate(self.runs) for w in unfit_to_compare(r.summary)]

    @property
    def connect_recorded(self) -> bool | None:
        """Whether its records measure new connections' set-up (``connect_wait_ns``, and
        with it a ``send_ns`` stamped before a connection was taken): False for records
        written before they did (``send_ns`` stamped once a connection was had); None
        where that does not apply (virtual time: no connection; a gateway's access log:
        its ``send_ns`` is a request's arrival, on its client's connection; nothing sent)."""
        if any(r.server.kind == VIRTUAL or "gateway" in r.config for r in self.runs):
            return None
        sent = [r for run in self.runs for r in run.records if not r.warmup and r.send_ns is not None]
        return None if not sent else any(r.connect_wait_ns is not None for r in sent)

    def connect_waits(self) -> ConnectWaits | None:
        """Its completed requests' waits for a new connection (None where none measured one)."""
        done = [r for run in self.runs for r in run.records if r.ok and not r.warmup]
        waits = sorted(w for w in map(connect_wait_ms, done) if w is not None)
        if not waits:
            return None
        ttfts = [t for r in done if (t := request_metrics(r).ttft_ms) is not None]
        return ConnectWaits(len(waits), sum(1 for w in waits if w > 0), sum(waits) / len(waits), percentile(waits, 99),
                            sum(ttfts) / len(ttfts) if ttfts else None)

    @property
    def failures(self) -> tuple[int, int]:
        """(failed requests, failed and completed ones) over its runs, warm-up and
        cancelled ones left out (as the ``failed`` metric counts them)."""
        ended = [r for run in self.runs for r in run.records
                 if not r.warmup and r.error_kind is not ErrorKind.CANCELLED and (r.ok or r.error_kind is not None)]
        return sum(1 for r in ended if not r.ok), len(ended)


@dataclass(frozen=True)
class ConnectWaits:
    """A side's completed requests' waits for new connections: ``requests`` that measured
    one, ``opened`` those that waited for one (over 0), the waits' ``mean_ms`` and
    ``p99_ms`` over all of them, and the TTFT mean they are part of."""

    requests: int
    opened: int
    mean_ms: float
    p99_ms: float
    ttft_mean_ms: float | None

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "opened_connection": self.opened, "mean_ms": self.mean_ms,
                "p99_ms": self.p99_ms, "ttft_mean_ms": self.ttft_mean_ms}


@dataclass
class Comparison:
    sides: list[Side]
    deltas: list[list[Delta]] = field(default_factory=list)  # per side after the first
    tests: list[dict[str, float | None]] = field(default_factory=list)
    # per side after the first: its load and workload settings that differ from the first's
    differences: list[list[Difference]] = field(default_factory=list)
    # per side after the first: its server's settings that differ from the first's
    engines: list[list[Difference]] = field(default_factory=list)
    # per side after the first: the earlier side it is the same run as, and how that shows
    # (None: another run)
    same: list[tuple[str, str] | None] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "baseline": self.sides[0].label,
            "runs": [{"label": s.label, "paths": [str(r.path) for r in s.runs], "simulated": s.simulated,
                      "response_cache_hits": s.cache_hits[0], "requests_ended": s.failures[1], "requests_failed": s.failures[0],
                      "caveats": s.caveats}
                     for s in self.sides],
            "comparisons": [
                {"run": s.label, "workload_differences": [d.to_json() for d in diff],
                 "engine_differences": [d.to_json() for d in engine],
                 "same_run_as": None if same is None else same[0],
                 "connect_wait_definitions": self._connect_json(s),
                 "metrics": [d.to_json() for d in ds], "mann_whitney_p": t}
                for s, ds, t, diff, engine, same in zip(self.sides[1:], self.deltas, self.tests, self.differences,
                                                        self.engines, self.same, strict=True)
            ],
        }

    def _connect_pair(self, side: Side) -> tuple[Side, Side, ConnectWaits | None] | None:
        """(the side whose records predate ``connect_wait_ns``, the side that has it, its
        waits) where ``side`` and the baseline differ so; None where they do not."""
        base = self.sides[0]
        recorded = (base.connect_recorded, side.connect_recorded)
        if recorded == (False, True):
            return base, side, side.connect_waits()
        if recorded == (True, False):
            return side, base, base.connect_waits()
        return None

    def _connect_json(self, side: Side) -> dict[str, Any] | None:
        pair = self._connect_pair(side)
        if pair is None:
            return None
        old, new, waits = pair
        return {"without": old.label, "with": new.label, "connect_wait": None if waits is None else waits.to_json()}

    def connect_lines(self) -> list[str]:
        """One line per run whose records and the baseline's time TTFT from different
        points (one side's records predate ``connect_wait_ns``): the other's TTFT holds
        its new connections' set-up, and how much, so a reader can tell whether it matters."""
        lines = []
        for s in self.sides[1:]:
            pair = self._connect_pair(s)
            if pair is None:
                continue
            old, new, w = pair
            held = "no completed request measured one" if w is None else (
                f"{w.opened:,} of {w.requests:,} completed requests ({w.opened / w.requests:.0%}) opened one, "
                f"connect wait mean {w.mean_ms:,.2f} ms, p99 {w.p99_ms:,.2f} ms"
                + ("" if w.ttft_mean_ms is None else f" (its TTFT mean {w.ttft_mean_ms:,.2f} ms)"))
            lines.append(
                f"{old.label}'s records predate connect_wait_ns and {new.label}'s have it: {new.label}'s TTFT, TTFB and E2E "
                f"run from before a connection was taken, {old.label}'s from once one was had, so {new.label}'s hold new "
                f"connections' set-up: {held}; a change of about that size may be the definitions', not the server's")
        return lines

    def difference_lines(self) -> list[str]:
        """One line per run whose load or workload differs from the baseline's, naming
        the settings (empty when every run asked the same of its server)."""
        base = self.sides[0].label
        return [f"{s.label} differs from {base} in load or workload ({base}'s vs {s.label}'s): {'; '.join(d.text for d in diff)}"
                for s, diff in zip(self.sides[1:], self.differences, strict=True) if diff]

    def engine_lines(self) -> list[str]:
        """One line per run whose server settings differ from the baseline's, naming them
        (what a comparison of servers is usually for: said, not warned of)."""
        base = self.sides[0].label
        return [f"{s.label}'s server differs from {base}'s ({base}'s vs {s.label}'s): {'; '.join(d.text for d in diff)}"
                for s, diff in zip(self.sides[1:], self.engines, strict=True) if diff]

    def same_lines(self) -> list[str]:
        """One line per run that is an earlier one given again (empty when none is)."""
        return [f"{s.label} is {earlier}, the same run given twice ({how}): its changes below are zero by construction, not a measurement"
                for s, same in zip(self.sides[1:], self.same, strict=True) if same for earlier, how in [same]]

    def cache_lines(self) -> list[str]:
        """One line per run a response cache answered requests of (empty when none)."""
        return [f"{s.label}: {response_cache_share(hits, done)}: its latency and tokens/s are partly the cache's, not the server's"
                for s in self.sides for hits, done in [s.cache_hits] if hits]

    def failure_lines(self) -> list[str]:
        """One line per run with failed requests (empty when none failed): its latencies
        are over the requests that completed, so failing the slowest reads as faster."""
        return [f"{s.label}: {failed} of {ended} requests failed; its latencies and tokens/s are over the "
                f"{ended - failed} that completed (a run that fails its slowest requests looks faster): see the failed row"
                for s in self.sides for failed, ended in [s.failures] if failed]

    def gateway_lines(self) -> list[str]:
        """One line per run that went through inferlab gateway where the baseline did
        not, or the other way round (empty when none did, or all did)."""
        base = self.sides[0].label
        lines = []
        for s, diff in zip(self.sides[1:], self.engines, strict=True):
            for d in diff:
                if d.setting == GATEWAY:
                    via, direct = (s.label, base) if d.b != "no gateway" else (base, s.label)
                    lines.append(f"{via} went through inferlab gateway and {direct} did not: {via}'s TTFT and latencies "
                                 "include the gateway's queue and relay (its gateway_queue says how long the queue held "
                                 "requests)")
        return lines

    def caveat_lines(self) -> list[str]:
        """One line per run whose own summary warns its numbers are unfit to compare
        (``Side.caveats``), naming each warning (empty when none does)."""
        return [f"{s.label}'s summary warns: {'; '.join(caveats)}: its numbers are not the server's alone"
                for s in self.sides for caveats in [s.caveats] if caveats]

    def warning_lines(self) -> list[str]:
        """What may explain a change better than the server: different workloads, a
        run's own summary's warnings, TTFT timed from different points, a gateway in
        front of one run only, a response cache, failed requests."""
        return [*self.same_lines(),
                *(f"{line}: a change below may come from that, not from the server" for line in
                  (*self.difference_lines(), *self.caveat_lines())),
                *self.connect_lines(), *self.gateway_lines(), *self.cache_lines(), *self.failure_lines()]


def side_of(path: str, label: str | None = None) -> Side:
    """A run directory, or a sweep whose points are repeats of one configuration."""
    src = load(path)
    name = label or os.path.basename(os.path.normpath(path)) or path
    if isinstance(src, Sweep):
        runs = [p.run for p in src.points if p.run is not None and p.status == "done"]
        params = {tuple(sorted((k, str(v)) for k, v in p.params.items())) for p in src.points if p.run is not None and p.status == "done"}
        if not runs:
            raise UsageError(f"{path}: a sweep with no finished point")
        if len(params) > 1:
            raise UsageError(f"{path}: a sweep over {len(params)} configurations; compare its point directories (or use inferlab report)")
        return Side(name, runs)
    return Side(name, [src])


def build(sides: Sequence[Side]) -> Comparison:
    if len(sides) < 2:
        raise UsageError("compare needs two runs or more")
    c = Comparison(list(sides))
    for s in sides[1:]:
        c.deltas.append(compare(sides[0].runs, s.runs))
        c.tests.append(distribution_tests(sides[0].runs, s.runs))
        differ = load_differences(sides[0].runs[0].config, s.runs[0].config)
        # (tokens sent by runs whose configs differ in workload differ for that reason)
        same_asked = not any(d.setting.startswith("workload.") or d.setting in ("model", "api") for d in differ)
        differ += sent_differences(sides[0].runs, s.runs, tokens=same_asked)
        c.differences.append(differ)
        c.engines.append(engine_differences(sides[0].runs[0].config, s.runs[0].config))
    c.same = [_same_run(s, sides[:i + 1]) for i, s in enumerate(sides[1:])]
    return c


def _same_run(side: Side, earlier: Sequence[Side]) -> tuple[str, str] | None:
    """The first of ``earlier`` that ``side`` is the same run as, and how that shows (the
    same folder, or the same requests.jsonl in another); None when it is another run."""
    for other in earlier:
        if [os.path.realpath(r.path) for r in side.runs] == [os.path.realpath(r.path) for r in other.runs]:
            return other.label, "the same folder"
        if [_digest(r.path) for r in side.runs] == [_digest(r.path) for r in other.runs]:
            return other.label, "an identical requests.jsonl"
    return None


def _digest(run_dir: os.PathLike[str]) -> str | None:
    """The SHA-256 of a run's requests.jsonl; None where it cannot be read."""
    import hashlib

    try:
        with open(os.path.join(run_dir, "requests.jsonl"), "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


def fmt(v: float | None, unit: str) -> str:
    if v is None or not math.isfinite(v):  # (no value: NaN printed "nan")
        return "—"
    if unit in ("tok/s",):
        return f"{v:,.0f}"
    return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.1f}"


def bound(v: float) -> str:
    """A side of a change's interval: a signed number, or unbounded."""
    return f"{v:+,.3g}" if math.isfinite(v) else "unbounded"


def change_text(d: Delta) -> str:
    """A change as a table cell: relative (``+12.5%``), or in its unit where the first
    run's value is 0, and in points for a share (``failed``: ``+72.5 pts``)."""
    if d.delta is None:
        return "—"
    if d.metric.unit == "%":
        return f"{d.delta:+.3g} pts"
    return f"{d.rel * 100:+.1f}%" if d.rel is not None else f"{d.delta:+.3g}"


def render(console: Console, c: Comparison) -> None:
    base = c.sides[0]
    for s in c.sides:
        console.print(s.describe())
    for line in c.engine_lines():
        console.print(line, highlight=False, soft_wrap=True)
    for line in c.warning_lines():  # (above the verdicts: they may come from it)
        console.print(f"[yellow]warning:[/yellow] {line}", highlight=False, soft_wrap=True)
    t = Table(title=f"each run against {base.label}: the change, and whether it exceeds run-to-run noise (its 95% interval, in --json, excludes 0)",
              title_justify="left")
    t.add_column("metric", no_wrap=True)
    t.add_column(base.label, justify="right")
    for s in c.sides[1:]:
        t.add_column(s.label, justify="right")
        t.add_column("change", justify="right")
        t.add_column("vs noise")
    for i, m in enumerate(METRICS):
        row = [f"{m.label} ({m.unit})", fmt(estimate(m, base.runs).value, m.unit)]
        for ds in c.deltas:
            d = ds[i]
            change = change_text(d)
            style = "" if d.verdict != "beyond noise" else ("green" if d.better else "red")
            row += [fmt(d.b.value, m.unit), change, f"[{style}]{verdict_words(d)}[/]" if style else verdict_words(d)]
        t.add_row(*row)
    console.print(t)
    for s, tests in zip(c.sides[1:], c.tests, strict=True):
        parts = [f"{name.removesuffix('_ms').upper()} p={p:.3g}" for name, p in tests.items() if p is not None]
        if parts:
            console.print(f"Mann–Whitney over the batches' medians, {s.label} vs {base.label} (p < 0.05: the typical request moved): "
                          + ", ".join(parts))
    console.print(f"95% intervals: over repeats when given, else over 3 to 5 batches of a run in the order its requests ended "
                  f"(docs/report.md); beyond noise = the change's interval excludes 0; too few requests = a run has under "
                  f"{TAIL_MIN} requests beyond that percentile, which leaves it unbounded; only N batches = a run too short for "
                  f"{MAX_BATCHES} batches of the size its load needs, and with {MAX_BATCHES} of the same spread the change "
                  "would exceed noise (a short run cannot tell; not a sign the change is real); noise unknown = a mean or "
                  "throughput of a run of under 30 requests (fewer than 3 batches)", style="dim")


def render_html_table(c: Comparison) -> str:
    """The comparison as an HTML table (the report's section)."""
    from html import escape

    base = c.sides[0]
    head = f"<th>metric</th><th>{escape(base.label)}</th>" + "".join(
        f"<th>{escape(s.label)}</th><th>change</th><th>vs noise</th>" for s in c.sides[1:])
    rows = []
    for i, m in enumerate(METRICS):
        cells = [f"<td>{escape(m.label)} ({m.unit})</td><td>{fmt(estimate(m, base.runs).value, m.unit)}</td>"]
        for ds in c.deltas:
            d = ds[i]
            change = change_text(d)
            cls = "" if d.verdict != "beyond noise" else (' class="better"' if d.better else ' class="worse"')
            ci = "" if d.lo is None or d.hi is None else f" (95% interval of the change {bound(d.lo)} to {bound(d.hi)})"
            cells.append(f"<td>{fmt(d.b.value, m.unit)}</td><td{cls} title=\"{escape(ci)}\">{change}</td><td{cls}>{escape(verdict_words(d))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    lines = "".join(f"<li>{escape(s.describe())}</li>" for s in c.sides)
    lines += "".join(f"<li>{escape(line)}</li>" for line in c.engine_lines())
    lines += "".join(f'<li class="worse">warning: {escape(line)}</li>' for line in c.warning_lines())
    tests = "".join(
        f"<li>Mann–Whitney over the batches' medians, {escape(s.label)} vs {escape(base.label)}: "
        + ", ".join(f"{k.removesuffix('_ms').upper()} p={p:.3g}" for k, p in t.items() if p is not None) + "</li>"
        for s, t in zip(c.sides[1:], c.tests, strict=True))
    return (f"<ul>{lines}</ul><table class=\"compare\"><tr>{head}</tr>{''.join(rows)}</table>"
            f"<ul>{tests}</ul><p class=\"what\">Each change against {escape(base.label)}; it exceeds noise when its 95% interval "
            "excludes zero (repeats: t over runs; one run: 3 to 5 batches in the order its requests ended, batch means and, for a "
            "percentile, a jackknife over them).</p>")
