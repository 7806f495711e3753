"""Request bodies: what a client builds and what a server reads back from it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from inferlab.openai.errors import APIError
from inferlab.openai.request import (
    PATHS,
    GenerationParams,
    completion_request,
    parse_body,
    read_messages,
    read_params,
    read_prompt,
)

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def test_chat_request_with_exact_output_and_usage_in_order() -> None:
    body = completion_request("m", "chat", messages=MESSAGES, max_tokens=16, exact_output=True)
    # The order is the bytes sent: model, input, limits, streaming.
    assert list(body) == ["model", "messages", "max_tokens", "ignore_eos", "min_tokens", "stream", "stream_options"]
    assert body == {
        "model": "m", "messages": MESSAGES, "max_tokens": 16, "ignore_eos": True, "min_tokens": 16,
        "stream": True, "stream_options": {"include_usage": True},
    }


def test_completions_request_without_limit_or_stream() -> None:
    assert completion_request("m", "completions", prompt=[1, 2, 3], exact_output=True, stream=False) == {
        "model": "m", "prompt": [1, 2, 3],
    }
    assert completion_request("m", "completions", prompt="text", max_tokens=4, stream=False) == {
        "model": "m", "prompt": "text", "max_tokens": 4,
    }


def test_extra_fields_come_last_and_override() -> None:
    body = completion_request("m", "chat", messages=MESSAGES, extra={"temperature": 0, "stream_options": {}})
    assert list(body)[-1] == "temperature"
    assert body["stream_options"] == {}


def test_the_apis_input_is_required() -> None:
    with pytest.raises(ValueError, match="messages"):
        completion_request("m", "chat", prompt="text")
    with pytest.raises(ValueError, match="prompt"):
        completion_request("m", "completions", messages=MESSAGES)


def test_paths_are_below_the_api_root() -> None:
    assert PATHS == {"chat": "/chat/completions", "completions": "/completions"}


def test_a_built_request_reads_back_on_the_server_side() -> None:
    raw = json.dumps(completion_request("m", "chat", messages=MESSAGES, max_tokens=8, exact_output=True)).encode()
    body = parse_body(raw)
    assert read_messages(body) == MESSAGES
    assert read_params(body) == GenerationParams(stream=True, include_usage=True, max_tokens=8, min_tokens=8, ignore_eos=True)
    raw = json.dumps(completion_request("m", "completions", prompt=[5, 6], stream=False)).encode()
    body = parse_body(raw)
    assert read_prompt(body) == [5, 6]
    assert read_params(body) == GenerationParams()


def test_parse_body_decodes_with_the_charset() -> None:
    assert parse_body('{"p": "é"}'.encode("latin-1"), "latin-1") == {"p": "é"}


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"{not json", "request body is not valid JSON: Expecting property name"),
        (b'{"a": "\xff"}', "request body is not valid JSON: 'utf-8' codec can't decode"),
        (b"[1, 2]", "request body must be a JSON object"),
    ],
)
def test_parse_body_refuses_with_400(raw: bytes, needle: str) -> None:
    with pytest.raises(APIError) as e:
        parse_body(raw)
    assert e.value.status == 400 and e.value.message.startswith(needle)


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        (None, "non-empty list"),
        ([], "non-empty list"),
        (["hi"], "non-empty list"),
        ([{"role": "robot"}], "unknown message role 'robot'"),
        ([{"content": "x"}], "unknown message role None"),
    ],
)
def test_read_messages_refuses_with_400(messages: Any, needle: str) -> None:
    with pytest.raises(APIError, match=needle) as e:
        read_messages({"messages": messages})
    assert e.value.status == 400


def test_read_prompt_takes_a_batch_of_one() -> None:
    assert read_prompt({"prompt": "text"}) == "text"
    assert read_prompt({"prompt": ["text"]}) == "text"
    assert read_prompt({"prompt": [[1, 2]]}) == [1, 2]
    assert read_prompt({"prompt": [7]}) == [7]


@pytest.mark.parametrize("prompt", [None, 5, [], [1.5], [True], ["a", "b"], [[]]])
def test_read_prompt_refuses_with_400(prompt: Any) -> None:
    with pytest.raises(APIError, match="'prompt' must be a string or a non-empty list of token ids"):
        read_prompt({"prompt": prompt})


def test_read_params_limits() -> None:
    assert read_params({"max_tokens": 5, "max_completion_tokens": 7}).max_tokens == 7
    assert read_params({"max_tokens": 5}).max_tokens == 5
    assert read_params({"min_tokens": "5"}).min_tokens == 0  # not an integer: ignored
    assert read_params({"min_tokens": None}).min_tokens == 0
    assert read_params({"stream_options": {"include_usage": True}}).include_usage
    assert not read_params({"stream_options": "yes"}).include_usage


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"stream": "yes"}, "'stream' must be a boolean"),
        ({"stream": 1, "max_tokens": 0}, "'stream' must be a boolean"),  # stream is checked first
        ({"max_tokens": 0}, "max_tokens must be a positive integer"),
        ({"max_tokens": True}, "max_tokens must be a positive integer"),
        ({"max_completion_tokens": 2.0}, "max_tokens must be a positive integer"),
    ],
)
def test_read_params_refuses_with_400(body: dict[str, Any], needle: str) -> None:
    with pytest.raises(APIError, match=needle) as e:
        read_params(body)
    assert e.value.status == 400
