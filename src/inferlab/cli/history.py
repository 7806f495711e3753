"""``inferlab runs``: the run history, listed and filtered; and how ``compare`` and
``report`` read a history id as the run directory it recorded."""

from __future__ import annotations

import os
import sys
from typing import Any

import click
from rich.table import Table

from inferlab._errors import UsageError
from inferlab.cli.common import console, run_guarded
from inferlab.results.history import ENV, Entry, History, history_path, overwritten, parse_since
from inferlab.results.provenance import PREDICTION
from inferlab.results.runfiles import dumps


def history_option(fn: Any) -> Any:
    return click.option(
        "--history", "history", metavar="PATH",
        help=f"The run-history database (default: ${ENV}, else history.sqlite in the user's data directory).",
    )(fn)


def open_history(option: str | None) -> History:
    """The history to read; ``UsageError`` when it is off or has not been created yet."""
    where = history_path(option)
    if where is None:
        raise UsageError(f"the run history is off (${ENV}={os.environ.get(ENV)}): give --history PATH")
    if not where.exists():
        raise UsageError(f"no run history at {where} yet (runs are recorded there as they finish)")
    return History(where)


def resolve_runs(items: tuple[str, ...], option: str | None) -> list[str]:
    """Each argument as a directory: a path that exists as given, else a history id (a
    number, or ``#N``) as the directory that run recorded. ``UsageError`` for an id the
    history does not have, or one recorded without a directory."""
    out: list[str] = []
    history: History | None = None
    try:
        for item in items:
            if os.path.exists(item) or not item.lstrip("#").isdigit():
                out.append(item)
                continue
            if history is None:
                history = open_history(option)
            entry = history.get(int(item.lstrip("#")))
            if entry is None:
                raise UsageError(f"{item}: no such path, and no run {item.lstrip('#')} in the history {history.path}")
            if entry.path is None:
                raise UsageError(f"run {entry.id} ({entry.time}) was not written to a directory (no --out): nothing to read")
            if (differ := overwritten(entry)) is not None:
                raise UsageError(f"run {entry.id} ({entry.time}): {entry.path} holds another run now ({differ}); "
                                 "give its path to read what it holds")
            out.append(entry.path)
    finally:
        if history is not None:
            history.close()
    return out


@click.command("runs")
@click.option("--model", help="Only runs of a model whose name contains this text (case-insensitive; _ and % are plain characters, not wildcards).")
@click.option("--url", help="Only runs against a target whose URL contains this text (case-insensitive).")
@click.option("--since", help="Only runs since this date or time (UTC: 2026-01-31, 2026-01-31T12:00) or span back from now (7d, 12h, 30m).")
@click.option("--kind", type=click.Choice(["run", "sweep"]), help="Only runs, or only sweeps.")
@click.option("-n", "--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Show at most this many, newest first.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line, every column.")
@history_option
def runs(**kw: Any) -> None:
    """List the run history (every bench, sim run and sweep), newest first."""
    sys.exit(run_guarded(lambda: _runs(kw)))


def _runs(kw: dict[str, Any]) -> int:
    since = parse_since(kw["since"]) if kw["since"] else None
    with open_history(kw["history"]) as history:
        entries = history.find(model=kw["model"], since=since, url=kw["url"], kind=kw["kind"], limit=kw["limit"])
        where = history.path
    if kw["as_json"]:
        for e in entries:
            click.echo(dumps(e.to_json(), indent=None))
        return 0
    if not entries:
        click.echo(f"no runs match (history: {where})", err=True)
        return 0
    t = Table(title=f"run history ({where}); times UTC; simulated runs are predictions", title_justify="left", box=None)
    right = ("id", "out tok/s", "req/s", "TTFT p50", "TTFT p99", "TPOT p50", "ok/fail")
    for col in ("id", "time", "target", "model", *right[1:], "path"):
        t.add_column(col, justify="right" if col in right else "left", no_wrap=col != "path")
    for e in entries:
        h = e.headline
        target = e.target or "?"
        if e.simulated:
            target = f"{target} {PREDICTION}"
        if e.kind == "sweep":
            target = f"{_sweep_kind(e)}: {target}"
        t.add_row(
            str(e.id), e.time.replace("+00:00", "").replace("T", " "), target, (e.model or "?").split("/")[-1],
            _num(h["output_tok_s"], 0), _num(h["req_s"], 2), _num(h["ttft_p50_ms"], 1), _num(h["ttft_p99_ms"], 1),
            _num(h["tpot_p50_ms"], 2), _outcomes(e), e.path or "(not written)",
        )
    # a pipe gets whole lines (for grep), a terminal its own width
    out = console() if sys.stdout.isatty() else console(width=240)
    out.print("latencies in ms, throughput per second", style="dim")
    out.print(t)
    if any(e.response_cache_hits for e in entries):
        out.print("ok/fail \"N cached\": N of the completed requests were answered by a response cache in front of "
                      "the engine; the run's latency and tokens/s are partly the cache's", style="yellow")
    return 0


def _sweep_kind(e: Entry) -> str:
    """'sweep', or for a tune which trial its row shows ('tune, best trial 0')."""
    workload = e.workload or {}
    if "tune_best" not in workload:
        return "sweep"
    return "tune, no best" if workload["tune_best"] is None else f"tune, best trial {workload['tune_best']}"


def _outcomes(e: Entry) -> str:
    """Completed/failed, and how many a response cache answered when any did."""
    cached = f", {e.response_cache_hits:,} cached" if e.response_cache_hits else ""
    return f"{_count(e.completed)}/{_count(e.failed)}{cached}"


def _count(n: int | None) -> str:
    return "?" if n is None else str(n)


def _num(v: float | None, digits: int) -> str:
    return "—" if v is None else f"{v:,.{digits}f}"
