"""Trace replay: arrival times and lengths from a file, turned into timed requests.

Formats (auto-detected from the JSON keys or CSV header, or named):

- ``inferlab`` JSONL: ``arrival_s``, ``input_tokens``, ``output_tokens``, optional
  ``session`` (turns of one session share a growing context: each prompt starts with
  the session's previous prompt) and ``prefix_group`` (requests of a group share their
  first ``prefix_tokens`` tokens; default half the prompt);
- ``requests``: the ``requests.jsonl`` a ``bench`` (or ``sim run``) wrote: each successful
  request at its intended send time with its token counts and what it measured (warm-up
  requests are replayed but not compared), so a run against a real server can be replayed in the simulator and
  compared (a closed loop's sends become fixed arrivals);
- ``azure`` CSV (Azure LLM inference traces): ``TIMESTAMP`` (date-time or seconds),
  ``ContextTokens``, ``GeneratedTokens``;
- ``burstgpt`` CSV: ``Timestamp`` (s), ``Request tokens``, ``Response tokens``; rows
  with 0 response tokens (failed requests in BurstGPT) are skipped;
- ``mooncake`` JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``,
  ``hash_ids``; each hash id is one block of ``block_tokens`` tokens (512, Mooncake's),
  and equal ids give identical blocks, so shared prefixes reach the server as such;
- ``vllm``: the JSON that ``vllm bench serve --save-result --save-detailed`` writes:
  ``input_lens``, ``output_lens``, per-request ``ttfts`` and ``itls`` (seconds), and
  ``request_rate``/``burstiness`` (the file has no send times: arrivals are redrawn
  from that rate with the run's seed, or taken from ``start_times``/``start_timestamps``
  when present), and
  its ``max_concurrency`` caps requests in flight unless ``--max-concurrency`` is given.

Our JSONL may also carry what each request measured (``ttft_ms``, ``tpot_ms``,
``e2e_ms``), as the vLLM result does; ``sim run`` then compares its predictions with
them (``compare_with_trace``).

Times are rebased so the first kept request is at 0, sliced to ``[start_s, end_s)`` of
the original trace time, then divided by ``speedup``. A bad row raises ``UsageError``
naming the file, line and problem.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import math
import os
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from inferlab._errors import UsageError
from inferlab.load.schedules import OpenLoop
from inferlab.results.metrics import request_metrics
from inferlab.results.records import RequestRecord
from inferlab.workload.prompts import PromptBuilder, Segment
from inferlab.workload.spec import Measured, RequestSpec, TimedSpec

TraceFormat = Literal["inferlab", "requests", "azure", "burstgpt", "mooncake", "vllm"]
FORMATS: tuple[str, ...] = ("inferlab", "requests", "azure", "burstgpt", "mooncake", "vllm")
MOONCAKE_BLOCK_TOKENS = 512


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


@dataclass(frozen=True)
class TraceConfig:
    """Which trace to replay and how: ``speedup`` > 1 compresses time; the window is in
    seconds of original trace time from its first request."""

    path: str
    format: TraceFormat | None = None
    speedup: float = 1.0
    start_s: float | None = None
    end_s: float | None = None
    block_tokens: int = MOONCAKE_BLOCK_TOKENS

    def __post_init__(self) -> None:
        if not self.speedup > 0:
            raise UsageError("--speedup must be positive")
        if self.start_s is not None and self.end_s is not None and self.end_s <= self.start_s:
            raise UsageError("--trace-end must be after --trace-start")
        if self.block_tokens < 1:
            raise UsageError("the hash block size must be at least 1 token")

    def rows(self, seed: int = 0) -> list[TraceRow]:
        """The kept rows, rebased, sliced and sped up, in arrival order (``seed`` draws
        arrivals for a vLLM result that has no send times)."""
        rows = sorted(read_rows(self.path, self.format, seed), key=lambda r: r.arrival_s)
        t0 = rows[0].arrival_s
        lo = self.start_s if self.start_s is not None else -math.inf
        hi = self.end_s if self.end_s is not None else math.inf
        kept = [r for r in rows if lo <= r.arrival_s - t0 < hi]
        if not kept:
            raise UsageError(f"{self.path}: no requests in the time window")
        k0 = kept[0].arrival_s
        return [_with_time(r, (r.arrival_s - k0) / self.speedup) for r in kept]

    def load(self, builder: PromptBuilder, seed: int = 0, exact_output: bool = True) -> list[TimedSpec]:
        return to_specs(self.rows(seed), builder, seed, exact_output, self.block_tokens)


def _with_time(r: TraceRow, t: float) -> TraceRow:
    return dataclasses.replace(r, arrival_s=t)


def to_specs(
    rows: list[TraceRow], builder: PromptBuilder, seed: int, exact_output: bool, block_tokens: int
) -> list[TimedSpec]:
    out = []
    for i, r in enumerate(rows):
        segs = _segments(r, i, builder, seed, block_tokens)
        prompt, _ = builder.join(segs)
        spec = RequestSpec(prompt, r.output_tokens, exact_output, r.input_tokens)
        out.append(TimedSpec(r.arrival_s, spec, r.measured))
    return out


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


# -- reading ------------------------------------------------------------------------


def read_rows(path: str, fmt: str | None = None, seed: int = 0) -> list[TraceRow]:
    if fmt is not None and fmt not in FORMATS:
        raise UsageError(f"unknown trace format {fmt!r} (expected one of {', '.join(FORMATS)})")
    try:
        f = open(path, newline="")  # noqa: SIM115
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror or e}") from e
    with f:
        first = f.readline()
        f.seek(0)
        result = _vllm_result(path, f, fmt == "vllm") if fmt in (None, "vllm") and first.lstrip().startswith("{") else None
        if fmt == "vllm" and result is None:
            raise UsageError(f"{path}: not a vLLM benchmark result (a JSON object with input_lens/output_lens)")
        if result is not None:
            rows = _read_vllm_result(path, result, seed)
        else:
            f.seek(0)
            kind = fmt or _detect(path, first)
            if kind == "requests":
                rows = _read_requests(path, f)
            elif kind in ("inferlab", "mooncake"):
                rows = list(_read_jsonl(path, f, kind))
            else:
                rows = list(_read_csv(path, f, kind))
    if not rows:
        raise UsageError(f"{path}: the trace has no requests")
    return rows


def _detect(path: str, first: str) -> str:
    s = first.strip()
    if s.startswith("{"):
        try:
            keys = set(json.loads(s))
        except ValueError:
            raise UsageError(f"{path}:1: not valid JSON") from None
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


def _read_jsonl(path: str, f: Any, kind: str) -> Iterator[TraceRow]:
    for n, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise TypeError("not a JSON object")
            if kind == "inferlab":
                r = TraceRow(
                    float(row["arrival_s"]), _int(row["input_tokens"]), _int(row["output_tokens"]),
                    _opt_str(row.get("session")), _opt_str(row.get("prefix_group")),
                    None if row.get("prefix_tokens") is None else _int(row["prefix_tokens"]),
                    measured=_measured(row),
                )
            else:
                hashes = row.get("hash_ids", [])
                if not isinstance(hashes, list):
                    raise TypeError("hash_ids must be a list")
                r = TraceRow(
                    float(row["timestamp"]) / 1e3, _int(row["input_length"]), _int(row["output_length"]),
                    hash_ids=tuple(_int(h) for h in hashes),
                )
        except (ValueError, KeyError, TypeError) as e:
            want = "arrival_s, input_tokens, output_tokens" if kind == "inferlab" else "timestamp, input_length, output_length, hash_ids"
            raise UsageError(f"{path}:{n}: expected {want} ({_why(e)})") from e
        _check(path, n, r)
        yield r


def _read_requests(path: str, f: Any) -> list[TraceRow]:
    """Rows from an inferlab ``requests.jsonl``; failed requests are left out."""
    rows = []
    for n, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            rec = RequestRecord.from_json(json.loads(line))
        except (ValueError, TypeError) as e:
            raise UsageError(f"{path}:{n}: not an inferlab request record ({_why(e)})") from e
        sent = rec.intended_send_ns if rec.intended_send_ns is not None else rec.send_ns
        if not rec.ok or sent is None or not rec.input_tokens or not rec.output_tokens:
            continue
        m = request_metrics(rec)
        # warm-up requests loaded the server too: replayed, but not compared
        measured = None if rec.warmup else Measured(m.ttft_ms, m.tpot_ms, m.e2e_ms)
        r = TraceRow(sent / 1e9, rec.input_tokens, rec.output_tokens, measured=measured)
        _check(path, n, r)
        rows.append(r)
    rows.sort(key=lambda r: r.arrival_s)
    return rows


def _read_csv(path: str, f: Any, kind: str) -> Iterator[TraceRow]:
    reader = csv.DictReader(f)
    names = ("TIMESTAMP", "ContextTokens", "GeneratedTokens") if kind == "azure" else ("Timestamp", "Request tokens", "Response tokens")
    missing = [c for c in names if c not in (reader.fieldnames or [])]
    if missing:
        raise UsageError(f"{path}:1: missing column(s) {', '.join(missing)} for a {kind} trace")
    ref: int | None = None  # whole seconds of the first row: keeps offsets exact
    for row in reader:
        n = reader.line_num
        try:
            whole, frac = _timestamp(row[names[0]])
            ref = whole if ref is None else ref
            t = (whole - ref) + frac
            inp, out = _int(row[names[1]]), _int(row[names[2]])
        except (ValueError, TypeError) as e:
            raise UsageError(f"{path}:{n}: bad {kind} row ({_why(e)})") from e
        if kind == "burstgpt" and out == 0:
            continue
        r = TraceRow(t, inp, out)
        _check(path, n, r)
        yield r


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
    whole, _, frac = v.partition(".")
    if frac and not frac.isdigit():
        raise ValueError(f"bad timestamp {v!r}")
    try:
        base = datetime.fromisoformat(whole)
    except ValueError:
        raise ValueError(f"bad timestamp {v!r}") from None
    return int(base.timestamp()), float("0." + frac) if frac else 0.0


def _measured(row: dict[str, Any]) -> Measured | None:
    vals = [None if row.get(k) is None else float(row[k]) for k in ("ttft_ms", "tpot_ms", "e2e_ms")]
    return None if all(v is None for v in vals) else Measured(*vals)


def _vllm_result(path: str, f: Any, required: bool = False) -> dict[str, Any] | None:
    """The file as a vLLM benchmark result (a JSON object with per-request lists), or
    ``None``; a summary saved without ``--save-detailed`` is an error that says so."""
    try:
        obj = json.load(f)
    except ValueError as e:
        if required:
            raise UsageError(f"{path}: not valid JSON ({e})") from None
        return None
    if not isinstance(obj, dict):
        return None
    if "input_lens" in obj and "output_lens" in obj:
        return obj
    if {"completed", "duration"} <= set(obj) or "request_throughput" in obj:
        raise UsageError(
            f"{path}: a benchmark result without per-request data; save it with "
            "vllm bench serve --save-result --save-detailed (input_lens, output_lens, ttfts, itls)"
        )
    return None


def _vllm_result_field(path: str, key: str) -> object:
    """One top-level field of a vLLM benchmark result; ``None`` for other trace files
    (the trace reader reports unreadable files with their line)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return _vllm_result_scalars(path, stat.st_mtime_ns, stat.st_size).get(key)


