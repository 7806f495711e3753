"""One upstream answer relayed to the client as it arrives, and observed.

A stream is parsed with the project's SSE parser and response reader as it passes
(``inferlab.openai``): each event is written to the client as soon as the upstream's
read completes it, one write per read (so the upstream's chunking is kept and the
client's backpressure reaches the upstream: its reading pauses while the client's
buffer is full). A read of whole, plain events passes on as its bytes came; one the
gateway changes or that the parser had to piece together is written as its events,
re-encoded, after the read's comment lines (keep-alives, passed on so that a client's
idle timeout sees them). What passes is observed for metrics, the access log and the cache: arrival
times of content, usage, the finish reason. The usage chunk the gateway asked for on
the client's behalf (``stream_options.include_usage``) is dropped again if the client
did not ask for it; the simulated server's ``inferlab_timeline`` on it is kept, on a
chunk of its own (``choices`` empty, no ``usage``).

The relay runs inside the upstream connection's read callback where the upstream is on
the httptools client (``gateway.upstream``), in the request's task on aiohttp's; either
way it writes to the client's connection directly (``ClientStream``). A failure after
the client got its first byte ends the client's stream with an SSE error event and
``[DONE]``; so does a stream that ends without ``[DONE]`` before any finish reason. One
that ends without it after a finish reason (the answer is whole) gets ``[DONE]`` alone,
and its record says the upstream sent none (``stream_done`` False).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_writer import StreamWriter

from inferlab._clock import NS_PER_S, Clock
from inferlab.gateway.cache import (
    TIMELINE,
    Answer,
    Entry,
    answer_of_body,
    answer_of_stream,
    plain_event,
)
from inferlab.gateway.metrics import Bins
from inferlab.gateway.upstream import Failure, Reply
from inferlab.openai.errors import error_body
from inferlab.openai.response import (
    ABORTED,
    ABORTED_MESSAGE,
    ErrorInResponse,
    MalformedResponse,
    ResponseReader,
)
from inferlab.openai.sse import DONE_EVENT, SSEParser, encode_event, encode_json
from inferlab.results.records import ErrorKind, RequestRecord


@dataclass
class Observed:
    """What the gateway saw of one answer, for metrics, the access log and the cache.
    Times are ns on the gateway's clock."""

    record: RequestRecord
    t0_ns: int
    received_ns: int  # the client's request, received
    content_ns: list[int] = field(default_factory=list)  # absolute; the record's are relative
    entry: Entry | None = None  # the answer, ready to cache (complete and successful only)
    sent: bool = False  # an upstream was sent the request (its tokens may have been used)

    def finish(self, reader: ResponseReader, now_ns: int) -> None:
        r = self.record
        r.end_ns = now_ns - self.t0_ns
        r.output_chars = reader.output_chars
        r.finish_reason = reader.finish_reason
        if reader.usage_seen:
            r.input_tokens, r.output_tokens = reader.prompt_tokens, reader.completion_tokens
            r.usage_source = "server"
        if reader.cached_seen:
            r.cached_tokens = reader.cached_tokens
        if reader.finish_reason == ABORTED:  # (the engine gave up: a failure, as bench counts it; never cached)
            self.fail(ErrorKind.STREAM_ERROR, ABORTED_MESSAGE)

    def fail(self, kind: ErrorKind, message: str) -> None:
        if self.record.error_kind is None:
            self.record.error_kind = kind
            self.record.error = message[:300]


def error_event(status: int, message: str) -> bytes:
    """The SSE event that tells a client its stream failed, in OpenAI's error format."""
    return encode_json(error_body(status, message, "InternalServerError" if status >= 500 else "BadRequestError"))


