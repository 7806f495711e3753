"""The client on gevent: one request at a time from a greenlet (a Locust user), over one
keep-alive connection of its own, filling the same ``RequestRecord`` as ``client.http``.

Locust runs its users as greenlets, so the asyncio client cannot run there. This one
writes the request on a gevent socket and reads the response with one ``recv`` per
network read, taking one clock reading per read; geventhttpclient's C parser (llhttp)
takes the HTTP framing off (chunked or not) and every read's body bytes go to the
shared ``client.exchange.StreamRecorder``, which fills the record exactly as the asyncio
client does. Locust's own clients do not fit: ``FastHttpUser``'s ``iter_content`` and
``requests``' ``iter_content`` gather a fixed number of bytes (several chunks, one time)
or split one read into several. A request that a stale keep-alive connection failed
before any answer came is sent again, once, on a new connection (``resent`` counts
them), as ``client.http`` does. A request never raises for a failure (it is recorded);
only ``GreenletExit`` (Locust stopping the user) propagates, the record marked
``cancelled``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import urlsplit

import gevent
import gevent.monkey
import gevent.socket
import gevent.ssl
from geventhttpclient.response import HTTPParseError, HTTPResponse

from inferlab._errors import InferlabError, ServerUnreachableError
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
from inferlab.openai.errors import one_line
from inferlab.results.records import ErrorKind, RequestRecord

__all__ = ["Connection", "GeventClient"]

#: Bytes asked of one ``recv``: more than any server writes between two reads.
_READ = 65536
#: After ``[DONE]``, how long to wait for the body's end so the connection can be reused
#: (as ``client.http``); never affects the record.
_DRAIN_S = 1.0


class _Response(HTTPResponse):
    """geventhttpclient's response parser, fed by hand: it keeps the body bytes of each
    ``feed`` apart (``take``) instead of gathering them into one buffer."""

    def __init__(self, method: str = "POST") -> None:
        super().__init__(method=method)
        self._pieces: list[bytes] = []

    def _on_body(self, buf: bytearray) -> None:
        self._pieces.append(bytes(buf))

    def take(self) -> bytes:
        """The body bytes fed since the last ``take`` (``b""``: none)."""
        pieces, self._pieces = self._pieces, []
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    @property
    def media_type(self) -> str:
        """The Content-Type without its parameters, lower case (aiohttp's ``content_type``)."""
        value = self.get("content-type") or ""
        return (value if isinstance(value, str) else value[0]).partition(";")[0].strip().lower()


class _Closed(Exception):
    """The server closed the connection before the response was whole."""


class _ConnectError(Exception):
    """No connection could be opened."""


class _DrainOver(Exception):
    """The wait for the body's end after ``[DONE]`` is over."""


class _TotalTimeout(Exception):
    """The whole request took longer than its endpoint's ``timeout_s``."""


class Connection:
    """One keep-alive HTTP/1.1 connection to the server of ``base_url``: opened on first
    use, opened again when the server has closed it, dropped after a response that
    leaves it unusable. TLS for ``https`` (certificates verified)."""

    def __init__(self, base_url: str, connect_timeout_s: float, idle_timeout_s: float) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.host_header = parts.netloc.rpartition("@")[2]
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self._sock: gevent.socket.socket | None = None
        self.reused = False  # the last ``socket()`` was a kept-alive connection

    def socket(self) -> gevent.socket.socket:
        """The open connection, or a new one; ``_ConnectError`` if none can be opened."""
        sock = self._sock
        if sock is not None and not _idle_and_open(sock):
            self.close()
            sock = None
        self.reused = sock is not None
        if sock is None:
            try:
                sock = gevent.socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s)
                sock.setsockopt(gevent.socket.IPPROTO_TCP, gevent.socket.TCP_NODELAY, 1)
                if self.tls:
                    sock = gevent.ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
            except OSError as e:
                raise _ConnectError(str(e) or type(e).__name__) from e
            sock.settimeout(self.idle_timeout_s)
            self._sock = sock
        return sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


#: The standard library's own ``select`` (gevent's yields to other greenlets even with
#: a zero timeout, and the request then waits for them).
_select = gevent.monkey.get_original("select", "select")


def _idle_and_open(sock: gevent.socket.socket) -> bool:
    """Whether a kept-alive connection can take the next request: nothing to read on it
    (readable between requests means the server closed it, or sent what nobody asked)."""
    try:
        readable, _, _ = _select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