@functools.lru_cache(maxsize=4)
def _vllm_result_scalars(path: str, _mtime_ns: int, _size: int) -> dict[str, object]:
    """The non-list top-level fields of a vLLM benchmark result, read once per file
    version (a detailed result can be megabytes); empty for other files."""
    try:
        with open(path, encoding="utf-8") as f:
            if not f.readline().lstrip().startswith("{"):
                return {}
            f.seek(0)
            obj = _vllm_result(path, f)
    except (OSError, UsageError):
        return {}
    return {k: v for k, v in (obj or {}).items() if not isinstance(v, (list, dict))}


def vllm_result_max_concurrency(path: str) -> int | None:
    """The ``max_concurrency`` a vLLM benchmark result was measured under (its
    ``--max-concurrency``), so a replay caps requests in flight the same way; ``None``
    for other trace files or an uncapped run."""
    value = _vllm_result_field(path, "max_concurrency")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def vllm_result_model(path: str) -> str | None:
    """The model a vLLM benchmark result measured (its ``model_id``), or ``None``."""
    value = _vllm_result_field(path, "model_id")
    return value.strip() or None if isinstance(value, str) else None


def _read_vllm_result(path: str, obj: dict[str, Any], seed: int = 0) -> list[TraceRow]:
    """Rows from vLLM's saved benchmark result (``--save-result --save-detailed``).

    Failed requests (empty output or no TTFT) are left out. Measured TPOT follows vLLM:
    (latency − TTFT) / (output tokens − 1), the latency being TTFT + Σ ITL."""
    try:
        ins, outs = list(obj["input_lens"]), list(obj["output_lens"])
        ttfts = list(obj.get("ttfts") or [None] * len(ins))
        itls = list(obj.get("itls") or [None] * len(ins))
        raw_rate = obj.get("request_rate")
        rate = math.inf if raw_rate in (None, "inf") else float(raw_rate)
        burst = float(obj.get("burstiness") or 1.0)
        # per-request send times when the client saved them (SGLang's bench_serving and
        # some vLLM forks: seconds, absolute or from the start; rebased below)
        starts = obj.get("start_times") or obj.get("start_timestamps")
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{path}: not a vLLM benchmark result with input_lens/output_lens ({_why(e)})") from e
    if not (len(ins) == len(outs) == len(ttfts) == len(itls)):
        raise UsageError(f"{path}: input_lens, output_lens, ttfts and itls differ in length")
    if starts is not None:
        arrivals = [float(t) for t in starts]
    else:
        arrivals = OpenLoop(rate, "gamma", burst).arrival_times_s(seed, len(ins), None)
    rows = []
    for i, (n_in, n_out, ttft, itl) in enumerate(zip(ins, outs, ttfts, itls, strict=True)):
        if not n_out or not n_in or (ttfts[i] is not None and not ttft):
            continue  # a failed request in the source run
        measured = None
        if ttft:
            gaps = sum(itl or [])
            e2e = (ttft + gaps) * 1e3
            tpot = gaps * 1e3 / (n_out - 1) if n_out > 1 and itl else None
            measured = Measured(ttft * 1e3, tpot, e2e)
        rows.append(TraceRow(arrivals[i], _int(n_in), _int(n_out), measured=measured))
    return rows


