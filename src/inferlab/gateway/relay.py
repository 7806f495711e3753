"""One request sent to one upstream, its answer relayed to the client as it arrives.

A stream is parsed with the project's SSE parser and response reader as it passes
(``inferlab.openai``): each event is written to the client as soon as the upstream's
read completes it, one write per read (so the upstream's chunking is kept and the
client's backpressure reaches the upstream: a write waits until the client takes it).
What passes is observed for metrics, the access log and the cache: arrival times of
content, usage, the finish reason. The usage chunk the gateway asked for on the
client's behalf (``stream_options.include_usage``) is dropped again if the client did
not ask for it.

``Failure`` is raised for an upstream that failed before the client got a byte (the
caller may try another upstream); after that, a failure ends the client's stream with
an SSE error event and ``[DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from inferlab._clock import NS_PER_S, Clock
from inferlab.gateway.cache import Answer, Entry, answer_of_body, answer_of_stream
from inferlab.openai.errors import error_body, error_message, one_line
from inferlab.openai.response import ErrorInResponse, MalformedResponse, ResponseReader
from inferlab.openai.sse import DONE_EVENT, SSEParser, encode_event, encode_json
from inferlab.results.records import ErrorKind, RequestRecord

#: Most bytes of an upstream's error body read to quote it.
_ERROR_BODY_BYTES = 65536


class Failure(Exception):
    """The upstream failed before the client got anything: ``kind`` (``connect``,
    ``status``, ``timeout``, ``disconnect``), a one-line message, the upstream's status
    if it answered, and whether another upstream may do better (``retry``)."""

    def __init__(self, kind: str, message: str, status: int | None = None, retry: bool = True) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.retry = retry


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

    def fail(self, kind: ErrorKind, message: str) -> None:
        if self.record.error_kind is None:
            self.record.error_kind = kind
            self.record.error = message[:300]


def error_event(status: int, message: str) -> bytes:
    """The SSE event that tells a client its stream failed, in OpenAI's error format."""
    return encode_json(error_body(status, message, "InternalServerError" if status >= 500 else "BadRequestError"))


async def send(
    session: aiohttp.ClientSession, url: str, payload: bytes, headers: dict[str, str], timeout_s: float,
) -> aiohttp.ClientResponse:
    """POST ``payload`` to the upstream; the response once its status and headers came.
    ``Failure`` if it cannot be reached, or answers with a status another upstream
    might not (429, 5xx; also 401/403: the gateway's own key was refused)."""
    try:
        resp = await session.post(url, data=payload, headers=headers,
                                  timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=10))
    except aiohttp.ClientConnectorError as e:
        raise Failure("connect", f"cannot connect to the upstream: {e.os_error}") from None
    except TimeoutError:
        raise Failure("timeout", f"the upstream did not answer within {timeout_s:g} s") from None
    except aiohttp.ClientError as e:
        raise Failure("disconnect", f"the upstream closed the connection: {type(e).__name__}: {e}") from None
    if resp.status >= 500 or resp.status in (401, 403, 429):
        message = await _error_text(resp)
        resp.release()
        raise Failure("status", f"the upstream answered HTTP {resp.status}: {message}", resp.status,
                      retry=resp.status not in (401, 403))
    return resp


async def _error_text(resp: aiohttp.ClientResponse) -> str:
    try:
        raw = await resp.content.read(_ERROR_BODY_BYTES)
    except (aiohttp.ClientError, TimeoutError):
        return resp.reason or ""
    try:
        return error_message(json.loads(raw))
    except ValueError:
        return one_line(raw.decode("utf-8", "replace")) or (resp.reason or "")


