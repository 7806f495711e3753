"""The client: sends one request, parses the response, fills a ``RequestRecord``.

It never raises for a failed request (only ``CancelledError`` propagates, after the
record is marked cancelled). ``Sender`` holds the rules every asyncio HTTP stack shares
(below, and the mapping of aiohttp's exceptions to error records, at one boundary);
``Client`` is aiohttp's (bench/client_cpu.py measures it against httpx per streamed
chunk), ``client.httptools_http.HttptoolsClient`` the leaner one for plain http, which
raises aiohttp's exceptions for the same failures.

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
import json
from collections.abc import Callable, Mapping
from types import SimpleNamespace

import aiohttp

from inferlab._clock import Clock
from inferlab._errors import InferlabError, ServerUnreachableError, UsageError
from inferlab.client.exchange import (
    CACHE_HEADERS,
    MAX_ERROR_BODY,
    Endpoint,
    StreamRecorder,
    api_base,
    fail,
    note_cache_header,
    record_body,
    record_http_error,
    request_body,
)
from inferlab.openai.errors import one_line
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.workload.spec import RequestSpec

__all__ = [
    "Client", "ConnectError", "Endpoint", "Sender", "api_base", "discover_model", "one_line", "request_body",
    "session_trace", "stale",
]


class _Attempt:
    """One attempt at a request, as the session's trace sees it: ``connecting`` and
    ``connected`` bracket the set-up of a new connection to the server (``waited_ns``
    adds them up); ``reused`` is set if it went out on a pooled keep-alive connection."""

    __slots__ = ("_now", "_since", "reused", "waited_ns")

    def __init__(self, now: Callable[[], int]) -> None:
        self._now = now
        self._since: int | None = None
        self.reused = False
        self.waited_ns = 0

    def connecting(self) -> None:
        self._since = self._now()

    def connected(self) -> None:
        """The connection is had, or its set-up ended without one (refused, timed out,
        cancelled): the wait counts either way."""
        if self._since is not None:
            self.waited_ns += self._now() - self._since
            self._since = None


def session_trace() -> aiohttp.TraceConfig:
    """Brackets the set-up of each new connection a request waits for (what the
    record's ``connect_wait_ns`` adds up), and notes whether it was sent on a reused
    connection (what a resend after a stale keep-alive connection needs to know). Give
    it to every session a ``Client`` sends over."""

    async def on_create_start(session: aiohttp.ClientSession, ctx: SimpleNamespace, params: object) -> None:
        attempt = ctx.trace_request_ctx
        if isinstance(attempt, _Attempt):
            attempt.connecting()

    async def on_create_end(session: aiohttp.ClientSession, ctx: SimpleNamespace, params: object) -> None:
        attempt = ctx.trace_request_ctx
        if isinstance(attempt, _Attempt):
            attempt.connected()

    async def on_reuse(session: aiohttp.ClientSession, ctx: SimpleNamespace, params: object) -> None:
        attempt = ctx.trace_request_ctx
        if isinstance(attempt, _Attempt):
            attempt.reused = True

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_start.append(on_create_start)
    trace.on_connection_create_end.append(on_create_end)
    trace.on_connection_reuseconn.append(on_reuse)
    return trace


#: After ``[DONE]``, how long to wait for the body's end (so the connection can be
#: reused) before giving the connection up. Never affects the request's record.
_DRAIN_S = 1.0


async def _drain(resp: aiohttp.ClientResponse) -> None:
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with asyncio.timeout(_DRAIN_S):
            async for _ in resp.content.iter_any():
                pass


def stale(e: BaseException, reused: bool, answered: bool) -> bool:
    """Whether ``e`` is a stale keep-alive connection failing: the connection was
    ``reused``, it closed or reset, and no response (not even a status line) came back
    (not ``answered``): the request may be sent again on a new connection."""
    return (
        reused
        and not answered
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


class ConnectError(aiohttp.ClientConnectionError):
    """No connection could be opened (a transport's own; aiohttp's is
    ``ClientConnectorError``): recorded as ``connect``, with ``os_error``."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(str(os_error))
        self.os_error = os_error


class Sender:
    """What every asyncio client shares: the record's request fields, the send stamp
    (the request's start, before a connection is taken) and the connect wait,
    the total timeout, the resend of a request a stale keep-alive connection failed,
    and how a failure is recorded (aiohttp's exceptions, which every transport raises).
    A transport gives ``_exchange``: one attempt, on a pooled connection or, for the
    resend (``fresh``), on a connection of its own, closed after it.

    Times in records are ns relative to ``t0_ns`` on ``clock``. ``resent`` counts the
    requests sent a second time because a stale keep-alive connection failed them
    before the server read them (see the module's docstring).
    """

    #: the HTTP stack, as config.json's ``resolved.client_stack.http`` names it
    stack = ""

    def __init__(self, endpoint: Endpoint, clock: Clock, t0_ns: int) -> None:
        self.endpoint = endpoint
        self.clock = clock
        self.t0_ns = t0_ns
        self.resent = 0

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
        record.hash_ids = list(spec.hash_ids) or None
        record.requested_input_tokens = spec.input_tokens
        record.requested_output_tokens = spec.max_tokens
        body = json.dumps(request_body(self.endpoint, spec)).encode()

        # (the request's start: before a connection is taken, so that the wait for a new
        # one is in its latencies and not in its queue delay; see ``RequestRecord``)
        record.send_ns = self._now()
        resent = False
        attempts = [_Attempt(self._now)]
        try:
            async with asyncio.timeout(self.endpoint.timeout_s):
                try:
                    await self._exchange(False, body, record, attempts[0], text_out)
                except aiohttp.ClientError as e:
                    if not stale(e, attempts[0].reused, record.status is not None):
                        raise
                    resent = True
                    self.resent += 1
                    attempts.append(_Attempt(self._now))
                    await self._exchange(True, body, record, attempts[1], text_out)
        except aiohttp.ServerTimeoutError:
            fail(record, ErrorKind.IDLE_TIMEOUT, f"no data for {self.endpoint.idle_timeout_s:g} s")
        except TimeoutError:
            fail(record, ErrorKind.TIMEOUT, f"request took over {self.endpoint.timeout_s:g} s")
        except (aiohttp.ClientConnectorError, ConnectError) as e:
            fail(record, ErrorKind.CONNECT, f"cannot connect to {self.endpoint.url}: {e.os_error}")
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
            fail(record, ErrorKind.DISCONNECT, _closed_message(e, record, resent))
        except aiohttp.ClientError as e:
            fail(record, ErrorKind.DISCONNECT, f"{type(e).__name__}: {e}")
        except asyncio.CancelledError:
            fail(record, ErrorKind.CANCELLED, "run interrupted")
            raise
        finally:
            for attempt in attempts:  # (a set-up that failed or was cut short waited too)
                attempt.connected()
            record.connect_wait_ns = sum(a.waited_ns for a in attempts)

    async def _exchange(
        self, fresh: bool, body: bytes, record: RequestRecord, attempt: _Attempt, text_out: list[str] | None,
    ) -> None:
        """One attempt: ``attempt.connecting()`` and ``connected()`` around the set-up of
        a new connection, ``attempt.reused`` set if it went out on a pooled one; fills
        ``record``; raises aiohttp's exceptions for what failed."""
        raise NotImplementedError


class Client(Sender):
    """Sends requests to one endpoint over a shared aiohttp session (made with
    ``session_trace()``: without it no connect wait is measured and nothing is resent)."""

    stack = "aiohttp"

    def __init__(
        self, endpoint: Endpoint, clock: Clock, session: aiohttp.ClientSession, t0_ns: int
    ) -> None:
        super().__init__(endpoint, clock, t0_ns)
        self.session = session
        self._headers = endpoint.request_headers()
        # no sock_read: the idle timeout is the client's own (``_IdleWatch``, and a timer
        # on the wait for the response's head)
        self._timeout = aiohttp.ClientTimeout(total=None)

    async def _exchange(
        self, fresh: bool, body: bytes, record: RequestRecord, attempt: _Attempt, text_out: list[str] | None,
    ) -> None:
        if fresh:
            await self._resend(body, record, attempt, text_out)
        else:
            await self._post(self.session, body, record, attempt, text_out)

    async def _resend(
        self, body: bytes, record: RequestRecord, attempt: _Attempt, text_out: list[str] | None
    ) -> None:
        """Send again on a connection of its own: the pool's other idle connections
        have idled as long as the stale one, and may be just as stale."""
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True), trace_configs=[session_trace()],
            auto_decompress=self.session.auto_decompress,
        ) as fresh:
            await self._post(fresh, body, record, attempt, text_out)

    async def _post(
        self, session: aiohttp.ClientSession, body: bytes, record: RequestRecord, attempt: _Attempt,
        text_out: list[str] | None,
    ) -> None:
        ep = self.endpoint
        try:
            async with asyncio.timeout(ep.idle_timeout_s):  # (the wait for the response's head)
                resp = await session.post(
                    ep.url, data=body, headers=self._headers, timeout=self._timeout, trace_request_ctx=attempt,
                )
        except TimeoutError:
            raise aiohttp.ServerTimeoutError("no response") from None
        async with resp:
            record.status = resp.status
            for name in CACHE_HEADERS:
                if (value := resp.headers.get(name)) is not None:
                    note_cache_header(record, name, value)
            idle = _IdleWatch(resp.content.set_exception, ep.idle_timeout_s, self._now)
            try:
                if resp.status >= 400:
                    raw = b""
                    while len(raw) < MAX_ERROR_BODY and (data := await resp.content.read(MAX_ERROR_BODY - len(raw))):
                        raw += data
                        idle.last_ns = self._now()
                    record_http_error(record, resp.status, raw, resp.reason or "")
                    return
                if ep.stream and resp.content_type == "text/event-stream":
                    done = await self._read_stream(resp, record, text_out, idle)
                else:
                    await self._read_body(resp, record, text_out, idle)
                    return
            finally:
                idle.cancel()
            if done:
                await _drain(resp)

    async def _read_stream(
        self, resp: aiohttp.ClientResponse, record: RequestRecord, text_out: list[str] | None, idle: _IdleWatch,
    ) -> bool:
        """Read a stream into ``record``; True if it ended with ``[DONE]``."""
        stream = StreamRecorder(record, text_out)
        content, now = resp.content, self._now
        try:
            # (readany, not iter_any: one await per network read, no iterator between)
            while data := await content.readany():
                t = idle.last_ns = now()
                if not stream.read(data, t):
                    break
            if stream.reading:
                stream.eof(self._now())
        finally:  # a failed or cancelled stream keeps what it said so far
            stream.flush()
        stream.finish()
        return stream.done

    async def _read_body(
        self, resp: aiohttp.ClientResponse, record: RequestRecord, text_out: list[str] | None, idle: _IdleWatch,
    ) -> None:
        chunks = []
        while data := await resp.content.readany():
            t = idle.last_ns = self._now()
            if record.ttfb_ns is None:
                record.ttfb_ns = t
            chunks.append(data)
        record_body(record, b"".join(chunks), self._now(), text_out)