class GeventClient:
    """Sends requests to one endpoint over one connection, one at a time (one Locust
    user's). Times in records come from ``now_ns`` (the run's clock: ns since the run's
    start); the request bodies are made by the caller (``client.exchange.request_body``)."""

    def __init__(self, endpoint: Endpoint, now_ns: Callable[[], int]) -> None:
        self.endpoint = endpoint
        self.now_ns = now_ns
        self.connection = Connection(endpoint.base_url, endpoint.idle_timeout_s, endpoint.idle_timeout_s)
        #: requests sent a second time because a stale keep-alive connection failed them
        self.resent = 0
        self.path = request_path(endpoint.url)
        self.header_lines = header_lines(
            {"Host": self.connection.host_header, **endpoint.request_headers(), "Accept-Encoding": "identity"}
        )

    def close(self) -> None:
        self.connection.close()

    def send(self, body: bytes, record: RequestRecord, text_out: list[str] | None = None) -> int:
        """POST ``body`` to the endpoint; fill ``record`` with what happened (the request
        fields the spec sets are the caller's). Returns the bytes of response body read.
        Never raises, except ``GreenletExit`` (the record is then marked ``cancelled``)."""
        ep = self.endpoint
        exchange = _Exchange(self, record, text_out)
        # (the request's start, before a connection is had: as ``client.http.Sender``)
        record.send_ns = self.now_ns()
        record.connect_wait_ns = 0
        resent = False
        try:
            with gevent.Timeout(ep.timeout_s, _TotalTimeout()):
                try:
                    exchange.run(body)
                except (_Closed, OSError, HTTPParseError) as e:
                    if not exchange.reused or record.status is not None or isinstance(e, TimeoutError):
                        raise
                    # a stale keep-alive connection, closed as the request went out
                    # (client.http's docstring): once more, on a new connection
                    self.connection.close()
                    resent = True
                    self.resent += 1
                    exchange = _Exchange(self, record, text_out)
                    exchange.run(body)
        except _TotalTimeout:
            fail(record, ErrorKind.TIMEOUT, f"request took over {ep.timeout_s:g} s")
        except _ConnectError as e:
            fail(record, ErrorKind.CONNECT, f"cannot connect to {ep.url}: {e}")
        except TimeoutError:
            fail(record, ErrorKind.IDLE_TIMEOUT, f"no data for {ep.idle_timeout_s:g} s")
        except (_Closed, OSError, HTTPParseError) as e:
            if record.status is not None:
                fail(record, ErrorKind.DISCONNECT, f"connection closed mid-response: {e}")
            else:
                retry = " (also when sent again on a new connection)" if resent else ""
                fail(record, ErrorKind.DISCONNECT, f"the server closed the connection before responding{retry}: {type(e).__name__}: {e}")
        except gevent.GreenletExit:
            fail(record, ErrorKind.CANCELLED, "run interrupted")
            raise
        finally:
            if not exchange.reusable:
                self.connection.close()
        return exchange.body_bytes

    def get(self, path: str, timeout_s: float = 10.0) -> tuple[int, bytes]:
        """``GET`` the endpoint's ``base_url`` + ``path`` over this connection: the status
        and the body. ``ServerUnreachableError`` if no whole answer comes."""
        url = self.endpoint.base_url + path
        request = (f"GET {request_path(url)} HTTP/1.1\r\n" + self.header_lines + "\r\n").encode("latin-1")
        reusable = False
        try:
            with gevent.Timeout(timeout_s, _TotalTimeout()):
                sock = self.connection.socket()
                sock.sendall(request)
                resp = _Response("GET")
                body = _read_whole(sock, resp, None)
                reusable = resp.message_complete and resp.should_keep_alive()
                return resp.status_code, body
        except _TotalTimeout:
            raise ServerUnreachableError(f"{url}: no answer within {timeout_s:g} s") from None
        except (_ConnectError, _Closed, OSError, HTTPParseError) as e:
            raise ServerUnreachableError.of(url, e) from e
        finally:
            if not reusable:
                self.connection.close()

    def discover_model(self) -> str:
        """The first model id of ``GET /models`` (as ``client.http.discover_model``);
        ``ServerUnreachableError`` if no server answers, ``InferlabError`` if it lists none."""
        status, body = self.get("/models")
        base = self.endpoint.base_url
        if status >= 400:
            text = one_line(body[:4096].decode("utf-8", "replace"))
            raise InferlabError(
                f"{base}/models answered HTTP {status} ({text or 'no body'}): is this an "
                "OpenAI-compatible API root? Check --host, or pass --model"
            )
        try:
            data = json.loads(body)
        except ValueError as e:
            raise ServerUnreachableError(f"unexpected answer from {base}/models: {e}") from e
        models = data.get("data") if isinstance(data, dict) else None
        if not models or not isinstance(models[0], dict) or "id" not in models[0]:
            raise InferlabError(f"{base}/models lists no model; pass --model explicitly")
        return str(models[0]["id"])


