"""The OpenAI request bodies, both ways: ``completion_request`` builds what a client sends
to ``/v1/chat/completions`` or ``/v1/completions``; ``parse_body``, ``read_messages``,
``read_prompt`` and ``read_params`` read it on a server, raising ``APIError`` (HTTP 400,
with the message the client will see) for what the API refuses.

Beyond OpenAI's own fields the builder uses vLLM's ``ignore_eos`` and ``min_tokens``
(also SGLang's, TGI's and llama.cpp's) to force an exact output length.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from inferlab.openai.errors import APIError

#: The two generation APIs: chat completions (messages) and text completions (prompt).
Api = Literal["chat", "completions"]

#: Each API's route below the API root (``…/v1``).
PATHS: dict[Api, str] = {"chat": "/chat/completions", "completions": "/completions"}

#: The message roles a chat request may use (OpenAI's, ``developer`` included).
ROLES = ("system", "user", "assistant", "tool", "developer")


def completion_request(
    model: str,
    api: Api,
    *,
    messages: Sequence[Mapping[str, Any]] | None = None,
    prompt: str | list[int] | None = None,
    max_tokens: int | None = None,
    exact_output: bool = False,
    stream: bool = True,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON body of one request: ``messages`` for the chat API, ``prompt`` (text or
    token ids) for the completions API. ``max_tokens`` None lets the server decide;
    ``exact_output`` asks for exactly ``max_tokens`` tokens. A stream asks for ``usage``
    in its last chunk (``stream_options.include_usage``). ``extra`` is merged last, so
    it can override any field. ``ValueError`` if the API's input is missing."""
    body: dict[str, Any] = {"model": model}
    if api == "chat":
        if messages is None:
            raise ValueError("the chat API needs messages")
        body["messages"] = messages
    else:
        if prompt is None:
            raise ValueError("the completions API needs a prompt")
        body["prompt"] = prompt
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
        if exact_output:
            body["ignore_eos"] = True
            body["min_tokens"] = max_tokens
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if extra:
        body.update(extra)
    return body


def parse_body(raw: bytes, charset: str | None = None) -> dict[str, Any]:
    """A request's JSON object from its bytes, decoded as ``charset`` (UTF-8 if None).
    ``APIError`` 400 if it is not JSON or not an object; ``LookupError`` for an unknown
    charset."""
    try:
        body = json.loads(raw.decode(charset or "utf-8"))
    except ValueError as e:  # (UnicodeDecodeError is one)
        raise APIError(400, f"request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    return body


def read_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A chat request's ``messages``: a non-empty list of objects with known ``role``s
    (``ROLES``); their content is not checked here. ``APIError`` 400 otherwise."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
        raise APIError(400, "'messages' must be a non-empty list of message objects")
    for m in msgs:
        if m.get("role") not in ROLES:
            raise APIError(400, f"unknown message role {m.get('role')!r}")
    return msgs


def read_prompt(body: Mapping[str, Any]) -> str | list[int]:
    """A completions request's ``prompt``: text, or a non-empty list of token ids (their
    range is the server's to check). A batch of one (``["text"]``, ``[[1, 2]]``) is taken
    as its element. ``APIError`` 400 otherwise."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return prompt
    raise APIError(400, "'prompt' must be a string or a non-empty list of token ids")


@dataclass(frozen=True)
class GenerationParams:
    """How much to generate and how to answer, as a request asks.

    ``max_tokens``: ``max_completion_tokens``, else ``max_tokens``; None lets the server
    decide. ``min_tokens`` (0 when absent or not an integer) and ``ignore_eos`` are
    vLLM's extensions. ``include_usage``: a stream ends with a usage chunk."""

    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False


def read_params(body: Mapping[str, Any]) -> GenerationParams:
    """A generation request's parameters. ``APIError`` 400 if ``stream`` is not a boolean
    or the token limit is not a positive integer (checked in that order)."""
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise APIError(400, "'stream' must be a boolean")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise APIError(400, "max_tokens must be a positive integer")
    min_tokens = body.get("min_tokens") or 0
    opts = body.get("stream_options") or {}
    return GenerationParams(
        stream=stream,
        include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
        max_tokens=max_tokens,
        min_tokens=min_tokens if isinstance(min_tokens, int) else 0,
        ignore_eos=bool(body.get("ignore_eos")),
    )
