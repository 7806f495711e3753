"""The client: sends one request, parses the response, fills a ``RequestRecord``.

It never raises for a failed request (only ``CancelledError`` propagates, after the
record is marked cancelled). aiohttp is the HTTP stack: bench/client_cpu.py measures it
against httpx per streamed chunk. All aiohttp errors are mapped here, at one boundary.

Stale keep-alive connections: servers close connections that stay idle past their
keep-alive timeout (llama.cpp and uvicorn, i.e. vLLM, after 5 s), and a request sent on a
pooled connection just as the server closes it fails before the server has read it. Such
a failure is the client's, not the server's: a request that failed on a reused
connection before any response arrived is sent again, once, on a new connection
(``Client.resent`` counts them). Any other failure is recorded as it happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from inferlab._clock import Clock
from inferlab._errors import InferlabError, ServerUnreachableError, UsageError
from inferlab.openai.errors import error_message, one_line
from inferlab.openai.request import PATHS, Api, completion_request
from inferlab.openai.response import (
    ErrorInResponse,
    MalformedResponse,
    ResponseError,
    ResponseReader,
)
from inferlab.openai.sse import SSEParser
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.workload.spec import RequestSpec

__all__ = [
    "Client", "Endpoint", "api_base", "discover_model", "one_line", "request_body", "session_trace",
]

_MAX_ERROR_CHARS = 300  # of a record's error message


def api_base(url: str) -> str:
    """``http://h:p`` → ``http://h:p/v1``; a URL with a path is used as given."""
    url = url.rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) URL: {url!r}")
    return url if parts.path not in ("", "/") else url + "/v1"


@dataclass(frozen=True)
class Endpoint:
    """Where and how to send. ``base_url`` is the API root (ending in ``/v1`` usually)."""

    base_url: str
    model: str
    api: Api = "chat"
    stream: bool = True
    api_key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0
    idle_timeout_s: float = 60.0
    # fields every request carries (``--temperature``, ``--extra-body``); a request's
    # own ``RequestSpec.extra_body`` goes over them
    extra_body: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.base_url + PATHS[self.api]

    def request_headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", **self.headers}
        if self.api_key:
            h.setdefault("Authorization", f"Bearer {self.api_key}")
        return h


def request_body(endpoint: Endpoint, spec: RequestSpec) -> dict[str, Any]:
    """The JSON body that sends ``spec`` to ``endpoint``. ``TypeError`` for a token-id
    prompt on the chat API."""
    chat = endpoint.api == "chat"
    return completion_request(
        endpoint.model,
        endpoint.api,
        messages=spec.messages() if chat else None,
        prompt=None if chat else spec.completion_prompt(),
        max_tokens=spec.max_tokens,
        exact_output=spec.exact_output,
        stream=endpoint.stream,
        extra={**endpoint.extra_body, **spec.extra_body} if endpoint.extra_body else spec.extra_body,
    )


class _Attempt:
    """One attempt at a request, as the session's trace sees it: ``stamp`` is called
    when its headers are written; ``reused`` is set if it went out on a pooled
    keep-alive connection."""

    __slots__ = ("reused", "stamp")

    def __init__(self, stamp: Callable[[], None]) -> None:
        self.stamp = stamp
        self.reused = False


def session_trace() -> aiohttp.TraceConfig:
    """Stamps the moment a request's headers are written (its first byte), and notes
    whether it was sent on a reused connection (what a resend after a stale keep-alive
    connection needs to know). Give it to every session a ``Client`` sends over."""

    async def on_headers_sent(
        session: aiohttp.ClientSession, ctx: SimpleNamespace, params: object
    ) -> None:
        stamp = getattr(ctx.trace_request_ctx, "stamp", None)
        if stamp is not None:
            stamp()

    async def on_reuse(session: aiohttp.ClientSession, ctx: SimpleNamespace, params: object) -> None:
        attempt = ctx.trace_request_ctx
        if isinstance(attempt, _Attempt):
            attempt.reused = True

    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(on_headers_sent)
    trace.on_connection_reuseconn.append(on_reuse)
    return trace


