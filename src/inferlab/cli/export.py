"""``inferlab export``: a run directory in other tools' formats (``results.export``)."""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

import click

from inferlab._errors import UsageError
from inferlab.cli.common import check_output_folder, percentiles_option, run_guarded
from inferlab.results.export import (
    VLLM_PERCENTILES,
    requests_csv,
    run_source,
    summary_csv,
    vllm_result,
)
from inferlab.results.provenance import VIRTUAL
from inferlab.results.runfiles import dumps, read_records, read_summary
from inferlab.results.sources import load_run
from inferlab.results.summary import Summary
from inferlab.sim.engine.bands import run_bands

FORMATS = ("vllm", "csv-summary", "csv-requests")


@click.command("export")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True, help="vllm: the JSON of vllm bench serve --save-result (--save-detailed); csv-summary: one row per metric; csv-requests: one row per request.")
@click.option("-o", "--output", default="-", show_default=True, help="File to write ('-': stdout).")
@click.option("--metric-percentiles", callback=percentiles_option, metavar="P,P,...", help="vllm: the percentiles of its summary keys (vLLM's --metric-percentiles; default 99).")
@click.option("--detailed/--no-detailed", default=True, show_default=True, help="vllm: include every per-request list (--save-detailed), which a replay needs; without, only latencies and queue_times, as vLLM.")
def export(run_dir: str, fmt: str, output: str, metric_percentiles: tuple[float, ...] | None, detailed: bool) -> None:
    """Write a run directory (bench or sim run --out) in another tool's format."""
    sys.exit(run_guarded(lambda: _export(run_dir, fmt, output, metric_percentiles, detailed)))


def _export(run_dir: str, fmt: str, output: str, percentiles: tuple[float, ...] | None, detailed: bool) -> int:
    if fmt != "vllm":  # (each error names the flag given and the format it cannot shape)
        if percentiles is not None:
            why = "the run's own percentiles" if fmt == "csv-summary" else "no percentiles, one row per request"
            raise UsageError(f"--metric-percentiles shapes --format vllm only (--format {fmt} has {why})")
        if not detailed:
            why = "no per-request lists" if fmt == "csv-summary" else "one row per request, always"
            raise UsageError(f"--no-detailed shapes --format vllm only (--format {fmt} has {why})")
    if output != "-":
        check_output_folder(Path(output))
    folder = Path(run_dir)
    summary_path = folder / "summary.json"
    if summary_path.is_file():
        summary = read_summary(summary_path)
    elif (folder / "requests.jsonl").is_file():
        # a run killed before it ended, or a gateway's access log: what it measured is
        # all in its records (the summary computed from them as report computes it)
        summary = Summary.from_json(load_run(folder).summary)
        summary_path = folder / "requests.jsonl"
        lost = "; its error bands, which sim run wrote there, are not exported" if summary.server.kind == VIRTUAL else ""
        click.echo(f"inferlab export: {run_dir} has no summary.json: the summary is computed from its "
                   f"requests.jsonl{lost}", err=True)
    else:
        raise UsageError(f"{run_dir}: neither summary.json nor requests.jsonl (not a run directory)")
    if fmt == "csv-summary":
        text = summary_csv(summary, run_bands(summary.prediction))
    else:
        records = list(read_records(folder / "requests.jsonl"))
        measured = sum(1 for r in records if not r.warmup)
        if measured != summary.counts.total:  # (a requests.jsonl emptied or of another run: zeros, or another run's rows)
            raise UsageError(f"{run_dir}: requests.jsonl holds {measured} measured requests where summary.json counts "
                             f"{summary.counts.total}: not the records of this run")
        if fmt == "csv-requests":
            text = requests_csv(records, run_source(summary))
        else:
            # vLLM's date is when its run ended: summary.json (else its last record) was written then
            ended = datetime.datetime.fromtimestamp(os.stat(summary_path).st_mtime)
            text = dumps(vllm_result(
                summary, records, date=ended.strftime("%Y%m%d-%H%M%S"),
                percentiles=percentiles or VLLM_PERCENTILES, detailed=detailed, source=run_source(summary),
                bands=run_bands(summary.prediction),
            ), indent=None) + "\n"
    if output == "-":
        click.echo(text, nl=False)
        return 0
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot write {output}: {e.strerror or e}") from e
    click.echo(f"inferlab export: {output} ({fmt})", err=True)
    return 0
