"""Fit an engine family's front-end latency on the `fit` rows of bench/data only.

vLLM V1's front end (``sim/engine/frontend.py``) has CPU costs, measured on vLLM's own
API server (``bench/vllm_front_end_cost.py``: per request, per prompt token, per
streamed token and per engine step streamed), and one fixed latency per request
(``Efficiencies.api_overhead_s``: whatever else a request waits for outside the engine
core on the fit hosts, which no measurement here accounts for). This script runs every
vLLM V1 row that goes through the API server (not offline, not a static batch) and sits
on the `fit` side of the split (docs/validation.md), for each latency of a grid, with
the family's measured CPU costs, and prints the median absolute error per metric class
over the rows and their mean (the objective: every fit row counts once), best first;
for comparison only, the same medians taken over hosts (a source and its GPU) instead of
rows. Held-out rows are never read.

``--family sglang`` does the same for SGLang, whose front end has no CPU model (its fixed
latency, ``api_overhead_s``, is all there is): its fit rows are SGLang's v0.3 benchmark
against vLLM (A100 and H100) and DataCrunch's H200 runs.

    python bench/fit_front_end.py --jobs 2                          # the grid the latency came from
    python bench/fit_front_end.py --jobs 2 --family sglang           # SGLang's (0 to 30 ms)
    python bench/fit_front_end.py --jobs 2 --latency-ms 0,2.5,5      # other latencies
    python bench/fit_front_end.py --jobs 2 --per-seq-us 5,15,25      # and the engine core's cost per sequence

``--per-seq-us`` scans the engine core's host cost per scheduled sequence
(``Efficiencies.per_seq_s``) with each latency: the grid is then two-dimensional and the
same objective ranks its points; of points within 0.2 of the best, the lowest cost per
sequence is taken, then the lowest latency.

(Before the CPU costs were measured, this script fitted them too: intake 2-4 ms x
streaming 25 or 70 us a token x the engine core's 0-45 us a sequence, at 25 ms; the
grid and its result are in docs/validation.md, "The front end's fit".)
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import statistics
import sys
from pathlib import Path

from inferlab.sim.engine import families
from inferlab.sim.engine.families import EngineFamily
from inferlab.sim.validation.calibration import load_rows, parse_rows
from inferlab.sim.validation.scenario import OFFLINE
from inferlab.sim.validation.validate import error_medians, validate_files

DATA = Path(__file__).resolve().parent / "data"
LATENCY_S = tuple(k * 2.5e-3 for k in range(13))  # 0 to 30 ms


def fit_rows(family: EngineFamily = EngineFamily.VLLM) -> list[str]:
    """Row ids of the family's served rows on the fit side (read from the files, before
    any run)."""
    rows = [r for path in sorted(DATA.glob("*.csv")) for r in load_rows(path) if r.get("split") == "fit"]
    scenarios, _ = parse_rows(rows)
    return [sc.row_id for sc in scenarios if sc.family == family and sc.regime != OFFLINE]


def host_medians(comparisons: list) -> dict[str, list[float]]:
    """Per metric class, each host's median |error| over its rows (a host: a source and
    its GPU, e.g. IOG's H100 PCIe nodes apart from its RTX 4090s), so that a source with
    a hundred rows counts as one host, not as a hundred."""
    by_host: dict[str, dict[tuple[str, str], dict[str, list[float]]]] = {}
    for c in comparisons:
        host = (c.scenario.source_id, c.scenario.gpu)
        by_host.setdefault(c.metric_class, {}).setdefault(host, {}).setdefault(c.scenario.row_id, []).append(
            abs(c.error_pct)
        )
    return {
        cls: [statistics.median(statistics.fmean(v) for v in rows.values()) for rows in hosts.values()]
        for cls, hosts in by_host.items()
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--family", choices=("vllm", "sglang"), default="vllm",
                    help="the engine family whose latency is fitted (default: vllm, vLLM V1)")
    ap.add_argument("--latency-ms", help="comma-separated fixed latencies to scan (default: 0 to 30 by 2.5)")
    ap.add_argument("--per-seq-us", help="comma-separated engine-core costs per scheduled sequence to scan "
                    "with each latency (default: the shipped one only)")
    args = ap.parse_args(argv)
    if args.jobs > 1 and multiprocessing.get_start_method() != "fork":
        args.jobs = 1  # workers that do not fork would not see the constant changed here
    try:
        latencies = [float(x) / 1e3 for x in args.latency_ms.split(",")] if args.latency_ms else list(LATENCY_S)
        family = EngineFamily.parse(args.family)
        base = families.FAMILY_RULES[family]
        per_seqs = ([float(x) / 1e6 for x in args.per_seq_us.split(",")] if args.per_seq_us
                    else [base.efficiencies.per_seq_s])
    except ValueError as e:
        print(f"fit_front_end.py: not a number: {e}", file=sys.stderr)
        return 2
    ids = fit_rows(family)
    results = []
    for per_seq, latency in ((p, lat) for p in per_seqs for lat in latencies):
        eff = dataclasses.replace(base.efficiencies, api_overhead_s=latency, per_seq_s=per_seq)
        families.FAMILY_RULES[family] = dataclasses.replace(base, efficiencies=eff)
        try:
            report = validate_files(sorted(DATA.glob("*.csv")), ids, args.jobs)
        finally:
            families.FAMILY_RULES[family] = base
        online = [
            c for c in report.comparisons
            if c.scenario.family == family and c.scenario.regime != OFFLINE and c.scenario.split == "fit"
        ]
        medians = error_medians(online)
        pooled = statistics.fmean(m for m, _, _ in medians.values())
        results.append((pooled, per_seq, latency))  # the objective: every fit row counts once
        cells = ", ".join(f"{cls} {m:.1f}% ({n})" for cls, (m, n, _) in medians.items())
        where = f"per seq {per_seq * 1e6:4.1f} us, " if args.per_seq_us else ""
        print(f"{where}latency {latency * 1e3:5.1f} ms: mean {pooled:6.2f}%  {cells}", flush=True)
        # (not the objective, for comparison: each host counted once, the median over hosts)
        hosts = host_medians(online)
        by_host = statistics.fmean(statistics.median(v) for v in hosts.values())
        per_host = ", ".join(f"{cls} {statistics.median(v):.1f}% ({len(v)} hosts)" for cls, v in hosts.items())
        print(f"{'':20}median over hosts: mean {by_host:5.1f}%  {per_host}", flush=True)
        # the hosts apart: each source's TTFT, signed (median over its rows)
        by_source: dict[str, dict[str, list[float]]] = {}
        for c in online:
            if c.metric_class == "TTFT":
                by_source.setdefault(c.scenario.source_id, {}).setdefault(c.scenario.row_id, []).append(c.error_pct)
        hosts = ", ".join(f"{s} {statistics.median(statistics.fmean(v) for v in rows.values()):+.0f}%"
                          for s, rows in sorted(by_source.items()))
        print(f"{'':20}TTFT per source, signed: {hosts}", flush=True)
    e = base.efficiencies
    if e.api_intake_s or e.api_stream_s:  # (vLLM V1's front end; SGLang's has no CPU model)
        print(f"\nCPU costs held (measured): intake {e.api_intake_s * 1e3:g} ms + {e.api_intake_per_token_s * 1e6:g} us "
              f"a prompt token, streaming {e.api_stream_s * 1e6:g} us a token + {e.api_stream_per_step_s * 1e6:g} us a step")
    print("\nbest first:")
    for score, per_seq, latency in sorted(results)[:5]:
        where = f"per seq {per_seq * 1e6:.1f} us, " if args.per_seq_us else ""
        print(f"  {where}latency {latency * 1e3:.1f} ms: {score:.2f}%")
    best = min(score for score, _, _ in results)
    near = min((p, lat) for score, p, lat in results if score <= best + 0.2)
    where = f"per seq {near[0] * 1e6:.1f} us, " if args.per_seq_us else ""
    print(f"chosen (within 0.2 of the best, the lowest): {where}latency {near[1] * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
