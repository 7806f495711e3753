"""Trace replay: arrival times and lengths from a file, turned into timed requests.

Formats (auto-detected from the JSON keys or CSV header, or named):

- ``inferlab`` JSONL: ``arrival_s``, ``input_tokens``, ``output_tokens``, optional
  ``session`` (turns of one session share a growing context: each prompt starts with
  the session's previous prompt) and ``prefix_group`` (requests of a group share their
  first ``prefix_tokens`` tokens; default half the prompt);
- ``requests``: the ``requests.jsonl`` a ``bench`` (or ``sim run``) wrote: each successful
  request at its intended send time with its token counts and what it measured (warm-up
  requests are replayed but not compared), so a run against a real server can be replayed in the simulator and
  compared; its prefix groups share their prefixes again, a multi-turn session's turns
  their growing context (as ``session`` does here), and a closed loop's users send
  again one request after another (``user``), each when the previous one ends;
- ``azure`` CSV (Azure LLM inference traces): ``TIMESTAMP`` (date-time, with a zone or
  as UTC, or seconds), ``ContextTokens``, ``GeneratedTokens``;
- ``burstgpt`` CSV: ``Timestamp`` (s), ``Request tokens``, ``Response tokens``; rows
  with 0 response tokens (failed requests in BurstGPT) are skipped, as are rows of 0
  tokens in Azure's and Mooncake's, each kind counted in a warning;
- ``mooncake`` JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``,
  ``hash_ids``; each hash id is one block of ``block_tokens`` tokens (512, Mooncake's),
  and equal ids give identical blocks, so shared prefixes reach the server as such;
- ``vllm``: the JSON that ``vllm bench serve --save-result --save-detailed`` writes:
  ``input_lens``, ``output_lens``, per-request ``ttfts`` and ``itls`` (seconds), and
  ``request_rate``/``burstiness`` (the file has no send times: arrivals are redrawn
  from that rate, or its ``ramp_up_strategy``, with the run's seed, or taken from
  ``start_times``/``start_timestamps`` when present), and
  its ``max_concurrency`` caps requests in flight unless ``--max-concurrency`` is given.

Our JSONL may also carry what each request measured (``ttft_ms``, ``tpot_ms``,
``e2e_ms``), as the vLLM result does; ``sim run`` then compares its predictions with
them (``traces.compare``).

The window ``[start_s, end_s)`` (``--trace-start``/``--trace-end``) counts seconds after
the trace's first request (its first row, whether or not it is replayed: a failed one's
too), at the trace's own pace (not its own clock: in a trace whose
``arrival_s`` runs from 10 to 14, ``start_s`` 1 keeps the requests from 11 on). The kept
requests are rebased so the first kept one is at 0, then their times divided by
``speedup``. A bad row raises ``UsageError`` naming the file, line and problem.

A window costs memory for its own rows only: the file is streamed (``traces.window``),
to its end, as rows may come in any order (every row is checked), or up to its first
row past the window with ``in_order`` (``--trace-in-order``: rows after it are neither
read nor checked). A vLLM result and a ``requests.jsonl`` are read whole.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Generator
from contextlib import closing
from dataclasses import dataclass
from typing import IO, Literal

from inferlab._errors import UsageError
from inferlab.results.runfiles import not_text_error
from inferlab.workload.prompts import PromptBuilder, Segment
from inferlab.workload.spec import RequestSpec, TimedSpec, Trace
from inferlab.workload.traces.compare import compare_with_trace
from inferlab.workload.traces.csv_traces import read_csv
from inferlab.workload.traces.jsonl import read_jsonl
from inferlab.workload.traces.requests import read_requests, recorded_max_concurrency
from inferlab.workload.traces.rows import TraceRow
from inferlab.workload.traces.vllm import (
    read_vllm_result,
    vllm_result,
    vllm_result_max_concurrency,
    vllm_result_model,
)
from inferlab.workload.traces.window import window

__all__ = [
    "FORMATS",
    "MOONCAKE_BLOCK_TOKENS",
    "TraceConfig",
    "TraceFormat",
    "TraceRow",
    "compare_with_trace",
    "read_rows",
    "recorded_max_concurrency",
    "to_specs",
    "vllm_result_max_concurrency",
    "vllm_result_model",
]

TraceFormat = Literal["inferlab", "requests", "azure", "burstgpt", "mooncake", "vllm"]

FORMATS: tuple[str, ...] = ("inferlab", "requests", "azure", "burstgpt", "mooncake", "vllm")
MOONCAKE_BLOCK_TOKENS = 512
#: each format with its article, as messages name it
_TRACE_NAMES = {"inferlab": "an inferlab", "requests": "a requests.jsonl", "azure": "an Azure", "burstgpt": "a BurstGPT",
                "mooncake": "a Mooncake", "vllm": "a vLLM"}


@dataclass(frozen=True)
class TraceConfig:
    """Which trace to replay and how: ``speedup`` > 1 compresses time; the window
    ``[start_s, end_s)`` is in seconds after the trace's first request, at the trace's
    own pace (before ``speedup``). ``in_order``: the file is in time order, so reading
    stops at the first row past ``end_s`` (``traces.window``)."""

    path: str
    format: TraceFormat | None = None
    speedup: float = 1.0
    start_s: float | None = None
    end_s: float | None = None
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    in_order: bool = False

    def __post_init__(self) -> None:
        if not self.speedup > 0:
            raise UsageError("--speedup must be positive")
        for name, value in (("--trace-start", self.start_s), ("--trace-end", self.end_s)):
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise UsageError(f"{name} must be a finite number of seconds, 0 or more (got {value:g})")
        if self.start_s is not None and self.end_s is not None and self.end_s <= self.start_s:
            raise UsageError("--trace-end must be after --trace-start")
        if self.end_s == 0:
            raise UsageError("--trace-end 0 keeps no request (the window ends before the trace's first request): give more than 0 s")
        if self.block_tokens < 1:
            raise UsageError("the hash block size must be at least 1 token")

    def rows(self, seed: int = 0) -> list[TraceRow]:
        """The kept rows, rebased, sliced and sped up, in arrival order (``seed`` draws
        arrivals for a vLLM result that has no send times). The file is read as a
        stream, holding the rows in the window only (``traces.window``)."""
        lo = self.start_s if self.start_s is not None else -math.inf
        hi = self.end_s if self.end_s is not None else math.inf
        # t0: the trace's first request, replayed or not (a failed one too)
        found = window(lambda: _every_row(self.path, self.format, seed, self.in_order), lo, hi, self.in_order)
        t0, kept = found.first_s, found.rows
        if not kept:
            # (a start is given: with none the first request is at 0 s, and --trace-end is above 0)
            window_s = f"from {_seconds(lo)} s" if self.end_s is None else f"{_seconds(lo)}–{_seconds(hi)} s"
            if found.stopped_s is not None:  # (the rest was not read: its span is not known)
                spans = f"the trace was read up to its first row past it, at {_seconds(found.stopped_s - t0)} s from its first request (--trace-in-order)"
            else:
                assert found.last_s is not None  # (_every_row refuses a trace with no request to replay)
                spans = f"the trace spans 0–{_seconds(found.last_s - t0)} s from its first request"
            raise UsageError(f"{self.path}: no requests in the time window ({window_s} after the trace's first request): {spans}")
        k0 = kept[0].arrival_s
        return [_with_time(r, (r.arrival_s - k0) / self.speedup) for r in kept]

    def load(
        self, builder: PromptBuilder, seed: int = 0, exact_output: bool = True, template_tokens: int = 0
    ) -> Trace:
        """The trace's requests, their prompts made by ``builder``. A trace's input
        lengths are what the server counted, the chat template (or BOS) included: each
        prompt is built ``template_tokens`` shorter (at least 1), the tokens the target
        adds, so the target sees the recorded length."""
        rows = self.rows(seed)
        specs = tuple(to_specs(rows, builder, seed, exact_output, self.block_tokens, template_tokens))
        return Trace(specs, self.speedup, tuple(_short_rows(rows, template_tokens)))


def _seconds(t: float) -> str:
    """Seconds as the window error writes them: 3.8, 600, 86,399.5."""
    return f"{t:,.3f}".rstrip("0").rstrip(".")


def _with_time(r: TraceRow, t: float) -> TraceRow:
    return dataclasses.replace(r, arrival_s=t)


def to_specs(
    rows: list[TraceRow], builder: PromptBuilder, seed: int, exact_output: bool, block_tokens: int,
    template_tokens: int = 0,
) -> list[TimedSpec]:
    """Each row as a request at its time; prompts ``template_tokens`` shorter than the
    row says (see ``TraceConfig.load``)."""
    out = []
    ids = _session_ids(rows)
    turns: dict[str, int] = {}
    for i, r in enumerate(rows):
        n = max(1, r.input_tokens - template_tokens)
        segs = _segments(dataclasses.replace(r, input_tokens=n), i, builder, seed, block_tokens)
        prompt, _ = builder.join(segs)
        session = turn = None
        if r.session is not None:  # (recorded again: a replay of this replay shares what it shared)
            session, turn = ids[r.session], r.turn if r.turn is not None else turns.get(r.session, 0)
            turns[r.session] = turn + 1
        spec = RequestSpec(
            prompt, r.output_tokens, exact_output, n, prefix_group=r.prefix_group, prefix_tokens=r.prefix_tokens,
            hash_ids=r.hash_ids, session=session, turn=turn,
        )
        out.append(TimedSpec(r.arrival_s, spec, r.measured, r.user, r.warmup))
    return out


def _session_ids(rows: list[TraceRow]) -> dict[str, int]:
    """Each session's number in the replay's records: its own where every session of the
    trace is named by a whole number (a run's requests.jsonl), else in order of first
    appearance."""
    names = list(dict.fromkeys(r.session for r in rows if r.session is not None))
    if all(n.isdigit() for n in names):
        return {n: int(n) for n in names}
    return {n: k for k, n in enumerate(names)}


def _short_rows(rows: list[TraceRow], template_tokens: int) -> list[str]:
    """The warning for rows that ask for fewer prompt tokens than the target's template
    adds: each is sent with 1 token of text, longer than the trace's."""
    short = [r.input_tokens for r in rows if r.input_tokens - template_tokens < 1]
    if not short:
        return []
    beyond = sum(1 + template_tokens - n for n in short)
    return [f"{len(short):,} trace row{'s' * (len(short) != 1)} asked for fewer prompt tokens than the chat template "
            f"(or BOS) adds ({template_tokens:,}): sent with 1 token of text, {1 + template_tokens:,} tokens in all each, "
            f"{beyond:,} more than the trace's in all"]


def _segments(r: TraceRow, i: int, b: PromptBuilder, seed: int, block: int) -> list[Segment]:
    own = f"trace:{seed}:{i}"
    n = r.input_tokens
    if r.hash_ids:
        segs = []
        left = n
        for h in r.hash_ids:
            if left <= 0:
                break
            take = min(block, left)
            # a partial last block is the start of that block's text: still shared
            segs.append(b.segment(f"block:{h}:{block}", take))
            left -= take
        if left > 0:
            segs.append(b.segment(own, left))
        return segs
    if r.session is not None:
        return [b.segment(f"session:{r.session}", n)]
    if r.prefix_group is not None:
        p = min(n, r.prefix_tokens if r.prefix_tokens is not None else n // 2)
        segs = [b.segment(f"group:{r.prefix_group}", p)] if p else []
        return segs + ([b.segment(own, n - p)] if n > p else [])
    return [b.segment(own, n)]


def read_rows(path: str, fmt: str | None = None, seed: int = 0) -> list[TraceRow]:
    """The rows to replay, in the file's order; ``UsageError`` for a file with none."""
    return [r for r in _every_row(path, fmt, seed) if not r.dropped]


def _every_row(path: str, fmt: str | None, seed: int, in_order: bool = False) -> Generator[TraceRow, None, None]:
    """Every row, those not replayed too (``TraceRow.dropped``), as the file is read
    (a vLLM result or a ``requests.jsonl`` is read whole first); ``UsageError`` at the
    end where none is replayed."""
    if fmt is not None and fmt not in FORMATS:
        raise UsageError(f"unknown trace format {fmt!r} (expected one of {', '.join(FORMATS)})")
    try:  # (utf-8-sig: the byte-order mark a spreadsheet may write is no part of the header)
        f = open(path, newline="", encoding="utf-8-sig")  # noqa: SIM115
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror or e}") from e
    rows = replayed = 0
    with f, closing(_read_rows(path, f, fmt, seed, in_order)) as read:  # (closed early: so is the reader)
        try:
            for r in read:
                rows += 1
                replayed += not r.dropped
                yield r
        except UnicodeDecodeError as e:  # (a binary or compressed file)
            raise not_text_error(path, e, "a trace: JSONL, CSV or a vLLM result JSON") from e
    if not replayed:
        raise UsageError(f"{path}: the trace has no requests" + (" to replay (see the warning above)" if rows else ""))


def _read_rows(path: str, f: IO[str], fmt: str | None, seed: int, in_order: bool = False) -> Generator[TraceRow, None, None]:
    """The rows of the file ``f``, as its format reads them; ``in_order`` (``--trace-in-order``)
    is refused for the formats read whole (a vLLM result, a ``requests.jsonl``), where it
    saves nothing and could only drop a row sent out of order."""
    first = f.readline()
    while first and not first.strip():  # (blank lines before the first row)
        first = f.readline()
    if not first:
        raise UsageError(f"{path}: the file is empty: no requests to replay")
    f.seek(0)
    # (a JSON object of its own on the first line, with none of a result's keys, is a
    # JSONL trace's row: the file is not read whole to find out it is no vLLM result)
    json_object = first.lstrip().startswith("{")
    maybe_vllm = json_object and not _a_trace_row(first)
    result = None
    if (fmt == "vllm" and json_object) or (fmt is None and maybe_vllm):
        result = vllm_result(path, f, fmt == "vllm")
    if fmt == "vllm" and result is None:
        raise UsageError(f"{path}: not a vLLM benchmark result (a JSON object with input_lens/output_lens)")
    if result is not None:
        _whole(path, "a vLLM result", in_order)
        yield from read_vllm_result(path, result, seed)
        return
    if fmt is not None and maybe_vllm:  # another format asked of what may be a vLLM result
        f.seek(0)
        try:
            other = vllm_result(path, f)
        except UsageError:
            other = {}  # (a vLLM summary without per-request data: a vLLM file all the same)
        if other is not None:
            raise UsageError(f"{path}: a vLLM benchmark result, not {_TRACE_NAMES[fmt]} trace: give --trace-format vllm, or none")
    f.seek(0)
    kind = fmt or _detect(path, first)
    if kind == "requests":
        _whole(path, "a requests.jsonl", in_order)
        yield from read_requests(path, with_dropped=True)
    elif kind in ("inferlab", "mooncake"):
        yield from read_jsonl(path, f, kind)  # (closing this closes the reader: it says what it skipped)
    else:
        yield from read_csv(path, f, kind)


#: the keys by which a line may be (the start of) a vLLM benchmark result (``vllm_result``)
_VLLM_KEYS = frozenset({"input_lens", "output_lens", "request_throughput", "completed", "duration"})


def _a_trace_row(first: str) -> bool:
    """Whether the first line is a JSON object of its own that no vLLM result is."""
    try:
        obj = json.loads(first)
    except ValueError:
        return False
    return isinstance(obj, dict) and not _VLLM_KEYS & obj.keys()


def _whole(path: str, what: str, in_order: bool) -> None:
    """``UsageError`` for ``--trace-in-order`` on a format read whole (``_read_rows``)."""
    if in_order:
        raise UsageError(f"{path}: --trace-in-order reads a CSV or JSONL trace up to its window's end; {what} is read "
                         "whole anyway, and its rows need not be in send order: drop --trace-in-order")


def _not_json_lines(path: str) -> str:
    """Why a file whose first line is not a JSON object is no JSONL trace: a JSON
    document written over several lines (a run's summary.json, a config) is valid JSON
    but not a trace; anything else is not valid JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            json.load(f)
    except (OSError, ValueError):
        return f"{path}:1: not valid JSON"
    return (f"{path}: not a trace: a JSON document over several lines, not one request per line (expected a JSONL "
            "trace with arrival_s or Mooncake keys, a run's requests.jsonl, a vLLM benchmark result, or an Azure or "
            "BurstGPT CSV; see --trace-format)")


def _detect(path: str, first: str) -> str:
    s = first.strip()
    if s.startswith("{"):
        try:
            keys = set(json.loads(s))
        except ValueError:
            raise UsageError(_not_json_lines(path)) from None
        if "arrival_s" in keys:
            return "inferlab"
        if {"send_ns", "content_ns"} <= keys:
            return "requests"
        if "timestamp" in keys and "input_length" in keys:
            return "mooncake"
        raise UsageError(f"{path}:1: unknown JSONL trace (expected arrival_s or Mooncake keys; see --trace-format)")
    header = {h.strip() for h in next(csv.reader([s]), [])}
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= header:
        return "azure"
    if {"Timestamp", "Request tokens", "Response tokens"} <= header:
        return "burstgpt"
    raise UsageError(f"{path}:1: unknown trace header (expected Azure or BurstGPT columns; see --trace-format)")
