"""How the gateway sends a request to an upstream, on one of two HTTP stacks
(``[gateway] http_client``, resolved per upstream as ``bench --http-client`` is):

- ``httptools``: the project's own client connections (``client.httptools_http``: a
  keep-alive pool per upstream, llhttp's parser); a streamed body is handed on read by
  read inside the connection's callback, with no task woken and no buffer per read.
  Plain ``http://`` only; ``auto`` takes it where the ``fast`` extra installed it.
- ``aiohttp``: an ``aiohttp.ClientSession`` (https upstreams, or without httptools).

Both give a ``Reply`` (status, content type; then the body whole, its start for an
error's message, or read by read to a consumer) and raise aiohttp's exceptions for the
same failures. ``Upstreams.send`` turns a failure before the answer into ``Failure``:
the caller may try another upstream.

Both ask for an uncompressed answer (``Accept-Encoding: identity``): the gateway relays
the body as it reads it, and says nothing of an encoding to its client. An upstream
that compresses anyway is decompressed by aiohttp's session (gzip, deflate; br and zstd
where their libraries are installed); an answer still encoded (the httptools client
decodes nothing) is a ``Failure``, never relayed as plain JSON.

The two differ in what the caller does not see: the httptools client sends a request a
stale keep-alive connection failed before any answer once more on a new connection
(aiohttp's session reports it, so the gateway counts an upstream error and tries again:
on another upstream when there is one).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

import aiohttp

from inferlab._clock import Clock
from inferlab.client.exchange import resolve_http_client
from inferlab.client.http import ConnectError
from inferlab.gateway.config import GatewayConfig
from inferlab.openai.errors import error_message, one_line
from inferlab.openai.request import PATHS, Api

if TYPE_CHECKING:  # (imported where a pool is made: httptools is the fast extra's)
    from inferlab.client.httptools_http import Pool
    from inferlab.client.httptools_relay import Response

    Send = Callable[[Pool, bytes, bytes, Callable[[], int], float, float], Awaitable[Response]]

#: Most bytes of an upstream's error body read to quote it.
_ERROR_BODY_BYTES = 65536
#: The longest wait for a new connection to an upstream.
CONNECT_TIMEOUT_S = 10.0
#: Content codings an aiohttp response reads decoded (its parser's; "" and identity: none).
_DECODED = ("", "identity", "gzip", "deflate", "br", "zstd")


#: Statuses an upstream answers for a request it cannot take (llama.cpp: 500 for an
#: ``image_url`` part without a vision model, 501 for a feature it lacks): with an
#: OpenAI error body, an answer to this request (``Failure.answer``), not a sign that
#: the upstream is down. 502, 503 and 504 say a server behind it, or it, is unavailable.
ANSWERED_STATUSES = (500, 501)


class Failure(Exception):
    """The upstream failed before the client got anything: ``kind`` (``connect``,
    ``status``, ``timeout``, ``disconnect``, ``malformed``), a one-line message, the upstream's status
    if it answered, and whether another upstream may do better (``retry``). ``answer``:
    the upstream's body where it answered one of ``ANSWERED_STATUSES`` with an OpenAI
    error body (``openai_error``): it is alive and refused this request (the gateway's
    rule: docs/gateway.md, "Streams")."""

    def __init__(self, kind: str, message: str, status: int | None = None, retry: bool = True,
                 answer: bytes | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.retry = retry
        self.answer = answer


class Reply(Protocol):
    """An upstream's answer, from its head on. ``content_type``: the media type,
    lowercased (``application/octet-stream`` when none is given); ``encoding``: the
    body's content coding as it is read (None: identity). ``relay`` hands each
    read of the body to ``on_read(data, t_ns)`` (``t_ns`` on the gateway's clock) until
    the body ends; ``on_read`` returning False pauses reading until ``drained()``.
    ``release`` ends the exchange (the connection is kept if the body was read to its
    end); ``abort`` drops the connection, which abandons the upstream's request."""

    status: int
    reason: str
    encoding: str | None

    @property
    def content_type(self) -> str: ...

    async def read(self) -> bytes: ...

    async def read_error(self) -> bytes: ...

    async def relay(self, on_read: Callable[[bytes, int], bool], drained: Callable[[], Awaitable[None]]) -> None: ...

    def release(self) -> None: ...

    def abort(self) -> None: ...


class _AiohttpReply:
    """``Reply`` over an ``aiohttp.ClientResponse``."""

    def __init__(self, resp: aiohttp.ClientResponse, clock: Clock) -> None:
        self._resp = resp
        self._clock = clock
        self.status = resp.status
        self.reason = resp.reason or ""
        coding = resp.headers.get("Content-Encoding", "").strip().lower()
        self.encoding = None if coding in _DECODED else coding

    @property
    def content_type(self) -> str:
        return self._resp.content_type

    async def read(self) -> bytes:
        return await self._resp.read()

    async def read_error(self) -> bytes:
        content, data = self._resp.content, b""
        while len(data) < _ERROR_BODY_BYTES and (more := await content.read(_ERROR_BODY_BYTES - len(data))):
            data += more  # (to its end, within the limit: a body cut short is not JSON)
        return data

    async def relay(self, on_read: Callable[[bytes, int], bool], drained: Callable[[], Awaitable[None]]) -> None:
        content, now = self._resp.content, self._clock.now_ns
        while data := await content.readany():
            if not on_read(data, now()):
                await drained()

    def release(self) -> None:
        self._resp.release()

    def abort(self) -> None:
        self._resp.close()


class Upstreams:
    """The gateway's connections to its upstreams: an httptools pool for each upstream
    ``http_client`` resolves to ``httptools``, one aiohttp session for the others and for
    every other call (models, health). ``open`` and ``close`` with the app;
    ``ValueError`` (from the constructor) for a stack that cannot reach an upstream."""

    def __init__(self, config: GatewayConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self.stacks = [resolve_http_client(config.http_client, u.url) for u in config.upstreams]
        self._session: aiohttp.ClientSession | None = None
        self._pools: list[Pool | None] = []
        self._heads: list[dict[Api, bytes]] = []
        self._send: Send | None = None  # ``client.httptools_relay.send``, where a pool is made

    async def open(self) -> None:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=False))
        for i, (up, stack) in enumerate(zip(self.config.upstreams, self.stacks, strict=True)):
            pool = None
            heads: dict[Api, bytes] = {}
            if stack == "httptools":
                from inferlab.client.httptools_http import Pool
                from inferlab.client.httptools_relay import send

                self._send = send
                pool = Pool(up.url)
                heads = {api: pool.post_head(up.url + "/v1" + path, self.headers(i)) for api, path in PATHS.items()}
            self._pools.append(pool)
            self._heads.append(heads)

    async def close(self) -> None:
        for pool in self._pools:
            if pool is not None:
                await pool.close()
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "the gateway's app is not started"
        return self._session

    def headers(self, i: int, json_body: bool = True) -> dict[str, str]:
        """What every request to upstream ``i`` carries: its own key, never the client's."""
        h = {"Content-Type": "application/json"} if json_body else {}
        key = self.config.upstreams[i].api_key
        if key:
            h["Authorization"] = f"Bearer {key}"
        return h

    async def send(self, i: int, api: Api, payload: bytes) -> Reply:
        """POST ``payload`` to upstream ``i``'s ``api``; its reply once the status and
        headers came. ``Failure`` if it cannot be reached, or answers with a status
        another upstream might not (429, 5xx; also 401/403: the gateway's own key was
        refused). The whole exchange is bounded by ``upstream_timeout_s``."""
        timeout_s = self.config.upstream_timeout_s
        pool = self._pools[i]
        reply: Reply
        try:
            if pool is not None:
                assert self._send is not None
                reply = await self._send(pool, self._heads[i][api], payload, self.clock.now_ns, timeout_s,
                                         CONNECT_TIMEOUT_S)
            else:
                url = self.config.upstreams[i].url + "/v1" + PATHS[api]
                timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=CONNECT_TIMEOUT_S)
                headers = {**self.headers(i), "Accept-Encoding": "identity"}
                reply = _AiohttpReply(await self.session.post(url, data=payload, headers=headers, timeout=timeout),
                                      self.clock)
        except (aiohttp.ClientConnectorError, ConnectError) as e:
            raise Failure("connect", f"cannot connect to the upstream: {e.os_error}") from None
        except TimeoutError:
            raise Failure("timeout", f"the upstream did not answer within {timeout_s:g} s") from None
        except aiohttp.ClientError as e:
            raise Failure("disconnect", f"the upstream closed the connection: {describe(e)}") from None
        if reply.encoding not in (None, "identity"):
            reply.abort()
            raise Failure("malformed", f"the upstream's answer is compressed ({reply.encoding}), though identity was "
                          "asked for")
        if reply.status >= 500 or reply.status in (401, 403, 429):
            raw = await _error_body(reply)
            reply.release()
            answer = raw if reply.status in ANSWERED_STATUSES and raw is not None and openai_error(raw) else None
            raise Failure("status", f"the upstream answered HTTP {reply.status}: {_error_text(reply, raw)}", reply.status,
                          retry=reply.status not in (401, 403), answer=answer)
        return reply


