"""``inferlab sim calibrate``: fit the simulator's step-time constants to measured runs
of one server (``sim.validation.twin``)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table

from inferlab._errors import ConfigError, UsageError
from inferlab.cli.common import check_output_folder, given, run_guarded
from inferlab.cli.sim import RUN_DEFAULTS, engine_config, engine_options
from inferlab.client.serverid import FAMILY_OF_SOFTWARE
from inferlab.sim.engine.config import engine_release
from inferlab.sim.engine.families import EngineFamily

if TYPE_CHECKING:
    from inferlab.sim.validation.twin import MeasuredRun


@click.command("calibrate")
@engine_options(RUN_DEFAULTS)
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--holdout", multiple=True, type=click.Path(exists=True, file_okay=False), help="A run directory predicted, not fitted on (repeatable): the error reported on it is the twin's.")
@click.option("--fit", "fit_names", default=None, metavar="NAME,NAME,...", help="The step-time constants to fit (default: gemm_compute, weight_stream, attention_compute, cpu_step_s, api_overhead_s).")
@click.option("--max-evaluations", type=click.IntRange(min=1), default=400, show_default=True, help="Simulated reruns of the fit set at most.")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="The efficiencies file to write (for sim run --efficiencies, with the same engine flags).")
@click.option("--report", type=click.Path(dir_okay=False), help="Also write the fit's report (constants, per-run measured and predicted) as JSON.")
def calibrate_cmd(**kw: Any) -> None:
    """Fit the simulator to measured runs of one server (bench run directories of
    synthetic workloads): its step-time constants, for the engine the flags describe,
    so that it reproduces their TTFT p50, TPOT p50, E2E p50 and output tok/s. Reports
    the error on the fit runs and on --holdout runs; the result is a twin whose numbers
    are predictions."""
    sys.exit(run_guarded(lambda: _calibrate(kw)))


def _as_the_server_said(kw: dict[str, Any], runs: list[MeasuredRun], err: Console) -> None:
    """What the runs' server said it is (``bench`` records it), where no flag says:
    the release of a family whose defaults follow releases (``--engine-version``: vLLM,
    SGLang), and no async scheduling for llama.cpp, which computes a batch before it
    schedules the next. Said on stderr. ``UsageError`` for runs of different servers or
    releases: a twin is of one."""
    said = [r.software for r in runs if r.software]
    if not said:
        return
    names = sorted({str(s.get("name")) for s in said})
    if len(names) > 1:
        raise UsageError(f"the runs were measured on different servers ({', '.join(names)}): a twin is of one server")
    name, family = names[0], EngineFamily.parse(str(kw["engine_family"]))
    releases = sorted({str(s["version"]) for s in said if s.get("version")})
    of = f"{len(said)} of {len(runs)} runs" if len(said) < len(runs) else "the runs"
    if FAMILY_OF_SOFTWARE.get(name) == family.value and releases:
        if given("engine_version"):
            if releases != [kw["engine_version"]]:
                err.print(f"inferlab sim calibrate: {of}' server said {name} {', '.join(releases)}; "
                          f"calibrating as release {kw['engine_version']}, as --engine-version says", highlight=False)
            return
        if len(releases) > 1:
            raise UsageError(f"the runs were measured on different releases of {name} ({', '.join(releases)}): "
                             "a twin is of one; calibrate each apart, or say which with --engine-version")
        try:
            release = engine_release(dataclasses.replace(engine_config(kw), engine_version=releases[0]))
        except ConfigError as e:
            err.print(f"inferlab sim calibrate: {of}' server said {name} {releases[0]}, which the simulator cannot "
                      f"follow ({e}); calibrating as its current release", highlight=False)
            return
        kw["engine_version"] = releases[0]
        # (vLLM's CPU backend keeps async scheduling off whatever its release: its /version does not say which it is)
        cpu = (" It schedules ahead as that release does on a GPU; vLLM's CPU backend does not: "
               "add --no-async-scheduling for a twin of one." if family is EngineFamily.VLLM
               and not given("overlap_schedule") and family.rules.overlap_schedule_in(release) else "")
        err.print(f"inferlab sim calibrate: release {releases[0]}, as {of}' server said ({said[0].get('source')}); "
                  f"--engine-version says otherwise.{cpu}", highlight=False)
    elif name == "llama.cpp" and not given("overlap_schedule") and family.rules.overlap_schedule:
        kw["overlap_schedule"] = False
        err.print(f"inferlab sim calibrate: {of}' server is llama.cpp, which schedules no step ahead: calibrating "
                  "without async scheduling (--async-scheduling says otherwise)", highlight=False)


def _calibrate(kw: dict[str, Any]) -> int:
    from inferlab.report.sweep import COLUMNS
    from inferlab.sim.validation.twin import (
        DEFAULT_FIT,
        METRICS,
        calibrate,
        median_abs_error,
        read_run,
        write_efficiencies,
    )

    names = DEFAULT_FIT if kw["fit_names"] is None else tuple(n.strip() for n in kw["fit_names"].split(",") if n.strip())
    if not names:
        raise UsageError("--fit names no constant")
    if kw["api_overhead_s"] is not None and "api_overhead_s" in names:
        raise UsageError("--api-latency-ms sets api_overhead_s, which --fit would fit: drop one of them")
    for path in (kw["out"], kw["report"]):  # (before the fit, which takes a while)
        if path:
            check_output_folder(Path(path))
    fit_runs = [read_run(p) for p in kw["runs"]]
    holdout = [read_run(p) for p in kw["holdout"]]
    err = Console(stderr=True)
    _as_the_server_said(kw, fit_runs + holdout, err)
    engine = engine_config(kw)
    labels = {key: label for label, key, _ in COLUMNS}  # (the twin's metrics are sweep headline keys)
    against = ", ".join(labels[m] for m in METRICS)
    err.print(f"inferlab sim calibrate: fitting {', '.join(names)} to {against} of {len(fit_runs)} run(s), "
              f"{len(holdout)} held out (each evaluation reruns the fit set in virtual time)")
    fit = calibrate(engine, fit_runs, holdout, names, kw["max_evaluations"])
    write_efficiencies(kw["out"], engine, fit)
    if kw["report"]:
        Path(kw["report"]).write_text(json.dumps(fit.to_json(), indent=2) + "\n")
    out = Console()
    table = Table(title="inferlab sim calibrate: measured vs the twin's prediction", title_justify="left", header_style="bold")
    for col in ("set", "run", "metric", "measured", "prediction", "error"):
        table.add_column(col, justify="left" if col in ("set", "run", "metric") else "right")
    for label, rows in (("fit", fit.fit_runs), ("held out", fit.holdout_runs)):
        for r in rows:
            for m in METRICS:
                if m in r["measured"]:
                    pred, e = r["predicted"][m], r["error"][m]
                    table.add_row(label, Path(r["run"]).name, m, f"{r['measured'][m]:,.2f}",
                                  "—" if pred is None else f"{pred:,.2f}", "—" if e is None else f"{e:+.1%}")
    out.print(table)
    for label, rows in (("fit", fit.fit_runs), ("held out", fit.holdout_runs)):
        if rows:
            meds = {m: median_abs_error(rows, m) for m in METRICS}
            out.print(f"median |error|, {label}: " + ", ".join(f"{m} {v:.1%}" for m, v in meds.items() if v is not None))
    out.print("constants: " + ", ".join(f"{k} {v:.4g}" for k, v in fit.constants.items()) + f" ({fit.evaluations} evaluations)")
    out.print(f"efficiencies: {kw['out']} (sim run --efficiencies {kw['out']} with the same engine flags)")
    return 0
