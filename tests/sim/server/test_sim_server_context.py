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
        return Answer(r.status_code, [], None, None, r.json()["error"])
    if not stream:
        d = r.json()
        return Answer(200, [c["finish_reason"] for c in d["choices"]], d["usage"]["completion_tokens"],
                      d["usage"]["prompt_tokens"], None)
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]
    assert r.text.rstrip().endswith("data: [DONE]")
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
    ({"engine_family": "sglang"}, False),  # (its own rule not verified: the 400 kept)
])
def test_the_rule_follows_the_release_and_family(engine: dict[str, Any], clamps: bool) -> None:
    for client in serve(**engine):
        a = ask(client, {"prompt": ids(11), "max_tokens": 505, "ignore_eos": True})
        assert a.status == (200 if clamps else 400), a
        if clamps:
            assert a.completion_tokens == CONTEXT - 11
