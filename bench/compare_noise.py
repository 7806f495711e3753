"""How often ``inferlab compare`` calls a difference "beyond noise" when there is none,
and when there is one.

Runs one configuration with many seeds (``sim run``, virtual time: the seed changes the
drawn lengths and arrivals) and compares each run with the next: every "beyond noise"
there is a false alarm. Then compares runs that differ (a token budget of 512 against
8192 on 6,000-token prompts) and counts how often TTFT is flagged.

    python bench/compare_noise.py [--seeds 20] [--requests 200]
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from inferlab.results.compare import FAILED, METRICS, compare
from inferlab.results.sources import load_run

#: the metrics measured here: every one but the failed share (nothing fails in these runs,
#: so it would add a metric that never alarms to the "all metrics" rate)
MEASURED = tuple(m for m in METRICS if m is not FAILED)

CONFIGS = {
    "closed loop, 16 users": ["-c", "16", "--input-tokens", "uniform:500:1500", "--output-tokens", "uniform:32:128"],
    "open loop, 10 req/s": ["--rate", "10", "--input-tokens", "lognormal:800:0.6", "--output-tokens", "uniform:32:128"],
}


def sim(out: Path, n: int, args: list[str]) -> None:
    subprocess.run([sys.executable, "-m", "inferlab", "sim", "run", "--no-history", "-n", str(n), *args, "-o", str(out)],
                   check=True, stdout=subprocess.DEVNULL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for name, flags in CONFIGS.items():
            runs = []
            for seed in range(args.seeds):
                sim(d / f"{name[:4]}{seed}", args.requests, [*flags, "--seed", str(seed)])
                runs.append(load_run(d / f"{name[:4]}{seed}"))
            flagged: Counter[str] = Counter()
            unknown: Counter[str] = Counter()
            pairs = len(runs) - 1
            for a, b in itertools.pairwise(runs):
                for delta in compare([a], [b], MEASURED):
                    flagged[delta.metric.name] += delta.verdict == "beyond noise"
                    unknown[delta.metric.name] += delta.verdict == "noise unknown"
            print(f"same configuration ({name}, {args.requests} requests), {pairs} pairs of seeds: share called beyond noise (false alarms)")
            for m in MEASURED:
                print(f"  {m.name:<14}{flagged[m.name] / pairs:6.0%}" + (f"   (noise unknown in {unknown[m.name]})" if unknown[m.name] else ""))
            total = sum(flagged.values()) / (pairs * len(MEASURED))
            print(f"  {'all metrics':<14}{total:6.0%}")
        hits: Counter[str] = Counter()
        k = max(2, args.seeds // 4)
        for seed in range(k):
            long = ["-c", "16", "--input-tokens", "6000", "--output-tokens", "64", "--max-num-seqs", "256", "--seed", str(seed)]
            sim(d / f"b8192_{seed}", args.requests, [*long, "--max-num-batched-tokens", "8192"])
            sim(d / f"b512_{seed}", args.requests, [*long, "--max-num-batched-tokens", "512"])
            for delta in compare([load_run(d / f"b8192_{seed}")], [load_run(d / f"b512_{seed}")], MEASURED):
                hits[delta.metric.name] += delta.verdict == "beyond noise"
        print(f"a real difference (--max-num-batched-tokens 512 vs 8192, 6,000-token prompts), {k} seeds: share called beyond noise")
        for m in MEASURED:
            print(f"  {m.name:<14}{hits[m.name] / k:6.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
