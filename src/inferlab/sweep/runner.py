"""``run_sweep``: the points of a sweep, in order, each through ``load.run.run`` (the call
behind ``bench`` and ``sim run``) into a run directory of its own; ``sweep.json``
rewritten after every point, so that an interrupted sweep leaves a valid index of what
finished.

The target is the simulator, a server, or ``Trials``: an engine the sweep starts itself
(``inferlab sweep --engine``), once for the whole sweep, or once per setting of its
engine axes (the axes that vary it run slowest, so each setting starts once), and stops
after.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import statistics
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from inferlab._errors import InferlabError, RunFailedError, UsageError
from inferlab.load.run import (
    HttpTarget,
    RunConfig,
    RunResult,
    SimTarget,
    Target,
    run,
    sim_engine_config,
)
from inferlab.results.metrics import SLO
from inferlab.results.records import RequestRecord
from inferlab.results.runfiles import plain_json
from inferlab.results.sweepindex import (
    CI_METRICS,
    FORMAT,
    INDEX,
    check_sweep_dir,
    headline,
    index_target,
    make_sweep_dir,
    write_index,
)
from inferlab.sim.engine.bands import headline_prediction
from inferlab.sim.engine.engine import Engine
from inferlab.sweep.goodput import Probe, SearchResult, find_max_rate, slo_share
from inferlab.sweep.grid import WORKLOAD_FIELDS, Grid, point_configs, slug
from inferlab.sweep.saturation import SaturationRules, check
from inferlab.sweep.stats import t_interval


class Trials(Protocol):
    """Targets started on demand (an engine launched from a config): the settings it
    takes (``fields``), what ``sweep.json`` says of it, whether its numbers are
    predictions, and the target of one setting for as long as the context lasts (an
    engine started for it, its output in ``log_path``, is stopped after; ``stop`` set
    while it starts: it gives up, ``InferlabError``)."""

    fields: frozenset[str]
    prediction: bool

    def target_json(self) -> dict[str, Any]: ...

    def open(self, params: dict[str, Any], log_path: str | None,
             stop: asyncio.Event | None = None) -> AbstractAsyncContextManager[Target]: ...


@dataclass(frozen=True)
class GoodputSearch:
    """Find, per group, the highest rate at which ``share`` of the requests meet ``slo``,
    from ``start_rps``, to within ``step`` (see ``sweep.goodput``)."""

    slo: SLO
    share: float = 0.9
    start_rps: float = 1.0
    step: float = 1.1
    max_probes: int = 40

    def __post_init__(self) -> None:
        if not 0 < self.share <= 1:
            raise UsageError("--slo-share is a share of requests, above 0 and at most 1")


@dataclass(frozen=True)
class SweepConfig:
    """A sweep: the base ``run`` (its ``out_dir`` unused) and ``target``, the ``grid``,
    where to write it (``out_dir``), ``repeats`` of every point, the saturation rules
    (None: run every load), and a goodput search instead of the load axis (its grid's
    load axis is ``rate``). ``auto_requests``: size each point's request count to its
    load (``grid.auto_num_requests``). ``command``: the command line, for the index.
    ``target`` a ``Trials``: an engine the sweep starts (per setting of the grid's axes
    in its ``fields``)."""

    run: RunConfig
    target: Target | Trials
    grid: Grid
    out_dir: str
    repeats: int = 1
    saturation: SaturationRules | None = field(default_factory=SaturationRules)
    goodput: GoodputSearch | None = None
    auto_requests: bool = True
    overwrite: bool = False
    command: str = ""

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise UsageError("--repeats must be at least 1")
        if self.goodput is not None and self.grid.load_axis != "rate":
            raise UsageError("a goodput search varies the rate: give no --concurrency")
        if isinstance(self.target, HttpTarget) and self.grid.engine_axes():
            raise UsageError("engine settings are the server's own: a sweep against a URL cannot vary them")
        if not isinstance(self.target, HttpTarget | SimTarget):
            others = [n for n in self.grid.engine_axes() if n not in self.target.fields]
            if others:
                raise UsageError(f"{', '.join(others)}: not a setting of the engine the sweep starts")


def launch_params(config: SweepConfig, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A group's ``params`` split: (the settings an engine the sweep starts takes, the
    rest); against the simulator or a server, nothing is started."""
    t = config.target
    if isinstance(t, HttpTarget | SimTarget):
        return {}, params
    mine = {k: v for k, v in params.items() if k in t.fields and k not in WORKLOAD_FIELDS}
    return mine, {k: v for k, v in params.items() if k not in mine}


