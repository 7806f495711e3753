"""How often ``inferlab compare`` calls a difference "beyond noise" when there is none,
and when there is one.

Runs each configuration with many seeds (``sim run``, virtual time: the seed changes the
drawn lengths and arrivals, and nothing else) and compares every pair of them: each
"beyond noise", and each Mann–Whitney p < 0.05, is a false alarm. Then compares runs
that differ, at the same seeds, and counts how often each metric is flagged, in the direction it moves on average:

- a 10 % slower GPU (``--efficiencies``: every achieved share of peak × 0.9) under the
  open loop of 20 req/s;
- a token budget of 512 against 8192 on 6,000-token prompts (16 users).

Prints markdown tables (docs/report.md has them). The runs are kept in ``--runs`` and
reused when there, so the same runs can be measured by another version of the code
(``PYTHONPATH=/path/to/other/src python bench/compare_noise.py --runs DIR``).

    python bench/compare_noise.py [--seeds 40] [--requests 200 1000 2000] [--runs DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from inferlab.results.compare import (
    DISTRIBUTIONS,
    FAILED,
    METRICS,
    Estimate,
    compare_pair,
    distribution_tests,
    estimate,
)
from inferlab.results.sources import Run, load_run
from inferlab.sim.engine.steptime import DEFAULT_EFFICIENCIES

#: the metrics measured here: every one but the failed share (nothing fails in these runs,
#: so it would add a metric that never alarms to the "any metric" rate)
MEASURED = tuple(m for m in METRICS if m is not FAILED)

CONFIGS = {
    "closed loop, 16 users": ["-c", "16", "--input-tokens", "uniform:500:1500", "--output-tokens", "uniform:32:128"],
    "open loop, 10 req/s": ["--rate", "10", "--input-tokens", "lognormal:800:0.6", "--output-tokens", "uniform:32:128"],
    "open loop, 20 req/s": ["--rate", "20", "--input-tokens", "lognormal:800:0.4", "--output-tokens", "uniform:64:256"],
}
SLOWER = {name: 0.9 * getattr(DEFAULT_EFFICIENCIES, name)  # DEFAULT_EFFICIENCIES' × 0.9
          for name in ("gemm_compute", "weight_stream", "attention_compute", "kv_stream", "activation_stream")}
LONG = ["-c", "16", "--input-tokens", "6000", "--output-tokens", "64", "--max-num-seqs", "256"]


def sim(out: Path, n: int, args: list[str]) -> Path:
    if not (out / "summary.json").exists():
        subprocess.run([sys.executable, "-m", "inferlab", "sim", "run", "--no-history", "--overwrite", "-n", str(n), *args,
                        "-o", str(out)], check=True, stdout=subprocess.DEVNULL)
    return out


def sims(jobs: int, todo: Sequence[tuple[Path, int, list[str]]]) -> list[Run]:
    with ThreadPoolExecutor(jobs) as pool:
        return [load_run(p) for p in pool.map(lambda t: sim(*t), todo)]


def pct(k: int, n: int) -> str:
    return f"{100 * k / n:.0f}" if n else "—"


def false_alarms(runs: list[Run], pairs: str) -> tuple[int, Counter[str], int, Counter[str]]:
    """(pairs, per metric how many pairs were beyond noise, pairs with any, per
    distribution how many pairs had Mann–Whitney p < 0.05)."""
    est: list[dict[str, Estimate]] = [{m.name: estimate(m, [r]) for m in MEASURED} for r in runs]
    chosen = (list(itertools.combinations(range(len(runs)), 2)) if pairs == "all"
              else [(i, i + 1) for i in range(0, len(runs) - 1, 2)])
    flagged: Counter[str] = Counter()
    moved: Counter[str] = Counter()
    anyone = 0
    for i, j in chosen:
        hits = [m.name for m in MEASURED if compare_pair(m, est[i][m.name], est[j][m.name]).verdict == "beyond noise"]
        flagged.update(hits)
        anyone += bool(hits)
        moved.update(k for k, p in distribution_tests([runs[i]], [runs[j]]).items() if p is not None and p < 0.05)
    return len(chosen), flagged, anyone, moved


def detections(a: list[Run], b: list[Run]) -> tuple[Counter[str], Counter[str]]:
    """Per metric how many of the pairs (a[i], b[i]) were beyond noise in the direction
    the change takes on average over the pairs (the truth, as near as these runs know
    it); per distribution how many had Mann–Whitney p < 0.05."""
    deltas = [[compare_pair(m, estimate(m, [x]), estimate(m, [y])) for m in MEASURED] for x, y in zip(a, b, strict=True)]
    found: Counter[str] = Counter()
    for i, m in enumerate(MEASURED):
        mean = sum(ds[i].delta or 0.0 for ds in deltas) / len(deltas)
        found[m.name] = sum(1 for ds in deltas if ds[i].verdict == "beyond noise" and (ds[i].delta or 0.0) * mean > 0)
    moved: Counter[str] = Counter()
    for x, y in zip(a, b, strict=True):
        moved.update(k for k, p in distribution_tests([x], [y]).items() if p is not None and p < 0.05)
    return found, moved


def header(first: str) -> str:
    cols = [first, "requests", "pairs", *(m.name for m in MEASURED), "any metric",
            *(f"MW {d.removesuffix('_ms')}" for d in DISTRIBUTIONS)]
    return "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--requests", type=int, nargs="+", default=[200, 1000, 2000])
    ap.add_argument("--pairs", choices=("all", "disjoint"), default="all",
                    help="every pair of seeds (default), or seeds 1-2, 3-4, ... (independent pairs)")
    ap.add_argument("--configs", nargs="+", choices=("closed", "open10", "open20"), default=["closed", "open10", "open20"])
    ap.add_argument("--detection-seeds", type=int, default=20, help="seeds of each real difference")
    ap.add_argument("--runs", type=Path, help="keep the runs here, and reuse those already there")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = args.runs or Path(tmp)
        slower = d / "slower.json"
        d.mkdir(parents=True, exist_ok=True)
        slower.write_text(json.dumps(SLOWER))
        keys = dict(zip(("closed", "open10", "open20"), CONFIGS, strict=True))
        print("Same configuration, seeds differ: % of seed pairs called beyond noise (false alarms), "
              "and % with Mann–Whitney p < 0.05\n")
        print(header("configuration"))
        for key in args.configs:
            flags = CONFIGS[keys[key]]
            for n in args.requests:
                runs = sims(args.jobs, [(d / f"{key}_{n}" / f"s{s}", n, [*flags, "--seed", str(s)]) for s in range(1, args.seeds + 1)])
                pairs, flagged, anyone, moved = false_alarms(runs, args.pairs)
                print(f"| {keys[key]} | {n:,} | {pairs} | " + " | ".join(pct(flagged[m.name], pairs) for m in MEASURED)
                      + f" | {pct(anyone, pairs)} | " + " | ".join(pct(moved[k], pairs) for k in DISTRIBUTIONS) + " |", flush=True)
        k = args.detection_seeds
        print("\nA real difference at the same seeds: % of pairs called beyond noise in the direction of the "
              "average change (the slower GPU: worse; the small budget: worse TTFT, better TPOT), "
              "and % with Mann–Whitney p < 0.05\n")
        print(header("difference"))
        for n in args.requests:
            flags = CONFIGS[keys["open20"]]
            base = sims(args.jobs, [(d / f"open20_{n}" / f"s{s}", n, [*flags, "--seed", str(s)]) for s in range(1, k + 1)])
            slow = sims(args.jobs, [(d / f"open20slow_{n}" / f"s{s}", n, [*flags, "--seed", str(s), "--efficiencies", str(slower)])
                                    for s in range(1, k + 1)])
            found, moved = detections(base, slow)
            print(f"| 10 % slower GPU, open loop 20 req/s | {n:,} | {k} | " + " | ".join(pct(found[m.name], k) for m in MEASURED)
                  + " | — | " + " | ".join(pct(moved[x], k) for x in DISTRIBUTIONS) + " |", flush=True)
        for n in args.requests:
            kb = max(2, k // 4)
            wide = sims(args.jobs, [(d / f"b8192_{n}" / f"s{s}", n, [*LONG, "--seed", str(s), "--max-num-batched-tokens", "8192"])
                                    for s in range(1, kb + 1)])
            small = sims(args.jobs, [(d / f"b512_{n}" / f"s{s}", n, [*LONG, "--seed", str(s), "--max-num-batched-tokens", "512"])
                                     for s in range(1, kb + 1)])
            found, moved = detections(wide, small)
            print(f"| token budget 512 vs 8192, 6,000-token prompts | {n:,} | {kb} | "
                  + " | ".join(pct(found[m.name], kb) for m in MEASURED)
                  + " | — | " + " | ".join(pct(moved[x], kb) for x in DISTRIBUTIONS) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
