"""A sweep in virtual time against the same sweep over HTTP, side by side.

1. Virtual time: the README's sweep (Qwen2.5-7B on L40S, 2,048 → 256 tokens, users
   doubling 1 → 256 until saturation). Prints the wall time, the virtual time its points
   covered and their ratio, and where it stopped.
2. HTTP against ``inferlab sim serve`` (a child process, real time) at two of those
   loads, with the virtual sweep's engine given to the server: the wall time of each,
   the ratio, and how far throughput and TTFT p50 differ at the shared points.

    python bench/sweep_speed.py
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from inferlab.sim.server.launch import ChildServer

ENGINE = ["--max-num-seqs", "16", "--gpu", "L40S", "--max-model-len", "4096", "--max-num-batched-tokens", "8192", "--enforce-eager"]
WORKLOAD = ["--input-tokens", "256", "--output-tokens", "8", "--api", "completions"]


def sweep(args: list[str], out: Path) -> tuple[float, dict[str, Any]]:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "inferlab", "sweep", *args, "-o", str(out), "--json"],
                   check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t
    return wall, json.loads((out / "sweep.json").read_text())


def done(index: dict[str, Any]) -> dict[float, dict[str, Any]]:
    return {p["params"][index["load_axis"]]: p["headline"] for p in index["points"] if p["status"] == "done"}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()  # (no options: --help, or a refusal)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        wall, ix = sweep(["--gpu", "L40S", "--input-tokens", "2048", "--output-tokens", "256"], root / "readme")
        virtual = sum(h["duration_s"] for h in done(ix).values())
        (g,) = ix["groups"]
        print(f"1. README sweep in virtual time: {len(done(ix))} points, {wall:.1f} s wall for {virtual:,.0f} s "
              f"simulated ({virtual / wall:,.0f}x); stopped: {g['stopped']}")

        vwall, v = sweep(["-c", "1,2,4,8,16,32,64,128,256", *ENGINE, *WORKLOAD], root / "virtual")
        with ChildServer(["--max-num-seqs", "16", "--gpu", "L40S"]) as server:
            hwall, h = sweep(["--url", server.url, "-c", "2,4", *WORKLOAD], root / "http")
        vd, hd = done(v), done(h)
        print(f"2. virtual sweep ({len(vd)} points, stopped at c={v['groups'][0]['stopped']['at']}): {vwall:.1f} s wall; "
              f"HTTP sweep (c=2,4): {hwall:.1f} s wall ({hwall / vwall:.1f}x the virtual sweep's)")
        print("   c   out tok/s http/virtual   TTFT p50 ms http/virtual")
        for c in sorted(hd):
            a, b = hd[c], vd[c]
            print(f"   {c:<3} {a['output_tok_s']:8.0f} / {b['output_tok_s']:<8.0f} ({a['output_tok_s'] / b['output_tok_s'] - 1:+.1%})"
                  f"   {a['ttft_p50_ms']:6.1f} / {b['ttft_p50_ms']:<6.1f} ({a['ttft_p50_ms'] / b['ttft_p50_ms'] - 1:+.1%})")


if __name__ == "__main__":
    main()
