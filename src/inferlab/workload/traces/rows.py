"""A trace's rows as every reader produces them, and the checks they share."""

from __future__ import annotations

import math
import warnings
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
    turn: int | None = None  # its session's turn (a run's requests.jsonl; None: by order)
    # a row not replayed (a failed request in the source, a row with 0 tokens): kept
    # only for its time, from which a window's seconds count (``TraceConfig.rows``)
    dropped: bool = False


def measured_of(row: dict[str, Any]) -> Measured | None:
    """What a row says its request measured (``ttft_ms``, ``tpot_ms``, ``e2e_ms``);
    ``check_row`` refuses values that are no time."""
    vals = [None if row.get(k) is None else _number(k, row[k]) for k in ("ttft_ms", "tpot_ms", "e2e_ms")]
    return None if all(v is None for v in vals) else Measured(*vals)


def _number(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"{key} must be a number of ms, not {value!r}")
    return float(value)


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


#: the most tokens a row may ask for in or out (beyond any model's context), and the
#: latest arrival in seconds (about 31,700 years: beyond it times overflow the clocks)
MAX_ROW_TOKENS = 10_000_000
MAX_ARRIVAL_S = 1e12


def check_row(path: str, n: int, r: TraceRow, from_first_row: bool = False) -> None:
    """``UsageError`` naming line ``n`` for a row no replay can send: a time that is not
    finite, or negative (unless times count ``from_first_row``, where an earlier row is
    before 0), or beyond ``MAX_ARRIVAL_S``; token counts that are not whole numbers from
    1 to ``MAX_ROW_TOKENS``; measured times that are not finite or below 0; a shared
    prefix longer than its prompt, or negative."""
    if not math.isfinite(r.arrival_s) or (r.arrival_s < 0 and not from_first_row) or abs(r.arrival_s) > MAX_ARRIVAL_S:
        raise UsageError(f"{path}:{n}: the arrival time must be finite, >= 0 and at most {MAX_ARRIVAL_S:g} s")
    for count in (r.input_tokens, r.output_tokens):
        if isinstance(count, bool) or not isinstance(count, int):
            raise UsageError(f"{path}:{n}: token counts must be whole numbers, not {count!r}")
    if r.input_tokens < 1 or r.output_tokens < 1:
        raise UsageError(f"{path}:{n}: token counts must be at least 1")
    if max(r.input_tokens, r.output_tokens) > MAX_ROW_TOKENS:
        raise UsageError(f"{path}:{n}: token counts must be at most {MAX_ROW_TOKENS:,} (no model takes more)")
    if r.measured is not None:  # (compared with a prediction as times: "+nan %", "-1497 %")
        for key, ms in (("ttft_ms", r.measured.ttft_ms), ("tpot_ms", r.measured.tpot_ms), ("e2e_ms", r.measured.e2e_ms)):
            if ms is not None and not (math.isfinite(ms) and ms >= 0):
                raise UsageError(f"{path}:{n}: {key} {ms!r} is not a time: a finite number of ms, 0 or more")
    if r.prefix_tokens is not None and not 0 <= r.prefix_tokens <= r.input_tokens:
        raise UsageError(f"{path}:{n}: prefix_tokens ({r.prefix_tokens}) must be from 0 to the row's "
                         f"input_tokens ({r.input_tokens})")


def say_skipped(path: str, empty: int, failed: int = 0) -> None:
    """The warnings that count a reader's rows not replayed: ``failed``, BurstGPT's
    failed requests (0 response tokens); ``empty``, rows of 0 prompt or answer tokens.
    A reader says them when it ends, or when it is closed early (the rows read)."""
    if failed:
        warnings.warn(f"{path}: {failed:,} row{'s' * (failed != 1)} skipped: 0 response tokens (failed requests in BurstGPT's log)", stacklevel=3)
    if empty:
        warnings.warn(f"{path}: {empty:,} row{'s' * (empty != 1)} skipped: 0 prompt or answer tokens (no request to send)", stacklevel=3)


def why(e: BaseException) -> str:
    if isinstance(e, KeyError):
        return f"missing {e}"
    return str(e)
