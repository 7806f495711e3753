"""What the gateway adds: TTFT and CPU per relayed chunk, through ``inferlab gateway``
versus straight to the engine, side by side in one run.

One ``inferlab sim serve`` is the engine (a child process; a small model on an H200 by
default, so that the engine's own queueing does not hide the gateway's cost); ``inferlab gateway`` runs in
front of it in a child process of its own (admission by tokens, cache off: every request
goes upstream). The load is ``inferlab bench`` itself (closed loop, ``-c`` users,
64-token answers, fresh 128-token prompts, no preflight), run alternately straight at
the engine and through the gateway, ``--rounds`` times each; medians are reported.

- added TTFT: TTFT p50 through the gateway minus TTFT p50 direct (ms), per round;
- CPU per 1,000 relayed chunks: the gateway process's user + system CPU time
  (``/proc/PID/stat``) over its phase, divided by the content chunks it relayed (its own
  ``/metrics``: one TTFT sample plus one ITL sample per content chunk);
- req/s through the gateway and direct, and their ratio.

The issue's targets (added TTFT p50 < 1 ms at concurrency 32; CPU <= 60 ms per 1,000
relayed chunks; >= 200 req/s of 64-token streams) are printed beside the numbers. The
machine is shared: read the ratios and the spread between rounds, not one number.

    python bench/gateway_overhead.py            # c=32, 600 requests a phase, 3 rounds
    python bench/gateway_overhead.py --quick    # 200 requests a phase, 2 rounds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from inferlab.sim.server.launch import ChildServer

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def relayed_chunks(url: str) -> float:
    """Content chunks the gateway has relayed: TTFT samples + ITL samples."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    n = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in ("gen_ai_server_time_to_first_token_seconds_count", "gen_ai_server_inter_token_latency_seconds_count"):
                n += s.value
    return n


MODEL = "Qwen2.5-0.5B-Instruct"


def bench(url: str, n: int, c: int) -> dict[str, float]:
    cmd = [sys.executable, "-m", "inferlab", "bench", "--url", url, "-n", str(n), "-c", str(c),
           "--input-tokens", "128", "--output-tokens", "64", "--no-preflight", "--json", "--workers", "1", "--model", MODEL]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True).stdout
    s = json.loads(out)
    return {"ttft_p50_ms": s["ttft_ms"]["p50"], "rps": s["request_throughput_rps"], "failed": s["counts"]["failed"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("-c", "--concurrency", type=int, default=32)
    ap.add_argument("-n", "--requests", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--model", default="Qwen2.5-0.5B-Instruct", help="the simulated engine's model (small: a fast engine shows the gateway's own cost)")
    args = ap.parse_args()
    n = args.requests or (200 if args.quick else 600)
    global MODEL
    MODEL = args.model
    rounds = args.rounds or (2 if args.quick else 3)
    engine = ChildServer(["--model", args.model, "--gpu", "H200"])
    gw = subprocess.Popen([sys.executable, "-m", "inferlab", "gateway", "--upstream", engine.url, "--port", "0",
                           "--announce"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert gw.stdout is not None
        gw_url = gw.stdout.readline().strip()
        if not gw_url.startswith("http://"):
            raise SystemExit(f"the gateway did not start: {gw.stderr.read() if gw.stderr else ''}")
        rows = []
        bench(engine.url, 50, args.concurrency)  # warm both paths (connections, caches)
        bench(gw_url, 50, args.concurrency)
        for r in range(rounds):
            direct = bench(engine.url, n, args.concurrency)
            chunks0, cpu0 = relayed_chunks(gw_url), cpu_s(gw.pid)
            via = bench(gw_url, n, args.concurrency)
            cpu1, chunks1 = cpu_s(gw.pid), relayed_chunks(gw_url)
            chunks = chunks1 - chunks0
            rows.append({
                "added_ttft_ms": via["ttft_p50_ms"] - direct["ttft_p50_ms"],
                "cpu_ms_per_1k_chunks": (cpu1 - cpu0) * 1e3 / chunks * 1000 if chunks else float("nan"),
                "rps_direct": direct["rps"], "rps_gateway": via["rps"],
                "ttft_direct": direct["ttft_p50_ms"], "ttft_gateway": via["ttft_p50_ms"],
                "failed": direct["failed"] + via["failed"],
            })
            x = rows[-1]
            print(f"round {r + 1}: TTFT p50 direct {x['ttft_direct']:.2f} ms, via gateway {x['ttft_gateway']:.2f} ms "
                  f"(added {x['added_ttft_ms']:+.2f} ms); gateway CPU {x['cpu_ms_per_1k_chunks']:.0f} ms per 1,000 chunks "
                  f"({chunks:.0f} chunks); req/s direct {x['rps_direct']:.0f}, via gateway {x['rps_gateway']:.0f}; "
                  f"failed {x['failed']}", flush=True)
    finally:
        gw.terminate()
        gw.wait(timeout=10)
        engine.close()

    def med(k: str) -> float:
        return statistics.median(x[k] for x in rows)

    print(f"\nmedian of {rounds} rounds, c={args.concurrency}, {n} requests of 64 tokens a phase:")
    print(f"  added TTFT p50     {med('added_ttft_ms'):+.2f} ms   (target < 1 ms)")
    print(f"  gateway CPU        {med('cpu_ms_per_1k_chunks'):.0f} ms per 1,000 relayed chunks   (target <= 60)")
    print(f"  req/s via gateway  {med('rps_gateway'):.0f}   direct {med('rps_direct'):.0f}   ratio {med('rps_gateway') / med('rps_direct'):.2f}"
          "   (target >= 200 through the gateway; direct is the engine's own limit)")
    print("  LiteLLM: not measured (not installed here)")


if __name__ == "__main__":
    main()
