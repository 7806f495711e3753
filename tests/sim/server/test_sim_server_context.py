"""sim serve at the context's edge, by release, over HTTP on loopback.

What vLLM 0.32's own server answered (its CPU build, a 512-token context; prompts of
token ids on the completions API, 14 tokens of chat template on the chat API): prompt
11 + max_tokens 505 → 200, 501 tokens, finish_reason "length" (streamed alike); max_tokens
512 (the whole context) the same; max_tokens 100,000 → 400 "max_tokens=100000 cannot be
greater than max_model_len=512" (param max_tokens, or max_completion_tokens); a prompt of
512 → 400 "max_tokens must be at least 1, got 0."; a prompt of 600 → 400 "... your prompt
contains 600 input tokens, which exceeds this limit even without any output tokens";
min_tokens 505 with max_tokens 505 → 400 "min_tokens must be less than or equal to
max_tokens=501, got 505.". vLLM 0.31 refused prompt + max_tokens over the context (400).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from simserver import HTTP_TIMEOUT_S, MODEL

from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer

CONTEXT = 512


def serve(**engine: Any) -> Iterator[httpx.Client]:
    config = ServerConfig(engine=EngineConfig(model=MODEL, max_model_len=CONTEXT, **engine))
    with EmbeddedServer(config) as srv, httpx.Client(base_url=srv.url, timeout=HTTP_TIMEOUT_S) as client:
        yield client


@pytest.fixture(scope="module")
def current() -> Iterator[httpx.Client]:
    """No release named: a current vLLM's rules."""
    yield from serve()


@pytest.fixture(scope="module")
def old() -> Iterator[httpx.Client]:
    yield from serve(engine_version="0.31")


@dataclass
class Answer:
    status: int
    finish_reasons: list[str]
    completion_tokens: int | None
    prompt_tokens: int | None
    error: dict[str, Any] | None


