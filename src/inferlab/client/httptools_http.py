"""The asyncio client on httptools: ``client.http``'s ``Sender`` (the same send stamp and
connect wait, timeouts, resend of a request a stale keep-alive connection failed, and error records)
over connections of its own, for plain ``http://`` endpoints (the ``fast`` extra).

Why: aiohttp hands a response's body to its reader through a ``StreamReader``: per
network read it buffers the bytes and wakes the reading task, and on each ``readany``
it resumes the transport and feeds its parser again; bench/client_cpu.py measured that
at about as much CPU per streamed chunk as the parse of the chunk itself. Here each
connection is an ``asyncio.Protocol``: httptools (llhttp, the parser uvicorn uses) takes
the HTTP framing off (chunked, ``Content-Length`` or up to the close), and each read's
body bytes go to ``client.exchange.StreamRecorder`` in the same callback, with the one
clock reading taken when the read arrived. No buffer, no task woken per read: the
request's task waits once, for the response's end (or a stream's ``[DONE]``).

It fills the same fields with the same meanings as aiohttp's ``Client``: ``send_ns``
as the request starts (``Sender``: before a connection is taken), ``connect_wait_ns``
the set-up of a new connection (``Pool.connect``), ``ttfb_ns`` at the
first read of the body, ``end_ns`` at the read that ended it. Failures are raised as
the aiohttp exceptions aiohttp's client would raise for them, so ``Sender`` records
them alike (the messages of a disconnect mid-body are aiohttp's words).

Not done here (``--http-client aiohttp`` does them): https, and compressed bodies (it
asks for ``identity``; a compressed answer fails the record as ``malformed``, as the
gevent client does). Neither client reads proxy settings from the environment.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from types import TracebackType
from typing import Self, cast
from urllib.parse import urlsplit

import aiohttp
import httptools

from inferlab._clock import Clock
from inferlab.client.exchange import (
    CACHE_HEADERS,
    MAX_ERROR_BODY,
    Endpoint,
    StreamRecorder,
    fail,
    header_lines,
    note_cache_header,
    record_body,
    record_http_error,
    request_path,
)
from inferlab.client.http import ConnectError, Sender, _Attempt, _IdleWatch
from inferlab.results.records import ErrorKind, RequestRecord

__all__ = ["HttptoolsClient", "InvalidResponse", "Pool", "check_url"]

#: After ``[DONE]``, how long to wait for the body's end so the connection can be
#: reused (as ``client.http``); never affects the record.
_DRAIN_S = 1.0


def check_url(url: str) -> None:
    """``ValueError`` unless ``url`` is one this client can send to (plain http)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"the httptools client speaks plain http:// only, not {url!r} (use aiohttp)")


class InvalidResponse(aiohttp.ClientError):
    """The server's bytes are not an HTTP/1.1 response (llhttp refused them)."""


def _never() -> int:
    raise AssertionError("a connection read before its exchange started")


# what the connection is reading (``_Connection.mode``); ``_HELD``: the head came, and
# the body is kept until ``httptools_relay.Response`` says how to read it; ``_RELAY``:
# each read's body bytes go to ``on_read`` in one piece (``Response.relay``)
_HEAD, _STREAM, _BODY, _ERROR, _AFTER, _HELD, _RELAY = range(7)