class Listener(Protocol):
    """What a sweep tells its watcher (the CLI's progress)."""

    def point_started(self, entry: dict[str, Any], number: int) -> None: ...
    def record(self, r: RequestRecord) -> None: ...
    def point_done(self, entry: dict[str, Any]) -> None: ...
    def group_done(self, group: dict[str, Any]) -> None: ...


class _Quiet:
    def point_started(self, entry: dict[str, Any], number: int) -> None:
        pass

    def record(self, r: RequestRecord) -> None:
        pass

    def point_done(self, entry: dict[str, Any]) -> None:
        pass

    def group_done(self, group: dict[str, Any]) -> None:
        pass


#: After each run: (the result, its directory) -> the result to keep (e.g. with more
#: percentiles added). The CLI also records the run in the history here.
AfterRun = Callable[[RunResult, str], RunResult]


@dataclass
class SweepResult:
    """The index as written (``sweep.json``), and whether the sweep was interrupted."""

    index: dict[str, Any]
    interrupted: bool


async def run_sweep(
    config: SweepConfig,
    *,
    listener: Listener | None = None,
    stop: asyncio.Event | None = None,
    after_run: AfterRun | None = None,
) -> SweepResult:
    """Run ``config``'s points in order into ``config.out_dir``; see the module. Setting
    ``stop`` ends the point in flight (kept, status ``stopped``) and marks the points not
    run ``skipped``. ``UsageError`` before anything runs if the folder holds a sweep
    (without ``overwrite``); a server that stops answering ends the sweep with its error,
    the index kept."""
    existed = _prepare_dir(config)
    sweep = _Sweep(config, listener or _Quiet(), stop or asyncio.Event(), after_run)
    try:
        return await sweep.run()
    except BaseException:
        if not sweep.index["points"]:  # nothing ran (no server there): leave no empty sweep behind
            _remove_index(config.out_dir, existed)
        raise


def _prepare_dir(config: SweepConfig) -> bool:
    """Check the folder and the points, make the folder; whether it existed."""
    check_sweep_dir(config.out_dir, config.overwrite)
    check_points(config)
    existed = os.path.isdir(config.out_dir)
    make_sweep_dir(config.out_dir)
    return existed


def _remove_index(out_dir: str, keep_dir: bool) -> None:
    with contextlib.suppress(OSError):
        (Path(out_dir) / INDEX).unlink()
        if not keep_dir:
            os.rmdir(out_dir)


def check_points(config: SweepConfig) -> None:
    """Fail fast, before anything runs, on settings no point can run with: each group's
    workload is built and its simulated engine sized at each load (``UsageError``: an
    unknown name, a bad length). A simulated engine that cannot run (one that does not
    hold the model, a token budget below its sequences) fails only the points of its
    setting when an engine axis has other settings that run: those points are recorded
    as failed and the other groups go on. When no point's engine can run (the fixed
    engine flags are at fault, or every setting of the engine axes), ``UsageError`` with
    the engine's reason, as ``sim run`` gives it."""
    grid = config.grid
    refused: list[tuple[dict[str, Any], str]] = []  # (group, why its engine cannot run)
    runs = not isinstance(config.target, SimTarget)
    for params in grid.groups():
        # (an engine the sweep starts is checked by its own: here, the workload)
        rest = launch_params(config, params)[1]
        base = config.target if isinstance(config.target, HttpTarget | SimTarget) else HttpTarget("")
        run_cfg = point_configs(config.run, base, grid.load_axis, grid.load_values[0], rest,
                                auto_requests=config.auto_requests)[0]
        run_cfg.workload.build(run_cfg.load.seed, run_cfg.api)
        if isinstance(base, SimTarget):
            why = _engine_refusal(config, base, rest)
            if why is None:
                runs = True
            else:
                refused.append((params, why))
    if not runs and refused:
        params, why = refused[0]
        if all(w == why for _, w in refused):
            raise UsageError(why)  # (whatever the axes: the flags every point shares)
        setting = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in params.items() if k in grid.engine_axes())
        raise UsageError(f"no engine setting of the sweep can run; with {setting}: {why}")