def compare_with_trace(records: list[RequestRecord], timed: list[TimedSpec]) -> dict[str, Any] | None:
    """Mean (and median) predicted against measured TTFT, TPOT and E2E over the requests the
    trace has measurements for (``records[i].index`` is the trace position).
    ``None`` when the trace measured nothing."""
    pairs: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in ("ttft_ms", "tpot_ms", "e2e_ms")}
    for r in records:
        if r.warmup or not r.ok or r.index >= len(timed):
            continue
        m = timed[r.index].measured
        if m is None:
            continue
        pm = request_metrics(r)
        for key, got, want in (("ttft_ms", pm.ttft_ms, m.ttft_ms), ("tpot_ms", pm.tpot_ms, m.tpot_ms), ("e2e_ms", pm.e2e_ms, m.e2e_ms)):
            if got is not None and want is not None:
                pairs[key][0].append(got)
                pairs[key][1].append(want)
    out: dict[str, Any] = {}
    for key, (pred, meas) in pairs.items():
        if pred:
            p, w = statistics.fmean(pred), statistics.fmean(meas)
            p50, w50 = statistics.median(pred), statistics.median(meas)
            out[key] = {"requests": len(pred), "predicted_mean": p, "measured_mean": w,
                        "error_pct": 100.0 * (p - w) / w if w else None,
                        "predicted_median": p50, "measured_median": w50,
                        "median_error_pct": 100.0 * (p50 - w50) / w50 if w50 else None}
    return out or None


def _int(v: object) -> int:
    if isinstance(v, bool):
        raise TypeError("expected an integer, got a boolean")
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        return int(float(v)) if v.strip().replace(".", "", 1).isdigit() else int(v)
    if not isinstance(v, int):
        raise TypeError(f"expected an integer, got {v!r}")
    return v


def _opt_str(v: object) -> str | None:
    return None if v is None else str(v)


def _check(path: str, n: int, r: TraceRow) -> None:
    if r.arrival_s < 0 or not math.isfinite(r.arrival_s):
        raise UsageError(f"{path}:{n}: the arrival time must be finite and >= 0")
    if r.input_tokens < 1 or r.output_tokens < 1:
        raise UsageError(f"{path}:{n}: token counts must be at least 1")


def _why(e: BaseException) -> str:
    if isinstance(e, KeyError):
        return f"missing {e}"
    return str(e)
