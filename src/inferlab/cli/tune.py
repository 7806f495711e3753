"""``inferlab tune``: search the simulated engine's flags for the best goodput on a
workload (``analysis.tune``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import json
import math
import sys
import types
import typing
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from inferlab._errors import ConfigError, UsageError
from inferlab.cli.common import (
    FloatRange,
    OneNamePerSetting,
    as_sweep_output,
    command_line,
    console,
    given,
    install_stop_signals,
    load_config,
    load_options,
    record_sweep_in_history,
    run_guarded,
    slo_config,
    workload_config,
)
from inferlab.cli.engine import FIXED_SETTINGS, EngineTrials
from inferlab.cli.sim import RUN_DEFAULTS, as_the_twin_was, engine_config, engine_options
from inferlab.cli.sweep import ENGINE_PARAMS, engine_flag
from inferlab.load.run import RunConfig, SimTarget, sim_engine_config, trtllm_bench_sized
from inferlab.report.sweep import band_lines
from inferlab.results.sweepindex import check_sweep_dir
from inferlab.sim.engine.bands import headline_prediction
from inferlab.sim.engine.config import engine_release, memory_share_refused
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.engine.families import EngineFamily
from inferlab.sim.engine.hardware import resolve_gpu
from inferlab.sweep.runner import Trials
from inferlab.sweep.tune import (
    TIE_RULE,
    Axis,
    Trial,
    TuneConfig,
    Tuner,
    TuneResult,
    best_json,
    best_note,
    param_text,
)

#: Settings no search moves: where the engine is, and how it is run.
_NOT_SEARCHED = FIXED_SETTINGS | {"efficiencies_path", "offline"}
#: The simulated engine's flags (engine_options): meaningless with --engine.
_SIM_FLAGS = frozenset(f.name for f in dataclasses.fields(EngineConfig))

#: load_options' flags that have no meaning for a search of many runs.
_NOT_FOR_TUNE = {
    "save_result": "--save-result", "save_detailed": "--save-detailed", "result_dir": "--result-dir",
    "result_filename": "--result-filename", "metric_percentiles": "--metric-percentiles",
}


_HELP = f"""Search engine flags for the best goodput on one workload, on the simulated engine
in virtual time (each trial a run directory; results are predictions).

