"""What the gateway makes of upstream answers the fake upstreams elsewhere do not give:
compressed bodies, timeouts and disconnects (as the access log and metrics record them),
upstreams without a model list."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.web import ContentCoding
from fakeupstream import ChatUpstream
from faultserver import FaultServer, reply_events
from gateway_helpers import chat_body, metrics, post, serving, total

from inferlab.gateway.config import CacheConfig, GatewayConfig, UpstreamConfig
from inferlab.openai.response import Completion
from inferlab.openai.sse import DONE_EVENT, encode_json
from inferlab.results.runfiles import read_records

STACKS = ("httptools", "aiohttp")
TEXT = "compressible " * 40


def config(*urls: str, stack: str = "auto", **kw: Any) -> GatewayConfig:
    return GatewayConfig(upstreams=tuple(UpstreamConfig(u) for u in urls), cache=CacheConfig(enabled=False),
                         metrics_refresh_s=0, http_client=stack, **kw)


class Compressing(ChatUpstream):
    """Compresses its answers where the request allows it (model ``polite``) or always,
    gzip (model ``gzip``); ``encodings`` lists each request's Accept-Encoding."""

    models = ("polite", "gzip")

    def __init__(self) -> None:
        super().__init__()
        self.encodings: list[str | None] = []

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.encodings.append(request.headers.get("Accept-Encoding"))
        force = ContentCoding.gzip if body["model"] == "gzip" else None
        c = Completion("cmpl-z", True, 0, body["model"])
        if not body.get("stream"):
            resp = web.json_response(c.body(TEXT, "stop", {"prompt_tokens": 3, "completion_tokens": 40, "total_tokens": 43}))
            resp.enable_compression(force)
            return resp
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        out.enable_compression(force)
        await out.prepare(request)
        await out.write(encode_json(c.chunk([c.choice(TEXT, None, role=True)])))
        await out.write(encode_json(c.chunk([c.choice("", "stop")])))
        await out.write(DONE_EVENT)
        return out


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("stream", [False, True])
async def test_the_gateway_asks_for_an_uncompressed_answer_and_never_relabels_a_compressed_one(stack: str, stream: bool) -> None:
    async with Compressing() as up, serving(config(up.url, stack=stack)) as (url, _), aiohttp.ClientSession() as s:
        polite = await post(s, url, chat_body("polite", stream=stream))
        assert up.encodings == ["identity"]
        assert polite.status == 200 and "Content-Encoding" not in polite.headers
        assert (polite.text() if stream else polite.json()["choices"][0]["message"]["content"]) == TEXT
        forced = await post(s, url, chat_body("gzip", stream=stream))  # compressed though identity was asked for
        if stack == "aiohttp":  # decompressed on the way
            assert forced.status == 200 and "Content-Encoding" not in forced.headers
            assert (forced.text() if stream else forced.json()["choices"][0]["message"]["content"]) == TEXT
        else:  # refused, in one line
            assert forced.status == 502
            assert forced.json()["error"]["message"] == "the upstream's answer is compressed (gzip), though identity was asked for"


class Silent(ChatUpstream):
    """Lists ``silent`` and never answers it (within ``wait_s``)."""

    models = ("silent",)

    def __init__(self, wait_s: float = 5.0) -> None:
        super().__init__()
        self.wait_s = wait_s

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(self.wait_s)
        return web.json_response({})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "silent", "object": "model"}]})


@pytest.mark.parametrize("stack", STACKS)
async def test_an_upstream_timeout_is_a_504_and_recorded_as_a_timeout(stack: str, tmp_path: Path) -> None:
    async with Silent() as up, serving(config(up.url, stack=stack, upstream_timeout_s=0.2,
                                              access_log=str(tmp_path / "log"))) as (url, _), \
            aiohttp.ClientSession() as s:
        ans = await post(s, url, chat_body("silent", stream=False))
        assert ans.status == 504 and ans.json()["error"]["message"] == "the upstream did not answer within 0.2 s"
        m = await metrics(s, url)
        assert total(m, "gen_ai_server_request_duration_seconds_count", error_type="timeout") == 1
    [record] = read_records(tmp_path / "log" / "requests.jsonl")
    assert record.error_kind is not None and record.error_kind.value == "timeout" and record.status == 504


