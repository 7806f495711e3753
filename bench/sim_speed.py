"""How fast the simulator runs, in virtual time and in real time.

1. Virtual time: 10,000 requests of ~1,000 input / ~250 output tokens, all arriving at
   t=0 (saturation: batches of 128+), through ``sim run``'s code path. Prints simulated
   requests per wall-clock second and the simulated-to-wall time ratio, side by side with
   the engine alone (no per-token records) so the cost of recording is visible.
2. SGLang with a small --chunked-prefill-size: the steady scheduler's sums against every
   decode visited each step, same records.
3. Real time: ``inferlab sim serve`` in a child process, ``inferlab bench`` at 256
   concurrent streams against it; reads the server's ``inferlab:token_emit_lag_seconds``
   histogram from /metrics (how late each step's tokens left the engine loop versus their
   simulated time) and the client's TTFT error against the server timeline.

    python bench/sim_speed.py            # full
    python bench/sim_speed.py --quick    # 2,000 requests, 64 streams
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
import urllib.request

from inferlab.load.schedules import ClosedLoop, LoadConfig, OpenLoop
from inferlab.load.virtual import serve_timelines, simulate
from inferlab.results.summary import summarize
from inferlab.results.telemetry import emit_lag
from inferlab.sim.engine.engine import Engine, EngineConfig
from inferlab.sim.server.launch import ChildServer
from inferlab.workload.builtin_prompts import SimPromptBuilder
from inferlab.workload.builtin_tokenizer import BuiltinTokenizer
from inferlab.workload.config import WorkloadConfig


def virtual(n: int) -> None:
    cfg = EngineConfig(enforce_eager=False)
    wl = WorkloadConfig(input_tokens=1000, output_tokens=250)

    def prompts() -> SimPromptBuilder:  # as `sim run` builds them for the completions API
        return SimPromptBuilder(BuiltinTokenizer())

    t0 = time.perf_counter()
    workload = wl.build(0, "completions", builder=prompts())
    records = simulate(Engine(cfg), LoadConfig(OpenLoop(math.inf), num_requests=n), workload)
    t1 = time.perf_counter()
    s = summarize(records)
    t2 = time.perf_counter()
    wall = t2 - t0

    specs = wl.build(0, "completions", builder=prompts())
    arrivals = [(0.0, str(i), list(next(specs).prompt), 250) for i in range(n)]
    t3 = time.perf_counter()
    serve_timelines(Engine(cfg), arrivals)
    engine_only = time.perf_counter() - t3

    print(f"virtual time, {n:,} requests x (1,000 in / 250 out), all at t=0, Qwen2.5-7B on H100")
    print(f"  sim run path (records + metrics): {wall:6.2f} s wall  {n / wall:8.0f} req/s  "
          f"simulated {s.duration_s:.0f} s  -> {s.duration_s / wall:5.1f}x faster than real time")
    print(f"    of which simulate {t1 - t0:.2f} s, summarize {t2 - t1:.2f} s")
    print(f"  engine alone (serve_timelines):  {engine_only:6.2f} s wall  {n / engine_only:8.0f} req/s")
    print(f"  ratio sim-run / engine-alone: {wall / engine_only:.2f}")

    # what a user waits for: the command itself, start-up and results files included
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "inferlab", "sim", "run", "--rate", "inf", "--num-requests", str(n),
               "--input-tokens", "1000", "--output-tokens", "250", "--out", out]
        t4 = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True, timeout=600)
        cli = time.perf_counter() - t4
    print(f"  `inferlab sim run --out DIR` command: {cli:6.2f} s wall  {n / cli:8.0f} req/s  "
          f"(ratio to engine alone {cli / engine_only:.2f})")


def sglang_small_budget(users: int, n: int) -> None:
    """SGLang with a prompt-chunk size (--chunked-prefill-size 512) far below its running
    decodes: every decode runs each decode step, outside the budget. The engine's steady
    decodes (kept as sums) against every decode visited each step (``steady_decodes``
    off: the reference's pass, what the steady scheduler fell back to before it knew
    that decodes outside the budget need no order); the same records either way."""
    cfg = EngineConfig(engine_family="sglang", max_num_batched_tokens=512)
    wl = WorkloadConfig(input_tokens=200, output_tokens=1000)
    times, outs = {}, {}
    for steady in (True, False):
        engine = Engine(cfg)
        engine.steady_decodes = steady
        workload = wl.build(0, "completions", builder=SimPromptBuilder(BuiltinTokenizer()))
        t0 = time.perf_counter()
        records = simulate(engine, LoadConfig(ClosedLoop(users), num_requests=n), workload)
        times[steady] = time.perf_counter() - t0
        outs[steady] = [(r.send_ns, r.ttfb_ns, r.end_ns, len(r.content_ns)) for r in records]
    same = "the same records" if outs[True] == outs[False] else "RECORDS DIFFER"
    print(f"\nSGLang, --chunked-prefill-size 512, {users:,} users, {n:,} requests of 200 in / 1,000 out ({same})")
    print(f"  steady decodes: {times[True]:6.2f} s wall; every decode visited: {times[False]:6.2f} s wall; "
          f"ratio {times[False] / times[True]:.1f}x")


def realtime(streams: int, per_stream: int) -> None:
    with ChildServer() as server:
        cmd = [sys.executable, "-m", "inferlab", "bench", "--url", server.url, "-c", str(streams),
               "-n", str(streams * per_stream), "--input-tokens", "200", "--output-tokens", "200",
               "--api", "completions", "--json"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        if p.returncode != 0:
            print(p.stderr)
            return
        s = json.loads(p.stdout)
        metrics = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
    try:
        buckets = emit_lag(metrics)
    except ValueError as e:
        sys.exit(str(e))
    total = buckets[math.inf]
    print(f"\nreal time, {streams} concurrent streams, 200 in / 200 out, bench in another process")
    print("  token emit lag (wall - simulated), share of steps at or under:")
    for le, count in buckets.items():
        print(f"    <= {le * 1e3:6.1f} ms: {count / total:6.1%}")
    err = s["server_timeline"]["ttft_error_ms"]
    print(f"  client TTFT - server TTFT: p50 {err['p50']:.2f} ms, p99 {err['p99']:.2f} ms")
    print(f"  TPOT p50 client {s['tpot_ms']['p50']:.2f} ms; output {s['output_token_throughput_tps']:.0f} tok/s")


def machine_speed() -> None:
    """A plain Python loop, timed: shared machines drift 2-3x in speed from day to day,
    so absolute requests per second only compare against the same loop's time."""
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        total = 0
        for i in range(10_000_000):
            total += i
        best = min(best, time.perf_counter() - t0)
    print(f"machine: a 10-million-step Python loop takes {best:.2f} s (best of 3)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    machine_speed()
    virtual(2000 if a.quick else 10_000)
    sglang_small_budget(1000 if a.quick else 3000, 4000 if a.quick else 12_000)
    realtime(64 if a.quick else 256, 1 if a.quick else 2)


if __name__ == "__main__":
    main()
