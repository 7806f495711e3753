"""vLLM's saved benchmark result (``vllm bench serve --save-result --save-detailed``)
as a trace: ``input_lens``, ``output_lens``, per-request ``ttfts`` and ``itls`` (s), and
``request_rate``/``burstiness`` (the file has no send times: arrivals are redrawn from
that rate with the run's seed, or from its ``ramp_up_strategy`` between
``ramp_up_start_rps`` and ``ramp_up_end_rps``, or taken from
``start_times``/``start_timestamps`` when present); its ``max_concurrency`` and
``model_id`` are read for the replay too."""

from __future__ import annotations

import functools
import json
import math
import os
import random
import warnings
from typing import Any

from inferlab._errors import UsageError
from inferlab.workload.arrivals import arrival_times_s, gap_s
from inferlab.workload.spec import Measured
from inferlab.workload.traces.rows import TraceRow, as_int, check_row, why


def vllm_result(path: str, f: Any, required: bool = False) -> dict[str, Any] | None:
    """The file as a vLLM benchmark result (a JSON object with per-request lists), or
    ``None``; a summary saved without ``--save-detailed`` is an error that says so."""
    try:
        obj = json.load(f)
    except ValueError as e:
        if isinstance(e, json.JSONDecodeError) and e.msg == "Extra data" and _one_result(e.doc[:e.pos]):
            raise UsageError(f"{path}: several vLLM benchmark results, one a line (vllm bench serve --append-result): "
                             "replay one of them, its line in a file of its own") from None
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


def _one_result(text: str) -> bool:
    """Whether ``text`` is one vLLM benchmark result (a JSON object of its keys)."""
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    return isinstance(obj, dict) and ("input_lens" in obj or "request_throughput" in obj)


def vllm_result_field(path: str, key: str) -> object:
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
            obj = vllm_result(path, f)
    except (OSError, UsageError, UnicodeDecodeError):  # (the trace reader says what is wrong)
        return {}
    return {k: v for k, v in (obj or {}).items() if not isinstance(v, (list, dict))}


def vllm_result_max_concurrency(path: str) -> int | None:
    """The ``max_concurrency`` a vLLM benchmark result was measured under (its
    ``--max-concurrency``), so a replay caps requests in flight the same way; ``None``
    for other trace files or an uncapped run."""
    value = vllm_result_field(path, "max_concurrency")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def vllm_result_model(path: str) -> str | None:
    """The model a vLLM benchmark result measured (its ``model_id``), or ``None``."""
    value = vllm_result_field(path, "model_id")
    return value.strip() or None if isinstance(value, str) else None


def _positive(path: str, key: str, raw: object) -> float:
    """A result's ``request_rate`` or ``burstiness``: a positive number, or ``inf``
    (``"inf"``, as vLLM writes an unlimited rate; a missing rate is unlimited too);
    ``UsageError`` naming the key and the value otherwise."""
    if raw is None or raw == "inf":
        return math.inf
    try:
        value = float(raw) if isinstance(raw, (int, float, str)) and not isinstance(raw, bool) else math.nan
    except ValueError:
        value = math.nan
    if not value > 0:
        raise UsageError(f"{path}: {key} {raw!r} must be a positive number or 'inf' (the arrivals are drawn from it: the file has no start_times)")
    return value


def _ramp_arrivals(path: str, obj: dict[str, Any], n: int, burst: float, seed: int) -> list[float]:
    """Send times drawn as ``vllm bench serve --ramp-up-strategy`` drew them: request i's
    rate goes from ``ramp_up_start_rps`` to ``ramp_up_end_rps`` over the run, linearly or
    geometrically in i / (n - 1), and the gap before it is drawn at that rate (gamma of
    the run's burstiness; constant where it is inf)."""
    strategy = obj.get("ramp_up_strategy")
    lo = _positive(path, "ramp_up_start_rps", obj.get("ramp_up_start_rps", "missing"))
    hi = _positive(path, "ramp_up_end_rps", obj.get("ramp_up_end_rps", "missing"))
    if strategy not in ("linear", "exponential") or math.isinf(lo) or math.isinf(hi):
        raise UsageError(f"{path}: ramp_up_strategy {strategy!r} from {lo:g} to {hi:g} req/s: vLLM ramps 'linear' or "
                         "'exponential' between two finite rates")
    rng = random.Random(seed)
    times = [0.0]
    for i in range(1, n):
        progress = i / max(n - 1, 1)
        rate = lo + (hi - lo) * progress if strategy == "linear" else lo * (hi / lo) ** progress
        times.append(times[-1] + gap_s(rate, "constant" if math.isinf(burst) else "gamma", burst, rng))
    return times


