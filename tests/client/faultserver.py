"""A deliberately misbehaving OpenAI-compatible server for the client's integration tests.

``FaultServer`` is an async context manager serving on ``127.0.0.1`` at a free port.
The request's ``model`` field picks the behaviour (``BEHAVIOURS`` lists them);
``"cycle:b1,b2,..."`` takes the next behaviour of that list on each request, so a run
with a single model name sends a fixed, countable mix. ``GET /v1/models`` lists
``normal`` first, so model discovery picks the well-behaved stream.

Every stream that ends well carries the same reply (``TEXTS``, ``USAGE``), whatever
the framing, so tests can assert the same record for all of them.

Keep-alive, on every route: ``keepalive_s`` closes connections idle that long (aiohttp's
own idle close: the client sees the close before it sends again), and
``stale_after_s`` drops, unanswered, a request arriving on a connection that has been
idle longer than that: what a client sees when its request crosses the server's idle
close on the wire (llama.cpp and uvicorn close after 5 s). ``dropped`` counts those.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from types import TracebackType
from typing import Any, Self

from aiohttp import web

from inferlab.openai.errors import error_body

#: The generated deltas of a normal reply: one reasoning delta, then three content deltas.
TEXTS = ("Think.", "Hello", " world", "!")
OUTPUT_CHARS = sum(len(t) for t in TEXTS)
USAGE = {
    "prompt_tokens": 7,
    "completion_tokens": 5,
    "total_tokens": 12,
    "prompt_tokens_details": {"cached_tokens": 2},
}
ERROR_MESSAGE = "the fault server says no"

Handler = Callable[["FaultServer", web.Request], Awaitable[web.StreamResponse]]


def chunk(delta: dict[str, Any] | None, *, finish: str | None = None,
          usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk`` object; ``delta=None`` gives ``choices: []``."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    obj: dict[str, Any] = {
        "id": "chatcmpl-fault",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fault",
        "choices": choices,
    }
    if usage is not None:
        obj["usage"] = usage
    return obj


def reply_events(*, usage: bool = True) -> list[dict[str, Any]]:
    """The normal reply as chunk objects: role-only first chunk, a reasoning delta,
    content deltas around an empty delta, a finish chunk, then usage with no choices."""
    events = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": TEXTS[0]}),
        chunk({"content": TEXTS[1]}),
        chunk({}),
        chunk({"content": TEXTS[2]}),
        chunk({"content": TEXTS[3]}),
        chunk({}, finish="stop"),
    ]
    if usage:
        events.append(chunk(None, usage=USAGE))
    return events


def sse(obj: dict[str, Any] | str, *, space: bool = True, eol: str = "\n") -> bytes:
    """One SSE event carrying ``obj`` (a JSON object, or a raw string such as ``[DONE]``)."""
    data = obj if isinstance(obj, str) else json.dumps(obj)
    return f"data:{' ' if space else ''}{data}{eol}{eol}".encode()


DONE = sse("[DONE]")


async def _open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    return resp


async def _stream(request: web.Request, pieces: list[bytes], gap_s: float = 0.0) -> web.StreamResponse:
    """Write each piece as its own write (one HTTP chunk), ``gap_s`` apart."""
    resp = await _open_stream(request)
    for i, piece in enumerate(pieces):
        if i and gap_s:
            await asyncio.sleep(gap_s)
        await resp.write(piece)
    await resp.write_eof()
    return resp


def _json_error(status: int, message: str, type_: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error_body(status, message, type_), status=status, headers=headers)


# --- behaviours -------------------------------------------------------------------------


async def normal(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    return await _stream(request, [sse(e) for e in reply_events()] + [DONE])


async def batched(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    """The whole reply in one write: several events per read."""
    return await _stream(request, [b"".join(sse(e) for e in reply_events()) + DONE])


async def split(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    """Each event cut in half across two writes, with a pause in between."""
    pieces: list[bytes] = []
    for event in [sse(e) for e in reply_events()] + [DONE]:
        half = len(event) // 2
        pieces += [event[:half], event[half:]]
    return await _stream(request, pieces, gap_s=0.005)


async def nospace(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    """``data:{...}`` with no space after the colon (legal SSE)."""
    events = [sse(e, space=False) for e in reply_events()] + [sse("[DONE]", space=False)]
    return await _stream(request, events)


async def comments(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    """Keep-alive comments first and between events, plus ``event``/``id``/``retry`` fields."""
    pieces = [b": keep-alive\n\n", b"retry: 1000\n\n"]
    for i, e in enumerate(reply_events()):
        pieces += [b": ping\n\n", f"event: message\nid: {i}\n".encode() + sse(e)]
    return await _stream(request, [*pieces, b": bye\n\n", DONE])


async def crlf(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    """CRLF line ends; each event's first ``\\r\\n`` is split between two writes."""
    pieces: list[bytes] = []
    for event in [sse(e, eol="\r\n") for e in reply_events()] + [sse("[DONE]", eol="\r\n")]:
        cut = event.index(b"\r") + 1
        pieces += [event[:cut], event[cut:]]
    return await _stream(request, pieces, gap_s=0.002)


