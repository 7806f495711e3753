"""``inferlab sweep``: many runs over a grid of load, workload and (against the simulator)
engine settings; a saturation stop per load axis, a goodput search, repeats.

Every ``bench``/``sim run`` flag works here; those that take a value and name a grid axis
(the load, workload lengths and prefixes, every engine flag that takes a value) also take
a comma list, e.g. ``-c 1,2,4,8`` or ``--gpu H100,L40S``.

``--engine CONFIG`` starts a real engine (``inferlab engine start``'s config) and
measures it over HTTP: once for the whole sweep, or once per value of an engine flag
that names one of the config's settings (``--max-num-seqs 4,16``: the engine restarted
with each); the simulator's other flags are refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from inferlab._errors import UsageError
from inferlab.cli.common import (
    FloatRange,
    OneNamePerSetting,
    as_sweep_output,
    check_users_have_requests,
    command_line,
    console,
    finish_run,
    given,
    http_options,
    install_stop_signals,
    load_config,
    load_options,
    parse_headers,
    parse_rate,
    record_sweep_in_history,
    run_guarded,
    server_metrics_options,
    slo_config,
    workload_config,
)
from inferlab.cli.engine import FIXED_SETTINGS, EngineTrials
from inferlab.cli.sim import RUN_DEFAULTS, as_the_twin_was, engine_config, engine_options
from inferlab.client.exchange import api_base
from inferlab.engines.launch import EngineSpec, load_spec
from inferlab.load.run import (
    HttpTarget,
    RunConfig,
    RunResult,
    SimTarget,
    Target,
    metrics_pages,
    sim_engine_config,
    trtllm_bench_sized,
)
from inferlab.openai.request import Api
from inferlab.report.sweep import params_text, point_line, render_sweep
from inferlab.results.provenance import PREDICTION, ServerInfo
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.results.runfiles import dumps
from inferlab.results.sweepindex import check_sweep_dir
from inferlab.sweep.grid import Grid, is_ascending, parse_values, point_configs
from inferlab.sweep.runner import (
    GoodputSearch,
    SweepConfig,
    SweepResult,
    Trials,
    check_points,
    run_sweep,
)
from inferlab.sweep.saturation import SaturationRules

#: load and workload flags that take a comma list (a grid axis each)
LOAD_AXES = ("concurrency", "rate")
WORKLOAD_AXES = ("input_tokens", "output_tokens", "prefix_tokens", "prefix_groups", "suffix_tokens")
#: the default load axis: users doubling up to 256, until saturation
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: flags that only mean something against a server
_HTTP_ONLY = ("stream", "api_key", "header", "timeout", "idle_timeout", "workers", "http_client", "preflight",
              "server_metrics", "metrics_urls")
#: flags a sweep refuses, with what to do instead
_REFUSED = {
    "trace": "a trace replays at its own times, with no load axis to sweep (run it with bench or sim run)",
    "save_result": "each point is a run directory: write a vLLM result from one with `inferlab export DIR --format vllm`",
}


def _params(decorate: Callable[[Callable[..., Any]], Callable[..., Any]]) -> list[click.Parameter]:
    """The click parameters a decorator such as ``load_options`` adds, in order."""

    def holder() -> None:
        pass

    decorate(holder)
    return list(reversed(getattr(holder, "__click_params__", [])))


def _listed(opt: click.Parameter, default: Any = None) -> click.Option:
    """``opt`` taking a comma list: each value read as ``opt`` reads one (its type and
    callback), into a tuple; ``default`` stands for not given."""
    assert isinstance(opt, click.Option)

    def read(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[Any, ...] | None:
        if value is None:
            return None
        try:
            words = parse_values(value)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
        out = []
        for word in words:
            v = opt.type.convert(word, opt, ctx)
            if opt.callback is not None:
                v = opt.callback(ctx, opt, v)
            out.append(v)
        return tuple(out)

    shown = opt.default if opt.default is not None else opt.show_default
    return click.Option(
        [opt.name or "", *opt.opts], type=click.STRING, default=default, callback=read,
        help=(opt.help or "") + " A comma list sweeps it.",
        show_default=str(shown) if isinstance(shown, str | int | float) and not isinstance(shown, bool) else False,
        metavar="V[,V...]",
    )


def _sweep_params() -> list[click.Parameter]:
    params: list[click.Parameter] = []
    for p in _params(load_options):
        params.append(_listed(p) if p.name in LOAD_AXES + WORKLOAD_AXES else p)
    for p in _params(engine_options(RUN_DEFAULTS)):
        assert isinstance(p, click.Option)
        params.append(p if p.is_flag else _listed(p))
    return params + _params(http_options) + _params(server_metrics_options)


#: a server flag's name on the command line (``--[no-]stream`` for a switch)
_HTTP_FLAG = {
    p.name or "": ("--[no-]" if isinstance(p, click.Option) and p.secondary_opts else "--")
    + next(o for o in [*p.opts, "--" + (p.name or "")] if o.startswith("--")).removeprefix("--")
    for p in _params(http_options) + _params(server_metrics_options)
}
assert set(_HTTP_ONLY) <= set(_HTTP_FLAG)

ENGINE_PARAMS = _params(engine_options(RUN_DEFAULTS))
#: engine flags: refused with --url
ENGINE_FLAGS = tuple(p.name or "" for p in ENGINE_PARAMS)
#: the engine's on/off flags: one value each, not a list
_ENGINE_SWITCHES = frozenset(p.name for p in ENGINE_PARAMS if isinstance(p, click.Option) and p.is_flag)
#: an engine flag's name on the command line (``api_overhead_s`` is ``--api-latency-ms``)
_FLAG_OF = {p.name or "": p.opts[0] for p in ENGINE_PARAMS}


def engine_flag(name: str) -> str:
    return _FLAG_OF.get(name) or "--" + name.replace("_", "-")


#: engine flags that name a setting of an engine config: with --engine they set it (a
#: comma list: an axis, the engine restarted per value); the others are refused
SPEC_FLAGS = tuple(n for n in ENGINE_FLAGS if n in {f.name for f in dataclasses.fields(EngineSpec)} - FIXED_SETTINGS)


def _sweep_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    attached: list[click.Parameter] = getattr(fn, "__click_params__", [])
    attached.extend(reversed(_sweep_params()))  # (as click.option attaches one: last first)
    fn.__click_params__ = attached  # type: ignore[attr-defined]  # click's own attribute
    return fn


@click.command(cls=OneNamePerSetting)
@click.option("--url", "--base-url", "url", help="An OpenAI-compatible server: every point runs over HTTP on the wall clock. Default: the simulator in virtual time (seconds for a whole sweep; every number a prediction).")
@click.option("--engine", "engine_config", type=click.Path(dir_okay=False), help="Start this engine (a TOML/JSON file, as for inferlab engine start) and measure it over HTTP, stopping it after: once for the whole sweep, or once per value of --max-num-seqs, --max-num-batched-tokens, --max-model-len, --tensor-parallel-size or --gpu-memory-utilization given as a comma list (a single value, and --[no-]enable-prefix-caching, --[no-]enforce-eager, replace the config's setting). The simulator's other engine flags are refused.")
@click.option("--api", type=click.Choice(["chat", "completions"]), help="Default: chat against --url or --engine, completions in the simulator (as bench and sim run).")
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True, help="Run every point this many times (the seed advanced each time) and report each headline metric's mean with a 95 % t confidence interval.")
@click.option("--saturation-gain", type=FloatRange(min=0), default=0.05, show_default=True, help="Stop a load axis when output tok/s rose by less than this share over the previous load (0.05: 5 %).")
@click.option("--ttft-growth", type=FloatRange(min=1, min_open=True), default=4.0, show_default=True, help="Stop a load axis when TTFT p50 grew more than this many times over the previous load's, beyond what output tok/s grew.")
@click.option("--saturation-stop/--no-saturation-stop", default=True, show_default=True, help="Stop each load axis at saturation (throughput flat, errors, TTFT exploding); off: run every load.")
@click.option("--find-max-rate", is_flag=True, help="Goodput search: the highest --rate (start: --rate R, default 1) at which --slo-share of the requests meet the --slo-*-ms limits, by bracketing then bisection to 10 %.")
@click.option("--slo-share", type=FloatRange(min=0, max=1, min_open=True), default=0.9, show_default=True, help="With --find-max-rate: the share of requests that must meet every SLO.")
@_sweep_options
def sweep(**kw: Any) -> None:
    """Run a grid of points (load x workload x engine) into one folder, each a run directory, indexed by sweep.json."""
    sys.exit(run_guarded(lambda: _sweep(kw)))


as_sweep_output(sweep, "point", "Print sweep.json on stdout instead of the table.")


def _sweep(kw: dict[str, Any]) -> int:
    config = sweep_config(kw)
    check_sweep_dir(config.out_dir, config.overwrite)
    check_points(config)  # (run_sweep checks again: a library call must too)
    # (an engine the sweep starts says so on the console the progress is on)
    err = config.target.err if isinstance(config.target, EngineTrials) else console(stderr=True)
    out = console()
    watcher = _Watcher(err, config)
    err.print(f"inferlab sweep: {_target_line(config)} → {config.out_dir}/sweep.json", soft_wrap=True, highlight=False)
    if sized := _sized_as_trtllm_bench(config):
        err.print(f"inferlab: offline TensorRT-LLM points sized as trtllm-bench sizes them for their mean lengths and KV "
                  f"cache ({'; '.join(sized)}), as sim run sizes them; give --max-num-seqs or --max-num-batched-tokens "
                  "to say otherwise", soft_wrap=True, highlight=False)

    def after_run(result: RunResult, path: str) -> RunResult:
        # (finish_run also records the point in the run history, as any run)
        return finish_run(result, {**kw, "out": path, "save_result": False})

    async def main_async() -> SweepResult:
        stop = asyncio.Event()
        install_stop_signals(stop)
        return await run_sweep(config, listener=watcher, stop=stop, after_run=after_run)

    with watcher:
        result = asyncio.run(main_async())
    record_sweep_in_history(config.out_dir, kw)
    if kw["as_json"]:
        click.echo(dumps(result.index))
    else:
        render_sweep(out, result.index, _title(config, result.index))
        out.print(f"sweep: {config.out_dir}/sweep.json ({sum(1 for p in result.index['points'] if p['dir'])} run directories)")
    if result.interrupted:
        return 130
    if not any(p["dir"] for p in result.index["points"]):
        click.echo("inferlab: no point ran: the engine did not start with any setting (sweep.json's points say why)", err=True)
        return 1
    return 0


def _sized_as_trtllm_bench(config: SweepConfig) -> list[str]:
    """The sizes each offline TensorRT-LLM point of a simulated sweep runs with, where
    trtllm-bench's sizing gives them (``load.run.trtllm_bench_sized``), one text each."""
    if not isinstance(config.target, SimTarget):
        return []
    grid, said = config.grid, []
    for params in grid.groups():
        for load in dict.fromkeys(grid.load_values):
            run_cfg, target = point_configs(config.run, config.target, grid.load_axis, load, params)
            assert isinstance(target, SimTarget)
            try:
                sized = trtllm_bench_sized(sim_engine_config(run_cfg.load, target), run_cfg.workload)
            except ValueError:  # (an engine that cannot start: that point fails and says why)
                continue
            if sized is not None:
                where = params_text({**params, grid.load_axis: load})
                said.append(f"{where}: --max-num-seqs {sized.max_num_seqs} --max-num-batched-tokens {sized.max_num_batched_tokens}")
    return list(dict.fromkeys(said))


