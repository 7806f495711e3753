"""A simulator calibrated to one measured server (its "digital twin").

``calibrate`` fits step-time constants (``Efficiencies`` fields) so that the simulated
engine, running the same workloads and loads as measured run directories, reproduces
their TTFT p50, TPOT p50, E2E p50 and output tokens/s; it then predicts run directories held
out of the fit and reports the error on them. The constants are written as an
efficiencies file, which ``sim run --efficiencies FILE`` (with the same engine flags)
uses to answer what-ifs for *that* server: more users, longer prompts, another batch
budget. Everything the twin says is a prediction.

The fit: each run directory's load and workload (its ``config.json``) run through the
simulated engine in virtual time; the loss is the sum over runs and metrics of the
squared log ratio of predicted to measured. A coordinate search in log space moves one
constant at a time by a factor (2, then √2, ... down to about 4 %), within bounds,
keeping each move that lowers the loss. It is deterministic and needs no dependency;
it finds a local best, which the held-out error checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferlab._errors import InferlabError, UsageError
from inferlab.load.run import RunConfig, SimTarget, run
from inferlab.load.schedules import ClosedLoop, LoadConfig, OpenLoop, Replay, Schedule
from inferlab.results.runfiles import read_summary
from inferlab.results.summary import Summary, client_bottleneck, foreign_cache
from inferlab.results.sweepindex import headline as sweep_headline
from inferlab.sim.engine.bands import CALIBRATED_WITH, served_by
from inferlab.sim.engine.config import EngineConfig, resolve
from inferlab.sim.engine.steptime import CALIBRATION_KEY, Efficiencies, efficiencies_json
from inferlab.workload.config import WorkloadConfig

#: The metrics a twin is fitted on and judged by. TPOT as well as E2E: where a run's E2E
#: is mostly prefill (a long prompt, a short output), E2E alone hardly constrains the
#: decode, and a fit of the decode's cost per context token (``kv_stream``) came out
#: anywhere in a range of 220x over runs of one server (docs/validation.md, "Known misses").
#: TPOT is (E2E − TTFT) / (output tokens − 1): the decode's rate however the server chunks
#: its stream, where it reports usage (without it, the tokens counted are its chunks).
METRICS = ("ttft_p50_ms", "tpot_p50_ms", "e2e_p50_ms", "output_tok_s")

#: The constants fitted by default: the compute rate (prefill, and decode where it is
#: compute-bound), the weight-streaming rate (decode where memory-bound), attention,
#: the host's cost per step and the fixed cost per request.
DEFAULT_FIT = ("gemm_compute", "weight_stream", "attention_compute", "cpu_step_s", "api_overhead_s")

#: Bounds per constant: a fraction of a peak may exceed 1 only where the device file's
#: peak is itself a guess (a CPU's caches beat its measured memory bandwidth).
BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_compute": (0.01, 4.0),
    "gemm_compute_w8a8": (0.01, 4.0),
    "weight_stream": (0.01, 20.0),
    "decode_compute": (0.001, 4.0),
    "attention_compute": (0.01, 4.0),
    "kv_stream": (0.01, 20.0),
    "activation_stream": (0.01, 20.0),
    "cpu_step_s": (1e-6, 1.0),
    "cpu_step_eager_s": (1e-6, 1.0),
    "per_seq_s": (1e-8, 0.1),
    "sampler_s": (1e-7, 0.1),
    "elementwise_per_layer_s": (1e-8, 0.1),
    "api_overhead_s": (1e-6, 5.0),
    "api_per_seq_s": (1e-8, 0.1),
}

_STEPS = (2.0, 2**0.5, 2**0.25, 2**0.125, 2**0.0625)


@dataclass(frozen=True)
class MeasuredRun:
    """A run directory: what ran (its load, workload and API) and what it measured;
    ``software``: what its server said it is (``config.json``'s
    ``resolved.server_software``: name, version, source), None where it said nothing
    inferlab knows or the run predates the record; ``offline``: the run was ``sim run``'s
    of vLLM's offline class (its engine says so); a server's runs are served, at
    ``--rate inf`` too. ``predicted``: the directory is a ``sim run``'s (the simulator's
    prediction in virtual time, no server's measurement); ``model`` and ``url``: the
    model the server served and its API root, as the run recorded them (None where it
    did not); ``counts``: its requests by outcome (``summary.json``'s ``counts``) and
    ``interrupted``; ``digest``: the SHA-256 of its ``requests.jsonl`` (None without one):
    two directories with one digest hold one run. ``engine_config``: the config inferlab
    started its server from (``bench --engine``, a sweep's setting: ``config.json``'s
    ``engine_config``), None for a server the run did not start. ``unreliable``: what its
    summary says makes its numbers unfit to fit on (``unreliable``); ``left_out``: the
    fitted metrics it has none of, and why (``left_out``)."""

    path: str
    config: RunConfig
    measured: dict[str, float]
    software: dict[str, Any] | None = None
    offline: bool = False
    predicted: bool = False
    model: str | None = None
    url: str | None = None
    counts: dict[str, Any] = field(default_factory=dict)
    interrupted: bool = False
    digest: str | None = None
    engine_config: dict[str, Any] | None = None
    unreliable: tuple[str, ...] = ()
    left_out: dict[str, str] = field(default_factory=dict)


def unreliable(s: Summary) -> tuple[str, ...]:
    """What a run's summary says makes its numbers unfit to fit or judge a twin by: the
    client was likely the bottleneck (its latencies inflated by its own delay), or the
    server served its prompts from a cache an earlier run filled (its TTFT is a cached
    prompt's). In words, one each; empty for neither."""
    return (*client_bottleneck(s.client), *foreign_cache(s.warnings))


def left_out(s: Summary, measured: dict[str, float]) -> dict[str, str]:
    """The fitted metrics (``METRICS``) a run's summary has none of, or zero, and why."""
    h = sweep_headline(s, None)
    return {m: ("it measured none" if h.get(m) is None else
                "it measured 0 (each answer's tokens after its first arrived at once, or it had one: no decode rate)"
                if m == "tpot_p50_ms" else "it measured 0")
            for m in METRICS if m not in measured}


def headline(s: Summary) -> dict[str, float]:
    """The fitted metrics a summary has (those it lacks are left out: a TPOT where every
    request had one output token), as sweeps name them (``results.sweepindex.headline``)."""
    h = sweep_headline(s, None)
    return {m: float(h[m]) for m in METRICS if h.get(m)}


def _schedule(d: dict[str, Any]) -> Schedule:
    kind = d.get("kind")
    if kind == "ClosedLoop":
        return ClosedLoop(int(d["concurrency"]))
    if kind == "OpenLoop":
        rate = d["rate_rps"]
        return OpenLoop(math.inf if rate == "inf" else float(rate), d.get("arrival", "poisson"),
                        float(d.get("burstiness", 1.0)), d.get("max_concurrency"))
    if kind == "Replay":
        return Replay(d.get("max_concurrency"))
    raise ValueError(f"unknown schedule {kind!r}")


def read_run(path: str) -> MeasuredRun:
    """A run directory written by ``bench`` (or ``sim run``), as the twin reruns it.
    ``UsageError`` for a folder without a run, or a run of a trace or dataset (the twin
    reruns synthetic workloads only: their prompts are rebuilt from the config)."""
    folder = Path(path)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: not a run directory ({e})") from None
    summary = read_summary(folder / "summary.json")
    try:
        load = config["load"]
        wl = dict(config["workload"])
        if wl.get("trace") or wl.get("dataset"):
            raise UsageError(f"{path}: a run of a trace or dataset; the twin reruns synthetic workloads (--input-tokens, --prefix-*, --sessions)")
        workload = WorkloadConfig(**{k: v for k, v in wl.items() if k in {f.name for f in dataclasses.fields(WorkloadConfig)}})
        load_config = LoadConfig(_schedule(load["schedule"]), load.get("num_requests"), load.get("duration_s"),
                                 int(load.get("warmup", 0)), int(load.get("seed", 0)))
        api = config.get("api", "chat")
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"{path}: config.json is not a run's ({e!r})") from None
    measured = headline(summary)
    if not measured:
        raise UsageError(f"{path}: the run measured nothing to fit (no completed request)")
    resolved = config.get("resolved")
    resolved = resolved if isinstance(resolved, dict) else {}
    software = resolved.get("server_software")
    engine = config.get("engine")
    predicted = config.get("command") == "sim run"
    model = (engine if predicted and isinstance(engine, dict) else {}).get("model") or resolved.get("model") or config.get("model")
    url = resolved.get("url") or config.get("url")
    try:
        digest: str | None = hashlib.sha256((folder / "requests.jsonl").read_bytes()).hexdigest()
    except OSError:
        digest = None
    return MeasuredRun(str(folder), RunConfig(load_config, workload, api, None), measured,
                       software if isinstance(software, dict) else None,
                       isinstance(engine, dict) and engine.get("offline") is True,
                       predicted, None if model is None else str(model), None if url is None else str(url),
                       summary.counts.to_json(), summary.interrupted, digest,
                       started if isinstance(started := config.get("engine_config"), dict) else None,
                       unreliable(summary), left_out(summary, measured))


#: Failures that leave a run's slowest requests out of its numbers: a request that took
#: longer than the client waited is not in its p50s, which are then biased low, however
#: few there are (and a run cut short left its requests in flight out).
CENSORING = ("timeout", "idle_timeout")
#: The share of a run's requests that may fail, of other kinds, before its numbers are
#: taken to be biased (the requests that failed need not be a random sample of them).
MAX_FAILED_SHARE = 0.05


def failures(run: MeasuredRun) -> tuple[str | None, bool]:
    """A run's failed and cancelled requests in words ("1 of 16 requests failed (timeout
    1)"), None where every request completed; and whether they bias what it measured:
    any failure of a kind in ``CENSORING``, a request cancelled or the run interrupted,
    or more than ``MAX_FAILED_SHARE`` of its requests failed."""
    counts = run.counts
    total, failed, cancelled = int(counts.get("total") or 0), int(counts.get("failed") or 0), int(counts.get("cancelled") or 0)
    errors = {str(k): int(v) for k, v in (counts.get("errors") or {}).items()}
    if not failed and not cancelled and not run.interrupted:
        return None, False
    parts = []
    if failed:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(errors.items()))
        parts.append(f"{failed} of {total} requests failed ({failed / total:.0%}{'; ' + kinds if kinds else ''})"
                     if total else f"{failed} requests failed")
    if cancelled:
        parts.append(f"{cancelled} cancelled")
    if run.interrupted:
        parts.append("the run was interrupted")
    biased = (any(errors.get(k) for k in CENSORING) or bool(cancelled) or run.interrupted
              or (total > 0 and failed / total > MAX_FAILED_SHARE))
    return ", ".join(parts), biased


