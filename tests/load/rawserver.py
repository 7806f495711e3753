"""A raw-socket OpenAI-compatible stub for the executor's connection tests: every
connection in a thread of its own, keep-alive, ``GET .../models`` answered with one
model and every ``POST`` with a short chat stream (two content chunks, ``[DONE]``).

``accept_every_s``: the listening socket has a backlog of 0 and its connections are
accepted one per that many seconds: a server slow to accept connections (the SYNs
beyond the one queued are dropped, and the client's kernel sends them again 1 s
later). ``answer_after_s``: each POST waits that long before its answer (requests
overlap). ``die_after``: once that many POSTs are answered, the listening socket and every
connection are closed: a server that died (new connections refused). Loopback only;
``close`` stops every thread.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from types import TracebackType
from typing import Self

_CHUNK = 'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":null}]}\n\n'
STREAM = (_CHUNK % "Hello" + _CHUNK % " world" + "data: [DONE]\n\n").encode()
MODELS = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()


class RawServer:
    def __init__(self, accept_every_s: float = 0.0, die_after: int | None = None, answer_after_s: float = 0.0) -> None:
        self.accept_every_s = accept_every_s
        self.answer_after_s = answer_after_s
        self.die_after = die_after
        self.answered = 0
        self.accepted = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(0 if accept_every_s else 128)
        self._sock.settimeout(0.05)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                self._conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)
            if self.accept_every_s:
                self._stop.wait(self.accept_every_s)

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            conn.settimeout(0.2)
        except OSError:  # (``kill`` closed it before this thread began)
            return
        while not self._stop.is_set():
            while b"\r\n\r\n" not in buf:
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    if self._stop.is_set():
                        return
                    continue
                except OSError:
                    return
                if not data:
                    return
                buf += data
            head, _, buf = buf.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(buf) < length:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buf += data
            buf = buf[length:]
            post = head.startswith(b"POST")
            if post and self.answer_after_s and self._stop.wait(self.answer_after_s):
                return
            body, kind = (STREAM, b"text/event-stream") if post else (MODELS, b"application/json")
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (kind, len(body), body))
            except OSError:
                return
            if post:
                with self._lock:
                    self.answered += 1
                    dead = self.die_after is not None and self.answered >= self.die_after
                if dead:
                    self.kill()
                    return

    def kill(self) -> None:
        """Close the listening socket and every connection: new ones are refused."""
        self._stop.set()
        self._sock.close()
        with self._lock:
            for c in self._conns:
                with contextlib.suppress(OSError):
                    c.shutdown(socket.SHUT_RDWR)
                c.close()

    def close(self) -> None:
        self.kill()
        deadline = time.monotonic() + 5
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
