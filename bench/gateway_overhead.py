"""What the gateway adds: TTFT and CPU per relayed chunk, through ``inferlab gateway``
versus straight to the engine, side by side in one run.

One ``inferlab sim serve`` is the engine (a child process; a small model on an H200 by
default, so that the engine's own queueing does not hide the gateway's cost); ``inferlab gateway`` runs in
front of it in a child process of its own (admission by tokens, cache off: every request
goes upstream). The load is ``inferlab bench`` itself (closed loop, ``-c`` users,
64-token answers, fresh 128-token prompts, no preflight), run alternately straight at
the engine and through the gateway, ``--rounds`` times each; medians are reported.

- added TTFT: TTFT p50 through the gateway minus TTFT p50 direct (ms), per round; with
  an engine that reports its own timeline (``sim serve``), how much of it is transport
  (each request's client TTFT less the engine's own first-token time) and how much the
  engine's own time moved (a closed loop's requests reach the engine at one point of
  its step cycle, and the gateway's delay moves that point; ``--rate R`` loads with
  Poisson arrivals instead, at random points of it);
- CPU per 1,000 relayed chunks: the gateway process's user + system CPU time
  (``/proc/PID/stat``) over its phase, divided by the content chunks it relayed (its own
  ``/metrics``: one TTFT sample plus one ITL sample per content chunk);
- req/s through the gateway and direct, and their ratio.

``--gateway`` (repeatable) runs several gateways side by side, each in a process of its
own, in the same rounds (the order of the paths turning each round): ``auto``,
``httptools`` or ``aiohttp`` (this checkout's gateway with that ``--http-client`` to the
engine), ``redis`` (this checkout's, its admission budget kept in a Redis server it
starts, ``[redis] admission``: what sharing the budget across instances costs a
request), or ``git:REV`` (the gateway of revision REV of this repository, from ``git
archive``, as it ran then). Each is printed with its medians, then each against the
first: CPU per chunk and req/s as ratios, added TTFT as both values.

The issue's targets (added TTFT p50 < 1 ms at concurrency 32; CPU <= 60 ms per 1,000
relayed chunks; >= 200 req/s of 64-token streams) are printed beside the numbers. The
machine is shared: read the ratios and the spread between rounds, not one number.

    python bench/gateway_overhead.py            # c=32, 600 requests a phase, 3 rounds
    python bench/gateway_overhead.py --quick    # 200 requests a phase, 2 rounds
    python bench/gateway_overhead.py --engine sim --rate 100   # Poisson arrivals at 100 req/s
    python bench/gateway_overhead.py --gateway httptools --gateway aiohttp --gateway git:main
    python bench/gateway_overhead.py --gateway auto --gateway redis   # the shared budget's cost
    python bench/gateway_overhead.py --engine sim --engines 2   # issue 21's check: two sim serve upstreams
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from inferlab.results.metrics import request_metrics
from inferlab.results.runfiles import read_records
from inferlab.sim.server.launch import ChildServer

#: The fast engine's answer: a role chunk, 64 content chunks ``--gap-ms`` apart, the
#: finish chunk, the usage chunk if asked, [DONE] (vLLM's keys and sizes).
CHUNKS = 64


def _fast_engine(port_out: Any, gap_s: float, lockstep: bool = False) -> None:
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
        loop = asyncio.get_running_loop()
        for _ in range(CHUNKS):
            # lockstep: every stream's chunk on one shared tick, as an engine's step ends
            await asyncio.sleep(gap_s - loop.time() % gap_s if lockstep else gap_s)
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


def bench(urls: str | list[str], model: str, n: int, c: int, api_key: str | None = None,
          rate: float | None = None) -> dict[str, float]:
    """One ``inferlab bench`` run: TTFT p50 (ms), req/s, failures; and ``engine_ttft``, the
    p50 of the engine's own receipt-to-first-token time (``server_timeline``, which
    ``sim serve`` sends; NaN from an engine that does not), and ``transport``, the p50
    over requests of each one's client TTFT less the engine's own for it: what the
    gateway adds in transport, told apart from a change in what the engine did (a closed
    loop's requests reaching the engine at another point of its step cycle).

    Several ``urls`` (straight at several engines): one ``inferlab bench`` per URL at the
    same time, the load split evenly (``c``, ``n`` and ``rate`` divided among them: a
    client that spreads its users over the engines as the gateway's routing would), and
    the numbers taken over all their requests together (req/s summed)."""
    urls = [urls] if isinstance(urls, str) else urls
    k = len(urls)
    with tempfile.TemporaryDirectory() as out:
        procs = []
        for i, url in enumerate(urls):
            # one URL: the same arrivals both ways (seed 1); several: each a Poisson process of
            # its share of the rate, together one of the whole rate (other arrivals, same law)
            load = (["--rate", f"{rate / k:g}", "--seed", str(1 + i)] if rate else ["-c", str(max(c // k, 1))])
            cmd = [sys.executable, "-m", "inferlab", "bench", "--url", url, "-n", str(max(n // k, 1)), *load,
                   "--model", model, "--input-tokens", "128", "--output-tokens", str(CHUNKS), "--no-preflight",
                   "--json", "--workers", "1", "--no-history", "-o", str(Path(out) / f"run{i}")]
            if api_key:
                cmd += ["--api-key", api_key]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        summaries = []
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=600)
            if proc.returncode != 0:
                raise SystemExit(f"inferlab bench failed ({proc.returncode}): {stderr.strip()[-2000:]}")
            summaries.append(json.loads(stdout))
        ttfts, own, transport = [], [], []
        for i in range(k):
            for rec in read_records(Path(out) / f"run{i}" / "requests.jsonl"):
                ttft = request_metrics(rec).ttft_ms
                if rec.warmup or ttft is None:
                    continue
                ttfts.append(ttft)
                tl = rec.server_timeline
                if tl and tl.get("first_token_ms") is not None:
                    own.append(float(tl["first_token_ms"]))
                    transport.append(ttft - float(tl["first_token_ms"]))  # (the same request's: no engine in it)
    nan = float("nan")
    return {"ttft": statistics.median(ttfts) if ttfts else nan,
            "rps": sum(x["request_throughput_rps"] for x in summaries),
            "failed": sum(x["counts"]["failed"] for x in summaries),
            "engine_ttft": statistics.median(own) if own else nan,
            "transport": statistics.median(transport) if transport else nan}


def pin(pid: int, cores: set[int]) -> None:
    """Every thread of ``pid`` onto ``cores``."""
    for task in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(task), cores)


def start_engine(kind: str, sim_model: str, gap_ms: float) -> tuple[str, str, Any, int]:
    """(its URL, the model to ask for, a close function, its process id)."""
    if kind == "sim":
        sim = ChildServer(["--model", sim_model, "--gpu", "H200"])
        return sim.url, sim_model, sim.close, sim.pid
    ctx = mp.get_context("spawn")
    port_out = ctx.Queue()
    proc = ctx.Process(target=_fast_engine, args=(port_out, gap_ms / 1e3, kind == "lockstep"), daemon=True)
    proc.start()
    url = f"http://127.0.0.1:{port_out.get(timeout=30)}"
    assert proc.pid is not None
    return url, "fast", proc.terminate, proc.pid


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


def checkout(rev: str, into: Path) -> Path:
    """``src/`` of revision ``rev`` of this repository, extracted under ``into``."""
    root = Path(__file__).resolve().parents[1]
    archive = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", rev, "src"], capture_output=True,
                             check=False)
    if archive.returncode != 0:
        raise SystemExit(f"--gateway git:{rev}: {archive.stderr.decode().strip()}")
    (into / "src.tar").write_bytes(archive.stdout)
    with tarfile.open(into / "src.tar") as tar:
        tar.extractall(into, filter="data")
    return (into / "src").resolve()


def start_redis(workdir: str) -> tuple[str, subprocess.Popen[bytes]]:
    """A Redis server on a free loopback port (Debian's ``redis-server``): (its URL, its process)."""
    import socket
    import time

    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("--gateway redis needs a Redis server: apt-get install redis-server")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", workdir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):  # bounded: 5 s
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                return f"redis://127.0.0.1:{port}/0", proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the Redis server did not start")


def start_gateway(spec: str, engine_urls: list[str], workdir: str,
                  redis_url: str | None = None) -> tuple[str, subprocess.Popen[str]]:
    """The gateway ``spec`` names (``--gateway``) in front of the engines: (its URL, its process)."""
    ups = [x for url in engine_urls for x in ("--upstream", url)]
    cmd = [sys.executable, "-m", "inferlab", "gateway", *ups, "--port", "0", "--announce"]
    env = dict(os.environ)
    if spec.startswith("git:"):
        src = checkout(spec[4:], Path(tempfile.mkdtemp(dir=workdir)))
        env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    elif spec == "redis":
        config = Path(workdir) / "gateway-redis.toml"
        config.write_text(f'[redis]\nurl = "{redis_url}"\nlimits = false\ncache = false\nadmission = true\n')
        cmd += ["--config", str(config)]
    else:
        cmd += ["--http-client", spec]
    gw = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert gw.stdout is not None
    url = gw.stdout.readline().strip()
    if not url.startswith("http://"):
        raise SystemExit(f"gateway {spec} did not start: {gw.stderr.read() if gw.stderr else ''}")
    return url, gw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests and rounds")
    ap.add_argument("--engine", choices=["fast", "lockstep", "sim"], default="fast",
                    help="fast: a stub engine streaming 64 chunks --gap-ms apart (TTFT ~0: what is added is the "
                         "gateway's); lockstep: the same stub writing every stream's chunk on one shared tick "
                         "(--gap-ms), as an engine's step ends; sim: inferlab sim serve")
    ap.add_argument("--gap-ms", type=float, default=1.0, help="the fast engine's time between chunks")
    ap.add_argument("--sim-model", default="Qwen2.5-0.5B-Instruct", help="sim: the simulated model (on an H200)")
    ap.add_argument("--engines", type=int, choices=[1, 2], default=1,
                    help="engines behind each gateway (2: its least-outstanding routing over two; direct, the load "
                         "split evenly over them, each half a bench process of its own)")
    ap.add_argument("-c", "--concurrency", type=int, default=32)
    ap.add_argument("-n", "--requests", type=int, default=None, help="requests per phase at -c")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--rate", type=float, default=None,
                    help="the loaded phase as Poisson arrivals at this rate (req/s, the same seed both ways) instead of "
                         "a closed loop of -c users: arrivals at random points of the engine's step cycle, where a "
                         "closed loop keeps its users' requests at one point of it")
    ap.add_argument("--gateway", action="append", metavar="auto|httptools|aiohttp|redis|git:REV",
                    help="a gateway to measure (repeatable; default auto): this checkout's with that --http-client "
                         "to the engine, this checkout's with its admission budget in Redis (redis), or revision "
                         "REV's")
    ap.add_argument("--pin-gateway", action="store_true",
                    help="the gateways on the last core, the engine and the load on the others (is the gateway "
                         "waiting for a core?)")
    ap.add_argument("--litellm", metavar="EXE", help="also LiteLLM's proxy: the litellm command of a separate environment")
    args = ap.parse_args()
    specs: list[str] = args.gateway or ["auto"]
    for spec in specs:
        if spec not in ("auto", "httptools", "aiohttp", "redis") and not spec.startswith("git:"):
            ap.error(f"--gateway {spec}: auto, httptools, aiohttp, redis or git:REV")
    if len(set(specs)) != len(specs):
        ap.error("a --gateway is given twice")
    if args.engines > 1 and args.litellm:
        ap.error("--litellm runs in front of one engine: leave out --engines")
    n = args.requests or (200 if args.quick else 600)
    n1 = max(n // 4, 20)  # at concurrency 1
    rounds = args.rounds or (2 if args.quick else 3)
    c = args.concurrency
    loaded = f"Poisson {args.rate:g} req/s" if args.rate else f"c={c}"  # (the loaded phase)
    workdir = tempfile.mkdtemp()
    engines = [start_engine(args.engine, args.sim_model, args.gap_ms) for _ in range(args.engines)]
    engine_urls, model = [e[0] for e in engines], engines[0][1]
    engine_url, engine_pids = engine_urls[0], [e[3] for e in engines]
    gateways: list[tuple[str, str, subprocess.Popen[str]]] = []
    rows: list[dict[str, dict[str, float]]] = []
    lite: tuple[str, subprocess.Popen[str]] | None = None
    redis: tuple[str, subprocess.Popen[bytes]] | None = None
    try:
        if "redis" in specs:
            redis = start_redis(workdir)
        for spec in specs:
            gateways.append((spec, *start_gateway(spec, engine_urls, workdir, redis[0] if redis else None)))
        if args.pin_gateway:
            cores = sorted(os.sched_getaffinity(0))
            if len(cores) < 2:
                ap.error("--pin-gateway needs two cores")
            for _, _, gw_proc in gateways:
                pin(gw_proc.pid, {cores[-1]})
            pin(os.getpid(), set(cores[:-1]))  # (the bench processes inherit it)
            for pid in engine_pids:
                pin(pid, set(cores[:-1]))
        if args.litellm:
            lite = start_litellm(args.litellm, engine_url, model, workdir)
            bench(lite[0], model, 50, c, LITELLM_KEY)
        bench(engine_urls, model, 50, c)  # warm every path (connections, caches)
        for _, url, _ in gateways:
            bench(url, model, 50, c)
        paths: list[tuple[str, str, subprocess.Popen[str] | None]] = [("direct", engine_url, None), *gateways]
        for r in range(rounds):
            turn = paths[r % len(paths):] + paths[:r % len(paths)]
            row: dict[str, dict[str, float]] = {}
            for name, url, _ in turn:
                row[name] = bench(url, model, n1, 1)
            for name, url, proc in turn:
                if proc is None:  # (straight at the engines: the load split over them)
                    row[name] |= {f"{k}_c": v for k, v in bench(engine_urls, model, n, c, rate=args.rate).items()}
                    continue
                chunks0, cpu0, sys0 = relayed_chunks(url), cpu_s(proc.pid), cpu_s(proc.pid, slice(12, 13))
                via = bench(url, model, n, c, rate=args.rate)
                cpu1, sys1, chunks1 = cpu_s(proc.pid), cpu_s(proc.pid, slice(12, 13)), relayed_chunks(url)
                chunks = chunks1 - chunks0
                row[name] |= {f"{k}_c": v for k, v in via.items()} | {
                    "cpu": (cpu1 - cpu0) * 1e6 / chunks if chunks else float("nan"),
                    "sys": (sys1 - sys0) * 1e6 / chunks if chunks else float("nan"),
                }
            d = row["direct"]
            for name, _, _ in gateways:
                x = row[name]
                x["added_c1"], x["added_c"] = x["ttft"] - d["ttft"], x["ttft_c"] - d["ttft_c"]
                x["added_transport_c"] = x["transport_c"] - d["transport_c"]
            rows.append(row)
            failed = sum(x["failed"] + x["failed_c"] for x in row.values())
            own = f" (the engine's own {d['engine_ttft_c']:.2f})" if d["engine_ttft_c"] == d["engine_ttft_c"] else ""
            print(f"round {r + 1}: direct TTFT p50 {d['ttft']:.2f} ms at c=1, {d['ttft_c']:.2f} ms at {loaded}{own}, "
                  f"{d['rps_c']:.0f} req/s; failed {failed:.0f}", flush=True)
            for name, _, _ in gateways:
                x = row[name]
                own = (f" (the engine's own {x['engine_ttft_c']:.2f}; in transport {x['added_transport_c']:+.2f})"
                       if x["engine_ttft_c"] == x["engine_ttft_c"] else "")
                print(f"  via {name:<14} TTFT p50 {x['ttft']:.2f} ms at c=1 ({x['added_c1']:+.2f}), {x['ttft_c']:.2f} ms "
                      f"at {loaded}{own} ({x['added_c']:+.2f}); CPU {x['cpu']:.1f} ms per 1,000 chunks (system {x['sys']:.1f}); "
                      f"{x['rps_c']:.0f} req/s", flush=True)
            if lite is not None:
                l1 = bench(lite[0], model, n1, 1, LITELLM_KEY)
                lcpu0 = tree_cpu_s(lite[1].pid)
                lv = bench(lite[0], model, n, c, LITELLM_KEY, rate=args.rate)
                lcpu1 = tree_cpu_s(lite[1].pid)
                row["litellm"] = {"added_c1": l1["ttft"] - d["ttft"], "added_c": lv["ttft"] - d["ttft_c"],
                                  "cpu": (lcpu1 - lcpu0) * 1e3 / (n * CHUNKS) * 1000, "rps_c": lv["rps"]}
                print(f"  LiteLLM: TTFT p50 at c=1 {l1['ttft']:.2f} ms, at {loaded} {lv['ttft']:.2f} ms; "
                      f"CPU {row['litellm']['cpu']:.0f} ms per 1,000 chunks (counted as sent); req/s {lv['rps']:.0f}; "
                      f"failed {l1['failed'] + lv['failed']}", flush=True)
    finally:
        for _, _, proc in gateways:
            proc.terminate()
            proc.wait(timeout=10)
        if lite is not None:
            lite[1].terminate()
            lite[1].wait(timeout=10)
        for engine in engines:
            engine[2]()
        if redis is not None:
            redis[1].terminate()
            redis[1].wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)

    def med(path: str, k: str) -> float:
        return statistics.median(float(row[path][k]) for row in rows)

    what = f"a stub engine ({CHUNKS} chunks {args.gap_ms:g} ms apart{', in lockstep' if args.engine == 'lockstep' else ''})" if args.engine != "sim" else f"sim serve ({args.sim_model} on H200)"
    if args.engines > 1:
        what = f"{args.engines} engines, each {what} (direct: the load split evenly over them)"
    print(f"\nmedian of {rounds} rounds against {what}, {CHUNKS}-token streams, {n} requests at {loaded}, {n1} at c=1 "
          f"(direct: {med('direct', 'rps_c'):.0f} req/s at {loaded}):")
    print(f"  {'gateway':<16} {'added TTFT p50 c=1':>18} {f'{loaded}':>9} {'CPU/1k chunks':>14} {'(system)':>9} {'req/s':>6}")
    for name, _, _ in gateways:
        print(f"  {name:<16} {med(name, 'added_c1'):>+15.2f} ms {med(name, 'added_c'):>+6.2f} ms {med(name, 'cpu'):>11.1f} ms "
              f"{med(name, 'sys'):>9.1f} {med(name, 'rps_c'):>6.0f}")
    first = gateways[0][0]
    for name, _, _ in gateways[1:]:
        print(f"  {first} against {name}: CPU per chunk {med(first, 'cpu') / med(name, 'cpu'):.2f}x, "
              f"req/s {med(first, 'rps_c') / med(name, 'rps_c'):.2f}x; added TTFT p50 at c=1 {med(first, 'added_c1'):+.2f} "
              f"against {med(name, 'added_c1'):+.2f} ms, at {loaded} {med(first, 'added_c'):+.2f} against "
              f"{med(name, 'added_c'):+.2f} ms")
    if med("direct", "transport_c") == med("direct", "transport_c"):  # (an engine with its own timeline)
        print(f"  of the added TTFT at {loaded}, in transport (each request's client TTFT less the engine's own, "
              "p50, against direct): " + ", ".join(f"{name} {med(name, 'added_transport_c'):+.2f} ms" for name, _, _ in gateways))
    print(f"  targets ({first}): added TTFT p50 < 1 ms at c=32; CPU <= 60 ms per 1,000 chunks; >= 200 req/s")
    if lite is None:
        print("  LiteLLM: not measured (--litellm EXE)")
    else:
        print(f"  LiteLLM added TTFT p50 at c=1   {med('litellm', 'added_c1'):+.2f} ms;  at {loaded}: {med('litellm', 'added_c'):+.2f} ms")
        print(f"  LiteLLM CPU per 1,000 chunks     {med('litellm', 'cpu'):.0f} ms   (ratio to {first}: "
              f"{med('litellm', 'cpu') / med(first, 'cpu'):.1f}x)")
        print(f"  req/s via LiteLLM                {med('litellm', 'rps_c'):.0f}")


if __name__ == "__main__":
    main()
