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
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from inferlab.sim.server.launch import ChildServer

#: The fast engine's answer: a role chunk, 64 content chunks ``--gap-ms`` apart, the
#: finish chunk, the usage chunk if asked, [DONE] (vLLM's keys and sizes).
CHUNKS = 64


def _fast_engine(port_out: Any, gap_s: float) -> None:
    import asyncio

    from aiohttp import web

    from inferlab.openai.response import Completion
    from inferlab.openai.sse import DONE_EVENT, encode_json

    c = Completion("chatcmpl-0f3c8a4e5b2d4c7e9a1b6d2f8e0c4a17", True, 1733000000, "fast")
    head = encode_json(c.chunk([c.choice("", None, role=True)]))
    token = encode_json(c.chunk([c.choice(" lighthouse", None)]))
    tail = encode_json(c.chunk([c.choice("", "length")]))
    usage = encode_json(c.chunk([], usage={"prompt_tokens": 128, "completion_tokens": CHUNKS, "total_tokens": 128 + CHUNKS}))

    async def chat(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(head)
        for _ in range(CHUNKS):
            await asyncio.sleep(gap_s)
            await resp.write(token)
        await resp.write(tail + (usage if (body.get("stream_options") or {}).get("include_usage") else b"") + DONE_EVENT)
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fast", "object": "model"}]})

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port_out.put(runner.addresses[0][1])
        await asyncio.Event().wait()

    asyncio.run(main())

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int, part: slice = slice(11, 13)) -> float:
    """CPU seconds of process ``pid`` so far: user + system (``part``: 11 user, 12 system)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[part]) / TICKS_PER_S


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


#: LiteLLM's proxy refuses to start without a master key.
LITELLM_KEY = "sk-inferlab-bench-0123456789abcdef"


def bench(url: str, model: str, n: int, c: int, api_key: str | None = None) -> dict[str, float]:
    """One ``inferlab bench`` run: TTFT p50 (ms), req/s, failures."""
    cmd = [sys.executable, "-m", "inferlab", "bench", "--url", url, "-n", str(n), "-c", str(c), "--model", model,
           "--input-tokens", "128", "--output-tokens", str(CHUNKS), "--no-preflight", "--json", "--workers", "1"]
    if api_key:
        cmd += ["--api-key", api_key]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True).stdout
    s = json.loads(out)
    return {"ttft": s["ttft_ms"]["p50"], "rps": s["request_throughput_rps"], "failed": s["counts"]["failed"]}


def start_engine(kind: str, sim_model: str, gap_ms: float) -> tuple[str, str, Any]:
    """(its URL, the model to ask for, a close function)."""
    if kind == "sim":
        sim = ChildServer(["--model", sim_model, "--gpu", "H200"])
        return sim.url, sim_model, sim.close
    ctx = mp.get_context("spawn")
    port_out = ctx.Queue()
    proc = ctx.Process(target=_fast_engine, args=(port_out, gap_ms / 1e3), daemon=True)
    proc.start()
    return f"http://127.0.0.1:{port_out.get(timeout=30)}", "fast", proc.terminate


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its live children (LiteLLM's proxy may fork workers)."""
    total = cpu_s(pid)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                total += (int(fields[11]) + int(fields[12])) / TICKS_PER_S
    return total