The best trial is, {TIE_RULE}: it may score a little below the highest (a run's noise is
no difference), and the line naming it then says so."""


@click.command(help=_HELP, cls=OneNamePerSetting)
@engine_options(RUN_DEFAULTS)
@load_options
@click.option("--api", type=click.Choice(["chat", "completions"]), default="completions", show_default=True, help="chat applies the chat template to prompts.")
@click.option("--param", "params", multiple=True, metavar="FLAG=V1,V2,...", help="An engine flag to search and its values, e.g. max-num-batched-tokens=512,2048,8192 (repeatable: the grid is their product).")
@click.option("--search", type=click.Choice(["pattern", "grid"]), default="pattern", show_default=True, help="pattern: a coordinate search from the middle of every axis, one step at a time while it improves (few trials); grid: every combination.")
@click.option("--objective", type=click.Choice(["goodput", "throughput"]), default="goodput", show_default=True, help="goodput: requests/s within every SLO; throughput: output tokens/s of trials where at least --slo-share of requests met the SLOs.")
@click.option("--slo-share", type=FloatRange(min=0, max=1, min_open=True), default=0.9, show_default=True, help="With --objective throughput: the share of requests that must meet the SLOs.")
@click.option("--max-trials", type=click.IntRange(min=1), help="Stop after this many trials (default: as many as the search needs).")
@click.option("--engine", "engine_config", type=click.Path(dir_okay=False), help="Tune a real engine: this config (TOML/JSON, as for inferlab engine start) with each setting put in, started for each trial and stopped after it; --param then names its settings (max-num-seqs, max-num-batched-tokens, max-model-len, enable-prefix-caching, ...).")
@click.option("--abort-hopeless/--no-abort-hopeless", default=True, show_default=True, help="End a trial early once it can no longer be chosen: its goodput, were every request left to meet the SLOs and the run to end now, below the tie share of the highest (throughput: more requests missed than --slo-share allows).")
def tune(**kw: Any) -> None:
    """``inferlab tune`` (its help: ``_HELP``)."""
    sys.exit(run_guarded(lambda: _tune(kw)))


as_sweep_output(tune, "trial", "Print the tune's result as JSON on stdout (every trial, the best, the Pareto set) instead of the table.")


def _flag_values(name: str, text: str, config_type: type = EngineConfig) -> tuple[Any, ...]:
    """``--param``'s values for field ``name`` of ``config_type`` (the simulator's
    ``EngineConfig``, or an ``EngineSpec``), read as the field's type."""
    hints = typing.get_type_hints(config_type)
    kind = hints[name]
    args = [a for a in typing.get_args(kind) if a is not type(None)] if isinstance(kind, types.UnionType) else [kind]
    base = args[0] if args else kind
    out: list[Any] = []
    for raw in (v.strip() for v in text.split(",")):
        if not raw:
            continue
        try:
            if base is bool:
                if raw.lower() not in ("on", "off", "true", "false"):
                    raise ValueError(raw)
                out.append(raw.lower() in ("on", "true"))
            elif base is int:
                out.append(int(raw))
                if out[-1] < 1:  # (sizes and counts: the engine refuses less than one)
                    raise UsageError(f"--param {name.replace('_', '-')}: {raw} is below 1")
            elif base is float:
                out.append(float(raw))
                if not math.isfinite(out[-1]):
                    raise ValueError(raw)
            elif isinstance(base, type) and issubclass(base, enum.Enum) and hasattr(base, "parse"):
                try:  # (a name the enum has not would fail every trial: refused now)
                    out.append(base.parse(raw))
                except UsageError as e:
                    raise UsageError(f"--param {name.replace('_', '-')}: {e}") from None
            else:  # names (model, GPU, family), which EngineConfig reads itself
                if name in _NAMED:  # (an unknown one would fail its trials: refused now)
                    try:
                        _NAMED[name](raw)
                    except UsageError as e:
                        raise UsageError(f"--param {name.replace('_', '-')}: {e}") from None
                out.append(raw)
        except ValueError:
            what = "on or off" if base is bool else f"a {getattr(base, '__name__', 'value')}"
            raise UsageError(f"--param {name.replace('_', '-')}: {raw!r} is not {what}") from None
    if not out:
        raise UsageError(f"--param {name.replace('_', '-')}: no values")
    return tuple(dict.fromkeys(out))  # once each, in the order given


#: names a searched value is read as before any trial runs
_NAMED: dict[str, Callable[[str], object]] = {"gpu": resolve_gpu}


#: ``--param``'s names for the simulator's fields: every name ``sim run`` takes for an
#: engine flag (``max-num-seqs``, SGLang's ``max-running-requests``, TensorRT-LLM's
#: ``max_batch_size``, ``async-scheduling`` ...), as ``--param`` reads it (no leading
#: dashes, ``_`` for ``-``; a switch's off name is none: its values are on/off) -> field
_PARAM_NAMES = {name.lstrip("-").replace("-", "_"): p.name for p in ENGINE_PARAMS
                if isinstance(p, click.Option) and p.name for name in p.opts}
#: each field's option: a searched value is read as the flag reads it (its type and
#: callback), so what sim run refuses (a block of 3 tokens) is refused here too, and a
#: value in the flag's units is the field's (``--api-latency-ms`` in ms, its field in s)
_OPTIONS = {p.name: p for p in ENGINE_PARAMS if isinstance(p, click.Option) and p.name}