def _as_the_twin_was(kw: dict[str, Any], url: str | None) -> None:
    """One calibrated twin (``--efficiencies``) of one family: every point runs as the
    twin was calibrated where its flags do not say otherwise, as ``sim run`` does
    (``cli.sim.as_the_twin_was``); with several twins or families, each point runs as
    its flags say, and that is said."""
    twin, family = kw.get("efficiencies_path"), kw.get("engine_family") or ("vllm",)
    if url is not None or kw.get("engine_config") is not None or not isinstance(twin, tuple) or not twin:
        return
    if len(twin) > 1 or not isinstance(family, tuple) or len(family) > 1:
        click.echo("inferlab: --efficiencies or --engine-family is a list: each point runs as its flags say (a twin's "
                   "own release, switches and server settings are taken by a sweep of one twin and one family)", err=True)
        return
    settings = as_the_twin_was({**kw, "efficiencies_path": twin[0], "engine_family": family[0],
                                "engine_version": None if kw.get("engine_version") is None else kw["engine_version"][0]})
    for key, value in settings.items():  # (a listed flag's value is a tuple here)
        kw[key] = value if key in _ENGINE_SWITCHES else (value,)


def sweep_config(kw: dict[str, Any]) -> SweepConfig:
    """The sweep the flags ask for; ``UsageError`` for flags it cannot honour."""
    for name, why in _REFUSED.items():
        if kw.get(name):
            raise UsageError(f"--{name.replace('_', '-')}: {why}")
    if kw["out"] is None:
        raise UsageError("a sweep needs -o/--out DIR: the folder its run directories and sweep.json go in")
    url = kw["url"]
    pages: tuple[str, ...] = ()
    if kw["engine_config"] is not None:
        if url is not None:
            raise UsageError("--engine starts the server to measure: give --engine or --url, not both")
        refused = [n for n in ENGINE_FLAGS if n != "model" and n not in SPEC_FLAGS and given(n)]
        if refused:
            flags = ", ".join(map(engine_flag, refused))
            raise UsageError(f"{flags}: flags of the simulated engine; with --engine the config file sets the engine "
                             "(here only its settings: " + ", ".join(map(engine_flag, SPEC_FLAGS)) + ")")
        if kw["model"] is not None and len(kw["model"]) > 1:
            raise UsageError("--model: with --engine the config names the model and a sweep requests one (the model name)")
        if kw["metrics_urls"]:
            raise UsageError("--metrics-url needs --url: the server --engine starts has its own /metrics read already")
    elif url is not None:
        try:
            api_base(url)
        except ValueError as e:  # (refused before any point runs, as bench refuses it)
            raise UsageError(f"--url: {e}") from None
        pages = metrics_pages(kw["metrics_urls"], kw["server_metrics"])  # (likewise)
        engine = [n for n in ENGINE_FLAGS if n != "model" and given(n)]
        if engine:
            flags = ", ".join(map(engine_flag, engine))
            raise UsageError(
                f"{flags}: engine flags apply to the simulator (no --url), which the sweep runs in virtual time; "
                "against --url the engine is the server's own (start it with those flags)"
            )
        if kw["model"] is not None and len(kw["model"]) > 1:
            raise UsageError("--model: against --url a sweep requests one model (a list sweeps simulated models)")
    else:
        http = [n for n in _HTTP_ONLY if given(n)]
        if http:
            flags = ", ".join(_HTTP_FLAG[n] for n in http)
            raise UsageError(f"{flags}: only for runs against --url (without it the sweep runs the simulator in virtual time)")
    tuning = [f for f in ("saturation_gain", "ttft_growth") if given(f)]
    if kw["find_max_rate"] and (tuning or given("saturation_stop")):
        flags = ", ".join("--" + f.replace("_", "-") for f in tuning) or "--[no-]saturation-stop"
        raise UsageError(f"{flags}: the saturation stop applies to a load axis, not to --find-max-rate")
    if tuning and not kw["saturation_stop"]:
        flags = ", ".join("--" + f.replace("_", "-") for f in tuning)
        raise UsageError(f"{flags}: these tune the saturation stop, which --no-saturation-stop turns off")
    if kw["find_max_rate"]:
        load_axis, loads = _search_axis(kw)
    else:
        if given("slo_share"):
            raise UsageError("--slo-share needs --find-max-rate")
        load_axis, loads = _load_axis(kw)
        if kw["saturation_stop"] and not is_ascending(loads):
            raise UsageError(f"--{load_axis}: the saturation stop needs the loads in ascending order (or --no-saturation-stop)")
    _as_the_twin_was(kw, url)
    axes: list[tuple[str, tuple[Any, ...]]] = []
    base = dict(kw)
    for name in WORKLOAD_AXES + ENGINE_FLAGS:
        values = kw.get(name)
        if isinstance(values, tuple):  # a listed flag given: its first value, or an axis
            base[name] = values[0]
            if len(values) > 1:
                axes.append((name, values))
        elif values is None and name in ENGINE_FLAGS:
            base.pop(name, None)  # not given: the engine's default
    if url is not None or kw["engine_config"] is not None:
        axes = [(n, v) for n, v in axes if n != "model"]
    base["concurrency"] = int(loads[0]) if load_axis == "concurrency" else None
    base["rate"] = str(loads[0]) if load_axis == "rate" else None
    api: Api = kw["api"] or ("chat" if url is not None or kw["engine_config"] is not None else "completions")
    base["api"] = api
    load = load_config(base)  # every load flag checked as bench checks it
    slo = slo_config(kw)
    run = RunConfig(load, workload_config(base), api, slo)
    target: Target | Trials
    if url is None and kw["engine_config"] is None:
        target = SimTarget(engine_config(base))
    else:
        target = HttpTarget(
            url or "", base.get("model"), kw["stream"], kw["api_key"], parse_headers(kw["header"]), kw["timeout"],
            kw["idle_timeout"], kw["preflight"], workers=kw["workers"], http_client=kw["http_client"],
            server_metrics=kw["server_metrics"], metrics_urls=pages,
        )
        if kw["engine_config"] is not None:
            target = _engine_target(kw["engine_config"], base, axes, target)
            axes.sort(key=lambda a: a[0] not in SPEC_FLAGS)  # its settings slowest: each started once
    goodput = None
    if kw["find_max_rate"]:
        if slo is None:
            raise UsageError("--find-max-rate needs an SLO: --slo-ttft-ms, --slo-tpot-ms or --slo-e2e-ms")
        if kw["repeats"] > 1:
            raise UsageError("--repeats with --find-max-rate is not supported: each probe is one run")
        goodput = GoodputSearch(slo, kw["slo_share"], loads[0])
    rules = SaturationRules(kw["saturation_gain"], kw["ttft_growth"]) if kw["saturation_stop"] else None
    auto = not (given("num_requests") or given("duration") or kw.get("sessions"))
    if load_axis == "concurrency" and not auto and load.num_requests is not None and not kw.get("sessions"):
        # (a point of more users than requests would run fewer: the largest decides)
        check_users_have_requests(int(max(loads)), load.num_requests, load.warmup)
    try:
        grid = Grid(load_axis, tuple(loads), tuple(axes))
    except ValueError as e:
        raise UsageError(str(e)) from e
    return SweepConfig(
        run, target, grid, kw["out"], kw["repeats"], rules, goodput, auto, kw["overwrite"], command=command_line(),
    )


