"""The ``requests.jsonl`` of an earlier ``bench`` or ``sim run`` as a trace: each
successful request at its intended send time, with its token counts and what it
measured (its warm-up requests are replayed as warm-ups: sent, then left out of the
metrics and the comparison), and what made the run: its prefix group (requests of a group share their first ``prefix_tokens`` tokens; a group
without them, the whole prompt), its multi-turn session (each turn's prompt starts with
the session's previous one, as its context grew) and the closed-loop user that sent it
(a replay sends a user's requests one after another, each when the previous one ends)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from inferlab.results.metrics import request_metrics
from inferlab.results.runfiles import numbered_records
from inferlab.workload.spec import Measured
from inferlab.workload.traces.rows import TraceRow, check_row


def read_requests(path: str, with_dropped: bool = False) -> list[TraceRow]:
    """Rows from an inferlab ``requests.jsonl`` (``results.runfiles.numbered_records``:
    a cut-short last line is skipped, any other bad line is an error); failed requests
    are left out (``with_dropped``: kept as ``dropped`` rows, for their send times)."""
    rows = []
    skipped = 0
    for n, rec in numbered_records(path):
        sent = rec.intended_send_ns if rec.intended_send_ns is not None else rec.send_ns
        if not rec.ok or sent is None or not rec.input_tokens or not rec.output_tokens:
            skipped += 1
            if sent is not None:  # (its time: a window counts from the run's first send)
                rows.append(TraceRow(sent / 1e9, rec.input_tokens or 0, rec.output_tokens or 0, dropped=True))
            continue
        m = request_metrics(rec)
        # warm-up requests loaded the server too: replayed, but not compared
        measured = None if rec.warmup else Measured(m.ttft_ms, m.tpot_ms, m.e2e_ms)
        prefix = rec.prefix_tokens if rec.prefix_tokens is not None else rec.input_tokens
        r = TraceRow(
            sent / 1e9, rec.input_tokens, rec.output_tokens, measured=measured, user=rec.user,
            prefix_group=rec.prefix_group, prefix_tokens=prefix if rec.prefix_group is not None else None,
            session=None if rec.session is None else str(rec.session), turn=rec.turn, warmup=rec.warmup,
            hash_ids=tuple(rec.hash_ids or ()),
        )
        check_row(path, n, r)
        rows.append(r)
    rows.sort(key=lambda r: (r.arrival_s, not r.warmup))  # (warm-ups first among sends at one instant)
    if not with_dropped:
        rows = [r for r in rows if not r.dropped]
    if skipped:
        warnings.warn(f"{path}: {skipped:,} of {len(rows) + skipped - sum(r.dropped for r in rows):,} requests skipped: failed or cancelled in the "
                      "recorded run, or without their token counts", stacklevel=2)
    return rows


def recorded_max_concurrency(path: str) -> int | None:
    """The cap on requests in flight (``--max-concurrency`` beside ``--rate``) that the
    run whose ``requests.jsonl`` this is was measured under, from the ``config.json``
    beside it: its intended send times are the schedule's, not when the cap let each
    request go, so a replay caps the same way. ``None`` for other traces, an uncapped
    run or a closed loop (whose users a replay keeps from ``user``)."""
    try:
        with open(path, encoding="utf-8") as f:
            first = json.loads(f.readline())
        if not (isinstance(first, dict) and {"send_ns", "content_ns"} <= set(first)):
            return None
        config = json.loads((Path(path).parent / "config.json").read_text())
        schedule = config["load"]["schedule"]
        cap = schedule.get("max_concurrency") if schedule.get("kind") == "OpenLoop" else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None
