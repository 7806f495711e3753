"""The chunk reader's two paths agree: a chunk of the common shape, matched without being
decoded (``_plain_chunk``, used where orjson is not installed), reads exactly as the
same chunk decoded whole; anything the match is not sure of goes to the decoder. And the
SSE parser's fast path (whole ``data:`` events in one read) gives what its general path
gives, however the bytes are cut."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from splits import random_splits

import inferlab.openai.response as response
from inferlab.openai.response import ResponseError, ResponseReader
from inferlab.openai.sse import SSEParser, encode_event

PLAIN = re.compile(response._CHUNK).fullmatch



def read(data: list[str], plain: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    """Everything a reader ends with after ``data`` (or the error it raised)."""
    monkeypatch.setattr(response, "_plain_chunk", PLAIN if plain else None)
    monkeypatch.setattr(response, "_decode_json", json.JSONDecoder().decode)
    text: list[str] = []
    r = ResponseReader(text)
    arrivals = []
    try:
        for d in data:
            arrivals.append(r.event(d))
    except ResponseError as e:
        return ("error", type(e).__name__, str(e))
    return (arrivals, text, r.output_chars, r.finish_reason, r.usage_seen, r.prompt_tokens,
            r.completion_tokens, r.cached_seen, r.cached_tokens, r.timeline, r.done)


# --- chunks as servers write them --------------------------------------------------------

VLLM = (
    '{"id":"chatcmpl-0f3c","object":"chat.completion.chunk","created":1733000000,"model":"m",'
    '"choices":[{"index":0,"delta":{"content":" lighthouse"},"logprobs":null,"finish_reason":null}]}'
)
VLLM_ROLE = VLLM.replace('{"content":" lighthouse"}', '{"role":"assistant","content":""}')
VLLM_END = VLLM.replace('{"content":" lighthouse"},"logprobs":null,"finish_reason":null',
                        '{},"logprobs":null,"finish_reason":"length","stop_reason":null')
SGLANG = (
    '{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    '"delta":{"role":null,"content":"wörld","reasoning_content":null,"tool_calls":null},'
    '"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}'
)
LLAMACPP = (
    '{"choices":[{"finish_reason":null,"index":0,"delta":{"content":" the"}}],"created":1,'
    '"id":"chatcmpl-x","model":"m","system_fingerprint":"b1-abc","object":"chat.completion.chunk"}'
)
COMPLETION = '{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" x","logprobs":null,"finish_reason":"stop"}]}'
SPACED = json.dumps({"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]})

COMMON = [VLLM, VLLM_ROLE, VLLM_END, SGLANG, LLAMACPP, COMPLETION, SPACED]


@pytest.mark.parametrize("data", COMMON)
def test_the_common_shapes_are_matched_and_read_as_decoded(data: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert PLAIN(data) is not None  # (else this test would compare the decoder with itself)
    assert read([data], True, monkeypatch) == read([data], False, monkeypatch)


NOT_PLAIN = [
    VLLM.replace("lighthouse", "light\\nhouse"),  # an escape
    VLLM.replace("lighthouse", "light\thouse"),  # a raw control character (not JSON)
    VLLM[:-1],  # cut short
    VLLM + "}",  # one brace too many
    VLLM.replace('"created":1733000000', '"created":01733000000'),  # not a JSON number
    VLLM.replace('"logprobs":null', '"logprobs":{"content":[]}'),
    VLLM.replace('"model":"m"', '"error":null'),  # an error member, even null, fails the read
    VLLM.replace('{"content":" lighthouse"}', '{"reasoning_content":"hmm"}'),
    VLLM.replace('{"content":" lighthouse"}', '{"tool_calls":[{"index":0}]}'),
    VLLM.replace('{"content":" lighthouse"}', '{"content":7}'),
    VLLM.replace('"finish_reason":null', '"finish_reason":1'),
    VLLM.replace('"choices":[{', '"choices":[{"index":1,"text":"b"},{'),  # two choices
    VLLM.replace('"choices":[', '"usage":{"prompt_tokens":3},"choices":['),
    VLLM.replace('"choices":[', '"inferlab_timeline":{"a":1},"choices":['),
    '{"choices":[]}',
    "[1]",
    "not json",
]

#: Chunks the match takes whole but that repeat a key it reads: a decoder keeps the last
#: value, the match its first.
REPEATED = [
    '{"choices":[{"delta":{"content":"a"},"delta":{}}]}',
    '{"choices":[{"finish_reason":"stop"}],"choices":[{"delta":{}}]}',
    '{"choices":[{"delta":{"content":"a","content":"b"}}]}',
]


@pytest.mark.parametrize("data", REPEATED)
def test_a_repeated_key_is_left_to_the_decoder(data: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert PLAIN(data) is not None  # (the match alone would read it)
    assert read([data], True, monkeypatch) == read([data], False, monkeypatch)


@pytest.mark.parametrize("data", NOT_PLAIN)
def test_anything_else_is_left_to_the_decoder(data: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert PLAIN(data) is None
    assert read([data], True, monkeypatch) == read([data], False, monkeypatch)


# --- generated chunks --------------------------------------------------------------------

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), _text,
                    st.floats(allow_nan=False, allow_infinity=False, width=32))
_names = st.sampled_from(["id", "object", "created", "model", "index", "role", "stop_reason",
                          "system_fingerprint", "matched_stop", "content", "text", "finish_reason",
                          "reasoning_content", "reasoning", "tool_calls", "logprobs", "usage", "error"])


@st.composite
def chunks(draw: st.DrawFn) -> dict[str, Any]:
    delta = draw(st.dictionaries(_names, _scalar, max_size=4))
    choice = draw(st.dictionaries(_names, _scalar, max_size=4))
    if draw(st.booleans()):
        choice["delta"] = delta
    top = draw(st.dictionaries(_names.filter(lambda n: n not in ("error", "usage")), _scalar, max_size=4))
    if draw(st.booleans()):
        top["usage"] = None
    top["choices"] = [choice]
    order = draw(st.permutations(list(top)))
    return {k: top[k] for k in order}


@settings(max_examples=400, deadline=None)
@given(obj=chunks(), compact=st.booleans(), ascii_only=st.booleans())
def test_generated_chunks_read_the_same_both_ways(obj: dict[str, Any], compact: bool, ascii_only: bool) -> None:
    separators = (",", ":") if compact else (", ", ": ")
    data = json.dumps(obj, separators=separators, ensure_ascii=ascii_only)
    with pytest.MonkeyPatch.context() as mp:
        assert read([data], True, mp) == read([data], False, mp)


def test_generated_chunks_do_take_the_plain_path() -> None:
    """Most chunks a streaming server writes match (else the path would be dead code)."""
    rng = random.Random(0)
    words = ["the", " sea", "wörld", "", " 42"]
    for _ in range(50):
        delta = {"content": rng.choice(words)} if rng.random() < 0.8 else {}
        data = json.dumps({"id": "c", "object": "chat.completion.chunk", "created": rng.randrange(10**9),
                           "model": "m", "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                      "finish_reason": rng.choice([None, "stop"])}]},
                          separators=(",", ":"), ensure_ascii=False)
        assert PLAIN(data) is not None, data


# --- the SSE parser's fast path ----------------------------------------------------------

_payloads = st.lists(st.one_of(
    st.text(st.characters(codec="utf-8", exclude_characters="\r\n", exclude_categories=("Cs",)), max_size=12),
    st.sampled_from(["[DONE]", VLLM, "a\nb"]),
), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(payloads=_payloads, comments=st.booleans(), seed=st.integers(0, 2**16))
def test_sse_fast_path_gives_what_the_general_path_gives(payloads: list[str], comments: bool, seed: int) -> None:
    stream = b"".join((b": ping\n\n" if comments and i % 2 else b"") + encode_event(p) for i, p in enumerate(payloads))
    one_by_one = SSEParser()
    expected = [e for b in stream for e in one_by_one.feed(bytes([b]))] + one_by_one.close()
    assert expected == payloads  # (bytes one at a time never take the fast path)
    rng = random.Random(seed)
    for pieces in ([stream], random_splits(stream, rng, cuts=3), [encode_event(p) for p in payloads]):
        parser = SSEParser()
        got = [e for piece in pieces for e in parser.feed(piece)] + parser.close()
        assert got == payloads
