"""Search engine flags for the best goodput on one workload: ``inferlab tune``.

Each **trial** runs the same workload and load on the engine with one setting of the
flags being searched, as a normal run directory under the tune directory; ``sweep.json``
indexes them in the sweep format (``inferlab.sweep/1``, so reports read a tune like a
sweep) with the search's own results under ``tune``.

Two searches over the grid of the values given per flag:

- ``grid``: every combination, in order (the exhaustive reference);
- ``pattern`` (the default): a coordinate pattern search over the sorted values. It
  starts at the middle of every axis and moves one step at a time along one axis
  while that improves the objective, then tries the next axis, until a whole pass
  over the axes improves nothing. On a simulator a trial is deterministic, so a point
  is never run twice. It visits a few points per axis where the grid visits their
  product; it finds the best of a landscape with one peak per axis, and may stop at a
  local best on a rugged one (``grid`` is the check).

The **objective** is goodput (requests completed within every SLO per second: the
summary's ``goodput_rps``) or output tokens per second of a trial in which at least
``slo_share`` of the requests met the SLOs (``throughput``; others score 0). Ties
(several settings meeting every SLO at the offered rate, say) go to the lower TTFT p99,
and so do scores within ``TIE_SHARE`` (2 %) of the best: goodput at an offered rate
differs by a run's duration noise (0.6 % picked a 4× larger batching budget with a worse
TTFT p99). The best may so score a little below the highest; the console line naming it
says so (``best_note``), and tune's JSON gives the highest score and why (``best_json``).

A trial is **stopped** early when it can no longer win: the requests that missed an SLO
(or failed) so far leave fewer than the best trial's count of requests that met them
(``goodput``), or already exceed the share allowed (``throughput``). Its directory
and summary are kept, marked ``stopped`` with the reason (a sweep's status for a run
that ended early).

The **Pareto front** is the trials no other beats on both output tokens/s (higher) and
TTFT p99 (lower).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import math
import os
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from inferlab._errors import InferlabError, UsageError
from inferlab.load.run import RunConfig, RunResult, SimTarget, Target, run
from inferlab.results.metrics import request_metrics
from inferlab.results.records import RequestRecord
from inferlab.results.runfiles import plain_json
from inferlab.results.summary import Summary
from inferlab.results.sweepindex import FORMAT, headline, index_target, make_sweep_dir, write_index
from inferlab.sim.engine.bands import headline_prediction
from inferlab.sweep.runner import Trials, target_json

Search = Literal["grid", "pattern"]
Objective = Literal["goodput", "throughput"]
#: Trials scoring within this share of the best are tied; the lower TTFT p99 wins.
TIE_SHARE = 0.02
#: The tie rule in words, for ``--help``, the console and the docs.
TIE_RULE = (f"of the trials scoring within {TIE_SHARE:.0%} of the highest score, the one with the lowest "
            "TTFT p99").replace("%", " %")


class _AnyThreadStop(asyncio.Event):
    """A trial's stop, set from the thread that sees its records: a run in virtual time
    simulates in a worker thread and asks ``is_set`` between steps, which must answer
    true at once (a ``call_soon_threadsafe`` alone lands when the event loop next runs,
    and on a busy machine the run could finish first); waiters on the loop are woken
    there."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._loop = loop
        self._flag = threading.Event()

    def is_set(self) -> bool:
        return self._flag.is_set() or super().is_set()

    def set_from_any_thread(self) -> None:
        self._flag.set()
        self._loop.call_soon_threadsafe(self.set)


@dataclass(frozen=True)
class Axis:
    """One engine flag searched: its ``EngineConfig`` field and the values to try
    (in the order given; the pattern search sorts them)."""

    name: str
    values: tuple[Any, ...]

    @property
    def flag(self) -> str:
        return "--" + _FLAG_NAMES.get(self.name, self.name.replace("_", "-"))


