"""The response cache never changes an answer: one with tool calls or reasoning, stored
in one form (stream or body), is not rebuilt in the other (that would drop them); the
other form goes upstream. A plain text answer still answers both forms."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from fakeupstream import ChatUpstream
from gateway_helpers import chat_body, metrics, post, serving, total

from inferlab.gateway.config import CacheConfig, GatewayConfig, UpstreamConfig
from inferlab.openai.sse import DONE_EVENT, encode_json

USAGE = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}

#: Each model's answer: the stream's deltas (tool calls streamed in pieces, as vLLM does)
#: and the whole body's message.
DELTAS: dict[str, list[dict[str, Any]]] = {
    "tools": [
        {"role": "assistant", "content": None,
         "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]},
    ],
    "think": [{"role": "assistant", "reasoning_content": "thinking hard"}, {"content": "4"}, {"content": "2"}],
    "plain": [{"role": "assistant", "content": "4"}, {"content": "2"}],
    # (an answer the engine gave up on: SGLang 0.5.6-0.5.9's refusal inside a stream, vLLM's abort)
    "aborted": [{"role": "assistant", "content": ""}],
}
MESSAGES: dict[str, dict[str, Any]] = {
    "tools": {"role": "assistant", "content": None, "tool_calls": [CALL]},
    "think": {"role": "assistant", "content": "42", "reasoning_content": "thinking hard"},
    "plain": {"role": "assistant", "content": "42", "tool_calls": [], "reasoning_content": None},
    "aborted": {"role": "assistant", "content": ""},
}
#: What a client assembles from each model's stream.
ASSEMBLED = {"tools": {"tool_calls": [CALL]}, "think": {"reasoning_content": "thinking hard", "content": "42"}}
FINISH = {"tools": "tool_calls", "think": "stop", "plain": "stop", "aborted": "abort"}


class ToolUpstream(ChatUpstream):
    """Answers ``DELTAS`` / ``MESSAGES`` by model; ``posts`` counts generation requests."""

    models = tuple(DELTAS)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        model = body["model"]
        head = {"id": "chatcmpl-t", "created": 1, "model": model}
        if not body.get("stream"):
            return web.json_response({**head, "object": "chat.completion", "usage": USAGE, "choices": [
                {"index": 0, "message": MESSAGES[model], "logprobs": None, "finish_reason": FINISH[model]}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = {**head, "object": "chat.completion.chunk"}
        for d in DELTAS[model]:
            await resp.write(encode_json({**chunk, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}))
        await resp.write(encode_json({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": FINISH[model]}]}))
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(encode_json({**chunk, "choices": [], "usage": USAGE}))
        await resp.write(DONE_EVENT)
        return resp


def config(url: str) -> GatewayConfig:
    return GatewayConfig(upstreams=(UpstreamConfig(url),), cache=CacheConfig(), metrics_refresh_s=0)


def message(stream_objects: list[dict[str, Any]]) -> dict[str, Any]:
    """A stream's deltas assembled as a client does: text concatenated, tool calls by index."""
    out: dict[str, Any] = {}
    calls: dict[int, dict[str, Any]] = {}
    for o in stream_objects:
        for c in o["choices"]:
            for k, v in c["delta"].items():
                if k == "tool_calls":
                    for tc in v:
                        call = calls.setdefault(tc["index"], {"function": {"arguments": ""}})
                        call.update({x: tc[x] for x in ("id", "type") if x in tc})
                        fn = tc.get("function", {})
                        call["function"]["name"] = fn.get("name", call["function"].get("name"))
                        call["function"]["arguments"] += fn.get("arguments", "")
                elif isinstance(v, str) and k != "role":
                    out[k] = out.get(k, "") + v
    if calls:
        out["tool_calls"] = [calls[i] for i in sorted(calls)]
    return out


@pytest.mark.parametrize("model", ["tools", "think"])
async def test_a_streamed_answer_with_tool_calls_or_reasoning_is_not_rebuilt_as_a_body(model: str) -> None:
    async with ToolUpstream() as up, serving(config(up.url)) as (url, _), aiohttp.ClientSession() as s:
        body = chat_body(model, temperature=0)
        first = await post(s, url, body)
        assert first.headers["x-inferlab-cache"] == "miss"
        whole = await post(s, url, {**body, "stream": False})
        assert whole.headers["x-inferlab-cache"] == "miss" and up.posts == 2  # went upstream
        choice = whole.json()["choices"][0]
        assert choice["message"] == MESSAGES[model] and choice["finish_reason"] == FINISH[model]
        assert message(first.objects()) == ASSEMBLED[model]
        again = await post(s, url, body)  # the same form: replayed as it came, under an id of its own
        assert again.headers["x-inferlab-cache"] == "hit" and again.replays(first) and up.posts == 2
        m = await metrics(s, url)
        assert total(m, "inferlab_gateway_cache_hits_total") == 1
        assert total(m, "inferlab_gateway_cache_misses_total") == 2


