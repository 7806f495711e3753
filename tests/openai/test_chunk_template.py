"""A stream's chunks read by their template (``ResponseReader._learn``): once a chunk
that carried one piece of text is proven to be a template, later chunks that differ
from it only in that text are read by comparing head and tail. Whatever the chunks,
a reader that learns ends exactly where one that decodes every chunk ends."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import inferlab.openai.response as response
from inferlab.openai.response import ResponseError, ResponseReader
from inferlab.openai.sse import DONE


def read(chunks: list[str], learn: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    """Everything a reader ends with after ``chunks`` (and each chunk's arrivals), or the
    error it raised and where."""
    monkeypatch.setattr(response, "_LEARN_TRIES", response._LEARN_TRIES if learn else 0)
    text: list[str] = []
    r = ResponseReader(text)
    arrivals = []
    for i, data in enumerate(chunks):
        try:
            arrivals.append(r.event(data))
        except ResponseError as e:
            return ("error", i, type(e).__name__, str(e), arrivals, text, r.output_chars)
    return (arrivals, text, r.output_chars, r.finish_reason, r.usage_seen, r.prompt_tokens,
            r.completion_tokens, r.cached_seen, r.cached_tokens, r.timeline, r.done)


def vllm(content: str, **choice: Any) -> str:
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                       "choices": [{"index": 0, "delta": {"content": content}, "logprobs": None,
                                    "finish_reason": None, **choice}]}, separators=(",", ":"), ensure_ascii=False)


USAGE = json.dumps({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}})


def test_a_vllm_stream_is_read_by_its_template(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first content chunk, no chunk of the same shape is decoded (else the
    template would be dead code); the reader still ends as one that decodes all."""
    words = [" the", " sea", "wörld", " 42", "", " émigré"] * 20
    stream = [vllm("")] + [vllm(w) for w in words] + [vllm("", finish_reason="length"), USAGE, DONE]
    decoded: list[str] = []
    real = response._decode_json
    monkeypatch.setattr(response, "_plain_chunk", None)  # (every full read decodes)

    def counting(data: str) -> Any:
        decoded.append(data)
        return real(data)

    monkeypatch.setattr(response, "_decode_json", counting)
    got = read(stream, True, monkeypatch)
    # the role chunk, the first content chunk (read, then decoded twice to learn: it
    # and the probe), the finish and usage chunks
    assert len(decoded) == 6, decoded
    decoded.clear()
    assert got == read(stream, False, monkeypatch)
    assert len(decoded) == len(stream) - 1  # (every chunk but [DONE])
    assert got[0] == [0] + [1 if w else 0 for w in words] + [0, 0, 0]
    assert "".join(got[1]) == "".join(words)


def test_a_text_completion_stream_and_a_reasoning_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    completion = [json.dumps({"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": w}]})
                  for w in ["a", "b", "", "c"]]
    reasoning = [json.dumps({"choices": [{"index": 0, "delta": {"reasoning_content": w, "content": None}}]})
                 for w in ["think", "more"]]
    answer = [json.dumps({"choices": [{"index": 0, "delta": {"content": w, "reasoning_content": None}}]})
              for w in ["then", "say", "it"]]
    for stream in (completion, reasoning + answer):
        assert read(stream, True, monkeypatch) == read(stream, False, monkeypatch)


TRICKY = [
    'a", "role": "x',  # ends the string early: the rest is another member
    'a"}]}',  # closes the object
    "back\\slash",  # an escape in the text as written
    "tab\there",  # a control character (not JSON as written)
    "\u2028",  # a line separator: a plain character in JSON
    "m",  # the model's name: a text that is written elsewhere in the chunk too
    "chatcmpl-1",
    "",
]


