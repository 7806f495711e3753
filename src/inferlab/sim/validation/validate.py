"""Validate the simulator against published measurements (``calibration.csv`` format).

``calibration`` turns each CSV row into a ``Scenario`` (or a ``Skipped`` with the
reason); ``predict_scenario`` runs a scenario in virtual time on the engine ``engines``
builds for it and computes the statistics the source reports; ``validate`` does both for
a file and ``error_medians`` takes the median error per metric class. Nothing is tuned per row:

- workload: fixed lengths; ``U[a,b]`` uniform (scaled to the mean the source measured,
  when the row gives one); answers that stop at EOS below the client's max_tokens
  ShareGPT's answer lengths scaled to their mean, at most that limit; ShareGPT rows the token lengths of a published run of vLLM's
  ShareGPT sampler (``sharegpt_lengths``) in order, scaled to the row's means; requests
  the source counted as empty (no text) are that share, one output token each, and the
  others carry the row's mean over them; no two prompts share a prefix;
- load: ``offline`` and ``static`` (batch) = every request at t=0 through the engine
  API (no API cost); ``burst`` = every request at t=0 through the server; ``poisson``
  = seeded exponential gaps from t=0; ``constant`` = even gaps; ``closed`` = N users,
  each sending its next request when the previous one finishes.

Rows with huge offline/closed-loop request counts run on a prefix of their requests
(``_OUTPUT_TOKEN_BUDGET`` output tokens, at least ``_MIN_BATCHES`` full batches) and the
duration is extrapolated at the steady completion rate; latencies come from the prefix.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import math
import random
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from inferlab._errors import InferlabError
from inferlab.load.policy import ClosedLoopPolicy, OpenLoopPolicy, Policy
from inferlab.load.virtual import EngineTarget, drive
from inferlab.results.metrics import interpolate, percentile
from inferlab.sim.engine.engine import Engine, RequestTimeline
from inferlab.sim.validation.calibration import load_rows, parse_rows
from inferlab.sim.validation.engines import build_engine
from inferlab.sim.validation.scenario import (
    LATENCY_COLUMNS,
    METRIC_CLASS,
    Lengths,
    Measurement,
    PromptSharing,
    Scenario,
    ScenarioError,
    Skipped,
    stat_order,
)
from inferlab.workload.sharegpt import sharegpt_lengths
from inferlab.workload.spec import RequestSpec

# ShareGPT V3 through vLLM's sampler (prompt <= 1024, prompt + output <= 2048): the
# lengths of a published run (``sharegpt_lengths``), scaled to the row's means.
_SHAREGPT_MAX_INPUT = 1024
_SHAREGPT_MAX_TOTAL = 2048

_OUTPUT_TOKEN_BUDGET = 1_000_000
_MIN_BATCHES = 4
_SEED = 0

METRIC_CLASSES = ("throughput", "TTFT", "TPOT/ITL", "E2E")
TARGET_PCT = {"throughput": 10.0, "TTFT": 15.0, "TPOT/ITL": 15.0}


@dataclass(frozen=True)
class Comparison:
    """Measured against predicted for one metric of one scenario."""

    scenario: Scenario
    metric: str
    stat: str
    measured: float
    predicted: float

    @property
    def error_pct(self) -> float:
        """Signed error of the prediction, in percent of the measurement."""
        return 100.0 * (self.predicted - self.measured) / self.measured

    @property
    def metric_class(self) -> str:
        return METRIC_CLASS[self.metric]


@dataclass
class Report:
    comparisons: list[Comparison] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    # the rows' other latency statistics (``Scenario.distribution``), kept apart:
    # ``error_medians`` of ``comparisons`` are the headline, these never enter it
    distribution: list[Comparison] = field(default_factory=list)


# --- the workload ---------------------------------------------------------------------------


def _scaled(values: Sequence[int], mean: float, caps: Sequence[int], low: int = 1) -> list[int]:
    """``values`` scaled so that their mean is ``mean``, each in [low, caps[i]]: where caps
    cut the longest, the rest scale up further, as far as the caps allow."""

    def scale(factor: float) -> list[int]:
        return [max(low, min(cap, round(v * factor))) for v, cap in zip(values, caps, strict=True)]

    lo = mean / statistics.fmean(values)
    out = scale(lo)
    if statistics.fmean(out) >= mean * 0.999:
        return out
    hi = lo * 2
    while statistics.fmean(scale(hi)) < mean and hi < lo * 1024:
        hi *= 2
    for _ in range(40):  # the capped mean rises with the factor: bisect for it
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if statistics.fmean(scale(mid)) < mean else (lo, mid)
    return scale(hi)


def workload(sc: Scenario) -> list[tuple[int, int]]:
    """``(prompt_len, output_len)`` per request; deterministic (seed 0)."""
    n = sc.num_requests
    rng = random.Random(_SEED)
    inp, out = sc.input_len, sc.output_len
    # ShareGPT: the published run's requests in order (vLLM's sampler takes the first n),
    # without those that produced no text; repeated when a row asks for more
    shared = [(i, o) for i, o in zip(*sharegpt_lengths(), strict=True) if o > 0]
    pairs = [shared[k % len(shared)] for k in range(n)]
    if inp.kind == "sharegpt":
        ins = _scaled([i for i, _ in pairs], inp.a, [_SHAREGPT_MAX_INPUT] * n)
    else:
        ins = _draws(inp, rng, n)
    # requests that generate no text get one token (prefilled, then end of sequence);
    # the others have the stated mean, which the source measured over them
    empty = set(_empty_indices(sc, n))
    keep = [k for k in range(n) if k not in empty]
    if not keep:
        raise ScenarioError("every request is counted empty")
    # the row's mean over the non-empty requests assumed the stated share; with this
    # many requests the share runs a little off it, and the overall mean stays the stated one
    adjust = (1 - sc.empty_fraction) * n / len(keep)
    if out.kind == "sharegpt":
        caps = [max(1, _SHAREGPT_MAX_TOTAL - ins[k]) for k in keep]
        kept = _scaled([pairs[k][1] for k in keep], out.a * adjust, caps)
    elif out.kind == "eos":
        if out.a * adjust >= out.b:  # (every answer at the limit would be lockstep again)
            raise ScenarioError(f"answers stopped at EOS average {out.a * adjust:g} over the non-empty requests: not below max_tokens {out.b:g}")
        # answers that end at EOS: how long a model chooses to answer (ShareGPT's answers,
        # in order) scaled to the measured mean, each at most the client's max_tokens;
        # where that limit cuts the longest, the rest are scaled up further. Lengths that
        # differ let a closed loop's users drift apart, as real ones do
        kept = _scaled([pairs[k][1] for k in keep], out.a * adjust, [int(out.b)] * len(keep))
    else:
        measured = None if out.measured is None else out.measured * adjust
        kept = _draws(dataclasses.replace(out, measured=measured), rng, len(keep))
    outs = [1] * n
    for k, o in zip(keep, kept, strict=True):
        outs[k] = o
    return list(zip(ins, outs, strict=True))


def _draws(spec: Lengths, rng: random.Random, n: int) -> list[int]:
    """``n`` lengths: fixed, or uniform draws (scaled to the mean measured, if stated)."""
    if spec.kind != "uniform":
        return [max(1, round(spec.a))] * n
    lo, hi = int(spec.a), int(spec.b)
    drawn = [rng.randint(lo, hi) for _ in range(n)]
    return drawn if spec.measured is None else _scaled(drawn, spec.measured, [hi] * n, max(1, lo))


def _empty_indices(sc: Scenario, n: int) -> list[int]:
    """The requests that generate no text (the stated share of ``n``), spread evenly."""
    count = round(sc.empty_fraction * n)
    return [k * n // count for k in range(count)]


# --- running --------------------------------------------------------------------------------


@dataclass
class _Run:
    timelines: list[RequestTimeline]
    gaps_s: list[float]  # every inter-token gap of every request
    num_requests: int  # the row's count (more than len(timelines) when run on a prefix)
    empty: frozenset[int]  # requests the source counts as empty


_FIRST_ID = 1 << 20  # above every other prompt id


_PREFIX_BASE = 1 << 24  # shared prefixes' ids: above every request's first id


def prompts(jobs: Sequence[tuple[int, int]], sharing: PromptSharing | None = None) -> list[list[int]]:
    """Each job's prompt ids. Without ``sharing`` no two prompts share a cached prefix
    (each begins with an id of its own). With it, prompt k begins with shared prefix
    k mod groups, and a conversation's turns (``turns`` consecutive jobs) are prefixes
    of one token stream: each turn's prompt holds the earlier ones (``PromptSharing``)."""
    out: list[list[int]] = []
    turns = sharing.turns if sharing is not None else 1
    p = sharing.prefix_tokens if sharing is not None else 0
    groups = sharing.groups if sharing is not None else 1
    for i, (n, _) in enumerate(jobs):
        lead = i // turns  # the conversation (each request its own without turns)
        prefix = [_PREFIX_BASE + (lead % groups) * p + j for j in range(p)] if p else []
        stream = [*prefix, _FIRST_ID + lead, *range(1, max(0, n - len(prefix) - 1) + 1)]
        out.append(stream[:n])
    return out