async def test_a_body_with_reasoning_is_not_rebuilt_as_a_stream() -> None:
    async with ToolUpstream() as up, serving(config(up.url)) as (url, _), aiohttp.ClientSession() as s:
        body = chat_body("think", stream=False, seed=3)
        assert (await post(s, url, body)).json()["choices"][0]["message"] == MESSAGES["think"]
        stream = await post(s, url, {**body, "stream": True})
        assert stream.headers["x-inferlab-cache"] == "miss" and up.posts == 2
        assert message(stream.objects()) == ASSEMBLED["think"]
        whole = await post(s, url, body)
        assert whole.headers["x-inferlab-cache"] == "hit" and whole.json()["choices"][0]["message"] == MESSAGES["think"]
        assert up.posts == 2


async def test_a_plain_text_answer_still_answers_both_forms() -> None:
    async with ToolUpstream() as up, serving(config(up.url)) as (url, _), aiohttp.ClientSession() as s:
        body = chat_body("plain", temperature=0)
        await post(s, url, body)
        whole = await post(s, url, {**body, "stream": False})
        assert whole.headers["x-inferlab-cache"] == "hit" and up.posts == 1
        assert whole.json()["choices"][0]["message"] == {"role": "assistant", "content": "42"}
    async with ToolUpstream() as up, serving(config(up.url)) as (url, _), aiohttp.ClientSession() as s:
        body = chat_body("plain", stream=False, temperature=0)
        await post(s, url, body)  # (its message's empty tool_calls and null reasoning are no content)
        stream = await post(s, url, {**body, "stream": True})
        assert stream.headers["x-inferlab-cache"] == "hit" and up.posts == 1
        assert json.loads(stream.events[0])["choices"][0]["delta"]["content"] == "42"


@pytest.mark.parametrize("stream", [True, False])
async def test_each_answer_from_the_cache_has_an_id_of_its_own(stream: bool) -> None:
    """An upstream gives every response its own id; two cache hits are two responses, so
    neither reuses the stored answer's id (a client that keys on ids sees them apart),
    in either form, and the rest of the answer is as stored."""
    async with ToolUpstream() as up, serving(config(up.url)) as (url, _), aiohttp.ClientSession() as s:
        body = chat_body("plain", temperature=0, stream=stream)
        answers = [await post(s, url, body) for _ in range(3)]
        assert [a.headers["x-inferlab-cache"] for a in answers] == ["miss", "hit", "hit"] and up.posts == 1
        if stream:
            ids = [{json.loads(e)["id"] for e in a.events[:-1]} for a in answers]
            assert all(len(i) == 1 for i in ids)  # (one id through each stream)
            ids_flat = [i.pop() for i in ids]
            texts = [message(a.objects()) for a in answers]
        else:
            ids_flat = [a.json()["id"] for a in answers]
            texts = [a.json()["choices"][0]["message"] for a in answers]
        assert ids_flat[0] == "chatcmpl-t" and len(set(ids_flat)) == 3
        assert all(i.startswith("chatcmpl-") for i in ids_flat)
        assert texts[1] == texts[2] == texts[0]


@pytest.mark.parametrize("stream", [True, False])
async def test_an_answer_the_upstream_ended_abort_is_not_kept(stream: bool) -> None:
    """An answer that ends with finish_reason "abort" is the engine giving up (bench fails
    it): the cache kept it and replayed it as a hit to every later identical request, an
    abort that may have been the engine's state at the time (a full KV cache, a restart)."""
    async with ToolUpstream() as up, serving(config(up.url)) as (url, _), aiohttp.ClientSession() as s:
        body = chat_body("aborted", temperature=0, stream=stream)
        answers = [await post(s, url, body) for _ in range(2)]
        assert [a.headers["x-inferlab-cache"] for a in answers] == ["miss", "miss"] and up.posts == 2
        finish = [o["choices"][0]["finish_reason"] for o in answers[1].objects() if o["choices"]][-1] if stream \
            else answers[1].json()["choices"][0]["finish_reason"]
        assert finish == "abort"  # (relayed as it came)
        seen = await metrics(s, url)
        assert total(seen, "inferlab_gateway_cache_hits_total") == 0
        # (counted a failure, as bench counts it, not a success)
        assert total(seen, "gen_ai_server_request_duration_seconds_count", error_type="stream_error") == 2
        assert total(seen, "gen_ai_server_request_duration_seconds_count", error_type="") == 0


def test_an_event_is_plain_unless_a_member_beside_its_text_has_a_value() -> None:
    from inferlab.gateway.cache import plain_event

    def event(delta: dict[str, Any]) -> str:
        return json.dumps({"choices": [{"index": 0, "delta": delta}]})

    assert plain_event(event({"content": "my reasoning: tool_calls and refusal"}))
    assert plain_event(event({"content": "x", "reasoning_content": None, "tool_calls": []}))
    assert not plain_event(event({"reasoning": "hm"}))
    assert not plain_event(event({"refusal": "no"}))