def _engine_target(path: str, base: dict[str, Any], axes: list[tuple[str, tuple[Any, ...]]],
                   http: HttpTarget) -> EngineTrials:
    """The engine of ``path``, the settings given as flags put in (an axis's values
    each checked, before anything starts), measured over HTTP as ``http`` says."""
    swept = {n for n, _ in axes}
    trials = EngineTrials(load_spec(path), console(stderr=True), http, who="inferlab sweep")
    trials.spec = trials.setting({n: base[n] for n in SPEC_FLAGS if n not in swept and given(n)})
    for name, values in axes:
        for v in values if name in SPEC_FLAGS else ():
            try:
                trials.setting({name: v})
            except UsageError as e:
                raise UsageError(f"--{name.replace('_', '-')} {v}: {e}") from None
    return trials


def _load_axis(kw: dict[str, Any]) -> tuple[str, list[float]]:
    conc, rate = kw["concurrency"], kw["rate"]
    if conc is not None and rate is not None:
        raise UsageError("--concurrency and --rate are exclusive: a sweep has one load axis")
    if rate is not None:
        return "rate", [_rate(r) for r in rate]
    if kw["max_concurrency"] is not None and conc is None:
        raise UsageError("--max-concurrency caps an open loop: give --rate values, or sweep users with --concurrency")
    users = list(conc or DEFAULT_CONCURRENCY)
    if any(u < 1 for u in users):
        raise UsageError(f"--concurrency values must be at least 1, not {min(users)}")
    return "concurrency", users


