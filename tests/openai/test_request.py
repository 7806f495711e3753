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
    read_bool,
    read_chat_template,
    read_messages,
    read_model,
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
    assert read_params(body, "chat") == GenerationParams(stream=True, include_usage=True, max_tokens=8, min_tokens=8, ignore_eos=True)
    raw = json.dumps(completion_request("m", "completions", prompt=[5, 6], stream=False)).encode()
    body = parse_body(raw)
    assert read_prompt(body) == [5, 6]
    assert read_params(body, "completions") == GenerationParams()


def test_parse_body_decodes_with_the_charset() -> None:
    assert parse_body('{"p": "é"}'.encode("latin-1"), "latin-1") == {"p": "é"}


@pytest.mark.parametrize("charset", ["no-such-charset", "zlib", "rot13", "utf-8\x00"])
def test_parse_body_refuses_a_charset_that_is_not_a_text_encoding(charset: str) -> None:
    with pytest.raises(APIError, match="unsupported charset") as e:
        parse_body(b"{}", charset)
    assert e.value.status == 400


def test_parse_body_takes_surrogate_pairs_and_escaped_backslashes() -> None:
    assert parse_body(b'{"p": "\\ud83d\\ude80"}') == {"p": "\U0001f680"}
    assert parse_body(b'{"p": "\\\\ud800"}') == {"p": "\\ud800"}  # a backslash, then text


def test_parse_body_refuses_a_lone_surrogate_that_a_lax_codec_decoded() -> None:
    with pytest.raises(APIError, match="not valid Unicode"):
        parse_body(b'{"p": "+2AA-"}', "utf-7")


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"{not json", "request body is not valid JSON: Expecting property name"),
        (b'{"a": "\xff"}', "request body is not valid JSON: 'utf-8' codec can't decode"),
        (b"[1, 2]", "request body must be a JSON object"),
        (b"[" * 100_000, "request body is not valid JSON: it is nested too deeply"),
        (b'{"a": "\\ud800"}', "request body holds text that is not valid Unicode"),
        (b'{"a": ["x", {"\\udfff": 1}]}', "request body holds text that is not valid Unicode"),
        (b'{"a": 1' + b"0" * 5000 + b"}", "request body is not valid JSON: Exceeds the limit"),
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
        ([{}], "unknown message role None"),
        ([{"role": ["user"]}], "unknown message role"),
        ([{"role": "user", "content": 5}], "must be a string or a list of content parts"),
        ([{"role": "user", "content": ["hi"]}], "must be a content part"),
        ([{"role": "user", "content": [{"text": "hi"}]}], "must be a content part"),
        ([{"role": "user", "content": [{"type": "text", "text": 5}]}], "text: Input should be a valid string"),
    ],
)
def test_read_messages_refuses_with_400(messages: Any, needle: str) -> None:
    with pytest.raises(APIError, match=needle) as e:
        read_messages({"messages": messages})
    assert e.value.status == 400


def test_read_messages_takes_content_as_openai_writes_it() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {}}]},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "user", "content": ""},
    ]
    assert read_messages({"messages": messages}) == messages


def test_read_prompt_takes_a_batch_of_one() -> None:
    assert read_prompt({"prompt": "text"}) == "text"
    assert read_prompt({"prompt": ["text"]}) == "text"
    assert read_prompt({"prompt": [[1, 2]]}) == [1, 2]
    assert read_prompt({"prompt": [7]}) == [7]


@pytest.mark.parametrize("prompt", [5, [], [1.5], [True], [[]]])
def test_read_prompt_refuses_with_400(prompt: Any) -> None:
    with pytest.raises(APIError, match="'prompt' must be a string or a non-empty list of token ids"):
        read_prompt({"prompt": prompt})


@pytest.mark.parametrize("prompt", [["a", "b"], [[1], [2, 3]], ["a", [1]]])
def test_read_prompt_says_a_batch_is_not_served(prompt: Any) -> None:
    with pytest.raises(APIError, match=f"prompt: a batch of {len(prompt)} prompts in one request is not supported"):
        read_prompt({"prompt": prompt})


@pytest.mark.parametrize("prompt", [None, "", [""]])
def test_read_prompt_refuses_an_empty_prompt_as_vllm_does(prompt: Any) -> None:
    with pytest.raises(APIError, match=r"Either prompt or prompt_embeds must be provided and non-empty\."):
        read_prompt({"prompt": prompt})


def test_read_model() -> None:
    assert read_model({}) is None
    assert read_model({"model": "m"}) == "m"
    with pytest.raises(APIError, match="model: Input should be a valid string") as e:
        read_model({"model": ["m"]})
    assert e.value.param == "model"


