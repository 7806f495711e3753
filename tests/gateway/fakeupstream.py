"""A scripted upstream for the gateway's tests: it records what reaches it (path,
headers, body) and answers by the request's ``model``:

- ``ok``: a stream of ``TEXTS`` (the usage chunk only if asked), or a whole body;
- ``die``: two events, then the connection closes mid-stream;
- ``e500``: HTTP 500 before any byte, a plain-text body (a server that fell over);
- ``long``: ``long_chunks`` events ``gap_s`` apart; ``cancelled`` counts those the
  client (the gateway) abandoned.

A chat request with an ``image_url`` part, to an upstream made with
``refuses_images``, is answered as llama.cpp without a vision model answers it: HTTP 500
with an OpenAI error body (``IMAGE_REFUSAL``).

``/metrics`` answers ``metrics_page`` (a Prometheus page, or any text) when it is set,
else 404; ``/version`` ``{"version": version}`` and ``/props`` ``{"build_info":
build_info}`` where set (vLLM's and llama.cpp's release routes; ``/props`` with a slot's
context, ``default_generation_settings.n_ctx``, where ``n_ctx`` is set), else 404.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Self

from aiohttp import web

from inferlab.openai.errors import error_body
from inferlab.openai.response import Completion
from inferlab.openai.sse import DONE_EVENT, encode_json

TEXTS = ("Hello", " world", "!")
USAGE = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}
MODELS = ("ok", "die", "e500", "long")
#: llama.cpp's answer to an ``image_url`` part without a vision model (its own words)
IMAGE_REFUSAL = {"error": {"code": 500, "message": "image input is not supported - hint: if this is unexpected, you "
                           "may need to provide the mmproj", "type": "server_error"}}


class FakeUpstream:
    def __init__(self, models: tuple[str, ...] = MODELS, long_chunks: int = 400, gap_s: float = 0.01,
                 owned_by: str | None = None, refuses_images: bool = False, version: str | None = None,
                 build_info: str | None = None, n_ctx: int | None = None) -> None:
        self.models = models
        self.refuses_images = refuses_images
        self.version = version
        self.build_info = build_info
        self.n_ctx = n_ctx  # (a slot's context in /props, as llama.cpp states it)
        self.owned_by = owned_by  # (its model cards' owner, as an engine names itself there)
        self.long_chunks = long_chunks
        self.gap_s = gap_s
        self.seen: list[dict[str, Any]] = []  # {"path", "headers", "body"} per request
        self.cancelled = 0
        self.in_flight = 0  # generation requests being answered now
        self.peak = 0  # the most at once
        self.metrics_page: str | None = None
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _any(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.seen.append({"path": request.path_qs, "method": request.method, "headers": dict(request.headers),
                          "body": raw})
        if request.path == "/v1/models":
            cards = [{"id": m, "object": "model", **({"owned_by": self.owned_by} if self.owned_by else {})} for m in self.models]
            return web.json_response({"object": "list", "data": cards})
        if request.path == "/health":
            return web.Response(text="ok")
        if request.path == "/metrics" and self.metrics_page is not None:
            return web.Response(text=self.metrics_page)
        if request.path == "/version" and self.version is not None:
            return web.json_response({"version": self.version})
        if request.path == "/props" and (self.build_info is not None or self.n_ctx is not None):
            return web.json_response({**({"build_info": self.build_info} if self.build_info else {}),
                                      **({"default_generation_settings": {"n_ctx": self.n_ctx}} if self.n_ctx else {})})
        if request.path not in ("/v1/chat/completions", "/v1/completions"):
            return web.json_response(error_body(404, "no such route", "NotFoundError"), status=404)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            return await self._generate(request, json.loads(raw))
        finally:
            self.in_flight -= 1

    async def _generate(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        model = body.get("model")
        c = Completion("cmpl-1", request.path.endswith("chat/completions"), 0, str(model))
        if model == "e500":
            return web.Response(text="engine fell over", status=500)
        if self.refuses_images and any(isinstance(part, dict) and part.get("type") == "image_url"
                                       for m in body.get("messages") or () if isinstance(m.get("content"), list)
                                       for part in m["content"]):
            return web.json_response(IMAGE_REFUSAL, status=500)
        if not body.get("stream"):
            return web.json_response(c.body("".join(TEXTS), "stop", USAGE))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if model == "long":
            try:
                for i in range(self.long_chunks):
                    await resp.write(encode_json(c.chunk([c.choice("x", None, role=i == 0)])))
                    await asyncio.sleep(self.gap_s)
            except (asyncio.CancelledError, ConnectionError):
                self.cancelled += 1
                raise
            await resp.write(DONE_EVENT)
            return resp
        for i, t in enumerate(TEXTS):
            await resp.write(encode_json(c.chunk([c.choice(t, None, role=i == 0)])))
            if model == "die" and i == 1:
                assert request.transport is not None
                request.transport.close()
                raise asyncio.CancelledError
        await resp.write(encode_json(c.chunk([c.choice("", "stop")])))
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(encode_json(c.chunk([], usage=USAGE)))
        await resp.write(DONE_EVENT)
        return resp

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._any)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class ChatUpstream:
    """A one-purpose fake upstream: a subclass answers ``/v1/chat/completions`` in
    ``_chat`` and lists ``models`` at ``/v1/models`` (``None``: no such route);
    ``posts`` counts the generation requests it was sent."""

    models: tuple[str, ...] | None = ()

    def __init__(self) -> None:
        self.url = ""
        self.posts = 0
        self._runner: web.AppRunner | None = None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def _counted(self, request: web.Request) -> web.StreamResponse:
        self.posts += 1
        return await self._chat(request)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": m, "object": "model"} for m in self.models or ()]})

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._counted)
        if self.models is not None:
            app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
