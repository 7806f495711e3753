"""The raw per-request record: timestamps as measured, nothing derived.

All times are integer nanoseconds on the run's clock, relative to the run's start
(``t0``), so a record is meaningful on its own and JSON stays compact. Metrics are pure
functions of these records (``inferlab.results.metrics``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any


class ErrorKind(enum.StrEnum):
    """Why a request failed. A failure is data, never an exception that stops the run."""

    HTTP_STATUS = "http_status"  # non-2xx response; ``status`` and ``error`` say which
    CONNECT = "connect"  # could not open a connection
    TIMEOUT = "timeout"  # the whole request took longer than the total timeout
    IDLE_TIMEOUT = "idle_timeout"  # no bytes for longer than the idle timeout mid-response
    DISCONNECT = "disconnect"  # the server closed the connection mid-stream
    MALFORMED = "malformed"  # a stream event or body that is not the expected JSON
    STREAM_ERROR = "stream_error"  # an error object inside the response, or an answer ended finish_reason "abort"
    CANCELLED = "cancelled"  # the run was interrupted while this request was in flight


@dataclass
class RequestRecord:
    """One request as the client saw it.

    ``send_ns`` is when the client started the request, before it took a connection
    (so a new connection's set-up is in TTFT and E2E, what a user waits, as vLLM's
    ``bench serve`` counts it); ``connect_wait_ns`` how long of that it then waited for
    new connections to the server (DNS, TCP and TLS set-up: the server's or the
    network's time, not the client's; 0 on a pooled keep-alive connection); ``ttfb_ns``
    the first byte of the response body; ``content_ns`` one entry per chunk that carried
    generated content; ``end_ns`` the last byte. ``None`` means the event never happened
    (``connect_wait_ns``: not measured, as in records written before it was, whose
    ``send_ns`` was stamped once a connection was had).
    """

    index: int
    warmup: bool = False
    intended_send_ns: int | None = None
    send_ns: int | None = None
    ttfb_ns: int | None = None
    content_ns: list[int] = field(default_factory=list)
    end_ns: int | None = None
    status: int | None = None
    error_kind: ErrorKind | None = None
    error: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    usage_source: str = "none"  # "server": the server's usage; "engine": sim run's own counts
    output_chars: int = 0
    requested_input_tokens: int | None = None
    requested_output_tokens: int | None = None
    finish_reason: str | None = None
    stream_done: bool | None = None  # the stream ended with ``data: [DONE]``
    server_timeline: dict[str, Any] | None = None  # the sim's own view of this request
    # a cache in front of the engine answered it (its response header said so: see
    # ``client.exchange.CACHE_HEADERS``); None: no such header came
    response_cache_hit: bool | None = None
    session: int | None = None  # multi-turn workloads: which session, and which turn (from 0)
    turn: int | None = None
    # what a replay needs to send the run again as it ran: the closed-loop user that sent
    # it, and the workload's prefix group (prompts of a group share their first
    # ``prefix_tokens`` tokens; None: the whole prompt)
    user: int | None = None
    prefix_group: str | None = None
    prefix_tokens: int | None = None
    # the client key's name (``inferlab gateway``'s access log, where keys are configured);
    # None: no key, or a record written before there was this field
    key: str | None = None
    # a Mooncake trace row's block ids (512 tokens each; requests with equal leading ids
    # share those blocks' text), so that a replay of the run shares them again; None: none
    hash_ids: list[int] | None = None
    # (a duration, ns; at the end: older records lack it, and it is no time since t0)
    connect_wait_ns: int | None = None

    @property
    def ok(self) -> bool:
        return self.error_kind is None and self.end_ns is not None

    def to_json(self) -> dict[str, Any]:
        # Shallow on purpose: ``asdict`` deep-copies every token time, which cost more
        # than the whole simulation when ``sim run`` writes 10,000 records.
        d = {name: getattr(self, name) for name in _FIELDS}
        d["content_ns"] = list(self.content_ns)
        d["error_kind"] = self.error_kind.value if self.error_kind else None
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RequestRecord:
        """Read back ``to_json``'s form; keys it does not write are ignored. ``TypeError``
        naming the field for one whose value is not of its type (a string where a time
        goes would be subtracted later), ``ValueError`` for an unknown error kind."""
        if not isinstance(d, dict):
            raise TypeError(f"a JSON {type(d).__name__}, not an object")
        for name, value in d.items():
            allowed = _FIELD_TYPES.get(name)
            if allowed is not None and not isinstance(value, allowed):
                raise TypeError(f"{name} is {value!r:.40}")
        if not {type(t) for t in d.get("content_ns") or ()} <= {int}:
            raise TypeError("content_ns holds what is not a time in ns")
        if not {type(h) for h in d.get("hash_ids") or ()} <= {int}:
            raise TypeError("hash_ids holds what is not a block id")
        missing = [k for k in _REQUIRED if k not in d]
        d = dict(d)
        kind = d.get("error_kind")
        d["error_kind"] = ErrorKind(kind) if kind else None
        if missing:  # (``{"index": 1}`` alone is no record: it would read as a failure)
            raise TypeError(f"no {', '.join(missing)}")
        return cls(**{k: v for k, v in d.items() if k in _FIELD_TYPES})


_FIELDS = tuple(f.name for f in fields(RequestRecord))
#: The keys every record has had since the first release wrote them (a record of an
#: older run may lack a later field, never these).
_REQUIRED = ("index", "send_ns", "content_ns", "end_ns", "error_kind")


def _json_types(annotation: str) -> tuple[type, ...]:
    """The JSON types a field's annotation allows (``int | None``: int and None; an
    ``ErrorKind`` is its string)."""
    known = {"int": int, "str": str, "bool": bool, "list": list, "dict": dict, "ErrorKind": str, "None": type(None)}
    return tuple(known[part.split("[")[0]] for part in annotation.split(" | "))


#: Each record field and the JSON types it may hold.
_FIELD_TYPES = {f.name: _json_types(str(f.type)) for f in fields(RequestRecord)}


def unanswered(record: RequestRecord) -> str | None:
    """Why ``record`` got no answer for want of a connection (refused, reset, closed before
    any status line), in a few words; None if it did get one, or failed otherwise (a
    timeout, a cancel)."""
    if record.status is not None:
        return None
    if record.error_kind is ErrorKind.CONNECT:
        text = (record.error or "").lower()
        return "connection refused" if "refused" in text or "connect call failed" in text else "cannot connect"
    if record.error_kind is ErrorKind.DISCONNECT:
        return "connection closed before any answer"
    return None
