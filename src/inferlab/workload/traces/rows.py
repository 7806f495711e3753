"""A trace's rows as every reader produces them, and the checks they share."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from inferlab._errors import UsageError
from inferlab.workload.spec import Measured


@dataclass(frozen=True)
class TraceRow:
    arrival_s: float
    input_tokens: int
    output_tokens: int
    session: str | None = None
    prefix_group: str | None = None
    prefix_tokens: int | None = None
    hash_ids: tuple[int, ...] = ()
    measured: Measured | None = None
    user: int | None = None  # the closed-loop user that sent it (a run's requests.jsonl)
    warmup: bool = False  # a warm-up request of the recorded run (a run's requests.jsonl)


def measured_of(row: dict[str, Any]) -> Measured | None:
    vals = [None if row.get(k) is None else float(row[k]) for k in ("ttft_ms", "tpot_ms", "e2e_ms")]
    return None if all(v is None for v in vals) else Measured(*vals)


def as_int(v: object) -> int:
    if isinstance(v, bool):
        raise TypeError("expected an integer, got a boolean")
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        if v.strip().replace(".", "", 1).isdigit():  # "12.0" as some CSV writers write 12
            x = float(v)
            if not x.is_integer():  # (not truncated: 12.7 tokens is no count)
                raise ValueError(f"expected an integer, got {v!r}")
            return int(x)
        return int(v)
    if not isinstance(v, int):
        raise TypeError(f"expected an integer, got {v!r}")
    return v


def opt_str(v: object) -> str | None:
    return None if v is None else str(v)


def check_row(path: str, n: int, r: TraceRow, from_first_row: bool = False) -> None:
    """``UsageError`` naming line ``n`` for a row no replay can send: a time that is not
    finite, or negative (unless times count ``from_first_row``, where an earlier row is
    before 0), or fewer than 1 token in or out."""
    if not math.isfinite(r.arrival_s) or (r.arrival_s < 0 and not from_first_row):
        raise UsageError(f"{path}:{n}: the arrival time must be finite and >= 0")
    if r.input_tokens < 1 or r.output_tokens < 1:
        raise UsageError(f"{path}:{n}: token counts must be at least 1")


def why(e: BaseException) -> str:
    if isinstance(e, KeyError):
        return f"missing {e}"
    return str(e)
