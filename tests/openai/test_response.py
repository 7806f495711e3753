"""Response bodies: the chunks and bodies a server builds, read back by a client."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from splits import random_splits

from inferlab.openai.errors import error_body
from inferlab.openai.response import (
    Completion,
    ErrorInResponse,
    MalformedResponse,
    ResponseReader,
    chat_logprobs,
    completion_logprobs,
    usage,
)
from inferlab.openai.sse import DONE_EVENT, SSEParser, encode_json

CHAT = Completion("chatcmpl-7", True, 1700000000, "m")
TEXT = Completion("cmpl-7", False, 1700000000, "m")
TIMELINE = {"queued_ms": 0.0, "first_token_ms": 12.5}
PIECES = ["Hello", " wörld", "!"]


def test_chat_chunks_are_openais_bytes() -> None:
    assert encode_json(CHAT.chunk([CHAT.choice("", None, role=True)])) == (
        b'data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1700000000,"model":"m",'
        b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
    )
    assert CHAT.chunk([], usage=usage(3, 2, 1), inferlab_timeline=TIMELINE) == {
        "id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1700000000, "model": "m",
        "choices": [],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, "prompt_tokens_details": {"cached_tokens": 1}},
        "inferlab_timeline": TIMELINE,
    }


def test_text_completion_chunks_and_bodies() -> None:
    assert TEXT.chunk([TEXT.choice("x", "stop")]) == {
        "id": "cmpl-7", "object": "text_completion", "created": 1700000000, "model": "m",
        "choices": [{"index": 0, "text": "x", "logprobs": None, "finish_reason": "stop"}],
    }
    body = TEXT.body("xy", "length", usage(1, 2, 0))
    assert body["object"] == "text_completion"
    assert body["choices"] == [{"index": 0, "text": "xy", "logprobs": None, "finish_reason": "length"}]


def test_chat_body_key_order() -> None:
    body = CHAT.body("hi", "stop", usage(1, 1, 0), inferlab_timeline=TIMELINE)
    assert list(body) == ["id", "object", "created", "model", "choices", "usage", "inferlab_timeline"]
    assert body["object"] == "chat.completion"
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "logprobs": None, "finish_reason": "stop"}]


def test_stop_reason_rides_on_the_finishing_choice_only_when_given() -> None:
    assert TEXT.choice("", "stop", stop_reason="\n") == {"index": 0, "text": "", "logprobs": None, "finish_reason": "stop", "stop_reason": "\n"}
    assert "stop_reason" not in TEXT.choice("", "stop")
    body = CHAT.body("hi", "stop", usage(1, 1, 0), stop_reason=7)
    assert body["choices"][0]["stop_reason"] == 7 and "stop_reason" not in body


LOGPROBS = [("Hé", -0.25, [("Hé", -0.25), (" a", -1.5)]), ("!", -0.5, [("!", -0.5), ("?", -2.0)])]


def test_chat_logprobs_are_openais() -> None:
    assert chat_logprobs(LOGPROBS[:1]) == {
        "content": [
            {
                "token": "Hé", "logprob": -0.25, "bytes": [72, 195, 169],
                "top_logprobs": [
                    {"token": "Hé", "logprob": -0.25, "bytes": [72, 195, 169]},
                    {"token": " a", "logprob": -1.5, "bytes": [32, 97]},
                ],
            }
        ]
    }
    assert chat_logprobs([("x", -1.0, [])])["content"][0]["top_logprobs"] == []  # top_logprobs: 0


def test_completion_logprobs_are_the_legacy_format() -> None:
    assert completion_logprobs(LOGPROBS, 10) == {
        "text_offset": [10, 12],
        "token_logprobs": [-0.25, -0.5],
        "tokens": ["Hé", "!"],
        "top_logprobs": [{"Hé": -0.25, " a": -1.5}, {"!": -0.5, "?": -2.0}],
    }
    # logprobs: 0 still gives the chosen token's
    assert completion_logprobs([("x", -1.0, [])], 0)["top_logprobs"] == [{"x": -1.0}]


def test_logprobs_ride_on_choices_and_bodies() -> None:
    lp = chat_logprobs(LOGPROBS)
    assert CHAT.choice("Hé", None, logprobs=lp)["logprobs"] == lp
    assert CHAT.body("Hé!", "length", usage(1, 2, 0), logprobs=lp)["choices"][0]["logprobs"] == lp


def stream(answer: Completion, *, include_usage: bool) -> bytes:
    """A whole stream as the simulated server writes it."""
    out = encode_json(answer.chunk([answer.choice("", None, role=True)])) if answer.chat else b""
    out += b"".join(encode_json(answer.chunk([answer.choice(p, None)])) for p in PIECES)
    extra = {} if include_usage else {"inferlab_timeline": TIMELINE}
    out += encode_json(answer.chunk([answer.choice("", "length")], **extra))
    if include_usage:
        out += encode_json(answer.chunk([], usage=usage(9, 3, 4), inferlab_timeline=TIMELINE))
    return out + DONE_EVENT


def read(pieces: list[bytes]) -> tuple[ResponseReader, list[str], list[int]]:
    text: list[str] = []
    reader, parser, arrivals = ResponseReader(text), SSEParser(), []
    for piece in pieces:
        arrivals += [reader.event(e) for e in parser.feed(piece)]
    arrivals += [reader.event(e) for e in parser.close()]
    return reader, text, arrivals


@pytest.mark.parametrize("answer", [CHAT, TEXT], ids=["chat", "completions"])
@pytest.mark.parametrize("include_usage", [True, False])
def test_a_built_stream_reads_back_in_any_split(answer: Completion, include_usage: bool) -> None:
    data = stream(answer, include_usage=include_usage)
    rng = random.Random(4)
    for _ in range(50):
        reader, text, arrivals = read(random_splits(data, rng, cuts=8))
        assert text == PIECES
        # the role chunk carries no content; [DONE] reads as 0
        assert sum(arrivals) == len(PIECES)
        assert reader.done and reader.output_chars == sum(map(len, PIECES))
        assert reader.finish_reason == "length"
        assert reader.timeline == TIMELINE
        assert reader.usage_seen is include_usage
        if include_usage:
            assert (reader.prompt_tokens, reader.completion_tokens, reader.cached_tokens) == (9, 3, 4)


@pytest.mark.parametrize("answer", [CHAT, TEXT], ids=["chat", "completions"])
def test_a_built_body_reads_back(answer: Completion) -> None:
    text: list[str] = []
    reader = ResponseReader(text)
    reader.body(json.dumps(answer.body("all of it", "stop", usage(5, 3, 0), inferlab_timeline=TIMELINE)).encode())
    assert text == ["all of it"] and reader.output_chars == 9 and reader.finish_reason == "stop"
    assert (reader.usage_seen, reader.prompt_tokens, reader.completion_tokens) == (True, 5, 3)
    assert reader.cached_seen and reader.cached_tokens == 0
    assert reader.timeline == TIMELINE and not reader.done


def chunk(delta: dict[str, Any], **extra: Any) -> str:
    return json.dumps({"choices": [{"index": 0, "delta": delta}], **extra})


def test_reasoning_and_tool_calls_count_as_content() -> None:
    reader = ResponseReader()
    assert reader.event(chunk({"reasoning_content": "hmm"})) == 1
    assert reader.event(chunk({"reasoning": "so"})) == 1
    assert reader.event(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]})) == 1
    assert reader.event(chunk({"content": None, "role": "assistant"})) == 0
    assert reader.event(chunk({})) == 0
    assert reader.output_chars == 5  # a tool call's arguments are not text


def test_every_choice_with_content_is_an_arrival() -> None:
    both = json.dumps({"choices": [{"index": 0, "delta": {"content": "a"}}, {"index": 1, "text": "b"}, "junk"]})
    assert ResponseReader().event(both) == 2


def test_usage_without_details_keeps_the_cached_count() -> None:
    reader = ResponseReader()
    reader.event(json.dumps({"choices": [], "usage": {"prompt_tokens": 4, "prompt_tokens_details": {"cached_tokens": 2}}}))
    reader.event(json.dumps({"choices": [], "usage": {"prompt_tokens": "4", "completion_tokens": 1}}))
    assert (reader.prompt_tokens, reader.completion_tokens, reader.cached_tokens) == (None, 1, 2)
    assert reader.finish_reason is None and reader.timeline is None


def test_llamacpps_timings_say_the_cached_tokens_where_usage_does_not() -> None:
    """llama.cpp before its PR 19361 (February 2026) wrote its cached prompt tokens only
    as ``timings.cache_n``; since, it writes ``prompt_tokens_details`` too, and those
    are read first, whichever of them comes first."""
    old = {"choices": [], "usage": {"completion_tokens": 2, "prompt_tokens": 30, "total_tokens": 32},
           "timings": {"cache_n": 29, "prompt_n": 1, "predicted_n": 2}}
    reader = ResponseReader()
    reader.body(json.dumps(old).encode())
    assert reader.cached_seen and reader.cached_tokens == 29
    both = ResponseReader()
    both.event(json.dumps({"choices": [], "usage": {"prompt_tokens": 30, "prompt_tokens_details": {"cached_tokens": 7}}}))
    both.event(json.dumps({"choices": [], "timings": {"cache_n": 29}}))
    assert both.cached_tokens == 7
    later = ResponseReader()
    later.event(json.dumps({"choices": [], "timings": {"cache_n": 29}}))
    later.event(json.dumps({"choices": [], "usage": {"prompt_tokens": 30, "prompt_tokens_details": {"cached_tokens": 7}}}))
    assert later.cached_tokens == 7
    none = ResponseReader()
    none.event(json.dumps({"choices": [], "timings": {"prompt_n": 30}}))
    assert not none.cached_seen and none.cached_tokens is None


@pytest.mark.parametrize(
    ("data", "needle"),
    [("not json", "event is not JSON: 'not json'"), ("[1]", "event is not a JSON object: '[1]'")],
)
def test_a_malformed_event_raises(data: str, needle: str) -> None:
    with pytest.raises(MalformedResponse) as e:
        ResponseReader().event(data)
    assert str(e.value) == needle


def test_an_error_event_or_body_raises_with_its_message() -> None:
    err = json.dumps(error_body(500, "engine died", "InternalServerError"))
    with pytest.raises(ErrorInResponse, match=r"^engine died$"):
        ResponseReader().event(err)
    with pytest.raises(ErrorInResponse, match=r"^engine died$"):
        ResponseReader().body(err.encode())


@pytest.mark.parametrize(("raw", "needle"), [(b"<html>", "response body is not JSON"), (b'"x"', "response body is not a JSON object")])
def test_a_malformed_body_raises(raw: bytes, needle: str) -> None:
    with pytest.raises(MalformedResponse, match=f"^{needle}$"):
        ResponseReader().body(raw)