def test_read_chat_template() -> None:
    assert read_chat_template({}) == (True, False)
    assert read_chat_template({"add_generation_prompt": False, "continue_final_message": True}) == (False, True)
    with pytest.raises(APIError, match=r"Cannot set both `continue_final_message` and `add_generation_prompt` to True\."):
        read_chat_template({"continue_final_message": True})
    with pytest.raises(APIError, match="add_generation_prompt: Input should be a valid boolean"):
        read_chat_template({"add_generation_prompt": "no"})


def test_read_params_limits() -> None:
    assert read_params({"max_tokens": 5, "max_completion_tokens": 7}, "chat").max_tokens == 7
    assert read_params({"max_tokens": 5, "max_completion_tokens": None}, "chat").max_tokens == 5
    assert read_params({"max_tokens": 5}, "chat").max_tokens == 5
    assert read_params({"min_tokens": None}, "chat").min_tokens == 0
    assert read_params({"max_tokens": 5, "min_tokens": 5}, "chat").min_tokens == 5
    assert read_params({"stream": True, "stream_options": {"include_usage": True}}, "chat").include_usage
    assert not read_params({"stream_options": {}}, "chat").include_usage  # empty: allowed without a stream


def test_read_params_accepts_vllms_sampling_ranges() -> None:
    body = {
        "temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0.0, "presence_penalty": -2, "frequency_penalty": 2.0,
        "repetition_penalty": 1.1, "seed": -(2**63), "n": 1, "ignore_eos": False, "prompt_logprobs": None,
    }
    assert read_params(body, "completions") == GenerationParams()
    assert read_params({"temperature": 2, "top_p": 1e-9, "top_k": 0, "seed": 2**63 - 1}, "chat") == GenerationParams()


def test_read_params_stop() -> None:
    assert read_params({"stop": "\n"}, "chat").stop == ("\n",)
    assert read_params({"stop": ["a", "b", "c", "d"]}, "chat").stop == ("a", "b", "c", "d")
    assert read_params({"stop": None, "stop_token_ids": [3, 4]}, "chat") == GenerationParams(stop_token_ids=(3, 4))


def test_read_params_logprobs_by_api() -> None:
    assert read_params({"logprobs": True}, "chat").logprobs == 0
    assert read_params({"logprobs": True, "top_logprobs": 20}, "chat").logprobs == 20
    assert read_params({"logprobs": False, "top_logprobs": 0}, "chat").logprobs is None
    assert read_params({"logprobs": 0}, "completions").logprobs == 0
    assert read_params({"logprobs": 5}, "completions").logprobs == 5
    assert read_params({"n": 3, "prompt_logprobs": 1}, "completions") == GenerationParams(n=3, prompt_logprobs=1)