class _IdleWatch:
    """The idle timeout while a response's body is read, with one timer per idle period
    rather than aiohttp's ``sock_read``, which cancels and sets a timer on every network
    read (bench/client_cpu.py: a third of the client's CPU per chunk, paced). The
    reader stamps ``last_ns`` (its clock, ns) at each read; when ``idle_s`` pass with
    none (counted from ``since_ns``, default now), ``on_idle`` gets a
    ``ServerTimeoutError`` to fail the body with, as ``sock_read`` would fail it."""

    __slots__ = ("_handle", "_idle_ns", "_now", "_on_idle", "last_ns")

    def __init__(
        self, on_idle: Callable[[BaseException], object], idle_s: float, now: Callable[[], int],
        since_ns: int | None = None,
    ) -> None:
        self._on_idle = on_idle
        self._now = now
        self._idle_ns = int(idle_s * 1e9)
        self.last_ns = now() if since_ns is None else since_ns
        self._handle: asyncio.TimerHandle | None = None
        self._check()

    def _check(self) -> None:
        quiet_ns = self._now() - self.last_ns
        if quiet_ns < self._idle_ns:
            self._handle = asyncio.get_running_loop().call_later((self._idle_ns - quiet_ns) / 1e9, self._check)
            return
        self._handle = None
        self._on_idle(aiohttp.ServerTimeoutError("Timeout on reading data from socket"))

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


async def discover_model(base_url: str, headers: Mapping[str, str], timeout_s: float = 10.0) -> str:
    """The first model id from ``GET /v1/models``, asked with the run's ``headers``
    (``exchange.auth_headers``: its credentials); ``ServerUnreachableError`` if no server
    answers there."""
    import aiohttp  # (here: `sim run` imports this module and makes no HTTP call)

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
        raise ServerUnreachableError.of(base_url, e) from e
    except (aiohttp.ClientError, ValueError) as e:
        raise ServerUnreachableError(f"unexpected answer from {base_url}/models: {e}") from e
    models = data.get("data") if isinstance(data, dict) else None
    if not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise UsageError(f"{base_url}/models lists no model; pass --model explicitly")
    return str(models[0]["id"])