def _with_turns(jobs: list[tuple[int, int]], sharing: PromptSharing | None) -> list[tuple[int, int]]:
    """``jobs`` with each conversation's prompt lengths in rising order (the history grows
    turn by turn; the lengths drawn are kept, so their mean is)."""
    if sharing is None or sharing.turns <= 1:
        return jobs
    t = sharing.turns
    out: list[tuple[int, int]] = []
    for start in range(0, len(jobs), t):
        conv = jobs[start:start + t]
        ins = sorted(i for i, _ in conv)
        out.extend((i, o) for i, (_, o) in zip(ins, conv, strict=True))
    return out


# between two passes of one benchmark on one server (a rerun): enough for the last
# pass's streams to drain; nothing in the engine depends on its length
_BETWEEN_PASSES_S = 1.0


def _serve(
    engine: Engine,
    jobs: Sequence[tuple[int, int]],
    arrivals_s: Sequence[float] | None,
    users: int,
    sharing: PromptSharing | None = None,
) -> list[RequestTimeline]:
    """Serve ``jobs`` open loop at ``arrivals_s`` (in time order), or closed loop with
    ``users`` (when ``arrivals_s`` is None), in virtual time, with prompts that share
    prefixes as ``sharing`` says (``prompts``); returns the timelines in job order. A
    rerun (``sharing.reruns``) serves the same prompts that many times first, each pass
    after the one before has ended, and returns the last pass's timelines."""
    if arrivals_s is not None and any(b < a for a, b in itertools.pairwise(arrivals_s)):
        raise ValueError("arrivals must be in time order")
    ids = prompts(jobs, sharing)
    start_s = 0.0  # each pass in the engine's one clock, after the one before has ended
    reruns = sharing.reruns if sharing is not None else 0
    if reruns and not engine.config.enable_prefix_caching:
        raise ScenarioError(
            f"prefix_sharing rerun={reruns}: this engine caches no prefixes (prefix caching off), "
            "so an earlier pass leaves nothing for the measured one: state the row without rerun"
        )
    for rerun in range(reruns + 1):
        specs = (RequestSpec(p, out) for p, (_, out) in zip(ids, jobs, strict=True))
        policy: Policy
        if arrivals_s is not None:
            at = [start_s + a for a in arrivals_s]
            policy = OpenLoopPolicy(zip(at, specs, strict=True), max_concurrency=None, warmup=0)
        else:
            policy = ClosedLoopPolicy(users, specs, total=len(jobs), warmup=0, duration_s=None, start_s=start_s)
        names = [str(i) if rerun == reruns else f"pass{rerun}-{i}" for i in range(len(jobs))]
        drive(policy, EngineTarget(engine, names))
        if rerun < reruns:  # an earlier pass: only what it left in the cache matters
            done = [engine.forget(name) for name in names]
            start_s = max(_finished(t) for t in done if t is not None) + _BETWEEN_PASSES_S
    return [engine.timeline(str(i)) for i in range(len(jobs))]


