"""A fast mock OpenAI server for client benchmarks, and a client that parses nothing.

The server (raw asyncio protocols, on uvloop where installed; HTTP/1.1 keep-alive, chunked transfer encoding) streams vLLM's
chat chunks with no simulated delay: ``max_tokens`` content chunks per request, then a
finish chunk, a usage chunk and ``[DONE]``. Like an engine with no step time, each step
writes one content chunk to every stream whose socket can take it (one write each) and
yields. It stamps each generation request's arrival and counts chunks per 0.1 s of the
monotonic clock (``GET /mock/stats``; ``GET /mock/reset`` clears both). Loopback only.

    python bench/mock_server.py serve [--port 0] [--batch 1]   # prints its port
    python bench/mock_server.py drain --url URL [--conns 32 --chunks 2048 --seconds 5]

``bench/client_scale.py`` runs both in their own processes.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import signal
import sys
import time
from typing import Any

MODEL = "inferlab/mock-8b"


def _event(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(", ", ": "))
    return f"data: {data}\n\n".encode()


def _frame(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk (chunked transfer encoding)."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _chat_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    """A chat chunk as vLLM sends it (same keys, typical sizes)."""
    return {
        "id": "chatcmpl-0f3c8a4e5b2d4c7e9a1b6d2f8e0c4a17",
        "object": "chat.completion.chunk",
        "created": 1733000000,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


WORD = " lighthouse"
END = b"0\r\n\r\n"
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
HEAD = _frame(_event(_chat_chunk({"role": "assistant", "content": ""})))
BODY = _frame(_event(_chat_chunk({"content": WORD})))


def _usage(chunks: int, prompt: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": chunks, "total_tokens": prompt + chunks}


def _tail(chunks: int, prompt: int) -> bytes:
    final = {**_chat_chunk({}), "choices": [], "usage": _usage(chunks, prompt)}
    return _frame(_event(_chat_chunk({}, "length")) + _event(final) + _event("[DONE]")) + END


def _whole(chunks: int, prompt: int) -> bytes:
    """A non-streamed answer."""
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": WORD * chunks},
        "finish_reason": "length",
    }
    obj = {"id": "chatcmpl-0", "object": "chat.completion", "created": 1733000000}
    return json.dumps(
        {**obj, "model": MODEL, "choices": [choice], "usage": _usage(chunks, prompt)}
    ).encode()


class _Stream:
    __slots__ = ("conn", "left", "tail")

    def __init__(self, conn: _Conn, left: int, tail: bytes) -> None:
        self.conn, self.left, self.tail = conn, left, tail


class _Pump:
    """The 'engine' with no step time: each step writes one content chunk to every
    stream whose socket can take it (``batch`` of them in one write, as a server that
    streams several tokens at a time), finishes the streams that are done, and yields."""

    def __init__(self, batch: int = 1) -> None:
        self.batch = batch
        self.active: list[_Stream] = []
        self.incoming: list[_Stream] = []
        self.wake = asyncio.Event()
        self.reset()

    def reset(self) -> None:
        self.chunks = 0
        self.arrivals_ns: list[int] = []  # each generation request, as it arrived
        self.buckets: dict[int, int] = {}  # 0.1 s of the monotonic clock -> chunks written

    def add(self, stream: _Stream) -> None:
        self.incoming.append(stream)
        self.wake.set()

    async def run(self) -> None:
        while True:
            if self.incoming:
                self.active += self.incoming
                self.incoming = []
            written = 0
            keep = []
            for s in self.active:
                conn = s.conn
                if conn.closed:
                    continue
                if conn.paused:
                    keep.append(s)
                elif s.left:
                    k = min(s.left, self.batch)
                    conn.transport.write(BODY if k == 1 else BODY * k)
                    s.left -= k
                    written += k
                    keep.append(s)
                else:
                    conn.transport.write(s.tail)
                    conn.finished()
            self.active = keep
            if written:
                self.chunks += written
                b = time.monotonic_ns() // 100_000_000
                self.buckets[b] = self.buckets.get(b, 0) + written
                await asyncio.sleep(0)
            elif not self.incoming:
                self.wake.clear()
                await self.wake.wait()

    def stats(self) -> dict[str, Any]:
        return {
            "chunks": self.chunks,
            "arrivals_ns": self.arrivals_ns,
            "buckets": sorted(self.buckets.items()),
        }


class _Conn(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection: reads a request, answers, reads the next."""

    def __init__(self, pump: _Pump) -> None:
        self.pump = pump
        self.buf = b""
        self.busy = self.paused = self.closed = self.close_after = False
        self.transport: asyncio.Transport = None  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (uvloop's is no asyncio.Transport subclass)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pump.wake.set()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.pump.wake.set()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._next()

    def finished(self) -> None:
        """The response in progress is written."""
        self.busy = False
        if self.close_after:
            self.transport.close()
        elif self.buf:
            self._next()

    def _next(self) -> None:
        while not self.busy and not self.closed:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            method, target, version = [*head[0].split(" "), "", "", ""][:3]
            headers = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0") or 0)
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            conn = headers.get("connection", "").lower()
            self.close_after = conn == "close" or (version == "HTTP/1.0" and conn != "keep-alive")
            if "chunked" in headers.get("transfer-encoding", "").lower():
                self.close_after = True  # (no tool here sends a chunked body)
                self._send(411, b'{"error": {"message": "length required"}}')
                return
            self._route(method, target.split("?", 1)[0], body)

    def _send(self, status: int, body: bytes) -> None:
        head = (
            f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        )
        if self.close_after:
            head += "Connection: close\r\n"
        self.transport.write(head.encode() + b"\r\n" + body)
        if self.close_after:
            self.transport.close()

    def _route(self, method: str, path: str, body: bytes) -> None:
        if path.endswith("/chat/completions") and method == "POST":
            self._generate(body)
        elif path.endswith("/models"):
            model = {"id": MODEL, "object": "model", "created": 1733000000, "owned_by": "mock"}
            self._send(200, json.dumps({"object": "list", "data": [model]}).encode())
        elif path in ("/health", "/ping", "/v1/health"):
            self._send(200, b"{}")
        elif path == "/mock/stats":
            self._send(200, json.dumps(self.pump.stats()).encode())
        elif path == "/mock/reset":
            self.pump.reset()
            self._send(200, b"{}")
        else:
            self._send(404, b'{"error": {"message": "not found", "type": "NotFoundError"}}')

    def _generate(self, body: bytes) -> None:
        self.pump.arrivals_ns.append(time.monotonic_ns())
        try:
            req = json.loads(body)
            chunks = max(1, int(req.get("max_completion_tokens") or req.get("max_tokens") or 16))
        except (ValueError, TypeError, AttributeError):
            self._send(400, b'{"error": {"message": "bad request", "type": "BadRequestError"}}')
            return
        prompt = 8 + body.count(b" ")  # about one token a word: grows with the prompt
        if not req.get("stream"):
            self._send(200, _whole(chunks, prompt))
            return
        self.busy = True
        self.transport.write(STREAM_HEAD + HEAD)
        self.pump.add(_Stream(self, chunks, _tail(chunks, prompt)))


def serve(port: int, batch: int = 1) -> None:
    """Run the mock server (prints its port on stdout); ``batch`` content chunks to a
    stream per write."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the orchestrator stops it with SIGTERM)

    async def main() -> None:
        pump = _Pump(batch)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _Conn(pump), "127.0.0.1", port, backlog=4096, reuse_address=True
        )
        print(server.sockets[0].getsockname()[1], flush=True)
        await pump.run()

    try:  # (uvloop where installed: a higher ceiling, so that the client sets the pace)
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())


def drain(url: str, conns: int, chunks: int, seconds: float) -> None:
    """A client that parses nothing: keeps ``conns`` streams busy for ``seconds``,
    searching each read only for the response's end."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": chunks,
         "stream": True}
    ).encode()  # fmt: skip
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body

    class Drain(asyncio.Protocol):
        def __init__(self, deadline: float, finished: asyncio.Future[None]) -> None:
            self.deadline, self.finished, self.tail = deadline, finished, b""

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            self.transport = transport
            transport.write(request)

        def data_received(self, data: bytes) -> None:
            self.tail = (self.tail + data[-len(END) :])[-len(END) :]
            if self.tail == END:
                self.tail = b""
                if time.monotonic() < self.deadline:
                    self.transport.write(request)
                else:
                    self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            if not self.finished.done():
                self.finished.set_result(None)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + seconds
        waits = []
        for _ in range(conns):
            fut: asyncio.Future[None] = loop.create_future()
            await loop.create_connection(functools.partial(Drain, deadline, fut), host, int(port))
            waits.append(fut)
        async with asyncio.timeout(seconds + 30):
            await asyncio.gather(*waits)

    asyncio.run(main())


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve", help="run the mock server")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--batch", type=_positive, default=1,
                   help="content chunks a stream gets per write (each its own HTTP chunk)")  # fmt: skip
    d = sub.add_parser("drain", help="keep streams busy, parsing nothing")
    d.add_argument("--url", required=True)
    d.add_argument("--conns", type=int, default=32)
    d.add_argument("--chunks", type=int, default=2048)
    d.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args(argv)
    if args.mode == "serve":
        serve(args.port, args.batch)
    else:
        drain(args.url, args.conns, args.chunks, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
