"""vLLM V1's API server CPU per request, per prompt token, per streamed token and per
engine step, and what it adds to TTFT outside the engine core, measured on vLLM's own code: its CPU build (installed once per machine, as the opt-in
``-m vllm`` tests do) serving the tiny generated model.

    python bench/vllm_front_end_cost.py [--rounds 2] [--requests 300] [--out DIR]

The simulator's vLLM V1 front end (``sim/engine/frontend.py``) is a CPU queue with four
costs: ``api_intake_s`` per request (HTTP, validation, chat template),
``api_intake_per_token_s`` per prompt token (tokenization), ``api_stream_s`` per
streamed token (detokenization, the SSE chunk) and ``api_stream_per_step_s`` per engine
step that streams any (its outputs taken as one message). This script measures them on
the API server process of ``vllm serve`` (api-server-count 1: the process that answers
HTTP; the engine core and the worker are processes of their own): its CPU time, user
and system, every thread, ended ones too (the process's CPU-time clock, to the
nanosecond), over runs that differ in one thing each:

- ``short``: prompts of 16 tokens, 1 token out (completions API);
- ``long``: prompts of ``--long-tokens`` tokens, 1 token out;
- ``stream``: prompts of 16 tokens, ``--stream-tokens`` tokens out, streamed;
- ``chat``: as ``short``, through the chat API (its template);
- ``stream-wide``: as ``stream``, at 32 streams instead of 4.

Every request is streamed, as in the validation rows. The server's CPU while idle (its
timers) is measured for a few seconds before each round and taken off each run's count
(per wall second). Per request, the CPU is ``a + b * prompt tokens + c * streamed
tokens``; ``short``, ``long`` and ``stream`` give ``a``, ``b`` and ``c`` (three equations),
``chat`` the template's cost on top of ``a``; ``stream`` and ``stream-wide`` split ``c``
into a cost per token and one per engine step, each step emitting a token per stream
(the streaming runs go in whole waves: their request counts are multiples of their
streams). The prompts are text the client made of exactly that many tokens of the tiny
model's tokenizer (a byte-level BPE of 8,192 tokens, trained as real ones are), so
tokenization does the work it does for real text. Last in each round, one stream of
16-token prompts and one token out: the client's mean TTFT less vLLM's own queue +
prefill time (its ``/metrics`` histograms, from the engine core's timestamps) is what a
request spends outside the engine core.

What it cannot say: this machine (a shared 2-core VM; the engine's CPU worker spins on
a core) is not a GPU server's host, so the numbers are this host's. The ratios between
the costs, and their size against the simulator's, are what carry; ``--host-speed`` in
``sim run`` scales all four together.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from inferlab.engines.tinymodel import tiny_model
from inferlab.engines.vllm import VllmServer, hf_model, install_vllm
from inferlab.load.run import HttpTarget, RunConfig, run
from inferlab.load.schedules import ClosedLoop, LoadConfig
from inferlab.sim.engine.families import FAMILY_RULES, EngineFamily
from inferlab.workload.config import WorkloadConfig

FLAGS = ["--max-model-len", "2048", "--max-num-seqs", "64", "--max-num-batched-tokens", "4096", "--dtype", "bfloat16"]
IDLE_S = 4.0
WIDE = 32  # the streams of the second streaming run


def cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid``, every thread, ended ones too: its CPU-time clock
    (Linux's ``clock_getcpuclockid``: ``~pid << 3 | CPUCLOCK_SCHED``), to the nanosecond,
    where ``/proc/PID/stat`` counts 10 ms ticks."""
    return time.clock_gettime((~pid << 3) | 2)


@dataclass(frozen=True)
class Case:
    name: str
    api: str
    prompt_tokens: int
    output_tokens: int
    concurrency: int = 4


@dataclass(frozen=True)
class Measured:
    case: Case
    completed: int
    wall_s: float
    cpu_s: float  # the API server's, idle CPU taken off

    @property
    def per_request_s(self) -> float:
        return self.cpu_s / self.completed


def measure(server: VllmServer, case: Case, n: int, idle_rate: float, tokenizer: str, out: Path) -> Measured:
    assert server.pid is not None
    workload = WorkloadConfig(input_tokens=case.prompt_tokens, output_tokens=case.output_tokens, tokenizer=tokenizer)
    config = RunConfig(LoadConfig(ClosedLoop(case.concurrency), num_requests=n), workload, case.api,
                       out_dir=str(out / f"bench-{case.name}"), overwrite=True)
    before, t0 = cpu_s(server.pid), time.monotonic()
    # no /metrics reads during the run: rendering the page is the API server's CPU too
    target = HttpTarget(server.url, "tiny", preflight=False, workers=1, server_metrics=False)
    result = asyncio.run(run(config, target))
    wall = time.monotonic() - t0
    used = cpu_s(server.pid) - before - idle_rate * wall
    counts = result.summary.counts
    if counts.completed != n:
        raise SystemExit(f"{case.name}: {counts.completed} of {n} requests completed; see {out}/bench-{case.name}")
    return Measured(case, counts.completed, wall, used)