async def http_500(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    return _json_error(500, ERROR_MESSAGE, "server_error")


async def http_429(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    return _json_error(429, "Rate limit reached", "rate_limit_exceeded", {"Retry-After": "1"})


async def http_500_chunked(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    """The JSON error body of ``http_500`` in two writes (a proxy that streams it)."""
    body = json.dumps({"error": {"message": ERROR_MESSAGE, "type": "server_error", "code": 500}}).encode()
    resp = web.StreamResponse(status=500, headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    await resp.write(body[:10])
    await asyncio.sleep(0.01)
    await resp.write(body[10:])
    await resp.write_eof()
    return resp


async def hangup(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    """The connection closes before any response (a server that crashed)."""
    assert request.transport is not None
    request.transport.close()
    raise asyncio.CancelledError


async def http_text(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    """An error page that is not JSON (what a proxy in front of the server sends)."""
    return web.Response(status=503, text="upstream unavailable\n")


async def disconnect(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    """Three events, then the connection closes without the chunked body's end."""
    resp = await _open_stream(request)
    for e in reply_events()[:3]:
        await resp.write(sse(e))
    assert request.transport is not None
    request.transport.close()
    # Unwind quietly: there is nothing left to send and no one to send it to.
    raise asyncio.CancelledError


async def stall(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    """Two events, then silence for ``stall_s`` (longer than the client's idle timeout)."""
    resp = await _open_stream(request)
    events = [sse(e) for e in reply_events()] + [DONE]
    for piece in events[:2]:
        await resp.write(piece)
    await asyncio.sleep(srv.stall_s)
    for piece in events[2:]:
        await resp.write(piece)
    await resp.write_eof()
    return resp


async def malformed(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    events = [sse(e) for e in reply_events()]
    return await _stream(request, [*events[:3], b"data: {not json\n\n", *events[3:], DONE])


async def no_done(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    """The reply and its usage, then the stream ends cleanly without ``[DONE]``."""
    return await _stream(request, [sse(e) for e in reply_events()])


async def stream_error(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    """An OpenAI error object in the stream (what vLLM sends on an engine error)."""
    events = [sse(e) for e in reply_events()][:3]
    error = {"error": {"message": ERROR_MESSAGE, "type": "internal_error", "code": 500}}
    return await _stream(request, [*events, sse(error), DONE])


async def no_usage(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    """The reply without a usage chunk (a server that ignores ``include_usage``)."""
    return await _stream(request, [sse(e) for e in reply_events(usage=False)] + [DONE])


async def done_linger(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    """The full reply and ``[DONE]``, then the body stays open for ``stall_s``."""
    resp = await _open_stream(request)
    await resp.write(b"".join(sse(e) for e in reply_events()) + DONE)
    await asyncio.sleep(srv.stall_s)
    await resp.write_eof()
    return resp


async def slow(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    """A long stream: one content delta every ``slow_gap_s``, ``slow_chunks`` of them."""
    pieces = [sse(chunk({"role": "assistant", "content": ""}))]
    pieces += [sse(chunk({"content": "x"})) for _ in range(srv.slow_chunks)]
    return await _stream(request, [*pieces, DONE], gap_s=srv.slow_gap_s)


async def json_body(srv: FaultServer, request: web.Request) -> web.StreamResponse:
    """A non-streaming ``chat.completion`` (a server that ignores ``stream: true``)."""
    body = {
        "id": "chatcmpl-fault",
        "object": "chat.completion",
        "created": 0,
        "model": "fault",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "reasoning_content": TEXTS[0], "content": "".join(TEXTS[1:])},
            "finish_reason": "stop",
        }],
        "usage": USAGE,
    }
    return web.json_response(body)


BEHAVIOURS: dict[str, Handler] = {
    "normal": normal,
    "batched": batched,
    "split": split,
    "nospace": nospace,
    "comments": comments,
    "crlf": crlf,
    "http_500": http_500,
    "http_429": http_429,
    "http_500_chunked": http_500_chunked,
    "http_text": http_text,
    "hangup": hangup,
    "disconnect": disconnect,
    "stall": stall,
    "malformed": malformed,
    "no_done": no_done,
    "stream_error": stream_error,
    "no_usage": no_usage,
    "done_linger": done_linger,
    "slow": slow,
    "json": json_body,
}


class FaultServer:
    """Serves ``BEHAVIOURS`` on loopback while the ``async with`` block runs.

    ``served`` counts the behaviours actually answered, in the order chosen.
    """

    def __init__(
        self, *, stall_s: float = 1.0, slow_chunks: int = 200, slow_gap_s: float = 0.05,
        keepalive_s: float | None = None, stale_after_s: float | None = None,
    ) -> None:
        self.stall_s = stall_s
        self.slow_chunks = slow_chunks
        self.slow_gap_s = slow_gap_s
        self.keepalive_s = keepalive_s
        self.stale_after_s = stale_after_s
        self.served: Counter[str] = Counter()
        self.dropped = 0
        self._idle_since: dict[object, float] = {}  # peer address -> end of its last response
        self._cycles: dict[str, Iterator[str]] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        """The server root (``http://127.0.0.1:PORT``); the API is under ``/v1``."""
        return f"http://127.0.0.1:{self.port}"

    def choose(self, model: str) -> str:
        if model.startswith("cycle:"):
            if model not in self._cycles:
                self._cycles[model] = itertools.cycle(model.removeprefix("cycle:").split(","))
            return next(self._cycles[model])
        return model

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return _json_error(400, "body is not JSON", "invalid_request_error")
        name = self.choose(str(body.get("model", "")))
        handler = BEHAVIOURS.get(name)
        if handler is None:
            return _json_error(404, f"The model `{name}` does not exist.", "NotFoundError")
        self.served[name] += 1
        return await handler(self, request)

    @web.middleware
    async def _stale_connections(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        assert request.transport is not None
        peer = request.transport.get_extra_info("peername")
        idle_since = self._idle_since.pop(peer, None)
        if self.stale_after_s is not None and idle_since is not None and time.monotonic() - idle_since > self.stale_after_s:
            self.dropped += 1
            request.transport.close()
            raise asyncio.CancelledError
        try:
            return await handler(request)
        finally:
            self._idle_since[peer] = time.monotonic()

    async def _models(self, request: web.Request) -> web.Response:
        data = [{"id": name, "object": "model", "owned_by": "faultserver"} for name in BEHAVIOURS]
        return web.json_response({"object": "list", "data": data})

    async def __aenter__(self) -> Self:
        app = web.Application(middlewares=[self._stale_connections])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        keepalive = {} if self.keepalive_s is None else {"keepalive_timeout": self.keepalive_s}
        # handler_cancellation: a handler sleeping for a client that has gone away ends now.
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=0.1, **keepalive
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._runner is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner.cleanup()
            self._runner = None
