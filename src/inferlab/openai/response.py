"""The OpenAI response bodies, both ways: ``Completion``, ``usage``, ``chat_logprobs`` and
``completion_logprobs`` build the chunks and the whole body a server answers with;
``ResponseReader`` reads them on a client.

A chat stream's chunks are ``chat.completion.chunk`` objects whose choices carry a
``delta``; a whole chat body is a ``chat.completion`` whose choices carry a ``message``.
Text completions use ``text_completion`` and a ``text`` per choice, streamed or not.
A stream that asked for usage ends with a chunk whose ``choices`` is empty and which
carries ``usage``. ``inferlab_timeline`` is inferlab's extension: the simulated
server's own view of the request, in the last chunk or the body.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferlab._errors import InferlabError
from inferlab.openai.errors import error_message
from inferlab.openai.sse import DONE

# --- building (server) -------------------------------------------------------------------


@dataclass(frozen=True)
class Completion:
    """What every chunk and body of one answer repeats: its ``id``, whether it answers the
    chat API (else text completions), ``created`` (Unix seconds) and ``model``.
    ``vllm_stop_reason``: write vLLM's ``stop_reason`` wherever vLLM 0.32 does, null
    where no stop string or token ended the answer (the body's choice, a stream's
    finishing choice, and every text-completion chunk); else (the gateway's cache, which
    does not keep it) only where one is given."""

    id: str
    chat: bool
    created: int
    model: str
    vllm_stop_reason: bool = False

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        """One streamed chunk with these ``choices`` (``[]`` for the usage chunk) and
        top-level ``extra`` fields (``usage``, ``inferlab_timeline``) after them."""
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def choice(
        self,
        text: str,
        finish_reason: str | None,
        role: bool = False,
        logprobs: dict[str, Any] | None = None,
        stop_reason: str | int | None = None,
    ) -> dict[str, Any]:
        """Choice 0 of a streamed chunk, carrying ``text`` (chat: as a delta, with the
        ``assistant`` role if ``role``: the first chunk), its tokens' ``logprobs``
        (``chat_logprobs`` or ``completion_logprobs``), and the finish reason, if any,
        with vLLM's ``stop_reason`` (the stop string or token id that ended the answer;
        see ``vllm_stop_reason``)."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if role else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        if stop_reason is not None or (self.vllm_stop_reason and (finish_reason is not None or not self.chat)):
            choice["stop_reason"] = stop_reason
        return choice

    def body(
        self,
        text: str,
        finish_reason: str,
        usage: dict[str, Any],
        logprobs: dict[str, Any] | None = None,
        stop_reason: str | int | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """The whole (non-streamed) answer: one choice with all of ``text``, its
        ``logprobs`` and ``stop_reason`` (as in ``choice``), ``usage``, then top-level
        ``extra`` fields."""
        if self.chat:
            message = {"role": "assistant", "content": text}
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        if stop_reason is not None or self.vllm_stop_reason:
            choice["stop_reason"] = stop_reason
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
            **extra,
        }


#: One generated token's log-probability: (its text, its logprob, the most likely tokens
#: at its place as (text, logprob), most likely first).
TokenLogprob = tuple[str, float, list[tuple[str, float]]]


