"""Fit vLLM V1's front-end constants on the `fit` rows of bench/data only.

Runs every vLLM V1 row that goes through the API server (not offline, not a static
batch) and sits on the `fit` side of the split (docs/validation.md), for each point of a
small grid of front-end constants (``Efficiencies.api_overhead_s``, ``api_intake_s``,
``api_stream_s``, and the engine core's ``api_per_seq_s``), and prints the median absolute error per metric class and their mean,
best first. Held-out rows are never read. The per-prompt-token intake cost is not fitted
(the fit rows' prompts are too alike to separate it from the fixed cost): it is held at
``api_intake_per_token_s`` of the family, a tokenizer's order of magnitude.

    python bench/fit_front_end.py --jobs 2                      # the grid the constants came from
    python bench/fit_front_end.py --jobs 2 --latency-ms 5,15,25  # a wider scan (slower)
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import sys
from pathlib import Path

from inferlab.sim.engine import families
from inferlab.sim.engine.families import EngineFamily
from inferlab.sim.validation.calibration import load_rows, parse_rows
from inferlab.sim.validation.scenario import OFFLINE
from inferlab.sim.validation.validate import error_medians, validate_files

DATA = Path(__file__).resolve().parent / "data"
LATENCY_S = (0.025,)  # (--latency-ms scans others: the first pass, docs/validation.md)
INTAKE_S = (0.002, 0.003, 0.004)
STREAM_S = (25e-6, 70e-6)
# the engine core's own CPU per sequence that emits a token (outputs built, serialized
# and sent to the API process), on the engine step
ENGINE_PER_SEQ_S = (0.0, 20e-6, 45e-6)


def fit_rows() -> list[str]:
    """Row ids of vLLM V1 rows on the fit side (read from the files, before any run)."""
    rows = [r for path in sorted(DATA.glob("*.csv")) for r in load_rows(path) if r.get("split") == "fit"]
    scenarios, _ = parse_rows(rows)
    return [sc.row_id for sc in scenarios if sc.family == EngineFamily.VLLM and sc.regime != OFFLINE]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--latency-ms", help="comma-separated fixed latencies to scan (default: 25)")
    args = ap.parse_args(argv)
    latencies = [float(x) / 1e3 for x in args.latency_ms.split(",")] if args.latency_ms else list(LATENCY_S)
    base = families.FAMILY_RULES[EngineFamily.VLLM]
    ids = fit_rows()
    results = []
    for latency, intake, stream, per_seq in itertools.product(latencies, INTAKE_S, STREAM_S, ENGINE_PER_SEQ_S):
        eff = dataclasses.replace(
            base.efficiencies, api_overhead_s=latency, api_intake_s=intake, api_stream_s=stream, api_per_seq_s=per_seq
        )
        families.FAMILY_RULES[EngineFamily.VLLM] = dataclasses.replace(base, efficiencies=eff)
        report = validate_files(sorted(DATA.glob("*.csv")), ids, args.jobs)
        online = [
            c for c in report.comparisons
            if c.scenario.family == EngineFamily.VLLM and c.scenario.regime != OFFLINE and c.scenario.split == "fit"
        ]
        medians = error_medians(online)
        score = statistics.fmean(m for m, _, _ in medians.values())
        results.append((score, latency, intake, stream, per_seq, medians))
        cells = ", ".join(f"{cls} {m:.1f}% ({n})" for cls, (m, n, _) in medians.items())
        print(f"latency {latency * 1e3:4.0f} ms intake {intake * 1e3:3.0f} ms stream {stream * 1e6:3.0f} us "
              f"engine {per_seq * 1e6:3.0f} us/seq: "
              f"mean {score:5.1f}%  {cells}", flush=True)
    families.FAMILY_RULES[EngineFamily.VLLM] = base
    print()
    print("best first:")
    for score, latency, intake, stream, per_seq, _ in sorted(results, key=lambda r: r[0])[:5]:
        print(f"  latency {latency * 1e3:.0f} ms, intake {intake * 1e3:.0f} ms, stream {stream * 1e6:.0f} us, "
              f"engine {per_seq * 1e6:.0f} us/seq: {score:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
