"""Client CPU per streamed chunk, by HTTP stack: the measurement that chooses ours.

A local aiohttp SSE server runs in its own process and streams OpenAI chat chunks as
fast as it can ("burst") or with a pause between chunks ("paced", one chunk per read,
like a real server's token stream; "short": the same with 64-chunk answers at 32
concurrent streams, where each request's own cost counts too). Every cell (a stack, a
regime, a concurrency) runs in a fresh child process, which sends the requests and
divides its own CPU time (``time.process_time``: user + system, that process only) by
the content chunks received: µs per chunk, which is also ms per 1,000 chunks.

Stacks: ``aiohttp`` is inferlab's ``Client`` itself (aiohttp + ``SSEParser`` + the
chunk reader), on asyncio's loop with the standard library's JSON; ``+uvloop``,
``+orjson`` and ``+fast`` (both) are the same client with uvloop's event loop and/or
orjson as the JSON decoder; ``httptools`` is inferlab's ``HttptoolsClient`` (its own
asyncio connections, httptools' parser, the same chunk reader: ``--http-client
httptools``) on asyncio's loop and the standard library's JSON, and ``httptools+fast``
the same on uvloop with orjson (all of the ``fast`` extra: what ``bench`` runs where it
is installed); ``aiohttp@REV`` (with ``--baseline REV``) is the ``Client`` of another
git revision of this repository, run from its source (``git archive``), to compare a
change of the hot path before and after.
``httpx-raw`` reads ``aiter_raw`` into the same parser; ``httpx-lines`` uses
``aiter_lines``; ``openai`` is the official SDK's streaming. All but ``openai`` apply
each event exactly as the client does (one clock read per network read). Rounds are
interleaved and the median per cell is reported, with the ratio to ``aiohttp`` (lower
is cheaper).

    python bench/client_cpu.py                          # the default stacks, 5 rounds
    python bench/client_cpu.py --quick                  # fewer requests and rounds
    python bench/client_cpu.py --baseline 5f00c30       # ... and the client of 5f00c30
    python bench/client_cpu.py --stacks aiohttp,httpx-raw,httpx-lines,openai
    python bench/client_cpu.py --quick --stacks aiohttp,+fast,httptools,httptools+fast
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

# (inferlab is imported inside the stacks: a cell of ``aiohttp@REV`` runs another
# revision's source, which may lack what this one has)

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PROMPT = "Write a long story about a lighthouse keeper."
MAX_TOKENS = 2000


# --- the server (its own process) ----------------------------------------------------------


def _event(obj: dict[str, Any] | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    """A chat chunk as vLLM sends it (same keys, typical sizes)."""
    return {
        "id": "chatcmpl-0f3c8a4e5b2d4c7e9a1b6d2f8e0c4a17",
        "object": "chat.completion.chunk",
        "created": 1733000000,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def _serve(port_out: Any) -> None:
    from aiohttp import web

    head = _event(_chunk({"role": "assistant", "content": ""}))
    body = _event(_chunk({"content": " lighthouse"}))
    usage = {"prompt_tokens": 12, "completion_tokens": 2000, "total_tokens": 2012}
    tail = _event(_chunk({}, "length")) + _event({**_chunk({}), "choices": [], "usage": usage})
    tail += _event("[DONE]")

    async def chat(request: web.Request) -> web.StreamResponse:
        """``/{chunks}/{gap_us}/v1/chat/completions``: that many content chunks, one
        write each, ``gap_us`` apart (0: no pause at all)."""
        await request.read()
        chunks, gap_s = int(request.match_info["chunks"]), int(request.match_info["gap_us"]) / 1e6
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(head)
        for _ in range(chunks):
            if gap_s:
                await asyncio.sleep(gap_s)
            await resp.write(body)
        await resp.write(tail)
        await resp.write_eof()
        return resp

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/{chunks}/{gap_us}/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port_out.put(runner.addresses[0][1])
        await asyncio.Event().wait()

    asyncio.run(main())


# --- the clients ----------------------------------------------------------------------------

#: One request of a stack: returns the content chunks it received.
Request = Callable[[], Awaitable[int]]
#: A stack: opens its client/session for a base URL and yields its ``Request``.
Stack = Callable[[str], AbstractAsyncContextManager[Request]]


def _spec() -> Any:
    from inferlab.workload.spec import RequestSpec

    return RequestSpec(prompt=PROMPT, max_tokens=MAX_TOKENS)


def _requests(client: Any, spec: Any) -> Request:
    """One request of an inferlab client (``send`` of a fresh record) as a ``Request``."""
    from inferlab.results.records import RequestRecord

    async def one() -> int:
        record = RequestRecord(index=0)
        await client.send(spec, record)
        assert record.ok, record.error
        return len(record.content_ns)

    return one


@asynccontextmanager
async def inferlab_aiohttp(base_url: str) -> AsyncIterator[Request]:
    """inferlab's ``Client`` over the session its executors send with (the revision's
    own ``client_session`` where it has one)."""
    from inferlab._clock import WallClock
    from inferlab.client.http import Client, Endpoint, session_trace

    try:
        from inferlab.load.http import client_session
    except ImportError:  # (older revisions)
        def client_session() -> aiohttp.ClientSession:
            connector = aiohttp.TCPConnector(limit=0)
            return aiohttp.ClientSession(connector=connector, trace_configs=[session_trace()])

    clock = WallClock()
    endpoint = Endpoint(base_url=base_url, model=MODEL)
    spec = _spec()
    async with client_session() as s:
        client = Client(endpoint, clock, s, clock.now_ns())

        yield _requests(client, spec)


@asynccontextmanager
async def inferlab_httptools(base_url: str) -> AsyncIterator[Request]:
    """inferlab's ``HttptoolsClient`` over a pool of its own (as ``bench --http-client
    httptools`` sends)."""
    from inferlab._clock import WallClock
    from inferlab.client.http import Endpoint
    from inferlab.client.httptools_http import HttptoolsClient, Pool

    clock = WallClock()
    endpoint = Endpoint(base_url=base_url, model=MODEL)
    spec = _spec()
    async with Pool(endpoint.base_url) as pool:
        client = HttptoolsClient(endpoint, clock, pool, clock.now_ns())

        yield _requests(client, spec)


def _httpx_client() -> Any:
    import httpx

    return httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=None))


@asynccontextmanager
async def httpx_raw(base_url: str) -> AsyncIterator[Request]:
    from inferlab._clock import WallClock
    from inferlab.client.exchange import Endpoint, StreamRecorder, request_body
    from inferlab.results.records import RequestRecord

    clock = WallClock()
    endpoint = Endpoint(base_url=base_url, model=MODEL)
    body = json.dumps(request_body(endpoint, _spec())).encode()
    headers = endpoint.request_headers()
    async with _httpx_client() as http:

        async def one() -> int:
            record = RequestRecord(index=0)
            stream = StreamRecorder(record)
            async with http.stream("POST", endpoint.url, content=body, headers=headers) as resp:
                async for data in resp.aiter_raw():
                    stream.read(data, clock.now_ns())
            stream.flush()
            assert stream.done
            return len(record.content_ns)

        yield one


@asynccontextmanager
async def httpx_lines(base_url: str) -> AsyncIterator[Request]:
    from inferlab._clock import WallClock
    from inferlab.client.exchange import Endpoint, StreamState, request_body
    from inferlab.results.records import RequestRecord

    clock = WallClock()
    endpoint = Endpoint(base_url=base_url, model=MODEL)
    body = json.dumps(request_body(endpoint, _spec())).encode()
    headers = endpoint.request_headers()
    async with _httpx_client() as http:

        async def one() -> int:
            record = RequestRecord(index=0)
            state = StreamState(record)
            async with http.stream("POST", endpoint.url, content=body, headers=headers) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data:"):
                        state.event(line[5:].lstrip(" "), clock.now_ns())
            assert state.done
            return len(record.content_ns)

        yield one


@asynccontextmanager
async def openai_sdk(base_url: str) -> AsyncIterator[Request]:
    from inferlab._clock import WallClock
    from openai import AsyncOpenAI

    clock = WallClock()
    async with AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=None) as client:

        async def one() -> int:
            content_ns: list[int] = []
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": PROMPT}],
                max_tokens=MAX_TOKENS,
                stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    content_ns.append(clock.now_ns())
            return len(content_ns)

        yield one


@dataclass(frozen=True)
class StackSpec:
    """A stack, the event loop it runs on and the JSON decoder the client uses."""

    run: Stack
    uvloop: bool = False
    json: str = "stdlib"  # or "orjson" (inferlab's stacks only)


STACKS: dict[str, StackSpec] = {
    "aiohttp": StackSpec(inferlab_aiohttp),
    "+uvloop": StackSpec(inferlab_aiohttp, uvloop=True),
    "+orjson": StackSpec(inferlab_aiohttp, json="orjson"),
    "+fast": StackSpec(inferlab_aiohttp, uvloop=True, json="orjson"),
    "httptools": StackSpec(inferlab_httptools),
    "httptools+fast": StackSpec(inferlab_httptools, uvloop=True, json="orjson"),
    "httpx-raw": StackSpec(httpx_raw),
    "httpx-lines": StackSpec(httpx_lines),
    "openai": StackSpec(openai_sdk),
}
DEFAULT_STACKS = ["aiohttp", "+uvloop", "+orjson", "+fast", "httptools", "httptools+fast"]
#: The stack name of the baseline revision's client: ``aiohttp@REV``.
BASELINE = "aiohttp@"


def _use_json(name: str) -> None:
    """Make inferlab's chunk reader decode JSON with ``name`` (``stdlib``: the standard
    decoder, after the plain-chunk match where the revision has one; ``orjson``: orjson
    alone), whatever it would pick by itself."""
    import re

    import inferlab.openai.response as response

    if name == "orjson":
        import orjson

        response._decode_json = orjson.loads  # type: ignore[attr-defined]
        response._plain_chunk = None  # type: ignore[attr-defined]
    else:
        response._decode_json = json.JSONDecoder().decode  # type: ignore[attr-defined]
        chunk = getattr(response, "_CHUNK", None)
        response._plain_chunk = re.compile(chunk).fullmatch if chunk else None  # type: ignore[attr-defined]


async def _fan_out(requests: int, concurrency: int, one: Request) -> int:
    """``requests`` calls of ``one``, ``concurrency`` at a time; the chunks they got."""
    todo = iter(range(requests))

    async def worker() -> int:
        return sum([await one() for _ in todo])

    return sum(await asyncio.gather(*(worker() for _ in range(concurrency))))


# --- the measurement ------------------------------------------------------------------------


@dataclass(frozen=True)
class Regime:
    name: str
    chunks: int  # content chunks per request
    gap_us: int  # server pause between chunks
    requests: dict[int, int]  # concurrency -> requests per cell


def measure(spec: StackSpec, url: str, requests: int, concurrency: int) -> tuple[float, float]:
    """CPU µs of this process per content chunk for one cell, and the network reads per
    chunk (inferlab's stacks; NaN for the others, whose reads are not counted). The client is created and warmed up
    (one request per connection: connections, lazy imports, first-call caches) untimed.

    Reads per chunk: a client that keeps up reads each chunk as it comes (one read, one
    wake-up each); one that falls behind finds several waiting and reads them at once,
    which costs less per chunk and stamps them late. Compare CPU at like reads."""
    from aiohttp.client_proto import ResponseHandler

    protocol: Any = ResponseHandler
    if spec.run is inferlab_httptools:
        from inferlab.client.httptools_http import _Connection

        protocol = _Connection
    reads = [0]
    received = protocol.data_received

    def counting(self: Any, data: bytes) -> None:
        if data:
            reads[0] += 1
        received(self, data)

    async def cell() -> tuple[float, int, int]:
        async with spec.run(url) as one:
            await _fan_out(concurrency, concurrency, one)
            gc.collect()
            reads[0] = 0
            cpu = time.process_time()
            chunks = await _fan_out(requests, concurrency, one)
            return time.process_time() - cpu, chunks, reads[0]

    if spec.run in (inferlab_aiohttp, inferlab_httptools):
        _use_json(spec.json)
    loop_factory = None
    if spec.uvloop:
        import uvloop

        loop_factory = uvloop.new_event_loop
    protocol.data_received = counting
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            cpu_s, chunks, n_reads = runner.run(cell())
    finally:
        protocol.data_received = received
    counted = spec.run in (inferlab_aiohttp, inferlab_httptools)
    return cpu_s / chunks * 1e6, n_reads / chunks if counted else math.nan


def _cell(stack: str, url: str, requests: int, concurrency: int, baseline: Path | None) -> tuple[float, float]:
    """One cell in a fresh child process (a baseline's from that revision's source)."""
    env = dict(os.environ)
    if stack.startswith(BASELINE):
        assert baseline is not None
        env["PYTHONPATH"] = os.pathsep.join([str(baseline), env.get("PYTHONPATH", "")])
    argv = [sys.executable, __file__, "--cell", stack, url, str(requests), str(concurrency)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    if out.returncode != 0:
        raise SystemExit(f"cell {stack} c={concurrency} failed:\n{out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    expected = str(baseline) if stack.startswith(BASELINE) else str(Path(__file__).resolve().parents[1])
    if not result["inferlab"].startswith(expected):
        raise SystemExit(f"cell {stack} ran inferlab from {result['inferlab']}, not {expected}")
    return float(result["us_per_chunk"]), float(result["reads_per_chunk"])


def _run_cell(argv: list[str]) -> None:
    """``--cell STACK URL REQUESTS CONCURRENCY`` (a child of ``run``): prints one JSON line."""
    import inferlab

    stack, url, requests, concurrency = argv[0], argv[1], int(argv[2]), int(argv[3])
    spec = STACKS["aiohttp"] if stack.startswith(BASELINE) else STACKS[stack]
    us, reads = measure(spec, url, requests, concurrency)
    print(json.dumps({"us_per_chunk": us, "reads_per_chunk": reads, "inferlab": str(Path(inferlab.__file__).resolve())}))


def _checkout(rev: str, into: Path) -> Path:
    """``src/`` of revision ``rev`` of this repository, extracted under ``into``."""
    root = Path(__file__).resolve().parents[1]
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", "--format=tar", rev, "src"],
        capture_output=True, check=False,
    )
    if archive.returncode != 0:
        raise SystemExit(f"--baseline {rev}: {archive.stderr.decode().strip()}")
    tar_path = into / "src.tar"
    tar_path.write_bytes(archive.stdout)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    return (into / "src").resolve()


def run(regimes: list[Regime], stacks: list[str], rounds: int, baseline: Path | None = None) -> None:
    ctx = mp.get_context("spawn")
    port_q = ctx.Queue()
    server = ctx.Process(target=_serve, args=(port_q,), daemon=True)
    server.start()
    try:
        port = port_q.get(timeout=30)
        print(f"client CPU per streamed chunk (µs per chunk = ms per 1,000 chunks; median of "
              f"{rounds} interleaved rounds, each cell a fresh process; ratio = stack / aiohttp, "
              f"lower is cheaper)")
        for regime in regimes:
            results: dict[tuple[str, int], list[tuple[float, float]]] = {}
            for r in range(rounds):
                for conc, n in regime.requests.items():
                    order = stacks[r % len(stacks):] + stacks[: r % len(stacks)]
                    for name in order:
                        url = f"http://127.0.0.1:{port}/{regime.chunks}/{regime.gap_us}/v1"
                        results.setdefault((name, conc), []).append(
                            _cell(name, url, n, conc, baseline)
                        )
            _print_table(regime, stacks, results)
    finally:
        server.terminate()
        server.join()


def _print_table(regime: Regime, stacks: list[str], results: dict[tuple[str, int], list[tuple[float, float]]]) -> None:
    concs = list(regime.requests)
    gap = f"{regime.gap_us} µs between chunks" if regime.gap_us else "no pause"
    print(f"\n{regime.name}: {regime.chunks} chunks/request, {gap}; requests per cell "
          + ", ".join(f"{n} at c={c}" for c, n in regime.requests.items()))
    header = f"{'stack':<16}" + "".join(f"{f'c={c} µs/chunk':>17}{'ratio':>7}{'reads/chunk':>12}" for c in concs)
    print(header)
    print("-" * len(header))
    base = {c: statistics.median(u for u, _ in results[("aiohttp", c)]) for c in concs if ("aiohttp", c) in results}
    for name in stacks:
        row = f"{name:<16}"
        for c in concs:
            us = [u for u, _ in results[(name, c)]]
            med = statistics.median(us)
            spread = max(us) - min(us)
            ratio = f"{med / base[c]:.2f}" if c in base else "-"
            reads = statistics.median(r for _, r in results[(name, c)])
            row += f"{med:>10.1f} ±{spread / 2:>4.1f}{ratio:>7}" + (f"{'-':>12}" if math.isnan(reads) else f"{reads:>12.2f}")
        print(row)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--cell"]:
        _run_cell(argv[1:])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer requests and rounds")
    p.add_argument("--rounds", type=int, help="interleaved repetitions (default 5, quick 3)")
    p.add_argument("--stacks", default=",".join(DEFAULT_STACKS),
                   help=f"comma-separated, of {', '.join(STACKS)} (default: %(default)s)")
    p.add_argument("--baseline", metavar="REV",
                   help="also run the client of this git revision (stack aiohttp@REV)")
    p.add_argument("--regimes", default="burst,paced,short", help="comma-separated subset")
    args = p.parse_args(argv)
    stacks = args.stacks.split(",")
    unknown = [s for s in stacks if s not in STACKS]
    if unknown:
        p.error(f"unknown stacks: {', '.join(unknown)} (known: {', '.join(STACKS)})")
    if args.quick:
        regimes = [
            Regime("burst", 2000, 0, {1: 2, 16: 16}),
            Regime("paced", 200, 1000, {1: 2, 16: 16}),
            Regime("short", 64, 1000, {32: 64}),
        ]
    else:
        regimes = [
            Regime("burst", 2000, 0, {1: 8, 16: 64}),
            Regime("paced", 500, 1000, {1: 4, 16: 32}),
            Regime("short", 64, 1000, {32: 256}),
        ]
    wanted = args.regimes.split(",")
    if unknown := [w for w in wanted if w not in {r.name for r in regimes}]:
        p.error(f"unknown regimes: {', '.join(unknown)}")
    regimes = [r for r in regimes if r.name in wanted]
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        baseline = None
        if args.baseline:
            baseline = _checkout(args.baseline, Path(tmp))
            stacks.append(BASELINE + args.baseline)
        run(regimes, stacks, args.rounds or (3 if args.quick else 5), baseline)
    versions = [f"python {sys.version.split()[0]}", f"aiohttp {aiohttp.__version__}"]
    for name in ("uvloop", "orjson", "httptools"):
        with suppress(ImportError):
            versions.append(f"{name} {__import__(name).__version__}")
    print(f"\n({time.monotonic() - started:.0f} s; {', '.join(versions)})")


if __name__ == "__main__":
    main()
