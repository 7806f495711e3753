"""The gateway over loopback against scripted upstreams (``fakeupstream.py``): what
passes, what is refused, and that nothing reaches an address it was not configured with."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from collections.abc import Callable

import aiohttp
import pytest
from fakeupstream import TEXTS, USAGE, FakeUpstream
from gateway_helpers import chat_body, post, serving

from inferlab.gateway.config import (
    AdmissionConfig,
    CacheConfig,
    GatewayConfig,
    KeyConfig,
    UpstreamConfig,
    hash_key,
)
from inferlab.openai.sse import SSEParser

ALICE = "sk-alice-123"
UPSTREAM_KEY = "upstream-secret-456"


def config(*urls: str, keys: bool = True, **kw: object) -> GatewayConfig:
    return GatewayConfig(
        upstreams=tuple(UpstreamConfig(u, api_key=UPSTREAM_KEY) for u in urls),
        keys=(KeyConfig("alice", hash_key(ALICE)),) if keys else (),
        cache=CacheConfig(enabled=False),
        **kw,  # type: ignore[arg-type]
    )


AUTH = {"Authorization": f"Bearer {ALICE}"}


async def test_a_stream_passes_through_with_the_upstreams_key_and_without_the_clients() -> None:
    async with FakeUpstream() as up, serving(config(up.url)) as (url, _), aiohttp.ClientSession() as s:
        ans = await post(s, url, chat_body("ok"), {**AUTH, "X-Custom": "1"})
        assert ans.status == 200
        assert ans.text() == "".join(TEXTS)
        assert ans.events[-1] == "[DONE]"
        # the client did not ask for usage: the gateway asked upstream, and dropped it again
        assert not any("usage" in o for o in ans.objects())
        (seen,) = [r for r in up.seen if r["path"] == "/v1/chat/completions"]
        assert json.loads(seen["body"])["stream_options"] == {"include_usage": True}
        assert seen["headers"]["Authorization"] == f"Bearer {UPSTREAM_KEY}"
        assert ALICE not in json.dumps(seen["headers"]) and "X-Custom" not in seen["headers"]
        assert UPSTREAM_KEY not in json.dumps(ans.headers) and UPSTREAM_KEY.encode() not in ans.body


async def test_the_usage_chunk_reaches_a_client_that_asked_for_it() -> None:
    async with FakeUpstream() as up, serving(config(up.url)) as (url, _), aiohttp.ClientSession() as s:
        ans = await post(s, url, chat_body("ok", stream_options={"include_usage": True}), AUTH)
        assert ans.objects()[-1]["usage"] == USAGE
        whole = await post(s, url, chat_body("ok", stream=False), AUTH)
        assert whole.status == 200 and whole.json()["usage"] == USAGE


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer sk-wrong"}, 401), ({"Authorization": ALICE}, 401), (AUTH, 200)],
)
async def test_a_request_without_a_valid_key_gets_401(headers: dict[str, str], status: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with FakeUpstream() as up, serving(config(up.url)) as (url, _), aiohttp.ClientSession() as s:
        ans = await post(s, url, chat_body("ok"), headers)
        assert ans.status == status
        if status == 401:
            assert ans.json()["error"]["type"] == "AuthenticationError"
            # (the gateway's own reads: models, load, a slot's context)
            assert not [r for r in up.seen if r["path"] not in ("/v1/models", "/metrics", "/props")]
        models = await post(s, url, b"", headers, path="/v1/models")  # (POST: not a route)
        assert models.status == 405
    assert ALICE not in caplog.text and "sk-wrong" not in caplog.text


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (b"\xff\xfe", 400, None),
        (json.dumps(chat_body("ok", max_tokens=0)).encode(), 400, "max_tokens"),
        (json.dumps(chat_body("ok", temperature="hot")).encode(), 400, "temperature"),
        (json.dumps({"model": "ok", "messages": []}).encode(), 400, "messages"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(), 400, "model"),
        (json.dumps(chat_body("no-such-model")).encode(), 404, "model"),
        (b"x" * 5000, 413, None),
    ],
)
async def test_bad_input_gets_a_4xx_in_openai_format(body: bytes, status: int, param: str | None) -> None:
    async with FakeUpstream() as up, serving(config(up.url, max_body_bytes=4096)) as (url, _), aiohttp.ClientSession() as s:
        ans = await post(s, url, body, AUTH)
        assert ans.status == status
        err = ans.json()["error"]
        assert err["code"] == status and err["message"] and err["param"] == param
        assert not [r for r in up.seen if r["path"].startswith("/v1/chat")]


async def test_the_path_and_host_the_client_sends_choose_no_destination() -> None:
    async with FakeUpstream() as up, FakeUpstream() as bystander, serving(config(up.url)) as (url, _):
        host, port = url.removeprefix("http://").split(":")
        tricks = [
            f"POST http://127.0.0.1:{bystander.port}/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{bystander.port}",
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{bystander.port}",
            f"POST /v1/chat/completions/../../v1/chat/completions HTTP/1.1\r\nHost: {host}",
            f"POST //127.0.0.1:{bystander.port}/v1/chat/completions HTTP/1.1\r\nHost: {host}",
            f"GET /v1/models?url=http://127.0.0.1:{bystander.port} HTTP/1.1\r\nHost: {host}",
            f"POST /v1/../health HTTP/1.1\r\nHost: {host}",
        ]
        body = json.dumps(chat_body("ok", stream=False)).encode()
        for head in tricks:
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(f"{head}\r\nAuthorization: Bearer {ALICE}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            await writer.drain()
            reply = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            assert not reply.startswith(b"HTTP/1.1 5"), (head, reply[:200])
        assert bystander.seen == []
        assert all(r["path"] in ("/v1/models", "/v1/chat/completions", "/health", "/metrics", "/props") for r in up.seen)


@pytest.mark.parametrize("stack", ["httptools", "aiohttp"])
async def test_a_failure_before_the_first_byte_is_retried_on_another_upstream(stack: str) -> None:
    async with FakeUpstream(models=("ok",)) as up:
        closed = "http://127.0.0.1:9"  # discard port: nothing listens, the connection is refused
        cfg = config(closed, up.url, http_client=stack)
        async with serving(cfg) as (url, gw), aiohttp.ClientSession() as s:
            gw._models = {"ok": {0, 1}}  # as if the closed one had listed it before it went down
            gw._models_at_ns = gw.clock.now_ns()
            for _ in range(4):
                ans = await post(s, url, chat_body("ok"), AUTH)
                assert ans.status == 200 and ans.text() == "".join(TEXTS)
            assert sum(1 for r in up.seen if r["path"] == "/v1/chat/completions") == 4
            assert gw.admission.tokens_in_flight == [0, 0] and gw.admission.requests_in_flight == [0, 0]


@pytest.mark.parametrize("stack", ["httptools", "aiohttp"])
async def test_an_upstream_5xx_on_every_upstream_is_a_502_in_openai_format(stack: str) -> None:
    async with FakeUpstream() as up, serving(config(up.url, http_client=stack)) as (url, gw), aiohttp.ClientSession() as s:
        ans = await post(s, url, chat_body("e500"), AUTH)
        assert ans.status == 502
        assert "engine fell over" in ans.json()["error"]["message"]
        assert sum(1 for r in up.seen if r["path"] == "/v1/chat/completions") == 2  # the only one, twice
        assert gw.admission.requests_in_flight == [0]


async def test_a_failure_mid_stream_ends_the_stream_with_an_error_event() -> None:
    async with FakeUpstream() as up, serving(config(up.url)) as (url, gw), aiohttp.ClientSession() as s:
        ans = await post(s, url, chat_body("die"), AUTH)
        assert ans.status == 200
        objs = ans.objects()
        assert ans.text() == "".join(TEXTS[:2])
        assert "error" in objs[-1] and objs[-1]["error"]["code"] == 502
        assert ans.events[-1] == "[DONE]"
        assert gw.admission.tokens_in_flight == [0]


@pytest.mark.parametrize("stack", ["httptools", "aiohttp"])
async def test_a_client_that_goes_away_cancels_the_upstream_request_and_frees_its_room(stack: str) -> None:
    async with FakeUpstream(long_chunks=1000, gap_s=0.01) as up, serving(config(up.url, http_client=stack)) as (url, gw):
        async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=chat_body("long"), headers=AUTH) as resp:
            await resp.content.readany()
            assert gw.admission.requests_in_flight == [1]
        for _ in range(200):  # bounded: 2 s at most
            if up.cancelled and gw.admission.requests_in_flight == [0]:
                break
            await asyncio.sleep(0.01)
        assert up.cancelled == 1
        assert gw.admission.requests_in_flight == [0] and gw.admission.tokens_in_flight == [0]


async def test_models_are_merged_and_each_model_goes_only_where_it_is_served() -> None:
    async with FakeUpstream(models=("ok", "a")) as a, FakeUpstream(models=("ok", "b")) as b, \
            serving(config(a.url, b.url)) as (url, _), aiohttp.ClientSession() as s:
        async with s.get(url + "/v1/models", headers=AUTH) as resp:
            ids = sorted(m["id"] for m in (await resp.json())["data"])
        assert ids == ["a", "b", "ok"]
        for _ in range(3):
            assert (await post(s, url, chat_body("b", stream=False), AUTH)).status == 200
        assert [json.loads(r["body"])["model"] for r in b.seen if r["method"] == "POST"] == ["b"] * 3
        assert not [r for r in a.seen if r["method"] == "POST"]
        async with s.get(url + "/v1/models") as resp:
            assert resp.status == 401


async def test_health_says_which_upstreams_answer() -> None:
    async with FakeUpstream() as up, serving(config(up.url, "http://127.0.0.1:9")) as (url, _), \
            aiohttp.ClientSession() as s, s.get(url + "/health") as resp:
        assert resp.status == 200
        assert await resp.json() == {"upstreams": {f"127.0.0.1:{up.port}": True, "127.0.0.1:9": False}}
    async with serving(config("http://127.0.0.1:9")) as (url, _), aiohttp.ClientSession() as s, s.get(url + "/health") as resp:
        assert resp.status == 503


async def until(condition: Callable[[], bool], limit_s: float = 2.0) -> None:
    """Wait (bounded) until the gateway's state says ``condition``."""
    for _ in range(int(limit_s / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)


async def test_a_full_queue_answers_503_with_retry_after() -> None:
    adm = AdmissionConfig(mode="requests", max_requests_in_flight=1, queue_max=0)
    async with FakeUpstream(long_chunks=50, gap_s=0.01) as up, serving(config(up.url, admission=adm)) as (url, gw), \
            aiohttp.ClientSession() as s:
        first = asyncio.create_task(post(s, url, chat_body("long"), AUTH))
        await until(lambda: gw.admission.requests_in_flight == [1])
        second = await post(s, url, chat_body("ok"), AUTH)
        assert second.status == 503 and second.headers["Retry-After"] == "1"
        assert second.json()["error"]["type"] == "ServiceUnavailableError"
        assert (await first).status == 200


async def test_the_queue_wait_histogram_counts_admissions_only() -> None:
    """One long stream (2 s) holds the only slot; a second request waits its 0.5 s in the
    queue and is refused (503); a third is refused at a full queue. Neither was admitted:
    the wait histogram (the admitted requests' part of their TTFT) holds the first alone,
    and the refusals count the other two, by reason."""
    from gateway_helpers import metrics, total

    adm = AdmissionConfig(mode="requests", max_requests_in_flight=1, queue_max=1, queue_timeout_s=0.5)
    async with FakeUpstream(long_chunks=200, gap_s=0.01) as up, serving(config(up.url, admission=adm)) as (url, gw), \
            aiohttp.ClientSession() as s:
        first = asyncio.create_task(post(s, url, chat_body("long"), AUTH))
        await until(lambda: gw.admission.requests_in_flight == [1])
        waiting = asyncio.create_task(post(s, url, chat_body("ok"), AUTH))
        await until(lambda: gw.admission.queue_length == 1)
        full = await post(s, url, chat_body("ok"), AUTH)
        assert full.status == 503 and (await waiting).status == 503
        assert (await first).status == 200
        m = await metrics(s, url)
    assert total(m, "inferlab_gateway_queue_wait_seconds_count") == 1
    assert total(m, "inferlab_gateway_queue_wait_seconds_sum") == 0  # (the first, let in at once)
    assert total(m, "inferlab_gateway_rejections_total", reason="queue_timeout") == 1
    assert total(m, "inferlab_gateway_rejections_total", reason="queue_full") == 1


async def test_what_the_gateway_does_not_take_is_refused_in_its_own_words() -> None:
    """A gzip body: 415 naming the encoding (not "not valid JSON"); a batch of prompts:
    400 naming the gateway, not the simulator; /tokenize with a model that is no string:
    400, not relayed as if it had none."""
    async with FakeUpstream() as up, serving(config(up.url)) as (url, _), aiohttp.ClientSession() as s:
        raw = gzip.compress(json.dumps(chat_body("ok")).encode())
        ans = await post(s, url, raw, {**AUTH, "Content-Encoding": "gzip", "Content-Type": "application/json"})
        assert ans.status == 415 and "Content-Encoding 'gzip'" in ans.json()["error"]["message"]
        batch = {"model": "ok", "prompt": ["one", "two"], "max_tokens": 4}
        ans = await post(s, url, batch, AUTH, path="/v1/completions")
        message = ans.json()["error"]["message"]
        assert ans.status == 400 and "not relayed by inferlab gateway" in message and "simulated" not in message
        for model in (5, ["a"]):
            ans = await post(s, url, {"model": model, "prompt": "hi"}, AUTH, path="/tokenize")
            assert ans.status == 400 and ans.json()["error"]["param"] == "model"
        assert not [r for r in up.seen if r["path"] in ("/tokenize", "/v1/chat/completions", "/v1/completions")]


async def test_a_stream_longer_than_its_reservation_holds_more_room_until_it_ends() -> None:
    async with FakeUpstream(long_chunks=60, gap_s=0.005) as up, serving(config(up.url)) as (url, gw), \
            aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=chat_body("long", max_tokens=5),
                                                 headers=AUTH) as resp:
        reserved = gw.admission.tokens_in_flight[0]
        parser_events = 0
        parser = SSEParser()
        async for chunk in resp.content.iter_any():
            parser_events += len(parser.feed(chunk))
            if parser_events >= 30:
                break
        assert gw.admission.tokens_in_flight[0] >= reserved - 5 + 30
    for _ in range(200):
        if gw.admission.tokens_in_flight == [0]:
            break
        await asyncio.sleep(0.01)
    assert gw.admission.tokens_in_flight == [0]