def at_bounds(constants: dict[str, float]) -> dict[str, str]:
    """The fitted constants that ended at a bound of theirs (``BOUNDS``), and which
    ("lower", "upper"): the fit wanted to go further, so the engine as stated (model,
    device, flags) cannot explain the runs with that constant, and the others made up for it."""
    out = {}
    for name, value in constants.items():
        lo, hi = BOUNDS.get(name, (None, None))
        if lo is not None and value <= lo * (1 + 1e-9):
            out[name] = "lower"
        elif hi is not None and value >= hi * (1 - 1e-9):
            out[name] = "upper"
    return out


@dataclass
class Fit:
    """A calibration: the fitted constants, the loss, and each run's predictions.
    ``converged``: the search ended by itself (no move of any constant by its finest
    step lowered the loss), not at ``max_evaluations``, where a better fit may remain."""

    constants: dict[str, float]
    loss: float
    evaluations: int
    fit_runs: list[dict[str, Any]] = field(default_factory=list)
    holdout_runs: list[dict[str, Any]] = field(default_factory=list)
    converged: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"constants": self.constants, "at_bounds": at_bounds(self.constants), "loss": self.loss,
                "evaluations": self.evaluations, "converged": self.converged, "fit": self.fit_runs,
                "holdout": self.holdout_runs, "prediction": True}