class ClientStream:
    """The client's side of a relayed stream, once its response is prepared: each write
    goes straight to its connection's transport, framed as aiohttp's writer frames it
    (an HTTP/1.1 chunk; as it is for HTTP/1.0), so a read can be relayed from inside the
    upstream connection's callback (aiohttp's ``StreamResponse.write`` is an await, and
    three buffers per write). ``write`` returns False when the client's buffer is full
    (then ``drained`` waits until it has taken it); it raises ``ConnectionResetError``
    once the client has gone. The response is ended by aiohttp as ever
    (``write_eof``)."""

    def __init__(self, writer: AbstractStreamWriter | None) -> None:
        # (the server's writer: aiohttp's class, not compressing, headers sent at prepare)
        assert isinstance(writer, StreamWriter)
        self._writer = writer
        self._protocol = writer.protocol
        self._chunked = writer.chunked

    def write(self, data: bytes) -> bool:
        protocol = self._protocol
        transport = protocol.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client went away")
        transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)
        return not protocol.writing_paused

    async def drained(self) -> None:
        await self._writer.drain()


class StreamRelay:
    """Relays one upstream stream to the client (module docstring). ``drop_usage``: the
    client did not ask for the usage chunk; ``keep``: build a cache ``Entry``; ``itl``
    observes each gap between content chunks; once content chunks pass
    ``reserved_output``, ``grow`` is told their count (admission holds more room)."""

    def __init__(
        self, clock: Clock, observed: Observed, *, chat: bool, drop_usage: bool, keep: bool,
        itl: Bins | None = None, reserved_output: int | None = None, grow: Callable[[int], None] | None = None,
    ) -> None:
        self.clock = clock
        self.obs = observed
        self.chat = chat
        self.drop_usage = drop_usage
        self.keep = keep
        self.itl = itl
        # past ``reserved_output`` content arrivals, ``grow(arrivals)`` holds more room
        self.reserved_output = reserved_output if grow is not None else None
        self.grow = grow
        self.reader = ResponseReader([] if keep else None)
        self.parser = SSEParser(keep_comments=True)
        self.usage: dict[str, Any] = {}
        self.first: dict[str, Any] | None = None
        self.reads: list[tuple[tuple[str, bool], ...]] = []
        self.plain = True  # (kept: no event carried more than text)
        self.failed = False

    async def run(self, upstream: Reply, client: ClientStream) -> None:
        """Relay until the upstream's stream ends, fails, or the client goes away
        (``ConnectionResetError``, or the task's cancellation)."""
        obs, record = self.obs, self.obs.record
        write = client.write

        def on_read(data: bytes, now: int) -> bool:
            out = self.feed(data, now)
            return write(out) if out else True

        try:
            await upstream.relay(on_read, client.drained)
            out = self._events(self.parser.close(), self.clock.now_ns(), None)
            if not self.reader.done and not self.failed:
                if self.reader.finish_reason is None:
                    obs.fail(ErrorKind.DISCONNECT, "the upstream ended the stream without [DONE]")
                    out += error_event(502, "the upstream ended the stream early")
                out += DONE_EVENT
            if out:
                write(out)
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, TimeoutError) as e:
            kind = ErrorKind.TIMEOUT if isinstance(e, TimeoutError) else ErrorKind.DISCONNECT
            why = "timed out" if isinstance(e, TimeoutError) else f"failed: {type(e).__name__}"
            obs.fail(kind, f"the upstream stream {why}")
            write(error_event(504 if kind == ErrorKind.TIMEOUT else 502, f"the upstream stream {why}") + DONE_EVENT)
        obs.finish(self.reader, self.clock.now_ns())
        record.stream_done = self.reader.done
        if self.keep and self.reader.done and not self.failed and record.error_kind is None and self.first is not None:
            text = "".join(self.reader.text_out or [])
            answer: Answer = answer_of_stream(self.first, text, self.reader.finish_reason, self.usage, self.plain)
            obs.entry = Entry(self.chat, answer, reads=tuple(self.reads))

    def feed(self, data: bytes, now: int) -> bytes:
        """The bytes to write to the client for one read of the upstream's body, at
        ``now`` (ns on the gateway's clock)."""
        record = self.obs.record
        if record.ttfb_ns is None:
            record.ttfb_ns = now - self.obs.t0_ns
        parser = self.parser
        if not self.keep and self.reader.wire_template is not None and parser.idle:
            arrivals = self.reader.wire_event(data)  # (the stream's usual chunk: passed on)
            if arrivals is not None:
                if arrivals:
                    self._arrived(arrivals, now)
                return data
        events = parser.feed(data)
        comments = parser.comments
        if comments:  # (so the read is not plain: its events are written re-encoded)
            out = b"".join(c + b"\n" for c in comments) + b"\n"
            comments.clear()
            return out + self._events(events, now, None)
        return self._events(events, now, data if parser.plain else None) if events else b""

    def _arrived(self, arrivals: int, now: int) -> None:
        """``arrivals`` content chunks (choices) came at ``now``."""
        content = self.obs.content_ns
        if content and self.itl is not None:
            self.itl.observe((now - content[-1]) / NS_PER_S)
        content.extend([now] * arrivals)
        if self.reserved_output is not None and len(content) > self.reserved_output and self.grow:
            self.grow(len(content))

    def _events(self, events: list[str], now: int, raw: bytes | None) -> bytes:
        """The bytes to write for ``events`` (completed by one read at ``now``): ``raw``,
        the read's own bytes, if given and every event passes unchanged."""
        if not events:
            return b""
        kept = []
        changed = False
        group = []
        reader = self.reader
        for data in events:
            had_usage = reader.usage_seen
            try:
                arrivals = reader.event(data)
            except (ErrorInResponse, MalformedResponse) as e:  # relayed as it came
                self.failed = True
                self.obs.fail(ErrorKind.STREAM_ERROR if isinstance(e, ErrorInResponse) else ErrorKind.MALFORMED, str(e))
                arrivals = 0
            usage_only = False
            timeline = None  # the usage-only chunk's timeline, when that chunk is dropped
            if reader.usage_seen and not had_usage:
                obj = json.loads(data)
                self.usage = obj["usage"]
                if obj.get("choices"):
                    if self.drop_usage:  # usage riding on a chunk with content: strip it
                        del obj["usage"]
                        data = json.dumps(obj, separators=(",", ":"))
                        changed = True
                else:
                    usage_only = True
                    if self.drop_usage and TIMELINE in obj:  # (kept without the usage)
                        del obj["usage"]
                        timeline = json.dumps(obj, separators=(",", ":"))
            if arrivals:
                self._arrived(arrivals, now)
            if self.keep:
                if self.first is None and data != "[DONE]":
                    try:
                        first = json.loads(data)
                        self.first = first if isinstance(first, dict) else None
                    except ValueError:
                        pass
                if self.plain and not plain_event(data):
                    self.plain = False
                group.append((data, usage_only))
            if usage_only and self.drop_usage:
                changed = True
                if timeline is not None:
                    kept.append(timeline)
            else:
                kept.append(data)
        if self.keep and group:
            self.reads.append(tuple(group))
        if raw is not None and not changed:
            return raw
        return b"".join(map(encode_event, kept))


