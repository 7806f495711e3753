"""``inferlab compare`` (runs side by side, changes against noise, a CI exit status) and
``inferlab report`` (one self-contained HTML file of plots)."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from inferlab._errors import UsageError
from inferlab.cli.common import LINE, check_output_folder, console, run_guarded
from inferlab.cli.history import history_option, resolve_runs
from inferlab.results.compare import TAIL_MIN, parse_fail_if
from inferlab.results.runfiles import dumps

#: ``compare``'s exit status when a ``--fail-if`` condition holds (2 is a usage error,
#: 1 a failure to compare at all).
FAIL_IF_EXIT = 3


@click.command("compare")
@click.argument("runs", nargs=-1, required=True)
@click.option("--fail-if", "fail_if", multiple=True, metavar="COND", type=LINE,
              help=f"Exit {FAIL_IF_EXIT} when a run's change against the first passes this and is not within noise: "
                   "METRIC>LIMIT or METRIC<LIMIT, e.g. 'ttft_p99>+10%', 'output_tok_s<-5%', 'tpot_p50>+2' (ms), 'failed_pct>+1' (points of the share of requests that failed). Repeatable.")
@click.option("--allow-different-workloads", is_flag=True,
              help="With --fail-if: act on runs whose load or workload differ (prompt or output lengths, dataset, "
                   "concurrency or rate, model, ...), which is refused otherwise; the differences are still said.")
@click.option("--allow-unreliable", is_flag=True,
              help="With --fail-if: act on runs whose own summary warns their numbers are not the server's alone "
                   "(prompts served from a cache an earlier run filled, the client as the bottleneck, answers cut "
                   "short), which is refused otherwise; the warnings are still said.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@history_option
def compare_cmd(**kw: Any) -> None:
    """Compare runs side by side against the first: RUN directories, sweeps of repeats,
    or history ids (inferlab runs)."""
    sys.exit(run_guarded(lambda: _compare(kw)))


def _compare(kw: dict[str, Any]) -> int:
    from inferlab.report.compare import build, render, side_of

    conditions = [parse_fail_if(c) for c in kw["fail_if"]]
    if kw["allow_different_workloads"] and not conditions:
        raise UsageError("--allow-different-workloads lets --fail-if act on runs of different workloads: give --fail-if too")
    if kw["allow_unreliable"] and not conditions:
        raise UsageError("--allow-unreliable lets --fail-if act on runs whose summary warns their numbers are off: give --fail-if too")
    paths = resolve_runs(kw["runs"], kw["history"])
    if len(paths) < 2:
        raise UsageError("compare needs two runs or more (the first is the baseline)")
    labels = _labels(kw["runs"])
    comparison = build([side_of(p, label) for p, label in zip(paths, labels, strict=True)])
    differ = comparison.difference_lines()
    if conditions and differ and not kw["allow_different_workloads"]:
        # (a build must not fail on a change the workload made rather than the server)
        raise UsageError(f"--fail-if on runs of different workloads: {'; '.join(differ)}; "
                         "give --allow-different-workloads to act on them anyway")
    unfit = comparison.caveat_lines()
    if conditions and unfit and not kw["allow_unreliable"]:
        # (a build must not fail, or pass, on a change a cache or the client made)
        raise UsageError(f"--fail-if on runs whose summary warns their numbers are off: {'; '.join(unfit)}; "
                         "give --allow-unreliable to act on them anyway")
    if kw["as_json"]:
        for line in [*comparison.same_lines(), *differ, *unfit, *comparison.connect_lines(), *comparison.gateway_lines(),
                     *comparison.cache_lines(), *comparison.failure_lines()]:  # (the JSON has them too)
            click.echo(f"inferlab: warning: {line}", err=True)
        click.echo(dumps(comparison.to_json()))
    else:
        render(console(), comparison)
    tripped = []
    for side, deltas in zip(comparison.sides[1:], comparison.deltas, strict=True):
        for cond in conditions:
            d = next(d for d in deltas if d.metric is cond.metric)
            if d.unbounded:  # (a gate that cannot trip should not pass in silence)
                click.echo(f"inferlab: --fail-if: warning: {side.label}: {cond.text} cannot hold: a run has fewer than {TAIL_MIN} "
                           f"requests beyond {cond.metric.label}, too few to bound it, so no change of it is beyond noise", err=True)
            if not cond.trips(d):
                continue
            if d.delta is None:  # (a run measured nothing of it: the gate cannot pass)
                which = " and ".join(s.label for s, e in ((comparison.sides[0], d.a), (side, d.b)) if e.value is None)
                tripped.append(f"{side.label}: {cond.text} ({cond.metric.label}: no value in {which}, nothing to compare)")
            else:
                unit = "pts" if cond.metric.unit == "%" else cond.metric.unit
                change = f"{d.rel * 100:+.1f}%" if cond.percent and d.rel is not None else f"{d.delta:+.3g} {unit}"
                tripped.append(f"{side.label}: {cond.text} ({cond.metric.label} {change}, {d.verdict})")
    for line in tripped:
        click.echo(f"inferlab: --fail-if: {line}", err=True)
    return FAIL_IF_EXIT if tripped else 0


def _labels(args: tuple[str, ...]) -> list[str]:
    """Short names for the columns: the argument as given (a path's last part), made
    unique."""
    out: list[str] = []
    for a in args:
        name = a.rstrip("/").rsplit("/", 1)[-1] or a
        if a.lstrip("#").isdigit() and not os.path.exists(a):
            name = f"#{a.lstrip('#')}"
        base, k = name, 2
        while name in out:
            name, k = f"{base}({k})", k + 1
        out.append(name)
    return out


@click.command("report")
@click.argument("sources", nargs=-1, required=True)
@click.option("-o", "--output", "output", default="report.html", show_default=True, type=click.Path(dir_okay=False), help="The HTML file to write.")
@click.option("--png", "png_dir", type=click.Path(file_okay=False), help="Also write each plot as a PNG in this folder (drawn by headless Chromium: $INFERLAB_CHROMIUM, or chromium on PATH).")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs behind the target, for tokens/s per GPU (default: the engine's tensor-parallel size when the run records it, else 1, and the report says so).")
@click.option("--title", help="The report's title (default: from the sources).")
@click.option("--overwrite", is_flag=True, help="Replace a file at -o that is not a report (a report is replaced without it; a file the report reads, never).")
@history_option
def report_cmd(**kw: Any) -> None:
    """One self-contained HTML file (no network fetch) of the plots of runs and sweeps:
    RUN or SWEEP directories, or history ids. Several runs also get a comparison
    against the first."""
    sys.exit(run_guarded(lambda: _report(kw)))


def _report(kw: dict[str, Any]) -> int:
    from pathlib import Path

    from inferlab.report.compare import build, side_of
    from inferlab.report.html import Report, is_report, render
    from inferlab.results.sources import Run, files_read, load

    out = Path(kw["output"])
    check_output_folder(out)
    paths = resolve_runs(kw["sources"], kw["history"])
    labels = _labels(kw["sources"])
    sources = [load(p) for p in paths]
    # never over a file of a source, --overwrite or not (a run's requests.jsonl was lost so)
    if (target := out.resolve()) in {f.resolve() for src in sources for f in files_read(src)}:
        where = "" if target == out.absolute() else f" ({target})"
        raise UsageError(f"-o {out}{where} is one of the files the report reads: give another path")
    if out.is_file() and not kw["overwrite"] and not is_report(out):
        raise UsageError(f"-o {out} already exists and is not a report: give another path, or --overwrite")
    for src, label in zip(sources, labels, strict=True):
        if isinstance(src, Run):
            src.label = label
    title = kw["title"] or "inferlab report: " + ", ".join(labels)
    report = Report(title, sources, kw["gpus"])
    if len(sources) >= 2:
        try:  # runs, or sweeps of repeats of one configuration
            report.comparison = build([side_of(p, label) for p, label in zip(paths, labels, strict=True)])
        except UsageError:
            report.comparison = None  # a sweep over several configurations: its curves say it
    html = render(report)
    try:
        out.write_text(html, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot write {out}: {e.strerror or e}") from e
    drawn = [f for f in report.figures if f.body]
    click.echo(f"inferlab: report: {out} ({len(html) / 1024:,.0f} KiB, {len(drawn)} plots"
               + (f"; nothing to draw for {', '.join(f.id for f in report.figures if not f.body)}" if len(drawn) < len(report.figures) else "") + ")", err=True)
    if kw["png_dir"]:
        from inferlab.report.browser import screenshot_figures

        written = screenshot_figures(out, Path(kw["png_dir"]), [f.id for f in drawn])
        click.echo(f"inferlab: {len(written)} PNGs in {kw['png_dir']}", err=True)
    return 0
