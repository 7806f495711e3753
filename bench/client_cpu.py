"""Client CPU per streamed chunk, by HTTP stack: the measurement that chooses ours.

A local aiohttp SSE server runs in its own process and streams OpenAI chat chunks as
fast as it can ("burst") or with a pause between chunks ("paced", one chunk per read,
like a real server's token stream). This process is the client: for each stack it
sends the same requests and divides its own CPU time (``time.process_time``: user +
system, this process only) by the content chunks received.

Stacks: ``aiohttp`` is inferlab's ``Client`` itself (aiohttp + ``SSEParser`` + JSON);
``httpx-raw`` reads ``aiter_raw`` into the same parser; ``httpx-lines`` uses
``aiter_lines``; ``openai`` is the official SDK's streaming. All but ``openai`` apply
each event exactly as the client does (JSON parse, content/usage bookkeeping, one clock
read per network read). Rounds are interleaved and the median per cell is reported,
with the ratio to ``aiohttp`` (lower is cheaper).

    python bench/client_cpu.py            # 2,000 chunks per request, 5 rounds
    python bench/client_cpu.py --quick    # the same cells, fewer requests (< 60 s)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing as mp
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp

from inferlab._clock import WallClock
from inferlab.client.exchange import StreamState, request_body
from inferlab.client.http import Client, Endpoint, session_trace
from inferlab.openai.sse import SSEParser
from inferlab.results.records import RequestRecord
from inferlab.workload.spec import RequestSpec

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PROMPT = "Write a long story about a lighthouse keeper."
SPEC = RequestSpec(prompt=PROMPT, max_tokens=2000)


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


@asynccontextmanager
async def inferlab_aiohttp(base_url: str) -> AsyncIterator[Request]:
    clock = WallClock()
    endpoint = Endpoint(base_url=base_url, model=MODEL)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, trace_configs=[session_trace()]) as s:
        client = Client(endpoint, clock, s, clock.now_ns())

        async def one() -> int:
            record = RequestRecord(index=0)
            await client.send(SPEC, record)
            assert record.ok, record.error
            return len(record.content_ns)

        yield one


def _httpx_client() -> Any:
    import httpx

    return httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=None))


@asynccontextmanager
async def httpx_raw(base_url: str) -> AsyncIterator[Request]:
    clock = WallClock()
    endpoint = Endpoint(base_url=base_url, model=MODEL)
    body = json.dumps(request_body(endpoint, SPEC)).encode()
    headers = endpoint.request_headers()
    async with _httpx_client() as http:

        async def one() -> int:
            record = RequestRecord(index=0)
            state, parser = StreamState(record), SSEParser()
            async with http.stream("POST", endpoint.url, content=body, headers=headers) as resp:
                async for data in resp.aiter_raw():
                    t = clock.now_ns()
                    for event in parser.feed(data):
                        state.event(event, t)
            assert state.done
            return len(record.content_ns)

        yield one


@asynccontextmanager
async def httpx_lines(base_url: str) -> AsyncIterator[Request]:
    clock = WallClock()
    endpoint = Endpoint(base_url=base_url, model=MODEL)
    body = json.dumps(request_body(endpoint, SPEC)).encode()
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
    from openai import AsyncOpenAI

    clock = WallClock()
    async with AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=None) as client:

        async def one() -> int:
            content_ns: list[int] = []
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": PROMPT}],
                max_tokens=SPEC.max_tokens,
                stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    content_ns.append(clock.now_ns())
            return len(content_ns)

        yield one


STACKS: dict[str, Stack] = {
    "aiohttp": inferlab_aiohttp,
    "httpx-raw": httpx_raw,
    "httpx-lines": httpx_lines,
    "openai": openai_sdk,
}


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


def measure(stack: Stack, url: str, requests: int, concurrency: int) -> float:
    """CPU µs of this process per content chunk for one cell. The client is created and
    warmed up (one request: a connection, lazy imports, first-call caches) untimed."""

    async def cell() -> tuple[float, int]:
        async with stack(url) as one:
            await one()
            gc.collect()
            cpu = time.process_time()
            chunks = await _fan_out(requests, concurrency, one)
            return time.process_time() - cpu, chunks

    cpu_s, chunks = asyncio.run(cell())
    return cpu_s / chunks * 1e6


def run(regimes: list[Regime], stacks: list[str], rounds: int) -> None:
    ctx = mp.get_context("spawn")
    port_q = ctx.Queue()
    server = ctx.Process(target=_serve, args=(port_q,), daemon=True)
    server.start()
    try:
        port = port_q.get(timeout=30)
        print(f"client CPU per streamed chunk (µs, median of {rounds} interleaved rounds; "
              f"ratio = stack / aiohttp, lower is cheaper)")
        for regime in regimes:
            results: dict[tuple[str, int], list[float]] = {}
            for r in range(rounds):
                for conc, n in regime.requests.items():
                    order = stacks[r % len(stacks):] + stacks[: r % len(stacks)]
                    for name in order:
                        url = f"http://127.0.0.1:{port}/{regime.chunks}/{regime.gap_us}/v1"
                        results.setdefault((name, conc), []).append(
                            measure(STACKS[name], url, n, conc)
                        )
            _print_table(regime, stacks, results)
    finally:
        server.terminate()
        server.join()


def _print_table(regime: Regime, stacks: list[str], results: dict[tuple[str, int], list[float]]) -> None:
    concs = list(regime.requests)
    gap = f"{regime.gap_us} µs between chunks" if regime.gap_us else "no pause"
    print(f"\n{regime.name}: {regime.chunks} chunks/request, {gap}; requests per cell "
          + ", ".join(f"{n} at c={c}" for c, n in regime.requests.items()))
    header = f"{'stack':<12}" + "".join(f"{f'c={c} µs/chunk':>17}{'ratio':>7}" for c in concs)
    print(header)
    print("-" * len(header))
    base = {c: statistics.median(results[("aiohttp", c)]) for c in concs if ("aiohttp", c) in results}
    for name in stacks:
        row = f"{name:<12}"
        for c in concs:
            med = statistics.median(results[(name, c)])
            spread = max(results[(name, c)]) - min(results[(name, c)])
            ratio = f"{med / base[c]:.2f}" if c in base else "-"
            row += f"{med:>10.1f} ±{spread / 2:>4.1f}{ratio:>7}"
        print(row)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer requests and rounds (< 60 s)")
    p.add_argument("--rounds", type=int, help="interleaved repetitions (default 5, quick 3)")
    p.add_argument("--stacks", default=",".join(STACKS), help="comma-separated subset")
    args = p.parse_args(argv)
    stacks = args.stacks.split(",")
    unknown = [s for s in stacks if s not in STACKS]
    if unknown:
        p.error(f"unknown stacks: {', '.join(unknown)} (known: {', '.join(STACKS)})")
    if args.quick:
        regimes = [
            Regime("burst", 2000, 0, {1: 2, 16: 16}),
            Regime("paced", 200, 1000, {1: 2, 16: 16}),
        ]
    else:
        regimes = [
            Regime("burst", 2000, 0, {1: 8, 16: 64}),
            Regime("paced", 500, 1000, {1: 4, 16: 32}),
        ]
    started = time.monotonic()
    run(regimes, stacks, args.rounds or (3 if args.quick else 5))
    print(f"\n({time.monotonic() - started:.0f} s; python {sys.version.split()[0]}, "
          f"aiohttp {aiohttp.__version__})")


if __name__ == "__main__":
    main()
