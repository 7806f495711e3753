"""What a --trace-start/--trace-end window of a large trace costs: the streamed read
(``TraceConfig.rows``), and with ``--trace-in-order`` (it stops at the window's end),
against the full read it replaced (every row read, sorted, then sliced), side by side.

Writes an Azure-format CSV (the 2024 week trace's timestamps, ~45 requests/s: 2.5 million
rows is about 15 hours) in a temporary folder, then times each read in a child process
of its own, for a one-minute window at the start of the trace and one at its end, and
reads the child's peak resident memory (``ru_maxrss``) less what it held before reading.
Each round runs the three reads in another order.

    python bench/trace_window.py                  # 2.5 million rows, 2 rounds
    python bench/trace_window.py --rows 300000 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

#: one read in a child: prints seconds, rows kept and peak memory above the start (MB)
CHILD = """
import json, math, resource, sys, time
from inferlab.workload.traces import TraceConfig, _every_row

how, path, lo, hi = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
if how == "full":  # as TraceConfig.rows was: every row, sorted, then the window
    every = sorted(_every_row(path, None, 0), key=lambda r: r.arrival_s)
    t0 = every[0].arrival_s
    kept = [r for r in every if not r.dropped and lo <= r.arrival_s - t0 < hi]
else:
    kept = TraceConfig(path, start_s=lo, end_s=hi, in_order=how == "in-order").rows()
s = time.perf_counter() - t
peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"s": s, "kept": len(kept), "mb": (peak_kb - before_kb) / 1024}))
"""


def write_azure(path: Path, rows: int, rate_rps: float, seed: int = 0) -> float:
    """An Azure 2024-style CSV of ``rows`` Poisson arrivals; returns its span in s."""
    rng = random.Random(seed)
    start = datetime(2024, 5, 10, tzinfo=UTC)
    t = last = 0.0
    with open(path, "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for _ in range(rows):
            at = start + timedelta(seconds=t)
            f.write(f"{at:%Y-%m-%d %H:%M:%S.%f}+00:00,{rng.randint(50, 8000)},{rng.randint(1, 800)}\n")
            last, t = t, t + rng.expovariate(rate_rps)
    return last


def read_once(how: str, path: Path, lo: float, hi: float) -> dict[str, float]:
    p = subprocess.run([sys.executable, "-c", CHILD, how, str(path), repr(lo), repr(hi)],
                       capture_output=True, text=True, check=True)
    return json.loads(p.stdout)  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2_500_000)
    ap.add_argument("--rate", type=float, default=45.0, help="requests per second in the trace")
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "azure.csv"
        span_s = write_azure(path, args.rows, args.rate)
        print(f"{args.rows:,} rows, {path.stat().st_size / 1e6:.0f} MB, spanning {span_s / 3600:.1f} h; "
              f"windows of {args.window_s:g} s; {args.rounds} round(s), each read in a child process\n")
        windows = {"start": (0.0, args.window_s), "end": (span_s - args.window_s, span_s + 1)}
        print(f"{'window':7} {'read':9} {'s (each round)':>22} {'peak MB':>9} {'rows':>6}")
        for name, (lo, hi) in windows.items():
            got: dict[str, list[dict[str, float]]] = {"full": [], "streamed": [], "in-order": []}
            for i in range(args.rounds):
                for how in list(got)[i % 3:] + list(got)[:i % 3]:
                    got[how].append(read_once(how, path, lo, hi))
            for how, runs in got.items():
                secs = " / ".join(f"{r['s']:.2f}" for r in runs)
                print(f"{name:7} {how:9} {secs:>22} {max(r['mb'] for r in runs):9.1f} {int(runs[0]['kept']):6}")
            full = got["full"]
            for how in ("streamed", "in-order"):
                assert got[how][0]["kept"] == full[0]["kept"], got
                t_ratio = statistics.median(r["s"] for r in full) / statistics.median(r["s"] for r in got[how])
                m_ratio = max(r["mb"] for r in full) / max(0.1, max(r["mb"] for r in got[how]))  # (ru_maxrss: KB)
                print(f"{name:7} full/{how}: time {t_ratio:.2f}x, peak memory {m_ratio:.0f}x")
            print()

if __name__ == "__main__":
    main()