def _gaps_s(timelines: Iterable[RequestTimeline]) -> list[float]:
    """Every inter-token gap of every request (timelines with token times recorded)."""
    gaps: list[float] = []
    for t in timelines:
        times = t.token_times_s
        gaps.extend(b - a for a, b in itertools.pairwise(times))
    return gaps


def _run(sc: Scenario) -> _Run:
    jobs = _with_turns(workload(sc), sc.sharing)
    engine = build_engine(sc, max(i + o for i, o in jobs))
    n = len(jobs)
    if sc.kind in ("offline", "closed"):
        mean_out = statistics.fmean(o for _, o in jobs)
        mean_len = statistics.fmean(i + o for i, o in jobs)
        batch = min(engine.limits.max_num_seqs, engine.kv_capacity_tokens / mean_len)
        keep = max(int(_OUTPUT_TOKEN_BUDGET / mean_out), int(_MIN_BATCHES * batch) + 1)
        if sc.kind == "closed":
            keep = max(keep, _MIN_BATCHES * (sc.concurrency or 1))
        jobs = jobs[:keep]
    arrivals: list[float] | None
    if sc.kind == "closed":
        arrivals = None
    elif sc.kind in ("poisson", "constant"):
        rate = sc.rate_rps or 1.0
        rng = random.Random(_SEED)
        gaps = [rng.expovariate(rate) if sc.kind == "poisson" else 1 / rate for _ in jobs]
        arrivals = [0.0, *_cumsum(gaps[:-1])]
    else:
        arrivals = [0.0] * len(jobs)
    timelines = _serve(engine, jobs, arrivals, sc.concurrency or 1, sc.sharing)
    empty = frozenset(k for k in _empty_indices(sc, n) if k < len(jobs))
    return _Run(timelines, _gaps_s(timelines), n, empty)


