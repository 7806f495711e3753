"""``inferlab gateway`` in front of a real llama.cpp ``llama-server`` with ``[admission]
tokenizer = "upstream"``: its ``/tokenize`` takes text only (``content``), so a
completions prompt is counted by the engine itself, exactly as its usage reports it,
and a chat request by the engine's count of its ChatML text."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from inferlab.engines.llamacpp import LlamaServer
from inferlab.gateway.app import Gateway, start
from inferlab.gateway.config import AdmissionConfig, CacheConfig, GatewayConfig, UpstreamConfig
from inferlab.results.runfiles import read_records

PROMPTS = ["the lighthouse keeper", "a longer prompt about the sea and the ships that pass by the rocks at night " * 5]


async def test_the_gateway_reserves_what_llama_cpp_counts(llama: LlamaServer, tmp_path: Path) -> None:
    cfg = GatewayConfig(upstreams=(UpstreamConfig(llama.url),), admission=AdmissionConfig(tokenizer="upstream"),
                        cache=CacheConfig(enabled=False), access_log=str(tmp_path / "log"))
    gw = Gateway(cfg)
    runner, port = await start(gw, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as s:
            for text in PROMPTS:
                async with s.post(url + "/v1/completions", json={"model": llama.alias, "prompt": text, "max_tokens": 2}) as r:
                    assert r.status == 200, await r.text()
            async with s.post(url + "/v1/chat/completions", json={
                "model": llama.alias, "messages": [{"role": "user", "content": PROMPTS[1]}], "max_tokens": 2,
            }) as r:
                assert r.status == 200, await r.text()
            async with s.get(url + "/metrics") as r:
                page = await r.text()
    finally:
        await runner.cleanup()
    records = list(read_records(tmp_path / "log" / "requests.jsonl"))
    completions, chat = records[:2], records[2]
    assert [r.requested_input_tokens for r in completions] == [r.input_tokens for r in completions]
    assert all(r.input_tokens and r.input_tokens > 3 for r in completions)
    # the chat template llama.cpp applied is not ChatML: close, not exact
    assert chat.input_tokens is not None and chat.requested_input_tokens is not None
    assert abs(chat.requested_input_tokens - chat.input_tokens) <= 0.2 * chat.input_tokens
    assert 'inferlab_gateway_prompt_counts_total{source="upstream"} 3.0' in page

