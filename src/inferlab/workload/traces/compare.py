"""A replayed trace's own measurements against what the replay measured."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from inferlab.results.metrics import request_metrics
from inferlab.results.records import RequestRecord
from inferlab.results.summary import TraceComparison
from inferlab.workload.spec import TimedSpec


def compare_with_trace(
    records: list[RequestRecord], timed: Sequence[TimedSpec], positions: Sequence[int] | None = None,
) -> dict[str, TraceComparison] | None:
    """Mean (and median) predicted against measured TTFT, TPOT and E2E over the requests the
    trace has measurements for (``positions[r.index]`` is record ``r``'s trace position;
    without ``positions``, ``r.index``). ``None`` when the trace measured nothing."""
    pairs: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in ("ttft_ms", "tpot_ms", "e2e_ms")}
    for r in records:
        pos = r.index if positions is None else (positions[r.index] if r.index < len(positions) else len(timed))
        if r.warmup or not r.ok or pos >= len(timed):
            continue
        m = timed[pos].measured
        if m is None:
            continue
        pm = request_metrics(r)
        for key, got, want in (("ttft_ms", pm.ttft_ms, m.ttft_ms), ("tpot_ms", pm.tpot_ms, m.tpot_ms), ("e2e_ms", pm.e2e_ms, m.e2e_ms)):
            if got is not None and want is not None:
                pairs[key][0].append(got)
                pairs[key][1].append(want)
    out: dict[str, TraceComparison] = {}
    for key, (pred, meas) in pairs.items():
        if pred:
            p, w = statistics.fmean(pred), statistics.fmean(meas)
            p50, w50 = statistics.median(pred), statistics.median(meas)
            out[key] = TraceComparison(
                len(pred), p, w, 100.0 * (p - w) / w if w else None,
                p50, w50, 100.0 * (p50 - w50) / w50 if w50 else None,
            )
    return out or None