def _cumsum(xs: Iterable[float]) -> list[float]:
    out, total = [], 0.0
    for x in xs:
        total += x
        out.append(total)
    return out


def _finished(t: RequestTimeline) -> float:
    assert t.finished_s is not None  # every request runs to completion
    return t.finished_s


def _duration_s(run: _Run) -> float:
    """First arrival to last completion, extrapolated at the steady completion rate (between
    the first tenth of completions and the last admission) for a run on a prefix."""
    tls = run.timelines
    start = min(t.arrival_s for t in tls)
    finishes = sorted(_finished(t) for t in tls)
    elapsed = finishes[-1] - start
    n = len(tls)
    if run.num_requests <= n:
        return elapsed
    t_a = finishes[max(0, n // 10 - 1)]
    t_b = max(t.scheduled_s or 0.0 for t in tls)
    inside = sum(1 for f in finishes if t_a < f <= t_b)
    rate = inside / (t_b - t_a) if t_b > t_a and inside >= 2 else n / elapsed
    return elapsed + (run.num_requests - n) / rate


def _stat(values: Sequence[float], stat: str, weights: Sequence[float] | None = None) -> float:
    """mean, median or pNN of ``values``, each counted ``weights[i]`` times (default 1).
    Percentiles interpolate linearly between ranks, as numpy's (what vLLM's, SGLang's and
    most benchmark clients report) and inferlab's own summaries do."""
    if not values:
        raise ValueError("no simulated values for this statistic")
    q = 50 if stat == "median" else 0 if stat == "mean" else int(stat[1:])
    if weights is None:
        return statistics.fmean(values) if stat == "mean" else percentile(sorted(values), q)
    total = math.fsum(weights)
    if stat == "mean":
        return math.fsum(w * v for w, v in zip(weights, values, strict=True)) / total
    ordered = sorted(zip(values, weights, strict=True))

    def at(rank: int) -> float:  # the value at this 0-based rank of the expanded list
        seen = 0.0
        for v, w in ordered:
            seen += w
            if rank < seen - 1e-9 * total:
                return v
        return ordered[-1][0]

    return interpolate(at, max(1, round(total)), q)  # (the weights sum to whole requests)


def _request_weights(sc: Scenario, run: _Run) -> list[float] | None:
    """How many of the row's requests each simulated one stands for. A closed loop run on
    a prefix of the row's requests has its cold start (every user's first request, all at
    t = 0) once, like the full run, and the steady state that follows stands for the rest;
    counted evenly, a 10-round prefix would give the cold start 20 times its weight in a
    200-round run. ``None``: every request counts once."""
    n = len(run.timelines)
    users = min(sc.concurrency or 1, n)
    if sc.kind != "closed" or run.num_requests <= n or n <= users:
        return None
    rest = (run.num_requests - users) / (n - users)
    return [1.0] * users + [rest] * (n - users)


def predict(sc: Scenario, run: _Run, m: Measurement) -> float:
    """The simulated value of ``m``: same unit, same statistic. Static batches report the
    whole batch (its prefill for TTFT, its latency for E2E), like benchmark_latency."""
    tls, empty = run.timelines, run.empty
    first = [t.first_token_s or 0.0 for t in tls]
    weights = _request_weights(sc, run)
    if METRIC_CLASS[m.metric] == "throughput":
        mean_in = statistics.fmean(t.prompt_tokens for t in tls)
        mean_out = statistics.fmean(0 if k in empty else t.output_tokens for k, t in enumerate(tls))
        per_request = {"output_tok_per_s": mean_out, "total_tok_per_s": mean_in + mean_out}
        return run.num_requests * per_request.get(m.metric, 1.0) / _duration_s(run)
    if m.metric == "ttft_ms":
        if sc.kind == "static":
            return 1000 * max(first)
        ttfts = [
            0.0 if k in empty else f - t.arrival_s
            for k, (f, t) in enumerate(zip(first, tls, strict=True))
        ]
        return 1000 * _stat(ttfts, m.stat, weights)
    if m.metric == "e2e_latency_ms":
        if sc.kind == "static":
            return 1000 * max(_finished(t) for t in tls)
        e2es = [0.0 if k in empty else _finished(t) - t.arrival_s for k, t in enumerate(tls)]
        return 1000 * _stat(e2es, m.stat, weights)
    if m.metric == "tpot_ms":
        decoding = [k for k, t in enumerate(tls) if t.output_tokens > 1]
        tpots = [(_finished(tls[k]) - first[k]) / (tls[k].output_tokens - 1) for k in decoding]
        return 1000 * _stat(tpots, m.stat, None if weights is None else [weights[k] for k in decoding])
    # itl_ms: every gap, pooled over requests (``gaps_s`` holds them in request order)
    gap_weights = None
    if weights is not None:
        gap_weights = [w for w, t in zip(weights, tls, strict=True) for _ in t.token_times_s[1:]]
    return 1000 * _stat(run.gaps_s, m.stat, gap_weights)


def predict_scenario(sc: Scenario) -> tuple[dict[str, float], int]:
    """Predicted value per measured metric, and how many of the row's requests were
    simulated (fewer when the duration was extrapolated); ``ValueError`` if the engine
    cannot run the scenario."""
    predicted, _, simulated = _predict_all(sc)
    return predicted, simulated


def _predict_all(sc: Scenario) -> tuple[dict[str, float], dict[tuple[str, str], float], int]:
    """``predict_scenario``, and from the same run the row's distribution statistics by
    ``(metric, stat)``."""
    run = _run(sc)
    headline = {m.metric: predict(sc, run, m) for m in sc.measurements}
    spread: dict[tuple[str, str], float] = {}
    for m in sc.distribution:  # one the run cannot give is left out (``validate_files`` says so)
        try:
            spread[m.metric, m.stat] = predict(sc, run, m)
        except (ValueError, ArithmeticError):
            continue
    return headline, spread, len(run.timelines)


def validate(path: str | Path, row_ids: Iterable[str] | None = None, jobs: int = 1) -> Report:
    """Parse and simulate every row of a calibration file (or only ``row_ids``)."""
    return validate_files([path], row_ids, jobs)


def validate_files(
    paths: Sequence[str | Path], row_ids: Iterable[str] | None = None, jobs: int = 1
) -> Report:
    """``validate`` over several files (row ids are unique across ``bench/data``), with
    the rows simulated in ``jobs`` processes (the results do not depend on it)."""
    rows = [r for path in paths for r in load_rows(path)]
    if row_ids is not None:
        wanted = {r.strip() for r in row_ids}
        rows = [r for r in rows if r.get("row_id", "").strip() in wanted]
    scenarios, skipped = parse_rows(rows)
    report = Report(skipped=skipped)
    if jobs > 1 and len(scenarios) > 1:
        with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
            outcomes = list(pool.map(_predict_or_reason, scenarios, chunksize=1))
    else:
        outcomes = [_predict_or_reason(sc) for sc in scenarios]
    for sc, outcome in zip(scenarios, outcomes, strict=True):
        if isinstance(outcome, str):
            report.skipped.append(Skipped(sc.row_id, sc.engine_label, sc.model, outcome))
            continue
        predicted, spread, simulated = outcome
        if simulated < sc.num_requests:
            note = f"ran {simulated:,} of {sc.num_requests:,} requests, duration extrapolated"
            sc = dataclasses.replace(sc, assumptions=(*sc.assumptions, note))
        for m in sc.measurements:
            report.comparisons.append(
                Comparison(sc, m.metric, m.stat, m.value, predicted[m.metric])
            )
        for m in sc.distribution:
            if (m.metric, m.stat) not in spread:
                reason = f"{m.metric} {m.stat} (distribution): the simulated run gives no such value"
                report.skipped.append(Skipped(sc.row_id, sc.engine_label, sc.model, reason))
                continue
            report.distribution.append(
                Comparison(sc, m.metric, m.stat, m.value, spread[m.metric, m.stat])
            )
    return report


def _predict_or_reason(
    sc: Scenario,
) -> tuple[dict[str, float], dict[tuple[str, str], float], int] | str:
    """``_predict_all``, or the reason the row cannot run."""
    try:
        return _predict_all(sc)
    except (ValueError, ArithmeticError, LookupError, InferlabError) as e:
        # (a ScenarioError says why the row cannot be expressed; the rest are the engine's)
        return str(e) if isinstance(e, ScenarioError) else f"the simulated engine cannot run it: {e}"


def length_mismatches(comparisons: Sequence[Comparison], tolerance_pct: float = 3.0) -> dict[str, str]:
    """Rows whose simulated lengths disagree with their source's, by row id, with what
    disagrees. One run's output tok/s, total tok/s and req/s share its duration, so their
    errors differ only where tokens per request do: output tok/s against req/s is the
    output length, total against output tok/s the prompt length."""
    by_row: dict[str, dict[str, float]] = {}
    for c in comparisons:
        if c.metric_class == "throughput":
            by_row.setdefault(c.scenario.row_id, {})[c.metric] = 1 + c.error_pct / 100
    found: dict[str, str] = {}
    for rid, ratio in by_row.items():
        notes = []
        for a, b, what in (
            ("output_tok_per_s", "req_per_s", "output tokens per request"),
            ("total_tok_per_s", "output_tok_per_s", "prompt tokens (total vs output tok/s)"),
        ):
            if a in ratio and b in ratio and ratio[b] > 0:
                off = 100 * (ratio[a] / ratio[b] - 1)
                if abs(off) > tolerance_pct:
                    notes.append(f"{what} {off:+.1f}%")
        if notes:
            found[rid] = "; ".join(notes)
    return found


def error_medians(comparisons: Sequence[Comparison]) -> dict[str, tuple[float, int, int]]:
    """Per metric class present: (median over rows of the row's mean |error| %, rows,
    values). A row that reports three throughputs of one run counts once, not three times."""
    out: dict[str, tuple[float, int, int]] = {}
    for cls in METRIC_CLASSES:
        by_row: dict[str, list[float]] = {}
        for c in comparisons:
            if c.metric_class == cls:
                by_row.setdefault(c.scenario.row_id, []).append(abs(c.error_pct))
        if by_row:
            median = statistics.median(statistics.fmean(v) for v in by_row.values())
            out[cls] = (median, len(by_row), sum(len(v) for v in by_row.values()))
    return out


def row_errors_by_source(comparisons: Sequence[Comparison], cls: str) -> dict[str, list[float]]:
    """Each row's mean |error| % in metric class ``cls`` (what ``error_medians`` takes the
    median of), grouped by the row's source."""
    by_row: dict[str, list[float]] = {}
    source: dict[str, str] = {}
    for c in comparisons:
        if c.metric_class == cls:
            by_row.setdefault(c.scenario.row_id, []).append(abs(c.error_pct))
            source[c.scenario.row_id] = c.scenario.source_id
    out: dict[str, list[float]] = {}
    for row, errors in by_row.items():
        out.setdefault(source[row], []).append(statistics.fmean(errors))
    return out


def source_interval(by_source: dict[str, list[float]], draws: int = 2000, level: float = 0.95,
                    seed: int = 0) -> tuple[float, float]:
    """How far the median over rows moves with the sources that happen to be in the set:
    the central ``level`` interval of the median over the rows of as many sources drawn
    with replacement, ``draws`` times (a bootstrap over sources, the unit of the split:
    one source's rows share a host, a client and an engine build, so rows are not
    independent). Deterministic for a ``seed``; ``ValueError`` without rows."""
    groups = [v for v in by_source.values() if v]
    if not groups:
        raise ValueError("no rows")
    rng = random.Random(seed)
    medians = sorted(
        statistics.median([x for _ in groups for x in rng.choice(groups)]) for _ in range(draws)
    )
    tail = (1 - level) / 2
    return medians[int(tail * (draws - 1))], medians[math.ceil((1 - tail) * (draws - 1))]


def group_medians(
    comparisons: Sequence[Comparison], key: Callable[[Comparison], str]
) -> dict[str, dict[str, tuple[float, int, int]]]:
    """``error_medians`` per group of ``key`` (a family, a regime, a split ...)."""
    groups: dict[str, list[Comparison]] = {}
    for c in comparisons:
        groups.setdefault(key(c), []).append(c)
    return {g: error_medians(cs) for g, cs in sorted(groups.items())}


def distribution_medians(comparisons: Sequence[Comparison]) -> dict[tuple[str, str], tuple[float, float, int]]:
    """Per ``(metric, stat)`` (a latency column and one of its statistics, each row once):
    (median |error| %, median signed error %, rows), the statistics of each metric from
    the mean up to the highest percentile."""
    by: dict[tuple[str, str], list[float]] = {}
    for c in comparisons:
        by.setdefault((c.metric, c.stat), []).append(c.error_pct)
    order = {m: k for k, m in enumerate(LATENCY_COLUMNS)}
    return {
        key: (statistics.median(abs(e) for e in errs), statistics.median(errs), len(errs))
        for key, errs in sorted(by.items(), key=lambda kv: (order[kv[0][0]], stat_order(kv[0][1])))
    }