def ask(client: httpx.Client, body: dict[str, Any], *, chat: bool = False, stream: bool = False) -> Answer:
    """One request; its status, finish reasons, usage and error, streamed or not."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {"model": MODEL, **body}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    r = client.post(path, json=body)
    if r.status_code != 200:
        d = r.json()  # (OpenAI's body nests the error; SGLang's is the error, beside "object": "error")
        return Answer(r.status_code, [], None, None, d if d.get("object") == "error" else d["error"])
    if not stream:
        d = r.json()
        return Answer(200, [c["finish_reason"] for c in d["choices"]], d["usage"]["completion_tokens"],
                      d["usage"]["prompt_tokens"], None)
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]
    assert r.text.rstrip().endswith("data: [DONE]")
    if chunks and "error" in chunks[0]:  # (refused inside the stream: its only event)
        assert len(chunks) == 1, chunks
        return Answer(200, [], None, None, chunks[0]["error"])
    usage = next(c["usage"] for c in reversed(chunks) if c.get("usage"))
    finishes = [c["finish_reason"] for ch in chunks for c in ch["choices"] if c.get("finish_reason")]
    return Answer(200, finishes, usage["completion_tokens"], usage["prompt_tokens"], None)


def ids(n: int) -> list[int]:
    return [100 + i % 50 for i in range(n)]


HI = [{"role": "user", "content": "hello there"}]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("max_tokens", [505, CONTEXT])
def test_max_tokens_over_what_the_prompt_leaves_is_lowered_to_it(current: httpx.Client, stream: bool, max_tokens: int) -> None:
    for extra in ({"ignore_eos": True}, {}):  # (without ignore_eos the simulated model may stop first)
        a = ask(current, {"prompt": ids(11), "max_tokens": max_tokens, **extra}, stream=stream)
        assert a.status == 200, a.error
        assert a.prompt_tokens == 11 and a.completion_tokens is not None and a.completion_tokens <= CONTEXT - 11
        if extra:
            assert (a.finish_reasons, a.completion_tokens) == (["length"], CONTEXT - 11)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_chat_lowers_either_limit_field(current: httpx.Client, stream: bool, field: str) -> None:
    a = ask(current, {"messages": HI, field: 505, "ignore_eos": True}, chat=True, stream=stream)
    assert a.status == 200 and a.prompt_tokens is not None and a.prompt_tokens + 505 > CONTEXT, a
    assert (a.finish_reasons, a.completion_tokens) == (["length"], CONTEXT - a.prompt_tokens)
    over = ask(current, {"messages": HI, field: CONTEXT + 1}, chat=True, stream=stream)
    assert over.status == 400 and over.error is not None
    assert over.error["message"].startswith(f"{field}={CONTEXT + 1} cannot be greater than max_model_len={CONTEXT}")
    assert over.error["param"] == field


@pytest.mark.parametrize("stream", [False, True])
def test_what_a_current_release_still_refuses(current: httpx.Client, stream: bool) -> None:
    over = ask(current, {"prompt": ids(11), "max_tokens": 100_000}, stream=stream)
    assert over.status == 400 and over.error is not None and over.error["param"] == "max_tokens"
    assert "cannot be greater than max_model_len=512" in over.error["message"]
    full = ask(current, {"prompt": ids(CONTEXT), "max_tokens": 1}, stream=stream)
    assert full.status == 400 and full.error is not None
    assert full.error["message"] == "max_tokens must be at least 1, got 0."
    assert ask(current, {"prompt": ids(CONTEXT)}, stream=stream).status == 400  # (the default: none left)
    longer = ask(current, {"prompt": ids(600), "max_tokens": 1}, stream=stream)
    assert longer.status == 400 and longer.error is not None and longer.error["param"] == "input_tokens"
    assert "your prompt contains 600 input tokens, which exceeds this limit even without any output tokens" in (
        longer.error["message"])
    # exact output (min_tokens) past what the context leaves: the lowered max_tokens is below it
    exact = ask(current, {"prompt": ids(11), "max_tokens": 505, "min_tokens": 505}, stream=stream)
    assert exact.status == 400 and exact.error is not None
    assert exact.error["message"] == "min_tokens must be less than or equal to max_tokens=501, got 505."
    last = ask(current, {"prompt": ids(CONTEXT - 1), "max_tokens": 10, "ignore_eos": True}, stream=stream)
    assert (last.status, last.completion_tokens, last.finish_reasons) == (200, 1, ["length"])


@pytest.mark.parametrize("stream", [False, True])
def test_a_release_before_the_change_refuses_prompt_and_max_tokens_over_the_context(old: httpx.Client, stream: bool) -> None:
    for max_tokens in (505, CONTEXT):
        a = ask(old, {"prompt": ids(11), "max_tokens": max_tokens, "ignore_eos": True}, stream=stream)
        assert a.status == 400 and a.error is not None, a
        assert a.error["message"].startswith(f"This model's maximum context length is {CONTEXT} tokens. However, you "
                                             f"requested {11 + max_tokens} tokens")
    chat = ask(old, {"messages": HI, "max_completion_tokens": 505}, chat=True, stream=stream)
    assert chat.status == 400
    fits = ask(old, {"prompt": ids(11), "max_tokens": CONTEXT - 11, "ignore_eos": True}, stream=stream)
    assert (fits.status, fits.completion_tokens) == (200, CONTEXT - 11)


@pytest.mark.parametrize(("engine", "clamps"), [
    ({"engine_version": "0.32"}, True),
    ({"engine_version": "0.32.1"}, True),
    ({"engine_version": "0.20"}, False),
    ({"engine_family": "sglang"}, False),  # (SGLang refuses it too: test_sglang_*)
])
def test_the_rule_follows_the_release_and_family(engine: dict[str, Any], clamps: bool) -> None:
    for client in serve(**engine):
        a = ask(client, {"prompt": ids(11), "max_tokens": 505, "ignore_eos": True})
        assert a.status == (200 if clamps else 400), a
        if clamps:
            assert a.completion_tokens == CONTEXT - 11


# SGLang (its tokenizer manager's ``_validate_one_request``, its scheduler's
# ``validate_input_length`` and ``init_req_max_new_tokens``, read in its 0.5.9-0.5.11
# wheels): a prompt of the whole context is refused; prompt + max_tokens of exactly the
# context too before 0.5.11; a prompt within 6 tokens of it by the scheduler (inside a
# stream); every answer ends two tokens short of the context. Its error body is
# {"object": "error", "message", "type", "param", "code"}, not nested under "error".

SGLANG_WORDS_FULL = f"The input ({CONTEXT} tokens) is longer than the model's context length ({CONTEXT} tokens)."


def sglang_total(prompt: int, max_tokens: int) -> str:
    return (f"Requested token count exceeds the model's maximum context length of {CONTEXT} tokens. You requested a "
            f"total of {prompt + max_tokens} tokens: {prompt} tokens from the input messages and {max_tokens} tokens "
            "for the completion. Please reduce the number of tokens in the input messages or the completion to fit "
            "within the limit.")


def sglang_body(message: str, error_type: str = "BadRequestError") -> dict[str, Any]:
    return {"object": "error", "message": message, "type": error_type, "param": None, "code": 400}


@pytest.fixture(scope="module")
def sglang() -> Iterator[httpx.Client]:
    """No release named: a current SGLang's rules (0.5.11 on)."""
    yield from serve(engine_family="sglang")


