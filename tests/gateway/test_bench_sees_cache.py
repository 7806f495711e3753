"""``bench`` through ``inferlab gateway`` with its response cache on: a rerun of the same
deterministic requests is answered by the cache, and the run says so (per record, and a
warning in the summary) instead of reporting the cache's latency as the engine's; a
cached answer carries no server timeline of its own (the stored one was the first
request's). Real loopback HTTP, each of the client's HTTP stacks."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from inferlab.gateway.app import Gateway, start
from inferlab.gateway.config import CacheConfig, GatewayConfig, UpstreamConfig
from inferlab.load.run import HttpTarget, RunConfig, RunResult, run
from inferlab.load.schedules import ClosedLoop, LoadConfig
from inferlab.sim.server.launch import ChildServer
from inferlab.workload.config import WorkloadConfig

LIMIT_S = 120.0
SERVE = ["--max-model-len", "4096", "--gpu", "H100", "--enable-prompt-tokens-details"]


async def _bench(url: str, out: Path, http_client: str) -> RunResult:
    config = RunConfig(
        LoadConfig(ClosedLoop(2), num_requests=6, seed=7),
        WorkloadConfig(input_tokens=64, output_tokens=16, prompt_salt=""),  # (as --seed: the same prompts)
        "chat",
        out_dir=str(out),
    )
    target = HttpTarget(url, None, preflight=False, workers=1, http_client=http_client, extra_body={"temperature": 0})
    async with asyncio.timeout(LIMIT_S):
        return await run(config, target)


async def _twice(upstream: str, tmp: Path, cache: bool, http_client: str) -> tuple[RunResult, RunResult]:
    gw = Gateway(GatewayConfig((UpstreamConfig(upstream),), cache=CacheConfig(enabled=cache)))
    runner, port = await start(gw, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{port}"
        return await _bench(url, tmp / "first", http_client), await _bench(url, tmp / "again", http_client)
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("http_client", ["httptools", "aiohttp"])
def test_a_rerun_answered_by_the_gateways_cache_says_so(tmp_path: Path, http_client: str) -> None:
    with ChildServer(SERVE) as server:
        first, again = asyncio.run(_twice(server.url, tmp_path, True, http_client))
    assert all(r.ok for r in first.records + again.records)
    # the first run's prompts were new: every answer generated upstream
    assert [r.response_cache_hit for r in first.records] == [False] * 6
    assert not any("response cache" in w for w in first.summary.warnings)
    assert all(r.server_timeline is not None for r in first.records)
    # the same seed sends the same prompts: every one answered by the cache
    assert [r.response_cache_hit for r in again.records] == [True] * 6
    assert any(w.startswith("6 of 6 completed requests were answered by a response cache") for w in again.summary.warnings)
    assert all(r.server_timeline is None for r in again.records)
    assert again.summary.server_timeline is None
    assert again.summary.ttft_ms is not None and first.summary.ttft_ms is not None
    assert again.summary.ttft_ms.p50 < first.summary.ttft_ms.p50


def test_without_the_cache_nothing_is_said(tmp_path: Path) -> None:
    with ChildServer(SERVE) as server:
        first, again = asyncio.run(_twice(server.url, tmp_path, False, "httptools"))
    for result in (first, again):
        assert [r.response_cache_hit for r in result.records] == [None] * 6  # (no cache: no header)
        assert not any("response cache" in w for w in result.summary.warnings)
        assert all(r.server_timeline is not None for r in result.records)


def test_answers_from_the_response_cache_count_no_prefix_cache_tokens(tmp_path: Path) -> None:
    """Prompts that share a 48-token prefix: upstream, the engine's prefix cache serves it
    to every request after the first, and the usage says so. Replayed by the gateway's
    response cache, that usage is another request's: the replays count no cached tokens,
    and the summary does not call the cache's answers the engine's prefix-cache hits."""
    async def both(upstream: str) -> tuple[RunResult, RunResult]:
        gw = Gateway(GatewayConfig((UpstreamConfig(upstream),), cache=CacheConfig(enabled=True)))
        runner, port = await start(gw, "127.0.0.1", 0)
        try:
            out = []
            for name in ("first", "again"):
                config = RunConfig(LoadConfig(ClosedLoop(1), num_requests=6, seed=7),
                                   WorkloadConfig(prefix_groups=1, prefix_tokens=48, suffix_tokens=16, output_tokens=8,
                                                  prompt_salt=""), "chat", out_dir=str(tmp_path / name))
                target = HttpTarget(f"http://127.0.0.1:{port}", None, preflight=False, workers=1, extra_body={"temperature": 0})
                async with asyncio.timeout(LIMIT_S):
                    out.append(await run(config, target))
            return out[0], out[1]
        finally:
            await runner.cleanup()

    with ChildServer(SERVE) as server:
        first, again = asyncio.run(both(server.url))
    assert (first.summary.cached_tokens or 0) >= 5 * 48  # (the premise: the engine's prefix cache served them)
    assert [r.response_cache_hit for r in again.records] == [True] * 6
    assert [r.cached_tokens for r in again.records] == [0] * 6
    assert again.summary.cached_tokens == 0
    assert not any("prefix cache" in w for w in again.summary.warnings), again.summary.warnings
