"""Both HTTP stacks to the upstream (``[gateway] http_client``: the project's httptools
client, and aiohttp's) relay alike: every framing the client's fault server sends
(``tests/client/faultserver.py``), a slow client's backpressure, a stale keep-alive
connection, a timeout."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from fakeupstream import ChatUpstream
from faultserver import TEXTS, USAGE, FaultServer, reply_events
from gateway_helpers import chat_body, metrics, post, serving, total

from inferlab._errors import UsageError
from inferlab.gateway.config import CacheConfig, GatewayConfig, UpstreamConfig, load_config
from inferlab.openai.response import Completion
from inferlab.openai.sse import DONE_EVENT, SSEParser, encode_json

STACKS = ("httptools", "aiohttp")


def config(*urls: str, stack: str, **kw: Any) -> GatewayConfig:
    return GatewayConfig(upstreams=tuple(UpstreamConfig(u) for u in urls), cache=CacheConfig(enabled=False),
                         metrics_refresh_s=0, http_client=stack, **kw)


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("behaviour", ["normal", "batched", "split", "nospace", "comments", "crlf"])
@pytest.mark.parametrize("usage", [True, False])
async def test_every_framing_reaches_the_client_as_the_same_events(stack: str, behaviour: str, usage: bool) -> None:
    async with FaultServer() as up, serving(config(up.url, stack=stack)) as (url, gw), aiohttp.ClientSession() as s:
        extra = {"stream_options": {"include_usage": True}} if usage else {}
        ans = await post(s, url, chat_body(behaviour, **extra))
        assert ans.status == 200 and ans.events[-1] == "[DONE]"
        assert ans.objects() == reply_events(usage=usage)
        m = await metrics(s, url)
        assert total(m, "gen_ai_client_token_usage_total", gen_ai_token_type="output") == USAGE["completion_tokens"]
        # one arrival per chunk with generated text (the reasoning delta included)
        assert total(m, "gen_ai_server_inter_token_latency_seconds_count") == len(TEXTS) - 1
        assert gw.admission.requests_in_flight == [0]


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize(("behaviour", "kind"), [("disconnect", "failed"), ("stream_error", None), ("malformed", None)])
async def test_a_stream_that_goes_wrong_reaches_the_client_as_it_went(stack: str, behaviour: str, kind: str | None) -> None:
    async with FaultServer() as up, serving(config(up.url, stack=stack)) as (url, gw), aiohttp.ClientSession() as s:
        ans = await post(s, url, chat_body(behaviour))
        assert ans.status == 200 and ans.events[-1] == "[DONE]"
        if kind is not None:  # the gateway's own error event, after what came
            assert kind in json.loads(ans.events[-2])["error"]["message"]
        else:  # relayed as it came: the error event, the broken one
            assert any(e.startswith('{"error"') or e == "{not json" for e in ans.events)
        assert gw.admission.requests_in_flight == [0] and gw.admission.tokens_in_flight == [0]


@pytest.mark.parametrize("stack", STACKS)
async def test_a_request_a_stale_keep_alive_connection_drops_still_gets_its_answer(stack: str) -> None:
    async with FaultServer(stale_after_s=0.1) as up, serving(config(up.url, stack=stack)) as (url, _), \
            aiohttp.ClientSession() as s:
        assert (await post(s, url, chat_body("normal"))).status == 200
        # (counted from here: on a slow machine the connection of the gateway's start-up
        # /v1/models probe may already be stale for the first request)
        dropped = up.dropped
        errors = total(await metrics(s, url), "inferlab_gateway_upstream_errors_total")
        await asyncio.sleep(0.3)  # the pooled connections are now stale: the server drops what comes on them
        again = await post(s, url, chat_body("normal"))
        assert again.status == 200 and again.objects() == reply_events(usage=False)
        assert up.dropped - dropped == 1
        errors = total(await metrics(s, url), "inferlab_gateway_upstream_errors_total") - errors
        # the httptools client sends it again on a new connection; aiohttp's session fails it,
        # and the gateway tries the upstream once more
        assert errors == (0 if stack == "httptools" else 1)


@pytest.mark.parametrize("stack", STACKS)
async def test_an_upstream_that_does_not_answer_in_time_is_a_timeout(stack: str) -> None:
    async with FaultServer(stall_s=5) as up, \
            serving(config(up.url, stack=stack, upstream_timeout_s=0.2)) as (url, gw), aiohttp.ClientSession() as s:
        ans = await post(s, url, chat_body("stall"))
        assert ans.status == 200 and ans.events[-1] == "[DONE]"
        assert "timed out" in json.loads(ans.events[-2])["error"]["message"]
        assert gw.admission.requests_in_flight == [0]


#: The backpressure test's stream: this many events of ``EVENT_CHARS`` characters, more
#: than loopback's socket buffers hold between the upstream and a client that stops reading.
EVENTS, EVENT_CHARS = 400, 65536


class BigUpstream(ChatUpstream):
    """Streams ``EVENTS`` large events as fast as its client takes them; ``written``
    counts those its writes have handed on."""

    models = ("big",)

    def __init__(self) -> None:
        super().__init__()
        self.written = 0

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        c = Completion("cmpl-big", True, 0, "big")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        event = encode_json(c.chunk([c.choice("x" * EVENT_CHARS, None)]))
        for _ in range(EVENTS):
            await resp.write(event)  # (waits while the transport's buffer is full)
            self.written += 1
        await resp.write(DONE_EVENT)
        return resp


@pytest.mark.parametrize("stack", STACKS)
async def test_a_client_that_stops_reading_stops_the_upstream_and_then_gets_everything(stack: str) -> None:
    async with BigUpstream() as up, serving(config(up.url, stack=stack)) as (url, _):
        host, port = url.removeprefix("http://").split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)  # (no autotuning: a small window)
        sock.connect((host, int(port)))
        reader, writer = await asyncio.open_connection(sock=sock)  # (its buffer stops at 128 KiB)
        body = json.dumps(chat_body("big", max_tokens=EVENTS)).encode()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await reader.readuntil(b"\r\n\r\n")
        last, still = -1, 0
        while still < 5:  # until the upstream has written nothing more for five looks in a row
            await asyncio.sleep(0.05)
            still, last = (still + 1, last) if up.written == last else (0, up.written)
        assert up.written < EVENTS  # the upstream waits for the client
        raw = await asyncio.wait_for(reader.read(), 60)
        writer.close()
        events = SSEParser().feed(_unchunk(raw))
        assert events[-1] == "[DONE]" and len(events) == EVENTS + 1
        assert up.written == EVENTS


def _unchunk(raw: bytes) -> bytes:
    """A chunked HTTP/1.1 body's bytes."""
    out, at = [], 0
    while True:
        end = raw.index(b"\r\n", at)
        size = int(raw[at:end], 16)
        if size == 0:
            return b"".join(out)
        out.append(raw[end + 2:end + 2 + size])
        at = end + 2 + size + 2


def test_the_http_client_is_checked_against_the_upstreams(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_config(["http://h:1"], host="h", port=1).http_client == "auto"
    assert load_config(["http://h:1"], host="h", port=1, http_client="aiohttp").http_client == "aiohttp"
    with pytest.raises(UsageError, match="plain http"):
        load_config(["https://h:1"], host="h", port=1, http_client="httptools")
    with pytest.raises(UsageError, match="unknown HTTP client"):
        GatewayConfig(upstreams=(UpstreamConfig("http://h:1"),), http_client="curl")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "httptools" else real(name, *a))
    with pytest.raises(UsageError, match="not installed"):
        load_config(["http://h:1"], host="h", port=1, http_client="httptools")