def _search_axis(kw: dict[str, Any]) -> tuple[str, list[float]]:
    if kw["concurrency"] is not None:
        raise UsageError("--find-max-rate searches over --rate: give no --concurrency")
    rates = [_rate(r) for r in (kw["rate"] or ("1",))]
    if len(rates) > 1:
        raise UsageError("--find-max-rate takes one --rate: where the search starts")
    if rates[0] == float("inf"):
        raise UsageError("--find-max-rate: the start --rate must be finite")
    return "rate", rates


def _rate(text: str) -> float:
    rate = parse_rate(text)
    assert rate is not None
    if not rate > 0:
        raise UsageError("--rate values must be positive")
    return rate


def _target_line(config: SweepConfig) -> str:
    # (over HTTP, whether the server is inferlab's simulator is known once a point ran)
    t = config.target
    if isinstance(t, SimTarget):
        return f"simulating {_engine_text(config)} in virtual time {PREDICTION}"
    if isinstance(t, EngineTrials):
        return f"running against {_started(t, config)}"
    assert isinstance(t, HttpTarget)
    return f"running against {t.url}"


def _started(t: EngineTrials, config: SweepConfig) -> str:
    varied = [n for n, _ in config.grid.axes if n in t.fields]
    each = f", started for each {', '.join('--' + n.replace('_', '-') for n in varied)}" if varied else ", started for the sweep"
    return f"{t.spec.engine} serving {t.spec.model}{each}"


