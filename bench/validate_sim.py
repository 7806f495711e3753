"""The simulator against published measurements: one line per measured metric.

Runs every row of a calibration CSV (default ``bench/data/calibration.csv``) through
``inferlab.sim.validation`` in virtual time and prints measured vs predicted with the
absolute error, then the median absolute error per metric class against the targets
(throughput <= 10 %, TTFT <= 15 %, TPOT/ITL <= 15 %), per engine family, the rows whose
throughput errors disagree (their simulated lengths are not the source's), and the rows
that could not be expressed with the reason.

    python bench/validate_sim.py                  # bench/data/calibration.csv
    python bench/validate_sim.py --csv other.csv  # any file in the same format
    python bench/validate_sim.py --csv bench/data/published_extra.csv  # rows we gathered
    python bench/validate_sim.py --rows 1,46,141  # a subset
    python bench/validate_sim.py --all --jobs 2   # every file in bench/data, fit vs held-out
    python bench/validate_sim.py --all --jobs 2 --write-bands  # and the error bands sim run shows
    python bench/validate_sim.py --all --set vllm.api_per_seq_s=15e-6  # a sensitivity check
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from inferlab.sim.engine import families
from inferlab.sim.engine.bands import BANDS_FILE, STATS
from inferlab.sim.engine.families import EngineFamily
from inferlab.sim.engine.steptime import Efficiencies
from inferlab.sim.validation.scenario import OFFLINE, REGIMES, SPLITS
from inferlab.sim.validation.validate import (
    METRIC_CLASSES,
    TARGET_PCT,
    Comparison,
    distribution_medians,
    error_medians,
    group_medians,
    length_mismatches,
    row_errors_by_source,
    source_interval,
    validate_files,
)

DATA = Path(__file__).resolve().parent / "data"
DEFAULT_CSV = DATA / "calibration.csv"
ALL_CSVS = sorted(DATA.glob("*.csv"))


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def _table(comparisons: list[Comparison]) -> None:
    head = (
        f"{'row':>4} {'family':<8} {'model':<20} {'gpu':<14} {'prec':<8} {'tp':>2} "
        f"{'scenario':<8} {'metric':<17} {'measured':>9} {'predicted':>9} {'err%':>7} {'|err|%':>6}"
    )
    print(head)
    print("-" * len(head))
    for c in comparisons:
        s = c.scenario
        metric = f"{c.metric}/{c.stat[:3]}" if c.stat != "aggregate" else c.metric
        print(
            f"{s.row_id:>4} {s.family:<8} {s.model[:20]:<20} {s.gpu[:14]:<14} "
            f"{s.precision[:8]:<8} {s.tp:>2} {s.kind:<8} {metric:<17} "
            f"{_fmt(c.measured):>9} {_fmt(c.predicted):>9} {c.error_pct:>+7.1f} "
            f"{abs(c.error_pct):>6.1f}"
        )


def _breakdown(title: str, comparisons: list[Comparison], key: Callable[[Comparison], str]) -> None:
    print()
    print(f"{title} (median over rows of |error| %, rows):")
    for group in sorted({key(c) for c in comparisons}):
        sub = error_medians([c for c in comparisons if key(c) == group])
        cells = ", ".join(f"{cls} {med:.1f}% ({rows})" for cls, (med, rows, _) in sub.items())
        print(f"  {group:<9} {cells}")


def _split_table(title: str, comparisons: list[Comparison], groups: list[tuple[str, Callable[[Comparison], bool]]]) -> None:
    """Fit against held-out rows per group, as a Markdown table (docs/validation.md)."""
    print()
    print(f"per {title}, fit against held-out (median over rows of |error| %, rows):")
    print()
    print(f"| {title} | split | " + " | ".join(METRIC_CLASSES) + " |")
    print("|---|---|" + "---|" * len(METRIC_CLASSES))
    for group, member in groups:
        sub = [c for c in comparisons if member(c)]
        if not sub:
            continue
        by_split = group_medians(sub, lambda c: c.scenario.split)
        for split in SPLITS:
            medians = by_split.get(split)
            if not medians:
                continue
            cells = [f"{medians[cls][0]:.1f} % ({medians[cls][1]})" if cls in medians else "—" for cls in METRIC_CLASSES]
            print(f"| {group} | {split} | " + " | ".join(cells) + " |")


def _distribution_table(comparisons: list[Comparison], groups: list[tuple[str, Callable[[Comparison], bool]]]) -> None:
    """The rows' other latency statistics (their ``distribution`` cells), compared apart
    from the headline: per group, split, metric and statistic, as a Markdown table."""
    print()
    print("distributions: the rows' other statistics of the same runs (bench/data's distribution")
    print("column), never in the medians above (median over rows of |error| %, median signed")
    print("error %, rows):")
    print()
    print("| family | split | metric | statistic | \\|error\\| | signed | rows |")
    print("|---|---|---|---|---|---|---|")
    for group, member in groups:
        for split in SPLITS:
            sub = [c for c in comparisons if member(c) and c.scenario.split == split]
            for (metric, stat), (abs_med, signed, n) in distribution_medians(sub).items():
                print(f"| {group} | {split} | {metric} | {stat} | {abs_med:.1f} % | {signed:+.1f} % | {n} |")


def write_bands(comparisons: list[Comparison], path: Path, distribution: list[Comparison] | None = None) -> int:
    """The error bands ``sim run`` shows (``inferlab.sim.engine.bands``): per engine
    family (and all families), regime (and all regimes) and split, each metric class's median over rows of
    |error| and its row count; then the same for each of ``STATS`` alone (``stat``), over
    the rows that reported it, as their headline or in their distribution. Returns how
    many bands were written."""
    bands = []
    families = sorted({str(c.scenario.family) for c in comparisons})
    everything = [*comparisons, *(distribution or [])]
    for stat in ("", *STATS):
        pool = comparisons if not stat else [c for c in everything if c.stat == stat]
        for family in (*families, "all"):
            mine = [c for c in pool if family in ("all", c.scenario.family)]
            for regime in (*REGIMES, "all"):
                sub = [c for c in mine if regime == "all" or c.scenario.regime == regime]
                for split, medians in group_medians(sub, lambda c: c.scenario.split).items():
                    for cls, (median, rows, _) in medians.items():
                        bands.append({
                            "family": family, "regime": regime, "split": split, "metric": cls,
                            "median_abs_pct": round(median, 2), "rows": rows, **({"stat": stat} if stat else {}),
                        })
    # the longest mean prompt and answer of the rows compared, per family and regime: a
    # run past them is outside what any band was measured on (``bands.beyond_validated``)
    lengths = []
    for family in (*families, "all"):
        for regime in (*REGIMES, "all"):
            rows = {c.scenario.row_id: c.scenario for c in comparisons
                    if family in ("all", c.scenario.family) and regime in ("all", c.scenario.regime)}
            if rows:
                lengths.append({
                    "family": family, "regime": regime,
                    "input_tokens_max": round(max(sc.input_len.mean for sc in rows.values())),
                    "output_tokens_max": round(max(sc.output_len.mean for sc in rows.values())),
                })
    path.write_text(json.dumps({
        "generated_by": "python bench/validate_sim.py --all --write-bands",
        "what": "median over rows of each row's mean |predicted - measured| / measured, in %, per engine family, "
        "load regime and side of the split (docs/validation.md); with a stat, over the rows' medians or p99s alone; "
        "lengths: the longest mean prompt and answer of the rows compared, per family and regime",
        "bands": bands,
        "lengths": lengths,
    }, indent=1) + "\n")
    return len(bands)


def _source_intervals(comparisons: list[Comparison]) -> None:
    """The held-out medians with the 95 % interval a bootstrap over whole sources gives:
    how much of a median is which sources happen to be in the set."""
    print()
    print("held out, median over rows with its 95 % interval over sources (2,000 draws of whole sources):")
    print()
    print("| held out | " + " | ".join(METRIC_CLASSES) + " |")
    print("|---|" + "---|" * len(METRIC_CLASSES))
    groups = [("every family", lambda c: True),
              ("vllm online", lambda c: c.scenario.family == "vllm" and c.scenario.regime != OFFLINE)]
    for name, member in groups:
        held = [c for c in comparisons if c.scenario.split == "holdout" and member(c)]
        medians = error_medians(held)
        cells = []
        for cls in METRIC_CLASSES:
            if cls not in medians:
                cells.append("—")
                continue
            by_source = row_errors_by_source(held, cls)
            lo, hi = source_interval(by_source)
            cells.append(f"{medians[cls][0]:.1f} % [{lo:.1f}, {hi:.1f}] ({medians[cls][1]} rows, {len(by_source)} sources)")
        print(f"| {name} | " + " | ".join(cells) + " |")


def apply_overrides(settings: list[str]) -> None:
    """Change one efficiency constant of one engine family (``all``: of every family) per
    ``FAMILY.NAME=VALUE``, for this process: a sensitivity check that leaves the shipped
    constants as they are.

    Raises ``ValueError`` for an unknown family or constant or a value that is no number."""
    known = {f.name for f in dataclasses.fields(Efficiencies)}
    for setting in settings:
        key, sep, value = setting.partition("=")
        family_name, dot, name = key.strip().partition(".")
        if not sep or not dot:
            raise ValueError(f"--set {setting!r}: expected FAMILY.NAME=VALUE")
        chosen = list(families.FAMILY_RULES) if family_name == "all" else [EngineFamily(family_name)]
        if name not in known:
            raise ValueError(f"--set {setting!r}: no constant {name!r}; known: {sorted(known)}")
        for family in chosen:
            rules = families.FAMILY_RULES[family]
            eff = dataclasses.replace(rules.efficiencies, **{name: float(value)})
            families.FAMILY_RULES[family] = dataclasses.replace(rules, efficiencies=eff)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV, help="calibration CSV")
    ap.add_argument("--rows", help="comma-separated row ids (default: all)")
    ap.add_argument("--all", action="store_true", help="every CSV in bench/data, with fit vs held-out tables")
    ap.add_argument("--jobs", type=int, default=1, help="simulate rows in this many processes")
    ap.add_argument("--write-bands", action="store_true", help=f"with --all: write {BANDS_FILE.name} for sim run")
    ap.add_argument(
        "--set", action="append", default=[], metavar="FAMILY.NAME=VALUE",
        help="run with one efficiency constant of one engine family changed (e.g. "
        "vllm.api_per_seq_s=15e-6; all.attention_compute=0.4 for every family; repeatable): a "
        "sensitivity check, in one process, never with --write-bands",
    )
    args = ap.parse_args(argv)
    if args.write_bands and (not args.all or args.rows or args.set):
        print("--write-bands needs --all and every row, with the shipped constants", file=sys.stderr)
        return 2
    try:
        apply_overrides(args.set)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if args.set:
        args.jobs = 1  # worker processes would not see the changed constants
        print(f"constants changed for this run: {', '.join(args.set)}")
    paths = ALL_CSVS if args.all else [args.csv]
    if not all(p.is_file() for p in paths):
        print(f"no such file: {args.csv}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    rows = args.rows.split(",") if args.rows else None
    report = validate_files(paths, rows, args.jobs)
    elapsed = time.perf_counter() - started

    _table(report.comparisons)
    print()
    print("median over rows of |error| per metric class (target):")
    for cls, (median, n_rows, n_cmp) in error_medians(report.comparisons).items():
        target = f"<= {TARGET_PCT[cls]:.0f}%" if cls in TARGET_PCT else "no target"
        ok = "" if cls not in TARGET_PCT else (" ok" if median <= TARGET_PCT[cls] else " MISS")
        print(f"  {cls:<10} {median:6.1f}%  ({n_rows} rows, {n_cmp} values; {target}){ok}")
    _breakdown("per engine family", report.comparisons, lambda c: c.scenario.family)
    _breakdown("per scenario", report.comparisons, lambda c: c.scenario.kind)
    _breakdown("per split", report.comparisons, lambda c: c.scenario.split)
    families = sorted({str(c.scenario.family) for c in report.comparisons})
    _split_table("family", report.comparisons, [
        ("all", lambda c: True),
        *((f, lambda c, f=f: c.scenario.family == f) for f in families),
        ("vllm online", lambda c: c.scenario.family == "vllm" and c.scenario.regime != OFFLINE),
    ])
    _split_table("regime", report.comparisons, [(r, lambda c, r=r: c.scenario.regime == r) for r in REGIMES])
    _source_intervals(report.comparisons)
    # vLLM V1 by source (the unit of the split), and without each of its two largest held-out sources
    v1 = [c for c in report.comparisons if c.scenario.family == "vllm"]
    sources = sorted({c.scenario.source_id for c in v1})
    held = Counter(c.scenario.source_id for c in v1 if c.scenario.split == "holdout")
    largest = [(f"vllm without {s}", lambda c, s=s: c.scenario.family == "vllm" and c.scenario.source_id != s)
               for s, _ in held.most_common(2)]
    _split_table("source, vllm", report.comparisons, [
        *((s, lambda c, s=s: c.scenario.family == "vllm" and c.scenario.source_id == s) for s in sources), *largest,
    ])
    sglang = sorted({c.scenario.source_id for c in report.comparisons if c.scenario.family == "sglang"})
    _split_table("source, sglang", report.comparisons, [
        (s, lambda c, s=s: c.scenario.family == "sglang" and c.scenario.source_id == s) for s in sglang
    ])
    if report.distribution:
        print()
        _table(report.distribution)
        v1_sources = sorted({c.scenario.source_id for c in report.distribution if c.scenario.family == "vllm"})
        _distribution_table(report.distribution, [
            ("all", lambda c: True),
            *((f, lambda c, f=f: c.scenario.family == f) for f in families),
            *((f"vllm, {s}", lambda c, s=s: c.scenario.family == "vllm" and c.scenario.source_id == s) for s in v1_sources),
        ])
    assumed = {
        c.scenario.row_id: c.scenario.assumptions
        for c in report.comparisons
        if c.scenario.assumptions
    }
    if assumed:
        print()
        print("assumptions:")
        for rid, notes in assumed.items():
            print(f"  row {rid}: {'; '.join(notes)}")
    mismatched = length_mismatches(report.comparisons)
    if mismatched:
        print()
        print("lengths to check (a row's throughput errors disagree: the simulated tokens per")
        print("request differ from the source's by more than 3 %):")
        for rid, what in mismatched.items():
            print(f"  row {rid}: {what}")
    print()
    print(f"skipped ({len(report.skipped)}):")
    for sk in report.skipped:
        print(f"  row {sk.row_id}: {sk.model[:40]} - {sk.reason}")
    if args.write_bands:
        n = write_bands(report.comparisons, BANDS_FILE, report.distribution)
        print()
        print(f"wrote {n} error bands to {BANDS_FILE}")
    n_rows = len({c.scenario.row_id for c in report.comparisons})
    print()
    print(f"{n_rows} rows compared, {len(report.comparisons)} values, in {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