#: engine fields whose flag has another name than the field's
_FLAG_NAMES = {"kv_cache_free_fraction": "kv-cache-free-gpu-mem-fraction", "api_overhead_s": "api-latency-ms"}
#: fields kept in seconds whose flag is in ms
_MS_FLAGS = frozenset({"api_overhead_s"})


def param_text(name: str, value: Any) -> str:
    """One searched setting as its flag writes it (``max-num-seqs=64``,
    ``kv-cache-free-gpu-mem-fraction=0.5``, ``api-latency-ms=5``: as ``--param`` takes it)."""
    shown = getattr(value, "value", value)
    if name in _MS_FLAGS and isinstance(shown, int | float):
        shown = f"{shown * 1e3:g}"
    return f"{_FLAG_NAMES.get(name, name.replace('_', '-'))}={shown}"


@dataclass(frozen=True)
class TuneConfig:
    axes: tuple[Axis, ...]
    search: Search = "pattern"
    objective: Objective = "goodput"
    slo_share: float = 0.9  # ``throughput``: the share of requests that must meet the SLOs
    max_trials: int | None = None  # None: as many as the search needs
    abort_hopeless: bool = True
    command: str = "tune"  # the command line that ran it, for sweep.json (secrets redacted)


@dataclass
class Trial:
    number: int
    params: dict[str, Any]
    dir: str | None
    status: Literal["done", "stopped", "failed"] = "done"
    reason: str | None = None
    summary: Summary | None = None
    met: int = 0  # measured requests that met every SLO
    score: float = 0.0

    def headline(self) -> dict[str, Any]:
        if self.summary is None:
            return {}
        tp = self.summary.config.get("engine", {}).get("tensor_parallel_size")
        return headline(self.summary, tp if isinstance(tp, int) else None)

    def key(self) -> tuple[float, float]:
        """Larger is better: the objective, then the lower TTFT p99."""
        p99 = self.headline().get("ttft_p99_ms")
        return (self.score, -(p99 if p99 is not None else math.inf))


@dataclass
class TuneResult:
    trials: list[Trial]
    best: Trial | None
    pareto: list[Trial]
    grid_size: int
    interrupted: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def best_trial(trials: Sequence[Trial]) -> Trial | None:
    """The best of the trials that ran to the end (None: none did): of those scoring
    within ``TIE_SHARE`` of the highest score, the lowest TTFT p99 (then the higher
    score). It may score a little below the highest (``best_note`` says so)."""
    done = [t for t in trials if t.status == "done"]
    if not done:
        return None
    top = max(t.score for t in done)
    tied = [t for t in done if t.score >= top * (1 - TIE_SHARE)]
    return max(tied, key=lambda t: (t.key()[1], t.score))


def best_json(trials: Sequence[Trial], best: Trial) -> dict[str, Any]:
    """How ``best`` (``best_trial`` of ``trials``) was chosen, for tune's JSON: the
    highest score of any trial, the tie share, and ``why`` in words."""
    top = max(t.score for t in trials if t.status == "done")
    return {"highest_score": top, "tie_share": TIE_SHARE, "why": best_note(trials, best) or "the highest score"}


def best_note(trials: Sequence[Trial], best: Trial) -> str | None:
    """Why ``best`` wins although another trial scored higher ("1.5 % below the highest,
    9.59 (within 2 %), and lower TTFT p99"): the highest with the digits that tell it from
    ``best``'s score (the console prints two), and the gap; None when it scored the highest."""
    top = max(t.score for t in trials if t.status == "done")
    if best.score >= top:
        return None
    digits = next((d for d in range(2, 7) if f"{top:.{d}f}" != f"{best.score:.{d}f}"), 6)
    gap = (top - best.score) / top * 100
    return f"{gap:.2g} % below the highest, {top:,.{digits}f} (within {TIE_SHARE * 100:g} %), and lower TTFT p99"


def grid_points(axes: Sequence[Axis]) -> list[dict[str, Any]]:
    return [dict(zip([a.name for a in axes], combo, strict=True)) for combo in itertools.product(*(a.values for a in axes))]