def read_vllm_result(path: str, obj: dict[str, Any], seed: int = 0) -> list[TraceRow]:
    """Rows from vLLM's saved benchmark result (``--save-result --save-detailed``).

    Failed requests (empty output or no TTFT) are left out. Measured TPOT follows vLLM:
    (latency − TTFT) / (output tokens − 1), the latency being TTFT + Σ ITL."""
    try:
        ins, outs = list(obj["input_lens"]), list(obj["output_lens"])
        ttfts = list(obj.get("ttfts") or [None] * len(ins))
        itls = list(obj.get("itls") or [None] * len(ins))
        # per-request send times when the client saved them (vLLM's start_times,
        # SGLang's bench_serving: seconds, absolute or from the start; rebased later)
        starts = obj.get("start_times") or obj.get("start_timestamps")
    except (KeyError, TypeError) as e:
        raise UsageError(f"{path}: not a vLLM benchmark result with input_lens/output_lens ({why(e)})") from e
    if not (len(ins) == len(outs) == len(ttfts) == len(itls)):
        raise UsageError(f"{path}: input_lens, output_lens, ttfts and itls differ in length")
    if starts is not None:
        try:
            arrivals = [float(t) for t in starts]
        except (TypeError, ValueError) as e:
            raise UsageError(f"{path}: start_times must be numbers of seconds ({why(e)})") from e
        if len(arrivals) != len(ins) or not all(math.isfinite(t) for t in arrivals):
            raise UsageError(f"{path}: start_times must be one finite time per request ({len(arrivals)} for {len(ins)})")
    else:  # no send times: drawn from the rate the run was asked for, as vLLM drew them
        raw_burst = obj.get("burstiness")
        burst = _positive(path, "burstiness", 1.0 if raw_burst is None else raw_burst)
        if obj.get("ramp_up_strategy") is not None:  # (its request_rate is "inf": the ramp sets the rate)
            arrivals = _ramp_arrivals(path, obj, len(ins), burst, seed)
        else:
            rate = _positive(path, "request_rate", obj.get("request_rate"))
            # vLLM's burstiness inf is constant gaps
            arrivals = arrival_times_s(rate, "constant" if math.isinf(burst) else "gamma", burst, seed, len(ins), None)
    rows = []
    for i, (n_in, n_out, ttft, itl) in enumerate(zip(ins, outs, ttfts, itls, strict=True)):
        if not n_out or not n_in or (ttfts[i] is not None and not ttft):
            # a failed request in the source run (its warning below): kept for its time
            rows.append(TraceRow(arrivals[i], 0, 0, dropped=True))
            continue
        try:
            n_in, n_out = as_int(n_in), as_int(n_out)
            measured = None
            if ttft:
                if isinstance(ttft, bool) or not isinstance(ttft, int | float) or not isinstance(itl or [], list) \
                        or not all(isinstance(g, int | float) and not isinstance(g, bool) for g in itl or []):
                    raise TypeError("ttfts and itls must be numbers of seconds")
                gaps = sum(itl or [])
                e2e = (ttft + gaps) * 1e3
                tpot = gaps * 1e3 / (n_out - 1) if n_out > 1 and itl else None
                measured = Measured(ttft * 1e3, tpot, e2e)
        except (TypeError, ValueError) as e:
            raise UsageError(f"{path}: request {i + 1}: {why(e)}") from None
        row = TraceRow(arrivals[i], n_in, n_out, measured=measured)
        check_row(path, i + 1, row, from_first_row=True)
        rows.append(row)
    if any(r.dropped for r in rows):
        warnings.warn(f"{path}: {sum(r.dropped for r in rows):,} of {len(ins):,} requests skipped: failed in the source run "
                      "(no output, or no first token)", stacklevel=2)
    return rows
