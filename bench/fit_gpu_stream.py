"""Fit one GPU's bandwidth factor on the `fit` rows of bench/data only.

A GPU preset's ``stream_factor`` (``sim/engine/hardware.py``) scales every streaming
efficiency of the step-time model (weights, KV cache, activations) on that card: the
share of its datasheet bandwidth it reaches relative to the H100 the efficiencies were
fit on. GDDR cards have 1.12; H200 has 0.92, from this script. It runs every `fit` row
whose GPU is the one named (any engine family; held-out rows are never run) with each
factor of a grid and prints, per factor, the median |error| over the rows in each metric
class and the objective: the mean of the throughput, TPOT/ITL and E2E medians (what
bandwidth moves; TTFT is printed but left out, the front end dominates it). The rule,
written before the H200 grid was run: the best point; of the points within 0.2 of it,
the one closest to 1.0 (the least change).

    python bench/fit_gpu_stream.py --jobs 2                              # H200, the grid its 0.92 came from
    python bench/fit_gpu_stream.py --jobs 2 --gpu H100 --grid 0.88,0.92,0.96,1  # the control: H100 keeps 1.0
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
from pathlib import Path

from inferlab._errors import UsageError
from inferlab.sim.engine import hardware
from inferlab.sim.validation.calibration import load_rows, parse_rows
from inferlab.sim.validation.validate import error_medians, validate_files

DATA = Path(__file__).resolve().parent / "data"
GRID = tuple(round(0.86 + 0.02 * k, 2) for k in range(8))  # 0.86 to 1.00
OBJECTIVE = ("throughput", "TPOT/ITL", "E2E")
TIE = 0.2  # points of objective within which the factor closest to 1.0 is taken


def fit_rows(gpu: str) -> list[str]:
    """Row ids of `fit` rows on ``gpu`` (read from the files, before any run)."""
    rows = [r for path in sorted(DATA.glob("*.csv")) for r in load_rows(path) if r.get("split") == "fit"]
    scenarios, _ = parse_rows(rows)
    return [sc.row_id for sc in scenarios if sc.gpu == gpu]


def choose(objectives: dict[float, float]) -> float:
    """The rule: the best factor, or of those within ``TIE`` of it the closest to 1.0."""
    best = min(objectives.values())
    near = [f for f, o in objectives.items() if o <= best + TIE]
    return min(near, key=lambda f: (abs(f - 1.0), objectives[f]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="H200-SXM-141GB", help="a preset or its short name (default: H200-SXM-141GB)")
    ap.add_argument("--grid", help="comma-separated factors (default: 0.86 to 1.00 by 0.02)")
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args(argv)
    if args.jobs > 1 and multiprocessing.get_start_method() != "fork":
        args.jobs = 1  # workers that do not fork would not see the constant changed here
    presets = hardware._presets()["gpus"]
    try:
        args.gpu = hardware.resolve_gpu(args.gpu).name  # (H200 -> H200-SXM-141GB)
    except UsageError as e:  # (its message lists the names)
        print(f"--gpu: {e}", file=sys.stderr)
        return 2
    if args.gpu not in presets:
        print(f"--gpu: {args.gpu!r} is not a preset; presets: {', '.join(sorted(presets))}", file=sys.stderr)
        return 2
    try:
        grid = [float(x) for x in args.grid.split(",")] if args.grid else list(GRID)
    except ValueError:
        print(f"--grid: not a list of numbers: {args.grid!r}", file=sys.stderr)
        return 2
    if not grid or any(not 0.5 <= f <= 1.5 for f in grid):
        print("--grid: factors between 0.5 and 1.5", file=sys.stderr)
        return 2
    ids = fit_rows(args.gpu)
    if not ids:
        print(f"no fit rows on {args.gpu}", file=sys.stderr)
        return 1
    print(f"{len(ids)} fit rows on {args.gpu}: {', '.join(ids)}")
    shipped = hardware.resolve_gpu(args.gpu).stream_factor
    paths = sorted(DATA.glob("*.csv"))
    objectives: dict[float, float] = {}
    for factor in grid:
        # the preset dict is read at every resolve; worker processes fork after this
        presets[args.gpu]["stream_factor"] = factor
        report = validate_files(paths, ids, args.jobs)
        assert all(c.scenario.split == "fit" for c in report.comparisons)
        medians = error_medians(report.comparisons)
        objectives[factor] = statistics.fmean(medians[c][0] for c in OBJECTIVE if c in medians)
        cells = ", ".join(f"{c} {m:.1f} % ({n})" for c, (m, n, _) in medians.items())
        print(f"  {factor:.2f}: objective {objectives[factor]:.2f}  ({cells})", flush=True)
    print(f"the rule takes {choose(objectives):.2f} (shipped: {shipped:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