def _engine_text(config: SweepConfig) -> str:
    """``model on TPx GPU``, an axis's values where it varies (``{1,4}x H100``)."""
    assert isinstance(config.target, SimTarget)
    e, axes = config.target.engine, dict(config.grid.axes)

    def show(name: str, value: Any) -> str:
        return "{" + ",".join(str(v) for v in axes[name]) + "}" if name in axes else str(value)

    return f"{show('model', e.model)} on {show('tensor_parallel_size', e.tensor_parallel_size)}x {show('gpu', e.gpu)}"


def _title(config: SweepConfig, index: dict[str, Any]) -> str:
    """What the table shows: a prediction in virtual time, a prediction over HTTP (its
    points ran against a server that identified itself as inferlab's simulator:
    ``results.provenance``; sweep.json's ``prediction``), or a measurement."""
    t = config.target
    if isinstance(t, SimTarget):
        return f"prediction (simulated, virtual time): {_engine_text(config)}"
    simulated = bool(index.get("prediction"))
    if isinstance(t, EngineTrials):
        return f"{'prediction' if simulated else 'measured'}: {_started(t, config)}" + (" (inferlab's simulator, over HTTP)" if simulated else "")
    assert isinstance(t, HttpTarget)
    if not simulated:
        return f"measured: {t.url}"
    server = next((info for p in index["points"] if (info := _point_server(config, p)) is not None and info.simulated), None)
    return f"prediction ({server.where if server is not None else t.url}, over HTTP)"