def chat_logprobs(tokens: list[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's ``logprobs``: ``content`` holds one entry per token, with its
    UTF-8 ``bytes`` and its ``top_logprobs``."""
    return {
        "content": [
            {
                "token": text,
                "logprob": logprob,
                "bytes": list(text.encode()),
                "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in top],
            }
            for text, logprob, top in tokens
        ]
    }


def completion_logprobs(tokens: list[TokenLogprob], first_offset: int) -> dict[str, Any]:
    """A text completion choice's ``logprobs`` (the legacy format): per token its text, its
    logprob, its top alternatives as a text → logprob object (the token itself at least),
    and its character offset in the answer, the first being ``first_offset``."""
    offsets = []
    offset = first_offset
    for text, _, _ in tokens:
        offsets.append(offset)
        offset += len(text)
    return {
        "text_offset": offsets,
        "token_logprobs": [logprob for _, logprob, _ in tokens],
        "tokens": [text for text, _, _ in tokens],
        "top_logprobs": [dict(top) if top else {text: logprob} for text, logprob, top in tokens],
    }


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> dict[str, Any]:
    """The ``usage`` object; ``cached_tokens``: prompt tokens served from the prefix cache
    (None: not said, ``prompt_tokens_details`` null)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": None if cached_tokens is None else {"cached_tokens": cached_tokens},
    }


# --- reading (client) --------------------------------------------------------------------

#: The finish reason of a request the server aborted (vLLM's ``FinishReason.ABORT``;
#: SGLang's ``FINISH_ABORT``, which 0.5.6-0.5.9 send for a streamed request their
#: scheduler refuses, with no error event): a failure, not an answer (bench fails it; the
#: gateway's response cache does not keep it).
ABORTED = "abort"
#: What is said of such an answer (bench's record, the gateway's).
ABORTED_MESSAGE = 'the server aborted the request (finish_reason "abort")'


class ResponseError(InferlabError):
    """A response ``ResponseReader`` cannot take; the message says why, in one line."""


class MalformedResponse(ResponseError):
    """An event or body that is not a JSON object."""


class ErrorInResponse(ResponseError):
    """The server answered with an error object (in a stream, or as a 200 body); the
    message is its ``error_message``."""


class ResponseReader:
    """What one response said, read chunk by chunk (``event``) or from one body
    (``body``), accumulated over the response.

    ``output_chars``: characters of generated text (content, reasoning, text);
    ``finish_reason``: the last one given; ``usage_seen`` is set once a ``usage`` object
    came, and ``prompt_tokens``, ``completion_tokens`` are its last values (None if not
    integers); ``cached_tokens`` is from the last ``prompt_tokens_details``, else from
    llama.cpp's ``timings.cache_n`` (set, with ``cached_seen``, only when one came);
    ``timeline``: the last ``inferlab_timeline``;
    ``done``: the stream's ``[DONE]`` came. Generated text is appended to ``text_out``
    if one is given (multi-turn sessions resend it).
    """

    # ``event`` is the client's per-chunk hot path (bench/client_cpu.py). A chunk of the
    # common shape is read without building it (``_plain_chunk``: a strict match that
    # finds content, text and finish reason); any other is decoded whole and walked.
    # Counts and values accumulate here; the client copies them into its record once,
    # at the end of the response.

    def __init__(self, text_out: list[str] | None = None) -> None:
        self.text_out = text_out
        self.done = False
        self.output_chars = 0
        self.finish_reason: str | None = None
        self.usage_seen = False
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_seen = False
        self.cached_tokens: int | None = None
        self._cached_in_usage = False  # (``prompt_tokens_details`` came: ``timings`` is not read)
        self.timeline: dict[str, Any] | None = None
        # (``_learn``: the stream's own chunk with its text cut out, and how many more
        # chunks may be decoded to find it)
        self._template: tuple[str, str, int, int] | None = None
        self._learn_left = _LEARN_TRIES
        #: the template as an SSE event on the wire (``data: `` + head, tail + blank line,
        #: their lengths), for a client that reads events straight from the bytes; None
        #: while there is no template, or where its head or tail holds a line break
        self.wire_template: tuple[bytes, bytes, int, int] | None = None

    def event(self, data: str) -> int:
        """Read one SSE ``data`` payload of a stream; return how many of its choices
        carried generated content (text, reasoning or a tool call): one arrival each.
        ``[DONE]`` sets ``done`` and returns 0. ``MalformedResponse`` if the payload is
        not a JSON object, ``ErrorInResponse`` if it is an error."""
        template = self._template
        if template is not None:
            head, tail, start, cut = template
            end = len(data) - cut
            if end >= start and data.startswith(head) and data.endswith(tail):
                text = data[start:end]
                if _unsafe_in_string(text) is None:  # (this stream's chunk, with ``text``)
                    return self._take(text)
        if data == DONE:
            self.done = True
            return 0
        plain = _plain_chunk(data) if _plain_chunk is not None else None
        if plain is not None and any(data.count(k) > 1 for k in _READ_KEYS):
            plain = None  # (a repeated key: the match took its first value, a decoder takes the last)
        if plain is not None:
            arrivals = self._read_plain(*plain.group("content", "text", "finish"))
        else:
            try:
                obj = _decode_json(data)
            except ValueError:
                raise MalformedResponse(f"event is not JSON: {data[:80]!r}") from None
            if not isinstance(obj, dict):
                raise MalformedResponse(f"event is not a JSON object: {data[:80]!r}")
            if "error" in obj:
                raise ErrorInResponse(error_message(obj))
            arrivals = self._read(obj, "delta")
        if arrivals == 1 and self._learn_left:
            self._learn(data)
        return arrivals

    def wire_event(self, data: bytes) -> int | None:
        """Read ``data``, one read of a stream's bytes, if it is exactly one SSE event
        that is this stream's template but for its text (``wire_template``; the caller
        holds nothing of an earlier read): return its arrivals, as ``event`` would; None
        if it is not such an event (then nothing was read: parse it as usual)."""
        wire = self.wire_template
        if wire is None:
            return None
        head, tail, start, cut = wire
        end = len(data) - cut
        if end < start or not data.startswith(head) or not data.endswith(tail):
            return None
        raw = data[start:end]
        if unsafe_in_wire_text(raw) is not None:
            return None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None  # (the parser reads it, with replacement characters)
        return self._take(text)

    def _take(self, text: str) -> int:
        """One choice's generated ``text`` of a chunk (or none): its arrivals."""
        if not text:
            return 0
        self.output_chars += len(text)
        if self.text_out is not None:
            self.text_out.append(text)
        return 1

    def _learn(self, data: str) -> None:
        """Take ``data``, a chunk that carried one piece of text and nothing else this
        reader keeps, as the stream's template: the chunk with its text cut out, so that
        a later chunk that is the same but for that text is read by comparing its head
        and tail and taking what is between. Kept only if proven: the chunk decoded again
        with a probe string in the text's place must equal the chunk decoded with the
        probe put there, and the text is a JSON string's whole body as written (no
        quote, backslash or control character, occurring once in the chunk). A string
        body with none of those decodes to itself and cannot end the string or change
        how the rest is read, so any chunk of head + such a body + tail decodes as the
        template does, with that body as its text: what the decoder and ``_read``
        would have returned."""
        self._learn_left -= 1
        try:
            obj = _decode_json(data)
        except ValueError:
            return
        slot = _text_slot(obj)
        if slot is None:
            return
        box, key = slot
        text = box[key]
        quoted = f'"{text}"'
        if _unsafe_in_string(text) is not None or data.count(quoted) != 1 or text == _PROBE:
            return  # (a text that is the probe would prove nothing)
        start = data.index(quoted) + 1
        head, tail = data[:start], data[start + len(text):]
        try:
            probe = _decode_json(head + _PROBE + tail)
        except ValueError:
            return
        box[key] = _PROBE
        if probe == obj:
            self._template = (head, tail, len(head), len(tail))
            wire = None
            if not any(c in head or c in tail for c in "\r\n"):
                whead, wtail = b"data: " + head.encode(), tail.encode() + b"\n\n"
                wire = (whead, wtail, len(whead), len(wtail))
            self.wire_template = wire

    def body(self, raw: bytes) -> None:
        """Read a whole (non-streamed) response body. ``MalformedResponse`` if it is not a
        JSON object, ``ErrorInResponse`` if it is an error."""
        try:
            obj = json.loads(raw)
        except ValueError:
            raise MalformedResponse("response body is not JSON") from None
        if not isinstance(obj, dict):
            raise MalformedResponse("response body is not a JSON object")
        if "error" in obj:
            raise ErrorInResponse(error_message(obj))
        self._read(obj, "message")

    def _read_plain(self, content: str | None, text: str | None, finish: str | None) -> int:
        """``_read`` of a chunk ``_plain_chunk`` matched: one choice whose content, text
        and finish reason are these JSON values as written (quoted strings without
        escapes, or ``null``), or None when absent."""
        # (each is a quoted string or null: a string of more than its quotes is not empty)
        out = content[1:-1] if content is not None and content[0] == '"' else ""
        if text is not None and len(text) > 2 and text[0] == '"':
            out += text[1:-1]
        if finish is not None and len(finish) > 2 and finish[0] == '"':
            self.finish_reason = finish[1:-1]
        return self._take(out)

    def _read(self, obj: dict[str, Any], part_key: str) -> int:
        """Accumulate one chunk or body whose choices carry their output under
        ``part_key``; return how many choices carried generated content."""
        arrivals = 0
        for choice in obj.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            part = choice.get(part_key)
            text = ""
            has_content = False
            if isinstance(part, dict):
                for key in ("content", "reasoning_content", "reasoning"):
                    value = part.get(key)
                    if value:
                        text += value if isinstance(value, str) else ""
                        has_content = True
                if part.get("tool_calls"):
                    has_content = True
            if choice.get("text"):
                text += str(choice["text"])
                has_content = True
            if has_content:
                arrivals += 1
            self.output_chars += len(text)
            if self.text_out is not None and text:
                self.text_out.append(text)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage_seen = True
            self.prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
            self.completion_tokens = _int_or_none(usage.get("completion_tokens"))
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict):
                self.cached_seen = self._cached_in_usage = True
                self.cached_tokens = _int_or_none(details.get("cached_tokens"))
        timings = obj.get("timings")
        if isinstance(timings, dict) and not self._cached_in_usage and "cache_n" in timings:
            # llama.cpp's ``timings.cache_n`` (its slot's ``n_prompt_tokens_cache``): the
            # prompt tokens its cache served, what ``cached_tokens`` says where llama.cpp
            # writes both (since PR 19361, February 2026); before, it wrote only this
            self.cached_seen = True
            self.cached_tokens = _int_or_none(timings["cache_n"])
        timeline = obj.get("inferlab_timeline")
        if isinstance(timeline, dict):
            self.timeline = timeline
        return arrivals