def describe(e: BaseException) -> str:
    """A client failure in one short line: its class and message, never the repr of a
    half-parsed head (aiohttp's ``ServerDisconnectedError`` carries one) nor a parser's
    multi-line message."""
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return f"{type(e).__name__}: it disconnected before a whole answer"
    message = e.message if isinstance(e, aiohttp.ClientResponseError) else str(e)
    return one_line(f"{type(e).__name__}: {message}")


def openai_error(raw: bytes) -> bool:
    """Whether ``raw`` is a well-formed OpenAI error body: a JSON object whose ``error``
    is an object with a non-empty string ``message``."""
    try:
        body = json.loads(raw)
    except ValueError:
        return False
    err = body.get("error") if isinstance(body, dict) else None
    return isinstance(err, dict) and isinstance(err.get("message"), str) and bool(err["message"].strip())


async def _error_body(reply: Reply) -> bytes | None:
    """An error answer's body (its first ``_ERROR_BODY_BYTES``), None if it broke off."""
    try:
        return await reply.read_error()
    except (aiohttp.ClientError, TimeoutError):
        return None


def _error_text(reply: Reply, raw: bytes | None) -> str:
    if raw is None:
        return reply.reason
    try:
        return error_message(json.loads(raw))
    except ValueError:
        return one_line(raw.decode("utf-8", "replace")) or reply.reason
