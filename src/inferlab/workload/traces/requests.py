"""The ``requests.jsonl`` of an earlier ``bench`` or ``sim run`` as a trace: each
successful request at its intended send time, with its token counts and what it
measured (warm-up requests are replayed but not compared)."""

from __future__ import annotations

import json
from typing import Any

from inferlab._errors import UsageError
from inferlab.results.metrics import request_metrics
from inferlab.results.records import RequestRecord
from inferlab.workload.spec import Measured
from inferlab.workload.traces.rows import TraceRow, check_row, why


def read_requests(path: str, f: Any) -> list[TraceRow]:
    """Rows from an inferlab ``requests.jsonl``; failed requests are left out."""
    rows = []
    for n, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            rec = RequestRecord.from_json(json.loads(line))
        except (ValueError, TypeError) as e:
            raise UsageError(f"{path}:{n}: not an inferlab request record ({why(e)})") from e
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
