"""The point of admission by tokens, measured end to end: two ``sim serve`` upstreams
(child processes) behind the gateway, 8k-token prompts flooding in from 24 closed-loop
clients, short chats arriving among them. Admission by requests (4 per upstream, in
arrival order: what gateways usually do) queues the short chats behind the flood;
admission by tokens (two 8k prompts' worth per upstream, smallest first) lets them
through. Ratios only: p99 TTFT of the short chats, and the flood's throughput."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from gateway_helpers import serving

from inferlab._clock import NS_PER_S, WallClock
from inferlab.gateway.config import (
    AdmissionConfig,
    AdmissionMode,
    CacheConfig,
    GatewayConfig,
    UpstreamConfig,
)
from inferlab.openai.sse import SSEParser
from inferlab.sim.server.launch import ChildServer
from inferlab.workload.prompts import words

BIG_TOKENS = 8000
FLOOD_CLIENTS = 24
SHORTS = 20
SHORT_GAP_S = 0.1
clock = WallClock()


async def ttft_s(s: aiohttp.ClientSession, url: str, model: str, text: str, max_tokens: int) -> float:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "stream": True, "ignore_eos": True}
    t0 = clock.now_ns()
    first: int | None = None
    async with s.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        parser = SSEParser()
        async for chunk in resp.content.iter_any():
            if first is None and any('"content":"' in e and '"content":""' not in e for e in parser.feed(chunk)):
                first = clock.now_ns()
    assert first is not None
    return (first - t0) / NS_PER_S


async def flood(mode: AdmissionMode, upstreams: list[str], model: str) -> tuple[float, float]:
    """(the short chats' p99 TTFT in s, the flood's prompts completed per second)."""
    adm = AdmissionConfig(mode=mode, max_tokens_in_flight=2 * BIG_TOKENS + 2000, max_requests_in_flight=4,
                          queue_max=1000, queue_timeout_s=120, starvation_s=10, tokenizer="builtin")
    cfg = GatewayConfig(upstreams=tuple(UpstreamConfig(u) for u in upstreams), admission=adm,
                        cache=CacheConfig(enabled=False))
    done = 0
    stop = asyncio.Event()
    async with serving(cfg) as (url, _), aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def big(c: int) -> None:
            nonlocal done
            for i in range(1000):  # bounded; stops when the short chats are done
                if stop.is_set():
                    return
                await ttft_s(s, url, model, " ".join(words(f"{mode}-big{c}-{i}", BIG_TOKENS)), 16)
                done += 1

        async def short(i: int) -> float:
            await asyncio.sleep(i * SHORT_GAP_S)
            return await ttft_s(s, url, model, " ".join(words(f"{mode}-short{i}", 50)), 8)

        async with asyncio.timeout(120):
            t0 = clock.now_ns()
            bigs = [asyncio.create_task(big(c)) for c in range(FLOOD_CLIENTS)]
            await asyncio.sleep(1.0)  # the flood first
            shorts = sorted(await asyncio.gather(*(short(i) for i in range(SHORTS))))
            stop.set()
            await asyncio.gather(*bigs)
            elapsed_s = (clock.now_ns() - t0) / NS_PER_S
    return shorts[-1], done / elapsed_s  # (20 samples: p99 is the largest)


@pytest.mark.slow
async def test_admission_by_tokens_keeps_short_chats_ttft_p99_3x_lower_at_the_same_throughput() -> None:
    servers = [ChildServer(["--max-model-len", "16384"]) for _ in range(2)]
    try:
        async with aiohttp.ClientSession() as s, s.get(servers[0].url + "/v1/models") as resp:
            model: Any = (await resp.json())["data"][0]["id"]
        urls = [sv.url for sv in servers]
        by_requests = await flood("requests", urls, model)
        by_tokens = await flood("tokens", urls, model)
    finally:
        for sv in servers:
            sv.close()
    print(f"short chats' TTFT p99: by requests {by_requests[0]:.3f} s, by tokens {by_tokens[0]:.3f} s; "
          f"flood: {by_requests[1]:.2f} vs {by_tokens[1]:.2f} prompts/s")
    assert by_requests[0] >= 3 * by_tokens[0]
    assert by_tokens[1] >= 0.8 * by_requests[1]