def pareto_front(trials: Sequence[Trial]) -> list[Trial]:
    """Trials that no other beats on both output tok/s (higher) and TTFT p99 (lower)."""
    pts = [(t, t.headline().get("output_tok_s"), t.headline().get("ttft_p99_ms")) for t in trials if t.status == "done"]
    pts = [(t, x, y) for t, x, y in pts if x is not None and y is not None]
    front = [
        t for t, x, y in pts
        if not any((x2 >= x and y2 <= y) and (x2 > x or y2 < y) for _, x2, y2 in pts)  # type: ignore[operator]
    ]
    return sorted(front, key=lambda t: t.headline()["output_tok_s"] or 0.0)


class SimTrials:
    """Trials on the simulated engine in virtual time: ``base`` with each setting's
    engine flags replaced."""

    prediction = True

    def __init__(self, base: SimTarget) -> None:
        self.base = base
        self.fields = frozenset(f.name for f in dataclasses.fields(type(base.engine))) - {"efficiencies_path", "offline"}

    def target_json(self) -> dict[str, Any]:
        return target_json(self.base)

    @contextlib.asynccontextmanager
    async def open(self, params: dict[str, Any], log_path: str | None,
                   stop: asyncio.Event | None = None) -> AsyncIterator[Target]:
        yield dataclasses.replace(self.base, engine=dataclasses.replace(self.base.engine, **params))


