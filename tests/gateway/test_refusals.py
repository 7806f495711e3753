"""An upstream that answers a request it cannot take with a 5xx and an OpenAI error body
(llama.cpp's 500 to an ``image_url`` part without a vision model), over loopback: the
client gets that answer, the upstream is not asked again, and it is not ejected for a
client's input; a server that fell over (a 5xx without such a body) is retried and
counted as before."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from fakeupstream import IMAGE_REFUSAL, FakeUpstream
from gateway_helpers import chat_body, metrics, post, serving, total

from inferlab.gateway.config import CacheConfig, GatewayConfig, UpstreamConfig
from inferlab.gateway.routing import EJECT_AFTER


def config(*urls: str, **kw: object) -> GatewayConfig:
    return GatewayConfig(upstreams=tuple(UpstreamConfig(u) for u in urls), cache=CacheConfig(enabled=False),
                         **kw)  # type: ignore[arg-type]


def image_body(*, stream: bool = True) -> dict[str, object]:
    """A chat request with an image part (what llama.cpp without a vision model refuses)."""
    body = chat_body("ok", stream=stream)
    body["messages"] = [{"role": "user", "content": [
        {"type": "text", "text": "what is in it?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]}]
    return body


def posts(up: FakeUpstream) -> int:
    return sum(1 for r in up.seen if r["path"] == "/v1/chat/completions")


@pytest.mark.parametrize("stack", ["httptools", "aiohttp"])
@pytest.mark.parametrize("stream", [True, False])
async def test_a_refusal_reaches_the_client_as_the_upstream_answered_it_and_ejects_nothing(stack: str, stream: bool) -> None:
    """One upstream: more refusals than ejection takes, each relayed with the upstream's
    status and message, each sent once (not again to the upstream that answered it); the
    upstream still takes a request it can serve."""
    async with FakeUpstream(refuses_images=True) as up, serving(config(up.url, http_client=stack)) as (url, gw), \
            aiohttp.ClientSession() as s:
        for n in range(1, EJECT_AFTER + 2):
            ans = await post(s, url, image_body(stream=stream))
            assert ans.status == 500
            assert ans.json() == IMAGE_REFUSAL
            assert posts(up) == n
        assert not gw.health.ejected(0) and gw.health.failures == [0]
        assert (await post(s, url, chat_body("ok", stream=stream))).status == 200
        assert gw.admission.requests_in_flight == [0]


async def test_a_request_every_upstream_refuses_ejects_none_of_them(tmp_path: object) -> None:
    """Two upstreams, both refusing: each request is tried on both (the second may take
    what the first cannot), then the refusal is relayed; neither is ejected however many
    such requests come, so one client's input cannot empty the pool."""
    async with FakeUpstream(refuses_images=True) as a, FakeUpstream(refuses_images=True) as b, \
            serving(config(a.url, b.url)) as (url, gw), aiohttp.ClientSession() as s:
        for n in range(1, 2 * EJECT_AFTER + 1):
            ans = await post(s, url, image_body())
            assert ans.status == 500 and ans.json()["error"]["message"] == IMAGE_REFUSAL["error"]["message"]
            assert posts(a) + posts(b) == 2 * n  # (each request: once on each upstream)
        assert not gw.health.ejected(0) and not gw.health.ejected(1)


async def test_a_refusal_another_upstream_serves_is_a_success_and_counts_against_the_refuser() -> None:
    """One upstream refuses images, the other serves them: the client gets the answer,
    and the refuser's answers count toward its ejection (another did what it would not),
    so after EJECT_AFTER of them it is ejected."""
    async with FakeUpstream(refuses_images=True) as a, FakeUpstream() as b, \
            serving(config(a.url, b.url, router="round-robin")) as (url, gw), aiohttp.ClientSession() as s:
        for _ in range(4 * EJECT_AFTER):  # (bounded: round-robin sends every other one to a first)
            assert (await post(s, url, image_body())).status == 200
            if posts(a) == EJECT_AFTER:
                break
        assert posts(a) == EJECT_AFTER and gw.health.ejected(0)


