"""The response cache: answers a deterministic request (temperature 0, or a fixed
``seed``) again without an upstream.

The key is a digest of the request body (stream fields left out, keys sorted, a whole
number written as a float read as the integer: the same request whatever its JSON
spelling, ``0`` or ``0.0``), the API and the caller's key scope (the key's
name; one scope for all keys only when configured). An entry keeps the answer as it
came: a stream as its events, grouped as the upstream's reads delivered them (replayed
with that chunking), or a whole body. The other form is built from the same answer when
asked for (a stored body streamed as SSE, a stored stream answered as one body) only
when that is exact: a plain text answer (``Answer.plain``). An answer with tool calls,
reasoning, a refusal, audio or annotations answers its own form only; the other form is
a miss (``Entry.serves``). Entries expire after ``ttl_s``; past ``max_entries`` or
``max_bytes`` the least recently used go.

Identical misses coalesce: the first one (the leader) goes upstream; the others wait for
its entry and are answered from it (or go upstream themselves if it failed).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from inferlab._clock import NS_PER_S, Clock
from inferlab.gateway.config import CacheConfig
from inferlab.openai.response import Completion
from inferlab.openai.sse import DONE_EVENT, encode_event, encode_json

#: Body fields that change only how the answer is delivered, not what it is.
_DELIVERY_FIELDS = ("stream", "stream_options")
#: A delta's or message's members that carry an answer beside its text: an answer with
#: any of them (not null or empty) is not plain.
_BESIDE_TEXT = ("tool_calls", "function_call", "reasoning_content", "reasoning", "refusal", "audio", "annotations")


def cacheable(body: dict[str, Any]) -> bool:
    """Whether a checked request's answer is deterministic enough to cache: temperature 0
    or an integer ``seed``, one choice, no log-probabilities (a body built from a stream
    would lose them)."""
    deterministic = body.get("temperature") == 0 or type(body.get("seed")) is int
    one = body.get("n") in (None, 1)
    no_logprobs = not body.get("logprobs") and not body.get("top_logprobs") and body.get("prompt_logprobs") is None
    return deterministic and one and no_logprobs


def cache_key(body: dict[str, Any], chat: bool, scope: str) -> str:
    """The digest a request is cached under (module docstring)."""
    kept = {k: _number_spelled_once(v) for k, v in body.items() if k not in _DELIVERY_FIELDS}
    text = json.dumps([chat, scope, kept], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _number_spelled_once(value: Any) -> Any:
    """``value`` with every whole float as its integer (``0.0`` as ``0``, ``1e3`` as
    ``1000``), in lists and objects too: JSON's spellings of one number, one key. An
    engine reads them as the same value (``temperature`` 0.0 is 0)."""
    if type(value) is float:
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {k: _number_spelled_once(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_number_spelled_once(v) for v in value]
    return value


@dataclass(frozen=True)
class Answer:
    """What one answer said, whatever form it came in: enough to build the other form
    when ``plain`` (its text is all it said: no member of ``_BESIDE_TEXT``)."""

    id: str
    created: int
    model: str
    text: str
    finish_reason: str
    usage: dict[str, Any]
    plain: bool = True

    @property
    def tokens(self) -> int:
        """Input plus output tokens, as the upstream counted them (0 if it did not)."""
        u = self.usage
        return sum(v for v in (u.get("prompt_tokens"), u.get("completion_tokens")) if isinstance(v, int))


@dataclass(frozen=True)
class Entry:
    """One cached answer: ``reads`` (a stream: each upstream read's events as (data, is
    the usage-only chunk)) or ``body`` (a whole JSON body), and its ``answer``."""

    chat: bool
    answer: Answer
    reads: tuple[tuple[tuple[str, bool], ...], ...] | None = None
    body: bytes | None = None

    def serves(self, stream: bool) -> bool:
        """Whether this entry answers a request for ``stream`` exactly: its own form, or
        the other one built from a plain answer."""
        return self.answer.plain or stream == (self.reads is not None)

    @property
    def size_bytes(self) -> int:
        if self.reads is not None:
            return sum(len(d) for read in self.reads for d, _ in read) + len(self.answer.text)
        return len(self.body or b"") + len(self.answer.text)

    def stream(self, include_usage: bool, rid: str | None = None) -> list[bytes]:
        """The answer as SSE, one bytes per write: a stored stream with its chunking
        (without its usage chunk unless ``include_usage``), else built from the body.
        ``rid``: the id this answer goes out under (``fresh_id``; default the stored
        one)."""
        a = self.answer
        rid = a.id if rid is None else rid
        if self.reads is not None:
            out = []
            for read in self.reads:
                data = b"".join(encode_event(_replayed(d, a.id, rid))
                                for d, usage_only in read if include_usage or not usage_only)
                if data:
                    out.append(data)
            return out
        c = Completion(rid, self.chat, a.created, a.model)
        events = [encode_json(c.chunk([c.choice(a.text, None, role=True)])),
                  encode_json(c.chunk([c.choice("", a.finish_reason)]))]
        if include_usage:
            events.append(encode_json(c.chunk([], usage=a.usage)))
        return [*events, DONE_EVENT]

    def whole(self, rid: str | None = None) -> bytes:
        """The answer as one JSON body (``rid`` as in ``stream``): a stored body as it
        came, else built from the stream."""
        a = self.answer
        rid = a.id if rid is None else rid
        if self.body is not None:
            return _replayed(self.body.decode(), a.id, rid).encode()
        c = Completion(rid, self.chat, a.created, a.model)
        return json.dumps(c.body(a.text, a.finish_reason, a.usage)).encode()

    def fresh_id(self) -> str:
        """A new id for one replay of this answer, in the stored id's form (its prefix,
        ``chatcmpl-``, ``cmpl-``...; a new random part): each response has an id of its
        own, as an upstream gives it, so that clients that key on ids see two answers."""
        prefix, sep, _ = self.answer.id.rpartition("-")
        return f"{prefix}{sep}{uuid.uuid4().hex}" if sep else f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"


#: The response header that says whether the cache answered (``hit``) or the request
#: went upstream (``miss``); only on requests the cache could answer. ``bench`` reads it.
CACHE_HEADER = "x-inferlab-cache"

#: The simulated server's account of one request (``inferlab_timeline``): a stored
#: answer's is the first request's, never a cache hit's, so it is left out of replays.
TIMELINE = "inferlab_timeline"


def _replayed(data: str, old_id: str, rid: str) -> str:
    """An event's or body's text as a replay sends it: without ``inferlab_timeline`` (its
    JSON re-encoded then), and with the JSON string equal to the stored id ``old_id`` as
    ``rid`` (a string replace, no decoding: a random id is no other string in an answer,
    and a cached stream's every chunk carries it)."""
    if TIMELINE in data:
        try:
            obj = json.loads(data)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            obj.pop(TIMELINE, None)
            data = json.dumps(obj)
    if old_id and old_id != rid:
        data = data.replace(f'"{old_id}"', f'"{rid}"')
    return data


def plain_event(data: str) -> bool:
    """Whether a stream's event carries text alone (or nothing): no choice's delta has a
    member of ``_BESIDE_TEXT``. (Decoded only when one of their names is in it.)"""
    if not any(name in data for name in _BESIDE_TEXT):
        return True
    try:
        obj = json.loads(data)
    except ValueError:
        return True  # (not an answer's chunk: the reader failed the stream)
    return not isinstance(obj, dict) or _plain_choices(obj.get("choices"), "delta")


def _plain_choices(choices: object, part_key: str) -> bool:
    for choice in choices if isinstance(choices, list) else []:
        part = choice.get(part_key) if isinstance(choice, dict) else None
        if isinstance(part, dict) and any(part.get(name) for name in _BESIDE_TEXT):
            return False
    return True


def answer_of_stream(first_chunk: dict[str, Any], text: str, finish_reason: str | None, usage: dict[str, Any],
                     plain: bool) -> Answer:
    """The ``Answer`` of a stream, from its first chunk's ids and what it carried."""
    return Answer(str(first_chunk.get("id", "")), _int(first_chunk.get("created")), str(first_chunk.get("model", "")),
                  text, finish_reason or "stop", usage, plain)


def answer_of_body(body: dict[str, Any], chat: bool) -> Answer | None:
    """The ``Answer`` of a whole response body; None if it has no single choice to read."""
    choices = body.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    plain = _plain_choices(choices, "message")
    if chat:
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else None
        if text is None and not plain:  # (tool calls without text: served as this body only)
            text = ""
    else:
        text = choice.get("text")
    usage = body.get("usage")
    if not isinstance(text, str) or not isinstance(usage, dict):
        return None
    return Answer(str(body.get("id", "")), _int(body.get("created")), str(body.get("model", "")),
                  text, str(choice.get("finish_reason") or "stop"), usage, plain)


def _int(v: object) -> int:
    return v if isinstance(v, int) else 0


class ResponseCache:
    """The in-memory cache (module docstring). One event loop; not thread-safe."""

    def __init__(self, config: CacheConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self._entries: OrderedDict[str, tuple[int, Entry]] = OrderedDict()  # key → (expiry ns, entry)
        self._bytes = 0
        self._pending: dict[str, asyncio.Future[Entry | None]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def get(self, key: str) -> Entry | None:
        """The live entry under ``key``, if any (and it becomes the most recently used)."""
        hit = self._entries.get(key)
        if hit is None:
            return None
        if hit[0] <= self.clock.now_ns():
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return hit[1]

    def pending(self, key: str) -> asyncio.Future[Entry | None] | None:
        """The leader's future for ``key`` if an identical request is on its way."""
        return self._pending.get(key)

    def lead(self, key: str) -> None:
        """Mark the caller as the leader for ``key``: identical misses wait for it. The
        leader must call ``finish`` however its request ends. ``ValueError`` if ``key``
        has a leader already."""
        if key in self._pending:
            raise ValueError("this request has a leader already")
        self._pending[key] = asyncio.get_running_loop().create_future()

    def finish(self, key: str, entry: Entry | None, store: bool = True) -> None:
        """The leader is done: store ``entry`` (None: nothing to store; ``store`` False:
        it is kept elsewhere) and hand it to the waiters."""
        try:
            if entry is not None and store:
                self.put(key, entry)
        finally:  # (the waiters are answered whatever storing did: else they would wait for ever)
            fut = self._pending.pop(key, None)
            if fut is not None and not fut.done():
                fut.set_result(entry)

    def put(self, key: str, entry: Entry) -> None:
        size = entry.size_bytes
        if size > self.config.max_bytes:
            return
        if key in self._entries:
            self._drop(key)
        self._entries[key] = (self.clock.now_ns() + int(self.config.ttl_s * NS_PER_S), entry)
        self._bytes += size
        while len(self._entries) > self.config.max_entries or self._bytes > self.config.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: str) -> None:
        _, entry = self._entries.pop(key)
        self._bytes -= entry.size_bytes