class Tuner:
    """Runs trials of ``run_config`` on ``trials`` (the simulated engine, a
    ``SimTarget``, or an engine started per trial), writing each under ``out_dir``
    (None: nowhere)."""

    def __init__(
        self,
        run_config: RunConfig,
        base: SimTarget | Trials,
        config: TuneConfig,
        out_dir: str | None,
        on_trial: Callable[[Trial], None] = lambda t: None,
        stop: asyncio.Event | None = None,
    ) -> None:
        if run_config.slo is None:
            raise UsageError("tune needs at least one SLO (--slo-ttft-ms, --slo-tpot-ms, --slo-e2e-ms, or --goodput)")
        if not config.axes:
            raise UsageError("tune needs at least one flag to search (--param NAME=V1,V2,...)")
        if not 0 < config.slo_share <= 1:
            raise UsageError("--slo-share must be in (0, 1]")
        if config.max_trials is not None and config.max_trials < 1:
            raise UsageError("--max-trials must be at least 1")
        self.trials_at: Trials = SimTrials(base) if isinstance(base, SimTarget) else base
        for a in config.axes:
            if a.name not in self.trials_at.fields:
                what = "the simulator" if self.trials_at.prediction else "the engine config"
                raise UsageError(f"{a.flag}: not an engine flag {what} takes")
            if not a.values:
                raise UsageError(f"{a.flag}: no values")
        self.run_config = run_config
        self.config = config
        self.out_dir = out_dir
        self.on_trial = on_trial
        self.stop = stop
        self.trials: list[Trial] = []
        self._seen: dict[tuple[Any, ...], Trial] = {}
        self.grid_size = math.prod(len(a.values) for a in config.axes)
        self.interrupted = False

    # --- one trial ---------------------------------------------------------------------

    def _best(self) -> Trial | None:
        return best_trial(self.trials)

    async def trial(self, params: dict[str, Any]) -> Trial:
        """The trial of ``params`` (run now, or the one already run)."""
        key = tuple(params[a.name] for a in self.config.axes)
        if key in self._seen:
            return self._seen[key]
        number = len(self.trials)
        name = f"trial-{number:03d}-" + "-".join(param_text(k, v) for k, v in params.items())
        out = None if self.out_dir is None else os.path.join(self.out_dir, name)
        trial = Trial(number, dict(params), None if out is None else name)
        result: RunResult | None
        try:
            async with self.trials_at.open(params, None if out is None else f"{out}.engine.log", self.stop) as target:
                result = await self._run(dataclasses.replace(self.run_config, out_dir=out), target, trial)
        except (UsageError, ValueError, InferlabError) as e:
            trial.status, trial.reason = "failed", str(e).splitlines()[0]
            partial = getattr(e, "result", None)  # every request failed: its summary is kept
            result = partial if isinstance(partial, RunResult) else None
        if out is not None and not await asyncio.to_thread(os.path.isdir, out):
            trial.dir = None  # (its engine never started, or the run was refused: nothing written)
        if result is not None:
            trial.summary = result.summary
            trial.score = self._score(result.summary, trial.met)
            if result.interrupted and trial.status == "done":
                if self.stop is not None and self.stop.is_set():
                    self.interrupted = True
                    trial.status, trial.reason = "stopped", "interrupted"
                else:
                    trial.status = "stopped"
                    trial.score = 0.0
        self.trials.append(trial)
        self._seen[key] = trial
        self.on_trial(trial)
        self._write_index(complete=False)
        return trial

    async def _run(self, config: RunConfig, target: Target, trial: Trial) -> RunResult:
        slo = config.slo
        assert slo is not None
        planned = config.load.num_requests
        best = self._best() if self.config.abort_hopeless else None
        loop = asyncio.get_running_loop()
        stop = _AnyThreadStop(loop)
        missed = 0
        # the run's duration so far (first send of a measured request seen → last end seen):
        # its final duration is at least this, which bounds the goodput it can still reach
        first_send: int | None = None
        last_end: int | None = None

        def on_record(r: RequestRecord) -> None:
            nonlocal missed, first_send, last_end
            if r.warmup:
                return
            if r.send_ns is not None:
                first_send = r.send_ns if first_send is None else min(first_send, r.send_ns)
            if r.ok and r.end_ns is not None:  # (the score's duration ends at the last completed request)
                last_end = r.end_ns if last_end is None else max(last_end, r.end_ns)
            if r.ok and slo.met_by(request_metrics(r)):
                trial.met += 1
                return
            missed += 1
            if planned and best is not None and not stop.is_set():
                elapsed_s = None if first_send is None or last_end is None else (last_end - first_send) / 1e9
                why = self._hopeless(planned, missed, elapsed_s)
                if why:
                    trial.reason = why
                    stop.set_from_any_thread()

        async def watch_user_stop() -> None:
            if self.stop is not None:
                await self.stop.wait()
                stop.set()

        watcher = asyncio.ensure_future(watch_user_stop())
        try:
            return await run(config, target, on_record=on_record, stop=stop)
        finally:
            watcher.cancel()

    def _hopeless(self, planned: int, missed: int, elapsed_s: float | None) -> str | None:
        """Why a trial cannot end among the best (None: it still can). Goodput: even if
        every request left met the SLOs, and the run ended now (it lasts at least as long
        as it has), its goodput would be below ``TIE_SHARE`` of the highest trial's, so the
        tie rule could not choose it either (a count of met requests alone is no bound:
        a faster run meets fewer in less time). Throughput: more requests missed than
        ``--slo-share`` allows (its score is then 0)."""
        if self.config.objective == "goodput":
            done = [t for t in self.trials if t.status == "done"]
            if not done or not elapsed_s or elapsed_s <= 0:
                return None
            top = max(done, key=lambda t: t.score)
            reach = (planned - missed) / elapsed_s
            if reach < top.score * (1 - TIE_SHARE):
                return (f"hopeless: {missed} of {planned} requests missed an SLO; at most {reach:.3g} req/s within them "
                        f"after {elapsed_s:.3g} s, under {1 - TIE_SHARE:.0%} of trial {top.number}'s {top.score:.3g}")
            return None
        allowed = (1 - self.config.slo_share) * planned
        if missed > allowed:
            return f"hopeless: {missed} of {planned} requests missed an SLO (at most {allowed:g} may, --slo-share {self.config.slo_share:g})"
        return None

    def _score(self, s: Summary, met: int) -> float:
        if self.config.objective == "goodput":
            return s.goodput_rps or 0.0
        measured = s.counts.total
        if not measured or met / measured < self.config.slo_share:
            return 0.0
        return s.output_token_throughput_tps or 0.0

    # --- the searches ------------------------------------------------------------------

    def _budget_left(self) -> bool:
        if self.stop is not None and self.stop.is_set():
            self.interrupted = True
            return False
        return self.config.max_trials is None or len(self.trials) < self.config.max_trials

    async def grid(self) -> None:
        for params in grid_points(self.config.axes):
            if not self._budget_left():
                return
            await self.trial(params)

    async def pattern(self) -> None:
        axes = [dataclasses.replace(a, values=tuple(sorted(set(a.values)))) for a in self.config.axes]
        at = [len(a.values) // 2 for a in axes]

        def params(idx: Sequence[int]) -> dict[str, Any]:
            return {a.name: a.values[i] for a, i in zip(axes, idx, strict=True)}

        if not self._budget_left():
            return
        current = await self.trial(params(at))
        improved = True
        while improved:
            improved = False
            for k, axis in enumerate(axes):
                for step in (+1, -1):
                    while 0 <= at[k] + step < len(axis.values):
                        if not self._budget_left():
                            return
                        nxt = list(at)
                        nxt[k] += step
                        t = await self.trial(params(nxt))
                        if t.status != "done" or t.key() <= current.key():
                            break
                        at, current, improved = nxt, t, True

    async def search(self) -> TuneResult:
        if self.out_dir is not None:
            make_sweep_dir(self.out_dir)
        if self.config.search == "grid":
            await self.grid()
        else:
            await self.pattern()
        self._write_index(complete=not self.interrupted)
        return TuneResult(self.trials, self._best(), pareto_front(self.trials), self.grid_size, self.interrupted)

    # --- the index ---------------------------------------------------------------------

    def _untried(self) -> list[dict[str, Any]]:
        """An interrupted grid search's trials not run (within ``--max-trials``), as sweep
        lists its points not run: ``skipped``, reason ``interrupted``. (The pattern search
        has no fixed list of trials still to come.)"""
        if not self.interrupted or self.config.search != "grid":
            return []
        planned = grid_points(self.config.axes)[:self.config.max_trials]
        return [
            {"dir": None, "params": params, "repeat": 0, "status": "skipped", "reason": "interrupted",
             "headline": None, "score": None, "met_slo": None, "prediction": None}
            for params in planned if tuple(params[a.name] for a in self.config.axes) not in self._seen
        ]

    def _write_index(self, complete: bool) -> None:
        if self.out_dir is None:
            return
        best = self._best()
        write_index(self.out_dir, plain_json({
            "format": FORMAT,
            "command": self.config.command,
            "target": index_target(self.trials_at.target_json(), (a.name for a in self.config.axes)),
            # (an engine started from a config may be inferlab's simulator: its trials say)
            "prediction": self.trials_at.prediction or any(t.summary is not None and t.summary.server.simulated for t in self.trials),
            "axes": {a.name: list(a.values) for a in self.config.axes},
            "load_axis": None,
            "repeats": 1,
            "saturation": None,
            "points": [
                {
                    "dir": t.dir, "params": t.params, "repeat": 0, "status": t.status,
                    "reason": t.reason, "headline": t.headline() or None, "score": t.score, "met_slo": t.met,
                    "prediction": None if t.summary is None else headline_prediction(t.summary.prediction),
                }
                for t in self.trials
            ] + self._untried(),
            "groups": [],
            "aggregates": [],
            "goodput_search": None,
            "tune": {
                "search": self.config.search,
                "objective": self.config.objective,
                "slo": None if self.run_config.slo is None else dataclasses.asdict(self.run_config.slo),
                "slo_share": self.config.slo_share,
                "grid_size": self.grid_size,
                "trials": len(self.trials),
                "best": None if best is None else {
                    "trial": best.number, "params": best.params, "score": best.score, **best_json(self.trials, best),
                },
                "pareto": [t.number for t in pareto_front(self.trials)],
            },
            "complete": complete,
        }))