def _axes(params: tuple[str, ...], kw: dict[str, Any], config_type: type = EngineConfig) -> tuple[Axis, ...]:
    ctx = click.get_current_context()
    fields = {f.name for f in dataclasses.fields(config_type)} - _NOT_SEARCHED
    axes: list[Axis] = []
    for p in params:
        flag, sep, values = p.partition("=")
        name = flag.strip().lstrip("-").replace("-", "_")
        if not sep or not name:
            raise UsageError(f"--param {p!r}: expected FLAG=V1,V2,..., e.g. max-num-seqs=16,64,256")
        if config_type is EngineConfig:  # (by any of the flag's names: not the field's)
            name = _PARAM_NAMES.get(name, "")
        if name not in fields:
            where = "the engine config" if config_type is not EngineConfig else "the simulator"
            names = sorted(engine_flag(f).lstrip("-") for f in fields) if config_type is EngineConfig \
                else sorted(f.replace("_", "-") for f in fields)
            raise UsageError(f"--param {flag}: not an engine flag tune can search on {where} (by any name sim run "
                             "takes for it); these are: " + ", ".join(names))
        if any(a.name == name for a in axes):
            raise UsageError(f"--param {flag} given twice")
        if name in kw and ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            raise UsageError(f"--{flag.lstrip('-')} is given as a flag and searched by --param: give one")
        found = _flag_values(name, values, config_type)
        if config_type is EngineConfig and (option := _OPTIONS.get(name)) is not None and not option.is_flag:
            read: list[Any] = []
            for raw in (v.strip() for v in values.split(",") if v.strip()):
                try:
                    value = option.type.convert(raw, option, ctx)
                    read.append(value if option.callback is None else option.callback(ctx, option, value))
                except click.BadParameter as e:
                    raise UsageError(f"--param {flag.strip()}: {e.message}") from None
            found = tuple(dict.fromkeys(read))  # (once each, in the order given)
        axes.append(Axis(name, found))
    return tuple(axes)


def _check_memory_share(axes: tuple[Axis, ...], kw: dict[str, Any]) -> None:
    """A search over the memory share another family's way (``--param gpu-memory-utilization``
    for trtllm or lmdeploy, ``kv-cache-free-gpu-mem-fraction`` for the others) would fail
    every trial but the default's, and name that one the best: refused now."""
    names = {a.name for a in axes}
    families = next((a.values for a in axes if a.name == "engine_family"), None) or [kw.get("engine_family")]
    for family in families:
        for name, flag, of_the_gpu in (("gpu_memory_utilization", "gpu-memory-utilization", True),
                                       ("kv_cache_free_fraction", "kv-cache-free-gpu-mem-fraction", False)):
            if name in names and (why := memory_share_refused(EngineFamily.parse(str(family)), of_the_gpu=of_the_gpu)):
                raise UsageError(f"--param {flag}: {why}")


