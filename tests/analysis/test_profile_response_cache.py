"""``profile``'s response-cache probe against a server that has one: ``inferlab gateway``
(its response cache on) in front of ``sim serve``, over real loopback HTTP; and the same
engine without the cache, where nothing may be detected."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from inferlab.analysis.profile import ProfileConfig, profile, read_profile
from inferlab.gateway.app import Gateway, start
from inferlab.gateway.config import CacheConfig, GatewayConfig, UpstreamConfig
from inferlab.sim.server.launch import ChildServer

LIMIT_S = 120.0
SERVE = ["--max-model-len", "4096", "--gpu", "H100"]


async def _profile(out: Path, url: str) -> None:
    config = ProfileConfig(str(out), budget_s=60, factors=("response_cache",))
    async with asyncio.timeout(LIMIT_S):
        await profile(config, url)


async def _through_gateway(out: Path, upstream: str, cache: bool) -> int:
    """Profile through a gateway whose cache is on or off; the cache hits it counted."""
    gw = Gateway(GatewayConfig((UpstreamConfig(upstream),), cache=CacheConfig(enabled=cache)))
    runner, port = await start(gw, "127.0.0.1", 0)
    try:
        await _profile(out, f"http://127.0.0.1:{port}")
        return sum(int(sample.value) for family in gw.metrics.registry.collect() for sample in family.samples
                   if sample.name == "inferlab_gateway_cache_hits_total")
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("cache", [True, False], ids=["cache-on", "cache-off"])
def test_the_probe_detects_a_response_cache_only_where_there_is_one(tmp_path: Path, cache: bool) -> None:
    with ChildServer(SERVE) as server:
        hits = asyncio.run(_through_gateway(tmp_path / "p", server.url, cache))
    factor = read_profile(tmp_path / "p").factor("response_cache")
    assert factor is not None and factor.measured
    assert factor.data["detected"] is cache, factor.cost
    if cache:
        # the repeats were answered without generating: far below a fresh request
        assert factor.data["ratio"] < 0.5 and factor.data["decode_ratio"] < 0.5
        assert hits >= 4  # (the gateway's own count: the probe's repeats were its hits)
    else:
        # the simulator's prefix cache speeds a repeat's prefill, not its generation
        assert factor.data["decode_ratio"] > 0.5
        assert hits == 0
