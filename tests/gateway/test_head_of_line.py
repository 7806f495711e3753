"""The point of admission by tokens, measured end to end: two ``sim serve`` upstreams
(child processes) behind the gateway, 8k-token prompts flooding in from 24 closed-loop
clients, short chats arriving among them. Admission by requests (4 per upstream, in
arrival order: what gateways usually do) queues the short chats behind the flood;
admission by tokens (two 8k prompts' worth per upstream, smallest first) lets them
through. Ratios only: p99 TTFT of the short chats, and the flood's throughput.

``sim run --admission`` runs the same admission code in front of simulated engines in
virtual time; the last test checks that it predicts the same, in a second."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner
from gateway_helpers import serving

from inferlab._clock import NS_PER_S, WallClock
from inferlab.cli.main import main
from inferlab.gateway.config import (
    AdmissionConfig,
    AdmissionMode,
    CacheConfig,
    GatewayConfig,
    UpstreamConfig,
)
from inferlab.openai.sse import SSEParser
from inferlab.results.metrics import request_metrics
from inferlab.results.records import RequestRecord
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


def flood_trace(path: Path, bigs_each: int) -> None:
    """The same flood as a run's requests.jsonl that ``sim run --trace`` replays: each
    flood client sends its prompts one after another (a closed-loop user), the short
    chats each at its own time."""
    lines = []
    for c in range(FLOOD_CLIENTS):
        for i in range(bigs_each):
            lines.append(RequestRecord(len(lines), intended_send_ns=i, send_ns=i, end_ns=i + 1, content_ns=[i + 1],
                                       input_tokens=BIG_TOKENS, output_tokens=16, user=c))
    for k in range(SHORTS):
        t = int((1.0 + k * SHORT_GAP_S) * NS_PER_S)
        lines.append(RequestRecord(len(lines), intended_send_ns=t, send_ns=t, end_ns=t + 1, content_ns=[t + 1],
                                   input_tokens=50, output_tokens=8, user=FLOOD_CLIENTS + k))
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in lines))


def simulated_flood(tmp_path: Path, mode: str, *budget: str) -> tuple[float, float]:
    """(the short chats' p99 TTFT in s, the flood's prompts completed per second), from
    ``sim run`` on two engines as ``sim serve`` runs them, behind the gateway's admission."""
    out = tmp_path / mode
    result = CliRunner().invoke(main, [
        "sim", "run", "--trace", str(tmp_path / "flood.jsonl"), "--max-model-len", "16384",
        "--max-num-batched-tokens", "8192", "--enforce-eager", "--replicas", "2", "--router", "least-outstanding",
        "--admission", mode, *budget, "--queue-max", "1000", "--queue-timeout-s", "120", "-o", str(out), "--json",
    ])
    assert result.exit_code == 0, result.output
    records = [RequestRecord.from_json(json.loads(line)) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert all(r.ok for r in records)
    shorts = sorted(request_metrics(r).ttft_ms or 0.0 for r in records if r.input_tokens == 50)
    bigs = [r for r in records if r.input_tokens == BIG_TOKENS]
    assert len(shorts) == SHORTS and len(bigs) == FLOOD_CLIENTS * 6
    first = min(r.send_ns or 0 for r in records)
    last = max(r.end_ns or 0 for r in bigs)
    return shorts[-1] / 1e3, len(bigs) / ((last - first) / NS_PER_S)


def test_sim_run_with_the_gateways_admission_agrees_the_short_chats_ttft_p99_is_lower_by_tokens(tmp_path: Path) -> None:
    # the flood above, in virtual time: the same admission code in front of two simulated
    # engines (sim serve's sizes), the same budgets. Measured over HTTP: 2.95 s against
    # 0.43 s at 6.2 against 6.9 prompts/s (docs/gateway.md); predicted here: 3.07 s against
    # 0.41 s at 7.0 against 8.3 prompts/s
    flood_trace(tmp_path / "flood.jsonl", bigs_each=6)
    by_requests = simulated_flood(tmp_path, "requests", "--max-requests-in-flight", "4")
    by_tokens = simulated_flood(tmp_path, "tokens", "--max-tokens-in-flight", str(2 * BIG_TOKENS + 2000),
                                "--starvation-s", "10")
    assert by_requests[0] >= 3 * by_tokens[0]
    assert by_tokens[1] >= 0.8 * by_requests[1]
