"""``inferlab locust-merge``: a Locust run's records (what its master received) into the
usual run directory (``load.distributed``). The master does this itself when the test
stops; this command does it again: after a master that died, or to redo it."""

from __future__ import annotations

import sys

import click

from inferlab.cli.common import console, run_guarded
from inferlab.results.runfiles import dumps


@click.command("locust-merge")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print summary.json instead of the table.")
def locust_merge(run_dir: str, as_json: bool) -> None:
    """Write config.json, requests.jsonl and summary.json of a Locust run (the folder
    given as --inferlab-out) from the records its master received."""
    sys.exit(run_guarded(lambda: _merge(run_dir, as_json)))


def _merge(run_dir: str, as_json: bool) -> int:
    from inferlab.load.distributed import describe, finish_run
    from inferlab.report.console import render_summary

    summary, merged = finish_run(run_dir)
    if as_json:
        click.echo(dumps(summary.to_json()))
        return 0
    err = console(stderr=True)
    err.print(f"inferlab: {describe(merged)}")
    model = summary.config.get("model") or summary.config.get("resolved", {}).get("model", "?")
    render_summary(console(), summary, f"{model} @ {summary.config.get('url')} (Locust)")
    console().print(f"results: {run_dir}/summary.json, {run_dir}/requests.jsonl")
    return 0