class _StreamState:
    """One response's reader, and the record it fills: arrival times as chunks come
    (``event``), everything else once at the end (``flush``)."""

    def __init__(self, record: RequestRecord, text_out: list[str] | None = None) -> None:
        self.record = record
        self.reader = ResponseReader(text_out)

    @property
    def done(self) -> bool:
        """The stream ended with ``[DONE]``."""
        return self.reader.done

    def event(self, data: str, t_ns: int) -> bool:
        """Apply one SSE ``data`` payload received at ``t_ns``; False = stop reading."""
        try:
            arrivals = self.reader.event(data)
        except ResponseError as e:
            return self._fail(e)
        if arrivals:
            content_ns = self.record.content_ns
            content_ns.append(t_ns)
            if arrivals > 1:  # several choices (a request with n > 1) in one chunk
                content_ns.extend(itertools.repeat(t_ns, arrivals - 1))
        return not self.reader.done

    def body(self, raw: bytes) -> bool:
        """Apply a whole (non-streamed) response body; False if it failed the record."""
        try:
            self.reader.body(raw)
        except ResponseError as e:
            return self._fail(e)
        return True

    def flush(self) -> None:
        """Copy what the response said into the record (once, whatever way it ended)."""
        r, rd = self.record, self.reader
        r.output_chars += rd.output_chars
        if rd.finish_reason is not None:
            r.finish_reason = rd.finish_reason
        if rd.usage_seen:
            r.input_tokens = rd.prompt_tokens
            r.output_tokens = rd.completion_tokens
            r.usage_source = "server"
        if rd.cached_seen:
            r.cached_tokens = rd.cached_tokens
        if rd.timeline is not None:
            r.server_timeline = rd.timeline

    def _fail(self, e: ResponseError) -> bool:
        self.record.error_kind = _ERROR_KINDS[type(e)]
        self.record.error = str(e)[:_MAX_ERROR_CHARS]
        return False


#: How a response the reader refuses is recorded.
_ERROR_KINDS: dict[type[ResponseError], ErrorKind] = {
    MalformedResponse: ErrorKind.MALFORMED,
    ErrorInResponse: ErrorKind.STREAM_ERROR,
}


#: After ``[DONE]``, how long to wait for the body's end (so the connection can be
#: reused) before giving the connection up. Never affects the request's record.
_DRAIN_S = 1.0


async def _drain(resp: aiohttp.ClientResponse) -> None:
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with asyncio.timeout(_DRAIN_S):
            async for _ in resp.content.iter_any():
                pass


def _stale(e: aiohttp.ClientError, record: RequestRecord, attempt: _Attempt) -> bool:
    """Whether ``e`` is a stale keep-alive connection failing: the connection was
    reused, it closed or reset, and no response (not even a status line) came back."""
    return (
        attempt.reused
        and record.status is None
        and isinstance(e, aiohttp.ClientConnectionError)
        and not isinstance(e, TimeoutError)  # (a slow server on a live connection)
    )


def _closed_message(e: aiohttp.ClientError, record: RequestRecord, resent: bool) -> str:
    """What happened when the server closed or reset the connection: before it answered
    (and whether this was already the resend), or in the middle of its response."""
    if record.status is not None:
        return f"connection closed mid-response: {e}"
    when = "while the request was being sent" if isinstance(e, aiohttp.ClientOSError) else "before responding"
    retry = " (also when sent again on a new connection)" if resent else ""
    return f"the server closed the connection {when}{retry}: {type(e).__name__}: {e}"


