"""When a load axis stops: the point past which more load buys latency, not throughput.

Pure rules over two consecutive points' headline metrics (``index.headline``); the
sweep runner asks after each load value and skips the rest of that axis once one fires.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SaturationRules:
    """``min_gain``: stop when output tokens/s rose by less than this share over the
    previous load (0.05: 5 %); ``max_ttft_growth``: stop when TTFT p50 grew more than
    this many times over the previous load's, beyond what output tokens/s grew (TTFT
    4.5x for 1.1x the throughput stops; 5x for 6.6x, a load step that bought throughput
    with it, does not); ``on_errors``: stop at the first load with failed requests."""

    min_gain: float = 0.05
    max_ttft_growth: float = 4.0
    on_errors: bool = True

    def __post_init__(self) -> None:
        if not self.min_gain >= 0:
            raise ValueError("the throughput gain threshold cannot be negative")
        if not self.max_ttft_growth > 1:
            raise ValueError("the TTFT growth limit must be above 1")


@dataclass(frozen=True)
class Stop:
    """Why an axis stopped: ``rule`` (``errors``, ``ttft``, ``throughput``), the reason in
    words, the load value ``at`` which it fired and the ``knee``: the last load before it
    (None when the first load fired: no good point)."""

    rule: str
    reason: str
    at: float
    knee: float | None

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "reason": self.reason, "at": self.at, "knee": self.knee}


def check(
    rules: SaturationRules,
    axis: str,
    prev: tuple[float, dict[str, Any]] | None,
    cur: tuple[float, dict[str, Any]],
) -> Stop | None:
    """Whether the load axis ``axis`` stops at ``cur`` ((load, headline)), given the
    point before it, ``prev`` (None at the first load). Errors first, then TTFT, then
    throughput; a metric a point lacks (None) fires no rule."""
    load, head = cur
    name = _short(axis)
    if rules.on_errors and (head.get("failed") or 0) > 0:
        knee = None if prev is None else prev[0]
        return Stop("errors", f"{head['failed']} of {head.get('total')} requests failed at {name}={_num(load)}", load, knee)
    if prev is None:
        return None
    p_load, p_head = prev
    ttft, p_ttft = head.get("ttft_p50_ms"), p_head.get("ttft_p50_ms")
    tps, p_tps = head.get("output_tok_s"), p_head.get("output_tok_s")
    bought = max(1.0, tps / p_tps) if tps is not None and p_tps else 1.0  # (the throughput the step bought)
    if ttft is not None and p_ttft and ttft > rules.max_ttft_growth * bought * p_ttft:
        more = f" for {bought:.3g}x the output tok/s" if bought > 1 else ""
        limit = rules.max_ttft_growth * bought
        return Stop(
            "ttft",
            f"TTFT p50 exploded: {p_ttft:,.0f} → {ttft:,.0f} ms ({ttft / p_ttft:.1f}x{more}, > {limit:.3g}x) "
            f"from {name}={_num(p_load)} to {_num(load)}",
            load, p_load,
        )
    if tps is not None and p_tps:
        gain = tps / p_tps - 1
        if gain < rules.min_gain:
            return Stop(
                "throughput",
                f"output tok/s gained {gain:+.1%} (< {rules.min_gain:.0%}) from {name}={_num(p_load)} to {_num(load)}",
                load, p_load,
            )
    return None


def _short(axis: str) -> str:
    return {"concurrency": "c", "rate": "rate"}.get(axis, axis)


def _num(v: float) -> str:
    return f"{v:g}"