def _tune(kw: dict[str, Any]) -> int:
    for key, flag in _NOT_FOR_TUNE.items():
        if kw.get(key):
            raise UsageError(f"{flag} is for a single run, not for tune (each trial is a run directory under --out)")
    if given("slo_share") and kw["objective"] != "throughput":
        raise UsageError(f"--slo-share acts with --objective throughput (given: {kw['objective']})")
    spec = None
    if kw["engine_config"]:
        from inferlab.engines.launch import EngineSpec, load_spec

        ctx = click.get_current_context()
        sim_flags = [p.opts[-1] for p in ctx.command.params if p.name in _SIM_FLAGS
                 and ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE]
        if sim_flags:
            raise UsageError(f"{sim_flags[0]} is a flag of the simulated engine; with --engine the config file sets the engine (search its settings with --param)")
        spec = load_spec(kw["engine_config"])
    config = TuneConfig(
        _axes(kw["params"], kw, EngineConfig if spec is None else EngineSpec), kw["search"], kw["objective"],
        kw["slo_share"], kw["max_trials"], kw["abort_hopeless"], command_line(),
    )
    if spec is None:  # a release the rules cannot follow fails every trial alike: refuse it now
        searched = next((a.values for a in config.axes if a.name == "engine_version"), None)
        # (a calibrated twin's release and its switches, as sim run takes them)
        kw.update(as_the_twin_was(kw, searched=[a.name for a in config.axes]))
        for release in searched or [kw.get("engine_version")]:
            try:
                engine_release(dataclasses.replace(engine_config(kw), engine_version=release))
            except ConfigError as e:
                raise UsageError(str(e)) from None
        _check_memory_share(config.axes, kw)
    out = kw["out"]
    if kw.get("history") and not out:
        raise UsageError("--history records the tune's sweep.json in the history: give --out too")
    if out:
        check_sweep_dir(out, kw["overwrite"])
    run_config = RunConfig(load_config(kw), workload_config(kw), kw["api"], slo_config(kw), None, kw["overwrite"])
    run_config.workload.build(run_config.load.seed, run_config.api)  # (a bad dataset fails every trial: refused first)
    err = console(stderr=True)
    target: SimTarget | Trials = SimTarget(engine_config(kw)) if spec is None else EngineTrials(spec, err, who="inferlab tune")
    where = ("on the simulated engine (virtual time; predictions)" if spec is None
             else f"on {spec.engine}, started for each trial")
    sized = isinstance(target, SimTarget) and _sized_as_trtllm_bench(run_config, target, config.axes)

    def on_trial(t: Trial) -> None:
        if not kw["as_json"]:
            err.print(_trial_line(t, config))

    async def main_async() -> TuneResult:
        stop = asyncio.Event()
        install_stop_signals(stop)
        tuner = Tuner(run_config, target, config, out, on_trial, stop)
        grid = tuner.grid_size
        if sized and not kw["as_json"]:  # (once the search is known to start)
            err.print("inferlab: offline TensorRT-LLM trials are sized as trtllm-bench sizes them for their lengths and "
                      "KV cache, as sim run sizes them (each trial's config.json has its sizes)", soft_wrap=True,
                      highlight=False)
        if not kw["as_json"]:
            err.print(f"inferlab tune: {config.search} search over {grid} settings of "
                      + ", ".join(a.flag for a in config.axes) + " " + where)
        return await tuner.search()

    result = asyncio.run(main_async())
    if out:
        record_sweep_in_history(out, kw)
    # an engine started from a config can be inferlab's simulator too (kind sim): its
    # trials' servers say so (results.provenance)
    simulated = spec is None or any(t.summary is not None and t.summary.server.simulated for t in result.trials)
    if kw["as_json"]:
        click.echo(json.dumps(_result_json(result, config, simulated), indent=2, allow_nan=False, default=lambda v: getattr(v, "value", str(v))))
    else:
        _render(console(), result, config, out, simulated, virtual=spec is None)
    if result.best is None:
        raise UsageError("no trial completed: see the reasons above") if not result.interrupted else click.exceptions.Exit(130)
    return 130 if result.interrupted else 0


def _sized_as_trtllm_bench(run_config: RunConfig, target: SimTarget, axes: tuple[Axis, ...]) -> bool:
    """Whether a trial may run offline TensorRT-LLM sized as trtllm-bench sizes it
    (``load.run.trtllm_bench_sized``): the base engine, or any family the search tries,
    where the search sets neither size."""
    if any(a.name in ("max_num_seqs", "max_num_batched_tokens") for a in axes):
        return False
    families = next((a.values for a in axes if a.name == "engine_family"), None) or [target.engine.engine_family]
    for family in families:
        engine = dataclasses.replace(target.engine, engine_family=EngineFamily.parse(str(family)))
        with contextlib.suppress(ValueError, UsageError):  # (a trial that cannot start says why)
            if trtllm_bench_sized(sim_engine_config(run_config.load, dataclasses.replace(target, engine=engine)),
                                  run_config.workload) is not None:
                return True
    return False


def _params(t: Trial, sep: str = " ") -> str:
    return sep.join(param_text(k, v) for k, v in t.params.items())


