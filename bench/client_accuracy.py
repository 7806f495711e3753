"""How far the client's TTFT is from the server's own, against the simulated server.

The simulator reports each request's engine timeline (``inferlab_timeline``), so the
client's measurement error is visible directly: client TTFT − server TTFT = network,
both HTTP stacks and our parsing. Runs ``inferlab bench`` at several concurrencies
from this process against (a) the server ``bench`` starts by default (a child process)
and (b) the same server in a thread of this process, side by side, and prints p50/p99
of the error and their ratio.

    python bench/client_accuracy.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio

from inferlab import BenchConfig, ClosedLoop, LoadConfig, Summary, WorkloadConfig, bench_async
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import ChildServer, EmbeddedServer


def in_process(url: str, c: int, n: int) -> Summary:
    cfg = BenchConfig(load=LoadConfig(ClosedLoop(c), num_requests=n), workload=WorkloadConfig())
    return asyncio.run(bench_async(cfg, url)).summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    levels = [1, 8, 32] if a.quick else [1, 8, 32, 128]
    rows = []
    with ChildServer() as child:
        for c in levels:
            rows.append(("server in child process", c, in_process(child.url, c, max(32, 2 * c))))
    with EmbeddedServer(ServerConfig(engine=EngineConfig(enforce_eager=True))) as thread:
        for c in levels:
            rows.append(("server in a thread of the client", c, in_process(thread.url, c, max(32, 2 * c))))
    print(f"{'setup':34} {'conc':>4} {'server TTFT p50':>16} {'error p50':>10} {'error p99':>10}")
    by_key = {}
    for setup, c, s in rows:
        sv = s.server_timeline
        assert sv is not None  # (the simulated server sends its timeline)
        err = sv.ttft_error_ms
        by_key[(setup, c)] = err
        print(f"{setup:34} {c:4d} {sv.server_ttft_ms.p50:13.2f} ms {err.p50:7.2f} ms {err.p99:7.2f} ms")
    print("\nerror p50 ratio, thread / child process:")
    for c in levels:
        t = by_key[("server in a thread of the client", c)].p50
        ch = by_key[("server in child process", c)].p50
        print(f"  concurrency {c:4d}: {t / ch:5.2f}x")


if __name__ == "__main__":
    main()