def _orjson_loads() -> Callable[[str], Any] | None:
    try:
        import orjson
    except ImportError:
        return None
    return orjson.loads


#: The decoder of a chunk or body: orjson's ``loads`` where it is installed (the ``fast``
#: extra), else the standard decoder's ``decode`` (what ``json.loads`` wraps; calling it
#: directly saves a call per chunk).
JSON_LIBRARY = "orjson" if _orjson_loads() is not None else "json"
_decode_json: Callable[[str], Any] = _orjson_loads() or json.JSONDecoder().decode

# The common chunk, matched whole instead of decoded: an object of scalar members and
# one ``choices`` list holding one choice, whose members are scalars, ``logprobs`` null
# and at most a ``delta`` object of scalar members; strings without escapes or control
# characters; no ``error``, no ``usage`` object, no ``inferlab_timeline``; reasoning and
# tool calls only as null. ``content`` (in the delta), ``text`` and ``finish_reason``
# (in the choice) are captured as written. JSON's optional spaces after ``:`` and ``,``
# (Python's default) are allowed. Anything else goes through the decoder: this only
# ever answers for input the decoder would read the same way (tests/openai: both on
# many generated chunks). Per chunk it costs about half of the standard decoder and the
# walk over its result, and more than orjson's decoder and the walk (bench/README.md),
# so it is used only where orjson is not installed.
_STR = r'"[^"\\\x00-\x1f]*"'
_VALUE = rf'(?:{_STR}|-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?|null|true|false)'