def _engine_refusal(config: SweepConfig, base: SimTarget, params: dict[str, Any]) -> str | None:
    """Why the simulated engine of a group (``params`` put in ``base``) cannot run at any
    load of the sweep (sized as each point's run sizes it: offline at ``--rate inf``),
    or None."""
    grid, reasons = config.grid, []
    for load in dict.fromkeys(grid.load_values):
        run_cfg, target = point_configs(config.run, base, grid.load_axis, load, params)
        assert isinstance(target, SimTarget)
        try:
            Engine(sim_engine_config(run_cfg.load, target, run_cfg.workload))
        except ValueError as e:
            reasons.append(str(e))
        else:
            return None
    return reasons[0]


class _Sweep:
    def __init__(self, config: SweepConfig, listener: Listener, stop: asyncio.Event, after_run: AfterRun | None) -> None:
        self.config = config
        self.listener = listener
        self.stop = stop
        self.after_run = after_run
        self.count = 0
        self.interrupted = False
        # the target points run against: a started engine's, while its setting lasts
        self.target: Target | None = config.target if isinstance(config.target, HttpTarget | SimTarget) else None
        self.engines = contextlib.AsyncExitStack()  # the engine started, stopped on the way out
        self.launched: dict[str, Any] | None = None  # its setting
        self.refused: list[tuple[dict[str, Any], str]] = []  # settings it did not start with, and why
        g = config.goodput
        self.index: dict[str, Any] = {
            "format": FORMAT,
            "command": config.command,
            "target": index_target(target_json(config.target) if isinstance(config.target, HttpTarget | SimTarget)
                                   else config.target.target_json(), config.grid.engine_axes()),
            "prediction": isinstance(config.target, SimTarget),
            "axes": config.grid.to_json(),
            "load_axis": config.grid.load_axis,
            "repeats": config.repeats,
            "saturation": None if config.saturation is None else dataclasses.asdict(config.saturation),
            "points": [],
            "groups": [],
            "aggregates": [],
            "goodput_search": None if g is None else {
                "slo": dataclasses.asdict(g.slo), "share": g.share, "start_rate": g.start_rps, "step": g.step,
                "groups": [],
            },
            "complete": False,
        }

    def write(self) -> None:
        write_index(self.config.out_dir, self.index)

    async def run(self) -> SweepResult:
        async with self.engines:  # (an engine still running stops here, whatever ended the sweep)
            return await self._run()

    async def _run(self) -> SweepResult:
        self.write()
        for params in self.config.grid.groups():
            group: dict[str, Any] = {"params": plain_json(params), "load_axis": self.config.grid.load_axis, "stopped": None}
            self.index["groups"].append(group)
            if self.interrupted or self.stop.is_set():
                self.interrupted = True
                self._skip(params, self.config.grid.load_values, "interrupted")
            elif not await self._launch(params, group):
                pass  # the engine did not start: said in the group
            elif self.config.goodput is not None:
                await self._search(params, group)
            else:
                await self._load_axis(params, group)
            self.write()
            self.listener.group_done(group)
        self.index["complete"] = not self.interrupted
        self.write()
        return SweepResult(self.index, self.interrupted)

    async def _launch(self, params: dict[str, Any], group: dict[str, Any]) -> bool:
        """Start the engine of this group's setting, unless it runs already (the
        previous setting's stopped first); whether there is one to measure. An engine
        that does not start fails its group (its first point says why, the rest are
        skipped), or, with no axis of its settings, the whole sweep."""
        trials = self.config.target
        if isinstance(trials, HttpTarget | SimTarget):
            return True
        setting = launch_params(self.config, params)[0]
        if setting == self.launched:
            return True
        await self.engines.aclose()  # (AsyncExitStack: usable again once closed)
        self.launched = self.target = None
        why = next((w for s, w in self.refused if s == setting), None)  # (not started twice)
        if why is None:
            name = "engine.log" if not setting else f"engine_{slug(setting)}.log"
            try:
                self.target = await self.engines.enter_async_context(
                    trials.open(setting, str(Path(self.config.out_dir) / name), self.stop))
            except InferlabError as e:
                if self.stop.is_set():
                    self.interrupted = True
                    self._skip(params, self.config.grid.load_values, "interrupted")
                    return False
                if not setting:
                    raise
                why = str(e)
                self.refused.append((setting, why))
        if why is not None:
            loads = self.config.grid.load_values
            full = {self.config.grid.load_axis: loads[0], **params}
            self.index["points"].append({"dir": None, "params": plain_json(full), "repeat": 0, "status": "failed",
                                         "reason": f"the engine did not start: {why}", "headline": None,
                                         "prediction": None})
            self.listener.point_done(self.index["points"][-1])
            group["stopped"] = {"rule": "failed", "reason": why, "at": loads[0], "knee": None}
            self._skip(params, loads[1:], "the engine did not start", first_repeat={loads[0]: 1})
            return False
        self.launched = setting
        return True

    async def _load_axis(self, params: dict[str, Any], group: dict[str, Any]) -> None:
        grid, rules = self.config.grid, self.config.saturation
        prev: tuple[float, dict[str, Any]] | None = None
        for i, load in enumerate(grid.load_values):
            entries = []
            for k in range(self.config.repeats):
                if self.stop.is_set():
                    self.interrupted = True
                    break
                entries.append(await self._point(params, load, k))
                if entries[-1]["status"] == "stopped":
                    self.interrupted = True
                    break
            if self.interrupted:
                self._skip(params, grid.load_values[i + 1:], "interrupted", first_repeat={load: len(entries)})
                return
            head = self._aggregate(params, load, entries)
            stop = None if rules is None else check(rules, grid.load_axis, prev, (load, head))
            if stop is None and any(e["status"] == "failed" for e in entries):  # (also without rules)
                stop_json: dict[str, Any] | None = {"rule": "failed", "reason": entries[-1].get("reason"), "at": load,
                                                    "knee": None if prev is None else prev[0]}
            else:
                stop_json = None if stop is None else stop.to_json()
            if stop_json is not None:
                group["stopped"] = stop_json
                self._skip(params, grid.load_values[i + 1:], f"past the stop at {grid.load_axis}={load:g} ({stop_json['rule']})")
                return
            prev = (load, head)

    async def _search(self, params: dict[str, Any], group: dict[str, Any]) -> None:
        g = self.config.goodput
        assert g is not None

        async def probe(rate: float) -> Probe:
            entry = await self._point(params, rate, 0, with_slo=g)
            share = entry["headline"].get("slo_share") if entry.get("headline") else None
            stopped = entry["status"] == "stopped"
            meets = not stopped and entry["status"] == "done" and share is not None and share >= g.share
            error = entry.get("reason") if entry["status"] == "failed" and entry["headline"] is None else None
            head = entry.get("headline") or {}
            in_flight = (head["req_s"] * head["e2e_p50_ms"] / 1e3
                         if head.get("req_s") and head.get("e2e_p50_ms") is not None else None)
            return Probe(rate, share, meets, entry["dir"], stopped, error, in_flight)

        result: SearchResult = await find_max_rate(probe, g.start_rps, step=g.step, max_probes=g.max_probes)
        if result.note == "interrupted":
            self.interrupted = True
        found = {"params": plain_json(params), **result.to_json()}
        group["goodput"] = found
        self.index["goodput_search"]["groups"].append(found)

    async def _point(self, params: dict[str, Any], load: float, repeat: int, with_slo: GoodputSearch | None = None) -> dict[str, Any]:
        c = self.config
        self.count += 1
        full = {c.grid.load_axis: load, **params}
        rel = f"{self.count:03d}_{slug(full, repeat if c.repeats > 1 else None)}"
        path = str(Path(c.out_dir) / rel)
        entry: dict[str, Any] = {
            "dir": rel, "params": plain_json(full), "repeat": repeat, "status": "running", "headline": None, "prediction": None,
        }
        self.listener.point_started(entry, self.count)
        result: RunResult | None = None
        assert self.target is not None  # (started by ``_launch``)
        try:
            run_cfg, target = point_configs(
                c.run, self.target, c.grid.load_axis, load, launch_params(c, params)[1], repeat=repeat,
                auto_requests=c.auto_requests,
            )
            run_cfg = dataclasses.replace(run_cfg, out_dir=path, overwrite=c.overwrite)
            result = await run(run_cfg, target, on_record=self.listener.record, stop=self.stop)
            entry["status"] = "stopped" if result.interrupted and self.stop.is_set() else "done"
            if result.cause is not None:
                entry["reason"] = str(result.cause)
        except RunFailedError as e:  # every request failed: its run directory is written
            result = e.result if isinstance(e.result, RunResult) else None
            entry.update(status="failed", reason=str(e))
        except (UsageError, ValueError) as e:  # this point's settings (a model that does not fit)
            entry.update(status="failed", reason=str(e))
        if result is not None:
            if self.after_run is not None:
                result = self.after_run(result, path)
            gpus = result.engine.config.tensor_parallel_size if result.engine is not None else None
            entry["headline"] = headline(result.summary, gpus)
            # simulated: each headline metric's validation error in this point's regime
            # (closed loop, Poisson, offline: the load decides); measured: none
            entry["prediction"] = headline_prediction(result.summary.prediction)
            if result.summary.server.simulated:
                # (over HTTP too: a server that identified itself as inferlab's simulator
                # made every number; only virtual-time points carry error bands)
                self.index["prediction"] = True
            if with_slo is not None:
                entry["headline"]["slo_share"] = slo_share(result.records, with_slo.slo)
        else:
            entry["dir"] = None  # the point's settings were refused before it ran: no run directory
        self.index["points"].append(entry)
        self.write()
        self.listener.point_done(entry)
        return entry

    def _aggregate(self, params: dict[str, Any], load: float, entries: list[dict[str, Any]]) -> dict[str, Any]:
        """The repeats' mean headline (the saturation rules read it) and, in the index,
        each headline metric's mean and 95 % t interval over the repeats."""
        heads = [e["headline"] for e in entries if e.get("headline") is not None]
        agg: dict[str, Any] = {}
        mean: dict[str, Any] = {}
        for key in CI_METRICS:
            values = [h[key] for h in heads if h.get(key) is not None]
            if values:
                agg[key] = t_interval(values).to_json()
                mean[key] = statistics.fmean(values)
            else:
                mean[key] = None
        for key in ("total", "completed", "failed"):
            mean[key] = sum(h.get(key) or 0 for h in heads)
        self.index["aggregates"].append({
            "params": plain_json({self.config.grid.load_axis: load, **params}),
            "repeats": len(entries), "dirs": [e["dir"] for e in entries], "headline": agg,
        })
        return mean

    def _skip(self, params: dict[str, Any], loads: tuple[float, ...], why: str,
              first_repeat: dict[float, int] | None = None) -> None:
        """Points planned but not run, listed as ``skipped`` with why."""
        first_repeat = first_repeat or {}
        for load, start in [*first_repeat.items(), *((v, 0) for v in loads)]:
            for k in range(start, self.config.repeats):
                self.index["points"].append({
                    "dir": None, "params": plain_json({self.config.grid.load_axis: load, **params}), "repeat": k,
                    "status": "skipped", "reason": why, "headline": None, "prediction": None,
                })


def target_json(target: Target) -> dict[str, Any]:
    if isinstance(target, SimTarget):
        return {"kind": "simulator", "virtual_time": True, "engine": plain_json(dataclasses.asdict(target.engine))}
    return {"kind": "server", "virtual_time": False, "url": target.url, "model": target.model}