def start_litellm(exe: str, engine_url: str, model: str, workdir: str) -> tuple[str, subprocess.Popen[str]]:
    """LiteLLM's proxy (``exe``: the ``litellm`` command of a separate environment) in
    front of the engine, on a free port."""
    import socket
    import time
    import urllib.error

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cfg = os.path.join(workdir, "litellm.yaml")
    with open(cfg, "w") as f:
        f.write(f"model_list:\n  - model_name: {model}\n    litellm_params:\n      model: openai/{model}\n"
                f"      api_base: {engine_url}/v1\n      api_key: none\n"
                f"general_settings:\n  master_key: {LITELLM_KEY}\n")
    proc = subprocess.Popen([exe, "--config", cfg, "--port", str(port), "--host", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):  # bounded: 120 s
        try:
            req = urllib.request.Request(url + "/v1/models", headers={"Authorization": f"Bearer {LITELLM_KEY}"})
            with urllib.request.urlopen(req, timeout=2):
                return url, proc
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    proc.terminate()
    raise SystemExit("LiteLLM's proxy did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests and rounds")
    ap.add_argument("--engine", choices=["fast", "sim"], default="fast",
                    help="fast: a stub engine streaming 64 chunks --gap-ms apart (TTFT ~0: what is added is the "
                         "gateway's); sim: inferlab sim serve")
    ap.add_argument("--gap-ms", type=float, default=1.0, help="the fast engine's time between chunks")
    ap.add_argument("--sim-model", default="Qwen2.5-0.5B-Instruct", help="sim: the simulated model (on an H200)")
    ap.add_argument("-c", "--concurrency", type=int, default=32)
    ap.add_argument("-n", "--requests", type=int, default=None, help="requests per phase at -c")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--litellm", metavar="EXE", help="also LiteLLM's proxy: the litellm command of a separate environment")
    args = ap.parse_args()
    n = args.requests or (200 if args.quick else 600)
    n1 = max(n // 4, 20)  # at concurrency 1
    rounds = args.rounds or (2 if args.quick else 3)
    engine_url, model, close_engine = start_engine(args.engine, args.sim_model, args.gap_ms)
    gw = subprocess.Popen([sys.executable, "-m", "inferlab", "gateway", "--upstream", engine_url, "--port", "0",
                           "--announce"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rows = []
    lite: tuple[str, subprocess.Popen[str]] | None = None
    try:
        if args.litellm:
            import tempfile

            lite = start_litellm(args.litellm, engine_url, model, tempfile.mkdtemp())
            bench(lite[0], model, 50, args.concurrency, LITELLM_KEY)
        assert gw.stdout is not None
        gw_url = gw.stdout.readline().strip()
        if not gw_url.startswith("http://"):
            raise SystemExit(f"the gateway did not start: {gw.stderr.read() if gw.stderr else ''}")
        bench(engine_url, model, 50, args.concurrency)  # warm both paths (connections, caches)
        bench(gw_url, model, 50, args.concurrency)
        for r in range(rounds):
            d1 = bench(engine_url, model, n1, 1)
            g1 = bench(gw_url, model, n1, 1)
            direct = bench(engine_url, model, n, args.concurrency)
            chunks0, cpu0, sys0 = relayed_chunks(gw_url), cpu_s(gw.pid), cpu_s(gw.pid, slice(12, 13))
            via = bench(gw_url, model, n, args.concurrency)
            cpu1, sys1, chunks1 = cpu_s(gw.pid), cpu_s(gw.pid, slice(12, 13)), relayed_chunks(gw_url)
            chunks = chunks1 - chunks0
            x = {
                "added_c1": g1["ttft"] - d1["ttft"], "added_c": via["ttft"] - direct["ttft"],
                "cpu": (cpu1 - cpu0) * 1e3 / chunks * 1000 if chunks else float("nan"),
                "sys": (sys1 - sys0) * 1e3 / chunks * 1000 if chunks else float("nan"),
                "rps_direct": direct["rps"], "rps_gateway": via["rps"],
                "failed": d1["failed"] + g1["failed"] + direct["failed"] + via["failed"],
            }
            rows.append(x)
            print(f"round {r + 1}: TTFT p50 at c=1 direct {d1['ttft']:.2f} ms, via gateway {g1['ttft']:.2f} ms; "
                  f"at c={args.concurrency} direct {direct['ttft']:.2f} ms, via gateway {via['ttft']:.2f} ms; "
                  f"gateway CPU {x['cpu']:.0f} ms per 1,000 chunks (system {x['sys']:.0f}; {chunks:.0f} chunks); "
                  f"req/s direct {x['rps_direct']:.0f}, via gateway {x['rps_gateway']:.0f}; failed {x['failed']}", flush=True)
            if lite is not None:
                l1 = bench(lite[0], model, n1, 1, LITELLM_KEY)
                lcpu0 = tree_cpu_s(lite[1].pid)
                lv = bench(lite[0], model, n, args.concurrency, LITELLM_KEY)
                lcpu1 = tree_cpu_s(lite[1].pid)
                x |= {"lite_added_c1": l1["ttft"] - d1["ttft"], "lite_added_c": lv["ttft"] - direct["ttft"],
                      "lite_cpu": (lcpu1 - lcpu0) * 1e3 / (n * CHUNKS) * 1000, "lite_rps": lv["rps"]}
                print(f"  LiteLLM: TTFT p50 at c=1 {l1['ttft']:.2f} ms, at c={args.concurrency} {lv['ttft']:.2f} ms; "
                      f"CPU {x['lite_cpu']:.0f} ms per 1,000 chunks (counted as sent); req/s {lv['rps']:.0f}; "
                      f"failed {l1['failed'] + lv['failed']}", flush=True)
    finally:
        gw.terminate()
        gw.wait(timeout=10)
        if lite is not None:
            lite[1].terminate()
            lite[1].wait(timeout=10)
        close_engine()

    def med(k: str) -> float:
        return statistics.median(float(x[k]) for x in rows)

    what = f"a stub engine ({CHUNKS} chunks {args.gap_ms:g} ms apart)" if args.engine == "fast" else f"sim serve ({args.sim_model} on H200)"
    print(f"\nmedian of {rounds} rounds against {what}, {CHUNKS}-token streams, {n} requests at c={args.concurrency}, {n1} at c=1:")
    print(f"  added TTFT p50 at c=1            {med('added_c1'):+.2f} ms")
    print(f"  added TTFT p50 at c={args.concurrency:<3}          {med('added_c'):+.2f} ms   (target < 1 ms at c=32)")
    print(f"  gateway CPU per 1,000 chunks     {med('cpu'):.0f} ms, of which system {med('sys'):.0f} ms   (target <= 60)")
    print(f"  req/s via gateway / direct       {med('rps_gateway'):.0f} / {med('rps_direct'):.0f} = {med('rps_gateway') / med('rps_direct'):.2f}"
          "   (target >= 200 via the gateway)")
    if lite is None:
        print("  LiteLLM: not measured (--litellm EXE)")
    else:
        print(f"  LiteLLM added TTFT p50 at c=1   {med('lite_added_c1'):+.2f} ms;  at c={args.concurrency}: {med('lite_added_c'):+.2f} ms")
        print(f"  LiteLLM CPU per 1,000 chunks     {med('lite_cpu'):.0f} ms   (ratio to the gateway: {med('lite_cpu') / med('cpu'):.1f}x)")
        print(f"  req/s via LiteLLM                {med('lite_rps'):.0f}")


if __name__ == "__main__":
    main()
