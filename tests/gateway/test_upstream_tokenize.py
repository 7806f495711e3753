"""``[admission] tokenizer = "upstream"``: the gateway counts a request's prompt tokens
with its upstream's own ``/tokenize`` before admitting it, so the reservation is the
engine's own count (chat template included); where an upstream has no such route it
estimates, and says which counted in ``/metrics``. Real loopback HTTP: ``sim serve`` in
a child process (its ``/tokenize`` is vLLM's), the fake upstream (no ``/tokenize``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from fakeupstream import FakeUpstream
from gateway_helpers import chat_body, metrics, post, serving, total

from inferlab.gateway import estimate
from inferlab.gateway.config import AdmissionConfig, CacheConfig, GatewayConfig, UpstreamConfig
from inferlab.gateway.estimate import UpstreamTokens
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


class TokenizingUpstream(FakeUpstream):
    """The fake upstream with a ``/tokenize`` that answers each call as ``answers`` says
    (the last one again once they run out): ``count`` (7 tokens), ``503``, ``hang``,
    ``deep`` (JSON nested too deep to decode), or ``400-messages`` (400 to a body of
    messages, a count to text)."""

    def __init__(self, *answers: str) -> None:
        super().__init__()
        self.answers = answers
        self.calls = 0

    async def _any(self, request: web.Request) -> web.StreamResponse:
        if request.path != "/tokenize":
            return await super()._any(request)
        raw = await request.read()
        how = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if how == "400-messages":  # (refuses a body of messages, counts text)
            how = "400" if b'"messages"' in raw else "count"
        if how == "400":
            return web.json_response({"error": {"message": "bad messages"}}, status=400)
        if how == "503":
            return web.json_response({"error": {"message": "loading"}}, status=503)
        if how == "hang":
            await asyncio.sleep(60)
        if how == "deep":
            return web.Response(text="[" * 100_000, content_type="application/json")
        return web.json_response({"count": 7, "tokens": list(range(7))})


async def counted(up: TokenizingUpstream, requests: int, log: Path) -> tuple[list[Any], dict[Any, float]]:
    async with serving(gateway(up.url, "upstream", log)) as (url, _), aiohttp.ClientSession() as s:
        for i in range(requests):
            assert (await post(s, url, chat_body("ok", f"request {i}"))).status == 200
        m = await metrics(s, url)
    return [r.requested_input_tokens for r in read_records(log / "requests.jsonl")], m


async def test_an_error_status_does_not_retire_the_route(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(Found in review: one 503 while the engine loaded turned the route off for good.)"""
    monkeypatch.setattr(UpstreamTokens, "BACKOFF_S", 0.0)
    async with TokenizingUpstream("503", "count") as up:
        reserved, m = await counted(up, 3, tmp_path / "log")
    assert total(m, "inferlab_gateway_prompt_counts_total", source="estimate") == 1
    assert total(m, "inferlab_gateway_prompt_counts_total", source="upstream") == 2
    assert reserved[1:] == [7, 7]


async def test_a_route_that_hangs_costs_one_request_its_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(estimate, "TOKENIZE_TIMEOUT_S", 0.3)
    async with TokenizingUpstream("hang") as up:
        _, m = await counted(up, 4, tmp_path / "log")
        assert up.calls == 1  # (the rest were not asked: the route rests after no answer)
    assert total(m, "inferlab_gateway_prompt_counts_total", source="estimate") == 4


async def test_an_answer_too_deep_to_decode_is_no_count_not_an_error(tmp_path: Path) -> None:
    async with TokenizingUpstream("deep") as up:
        _, m = await counted(up, 2, tmp_path / "log")  # (each answered 200: counted() checks)
    assert total(m, "inferlab_gateway_prompt_counts_total", source="estimate") == 2


async def test_a_route_that_refuses_one_body_is_asked_again(tmp_path: Path) -> None:
    """A 400 to a chat request's messages says nothing of the route: its ChatML text is
    counted instead, and the next request is counted too (no rest)."""
    async with TokenizingUpstream("400-messages") as up:
        reserved, m = await counted(up, 3, tmp_path / "log")
        assert up.calls == 6  # (messages, then text, for each request)
    assert total(m, "inferlab_gateway_prompt_counts_total", source="upstream") == 3
    assert reserved == [7, 7, 7]