@pytest.mark.parametrize("stack", STACKS)
async def test_an_upstream_that_hangs_up_before_answering_is_recorded_as_a_disconnect(stack: str, tmp_path: Path) -> None:
    async with FaultServer() as up, serving(config(up.url, stack=stack, access_log=str(tmp_path / "log"))) as (url, _), \
            aiohttp.ClientSession() as s:
        ans = await post(s, url, chat_body("hangup", stream=False))
        assert ans.status == 502
        m = await metrics(s, url)
        assert total(m, "gen_ai_server_request_duration_seconds_count", error_type="disconnect") == 1
    [record] = read_records(tmp_path / "log" / "requests.jsonl")
    assert record.error_kind is not None and record.error_kind.value == "disconnect"


class Unlisted(ChatUpstream):
    """Serves chat completions (a plain body) but has no ``/v1/models``."""

    models = None

    def __init__(self) -> None:
        super().__init__()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        c = Completion("cmpl-u", True, 0, body["model"])
        return web.json_response(c.body("hi", "stop", {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}))


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_without_any_model_list_a_request_is_a_503_not_an_unknown_model() -> None:
    async with Unlisted() as up:
        for urls in ([f"http://127.0.0.1:{_closed_port()}"], [up.url]):
            async with serving(config(*urls)) as (url, _), aiohttp.ClientSession() as s:
                ans = await post(s, url, chat_body("m", stream=False))
                assert ans.status == 503 and int(ans.headers["Retry-After"]) >= 1
                error = ans.json()["error"]
                assert error["type"] == "ServiceUnavailableError"
                assert error["message"] == "no upstream answered /v1/models: cannot tell which one serves `m`"


async def test_a_model_that_only_an_unlisted_upstream_might_serve_is_a_503_and_one_none_lists_a_404() -> None:
    async with Compressing() as listed, Unlisted() as unlisted:
        async with serving(config(listed.url, unlisted.url)) as (url, _), aiohttp.ClientSession() as s:
            ans = await post(s, url, chat_body("m", stream=False))
            assert ans.status == 503
            assert ans.json()["error"]["message"] == (f"no upstream that answered /v1/models lists `m`, and "
                                                      f"{unlisted.url.removeprefix('http://')} did not answer it")
        async with serving(config(listed.url)) as (url, _), aiohttp.ClientSession() as s:
            ans = await post(s, url, chat_body("m", stream=False))
            assert ans.status == 404 and ans.json()["error"]["message"] == "The model `m` does not exist."


@pytest.mark.parametrize("stack", STACKS)
async def test_keep_alive_comments_reach_the_client(stack: str) -> None:
    async with FaultServer() as up, serving(config(up.url, stack=stack)) as (url, _), aiohttp.ClientSession() as s:
        ans = await post(s, url, chat_body("comments"))
        assert ans.status == 200 and ans.events[-1] == "[DONE]"
        # (each read's comments come before its events: a read here may hold several)
        assert ans.body.startswith(b": keep-alive\n") and ans.body.count(b": ping\n") == 8
        assert b": bye\n" in ans.body and ans.objects() == reply_events(usage=False)


@pytest.mark.parametrize("stack", STACKS)
async def test_a_finished_stream_without_done_gets_done_and_no_error(stack: str, tmp_path: Path) -> None:
    async with FaultServer() as up, serving(config(up.url, stack=stack, access_log=str(tmp_path / "log"))) as (url, _), \
            aiohttp.ClientSession() as s:
        ans = await post(s, url, chat_body("no_done"))
        assert ans.status == 200 and ans.events[-1] == "[DONE]"
        assert not any("error" in o for o in ans.objects())
        assert ans.objects()[-1]["choices"][0]["finish_reason"] == "stop"
    [record] = read_records(tmp_path / "log" / "requests.jsonl")
    assert record.ok and record.stream_done is False  # (the upstream's stream had no [DONE]: the log says so)


@pytest.mark.parametrize("stack", STACKS)
async def test_a_stream_that_ends_without_a_finish_reason_gets_an_error_event(stack: str) -> None:
    async with Timed() as up, serving(config(up.url, stack=stack)) as (url, _), aiohttp.ClientSession() as s:
        ans = await post(s, url, chat_body("cut"))
        assert ans.events[-1] == "[DONE]" and "early" in json.loads(ans.events[-2])["error"]["message"]


TIMELINE = {"arrival_ms": 1.0, "first_scheduled_ms": 2.0, "first_token_ms": 3.0}


