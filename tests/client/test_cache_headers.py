"""Which response-cache headers mean the answer came from a cache (``response_cache_hit``),
read off real loopback HTTP by each of the client's stacks: Portkey's semantic hits,
Fastly's shielded lists (any entry but MISS: served from a cache, per Fastly's X-Cache
reference), Cloudflare's statuses (HIT, STALE, UPDATING, REVALIDATED served from its
cache; MISS, EXPIRED, BYPASS, DYNAMIC not), CloudFront's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web

from inferlab.load.run import HttpTarget, RunConfig, run
from inferlab.load.schedules import ClosedLoop, LoadConfig
from inferlab.openai.response import Completion
from inferlab.workload.config import WorkloadConfig

#: (header, value, a hit?), one request each, in this order.
CASES = [
    ("x-portkey-cache-status", "SEMANTIC HIT", True),
    ("x-portkey-cache-status", "SEMANTIC MISS", False),
    ("x-portkey-cache-status", "REFRESH", False),
    ("x-cache", "MISS, HIT", True),  # (Fastly, shielded: the edge answered from its cache)
    ("x-cache", "HIT, MISS", True),  # (the shield's cache answered the edge's miss)
    ("x-cache", "MISS, MISS", False),
    ("x-cache", "Hit from cloudfront", True),
    ("x-cache", "RefreshHit from cloudfront", True),
    ("x-cache", "Miss from cloudfront", False),
    ("cf-cache-status", "HIT", True),
    ("cf-cache-status", "STALE", True),
    ("cf-cache-status", "UPDATING", True),
    ("cf-cache-status", "REVALIDATED", True),
    ("cf-cache-status", "MISS", False),
    ("cf-cache-status", "EXPIRED", False),
    ("cf-cache-status", "BYPASS", False),
    ("cf-cache-status", "DYNAMIC", False),
    ("helicone-cache", "HIT", True),
]


async def _bench(http_client: str, out: Path) -> list[bool | None]:
    left = list(CASES)

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        name, value, _ = left.pop(0)
        c = Completion("cmpl-h", True, 0, "m")
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        return web.json_response(c.body("hi", "stop", usage), headers={name: value})

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        config = RunConfig(LoadConfig(ClosedLoop(1), num_requests=len(CASES), seed=1),
                           WorkloadConfig(input_tokens=8, output_tokens=4), "chat", out_dir=str(out))
        target = HttpTarget(url, None, preflight=False, workers=1, http_client=http_client)
        async with asyncio.timeout(60):
            result = await run(config, target)
    finally:
        await runner.cleanup()
    return [r.response_cache_hit for r in sorted(result.records, key=lambda r: r.send_ns)]


@pytest.mark.parametrize("http_client", ["httptools", "aiohttp"])
def test_each_caches_header_is_read_as_it_means(http_client: str, tmp_path: Path) -> None:
    got = asyncio.run(_bench(http_client, tmp_path / "run"))
    assert got == [hit for _, _, hit in CASES], [(n, v) for (n, v, hit), g in zip(CASES, got, strict=True) if g != hit]