@pytest.mark.parametrize("tricky", TRICKY)
def test_texts_that_are_not_a_plain_string_body_go_to_the_decoder(tricky: str, monkeypatch: pytest.MonkeyPatch) -> None:
    learned = vllm(" one")
    raw = learned.replace(" one", tricky)  # as written into the template's place, unescaped
    stream = [learned, raw, vllm(tricky), vllm(" two")]
    expected = read(stream, False, monkeypatch)
    assert read(stream, True, monkeypatch) == expected
    if tricky == 'a", "role": "x':
        assert expected[1][1] == "a"  # (the raw chunk's text is "a": so the template reader read)


def test_no_template_from_a_text_written_twice_or_a_chunk_that_does_more(monkeypatch: pytest.MonkeyPatch) -> None:
    for first in (vllm("m"), vllm(" x", finish_reason="stop"), USAGE):
        r = ResponseReader()
        monkeypatch.setattr(response, "_LEARN_TRIES", 4)
        r.event(first)
        assert r._template is None, first


# --- generated streams -------------------------------------------------------------------

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), _text)
_names = st.sampled_from(["id", "object", "model", "index", "role", "content", "text", "finish_reason",
                          "reasoning_content", "reasoning", "tool_calls", "logprobs", "usage"])


@st.composite
def streams(draw: st.DrawFn) -> list[str]:
    """Chunks of one shape with texts drawn anew (some of them unsafe), written as JSON
    of one style or spliced raw into the first chunk's text; other chunks among them."""
    choice = draw(st.dictionaries(_names, _scalar, max_size=3))
    slot = draw(st.sampled_from(["content", "reasoning_content", "text"]))
    if slot == "text":
        box = choice
    else:
        box = choice["delta"] = draw(st.dictionaries(_names, _scalar, max_size=3))
    top = draw(st.dictionaries(_names.filter(lambda n: n != "usage"), _scalar, max_size=3))
    top["choices"] = [choice]
    separators = draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    ascii_only = draw(st.booleans())
    first = draw(st.text(st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters='"\\'),
                         min_size=1, max_size=6).filter(lambda t: all(ord(c) >= 0x20 for c in t)))
    box[slot] = first
    template = json.dumps(top, separators=separators, ensure_ascii=ascii_only)
    out = [template]
    for _ in range(draw(st.integers(1, 8))):
        how = draw(st.sampled_from(["json", "raw", "other"]))
        text = draw(st.one_of(_text, st.sampled_from(TRICKY)))
        if how == "json":
            box[slot] = text
            out.append(json.dumps(top, separators=separators, ensure_ascii=ascii_only))
        elif how == "raw" and template.count(f'"{first}"') == 1:
            at = template.index(f'"{first}"') + 1
            out.append(template[:at] + text + template[at + len(first):])
        else:
            out.append(draw(st.sampled_from([vllm(text), USAGE, DONE, "{}", "[1]"])))
    return out


@settings(max_examples=500, deadline=None)
@given(stream=streams(), plain_match=st.booleans())
def test_generated_streams_read_the_same_with_and_without_templates(stream: list[str], plain_match: bool) -> None:
    with pytest.MonkeyPatch.context() as mp:
        if plain_match:  # (the path taken where orjson is not installed)
            import re

            mp.setattr(response, "_plain_chunk", re.compile(response._CHUNK).fullmatch)
            mp.setattr(response, "_decode_json", json.JSONDecoder().decode)
        assert read(stream, True, mp) == read(stream, False, mp)


def test_a_text_that_is_the_probe_proves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """(Found in review.) The chunk's text is the probe string, written with an escape, and
    the probe is also written plainly elsewhere in the chunk: no template is learned from it."""
    probe = response._PROBE
    first = '{"x":"' + probe + '","choices":[{"delta":{"content":"\\u0069' + probe[1:] + '"}}]}'
    second = first.replace(f'"x":"{probe}"', '"x":"abc"')
    assert json.loads(first)["choices"][0]["delta"]["content"] == probe
    assert read([first, second], True, monkeypatch) == read([first, second], False, monkeypatch)