def _point_server(config: SweepConfig, entry: dict[str, Any]) -> ServerInfo | None:
    """The server a point ran against, as its summary.json names it (``results.provenance``:
    sim serve, the gateway in front of it, another server); None without one."""
    if not entry.get("dir"):
        return None
    try:
        server = json.loads((Path(config.out_dir) / entry["dir"] / "summary.json").read_text()).get("server")
    except (OSError, ValueError):
        return None
    return ServerInfo.from_json(server) if isinstance(server, dict) else None


class _Watcher:
    """The sweep's progress on stderr: a live line (which point, its requests) and a row
    per point as it finishes."""

    def __init__(self, console: Console, config: SweepConfig) -> None:
        self.console = console
        self.config = config
        self.label = ""
        self.done = self.failed = 0
        self.total: int | None = None
        self.announced = False  # over HTTP: said that the server is inferlab's simulator
        self._status = console.status("starting", spinner="dots") if console.is_terminal else None

    def __enter__(self) -> _Watcher:
        if self._status is not None:
            self._status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(None, None, None)

    def point_started(self, entry: dict[str, Any], number: int) -> None:
        self.label = f"point {number}: {params_text(entry['params'])}" + (
            f" rep {entry['repeat'] + 1}/{self.config.repeats}" if self.config.repeats > 1 else ""
        )
        self.done = self.failed = 0
        self._show()

    def record(self, r: RequestRecord) -> None:
        if r.ok:
            self.done += 1
        elif r.error_kind is not ErrorKind.CANCELLED:
            self.failed += 1
        self._show()

    def point_done(self, entry: dict[str, Any]) -> None:
        virtual = isinstance(self.config.target, SimTarget)
        server = None if virtual else _point_server(self.config, entry)
        over_http = server is not None and server.simulated
        if server is not None and over_http and not self.announced:  # (over HTTP, known once a point ran)
            self.console.print(f"  the server is {server.where}: every number is a prediction", highlight=False, soft_wrap=True)
            self.announced = True
        # (a point with error bands already says "prediction: ...")
        mark = f" {PREDICTION}" if (virtual or over_http) and not entry.get("prediction") else ""
        self.console.print(f"  {point_line(entry)}{mark}", highlight=False, soft_wrap=True)

    def group_done(self, group: dict[str, Any]) -> None:
        s = group.get("stopped")
        if s is not None:
            knee = "none (no point before it)" if s.get("knee") is None else f"{group['load_axis']}={s['knee']:g}"
            self.console.print(f"  → stopped: {str(s['reason']).rstrip('.')}; knee: {knee}", highlight=False, soft_wrap=True)

    def _show(self) -> None:
        if self._status is not None:
            self._status.update(f"{self.label} · {self.done} done · {self.failed} failed")