class _Connection(asyncio.Protocol):
    """One keep-alive connection of a ``Pool``, and the state of the one exchange on it.

    ``start`` arms it for a request; the parser's callbacks then fill the record as the
    response arrives, and ``waiter`` is set when the request's task has something to do:
    the response ended (``complete``), a stream stopped reading (``[DONE]``, or an
    event that failed the record), the error body is read, or it failed (an exception).
    Started without a record, it wakes the task when the head came and holds the body
    for ``client.httptools_relay.Response`` (its caller reads the body its own way);
    ``arm`` makes the next waiter.
    """

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.clock_ns: Callable[[], int] = _never  # the client's clock, and its t0 (``start``)
        self.t0_ns = 0
        self.transport: asyncio.Transport | None = None
        self.open = False
        self.busy = False
        self.waiter: asyncio.Future[None] | None = None
        self._reset()

    def _reset(self) -> None:
        self.parser: httptools.HttpResponseParser | None = None
        self.mode = _HEAD
        self.status: int | None = None
        self.reason = ""
        self.interim = False  # a 1xx answer before the real one
        self.chunked = False
        self.length: int | None = None
        self.received = 0  # body bytes of this response
        self.media_type = ""
        self.encoding: str | None = None
        self.complete = False
        self.keep_alive = False
        self.pieces: list[bytes] = []
        self.stream: StreamRecorder | None = None
        self.t_ns = 0
        self.watch: _IdleWatch | None = None
        self._stream_wanted = True
        self._record: RequestRecord | None = None
        self._text_out: list[str] | None = None
        self.error: BaseException | None = None  # what failed the exchange (``fail``)
        self.on_read: Callable[[bytes, int], bool] | None = None  # (``_RELAY``)
        self.paused = False  # reading paused for ``on_read``'s consumer (``hold``)

    # --- the pool's side -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is not asyncio's class)
        self.open = True

    def start(
        self, record: RequestRecord | None, text_out: list[str] | None, stream: bool, clock_ns: Callable[[], int],
        t0_ns: int,
    ) -> asyncio.Future[None]:
        """Arm the connection for one request's response; the future ``waiter``. Without
        a ``record``, the waiter is set when the head came (``httptools_relay``)."""
        self._reset()
        self.busy = True
        self.clock_ns, self.t0_ns = clock_ns, t0_ns
        self.parser = httptools.HttpResponseParser(self)
        self._record, self._text_out, self._stream_wanted = record, text_out, stream
        self.waiter = asyncio.get_running_loop().create_future()
        return self.waiter

    def abort(self) -> None:
        self.open = False
        if self.transport is not None:
            self.transport.abort()

    def fail(self, exc: BaseException) -> None:
        """End the exchange with ``exc`` (the idle watch's, or the connection's)."""
        self.busy = False  # (nothing more of this exchange is read)
        if self.error is None:
            self.error = exc
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.abort()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def arm(self) -> asyncio.Future[None]:
        """A new ``waiter``, for the task's next wait; done at once if the exchange ended,
        failed (its exception) or was held (``hold``) since the last one."""
        waiter = self.waiter = asyncio.get_running_loop().create_future()
        if self.error is not None:
            waiter.set_exception(self.error)
        elif self.complete or self.paused:
            waiter.set_result(None)
        return waiter

    def hold(self) -> None:
        """Stop reading until ``unhold`` (``on_read``'s consumer is full); wake the task."""
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def unhold(self) -> None:
        if self.paused:
            self.paused = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()

    # --- asyncio's side ------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        if parser is None or not self.busy:  # bytes nobody asked for: not reusable
            self.abort()
            return
        self.t_ns = t = self.clock_ns() - self.t0_ns  # (``Sender._now``, inlined: once per read)
        if self.watch is not None:
            self.watch.last_ns = t
        try:
            parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:  # (a bug of ours, in a callback)
            self.fail(e.__context__ or e)
            return
        except httptools.HttpParserError as e:
            self.fail(InvalidResponse(f"invalid HTTP response: {e}"))
            return
        if self.mode == _RELAY and self.pieces:  # the read's body, in one piece however it was chunked
            pieces, self.pieces = self.pieces, []
            assert self.on_read is not None
            try:
                if not self.on_read(pieces[0] if len(pieces) == 1 else b"".join(pieces), t):
                    self.hold()
            except Exception as e:  # (the consumer's: its client went away, say)
                self.fail(e)

    def eof_received(self) -> bool:
        return False  # (the transport closes itself: ``connection_lost``)

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self.pool._lost(self)
        if not self.busy or self.complete:
            return
        if self.status is None or self.interim:
            self.fail(aiohttp.ServerDisconnectedError() if exc is None else aiohttp.ClientOSError(*exc.args))
        elif exc is None and not self.chunked and self.length is None:
            self.on_message_complete()  # a body that runs to the close
        else:
            # (aiohttp's words for it, so that both clients record it alike)
            if self.chunked:
                inner = "<TransferEncodingError: 400, message='Not enough data to satisfy transfer length header.'>"
            else:
                inner = (
                    "<ContentLengthError: 400, message='Not enough data to satisfy content length header "
                    f"(received {self.received} of {self.length} bytes).'>"
                )
            message = f"Response payload is not completed: {inner}" + ("" if exc is None else f". {exc!r}")
            self.fail(aiohttp.ClientPayloadError(message))

    # --- llhttp's callbacks ------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:  # a second response nobody asked for: the connection is unusable
            raise InvalidResponse("the server sent more than one response")

    def on_status(self, status: bytes) -> None:
        self.reason = status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.lower()
        if key == b"content-type":
            self.media_type = value.decode("latin-1").partition(";")[0].strip().lower()
        elif key == b"content-length":
            self.length = int(value)  # (llhttp checked it is a number)
        elif key == b"transfer-encoding":
            self.chunked = b"chunked" in value.lower()
        elif key == b"content-encoding":
            self.encoding = value.decode("latin-1").strip().lower()
        elif key.decode("latin-1") in CACHE_HEADERS and self._record is not None:
            note_cache_header(self._record, key.decode("latin-1"), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        status = self.parser.get_status_code()
        if status < 200:  # an interim answer (100 Continue, 103 Early Hints): the real one follows
            self.interim = True
            return
        self.status = status
        if self._record is None:
            self.mode = _HELD
            self._wake()
            return
        self._record.status = status
        if status >= 400:
            self.mode = _ERROR
        elif self.encoding not in (None, "identity"):
            self.mode = _AFTER  # the task fails the record
            self._wake()
        elif self._stream_wanted and self.media_type == "text/event-stream":
            self.mode = _STREAM
            self.stream = StreamRecorder(self._record, self._text_out)
        else:
            self.mode = _BODY

    def on_body(self, body: bytes) -> None:
        # The per-read hot path: one call per HTTP chunk (several may share a read).
        self.received += len(body)
        mode = self.mode
        if mode == _STREAM:
            assert self.stream is not None
            if not self.stream.read(body, self.t_ns):
                self.mode = _AFTER
                self._wake()
        elif mode in (_RELAY, _HELD):  # (a read's pieces go on when it is parsed)
            self.pieces.append(body)
        elif mode == _BODY:
            record = self._record
            if record is not None and record.ttfb_ns is None:
                record.ttfb_ns = self.t_ns
            self.pieces.append(body)
        elif mode == _ERROR:
            self.pieces.append(body)
            if self.received >= MAX_ERROR_BODY:  # enough for its message: the rest is not read
                self.mode = _AFTER
                self._wake()

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            self.chunked, self.length, self.media_type, self.encoding = False, None, "", None
            return
        if self.mode == _STREAM:
            assert self.stream is not None
            self.stream.eof(self.t_ns)
        self.complete = True
        self.keep_alive = self.parser is not None and self.parser.should_keep_alive() and self.open
        self.busy = False
        self._wake()


class Pool:
    """Keep-alive connections to the server of ``base_url`` (plain http), opened as
    needed: every connection that comes back whole is kept (no limit: the load policy
    bounds concurrency, as with the aiohttp session's pool), the last one back used
    first."""

    def __init__(self, base_url: str) -> None:
        check_url(base_url)
        parts = urlsplit(base_url)
        assert parts.hostname is not None
        self.host, self.port = parts.hostname, parts.port or 80
        self.host_header = parts.netloc.rpartition("@")[2]
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()

    async def connect(self) -> _Connection:
        """A new connection; ``ConnectError`` if none can be opened."""
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(lambda: _Connection(self), self.host, self.port)
        except OSError as e:
            raise ConnectError(e) from e
        self._all.add(conn)
        return conn

    def take(self) -> _Connection | None:
        """An idle connection still open, or None."""
        idle = self._idle
        while idle:
            conn = idle.pop()
            if conn.open and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    def give_back(self, conn: _Connection) -> None:
        """``conn``'s exchange is over: keep it if it can carry the next one, else close it."""
        if conn.open and conn.keep_alive and conn.complete:
            conn.busy = False
            conn.parser = None
            conn.on_read = None
            conn.unhold()
            self._idle.append(conn)
        else:
            conn.abort()

    def _lost(self, conn: _Connection) -> None:
        self._all.discard(conn)

    def post_head(self, url: str, headers: dict[str, str]) -> bytes:
        """The head of a POST to ``url`` (on this pool's server) with ``headers``, up to
        ``Content-Length: `` (the length and the body follow; ``httptools_relay.send``).
        The body is asked for as sent (``identity``). ``ValueError`` for a URL this
        client cannot send to, or a header that cannot be sent as given."""
        check_url(url)
        lines = header_lines({"Host": self.host_header, **headers, "Accept-Encoding": "identity"})
        return f"POST {request_path(url)} HTTP/1.1\r\n{lines}Content-Length: ".encode("latin-1")

    async def warm(self, n: int) -> None:
        """Open ``n`` connections into the pool (best effort: a failure is ignored)."""

        async def one() -> None:
            with contextlib.suppress(ConnectError):
                conn = await self.connect()
                conn.keep_alive = conn.complete = True
                self.give_back(conn)

        await asyncio.gather(*(one() for _ in range(n)))

    async def close(self) -> None:
        for conn in list(self._all):
            conn.abort()
        self._idle.clear()
        self._all.clear()
        await asyncio.sleep(0)  # (the transports' close callbacks)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class HttptoolsClient(Sender):
    """Sends requests to one plain-http endpoint over ``pool`` (its connections); see the
    module's docstring. Times in records are ns relative to ``t0_ns`` on ``clock``."""

    stack = "httptools"

    def __init__(self, endpoint: Endpoint, clock: Clock, pool: Pool, t0_ns: int) -> None:
        check_url(endpoint.url)
        super().__init__(endpoint, clock, t0_ns)
        self.pool = pool
        self._head = pool.post_head(endpoint.url, endpoint.request_headers())

    async def _exchange(
        self, fresh: bool, body: bytes, record: RequestRecord, attempt: _Attempt, text_out: list[str] | None,
    ) -> None:
        ep, pool = self.endpoint, self.pool
        start = self._now()
        conn = None if fresh else pool.take()
        attempt.reused = conn is not None
        if conn is None:
            attempt.connecting()
            try:
                async with asyncio.timeout(ep.idle_timeout_s):  # (as aiohttp's wait for the head)
                    conn = await pool.connect()
            except TimeoutError:
                raise aiohttp.ServerTimeoutError("no response") from None
            finally:
                attempt.connected()
        assert conn.transport is not None
        waiter = conn.start(record, text_out, ep.stream, self.clock.now_ns, self.t0_ns)
        # (from the attempt's start: the connect, the request and the wait for the head
        # count, as aiohttp's client counts them)
        conn.watch = watch = _IdleWatch(conn.fail, ep.idle_timeout_s, self._now, since_ns=start)
        reusable = False
        try:
            conn.transport.write(b"%s%d\r\n\r\n%s" % (self._head, len(body), body))
            try:
                await waiter
            finally:
                if conn.stream is not None:  # a failed or cancelled stream keeps what it said so far
                    conn.stream.flush()
            reusable = self._record(conn, record, text_out)
            if not reusable and conn.stream is not None and conn.stream.done and conn.open:
                watch.cancel()  # (the record is final: only the connection waits now)
                reusable = await self._drain(conn)
        finally:
            watch.cancel()
            conn.watch = None
            if fresh or not reusable:
                conn.abort()
            else:
                pool.give_back(conn)

    def _record(self, conn: _Connection, record: RequestRecord, text_out: list[str] | None) -> bool:
        """What the response said into ``record``, once the task is woken without an
        error; True if the connection's response is whole (reusable as far as it goes)."""
        status = conn.status
        assert status is not None
        if conn.stream is not None:
            conn.stream.finish()
        elif status >= 400:
            raw = b"".join(conn.pieces)[:MAX_ERROR_BODY]
            record_http_error(record, status, raw, conn.reason)
        elif conn.mode == _AFTER:  # a compressed body
            fail(record, ErrorKind.MALFORMED, f"the response is compressed ({conn.encoding}), though identity was asked for")
        else:
            record_body(record, b"".join(conn.pieces), conn.t_ns, text_out)
        return conn.complete

    async def _drain(self, conn: _Connection) -> bool:
        """After ``[DONE]``: wait for the body's end (so the connection can be reused);
        whatever happens, the record is final already."""
        waiter = conn.waiter = asyncio.get_running_loop().create_future()
        if conn.complete:
            return True
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with asyncio.timeout(_DRAIN_S):
                await waiter
        return conn.complete