def engine_seconds(url: str) -> tuple[float, int]:
    """vLLM's own sum of queue and prefill seconds over its requests so far (from its
    engine core's timestamps: received, scheduled, first token out), and their count."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        page = r.read().decode()
    total, count = 0.0, 0
    for name in ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds"):
        sums = re.findall(rf"^{name}_sum(?:{{[^}}]*}})? (\S+)$", page, re.M)
        counts = re.findall(rf"^{name}_count(?:{{[^}}]*}})? (\S+)$", page, re.M)
        if not sums or not counts:
            raise SystemExit(f"vLLM's /metrics has no {name}")
        total += sum(map(float, sums))
        count = int(sum(map(float, counts)))
    return total, count


def outside_engine(server: VllmServer, n: int, tokenizer: str, out: Path) -> tuple[float, float]:
    """At one stream (16-token prompts, one token out): the client's mean TTFT and the
    part of it outside vLLM's engine core (TTFT less the engine's own queue + prefill)."""
    before, k0 = engine_seconds(server.url)
    workload = WorkloadConfig(input_tokens=16, output_tokens=1, tokenizer=tokenizer)
    config = RunConfig(LoadConfig(ClosedLoop(1), num_requests=n), workload, "completions",
                       out_dir=str(out / "bench-one"), overwrite=True)
    target = HttpTarget(server.url, "tiny", preflight=False, workers=1, server_metrics=False)
    summary = asyncio.run(run(config, target)).summary
    after, k1 = engine_seconds(server.url)
    if summary.ttft_ms is None or k1 - k0 != n:
        raise SystemExit(f"one stream: {k1 - k0} of {n} requests seen by vLLM's metrics")
    ttft = summary.ttft_ms.mean
    return ttft, ttft - (after - before) / n * 1e3


def idle_rate(pid: int) -> float:
    """The server's CPU seconds per wall second with nothing to do."""
    before, t0 = cpu_s(pid), time.monotonic()
    time.sleep(IDLE_S)
    return (cpu_s(pid) - before) / (time.monotonic() - t0)