def _member(but: tuple[str, ...]) -> str:
    """A member with a scalar value and any name but ``but``'s."""
    return rf'"(?!(?:{"|".join(but)})")[^"\\\x00-\x1f]*": ?{_VALUE}'


def _object(members: str, empty: bool) -> str:
    """An object of ``members`` (one alternation, used once, so its groups are named
    once), comma-separated."""
    return rf'\{{(?:(?:{members})(?:, ?(?!\}})|(?=\}})))' + ("*" if empty else "+") + r"\}"


_REASONING = ("content", "reasoning_content", "reasoning", "tool_calls")
_DELTA = _object(
    rf'"content": ?(?P<content>{_STR}|null)|"(?:reasoning_content|reasoning|tool_calls)": ?null'
    rf"|{_member(_REASONING)}",
    empty=True,
)
_CHOICE = _object(
    rf'"delta": ?{_DELTA}|"text": ?(?P<text>{_STR}|null)|"finish_reason": ?(?P<finish>{_STR}|null)'
    rf'|"logprobs": ?null|{_member(("delta", "text", "finish_reason", "logprobs", "message"))}',
    empty=False,
)
_CHUNK = _object(
    rf'"choices": ?\[{_CHOICE}\]|"usage": ?null|{_member(("choices", "usage", "error", "inferlab_timeline"))}',
    empty=False,
)
#: The keys whose values the match reads (or whose place it takes), quoted: a chunk that
#: writes one twice goes to the decoder.
_READ_KEYS = ('"choices"', '"delta"', '"content"', '"text"', '"finish_reason"')
_plain_chunk: Callable[[str], re.Match[str] | None] | None = (
    None if JSON_LIBRARY == "orjson" else re.compile(_CHUNK).fullmatch
)


#: ``ResponseReader._learn``: chunks decoded in search of a template, per stream (a
#: stream that changes its chunk's shape, such as reasoning then content, learns again).
_LEARN_TRIES = 4
_PROBE = "inferlab template probe"
#: A character a JSON string cannot hold as written: what ends it, escapes, control.
_unsafe_in_string = re.compile(r'["\\\x00-\x1f]').search
#: The same in a text's UTF-8 bytes (``ResponseReader.wire_event``).
unsafe_in_wire_text = re.compile(rb'["\\\x00-\x1f]').search


def _text_slot(obj: Any) -> tuple[dict[str, Any], str] | None:
    """Where the one piece of text of a chunk is (its container and key), if reading the
    chunk does nothing but take that text (one arrival): one choice, no finish reason,
    no tool call, exactly one non-empty text (content, reasoning or ``text``), no error,
    no usage, no timeline; else None."""
    if not isinstance(obj, dict) or "error" in obj:
        return None
    if isinstance(obj.get("usage"), dict) or isinstance(obj.get("inferlab_timeline"), dict):
        return None
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    if choice.get("finish_reason"):
        return None
    found: list[tuple[dict[str, Any], str]] = []
    part = choice.get("delta")
    if isinstance(part, dict):
        if part.get("tool_calls"):
            return None
        found += [(part, key) for key in ("content", "reasoning_content", "reasoning") if part.get(key)]
    if choice.get("text"):
        found.append((choice, "text"))
    if len(found) != 1 or not isinstance(found[0][0][found[0][1]], str):
        return None
    return found[0]


def _int_or_none(v: object) -> int | None:
    return v if isinstance(v, int) else None