class Twin:
    """Reruns measured runs on ``engine`` with candidate constants (written to a
    scratch efficiencies file over ``engine``'s own)."""

    def __init__(self, engine: EngineConfig, scratch: str) -> None:
        self.engine = engine
        self.base = resolve(engine).efficiencies
        self.scratch = scratch
        self._n = 0

    def engine_with(self, constants: dict[str, float]) -> EngineConfig:
        self._n += 1
        path = os.path.join(self.scratch, f"eff-{self._n}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({**_overridden(self.engine), **constants}, f)
        return dataclasses.replace(self.engine, efficiencies_path=path)

    def predict(self, runs: Sequence[MeasuredRun], constants: dict[str, float]) -> list[dict[str, float]]:
        engine = self.engine_with(constants)
        # (as the run was: a server's served, at --rate inf too, not as vLLM's offline class)
        return [headline(asyncio.run(run(r.config, SimTarget(engine, offline=r.offline))).summary) for r in runs]


def _overridden(engine: EngineConfig) -> dict[str, float]:
    """The constants ``engine``'s own efficiencies file sets (the fit starts from them;
    an earlier calibration's record is not carried over)."""
    if not engine.efficiencies_path:
        return {}
    data = efficiencies_json(engine.efficiencies_path)
    return {k: float(v) for k, v in data.items() if k != CALIBRATION_KEY}


def loss(predicted: Sequence[dict[str, float]], runs: Sequence[MeasuredRun]) -> float:
    total = 0.0
    for p, r in zip(predicted, runs, strict=True):
        for m, v in r.measured.items():
            if m not in METRICS:
                continue
            got = p.get(m)
            if got is None or got <= 0 or v <= 0:
                total += 25.0  # (a prediction missing a metric: as bad as 150x off)
                continue
            total += math.log(got / v) ** 2
    return total


def errors(predicted: Sequence[dict[str, float]], runs: Sequence[MeasuredRun]) -> list[dict[str, Any]]:
    """Per run: measured, predicted and the signed relative error of each metric."""
    out = []
    for p, r in zip(predicted, runs, strict=True):
        out.append({
            "run": r.path,
            "measured": r.measured,
            "predicted": {m: p.get(m) for m in r.measured},
            "error": {m: (p[m] / v - 1) if p.get(m) is not None and v else None for m, v in r.measured.items()},
        })
    return out


def calibrate(
    engine: EngineConfig,
    fit_runs: Sequence[MeasuredRun],
    holdout_runs: Sequence[MeasuredRun] = (),
    names: Sequence[str] = DEFAULT_FIT,
    max_evaluations: int = 400,
    on_step: Callable[[int, float, dict[str, float]], None] = lambda n, loss, c: None,
) -> Fit:
    """Fit ``names`` (``Efficiencies`` fields) on ``fit_runs``; predict ``holdout_runs``.
    An engine in eager mode pays ``cpu_step_eager_s`` per step, not ``cpu_step_s``: that
    one is fitted in its place."""
    if engine.enforce_eager:
        names = tuple(dict.fromkeys("cpu_step_eager_s" if n == "cpu_step_s" else n for n in names))
    known = {f.name for f in dataclasses.fields(Efficiencies)}
    for n in names:
        if n not in known:
            raise UsageError(f"--fit {n}: not a step-time constant; known: {', '.join(sorted(known))}")
        if n not in BOUNDS:
            raise UsageError(f"--fit {n}: not one the twin fits; fitted: {', '.join(BOUNDS)}")
    if not fit_runs:
        raise UsageError("give at least one run directory to fit on")
    with tempfile.TemporaryDirectory(prefix="inferlab-twin-") as scratch:
        twin = Twin(engine, scratch)
        current = {n: float(getattr(twin.base, n)) for n in names}
        if current.get("decode_compute") == 0.0:  # (off: the fit starts where a GEMM row is)
            current["decode_compute"] = float(current.get("gemm_compute", twin.base.gemm_compute))
        try:
            best = loss(twin.predict(fit_runs, current), fit_runs)
        except InferlabError as e:
            raise UsageError(f"the engine cannot run these workloads: {e}") from None
        evaluations = 1
        on_step(evaluations, best, current)
        stopped = False  # (a move left untried for want of evaluations: not converged)
        for factor in _STEPS:
            improved = True
            while improved and evaluations < max_evaluations:
                improved = False
                for n in names:
                    lo, hi = BOUNDS[n]
                    for f in (factor, 1 / factor):
                        value = min(hi, max(lo, current[n] * f))
                        if value == current[n]:
                            continue
                        if evaluations >= max_evaluations:
                            stopped = True
                            continue
                        trial = {**current, n: value}
                        evaluations += 1
                        try:
                            got = loss(twin.predict(fit_runs, trial), fit_runs)
                        except InferlabError:  # (a constant the engine cannot run with)
                            continue
                        if got < best - 1e-12:
                            best, current, improved = got, trial, True
                            on_step(evaluations, best, current)
                            break
            stopped = stopped or improved  # (still improving when the evaluations ran out)
        fit = Fit(current, best, evaluations, converged=not stopped)
        fit.fit_runs = errors(twin.predict(fit_runs, current), fit_runs)
        if holdout_runs:
            fit.holdout_runs = errors(twin.predict(holdout_runs, current), holdout_runs)
    return fit


def loads_of(runs: Sequence[MeasuredRun]) -> dict[str, list[float]]:
    """The range of the loads ``runs`` ran: ``concurrency`` (closed loops' users, and the
    cap of an open loop's), ``rate_rps`` (open loops') and ``input_tokens`` (their
    prompts' length as configured), each [lowest, highest], where any run had one."""
    values: dict[str, list[float]] = {}
    for r in runs:
        schedule = r.config.load.schedule
        if isinstance(schedule, ClosedLoop):
            values.setdefault("concurrency", []).append(schedule.concurrency)
        elif isinstance(schedule, OpenLoop):
            values.setdefault("rate_rps", []).append(schedule.rate_rps)
            if schedule.max_concurrency is not None:
                values.setdefault("concurrency", []).append(schedule.max_concurrency)
        tokens = r.config.workload.input_tokens
        with contextlib.suppress(ValueError):  # (a length drawn from a distribution: left out)
            if tokens is not None:
                values.setdefault("input_tokens", []).append(float(tokens))
    return {k: [min(v), max(v)] for k, v in values.items() if v and all(math.isfinite(x) for x in v)}


def write_efficiencies(path: str, engine: EngineConfig, fit: Fit, server_settings: dict[str, Any] | None = None,
                       loads: dict[str, dict[str, list[float]]] | None = None, served_model: str | None = None) -> None:
    """The efficiencies file ``sim run --efficiencies`` reads: the engine's own file's
    constants under the fitted ones, and the calibration's error (``calibration_record``)
    and the server it holds for (``served_by``, and the release it was fitted as) for
    ``sim run`` to show beside what the twin predicts, on that server only; and
    ``server_settings``, the engine flags the runs' server stated that the fit took;
    ``loads``: the loads the runs the error is over ran (``"checked"``: those of the
    error's split) and of all of them, fit and held out (``"all"``), as ``loads_of``;
    ``served_model``: the model name the runs' server served them under (``served_model``,
    which ``sim serve`` with the twin answers to; left out where no run recorded one)."""
    with open(path, "w", encoding="utf-8") as f:
        # (the release too: sim run with this file and no --engine-version runs it)
        record = {**calibration_record(fit), "served_by": served_by(engine), "engine_version": engine.engine_version,
                  # (the engine flags the server stated and the fit took: runs of the twin take them too)
                  "server_settings": dict(server_settings or {}),
                  # (the name the runs' server answered to: the twin's server answers to it too)
                  **({"served_model": served_model} if served_model else {}),
                  # (what sized its cache: a run with others does not take the server's block count)
                  "sized_with": {k: getattr(engine, k) for k in CALIBRATED_WITH},
                  # (where its error was measured: a run at other loads is beyond them)
                  **({"loads": loads} if loads else {})}
        # a latency stated with --api-latency-ms (not fitted) is part of the twin too
        stated = {} if engine.api_overhead_s is None else {"api_overhead_s": engine.api_overhead_s}
        json.dump({**_overridden(engine), **stated, **fit.constants, CALIBRATION_KEY: record}, f, indent=2)
        f.write("\n")


#: the twin's metrics -> the error band's metric classes (``sim.engine.bands``)
_BAND_CLASSES = {"ttft_p50_ms": "TTFT", "tpot_p50_ms": "TPOT/ITL", "e2e_p50_ms": "E2E", "output_tok_s": "throughput"}


def calibration_record(fit: Fit) -> dict[str, Any]:
    """How well the fitted constants predicted: per metric class, the median absolute
    error (%) over the held-out runs and how many there were, or, with none held out,
    over the fit runs (in sample: what the fit was made to match); and whether the
    search converged (``Fit.converged``)."""
    split, rows = ("holdout", fit.holdout_runs) if fit.holdout_runs else ("fit", fit.fit_runs)
    errors: dict[str, dict[str, float]] = {}
    for metric, cls in _BAND_CLASSES.items():
        err = median_abs_error(rows, metric)
        if err is not None:
            n = sum(r["error"].get(metric) is not None for r in rows)
            errors[cls] = {"median_abs_pct": round(100 * err, 1), "runs": n}
    return {"split": split, "runs": len(rows), "errors": errors, "converged": fit.converged}


def median_abs_error(rows: Sequence[dict[str, Any]], metric: str) -> float | None:
    values: list[float] = sorted(abs(float(r["error"][metric])) for r in rows if r["error"].get(metric) is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2