@pytest.fixture(scope="module")
def sglang_0510() -> Iterator[httpx.Client]:
    yield from serve(engine_family="sglang", engine_version="0.5.10")


@pytest.mark.parametrize("stream", [False, True])
def test_sglang_refuses_a_prompt_of_the_whole_context_in_its_words_and_body(
    sglang: httpx.Client, sglang_0510: httpx.Client, stream: bool,
) -> None:
    for client in (sglang, sglang_0510):
        for extra in ({"max_tokens": 1}, {}):  # (none: the completions API's 16)
            r = client.post("/v1/completions", json={"model": MODEL, "prompt": ids(CONTEXT), "stream": stream, **extra})
            assert (r.status_code, r.json()) == (400, sglang_body(SGLANG_WORDS_FULL))


@pytest.mark.parametrize("stream", [False, True])
def test_sglang_before_0_5_11_refuses_prompt_and_max_tokens_of_exactly_the_context(
    sglang_0510: httpx.Client, stream: bool,
) -> None:
    for prompt in (CONTEXT - 1, 11):
        a = ask(sglang_0510, {"prompt": ids(prompt), "max_tokens": CONTEXT - prompt, "ignore_eos": True}, stream=stream)
        assert (a.status, a.error) == (400, sglang_body(sglang_total(prompt, CONTEXT - prompt))), a
    fits = ask(sglang_0510, {"prompt": ids(11), "max_tokens": CONTEXT - 12, "ignore_eos": True}, stream=stream)
    assert (fits.status, fits.finish_reasons, fits.completion_tokens) == (200, ["length"], CONTEXT - 13)  # (cut at 2 short)


@pytest.mark.parametrize("stream", [False, True])
def test_a_current_sglang_takes_the_total_of_the_context_and_ends_the_answer_two_tokens_short(
    sglang: httpx.Client, stream: bool,
) -> None:
    a = ask(sglang, {"prompt": ids(11), "max_tokens": CONTEXT - 11, "ignore_eos": True}, stream=stream)
    assert (a.status, a.finish_reasons, a.completion_tokens) == (200, ["length"], CONTEXT - 11 - 2), a
    over = ask(sglang, {"prompt": ids(11), "max_tokens": CONTEXT - 10}, stream=stream)
    assert (over.status, over.error) == (400, sglang_body(sglang_total(11, CONTEXT - 10)))
    # no max_tokens on the chat API: up to the context, less the same two
    chat = ask(sglang, {"messages": HI, "ignore_eos": True}, chat=True, stream=stream)
    assert chat.status == 200 and chat.prompt_tokens is not None
    assert (chat.finish_reasons, chat.completion_tokens) == (["length"], CONTEXT - chat.prompt_tokens - 2)


def test_sglang_refuses_a_prompt_within_six_tokens_of_the_context_in_its_scheduler(sglang: httpx.Client) -> None:
    """A token under the context with max_tokens 1 (the total the context): past the
    tokenizer manager's check from 0.5.11, refused by the scheduler, whose refusal a
    stream gets after its 200."""
    words = (f"Input length ({CONTEXT - 1} tokens) exceeds the maximum allowed length ({CONTEXT - 6} tokens). Use a "
             "shorter input or enable --allow-auto-truncate.")
    body = {"prompt": ids(CONTEXT - 1), "max_tokens": 1}
    whole = ask(sglang, body)
    assert (whole.status, whole.error) == (400, sglang_body(words))
    streamed = ask(sglang, body, stream=True)
    assert (streamed.status, streamed.error) == (200, sglang_body(words, "BAD_REQUEST"))
    last = ask(sglang, {"prompt": ids(CONTEXT - 7), "max_tokens": 7, "ignore_eos": True})
    assert (last.status, last.completion_tokens) == (200, 5)


def test_sglang_before_0_5_10_refuses_a_stream_inside_it() -> None:
    for client in serve(engine_family="sglang", engine_version="0.5.9"):
        a = ask(client, {"prompt": ids(CONTEXT)}, stream=True)
        assert (a.status, a.error) == (200, sglang_body(SGLANG_WORDS_FULL))
        assert ask(client, {"prompt": ids(CONTEXT)}).status == 400