async def read_body(clock: Clock, observed: Observed, upstream: Reply, *, chat: bool, keep: bool) -> bytes:
    """A whole (non-streamed) answer, read and observed; ``Failure`` if the upstream
    fails while sending it, or answers a success that is not a JSON object (the client
    has had nothing yet: a 502, as for any malformed answer, not a 200 it cannot read).
    An error status's body is relayed as it came."""
    obs = observed
    try:
        raw = await upstream.read()
    except TimeoutError:
        raise Failure("timeout", "the upstream did not finish its answer in time") from None
    except aiohttp.ClientError as e:
        raise Failure("disconnect", f"the upstream failed while answering: {type(e).__name__}") from None
    now = clock.now_ns()
    reader = ResponseReader()
    try:
        reader.body(raw)
    except MalformedResponse as e:
        if upstream.status < 400:
            raise Failure("malformed", f"the upstream's HTTP {upstream.status} answer is malformed: {e}") from None
        obs.fail(ErrorKind.MALFORMED, str(e))
    except ErrorInResponse as e:
        obs.fail(ErrorKind.HTTP_STATUS, str(e))
    obs.record.ttfb_ns = now - obs.t0_ns
    obs.finish(reader, now)
    if keep and upstream.status == 200 and obs.record.error_kind is None:
        body = json.loads(raw)
        answer = answer_of_body(body, chat)
        if answer is not None:
            obs.entry = Entry(chat, answer, body=raw)
    return raw