def solve(short: Measured, long: Measured, stream: Measured) -> tuple[float, float, float]:
    """(per request, per prompt token, per streamed token) from the three runs."""
    (ls, os_), (ll, ol), (lt, ot) = ((m.case.prompt_tokens, m.case.output_tokens) for m in (short, long, stream))
    if os_ != ol or ls != lt:
        raise ValueError("short/long differ only in the prompt, short/stream only in the output")
    b = (long.per_request_s - short.per_request_s) / (ll - ls)
    c = (stream.per_request_s - short.per_request_s) / (ot - os_)
    a = short.per_request_s - b * ls - c * os_
    return a, b, c


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="rounds of the six runs (default 2)")
    p.add_argument("--requests", type=int, default=300, help="requests per run without long output (default 300)")
    p.add_argument("--long-tokens", type=int, default=1024, help="prompt tokens of the long run (default 1024)")
    p.add_argument("--stream-tokens", type=int, default=256, help="streamed tokens of the stream run (default 256)")
    p.add_argument("--out", default="vllm-front-end-cost")
    args = p.parse_args()
    if args.rounds < 1 or args.requests < 20:
        p.error("--rounds at least 1, --requests at least 20")
    if not 16 < args.long_tokens <= 1900 or not 1 < args.stream_tokens <= 1024:
        p.error("--long-tokens from 17 to 1900, --stream-tokens from 2 to 1024")
    cases = [Case("short", "completions", 16, 1), Case("long", "completions", args.long_tokens, 1),
             Case("stream", "completions", 16, args.stream_tokens), Case("chat", "chat", 16, 1),
             Case("stream-wide", "completions", 16, args.stream_tokens, WIDE)]
    # the long and stream runs' requests each take the engine longer: fewer of them
    def waves(n: int, streams: int) -> int:  # whole waves of a closed loop
        return max(streams, n // streams * streams)

    counts = {"short": args.requests, "chat": args.requests, "long": max(20, args.requests // 5),
              "stream": waves(args.requests // 8, 4), "stream-wide": waves(args.requests // 2, WIDE)}
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"bench/vllm_front_end_cost.py: cannot make --out {out}: {e.strerror or e}", file=sys.stderr)
        return 1
    tiny = tiny_model()
    rounds: list[dict[str, Measured]] = []
    latency: list[tuple[float, float]] = []
    with VllmServer(install_vllm(), hf_model(tiny), name="tiny", flags=FLAGS, log_path=out / "vllm.log",
                    kv_cache_gib=2) as server:
        assert server.pid is not None
        # one throwaway run of each, so that first-use costs (compiling, caches) are not counted
        for case in cases:
            measure(server, case, 20, 0.0, str(tiny.tokenizer), out)
        for k in range(args.rounds):
            idle = idle_rate(server.pid)
            got = {c.name: measure(server, c, counts[c.name], idle, str(tiny.tokenizer), out) for c in cases}
            ttft, outside = outside_engine(server, max(20, args.requests // 2), str(tiny.tokenizer), out)
            latency.append((ttft, outside))
            rounds.append(got)
            line = ", ".join(f"{m.case.name} {m.per_request_s * 1e3:.2f} ms/request" for m in got.values())
            print(f"round {k + 1}: idle {idle * 1e3:.1f} ms/s; {line}; one stream: TTFT {ttft:.2f} ms, "
                  f"{outside:.2f} ms of it outside the engine core", flush=True)
    results = []
    for got in rounds:
        a, b, c = solve(got["short"], got["long"], got["stream"])
        template = got["chat"].per_request_s - got["short"].per_request_s
        # per streamed token at 4 and at WIDE streams: a cost per token plus the API
        # server's cost per engine step shared by the tokens that step emitted (one per stream)
        wide = got["stream-wide"]
        c_wide = (wide.per_request_s - got["short"].per_request_s) / (wide.case.output_tokens - 1)
        k, w = got["stream"].case.concurrency, wide.case.concurrency
        per_step = (c - c_wide) / (1 / k - 1 / w)
        results.append({"intake_s": a, "intake_per_token_s": b, "stream_per_token_s": c, "chat_template_s": template,
                        "chat_intake_s": a + template,
                        f"stream_per_token_at_{w}_s": c_wide, "stream_token_only_s": c_wide - per_step / w,
                        "stream_per_step_s": per_step})
    (out / "runs.json").write_text(json.dumps({"rounds": [{k: asdict(m) for k, m in got.items()} for got in rounds],
                                               "fits": results, "one_stream_ttft_and_outside_ms": latency},
                                              indent=2) + "\n")
    eff = FAMILY_RULES[EngineFamily.VLLM].efficiencies
    shown = (("intake per request (completions)", "intake_s", 1e3, "ms", None),
             ("intake per prompt token", "intake_per_token_s", 1e6, "us", eff.api_intake_per_token_s),
             # (the simulator's at k streams: a token's cost and a k-th of a step's)
             ("streaming per token, 4 streams", "stream_per_token_s", 1e6, "us",
              eff.api_stream_s + eff.api_stream_per_step_s / 4),
             (f"streaming per token, {WIDE} streams", f"stream_per_token_at_{WIDE}_s", 1e6, "us",
              eff.api_stream_s + eff.api_stream_per_step_s / WIDE),
             ("  of which per token", "stream_token_only_s", 1e6, "us", eff.api_stream_s),
             ("  and per engine step", "stream_per_step_s", 1e6, "us", eff.api_stream_per_step_s),
             ("chat template, on top of intake", "chat_template_s", 1e3, "ms", None),
             ("intake per request (chat)", "chat_intake_s", 1e3, "ms", eff.api_intake_s))
    print(f"vLLM's API server, this host ({len(rounds)} rounds; median, range):")
    for label, key, scale, unit, sim in shown:
        vals = [r[key] * scale for r in results]
        med = statistics.median(vals)
        beside = "" if sim is None else f"   simulator (typical host): {sim * scale:.3g} {unit}"
        print(f"  {label:34s} {med:8.2f} {unit} ({min(vals):.2f} .. {max(vals):.2f}){beside}")
    outs = [o for _, o in latency]
    print(f"  TTFT outside the engine core, one stream {statistics.median(outs):8.2f} ms ({min(outs):.2f} .. "
          f"{max(outs):.2f})   simulator (typical host): {eff.api_overhead_s * 1e3:g} ms latency + the intake")
    return 0


if __name__ == "__main__":
    sys.exit(main())
