"""How far to trust a simulated number: the validation error of its engine family in its
load regime, from the published rows in ``bench/data`` (docs/validation.md).

``python bench/validate_sim.py --all --write-bands`` writes ``sim/data/error_bands.json``:
per engine family, regime (offline, closed loop, Poisson, saturated, and ``all`` of them)
and side of the split (``holdout``, ``fit``), the median over rows of each row's absolute
error per metric class (throughput, TTFT, TPOT/ITL, E2E) and how many rows it rests on;
and the same for the rows' medians and p99s alone (``stat``: the rows that reported
that statistic, as their headline or in their ``distribution`` column), so a p50 or a
p99 is shown with the error validation found for that statistic. Nothing here is typed
by hand. ``error_band`` picks, for one metric, the most specific band with at least
``MIN_ROWS`` rows, held-out before in-sample: the family in this regime; else the wider
of every family in this regime and the family over every regime (neither is the
prediction's own: the one that trusts it less); else every row; at each of these, the statistic's
own band before the headline one where at least half the headline's rows reported the
statistic (``COVERAGE``: else the few that did would stand for the rest); ``None`` when
no row measured that metric.

    band = error_band("vllm", "saturated", "TTFT")
    band.describe() if band else "not validated"
    # '±42 % on 36 held-out vLLM V1 saturated rows' (whatever the file says)
    error_band("vllm", "Poisson", "TTFT", stat="median").describe()
    # '±29 % on the medians of 16 held-out vLLM V1 Poisson rows'

``sim run`` shows one band beside each headline metric (console and ``summary.json``'s
``prediction``); a sweep gives each simulated point's headline its bands
(``headline_prediction``, from that run's ``prediction``), and the advisor each predicted
gain the band of its metric class (``band_of``).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferlab.sim.engine.families import EngineFamily
from inferlab.sim.engine.steptime import CALIBRATION_KEY, efficiencies_json

if TYPE_CHECKING:
    from inferlab.sim.engine.config import EngineConfig

BANDS_FILE = Path(__file__).resolve().parents[1] / "data" / "error_bands.json"
# the load regimes validation keeps apart (``sim.validation.scenario.REGIMES``), and all
OFFLINE, CLOSED, POISSON, SATURATED, ALL = "offline", "closed loop", "Poisson", "saturated", "all"
REGIMES = (OFFLINE, CLOSED, POISSON, SATURATED)
METRIC_CLASSES = ("throughput", "TTFT", "TPOT/ITL", "E2E")
# a band resting on fewer rows than this gives way to a broader one
MIN_ROWS = 3
# the statistics with bands of their own (beside the headline: each row's own statistic)
STATS = ("median", "p99")
# ... taken over the headline's band of the same rows only where as many as this share of
# its rows reported the statistic
COVERAGE = 0.5
_STAT_WORDS = {"median": "the medians of", "p99": "the p99s of"}
_SIDE_WORDS = {"holdout": "held-out", "fit": "in-sample (fit)"}


def shown_pct(pct: float) -> str:
    """A band's percentage as every place shows it: the tenth ``to_json`` keeps, to the
    whole percent, halves up (4.5 is "5" wherever it is shown, never "4" in one place
    and "5" in another)."""
    return str(math.floor(round(pct, 1) + 0.5))


@dataclass(frozen=True)
class ErrorBand:
    """The median absolute error of ``metric`` over ``rows`` validation rows of
    ``family`` in ``regime`` (``all``: every family, every regime), on one side of the
    split."""

    metric: str
    pct: float
    rows: int
    split: str  # "holdout" or "fit"
    family: str
    regime: str
    # a calibrated twin's own error: the efficiencies file it is in (rows: its runs)
    twin: str | None = None
    # the statistic the error was measured on ("median", "p99"); "": each row's headline
    stat: str = ""
    # a twin's: the loads of the runs its error is over ("c 4–8, prompts 1,024 tokens")
    basis: str = ""

    def describe(self) -> str:
        """'±25 % on 6 held-out vLLM V1 Poisson rows'; a twin's: '±12 % on 4 held-out
        runs of the calibration in twin.json' (the file's name; ``twin`` has its path)."""
        regime = "" if self.regime == ALL else f" {self.regime}"
        loads = " of every load" if self.regime == ALL else ""
        side = _SIDE_WORDS[self.split]
        if self.twin is not None:  # (a twin may fit its own runs to under 1 %)
            pct = f"{self.pct:.1f}" if self.pct < 10 else shown_pct(self.pct)
            runs = "run" if self.rows == 1 else "runs"
            basis = f" ({self.basis})" if self.basis else ""
            return f"±{pct} % on {self.rows} {side} {runs}{basis} of the calibration in {Path(self.twin).name}"
        of = f"{_STAT_WORDS[self.stat]} " if self.stat else ""
        if self.family == ALL:
            return f"±{shown_pct(self.pct)} % on {of}{self.rows} {side}{regime} rows of every engine" + (
                " and load" if loads else "")
        engine = EngineFamily.parse(self.family).rules.engine.split(" (")[0]
        return f"±{shown_pct(self.pct)} % on {of}{self.rows} {side} {engine}{regime} rows{loads}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pct": round(self.pct, 1), "rows": self.rows, "split": self.split, "family": self.family,
            "regime": self.regime, "text": self.describe(),
        }
        if self.stat:
            out["stat"] = self.stat
        if self.basis:
            out["basis"] = self.basis
        return out if self.twin is None else {**out, "twin": self.twin}


#: The settings a release decides, as ``served_by`` records them
RELEASE_SWITCHES = ("overlap_schedule", "scheduler_reserve_full_isl", "evict_unhashed_first")


def served_by(config: EngineConfig) -> dict[str, Any]:
    """What a calibration's bands hold for: the engine family, the model and device (by
    their resolved names), the tensor-parallel degree, the precision, and the switches a
    release decides (async/overlap scheduling, full-sequence admission, the free queue's
    order: a release's way of running, not a size). A run that changes any of them is
    another server (flags such as the batch budget are what a twin is asked about, and
    keep its bands)."""
    from inferlab.sim.engine.config import resolve

    r = resolve(config)
    c = r.config
    return {
        "engine_family": c.engine_family.value, "model": _file_or_name(config.model, r.model.name),
        "gpu": _file_or_name(config.gpu, r.gpu.name),
        "tensor_parallel_size": c.tensor_parallel_size, "dtype": str(c.dtype.value),
        "quantization": None if c.quantization is None else str(c.quantization.value),
        "kv_cache_dtype": str(c.kv_cache_dtype.value), **{k: bool(getattr(c, k)) for k in RELEASE_SWITCHES},
        # (an eager engine runs on a host cost of its own, cpu_step_eager_s, fitted or not)
        "enforce_eager": bool(c.enforce_eager),
    }


def _file_or_name(given: str, name: str) -> str:
    """A model or device by a file (or folder) of its own: its absolute path, the same
    from any folder a run starts in; else its resolved name."""
    path = Path(given)
    return str(path.resolve()) if path.exists() else name


#: Overlap scheduling as a twin calibrated before ``served_by`` recorded it ran, unless its
#: author said otherwise: the family's default then (vLLM V1's was off until its async
#: scheduling was made the default, as vLLM 0.14 made it)
_OVERLAP_BEFORE_RECORDED = {EngineFamily.SGLANG.value: True}


def calibration_mismatch(efficiencies: str, served: dict[str, Any]) -> str | None:
    """Why ``sim calibrate``'s record in ``efficiencies`` does not hold for a run of the
    server ``served`` (``served_by``), in words; None if it holds, or if the record does
    not say what it was calibrated on (a file written before it did; of the release's
    switches, one written before they were recorded is held to overlap scheduling only,
    at its family's default then)."""
    record = efficiencies_json(efficiencies).get(CALIBRATION_KEY)
    on = record.get("served_by") if isinstance(record, dict) else None
    if not isinstance(on, dict):
        return None
    if "overlap_schedule" not in on:  # (written before it was recorded)
        on = {**on, "overlap_schedule": _OVERLAP_BEFORE_RECORDED.get(str(on.get("engine_family")), False)}
    differ = [k for k in served if k in on and on[k] != served[k]]
    if not differ:
        return None
    def said(value: object) -> object:
        return ("on" if value else "off") if isinstance(value, bool) else value

    return "; ".join(f"{k.replace('_', ' ')} {said(served[k])}, calibrated {said(on[k])}"
                     if isinstance(served[k], bool) else f"{k.replace('_', ' ')} {served[k]}, calibrated on {on[k]}"
                     for k in differ)


#: What sizes a KV cache by memory beside the model and device (the activation reserve
#: follows the batch budget, the sequence cap and CUDA graphs; a block's bytes its size):
#: a twin records the values it was calibrated with, so that a run can tell whether its
#: server's block count holds, and runs of the twin take them where not given (the memory
#: share either way: vLLM's and SGLang's of the card, TensorRT-LLM's and LMDeploy's of
#: what weights leave)
SIZED_WITH = ("gpu_memory_utilization", "kv_cache_free_fraction", "max_num_batched_tokens", "max_num_seqs",
              "enforce_eager", "block_size")
#: The other engine flags a twin records it was calibrated with, and its runs take where
#: not given: the switches that change how it schedules and what its steps hold (prefix
#: caching, chunked prefill, mixed batches, multi-step decoding, SGLang's admission,
#: TensorRT-LLM's capacity policy) and its front end (API servers, the host's speed). A
#: run without them would be another engine than the one fitted, shown under the fit's bands.
RAN_WITH = ("enable_prefix_caching", "enable_chunked_prefill", "mixed_batches", "num_scheduler_steps",
            "reserve_outputs", "capacity_scheduler_policy", "api_server_count", "host_speed")
#: What a twin records it was calibrated with, and its runs take where not given: what
#: sized its cache, the context a request had (which does not size vLLM's cache), and
#: ``RAN_WITH``
CALIBRATED_WITH = (*SIZED_WITH, "max_model_len", *RAN_WITH)


@dataclass(frozen=True)
class CalibratedAs:
    """What a ``sim calibrate`` record says its fit ran as (``calibrated_as``)."""

    family: str
    release: dict[str, Any]  # engine_version (when it had one) and the switches served_by records
    stated: dict[str, Any]  # the engine flags its server stated that the fit took (server_settings)
    sized_with: dict[str, Any]  # CALIBRATED_WITH as the fit's engine had them (a file from before: fewer)
    served_model: str | None = None  # the model name its runs were served under (a file from before: None)


def calibrated_as(efficiencies: str) -> CalibratedAs | None:
    """The engine family a ``sim calibrate`` record in ``efficiencies`` was fitted as;
    what a release decides as the fit ran it: ``engine_version`` (when calibrate had one:
    given, or its runs' server said it) and the switches ``served_by`` records (those it
    records: a file written before it recorded them has fewer); the engine flags the
    server stated that the fit took (``server_settings``: its KV cache, its context
    length); what sized its cache (``SIZED_WITH``); and the model name its runs were
    served under (``served_model``). None for a file without a record."""
    record = efficiencies_json(efficiencies).get(CALIBRATION_KEY)
    on = record.get("served_by") if isinstance(record, dict) else None
    if not isinstance(record, dict) or not isinstance(on, dict) or not isinstance(on.get("engine_family"), str):
        return None
    release: dict[str, Any] = {}
    if isinstance(record.get("engine_version"), str) and record["engine_version"]:
        release["engine_version"] = record["engine_version"]
    release.update({k: on[k] for k in RELEASE_SWITCHES if isinstance(on.get(k), bool)})
    stated, sized = record.get("server_settings"), record.get("sized_with")
    served = record.get("served_model")
    return CalibratedAs(str(on["engine_family"]), release, dict(stated) if isinstance(stated, dict) else {},
                        dict(sized) if isinstance(sized, dict) else {},
                        served if isinstance(served, str) and served.strip() else None)


def calibrated_bands(efficiencies: str, family: EngineFamily | str, regime: str) -> dict[str, ErrorBand]:
    """A calibrated twin's bands, per metric class: ``sim calibrate``'s record in the
    efficiencies file (its held-out runs' median error, else its fit runs'); empty for a
    file without one (constants edited by hand: nothing validated them). The stock
    bands do not apply to other constants."""
    record = efficiencies_json(efficiencies).get(CALIBRATION_KEY)
    if not isinstance(record, dict) or not isinstance(record.get("errors"), dict):
        return {}
    split = "holdout" if record.get("split") == "holdout" else "fit"
    fam = EngineFamily.parse(str(family)).value
    loads = record.get("loads")
    basis = loads_words(loads.get("checked")) if isinstance(loads, dict) else ""
    # (the calibration compares p50s and throughput: its latency bands are medians')
    return {
        cls: ErrorBand(cls, float(e["median_abs_pct"]), int(e["runs"]), split, fam, regime, efficiencies,
                       stat="" if cls == "throughput" else "median", basis=basis)
        for cls, e in record["errors"].items()
        if cls in METRIC_CLASSES and isinstance(e, dict)
    }


#: A calibration record's load ranges (``twin.loads_of``) in words
_LOAD_WORDS = (("concurrency", "c {}", ""), ("rate_rps", "rate {}", " req/s"), ("input_tokens", "prompts {}", " tokens"))


def _span(lo: float, hi: float) -> str:
    return f"{lo:,g}" if lo == hi else f"{lo:,g}–{hi:,g}"


def loads_words(loads: Any) -> str:
    """A calibration's load ranges in words ("c 4–8, prompts 1,024 tokens"); "" for none."""
    if not isinstance(loads, dict):
        return ""
    return ", ".join(form.format(_span(*loads[key])) + unit for key, form, unit in _LOAD_WORDS
                     if isinstance(loads.get(key), list) and len(loads[key]) == 2)


def beyond_checked(efficiencies: str, concurrency: float | None, rate_rps: float | None,
                   input_tokens: float | None) -> list[str]:
    """Where a run of a twin (``efficiencies``, its calibration record) is at a load
    outside every run its calibration fitted or checked (``loads``' ``all``): its
    concurrency, rate or mean prompt length beyond their range. Its error band was
    measured within that range only. One sentence, or none (a record without loads)."""
    record = efficiencies_json(efficiencies).get(CALIBRATION_KEY)
    loads = record.get("loads") if isinstance(record, dict) else None
    ranges = loads.get("all") if isinstance(loads, dict) else None
    if not isinstance(ranges, dict):
        return []
    out = []
    for key, value in (("concurrency", concurrency), ("rate_rps", rate_rps), ("input_tokens", input_tokens)):
        span = ranges.get(key)
        if value is None or not isinstance(span, list) or len(span) != 2:
            continue
        if not span[0] * (1 - 1e-6) <= value <= span[1] * (1 + 1e-6):
            out.append(key)
    if not out:
        return []
    run = {"concurrency": concurrency, "rate_rps": rate_rps, "input_tokens": input_tokens}
    this = ", ".join(form.format(f"{run[k]:,.0f}" if k != "rate_rps" else f"{run[k]:,g}") + unit
                     for k, form, unit in _LOAD_WORDS if k in out)
    return [f"this run ({this}) is beyond the loads the twin was checked on: {loads_words(ranges)}; its error "
            "band was measured within them only"]


@functools.cache
def _lengths(path: Path = BANDS_FILE) -> dict[tuple[str, str], tuple[int, int]]:
    """(family, regime) (either may be "all") -> the longest mean prompt and answer of its
    rows validated, as the file says; empty for a file written before it said."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {(str(x["family"]), str(x["regime"])): (int(x["input_tokens_max"]), int(x["output_tokens_max"]))
            for x in data.get("lengths", [])}


def beyond_validated(family: EngineFamily | str, regime: str, input_tokens: float | None, output_tokens: float | None,
                     path: Path = BANDS_FILE) -> list[str]:
    """Where a run's mean prompt or answer (tokens a request) is longer than any row that
    validation compared of its family in its regime (else of its family, else of every
    family in the regime, else of all): its bands were measured on shorter requests. One
    sentence per length past it; empty when none is."""
    fam = EngineFamily.parse(str(family)).value
    table = _lengths(path)
    for key in ((fam, regime), (fam, ALL), (ALL, regime), (ALL, ALL)):
        if key in table:
            limits = table[key]
            break
    else:
        return []
    f, reg = key
    load = "" if reg == ALL else f"{reg} "
    rows = f"{load}row of any engine" if f == ALL else f"{_engine_words(f)} {load}row"
    out = []
    for what, mean, most in (("prompts", input_tokens, limits[0]), ("answers", output_tokens, limits[1])):
        if mean is not None and mean > most:
            out.append(f"its {what} ({mean:,.0f} tokens on average) are longer than any validated {rows}'s "
                       f"(at most {most:,} on average): the bands were measured on shorter ones")
    return out


#: engine switches validation runs only as each family has them (no row states one), in words
_FAMILY_SWITCHES = {
    "capacity_scheduler_policy": "capacity policy",
    "reserve_outputs": "output reservation at admission",
    "mixed_batches": "mixing of prefill and decode in one step",
}


def unvalidated_switches(config: EngineConfig) -> list[str]:
    """Where a run's engine (resolved) sets a switch that validation only ever ran at its
    family's default (``_FAMILY_SWITCHES``) to the other value: one sentence each, as
    ``beyond_validated`` says of lengths (its bands were measured on another engine)."""
    rules = config.engine_family.rules
    defaults = {"capacity_scheduler_policy": rules.capacity_policy, "reserve_outputs": rules.reserve_outputs,
                "mixed_batches": rules.mixes_batches(bool(config.enable_chunked_prefill))}

    def said(value: object) -> str:
        return ("on" if value else "off") if isinstance(value, bool) else str(value)

    out = []
    for name, what in _FAMILY_SWITCHES.items():
        value = getattr(config, name)
        if value is not None and value != defaults[name]:
            out.append(f"its {what} ({said(value)}) is not what any validated {_engine_words(config.engine_family.value)} "
                       f"row ran ({said(defaults[name])}): the bands were measured with the other")
    return out


def _engine_words(family: str) -> str:
    return EngineFamily.parse(family).rules.engine.split(" (")[0]


@functools.cache
def _bands(path: Path = BANDS_FILE) -> dict[tuple[str, str, str, str, str], tuple[float, int]]:
    """(family, regime, split, metric, stat) -> (median |error| %, rows), as the file
    says; stat "" for the headline bands (a file written before there were others has
    only those)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {
        (b["family"], b["regime"], b["split"], b["metric"], b.get("stat", "")): (float(b["median_abs_pct"]), int(b["rows"]))
        for b in data.get("bands", [])
    }


def error_band(
    family: EngineFamily | str, regime: str, metric: str, path: Path = BANDS_FILE, *, stat: str | None = None,
) -> ErrorBand | None:
    """The band for one ``metric`` class (``METRIC_CLASSES``) of a prediction made as
    ``family`` in ``regime`` (``REGIMES``), for its ``stat`` (``STATS``; None: the
    headline's); see the module docstring for the order."""
    fam = EngineFamily.parse(str(family)).value
    table = _bands(path)

    def at(f: str, reg: str) -> ErrorBand | None:
        for split in ("holdout", "fit"):  # (held-out rows before in-sample ones)
            headline = table.get((f, reg, split, metric, ""))
            own = table.get((f, reg, split, metric, stat)) if stat else None
            # the statistic's own band where it rests on most of the same rows: a few
            # rows that reported it would speak for another population than the rest
            if own is not None and own[1] >= MIN_ROWS and (headline is None or own[1] >= COVERAGE * headline[1]):
                return ErrorBand(metric, own[0], own[1], split, f, reg, stat=stat or "")
            if headline is not None and headline[1] >= MIN_ROWS:
                return ErrorBand(metric, headline[0], headline[1], split, f, reg)
        return None

    # the family in this regime; else the wider of every family in it (the same model,
    # other constants) and the family over every regime (its constants, other loads):
    # neither is this prediction's own, so the one that trusts it less; else every row
    own = at(fam, regime)
    if own is not None:
        return own
    borrowed = [b for b in (at(ALL, regime), at(fam, ALL)) if b is not None]
    return max(borrowed, key=lambda b: b.pct) if borrowed else at(ALL, ALL)


def regime_of(*, offline: bool, closed_loop: bool, burst: bool, overloaded: bool = False) -> str:
    """The regime a run falls in: no API server (offline), N users in a closed loop, every
    request at once (saturated), or arrivals at a rate (Poisson, constant, replay). A load
    past the engine's capacity (``overloaded``: an open loop's queues grew through the run,
    ``results.summary.overload_warning``; a closed loop's users waited in the server's
    queue for most of their time to first token, ``results.summary.queue_bound``) is
    saturated too: its latency is the queue's, which no in-capacity Poisson or closed-loop
    row measured."""
    if offline:
        return OFFLINE
    if overloaded:
        return SATURATED
    if closed_loop:
        return CLOSED
    return SATURATED if burst else POISSON


# summary metric -> metric class and the statistic shown (the p50s the headline shows)
SUMMARY_METRICS: dict[str, tuple[str, str | None]] = {
    "ttft_ms": ("TTFT", "median"),
    "tpot_ms": ("TPOT/ITL", "median"),
    "itl_ms": ("TPOT/ITL", "median"),
    "e2e_ms": ("E2E", "median"),
    "output_token_throughput_tps": ("throughput", None),
}


#: a sweep's headline metric (``results.sweepindex.headline``) -> metric class; the others
#: (decode tok/s per user, goodput, counts) were never validated and get no band
HEADLINE_METRICS: dict[str, tuple[str, str | None]] = {
    "output_tok_s": ("throughput", None),
    "req_s": ("throughput", None),
    "output_tok_s_per_gpu": ("throughput", None),  # (output tok/s over a constant: the same relative error)
    "ttft_p50_ms": ("TTFT", "median"),
    "ttft_p99_ms": ("TTFT", "p99"),
    "tpot_p50_ms": ("TPOT/ITL", "median"),
    "tpot_p99_ms": ("TPOT/ITL", "p99"),
    "e2e_p50_ms": ("E2E", "median"),
    "e2e_p99_ms": ("E2E", "p99"),
}


def band_of(prediction: Any, metric: str, path: Path = BANDS_FILE, *, stat: str | None = None) -> ErrorBand | None:
    """The band of one ``metric`` class (for its ``stat``, as ``error_band``) for a run
    whose summary's ``prediction`` is ``prediction`` (its family and regime); None for a
    measured run (no such block) or a metric never validated. A calibrated twin's bands
    are its own runs', whatever the statistic."""
    if not isinstance(prediction, dict):
        return None
    twin = prediction.get("efficiencies")
    if twin:  # (a calibrated twin: its own error, or none; it measured p50s, never p99s)
        band = prediction.get("twin_bands", {}).get(metric)
        if band is None or stat == "p99":
            return None
        return ErrorBand(metric, band["pct"], band["rows"], band["split"], band["family"], band["regime"], twin,
                         stat=band.get("stat", ""), basis=band.get("basis", ""))
    return error_band(prediction["engine_family"], prediction["regime"], metric, path, stat=stat)


def headline_prediction(prediction: Any, path: Path = BANDS_FILE) -> dict[str, Any] | None:
    """A sweep point's ``prediction`` from its run's summary's: the family, the regime and
    each headline metric's band (``HEADLINE_METRICS``; null: not validated); None for a
    measured run. A band the summary recorded (its p50s and output throughput: what
    ``sim run`` printed) is kept as recorded; the others (p99s) are read from ``path``."""
    if not isinstance(prediction, dict):
        return None
    recorded = {SUMMARY_METRICS[k]: v for k, v in (prediction.get("error_bands") or {}).items() if k in SUMMARY_METRICS}
    bands: dict[str, Any] = {}
    for key, (cls, stat) in HEADLINE_METRICS.items():
        if (cls, stat) in recorded:
            bands[key] = recorded[(cls, stat)]
            continue
        band = band_of(prediction, cls, path, stat=stat)
        bands[key] = None if band is None else band.to_json()
    out = {"engine_family": prediction["engine_family"], "regime": prediction["regime"], "error_bands": bands}
    return out if not prediction.get("efficiencies") else {**out, "efficiencies": prediction["efficiencies"]}


def run_bands(prediction: Any, path: Path = BANDS_FILE) -> dict[str, dict[str, Any]] | None:
    """Each headline metric's band (``headline_prediction``) for a run whose summary's
    ``prediction`` is ``prediction``, one never validated as ``{"pct": None, "text":
    why}`` (``unvalidated_why``), for the exports; None for a measured run."""
    pred = headline_prediction(prediction, path)
    if pred is None:
        return None
    why = unvalidated_why(prediction)
    return {k: b or {"pct": None, "text": why} for k, b in pred["error_bands"].items()}


def unvalidated_why(prediction: dict[str, Any]) -> str:
    """Why a metric of a run whose summary's ``prediction`` is ``prediction`` has no
    band: 'not validated for vllm (closed loop)', or a calibrated twin's reason."""
    twin = prediction.get("efficiencies")
    if prediction.get("mismatch"):  # (a twin's bands hold for the server it was calibrated on)
        return f"not validated: {Path(str(twin)).name} was calibrated on another server ({prediction['mismatch']})"
    if twin:  # (the stock bands are for the stock constants)
        return f"not validated: constants from {Path(str(twin)).name}, no calibration recorded for this metric"
    return f"not validated for {prediction.get('engine_family')} ({prediction.get('regime')})"


def prediction_block(
    family: EngineFamily | str, regime: str, path: Path = BANDS_FILE, *, efficiencies: str | None = None,
    served: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What ``summary.json``'s ``prediction`` holds: that the numbers are simulated, the
    family and regime, and each headline metric's band (null: not validated). With
    ``efficiencies`` (step-time constants from a file: a calibrated twin, or edited) the
    bands are the file's own calibration's (``calibrated_bands``), never the stock ones,
    and none where the run's server (``served``: ``served_by``) is not the one the file
    was calibrated on (``mismatch`` says how)."""
    fam = EngineFamily.parse(str(family))
    mismatch = calibration_mismatch(efficiencies, served) if efficiencies and served is not None else None
    twin = ({} if mismatch else calibrated_bands(efficiencies, fam, regime)) if efficiencies else None
    bands: dict[str, Any] = {}
    for key, (cls, stat) in SUMMARY_METRICS.items():
        band = error_band(fam, regime, cls, path, stat=stat) if twin is None else twin.get(cls)
        bands[key] = None if band is None else band.to_json()
    block: dict[str, Any] = {
        "label": "prediction: simulated, not measured",
        "engine_family": fam.value,
        "regime": regime,
        "error_bands": bands,
        "source": "bench/data via `python bench/validate_sim.py --all --write-bands` (docs/validation.md)",
    }
    if twin is not None:
        block["efficiencies"] = efficiencies
        block["twin_bands"] = {cls: b.to_json() for cls, b in twin.items()}
        if mismatch:
            block["mismatch"] = mismatch
            block["source"] = f"none: {efficiencies} was calibrated on another server ({mismatch})"
        else:
            block["source"] = (f"the calibration recorded in {efficiencies} (sim calibrate)" if twin else
                               f"none: the step-time constants come from {efficiencies}, which records no calibration")
    return block