class Timed(ChatUpstream):
    """Streams as ``inferlab sim serve`` does: ``inferlab_timeline`` on the usage chunk
    when usage was asked for, else on the finish chunk; model ``cut``: one chunk, then
    the stream ends cleanly, with no finish reason and no ``[DONE]``."""

    models = ("sim", "cut")

    def __init__(self) -> None:
        super().__init__()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        usage = (body.get("stream_options") or {}).get("include_usage")
        c = Completion("cmpl-t", True, 0, body["model"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        out = encode_json(c.chunk([c.choice("hi", None, role=True)]))
        if body["model"] == "cut":
            await resp.write(out)
            return resp
        out += encode_json(c.chunk([c.choice("", "stop")], **({} if usage else {"inferlab_timeline": TIMELINE})))
        if usage:
            out += encode_json(c.chunk([], usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                                       inferlab_timeline=TIMELINE))
        await resp.write(out + DONE_EVENT)
        return resp


@pytest.mark.parametrize("stack", STACKS)
async def test_the_simulated_servers_timeline_survives_the_dropped_usage_chunk(stack: str) -> None:
    from inferlab.openai.response import ResponseReader

    async with Timed() as up, serving(config(up.url, stack=stack)) as (url, _), aiohttp.ClientSession() as s:
        ans = await post(s, url, chat_body("sim"))
        assert ans.events[-1] == "[DONE]" and not any("usage" in o for o in ans.objects())
        reader = ResponseReader()
        for e in ans.events:
            reader.event(e)
        assert reader.timeline == TIMELINE and ans.text() == "hi"


async def _raw_upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Lists ``halfhead`` and ``garbage``; answers them with half a head, or not HTTP."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
    body = await reader.readexactly(length)
    if head.startswith(b"GET /v1/models"):
        data = json.dumps({"data": [{"id": "halfhead"}, {"id": "garbage"}]}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(data), data))
    elif json.loads(body)["model"] == "halfhead":
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Ty")
    else:
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
    await writer.drain()
    writer.close()


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("model", ["halfhead", "garbage"])
async def test_an_upstream_that_breaks_http_gets_a_one_line_error(stack: str, model: str, tmp_path: Path) -> None:
    server = await asyncio.start_server(_raw_upstream, "127.0.0.1", 0)
    up = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with serving(config(up, stack=stack, access_log=str(tmp_path / "log"))) as (url, _), \
                aiohttp.ClientSession() as s:
            ans = await post(s, url, chat_body(model, stream=False))
    finally:
        server.close()
    assert ans.status == 502
    message = ans.json()["error"]["message"]
    assert "\n" not in message and "\\n" not in message and "RawResponseMessage" not in message, message
    assert len(message) <= 200, message
    [record] = read_records(tmp_path / "log" / "requests.jsonl")
    assert record.error is not None and "\n" not in record.error


class NotJSON(ChatUpstream):
    """Answers 200 with a body that is not JSON (model ``html``), or 400 with one (model
    ``bad``); ``posts`` counts the requests."""

    models = ("html", "bad")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        return web.Response(text="<html>oops</html>", status=200 if body["model"] == "html" else 400,
                            content_type="text/html")


@pytest.mark.parametrize("stack", STACKS)
async def test_a_success_that_is_not_json_is_a_502_as_the_log_says_and_an_error_status_passes(stack: str, tmp_path: Path) -> None:
    async with NotJSON() as up, serving(config(up.url, stack=stack, access_log=str(tmp_path / "log"))) as (url, _), \
            aiohttp.ClientSession() as s:
        html = await post(s, url, chat_body("html", stream=False))
        assert html.status == 502 and "malformed" in html.json()["error"]["message"] and up.posts == 2  # (tried twice)
        bad = await post(s, url, chat_body("bad", stream=False))
        assert bad.status == 400 and bad.body == b"<html>oops</html>" and up.posts == 3
        m = await metrics(s, url)
    assert total(m, "inferlab_gateway_upstream_errors_total", kind="malformed") == 2
    first, second = sorted(read_records(tmp_path / "log" / "requests.jsonl"), key=lambda r: r.index)
    assert (first.status, first.error_kind and first.error_kind.value) == (502, "malformed")
    assert (second.status, second.error_kind and second.error_kind.value) == (400, "malformed")
