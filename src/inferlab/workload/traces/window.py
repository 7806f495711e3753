"""A trace's time window in one pass over its rows, holding only the rows in it.

The window ``[lo_s, hi_s)`` counts seconds from the trace's first request: its earliest
row, replayed or not (``TraceRow.dropped``). Rows may come in any order, so that time is
known only at the end of the file. The pass keeps the rows in the window of the earliest
time seen so far; an earlier row moves the window earlier, and rows kept past its new
end are let go. A row passed over as before the window is the one thing such a move can
bring back: when one may be in the final window (a file out of time order), the rows are
read a second time with the first request's time known. A file in time order is read
once; to its end, unless the caller knows it is in time order throughout (``in_order``):
then reading stops at the first row past the window, if the rows up to it were in order."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Generator
from dataclasses import dataclass

from inferlab.workload.traces.rows import TraceRow


@dataclass(frozen=True)
class Window:
    """What one read of a trace found: ``rows``, the replayable rows in the window at
    their own times, in time order (ties in read order); ``first_s``, the trace's first
    request (any row); ``last_s``, its latest replayable row read (``None``: none);
    ``stopped_s``, where an ``in_order`` read stopped: the first row past the window
    (``None``: read to the end)."""

    rows: list[TraceRow]
    first_s: float
    last_s: float | None
    stopped_s: float | None = None


def window(read: Callable[[], Generator[TraceRow, None, None]], lo_s: float, hi_s: float, in_order: bool = False) -> Window:
    """The rows ``read()`` yields whose time, less the earliest row's, is in ``[lo_s,
    hi_s)`` (``-inf``/``inf`` for an open end), compared exactly as ``arrival_s -
    first_s``. Calls ``read`` once, or twice for a file out of time order whose earliest
    row came after rows it brings into the window (warnings of the second read are not
    said again). Memory: the rows in the window of each earliest time seen so far.
    ``in_order``: the rows are in time order after the window (not checked: they are not
    read); reading stops at the first row past it, if every row up to it came in time
    order (else it reads on, as without)."""
    first_s = math.inf
    last_s = -math.inf
    passed_s = -math.inf  # the latest row passed over as before the window
    kept: list[TraceRow] = []
    prune_at = 1024  # (let rows past a moved window go in batches: a reversed file moves it every row)
    ordered, latest_s, stopped_s = in_order, -math.inf, None
    rows = read()
    for r in rows:
        if ordered:
            ordered, latest_s = r.arrival_s >= latest_s, r.arrival_s
        if r.arrival_s < first_s:
            first_s = r.arrival_s
            if len(kept) >= prune_at:
                kept = [k for k in kept if k.arrival_s - first_s < hi_s]
                prune_at = max(1024, 2 * len(kept))
        if ordered and r.arrival_s - first_s >= hi_s:
            stopped_s = r.arrival_s
            rows.close()  # (the file; its reader says what it skipped of the rows read)
            break
        if r.dropped:
            continue
        if r.arrival_s > last_s:  # (comparisons, not max(): this runs for every row of the file)
            last_s = r.arrival_s
        offset_s = r.arrival_s - first_s
        if offset_s < lo_s:
            if r.arrival_s > passed_s:
                passed_s = r.arrival_s
        elif offset_s < hi_s:
            kept.append(r)
        # (past the end: the window only moves earlier, so it stays past it)
    if passed_s > -math.inf and passed_s - first_s >= lo_s:  # (passed over under a later first time: may be in it)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kept = [r for r in read() if not r.dropped and lo_s <= r.arrival_s - first_s < hi_s]
    else:  # (the offset only grew as the first time fell: only the end needs checking again)
        kept = [r for r in kept if r.arrival_s - first_s < hi_s]
    kept.sort(key=lambda r: r.arrival_s)
    return Window(kept, first_s, None if last_s == -math.inf else last_s, stopped_s)