def test_sglang_refuses_a_null_max_tokens_on_the_completions_api(sglang: httpx.Client) -> None:
    """Its CompletionRequest types max_tokens as an integer (16 when left out): a null is
    a validation error (400; http_server.py's validation_exception_handler: type "Bad
    Request", no param), where vLLM takes it as the context left."""
    a = ask(sglang, {"prompt": ids(11), "max_tokens": None})
    assert a.status == 400 and a.error is not None
    assert (a.error["object"], a.error["type"], a.error["param"], a.error["code"]) == ("error", "Bad Request", None, 400)
    assert ask(sglang, {"prompt": ids(11), "ignore_eos": True}).completion_tokens == 16


def test_sglang_cuts_an_exact_length_at_its_limit(sglang: httpx.Client) -> None:
    """min_tokens = max_tokens past the limit: SGLang checks min_tokens against max_tokens
    as asked, and its scheduler cuts the answer all the same (vLLM refuses it)."""
    exact = ask(sglang, {"prompt": ids(11), "max_tokens": CONTEXT - 11, "min_tokens": CONTEXT - 11})
    assert (exact.status, exact.finish_reasons, exact.completion_tokens) == (200, ["length"], CONTEXT - 13)


@pytest.mark.parametrize("engine", [{}, {"engine_version": "0.31"}])
def test_vllm_still_takes_prompt_and_max_tokens_of_exactly_the_context(engine: dict[str, Any]) -> None:
    for client in serve(**engine):
        for prompt in (11, CONTEXT - 1):
            a = ask(client, {"prompt": ids(prompt), "max_tokens": CONTEXT - prompt, "ignore_eos": True})
            assert (a.status, a.finish_reasons, a.completion_tokens) == (200, ["length"], CONTEXT - prompt), a


def test_sglang_before_0_5_10_sends_its_schedulers_refusal_as_a_bad_request_error_event() -> None:
    """Up to 0.5.5 the scheduler's refusal reached a stream as the tokenizer manager's
    ValueError (adapter.py, serving_chat.py: ``create_streaming_error_response``, type
    "BadRequestError"); the "BAD_REQUEST" event came with 0.5.10."""
    words = (f"Input length ({CONTEXT - 6} tokens) exceeds the maximum allowed length ({CONTEXT - 6} tokens). Use a "
             "shorter input or enable --allow-auto-truncate.")
    for client in serve(engine_family="sglang", engine_version="0.4.6"):
        a = ask(client, {"prompt": ids(CONTEXT - 6), "max_tokens": 1}, stream=True)
        assert (a.status, a.error) == (200, sglang_body(words, "BadRequestError"))


def chat_of(client: httpx.Client, tokens: int) -> list[dict[str, str]]:
    """Messages of ``tokens`` tokens as the server counts them (its /tokenize), template included."""
    def count(n: int) -> int:
        messages = [{"role": "user", "content": "x" * n}]
        return int(client.post("/tokenize", json={"model": MODEL, "messages": messages}).json()["count"])
    n = next(n for n in range(1, 20 * tokens) if count(n) >= tokens)
    assert count(n) == tokens
    return [{"role": "user", "content": "x" * n}]


@pytest.mark.parametrize("chat", [False, True])
def test_sglang_0_5_6_to_0_5_9_end_a_stream_their_scheduler_refuses_with_finish_reason_abort(chat: bool) -> None:
    """0.5.6-0.5.9's tokenizer manager yields the scheduler's abort to a stream, and their
    serving_chat.py / serving_completions.py pass it on as a finish reason: 200, no text,
    finish_reason "abort", no error event, then [DONE] (chat: the role's chunk first)."""
    for client in serve(engine_family="sglang", engine_version="0.5.9"):
        body = {"messages": chat_of(client, CONTEXT - 6)} if chat else {"prompt": ids(CONTEXT - 6)}
        path = "/v1/chat/completions" if chat else "/v1/completions"
        r = client.post(path, json={"model": MODEL, **body, "max_tokens": 1, "stream": True})
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]
        assert r.text.rstrip().endswith("data: [DONE]") and not any("error" in c for c in chunks), chunks
        finishes = [c.get("finish_reason") for ch in chunks for c in ch["choices"]]
        assert finishes == ([None, "abort"] if chat else ["abort"])
        assert not any(c.get("text") or (c.get("delta") or {}).get("content") for ch in chunks for c in ch["choices"])
        assert ask(client, {"prompt": ids(CONTEXT - 6), "max_tokens": 1}).status == 400  # (not streamed: a 400)
