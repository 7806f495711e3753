"""The httptools client's connections (``client.httptools_http``) for a caller that reads
a response's body its own way: ``send`` gives the ``Response`` once its head came, and
the caller reads the body whole, its start only (an error's message), or read by read
as it arrives (``Response.relay``: each network read handed on inside the connection's
callback, with the clock's reading then; no task is woken and nothing is buffered per
read). The gateway relays its upstreams' streams this way (``gateway.upstream``).

Failures are aiohttp's exceptions, as the client's own (``HttptoolsClient``) raises
them, and a request a stale keep-alive connection failed before any answer is sent
again on a new connection, by the client's rule (``client.http.stale``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from inferlab.client.exchange import MAX_ERROR_BODY
from inferlab.client.http import stale
from inferlab.client.httptools_http import _BODY, _ERROR, _RELAY, Pool, _Connection

__all__ = ["Response", "send"]


async def send(
    pool: Pool, head: bytes, body: bytes, clock_ns: Callable[[], int], timeout_s: float, connect_timeout_s: float,
) -> Response:
    """Send a request (``head`` from ``Pool.post_head``, then ``body``) on an idle
    connection of ``pool`` or a new one; its ``Response`` once the head came, for the
    caller to read the body. ``timeout_s`` bounds the whole exchange, the body included
    (``TimeoutError``), ``connect_timeout_s`` the opening of a connection. A request a
    reused connection failed before any answer (a stale keep-alive connection,
    ``client.http.stale``) is sent again, once, on a new connection. Failures are
    aiohttp's exceptions, as for ``HttptoolsClient``: ``ConnectError``,
    ``ServerDisconnectedError``, ``ClientOSError``, ``InvalidResponse``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    data = b"%s%d\r\n\r\n%s" % (head, len(body), body)
    conn = pool.take()
    while True:
        reused = conn is not None
        if conn is None:
            async with asyncio.timeout_at(min(deadline, loop.time() + connect_timeout_s)):
                conn = await pool.connect()
        assert conn.transport is not None
        waiter = conn.start(None, None, False, clock_ns, 0)
        response = Response(pool, conn, loop.call_at(deadline, _expire, conn, timeout_s))
        try:
            conn.transport.write(data)
            await waiter
        except BaseException as e:
            response.abort()
            if not stale(e, reused, conn.status is not None):
                raise
            conn = None
            continue
        response.head()
        return response


def _expire(conn: _Connection, timeout_s: float) -> None:
    if not conn.complete:
        conn.fail(TimeoutError(f"the exchange took over {timeout_s:g} s"))


class Response:
    """A response ``send`` has the head of (``status``, ``reason``, ``media_type``,
    ``encoding``, or None for identity), whose body the caller reads: whole (``read``),
    up to ``MAX_ERROR_BODY`` (``read_error``), or read by read as it arrives, inside
    the connection's callback (``relay``: no task is woken per read). ``release`` ends
    it: the connection goes back to the pool if the body was read to its end, else it
    is closed, as by ``abort`` (a server sees its request abandoned)."""

    def __init__(self, pool: Pool, conn: _Connection, timer: asyncio.TimerHandle) -> None:
        self._pool = pool
        self._conn = conn
        self._timer = timer
        self._over = False
        self.status = 0
        self.reason = ""
        self.media_type = ""
        self.encoding: str | None = None

    def head(self) -> None:
        conn = self._conn
        assert conn.status is not None
        self.status, self.reason, self.media_type, self.encoding = conn.status, conn.reason, conn.media_type, conn.encoding

    @property
    def content_type(self) -> str:
        """The media type, or ``application/octet-stream`` when none is given (as aiohttp's)."""
        return self.media_type or "application/octet-stream"

    async def read(self) -> bytes:
        """The whole body."""
        conn = self._conn
        conn.mode = _BODY
        while not conn.complete:
            await conn.arm()
        return b"".join(conn.pieces)

    async def read_error(self) -> bytes:
        """The body's first ``MAX_ERROR_BODY`` bytes (an error's message); the rest is not read."""
        conn = self._conn
        conn.mode = _ERROR
        while not conn.complete and conn.received < MAX_ERROR_BODY:
            await conn.arm()
        return b"".join(conn.pieces)[:MAX_ERROR_BODY]

    async def relay(self, on_read: Callable[[bytes, int], bool], drained: Callable[[], Awaitable[None]]) -> None:
        """Hand each read of the body to ``on_read(data, t_ns)`` as it arrives (``t_ns``:
        the clock's reading then), until the body ends. ``on_read`` returning False
        pauses the reading until ``drained()`` returns (its consumer is full:
        backpressure). What ``on_read`` raises fails the exchange and is raised here, as
        are the connection's failures."""
        conn = self._conn
        held, conn.pieces = conn.pieces, []
        conn.on_read = on_read
        conn.mode = _RELAY
        if held and not on_read(b"".join(held), conn.clock_ns() - conn.t0_ns):  # (what came with the head)
            conn.hold()
        while not conn.complete:
            if conn.paused:
                await drained()
                conn.unhold()
            else:
                await conn.arm()
        if conn.error is not None:  # (``on_read`` failed on the read that ended the body)
            raise conn.error

    def release(self) -> None:
        if self._over:
            return
        self._over = True
        self._timer.cancel()
        conn = self._conn
        if conn.complete and conn.error is None:
            self._pool.give_back(conn)
        else:
            conn.abort()

    def abort(self) -> None:
        self._over = True
        self._timer.cancel()
        self._conn.abort()