class Client:
    """Sends requests to one endpoint over a shared aiohttp session (made with
    ``session_trace()``: without it sends are stamped late and never resent).

    Times in records are ns relative to ``t0_ns`` on ``clock``. ``resent`` counts the
    requests sent a second time because a stale keep-alive connection failed them
    before the server read them (see the module's docstring).
    """

    def __init__(
        self, endpoint: Endpoint, clock: Clock, session: aiohttp.ClientSession, t0_ns: int
    ) -> None:
        self.endpoint = endpoint
        self.clock = clock
        self.session = session
        self.t0_ns = t0_ns
        self.resent = 0
        self._headers = endpoint.request_headers()

    def _now(self) -> int:
        return self.clock.now_ns() - self.t0_ns

    async def send(
        self, spec: RequestSpec, record: RequestRecord, text_out: list[str] | None = None
    ) -> None:
        """Send ``spec``; fill ``record`` with what happened (and ``text_out`` with the
        generated text, if given). Never raises, except ``CancelledError`` (the record
        is then marked ``CANCELLED``)."""
        record.session, record.turn = spec.session, spec.turn
        record.prefix_group, record.prefix_tokens = spec.prefix_group, spec.prefix_tokens
        record.requested_input_tokens = spec.input_tokens
        record.requested_output_tokens = spec.max_tokens
        body = json.dumps(request_body(self.endpoint, spec)).encode()

        def stamp() -> None:
            record.send_ns = self._now()

        record.send_ns = self._now()
        resent = False
        try:
            async with asyncio.timeout(self.endpoint.timeout_s):
                attempt = _Attempt(stamp)
                try:
                    await self._exchange(self.session, body, record, attempt, text_out)
                except aiohttp.ClientError as e:
                    if not _stale(e, record, attempt):
                        raise
                    resent = True
                    self.resent += 1
                    await self._resend(body, record, _Attempt(stamp), text_out)
        except aiohttp.ServerTimeoutError:
            self._fail(record, ErrorKind.IDLE_TIMEOUT, f"no data for {self.endpoint.idle_timeout_s:g} s")
        except TimeoutError:
            self._fail(record, ErrorKind.TIMEOUT, f"request took over {self.endpoint.timeout_s:g} s")
        except aiohttp.ClientConnectorError as e:
            self._fail(record, ErrorKind.CONNECT, f"cannot connect to {self.endpoint.url}: {e.os_error}")
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
            self._fail(record, ErrorKind.DISCONNECT, _closed_message(e, record, resent))
        except aiohttp.ClientError as e:
            self._fail(record, ErrorKind.DISCONNECT, f"{type(e).__name__}: {e}")
        except asyncio.CancelledError:
            self._fail(record, ErrorKind.CANCELLED, "run interrupted")
            raise

    async def _resend(
        self, body: bytes, record: RequestRecord, attempt: _Attempt, text_out: list[str] | None
    ) -> None:
        """Send again on a connection of its own: the pool's other idle connections
        have idled as long as the stale one, and may be just as stale."""
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True), trace_configs=[session_trace()],
            auto_decompress=self.session.auto_decompress,
        ) as fresh:
            await self._exchange(fresh, body, record, attempt, text_out)

    def _fail(self, record: RequestRecord, kind: ErrorKind, message: str) -> None:
        if record.error_kind is None and record.end_ns is not None:
            return  # finished already (e.g. a timeout while draining after [DONE])
        if record.error_kind is None:
            record.error_kind = kind
            record.error = message[:_MAX_ERROR_CHARS]
        record.end_ns = None

    async def _exchange(
        self, session: aiohttp.ClientSession, body: bytes, record: RequestRecord, attempt: _Attempt,
        text_out: list[str] | None,
    ) -> None:
        ep = self.endpoint
        async with session.post(
            ep.url,
            data=body,
            headers=self._headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_read=ep.idle_timeout_s),
            trace_request_ctx=attempt,
        ) as resp:
            record.status = resp.status
            if resp.status >= 400:
                raw = b""
                while len(raw) < 65536 and (data := await resp.content.read(65536 - len(raw))):
                    raw += data
                try:
                    message = error_message(json.loads(raw))
                except ValueError:
                    message = one_line(raw.decode("utf-8", "replace")) or (resp.reason or "")
                self._fail(record, ErrorKind.HTTP_STATUS, f"HTTP {resp.status}: {message}")
                return
            if ep.stream and resp.content_type == "text/event-stream":
                await self._read_stream(resp, record, text_out)
            else:
                await self._read_body(resp, record, text_out)

    async def _read_stream(
        self, resp: aiohttp.ClientResponse, record: RequestRecord, text_out: list[str] | None
    ) -> None:
        parser = SSEParser()
        state = _StreamState(record, text_out)
        reading = True
        t_end = 0
        try:
            async for data in resp.content.iter_any():
                t_end = self._now()
                if record.ttfb_ns is None:
                    record.ttfb_ns = t_end
                for event in parser.feed(data):
                    if not state.event(event, t_end):
                        reading = False
                        break
                if not reading:
                    break
            if not state.done and reading:
                t_end = self._now()
                for event in parser.close():
                    if not state.event(event, t_end):
                        break
        finally:  # a failed or cancelled stream keeps what it said so far
            state.flush()
        record.stream_done = state.done
        if record.error_kind is None:
            record.end_ns = t_end
        if state.done:
            await _drain(resp)

    async def _read_body(
        self, resp: aiohttp.ClientResponse, record: RequestRecord, text_out: list[str] | None
    ) -> None:
        chunks = []
        async for data in resp.content.iter_any():
            if record.ttfb_ns is None:
                record.ttfb_ns = self._now()
            chunks.append(data)
        t_end = self._now()
        state = _StreamState(record, text_out)
        if state.body(b"".join(chunks)):
            state.flush()
            record.end_ns = t_end


async def discover_model(base_url: str, api_key: str | None, timeout_s: float = 10.0) -> str:
    """The first model id from ``GET /v1/models``; ``ServerUnreachableError`` if no
    server answers there."""
    import aiohttp  # (here: `sim run` imports this module and makes no HTTP call)

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as s, s.get(
            base_url + "/models", headers=headers
        ) as resp:
            if resp.status >= 400:
                body = one_line((await resp.content.read(4096)).decode("utf-8", "replace"))
                raise InferlabError(
                    f"{base_url}/models answered HTTP {resp.status} ({body or resp.reason}): is "
                    "this an OpenAI-compatible API root? Check --url, or pass --model"
                )
            data = await resp.json(content_type=None)
    except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, TimeoutError) as e:
        raise ServerUnreachableError(f"cannot reach {base_url}: {e}") from e
    except (aiohttp.ClientError, ValueError) as e:
        raise ServerUnreachableError(f"unexpected answer from {base_url}/models: {e}") from e
    models = data.get("data") if isinstance(data, dict) else None
    if not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise UsageError(f"{base_url}/models lists no model; pass --model explicitly")
    return str(models[0]["id"])