def _fmt(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{v:,.{digits}f}"


def _trial_line(t: Trial, config: TuneConfig) -> str:
    h = t.headline()
    what = f"{config.objective} {t.score:,.2f}" if t.status == "done" else t.status + (f" ({t.reason})" if t.reason else "")
    return (f"trial {t.number}: {_params(t)}: {what}; {_fmt(h.get('output_tok_s'))} out tok/s, "
            f"TTFT p99 {_fmt(h.get('ttft_p99_ms'))} ms, TPOT p99 {_fmt(h.get('tpot_p99_ms'), 2)} ms")


def _render(out: Console, result: TuneResult, config: TuneConfig, folder: str | None, prediction: bool, *, virtual: bool) -> None:
    what = ("measured" if not prediction else "prediction (simulated, virtual time)" if virtual
            else "prediction (inferlab's simulator, over HTTP)")
    table = Table(title=f"inferlab tune: the best and the Pareto front (output tok/s vs TTFT p99); {what}",
                  title_justify="left", header_style="bold")
    for col in ("trial", "flags", config.objective, "out tok/s", "TTFT p99 ms", "TPOT p99 ms"):
        table.add_column(col, justify="left" if col == "flags" else "right", overflow="fold", no_wrap=col != "flags")
    rows = list(result.pareto)
    if result.best is not None and result.best not in rows:
        rows.insert(0, result.best)  # (the best goodput need not be on that front)
    for t in rows:
        h = t.headline()
        mark = " (best)" if result.best is t else ""
        table.add_row(f"{t.number}{mark}", _params(t, "\n"), f"{t.score:,.2f}", _fmt(h["output_tok_s"]), _fmt(h["ttft_p99_ms"]), _fmt(h["tpot_p99_ms"], 2))
    out.print(table)
    done = sum(1 for t in result.trials if t.status == "done")
    interrupted = sum(1 for t in result.trials if t.status == "stopped" and t.reason == "interrupted")
    stopped = sum(1 for t in result.trials if t.status == "stopped") - interrupted
    failed = sum(1 for t in result.trials if t.status == "failed")
    out.print(f"trials: {len(result.trials)} of a grid of {result.grid_size} ({done} done, {stopped} stopped early as hopeless, "
              + (f"{interrupted} interrupted, " if interrupted else "") + f"{failed} failed: refused or not started)"
              + ("; the search was interrupted" if result.interrupted else ""))
    if result.best is not None:
        b = result.best
        note = best_note(result.trials, b)
        out.print(f"best ({config.objective}, {'prediction' if prediction else 'measured'}"
                  + (", of the trials run before the search was interrupted" if result.interrupted else "")
                  + f"): trial {b.number}: {_params(b)}: {b.score:,.2f} "
                  + ("req/s within the SLOs" if config.objective == "goodput" else "output tok/s")
                  + ("" if note is None else f" ({note})"))
        lines = band_lines({"points": [{"params": t.params, "headline": t.headline(), "prediction": headline_prediction(
            t.summary.prediction)} for t in rows if t.summary is not None]}) if virtual else []
        if lines:
            out.print("error bands (the simulator's validation error for its engine family and load regime; goodput, "
                      "the requests within the SLOs, has none of its own: it moves with TTFT and TPOT; a best within "
                      "these bands of the next is no better than it, docs/validation.md):", soft_wrap=True)
            for line in lines:
                out.print(f"  {line}", soft_wrap=True, highlight=False)
    if folder:
        out.print(f"results: {folder}/sweep.json (each trial a run directory beside it)")


def _result_json(result: TuneResult, config: TuneConfig, prediction: bool) -> dict[str, Any]:
    def trial(t: Trial) -> dict[str, Any]:
        return {"trial": t.number, "params": t.params, "status": t.status, "reason": t.reason, "score": t.score,
                "met_slo": t.met, "dir": t.dir, "headline": t.headline()}

    return {
        "search": config.search, "objective": config.objective, "grid_size": result.grid_size,
        "trials": [trial(t) for t in result.trials],
        "best": None if result.best is None else {**trial(result.best), **best_json(result.trials, result.best)},
        "pareto": [t.number for t in result.pareto], "interrupted": result.interrupted, "prediction": prediction,
    }
