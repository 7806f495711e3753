"""The ``requests.jsonl`` of an earlier ``bench`` or ``sim run`` as a trace: each
successful request at its intended send time, with its token counts and what it
measured (warm-up requests are replayed but not compared)."""

from __future__ import annotations

from inferlab.results.metrics import request_metrics
from inferlab.results.runfiles import numbered_records
from inferlab.workload.spec import Measured
from inferlab.workload.traces.rows import TraceRow, check_row


def read_requests(path: str) -> list[TraceRow]:
    """Rows from an inferlab ``requests.jsonl`` (``results.runfiles.numbered_records``:
    a cut-short last line is skipped, any other bad line is an error); failed requests
    are left out."""
    rows = []
    for n, rec in numbered_records(path):
        sent = rec.intended_send_ns if rec.intended_send_ns is not None else rec.send_ns
        if not rec.ok or sent is None or not rec.input_tokens or not rec.output_tokens:
            continue
        m = request_metrics(rec)
        # warm-up requests loaded the server too: replayed, but not compared
        measured = None if rec.warmup else Measured(m.ttft_ms, m.tpot_ms, m.e2e_ms)
        r = TraceRow(sent / 1e9, rec.input_tokens, rec.output_tokens, measured=measured)
        check_row(path, n, r)
        rows.append(r)
    rows.sort(key=lambda r: r.arrival_s)
    return rows
