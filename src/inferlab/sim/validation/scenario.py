"""A calibration scenario: one published benchmark the simulator can run, or why not.

``calibration`` builds these from a calibration CSV; ``validate`` runs them. A
``Measurement``'s ``metric`` is a CSV column, grouped into classes by ``METRIC_CLASS``.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferlab._errors import InferlabError
from inferlab.sim.engine.dtypes import KVCacheDType, Quantization
from inferlab.sim.engine.families import EngineFamily

METRIC_CLASS = {
    "ttft_ms": "TTFT",
    "itl_ms": "TPOT/ITL",
    "tpot_ms": "TPOT/ITL",
    "e2e_latency_ms": "E2E",
    "output_tok_per_s": "throughput",
    "total_tok_per_s": "throughput",
    "req_per_s": "throughput",
}
METRIC_COLUMNS = tuple(METRIC_CLASS)
# the latency columns, in the order tables list them (a ``distribution`` cell's metrics)
LATENCY_COLUMNS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms")


def stat_order(stat: str) -> tuple[int, int]:
    """A sort key for a latency statistic: mean first, then percentiles upwards (the
    median is p50)."""
    return (0, 0) if stat == "mean" else (1, 50 if stat == "median" else int(stat[1:]))

# The data's split by source (``bench/data/*.csv``'s ``split`` column): constants are
# fitted on FIT rows only; HOLDOUT rows measure how far predictions carry.
FIT, HOLDOUT = "fit", "holdout"
SPLITS = (FIT, HOLDOUT)

# Load regimes, by scenario kind: no API server (offline, static batches); N users each
# waiting for their last answer (closed loop); arrivals at a rate (Poisson, constant);
# every request at once (saturated: a burst).
OFFLINE, CLOSED, POISSON, SATURATED = "offline", "closed loop", "Poisson", "saturated"
REGIMES = (OFFLINE, CLOSED, POISSON, SATURATED)
REGIME_OF_KIND = {
    "offline": OFFLINE,
    "static": OFFLINE,
    "closed": CLOSED,
    "poisson": POISSON,
    "constant": POISSON,
    "burst": SATURATED,
}


@dataclass(frozen=True)
class Lengths:
    """Token lengths: ``fixed`` (a), ``uniform`` [a, b], ``sharegpt`` with mean a, or
    ``eos`` (outputs only): answers that stop at end of sequence with mean a, each at
    most the client's limit b. A uniform range may carry the mean its source measured
    (``measured``)."""

    kind: str
    a: float
    b: float = 0.0
    measured: float | None = None

    @property
    def mean(self) -> float:
        if self.measured is not None:
            return self.measured
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a


@dataclass(frozen=True)
class PromptSharing:
    """How a row's prompts share prefixes (``bench/data``'s ``prefix_sharing`` column).

    ``prefix_tokens`` > 0: every prompt begins with one of ``groups`` shared prefixes of
    that many tokens (a system prompt or few-shot block per group, as inference-perf's
    and SGLang's shared-prefix datasets build them), request k with prefix k mod groups;
    the rest of each prompt is its own. ``turns`` > 1: requests come in conversations of
    that many consecutive turns, and each turn's prompt is the conversation so far: the
    earlier turns' prompts are its prefix (their answers are not: a row's turns go out
    as its load sends any request, not each after the last one's answer, so none can
    hold one; ``sim run --sessions`` does send each turn after its answer, and with
    ``--api chat`` the engine finds the answer's blocks). The stated input lengths are whole prompts, prefix and
    history included. ``reruns`` > 0: the same prompts, in the same order, were sent
    that many times before on the same server, each pass ended before the next began
    (a benchmark repeated with one seed against a server with prefix caching on): the
    measured pass finds in the cache what the earlier ones left there."""

    prefix_tokens: int = 0
    groups: int = 1
    turns: int = 1
    reruns: int = 0

    def describe(self) -> str:
        parts = []
        if self.prefix_tokens:
            parts.append(f"{self.groups} shared prefix{'es' if self.groups > 1 else ''} of {self.prefix_tokens} tokens")
        if self.turns > 1:
            parts.append(f"conversations of {self.turns} turns, each turn's prompt the conversation so far")
        if self.reruns:
            times = "once" if self.reruns == 1 else f"{self.reruns} times"
            parts.append(f"the same prompts sent {times} before on the same server (its prefix cache holds what it had room for)")
        return "; ".join(parts)


@dataclass(frozen=True)
class Measurement:
    """One published number: ``metric`` is a CSV column; ``stat`` is aggregate (the
    throughputs), mean, median or pNN."""

    metric: str
    stat: str
    value: float


@dataclass(frozen=True)
class Scenario:
    """A row the simulator can run; ``kind`` is offline|static|burst|poisson|constant|closed.

    ``concurrency`` is the batch (static) or user count (closed); ``engine_flags`` are the
    flags the row states, by vLLM name; ``version`` the engine release it states;
    ``empty_fraction`` is the share of requests the source counted with no output and
    TTFT = E2E = 0 in its means."""

    row_id: str
    family: EngineFamily
    engine_label: str
    model: str
    gpu: str
    tp: int
    precision: str  # a label: bf16, fp8, int8, int4, awq-int4
    quantization: Quantization | None  # None: bf16 weights
    kv_cache_dtype: KVCacheDType
    kind: str
    concurrency: int | None
    rate_rps: float | None
    num_requests: int
    input_len: Lengths
    output_len: Lengths
    measurements: tuple[Measurement, ...]
    engine_flags: tuple[tuple[str, float], ...]
    version: tuple[int, int] | None
    native_max_len: int
    via_server: bool
    empty_fraction: float = 0.0
    assumptions: tuple[str, ...] = ()
    source_id: str = ""  # the publisher's document or dataset: the unit of the split
    split: str = FIT  # FIT or HOLDOUT (``bench/data``'s ``split`` column)
    sharing: PromptSharing | None = None  # prompts that share prefixes (None: none do)
    # more statistics of the same run's latencies (``bench/data``'s ``distribution``
    # column: medians and tails beside a mean, ...): compared apart from
    # ``measurements``, never in the headline medians or the error bands
    distribution: tuple[Measurement, ...] = ()

    @property
    def regime(self) -> str:
        """The load regime the error bands are kept for (``REGIMES``)."""
        return REGIME_OF_KIND[self.kind]


@dataclass(frozen=True)
class Skipped:
    """A row, or one metric of a row (``reason`` starts with the column), left out."""

    row_id: str
    engine: str
    model: str
    reason: str


class ScenarioError(InferlabError):
    """A row cannot be expressed; the message is the reason."""
