"""Two CSV trace formats: Azure's LLM inference traces (``TIMESTAMP`` as a date-time
or seconds, ``ContextTokens``, ``GeneratedTokens``) and BurstGPT's (``Timestamp`` in s,
``Request tokens``, ``Response tokens``). Rows with 0 tokens either way (in BurstGPT, 0
response tokens are its failed requests) are not replayed, and a warning counts them;
they are yielded as ``dropped``, for their times. Rows may come in any order; times are
relative to the first row."""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from inferlab._errors import UsageError
from inferlab.workload.traces.rows import TraceRow, as_int, check_row, say_skipped, why


def read_csv(path: str, f: Any, kind: str) -> Iterator[TraceRow]:
    reader = csv.DictReader(f)
    if reader.fieldnames:  # ("TIMESTAMP, ContextTokens, ..." as some writers space it)
        reader.fieldnames = [name.strip() for name in reader.fieldnames]
    names = ("TIMESTAMP", "ContextTokens", "GeneratedTokens") if kind == "azure" else ("Timestamp", "Request tokens", "Response tokens")
    missing = [c for c in names if c not in (reader.fieldnames or [])]
    if missing:
        raise UsageError(f"{path}:1: missing column(s) {', '.join(missing)} for {'an Azure' if kind == 'azure' else 'a BurstGPT'} trace")
    ref: int | None = None  # whole seconds of the first row: keeps offsets exact
    failed = empty = 0
    try:
        for row in reader:
            n = reader.line_num
            try:
                whole, frac = _timestamp(row[names[0]])
                ref = whole if ref is None else ref
                t = (whole - ref) + frac
                inp, out = as_int(row[names[1]]), as_int(row[names[2]])
            except (ValueError, TypeError) as e:
                raise UsageError(f"{path}:{n}: bad {kind} row ({why(e)})") from e
            if inp == 0 or out == 0:
                if kind == "burstgpt" and out == 0:
                    failed += 1  # (a failed request in BurstGPT's log)
                else:
                    empty += 1
                check_row(path, n, TraceRow(t, 1, 1), from_first_row=True)  # (its time)
                yield TraceRow(t, inp, out, dropped=True)
                continue
            r = TraceRow(t, inp, out)
            # times are from the first row: an earlier row (a file out of time order) is
            # before it, and the replay puts rows in time order from the earliest
            check_row(path, n, r, from_first_row=True)
            yield r
    except GeneratorExit:  # (closed early: a window of a trace in time order ends there)
        say_skipped(path, empty, failed)
        raise
    say_skipped(path, empty, failed)


def _timestamp(v: str | None) -> tuple[int, float]:
    """Whole seconds and the fraction: seconds as a number, or an ISO date-time (Azure
    writes 7 fractional digits, more than ``datetime`` keeps)."""
    if v is None:
        raise ValueError("missing timestamp")
    v = v.strip()
    try:
        x = float(v)
    except ValueError:
        pass
    else:
        if not math.isfinite(x):
            raise ValueError(f"timestamp {v!r} is not finite")
        return math.floor(x), x - math.floor(x)
    # the fraction apart (Azure's 2024 trace: "2024-05-10 00:00:00.009930+00:00"), the
    # rest with its zone, if any, as ISO 8601
    m = re.search(r"\.(\d+)", v)
    frac = m[1] if m else ""
    whole = v if m is None else v[:m.start()] + v[m.end():]
    try:
        base = datetime.fromisoformat(whole)
    except ValueError:
        raise ValueError(f"bad timestamp {v!r}") from None
    if base.tzinfo is None:  # a clock with no zone: as UTC, not this machine's (whose DST would move rows)
        base = base.replace(tzinfo=UTC)
    return int(base.timestamp()), float("0." + frac) if frac else 0.0
