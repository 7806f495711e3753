"""``sweep.json``: the index of a sweep directory (``inferlab sweep``; ``inferlab tune`` writes
the same format), rewritten atomically after every point.

The format (``inferlab.sweep/1``) is documented in docs/design.md; ``headline`` picks
the numbers a sweep's tables and plots use from a run's summary.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from inferlab._errors import UsageError
from inferlab.results.runfiles import dumps
from inferlab.results.summary import Summary

FORMAT = "inferlab.sweep/1"
INDEX = "sweep.json"

#: Headline metrics over repeats get a confidence interval (the counts do not).
CI_METRICS = (
    "output_tok_s", "req_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms",
)


def headline(summary: Summary, gpus: int | None) -> dict[str, Any]:
    """The numbers a sweep compares, from a run's summary (None where the run has none):
    output tokens/s and requests/s, TTFT/TPOT/E2E p50 and p99 in ms, decode tokens/s per
    request at p50 (what one user sees), output tokens/s per GPU (``gpus``: the tensor-
    parallel degree where known), goodput, the duration and the request counts."""

    def p(dist: Any, q: str) -> float | None:
        return None if dist is None else float(getattr(dist, q))

    tps = summary.output_token_throughput_tps
    return {
        "output_tok_s": tps,
        "req_s": summary.request_throughput_rps,
        "ttft_p50_ms": p(summary.ttft_ms, "p50"),
        "ttft_p99_ms": p(summary.ttft_ms, "p99"),
        "tpot_p50_ms": p(summary.tpot_ms, "p50"),
        "tpot_p99_ms": p(summary.tpot_ms, "p99"),
        "e2e_p50_ms": p(summary.e2e_ms, "p50"),
        "e2e_p99_ms": p(summary.e2e_ms, "p99"),
        "decode_tok_s_per_user_p50": p(summary.decode_tps, "p50"),
        "output_tok_s_per_gpu": None if tps is None or not gpus else tps / gpus,
        "goodput_rps": summary.goodput_rps,
        "duration_s": summary.duration_s,
        "total": summary.counts.total,
        "completed": summary.counts.completed,
        "failed": summary.counts.failed,
        "cancelled": summary.counts.cancelled,
    }


def index_target(target: dict[str, Any], varied: Iterable[str]) -> dict[str, Any]:
    """``target`` as the index records it: the engine settings an axis varies taken out
    of its ``engine`` (no point ran the base's value) and named in ``varied`` (their
    values are the ``axes``, each point's in its ``params``). A target without an
    ``engine`` (a server at a URL) as it is."""
    engine = target.get("engine")
    if not isinstance(engine, dict):
        return target
    names = list(dict.fromkeys(varied))
    # (and the name a varied setting was given by: quantization's, ``quantization_name``)
    dropped = {*names, *(f"{n}_name" for n in names)}
    return {**target, "engine": {k: v for k, v in engine.items() if k not in dropped}, "varied": names}


def check_sweep_dir(path: str, overwrite: bool) -> None:
    """``UsageError`` if ``path`` is a file, or holds a sweep already and ``overwrite``
    is off (a second sweep must not replace a first one silently)."""
    d = Path(path)
    if d.exists() and not d.is_dir():
        raise UsageError(f"--out {path} is a file, not a folder")
    if (d / INDEX).exists() and not overwrite:
        raise UsageError(f"--out {path} holds a sweep already ({INDEX}): choose another folder, or --overwrite")


def make_sweep_dir(path: str) -> None:
    """Make the sweep's folder (and those above it); ``UsageError`` naming ``--out``
    where it cannot be made (a file on its path, a folder that cannot be written)."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {path}: cannot make that folder: {e.strerror or e}") from None


def write_index(sweep_dir: str, index: dict[str, Any]) -> Path:
    """Write ``sweep.json`` atomically (a temporary file, then a rename): a reader, or a
    sweep killed mid-write, never sees half an index."""
    path = Path(sweep_dir) / INDEX
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(dumps(index) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
