"""``[admission] tokenizer = "upstream"``: the gateway counts a request's prompt tokens
with its upstream's own ``/tokenize`` before admitting it, so the reservation is the
engine's own count (chat template included); where an upstream has no such route it
estimates, and says which counted in ``/metrics``. Real loopback HTTP: ``sim serve`` in
a child process (its ``/tokenize`` is vLLM's), the fake upstream (no ``/tokenize``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fakeupstream import FakeUpstream
from gateway_helpers import chat_body, metrics, post, serving, total

from inferlab.gateway.config import AdmissionConfig, CacheConfig, GatewayConfig, UpstreamConfig
from inferlab.results.runfiles import read_records
from inferlab.sim.server.launch import ChildServer

PROMPTS = ["hello there", "a somewhat longer question about the lighthouse keeper's daily routine " * 7,
           "x" * 400, "多言語のテキストも数える"]


def gateway(upstream: str, tokenizer: str, log: Path) -> GatewayConfig:
    return GatewayConfig(upstreams=(UpstreamConfig(upstream),), admission=AdmissionConfig(tokenizer=tokenizer),
                         cache=CacheConfig(enabled=False), access_log=str(log))


async def reserved_and_used(upstream: str, model: str, tokenizer: str, log: Path, api: str) -> list[tuple[Any, Any]]:
    """(the prompt tokens the gateway reserved, the engine's usage) per request."""
    async with serving(gateway(upstream, tokenizer, log)) as (url, _), aiohttp.ClientSession() as s:
        for text in PROMPTS:
            if api == "chat":
                ans = await post(s, url, chat_body(model, text, max_tokens=4))
            else:
                ans = await post(s, url, {"model": model, "prompt": text, "max_tokens": 4, "stream": True},
                                 path="/v1/completions")
            assert ans.status == 200, ans.body
        m = await metrics(s, url)
    assert total(m, "inferlab_gateway_prompt_counts_total", source="upstream" if tokenizer == "upstream" else "estimate") == len(PROMPTS)
    return [(r.requested_input_tokens, r.input_tokens) for r in read_records(log / "requests.jsonl")]


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_the_upstreams_tokenize_makes_the_reservation_the_engines_count(api: str, tmp_path: Path) -> None:
    server = ChildServer(["--max-model-len", "4096"])
    try:
        async with aiohttp.ClientSession() as s, s.get(server.url + "/v1/models") as resp:
            model = (await resp.json())["data"][0]["id"]
        exact = await reserved_and_used(server.url, model, "upstream", tmp_path / "upstream", api)
        estimated = await reserved_and_used(server.url, model, "estimate", tmp_path / "estimate", api)
    finally:
        server.close()
    assert all(isinstance(used, int) and used > 0 for _, used in exact)
    assert [r for r, _ in exact] == [u for _, u in exact]  # what was reserved is what the engine counted
    assert [u for _, u in estimated] == [u for _, u in exact]  # (the same requests)
    assert sum(r != u for r, u in estimated) >= 2  # (four characters a token is not the engine's count)


async def test_an_upstream_without_tokenize_is_estimated_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with FakeUpstream() as up:
        cfg = gateway(up.url, "upstream", tmp_path / "log")
        async with serving(cfg) as (url, _), aiohttp.ClientSession() as s:
            for text in ("ok", "ok again"):
                assert (await post(s, url, chat_body("ok", text))).status == 200
            m = await metrics(s, url)
    assert total(m, "inferlab_gateway_prompt_counts_total", source="estimate") == 2
    assert total(m, "inferlab_gateway_prompt_counts_total", source="upstream") == 0
    assert sum("has no /tokenize" in r.getMessage() for r in caplog.records) == 1
    reserved = [r.requested_input_tokens for r in read_records(tmp_path / "log" / "requests.jsonl")]
    from inferlab.gateway.estimate import prompt_counter, prompt_tokens

    assert reserved == [prompt_tokens(chat_body("ok", t), True, prompt_counter("estimate")) for t in ("ok", "ok again")]