class _Exchange:
    """One request on ``client``'s connection: writes it, reads the answer into
    ``record``; ``reusable`` once the connection can carry the next one."""

    def __init__(self, client: GeventClient, record: RequestRecord, text_out: list[str] | None) -> None:
        self.client = client
        self.record = record
        self.text_out = text_out
        self.reusable = False
        self.reused = False  # sent on a kept-alive connection
        self.body_bytes = 0

    def run(self, body: bytes) -> None:
        client, record = self.client, self.record
        since = client.now_ns()
        try:
            sock = client.connection.socket()
        finally:  # (a new connection's set-up, had or not; a pooled one's is 0)
            if not client.connection.reused:
                record.connect_wait_ns = (record.connect_wait_ns or 0) + client.now_ns() - since
        self.reused = client.connection.reused
        head = f"POST {client.path} HTTP/1.1\r\n{client.header_lines}Content-Length: {len(body)}\r\n\r\n"
        sock.sendall(head.encode("latin-1") + body)
        resp = _Response()
        t_ns = self._read_headers(sock, resp)
        record.status = status = resp.status_code
        for name in CACHE_HEADERS:
            if (value := resp.get(name)) is not None:
                note_cache_header(record, name, value if isinstance(value, str) else value[0])
        if status >= 400:
            record_http_error(record, status, _read_whole(sock, resp, MAX_ERROR_BODY), resp.status_message or "")
        else:
            encoding = resp.get("content-encoding")
            if encoding not in (None, "identity"):
                fail(record, ErrorKind.MALFORMED, f"the response is compressed ({encoding}), though identity was asked for")
                return
            if client.endpoint.stream and resp.media_type == "text/event-stream":
                self._read_stream(sock, resp, t_ns)
            else:
                self._read_body(sock, resp, t_ns)
        self.reusable = resp.message_complete and resp.should_keep_alive()

    def _recv(self, sock: gevent.socket.socket, resp: _Response) -> tuple[bytes, int]:
        """One network read fed to the parser: its body bytes and the time it returned.
        The end of the connection ends a body without length, else raises ``_Closed``."""
        data = sock.recv(_READ)
        t_ns = self.client.now_ns()
        _feed(resp, data)
        body = resp.take()
        self.body_bytes += len(body)
        return body, t_ns

    def _read_headers(self, sock: gevent.socket.socket, resp: _Response) -> int:
        t_ns = 0
        while not resp.headers_complete or resp.status_code < 200:  # (skips 1xx answers)
            data = sock.recv(_READ)
            t_ns = self.client.now_ns()
            if not data:
                raise _Closed("the server closed the connection before answering")
            resp.feed(data)
        return t_ns

    def _read_stream(self, sock: gevent.socket.socket, resp: _Response, t_ns: int) -> None:
        stream = StreamRecorder(self.record, self.text_out)
        try:
            data = resp.take()  # (what came with the headers)
            self.body_bytes += len(data)
            reading = stream.read(data, t_ns) if data else True
            while reading and not resp.message_complete:
                data, t_ns = self._recv(sock, resp)
                if data:
                    reading = stream.read(data, t_ns)
            if stream.reading:
                stream.eof(self.client.now_ns())
        finally:  # a failed or cancelled stream keeps what it said so far
            stream.flush()
        stream.finish()
        if stream.done and not resp.message_complete:
            self._drain(sock, resp)

    def _read_body(self, sock: gevent.socket.socket, resp: _Response, t_ns: int) -> None:
        record = self.record
        data = resp.take()
        self.body_bytes += len(data)
        pieces = [data] if data else []
        if data:
            record.ttfb_ns = t_ns
        while not resp.message_complete:
            data, t_ns = self._recv(sock, resp)
            if data:
                if record.ttfb_ns is None:
                    record.ttfb_ns = t_ns
                pieces.append(data)
        record_body(record, b"".join(pieces), self.client.now_ns(), self.text_out)

    def _drain(self, sock: gevent.socket.socket, resp: _Response) -> None:
        """Read what follows ``[DONE]`` (the body's end) so the connection can be reused;
        whatever happens, the record is final already."""
        try:
            with gevent.Timeout(_DRAIN_S, _DrainOver()):
                while not resp.message_complete:
                    self._recv(sock, resp)
        except (_DrainOver, _Closed, OSError, HTTPParseError):
            pass


def _feed(resp: _Response, data: bytes) -> None:
    """One read into the parser; an empty one (the server closed) ends a body without
    length, else raises ``_Closed``."""
    if data:
        resp.feed(data)
        return
    try:
        resp.feed(b"")
    except HTTPParseError:
        raise _Closed("the server closed the connection") from None
    if not resp.message_complete:
        raise _Closed("the server closed the connection")


def _read_whole(sock: gevent.socket.socket, resp: _Response, limit: int | None) -> bytes:
    """The rest of a response's body (at most ``limit`` bytes: past it the connection is
    left unusable), headers first if they have not come yet."""
    while not resp.headers_complete or resp.status_code < 200:
        data = sock.recv(_READ)
        if not data:
            raise _Closed("the server closed the connection before answering")
        resp.feed(data)
    pieces = [resp.take()]
    size = len(pieces[0])
    while not resp.message_complete and (limit is None or size < limit):
        _feed(resp, sock.recv(_READ))
        piece = resp.take()
        pieces.append(piece)
        size += len(piece)
    raw = b"".join(pieces)
    return raw if limit is None else raw[:limit]
