"""The grid of a sweep: one load axis (users or a request rate), innermost, and any
number of other axes (workload fields, and engine fields against the simulator), whose
combinations are the sweep's *groups*. A point is a group, a load and a repeat; it is run
as the base run with those values put in (``point_configs``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inferlab.load.run import HttpTarget, RunConfig, SimTarget, Target
from inferlab.load.schedules import ClosedLoop, OpenLoop
from inferlab.sim.engine.engine import EngineConfig
from inferlab.workload.config import WorkloadConfig

LOAD_AXES = ("concurrency", "rate")
WORKLOAD_FIELDS = frozenset(f.name for f in dataclasses.fields(WorkloadConfig))
ENGINE_FIELDS = frozenset(f.name for f in dataclasses.fields(EngineConfig))


@dataclass(frozen=True)
class Grid:
    """``load_axis`` (``concurrency`` or ``rate``) over ``load_values``, in the order
    given, for every combination of ``axes`` ((field name, values) pairs: the first
    varies slowest). ``ValueError`` for a name that is no load, workload or engine field,
    or an axis without values."""

    load_axis: str
    load_values: tuple[float, ...]
    axes: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    def __post_init__(self) -> None:
        if self.load_axis not in LOAD_AXES:
            raise ValueError(f"the load axis is one of {', '.join(LOAD_AXES)}, not {self.load_axis!r}")
        if not self.load_values:
            raise ValueError("the load axis has no values")
        for name, values in self.axes:
            if name not in WORKLOAD_FIELDS | ENGINE_FIELDS:
                raise ValueError(f"{name!r} is neither a workload nor an engine setting")
            if not values:
                raise ValueError(f"the {name} axis has no values")

    def groups(self) -> list[dict[str, Any]]:
        """Every combination of the non-load axes (one empty group without any)."""
        names = [n for n, _ in self.axes]
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(v for _, v in self.axes))]

    def engine_axes(self) -> list[str]:
        return [n for n, _ in self.axes if n in ENGINE_FIELDS and n not in WORKLOAD_FIELDS]

    def to_json(self) -> dict[str, Any]:
        return {self.load_axis: list(self.load_values), **{n: list(v) for n, v in self.axes}}


def auto_num_requests(load_axis: str, load: float) -> int:
    """Measured requests per point when neither a count nor a duration is given: four
    rounds of the users (at least 32) in a closed loop; ten seconds of arrivals (at least
    32) in an open loop, so that a queue past saturation has time to show."""
    if load_axis == "concurrency":
        return max(32, 4 * int(load))
    return 64 if math.isinf(load) else max(32, math.ceil(10 * load))


def point_configs(
    run: RunConfig,
    target: Target,
    load_axis: str,
    load: float,
    params: dict[str, Any],
    *,
    repeat: int = 0,
    auto_requests: bool = False,
) -> tuple[RunConfig, Target]:
    """The base ``run`` and ``target`` with one point's values put in: the load (users,
    or a rate keeping the base's arrival process and concurrency cap), the workload and
    engine fields of ``params``, and the seed advanced by ``repeat`` (repeats differ in
    their draws, else they would repeat one sample). ``auto_requests``: the request count
    of ``auto_num_requests``. ``ValueError`` for an engine field against a server."""
    s = run.load.schedule
    schedule = (
        ClosedLoop(int(load)) if load_axis == "concurrency"
        else OpenLoop(load, s.arrival, s.burstiness, s.max_concurrency) if isinstance(s, OpenLoop)
        else OpenLoop(load)
    )
    num = auto_num_requests(load_axis, load) if auto_requests else run.load.num_requests
    load_cfg = dataclasses.replace(run.load, schedule=schedule, num_requests=num, seed=run.load.seed + repeat)
    wl = {k: v for k, v in params.items() if k in WORKLOAD_FIELDS}
    eng = {k: v for k, v in params.items() if k in ENGINE_FIELDS and k not in WORKLOAD_FIELDS}
    run = dataclasses.replace(run, load=load_cfg, workload=dataclasses.replace(run.workload, **wl))
    if eng:
        if isinstance(target, HttpTarget):
            raise ValueError(f"engine settings ({', '.join(eng)}) are the server's own: a sweep against a URL cannot vary them")
        assert isinstance(target, SimTarget)
        target = dataclasses.replace(target, engine=dataclasses.replace(target.engine, **eng))
    return run, target


_SHORT = {
    "concurrency": "c", "rate": "rate", "input_tokens": "in", "output_tokens": "out", "prefix_tokens": "prefix",
    "prefix_groups": "groups", "suffix_tokens": "suffix", "tensor_parallel_size": "tp",
    "max_num_batched_tokens": "mnbt", "max_num_seqs": "seqs", "quantization": "q", "kv_cache_dtype": "kv",
    "capacity_scheduler_policy": "policy",
}


def slug(params: dict[str, Any], repeat: int | None = None) -> str:
    """A folder name for a point: short names and values, e.g. ``c16_in512_tp2_rep1``."""
    parts = [f"{_SHORT.get(k, k)}{_value(v)}" for k, v in params.items()]
    if repeat is not None:
        parts.append(f"rep{repeat}")
    return "_".join(parts) or "point"


def _value(v: Any) -> str:
    if isinstance(v, float):
        v = f"{v:.4g}"
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", str(v)).strip("-")[:40]


def parse_values(text: str) -> list[str]:
    """A comma list's words ("1,2, 4" → ["1", "2", "4"]); ``ValueError`` for an empty one."""
    words = [w.strip() for w in text.split(",")]
    if not all(words):
        raise ValueError(f"{text!r} has an empty value")
    return words


def is_ascending(values: Sequence[float]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))
