"""Fit the GEMMs' share of peak (``gemm_compute``) on the `fit` rows of bench/data only.

``Efficiencies.gemm_compute`` is the fraction of a GPU's dense bf16 peak the layer GEMMs
reach at large batches (``sim/engine/steptime.py``): it sets how long a prefill takes,
so every TTFT under load rests on it, and it is shared by every engine family on a GPU
(their GEMMs are cuBLAS's or CUTLASS's). It was 0.70, the middle of the 0.6-0.8 the
literature gives, never fitted. This script runs every `fit` row of every family (held-out
rows are never run) with each value of a grid and prints, per value, the median |error|
over rows in each metric class and the objective: their mean (every row counts once, as
``bench/fit_front_end.py``'s); beside it, not the objective, the same over hosts (a
source and its GPU counted once) and how often each value is best when whole hosts are
drawn with replacement (1,000 draws, seed 0). The rule, as the other fits': the best
value; of those within 0.2 of it, the closest to 0.70 (the least change from the
literature's middle).

    python bench/fit_gemm.py --jobs 2                         # the grid 0.60 came from
    python bench/fit_gemm.py --jobs 2 --grid 0.55,0.6,0.65    # other values

The front-end latencies were fitted with the GEMMs at their shipped value: after a change
here, run ``bench/fit_front_end.py`` (vLLM V1 and ``--family sglang``) again, and this
script once more with what they chose (docs/validation.md, "GEMMs' share of peak").
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import random
import statistics
import sys
from collections import Counter
from pathlib import Path

from inferlab.sim.engine import families
from inferlab.sim.validation.calibration import load_rows, parse_rows
from inferlab.sim.validation.validate import (
    METRIC_CLASSES,
    Comparison,
    error_medians,
    validate_files,
)

DATA = Path(__file__).resolve().parent / "data"
GRID = tuple(round(0.50 + 0.05 * k, 2) for k in range(7))  # 0.50 to 0.80
PRIOR = 0.70  # the literature's middle of 0.6-0.8, shipped until this fit
TIE = 0.2  # points of objective within which the value closest to PRIOR is taken
DRAWS = 1000


def fit_rows() -> list[str]:
    """Row ids of every `fit` row (read from the files, before any run)."""
    rows = [r for path in sorted(DATA.glob("*.csv")) for r in load_rows(path) if r.get("split") == "fit"]
    scenarios, _ = parse_rows(rows)
    return [sc.row_id for sc in scenarios]


def choose(objectives: dict[float, float]) -> float:
    """The rule: the best value, or of those within ``TIE`` of it the closest to ``PRIOR``."""
    best = min(objectives.values())
    near = [v for v, o in objectives.items() if o <= best + TIE]
    return min(near, key=lambda v: (abs(v - PRIOR), objectives[v]))


Host = tuple[str, str]
RowErrors = dict[Host, dict[str, dict[str, float]]]  # host -> metric class -> row -> mean |error|


def row_errors(comparisons: list[Comparison]) -> RowErrors:
    """Each row's mean |error| per metric class, grouped by host (a source and its GPU)."""
    acc: dict[Host, dict[str, dict[str, list[float]]]] = {}
    for c in comparisons:
        host = (c.scenario.source_id, c.scenario.gpu)
        acc.setdefault(host, {}).setdefault(c.metric_class, {}).setdefault(c.scenario.row_id, []).append(abs(c.error_pct))
    return {h: {cls: {r: statistics.fmean(v) for r, v in rows.items()} for cls, rows in by.items()} for h, by in acc.items()}


def objective(errors: RowErrors, hosts: list[Host]) -> float:
    """Mean over metric classes of the median over the rows of ``hosts`` (a host drawn
    twice counts twice)."""
    medians = []
    for cls in METRIC_CLASSES:
        values = [e for h in hosts for e in errors[h].get(cls, {}).values()]
        if values:
            medians.append(statistics.median(values))
    return statistics.fmean(medians)


def host_objective(errors: RowErrors) -> float:
    """Mean over metric classes of the median over hosts of each host's median."""
    medians = []
    for cls in METRIC_CLASSES:
        values = [statistics.median(by[cls].values()) for by in errors.values() if by.get(cls)]
        if values:
            medians.append(statistics.median(values))
    return statistics.fmean(medians)


def host_draw_wins(by_value: dict[float, RowErrors], draws: int = DRAWS, seed: int = 0) -> Counter[float]:
    """How often each value has the lowest objective when whole hosts are drawn with
    replacement, as many as there are."""
    hosts = sorted(next(iter(by_value.values())))
    rng = random.Random(seed)
    wins: Counter[float] = Counter()
    for _ in range(draws):
        drawn = [rng.choice(hosts) for _ in hosts]
        wins[min(by_value, key=lambda v: objective(by_value[v], drawn))] += 1
    return wins


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", help="comma-separated values (default: 0.50 to 0.80 by 0.05)")
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args(argv)
    if args.jobs > 1 and multiprocessing.get_start_method() != "fork":
        args.jobs = 1  # workers that do not fork would not see the constant changed here
    try:
        grid = [float(x) for x in args.grid.split(",")] if args.grid else list(GRID)
    except ValueError:
        print(f"--grid: not a list of numbers: {args.grid!r}", file=sys.stderr)
        return 2
    if not grid or any(not 0.2 <= v <= 1.0 for v in grid):
        print("--grid: values between 0.2 and 1.0", file=sys.stderr)
        return 2
    ids = fit_rows()
    print(f"{len(ids)} fit rows, every family")
    paths = sorted(DATA.glob("*.csv"))
    shipped = dict(families.FAMILY_RULES)
    objectives: dict[float, float] = {}
    by_value: dict[float, RowErrors] = {}
    for value in grid:
        for family, rules in shipped.items():  # worker processes fork after this
            families.FAMILY_RULES[family] = dataclasses.replace(
                rules, efficiencies=dataclasses.replace(rules.efficiencies, gemm_compute=value))
        try:
            report = validate_files(paths, ids, args.jobs)
        finally:
            families.FAMILY_RULES.update(shipped)
        assert all(c.scenario.split == "fit" for c in report.comparisons)
        medians = error_medians(report.comparisons)
        objectives[value] = statistics.fmean(m for m, _, _ in medians.values())
        by_value[value] = errors = row_errors(report.comparisons)
        cells = ", ".join(f"{c} {m:.1f} % ({n})" for c, (m, n, _) in medians.items())
        print(f"  {value:.2f}: objective {objectives[value]:.2f}  over hosts {host_objective(errors):.2f}  ({cells})",
              flush=True)
    wins = host_draw_wins(by_value)
    print(f"best in {DRAWS:,} draws of whole hosts: "
          + ", ".join(f"{v:.2f} {wins[v] / DRAWS:.0%}" for v in sorted(by_value)))
    in_use = {rules.efficiencies.gemm_compute for rules in shipped.values()}
    print(f"the rule takes {choose(objectives):.2f} (shipped: {', '.join(f'{v:g}' for v in sorted(in_use))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