async def test_refusals_are_counted_as_refused_not_failed_and_the_ejected_upstream_shows_in_metrics() -> None:
    """The refuser's answers are counted under upstream_errors' kind "refused", none
    under "status" (they are no failures of it); once another upstream's successes have
    ejected it, its ejected gauge reads 1 and the other's 0."""
    async with FakeUpstream(refuses_images=True) as a, FakeUpstream() as b, \
            serving(config(a.url, b.url, router="round-robin")) as (url, _), aiohttp.ClientSession() as s:
        first, second = (f"127.0.0.1:{u.port}" for u in (a, b))
        m = await metrics(s, url)
        assert total(m, "inferlab_gateway_upstream_ejected", server_address=first) == 0
        for _ in range(4 * EJECT_AFTER):  # (bounded: round-robin sends every other one to a first)
            assert (await post(s, url, image_body())).status == 200
            if posts(a) == EJECT_AFTER:
                break
        m = await metrics(s, url)
    errors = "inferlab_gateway_upstream_errors_total"
    assert total(m, errors, server_address=first, kind="refused") == posts(a) == EJECT_AFTER
    assert total(m, errors, kind="status") == 0
    assert total(m, "inferlab_gateway_upstream_ejected", server_address=first) == 1
    assert total(m, "inferlab_gateway_upstream_ejected", server_address=second) == 0


@pytest.mark.parametrize("body", [b"engine fell over", json.dumps({"error": "engine fell over"}).encode(),
                                  json.dumps({"error": {"message": ""}}).encode()])
async def test_a_5xx_without_an_openai_error_body_is_still_retried_counted_and_a_502(body: bytes) -> None:
    """A 500 whose body is not an OpenAI error (plain text, an error that is a bare
    string, an empty message) is a server failing, as before: retried on the same
    upstream (the only one), counted toward ejection, answered 502."""
    from aiohttp import web

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, status=500, content_type="application/json")

    async with _stub(handler) as up, serving(config(up)) as (url, gw), aiohttp.ClientSession() as s:
        ans = await post(s, url, chat_body("ok"))
        assert ans.status == 502 and ans.json()["error"]["type"] == "InternalServerError"
        assert gw.health.failures == [2]  # (tried twice, both counted)


async def test_a_503_with_an_openai_error_body_is_still_retried_as_an_overload() -> None:
    """503 says the server (or one behind it) cannot answer now: retried and counted
    whatever its body, as before (only 500 and 501 answer a request)."""
    from aiohttp import web

    from inferlab.openai.errors import error_body

    async def handler(request: web.Request) -> web.Response:
        return web.json_response(error_body(503, "overloaded", "ServiceUnavailableError"), status=503)

    async with _stub(handler) as up, serving(config(up)) as (url, gw), aiohttp.ClientSession() as s:
        assert (await post(s, url, chat_body("ok"))).status == 502
        assert gw.health.failures == [2]


async def test_the_gateway_relays_an_image_part_it_cannot_count_without_a_5xx_of_its_own() -> None:
    """An ``image_url`` part is the upstream's to take or refuse: the gateway reads,
    counts and admits the request, and an upstream that serves images answers it."""
    async with FakeUpstream() as up, serving(config(up.url)) as (url, _), aiohttp.ClientSession() as s:
        ans = await post(s, url, image_body())
        assert ans.status == 200 and posts(up) == 1
        assert json.loads(up.seen[-1]["body"])["messages"][0]["content"][1]["type"] == "image_url"


@contextlib.asynccontextmanager
async def _stub(handler: Any) -> AsyncIterator[str]:
    """An upstream on loopback answering chat requests with ``handler`` and listing the
    model ``ok``: its URL."""
    from aiohttp import web

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "ok", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