@pytest.mark.parametrize(
    ("body", "needle", "param"),
    [
        ({"stream": "yes"}, "stream: Input should be a valid boolean", "stream"),
        ({"stream": 1, "max_tokens": 0}, "stream: Input should be a valid boolean", "stream"),  # checked first
        ({"max_tokens": 0}, "max_tokens must be at least 1, got 0.", "max_tokens"),
        ({"max_completion_tokens": -3}, "max_completion_tokens must be at least 1, got -3.", "max_completion_tokens"),
        ({"max_tokens": True}, "max_tokens: Input should be a valid integer", "max_tokens"),
        ({"max_completion_tokens": 2.0}, "max_completion_tokens: Input should be a valid integer", "max_completion_tokens"),
        ({"max_tokens": 2**63}, "max_tokens: Input should be a 64-bit integer", "max_tokens"),
        ({"min_tokens": "5"}, "min_tokens: Input should be a valid integer", "min_tokens"),
        ({"min_tokens": -1}, "min_tokens must be greater than or equal to 0, got -1.", "min_tokens"),
        ({"max_tokens": 4, "min_tokens": 5}, "min_tokens must be less than or equal to max_tokens=4, got 5.", "min_tokens"),
        ({"ignore_eos": "true"}, "ignore_eos: Input should be a valid boolean", "ignore_eos"),
        ({"n": 0}, "n must be at least 1, got 0.", "n"),
        ({"n": "2"}, "n: Input should be a valid integer", "n"),
        ({"temperature": -0.5}, "temperature must be non-negative, got -0.5.", "temperature"),
        ({"temperature": 2.5}, "temperature must be in [0, 2], got 2.5.", "temperature"),
        ({"temperature": float("nan")}, "temperature must be a finite number, got nan.", "temperature"),
        ({"temperature": float("inf")}, "temperature must be a finite number, got inf.", "temperature"),
        ({"temperature": "hot"}, "temperature: Input should be a valid number", "temperature"),
        ({"temperature": True}, "temperature: Input should be a valid number", "temperature"),
        ({"top_p": 0}, "top_p must be in (0, 1], got 0.", "top_p"),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5.", "top_p"),
        ({"top_p": float("nan")}, "top_p must be in (0, 1], got nan.", "top_p"),
        ({"top_p": [1]}, "top_p: Input should be a valid number", "top_p"),
        ({"top_k": -2}, "top_k must be 0 (disable), or at least 1, got -2.", "top_k"),
        ({"top_k": 1.5}, "top_k: Input should be a valid integer", "top_k"),
        ({"min_p": 1.1}, "min_p must be in [0, 1], got 1.1.", "min_p"),
        ({"presence_penalty": 3}, "presence_penalty must be in [-2, 2], got 3.", "presence_penalty"),
        ({"frequency_penalty": -2.1}, "frequency_penalty must be in [-2, 2], got -2.1.", "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty must be greater than zero, got 0.", "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty must be a finite number, got inf.", "repetition_penalty"),
        ({"seed": 1.5}, "seed: Input should be a valid integer", "seed"),
        ({"seed": "42"}, "seed: Input should be a valid integer", "seed"),
        ({"seed": 2**64}, "seed: Input should be a 64-bit integer", "seed"),
        ({"stream_options": "yes"}, "stream_options: Input should be a valid dictionary", "stream_options"),
        ({"stream_options": {"include_usage": True}}, "Stream options can only be defined when `stream=True`.", "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": "y"}}, "stream_options.include_usage: Input should be a valid boolean", "stream_options.include_usage"),
        ({"stop": 5}, "stop: Input should be a valid string or a list of strings", "stop"),
        ({"stop": ["a", 1]}, "stop: Input should be a valid string or a list of strings", "stop"),
        ({"stop": ""}, "stop cannot contain an empty string.", "stop"),
        ({"stop": ["a", ""]}, "stop cannot contain an empty string.", "stop"),
        ({"stop": list("abcde")}, "stop: List should have at most 4 items after validation, not 5", "stop"),
        ({"stop_token_ids": [1, "2"]}, "stop_token_ids must contain only integers.", "stop_token_ids"),
        ({"stop_token_ids": 7}, "stop_token_ids must contain only integers.", "stop_token_ids"),
        ({"logprobs": "yes"}, "logprobs: Input should be a valid boolean", "logprobs"),
        ({"logprobs": True, "top_logprobs": "3"}, "`top_logprobs` must be an integer.", "top_logprobs"),
        ({"logprobs": True, "top_logprobs": -2}, "`top_logprobs` must be a positive value or -1.", "top_logprobs"),
        ({"top_logprobs": 3}, "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "Requested sample logprobs of 21, which is greater than max allowed: 20", "top_logprobs"),
        ({"logprobs": True, "top_logprobs": -1}, "Requested sample logprobs of the whole vocabulary (-1)", "top_logprobs"),
        ({"prompt_logprobs": 1, "stream": True}, "`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs"),
        ({"prompt_logprobs": -3}, "`prompt_logprobs` must be a positive value or -1.", "prompt_logprobs"),
    ],
)
def test_read_params_refuses_chat_with_400(body: dict[str, Any], needle: str, param: str) -> None:
    with pytest.raises(APIError) as e:
        read_params(body, "chat")
    assert e.value.status == 400
    assert e.value.message.startswith(needle), e.value.message
    assert e.value.param == param


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"logprobs": True}, "`logprobs` must be an integer."),
        ({"logprobs": 1.5}, "`logprobs` must be an integer."),
        ({"logprobs": -2}, "`logprobs` must be a positive value or -1."),
        ({"logprobs": 21}, "Requested sample logprobs of 21, which is greater than max allowed: 20"),
        ({"logprobs": -1}, "Requested sample logprobs of the whole vocabulary (-1), which is greater than max allowed: 20"),
    ],
)
def test_read_params_refuses_completions_logprobs_with_400(body: dict[str, Any], needle: str) -> None:
    with pytest.raises(APIError) as e:
        read_params(body, "completions")
    assert e.value.message == needle and e.value.param == "logprobs"


def test_read_bool() -> None:
    assert read_bool({}, "x", True) is True
    assert read_bool({"x": None}, "x", False) is False
    assert read_bool({"x": False}, "x", True) is False
    for value in (0, 1, "true", [], {}):
        with pytest.raises(APIError, match="x: Input should be a valid boolean"):
            read_bool({"x": value}, "x", False)
