"""Two JSONL trace formats: inferlab's own (``arrival_s``, ``input_tokens``,
``output_tokens``, optional ``session``, ``prefix_group``/``prefix_tokens`` and what each
request measured: ``ttft_ms``, ``tpot_ms``, ``e2e_ms``) and Mooncake's (``timestamp`` in
ms, ``input_length``, ``output_length``, ``hash_ids``: each id one block of shared tokens)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

from inferlab._errors import UsageError
from inferlab.workload.traces.rows import (
    TraceRow,
    as_int,
    check_row,
    measured_of,
    opt_str,
    say_skipped,
    why,
)


def read_jsonl(path: str, f: Any, kind: str) -> Iterator[TraceRow]:
    """The rows; a Mooncake row with 0 tokens either way is not replayed (``dropped``,
    for its time; a warning counts them), one of ours is an error."""
    empty = 0
    try:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise TypeError("not a JSON object")
                if kind == "inferlab":
                    r = TraceRow(
                        float(row["arrival_s"]), as_int(row["input_tokens"]), as_int(row["output_tokens"]),
                        opt_str(row.get("session")), opt_str(row.get("prefix_group")),
                        None if row.get("prefix_tokens") is None else as_int(row["prefix_tokens"]),
                        measured=measured_of(row),
                    )
                else:
                    hashes = row.get("hash_ids", [])
                    if not isinstance(hashes, list):
                        raise TypeError("hash_ids must be a list")
                    r = TraceRow(
                        float(row["timestamp"]) / 1e3, as_int(row["input_length"]), as_int(row["output_length"]),
                        hash_ids=tuple(as_int(h) for h in hashes),
                    )
            except (ValueError, KeyError, TypeError) as e:
                want = "arrival_s, input_tokens, output_tokens" if kind == "inferlab" else "timestamp, input_length, output_length, hash_ids"
                raise UsageError(f"{path}:{n}: expected {want} ({why(e)})") from e
            if kind == "mooncake" and (r.input_tokens == 0 or r.output_tokens == 0):
                empty += 1
                check_row(path, n, TraceRow(r.arrival_s, 1, 1))  # (its time)
                yield dataclasses.replace(r, dropped=True)
                continue
            check_row(path, n, r)
            yield r
    except GeneratorExit:  # (closed early: a window of a trace in time order ends there)
        say_skipped(path, empty)
        raise
    say_skipped(path, empty)