class StreamRelay:
    """Relays one upstream stream to the client (module docstring). ``drop_usage``: the
    client did not ask for the usage chunk; ``keep``: build a cache ``Entry``; ``itl``
    observes each gap between content chunks; once content chunks pass
    ``reserved_output``, ``grow`` is told their count (admission holds more room)."""

    def __init__(
        self, clock: Clock, observed: Observed, *, chat: bool, drop_usage: bool, keep: bool,
        itl: Any = None, reserved_output: int | None = None, grow: Callable[[int], None] | None = None,
    ) -> None:
        self.clock = clock
        self.obs = observed
        self.chat = chat
        self.drop_usage = drop_usage
        self.keep = keep
        self.itl = itl  # a histogram child (``observe(seconds)``), or None
        # past ``reserved_output`` content arrivals, ``grow(arrivals)`` holds more room
        self.reserved_output = reserved_output if grow is not None else None
        self.grow = grow
        self.reader = ResponseReader([] if keep else None)
        self.parser = SSEParser()
        self.usage: dict[str, Any] = {}
        self.first: dict[str, Any] | None = None
        self.reads: list[tuple[tuple[str, bool], ...]] = []
        self.failed = False

    async def run(self, upstream: aiohttp.ClientResponse, client: web.StreamResponse) -> None:
        """Relay until the upstream's stream ends, fails, or the client goes away."""
        obs, record = self.obs, self.obs.record
        try:
            async for data in upstream.content.iter_any():
                now = self.clock.now_ns()
                if record.ttfb_ns is None:
                    record.ttfb_ns = now - obs.t0_ns
                out = self._events(self.parser.feed(data), now)
                if out:
                    await client.write(out)
            out = self._events(self.parser.close(), self.clock.now_ns())
            if out:
                await client.write(out)
            if not self.reader.done and not self.failed:
                obs.fail(ErrorKind.DISCONNECT, "the upstream ended the stream without [DONE]")
                await client.write(error_event(502, "the upstream ended the stream early"))
                await client.write(DONE_EVENT)
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, TimeoutError) as e:
            kind = ErrorKind.TIMEOUT if isinstance(e, TimeoutError) else ErrorKind.DISCONNECT
            why = "timed out" if isinstance(e, TimeoutError) else f"failed: {type(e).__name__}"
            obs.fail(kind, f"the upstream stream {why}")
            await client.write(error_event(502, f"the upstream stream {why}") + DONE_EVENT)
        obs.finish(self.reader, self.clock.now_ns())
        record.stream_done = self.reader.done
        if self.keep and self.reader.done and not self.failed and record.error_kind is None and self.first is not None:
            text = "".join(self.reader.text_out or [])
            answer: Answer = answer_of_stream(self.first, text, self.reader.finish_reason, self.usage)
            obs.entry = Entry(self.chat, answer, reads=tuple(self.reads))

    def _events(self, events: list[str], now: int) -> bytes:
        """The bytes to write for ``events`` (completed by one read at ``now``)."""
        if not events:
            return b""
        out = []
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
            if reader.usage_seen and not had_usage:
                obj = json.loads(data)
                self.usage = obj["usage"]
                if obj.get("choices"):
                    if self.drop_usage:  # usage riding on a chunk with content: strip it
                        del obj["usage"]
                        data = json.dumps(obj, separators=(",", ":"))
                else:
                    usage_only = True
            if arrivals:
                content = self.obs.content_ns
                if content and self.itl is not None:
                    self.itl.observe((now - content[-1]) / NS_PER_S)
                content.extend([now] * arrivals)
                if self.reserved_output is not None and len(content) > self.reserved_output and self.grow:
                    self.grow(len(content))
            if self.keep:
                if self.first is None and data != "[DONE]":
                    try:
                        first = json.loads(data)
                        self.first = first if isinstance(first, dict) else None
                    except ValueError:
                        pass
                group.append((data, usage_only))
            if not (usage_only and self.drop_usage):
                out.append(encode_event(data))
        if self.keep and group:
            self.reads.append(tuple(group))
        return b"".join(out)


async def read_body(
    clock: Clock, observed: Observed, upstream: aiohttp.ClientResponse, *, chat: bool, keep: bool,
) -> bytes:
    """A whole (non-streamed) answer, read and observed; ``Failure`` if the upstream
    fails while sending it (the client has had nothing yet)."""
    obs = observed
    try:
        raw = await upstream.read()
    except (aiohttp.ClientError, TimeoutError) as e:
        raise Failure("disconnect", f"the upstream failed while answering: {type(e).__name__}") from None
    now = clock.now_ns()
    obs.record.ttfb_ns = now - obs.t0_ns
    reader = ResponseReader()
    try:
        reader.body(raw)
    except (ErrorInResponse, MalformedResponse) as e:
        obs.fail(ErrorKind.MALFORMED if isinstance(e, MalformedResponse) else ErrorKind.HTTP_STATUS, str(e))
    obs.finish(reader, now)
    if keep and upstream.status == 200 and obs.record.error_kind is None:
        body = json.loads(raw)
        answer = answer_of_body(body, chat)
        if answer is not None:
            obs.entry = Entry(chat, answer, body=raw)
    return raw
