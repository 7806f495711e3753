"""What every HTTP stack of the client shares, with no HTTP stack of its own: where to send
(``Endpoint``), what to send (``request_body``), and how one response's bytes fill a
``RequestRecord`` (``StreamRecorder`` for a stream, ``record_body`` for a whole body,
``record_http_error`` for an error status, ``fail``).

The asyncio clients (``client.http``, aiohttp; ``client.httptools_http``) and the gevent
one (``client.gevent_http``, Locust's workers) read the network their own way and hand
each read's bytes here with one clock reading, so all fill the same fields with the same
meanings. ``request_path`` and ``header_lines`` write a request's head for the clients
that write their own.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from inferlab.openai.errors import error_message, one_line
from inferlab.openai.request import PATHS, Api, completion_request
from inferlab.openai.response import (
    ABORTED,
    ABORTED_MESSAGE,
    ErrorInResponse,
    MalformedResponse,
    ResponseError,
    ResponseReader,
)
from inferlab.openai.sse import SSEParser
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.workload.spec import RequestSpec

#: How much of a record's error message is kept (characters).
MAX_ERROR_CHARS = 300
#: How much of an error response's body is read for its message (bytes).
MAX_ERROR_BODY = 65536


#: Response headers by which a cache in front of the engine says it answered a request
#: (lower case): ``inferlab gateway``'s own, the generic ``X-Cache`` of HTTP caches and
#: CDNs, Cloudflare's, Helicone's and Portkey's.
CACHE_HEADERS = frozenset({"x-inferlab-cache", "x-cache", "cf-cache-status", "helicone-cache", "x-portkey-cache-status"})
#: An entry's first word (lower case; after Portkey's "semantic") that says a cache
#: answered: a hit (``hit``, ``hit-...``, CloudFront's ``RefreshHit``, Squid's
#: ``TCP_HIT``), or Cloudflare's statuses served from its cache (``stale``, ``updating``,
#: ``revalidated``; ``miss``, ``expired``, ``bypass``, ``dynamic`` are not).
_SERVED = ("hit", "refreshhit", "tcp_hit", "stale", "updating", "revalidated")


def cache_hit(value: str) -> bool:
    """Whether a ``CACHE_HEADERS`` value says the answer came from a cache. A list (Fastly
    with shielding: one entry per cache passed, "MISS, HIT") is a hit if any entry is:
    per Fastly's X-Cache reference, any entry but MISS means the request was answered
    from a cache, not sent to the origin."""
    for entry in value.lower().split(","):
        words = entry.split()
        if words and words[0] == "semantic":  # (Portkey: SEMANTIC HIT, SEMANTIC MISS)
            words = words[1:]
        if words and (words[0] in _SERVED or words[0].startswith("hit-")):
            return True
    return False


def note_cache_header(record: RequestRecord, name: str, value: str) -> None:
    """Set ``record.response_cache_hit`` from one response header, if it is a cache's
    (``CACHE_HEADERS``; a hit from any of them stands)."""
    if name.lower() in CACHE_HEADERS:
        record.response_cache_hit = bool(record.response_cache_hit) or cache_hit(value)


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
        return {"Content-Type": "application/json", **auth_headers(self.headers, self.api_key)}


def auth_headers(headers: Mapping[str, str], api_key: str | None) -> dict[str, str]:
    """What every request to a server carries beyond its body's type: the ``--header``s,
    and ``--api-key`` as a bearer token. ``ValueError`` if both name the Authorization
    header (one would be dropped)."""
    h = dict(headers)
    if api_key:
        if any(name.lower() == "authorization" for name in h):
            raise ValueError("--api-key and --header Authorization both set the Authorization header: give one")
        h["Authorization"] = f"Bearer {api_key}"
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


def fail(record: RequestRecord, kind: ErrorKind, message: str) -> None:
    """Mark ``record`` failed with ``kind`` (the first failure wins) and no end. A record
    that had ended cleanly already (a timeout while draining after ``[DONE]``) stays as
    it was."""
    if record.error_kind is None and record.end_ns is not None:
        return
    if record.error_kind is None:
        record.error_kind = kind
        record.error = message[:MAX_ERROR_CHARS]
    record.end_ns = None


def record_http_error(record: RequestRecord, status: int, raw: bytes, reason: str) -> None:
    """Fail ``record`` for an error ``status``: the message from the body ``raw`` (OpenAI's
    error object, or the body as one line, or the status's ``reason``)."""
    try:
        message = error_message(json.loads(raw))
    except ValueError:
        message = one_line(raw.decode("utf-8", "replace")) or reason
    fail(record, ErrorKind.HTTP_STATUS, f"HTTP {status}: {message}")




class StreamState:
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
            if rd.finish_reason == ABORTED:
                fail(r, ErrorKind.STREAM_ERROR, ABORTED_MESSAGE)
        if rd.usage_seen:
            r.input_tokens = rd.prompt_tokens
            r.output_tokens = rd.completion_tokens
            r.usage_source = "server"
        if rd.cached_seen:
            # (a response cache's answer replays another request's usage: no prompt token
            # of this one came from the engine's prefix cache)
            r.cached_tokens = 0 if r.response_cache_hit else rd.cached_tokens
        if rd.timeline is not None and not r.response_cache_hit:  # (a cache's is another request's)
            r.server_timeline = rd.timeline

    def _fail(self, e: ResponseError) -> bool:
        """Fail the record for what the reader refused; False (stop reading)."""
        self.record.error_kind = _ERROR_KINDS[type(e)]
        self.record.error = str(e)[:MAX_ERROR_CHARS]
        return False


#: How a response the reader refuses is recorded.
_ERROR_KINDS: dict[type[ResponseError], ErrorKind] = {
    MalformedResponse: ErrorKind.MALFORMED,
    ErrorInResponse: ErrorKind.STREAM_ERROR,
}


class StreamRecorder:
    """A streamed (SSE) response body into its record, one network read at a time.

    The caller reads the body and calls ``read(data, t_ns)`` with each read's bytes and
    the one clock reading taken when it returned: the first sets ``ttfb_ns``, every
    event carrying content appends ``t_ns`` to ``content_ns``, the last read's time is
    the end. ``read`` returning False means stop reading (``[DONE]``, or an event that
    failed the record). When the body ends while still ``reading``, ``eof(t_ns)``
    dispatches an event left without its blank line. ``flush`` (always, also after a
    failure or a cancellation) copies what the response said; ``finish`` (only when
    the body was read to its end without an error of the connection) sets
    ``stream_done`` and ``end_ns``."""

    def __init__(self, record: RequestRecord, text_out: list[str] | None = None) -> None:
        self.record = record
        self._parser = SSEParser()
        self._state = StreamState(record, text_out)
        self._reader = self._state.reader
        self.reading = True
        self._t_end = 0

    @property
    def done(self) -> bool:
        """The stream ended with ``[DONE]``."""
        return self._state.done

    def read(self, data: bytes, t_ns: int) -> bool:
        # The per-read hot path: ``StreamState.event`` inlined (bench/client_cpu.py).
        self._t_end = t_ns
        record = self.record
        if record.ttfb_ns is None:
            record.ttfb_ns = t_ns
        reader = self._reader
        if reader.wire_template is not None and self._parser.idle:
            arrivals = reader.wire_event(data)  # (the stream's usual chunk: most reads)
            if arrivals is not None:
                if arrivals:
                    record.content_ns.append(t_ns)
                return True
        for event in self._parser.feed(data):
            try:
                arrivals = reader.event(event)
            except ResponseError as e:
                self.reading = False
                return self._state._fail(e)
            if arrivals:
                record.content_ns.append(t_ns)
                if arrivals > 1:  # several choices (a request with n > 1) in one chunk
                    record.content_ns.extend(itertools.repeat(t_ns, arrivals - 1))
            if reader.done:
                self.reading = False
                return False
        return True

    def eof(self, t_ns: int) -> None:
        """The body ended at ``t_ns`` before anything stopped the reading."""
        self._t_end = t_ns
        for event in self._parser.close():
            if not self._state.event(event, t_ns):
                break

    def flush(self) -> None:
        self._state.flush()

    def finish(self) -> None:
        record = self.record
        record.stream_done = self._state.done
        if record.error_kind is None:
            record.end_ns = self._t_end


def record_body(record: RequestRecord, raw: bytes, t_end_ns: int, text_out: list[str] | None = None) -> None:
    """A whole (non-streamed) response body ``raw``, ended at ``t_end_ns``, into
    ``record`` (``ttfb_ns`` is the caller's: its first read of the body)."""
    state = StreamState(record, text_out)
    if state.body(raw):
        state.flush()
        if record.error_kind is None:  # (an aborted answer failed it)
            record.end_ns = t_end_ns


#: The HTTP stacks a client can send with (``bench --http-client``, the gateway's
#: ``http_client``). ``auto``: httptools
#: where it is installed (the ``fast`` extra) and the URL is plain http, else aiohttp.
HTTP_CLIENTS = ("auto", "aiohttp", "httptools")


def resolve_http_client(choice: str, url: str) -> str:
    """The HTTP stack ``choice`` means for ``url``: ``aiohttp`` or ``httptools``;
    ``ValueError`` for one that cannot send there."""
    if choice not in HTTP_CLIENTS:
        raise ValueError(f"unknown HTTP client {choice!r} (known: {', '.join(HTTP_CLIENTS)})")
    if choice == "aiohttp":
        return choice
    installed = importlib.util.find_spec("httptools") is not None
    plain = url.lower().startswith("http://")
    if choice == "httptools":
        if not installed:
            raise ValueError("--http-client httptools: httptools is not installed (pip install 'inferlab[fast]')")
        if not plain:
            raise ValueError(f"--http-client httptools speaks plain http:// only, not {url} (use aiohttp)")
        return choice
    return "httptools" if installed and plain else "aiohttp"


def request_path(url: str) -> str:
    """The path (and query) of ``url``, as a request line names it."""
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def header_lines(headers: dict[str, str]) -> str:
    """``Name: value\\r\\n`` per header; ``ValueError`` for a line break in one (it would
    end the header early, or smuggle another)."""
    out = []
    for name, value in headers.items():
        if any(c in name + value for c in "\r\n\0") or not name or ":" in name:
            raise ValueError(f"header {name!r} cannot be sent as given")
        out.append(f"{name}: {value}\r\n")
    return "".join(out)
