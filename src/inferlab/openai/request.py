"""The OpenAI request bodies, both ways: ``completion_request`` builds what a client sends
to ``/v1/chat/completions`` or ``/v1/completions``; ``parse_body``, ``read_model``,
``read_messages``, ``read_prompt``, ``read_params``, ``read_chat_template`` and
``read_bool`` read it on a server, raising ``APIError`` (HTTP 400, with the message the
client will see and the field at fault as ``param``) for what vLLM refuses.

The readers follow vLLM's OpenAI server (``protocol.py``, ``sampling_params.py``): its
range rules with its messages, and, for a value of the wrong type, a message in the
words of its request models' validation (``temperature: Input should be a valid
number``). They are stricter in one way: a number must be a JSON number and a boolean a
JSON boolean (vLLM's models would also take ``"0.7"`` or ``1``).

Beyond OpenAI's own fields the builder uses vLLM's ``ignore_eos`` and ``min_tokens``
(also SGLang's, TGI's and llama.cpp's) to force an exact output length.
"""

from __future__ import annotations

import json
import math
import re
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

#: The most log-probabilities a request may ask for per token (vLLM's default
#: ``--max-logprobs``, and OpenAI's limit on ``top_logprobs``).
MAX_LOGPROBS = 20

#: The most stop strings a request may give (OpenAI's limit, and vLLM's default
#: ``VLLM_MAX_STOP_STRINGS``).
MAX_STOP_STRINGS = 4

#: Integer fields hold a signed 64-bit value (vLLM's engine takes no wider; it also keeps
#: the server's arithmetic on them small).
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


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


#: Body fields a run sets from its own flags, with the flag: ``--extra-body`` may not set
#: them, since a run's records and summary would then describe requests it did not send.
RUN_FIELDS: dict[str, str] = {
    "model": "--model",
    "messages": "the workload (--prompt, --dataset, --input-tokens ...)",
    "prompt": "the workload (--prompt, --dataset, --input-tokens ...)",
    "max_tokens": "--output-tokens",
    "max_completion_tokens": "--output-tokens",
    "min_tokens": "--output-tokens (exact unless --no-exact-output)",
    "ignore_eos": "--output-tokens (exact unless --no-exact-output)",
    "stream": "--stream/--no-stream",
    "stream_options": "--stream (a stream always asks for usage)",
    "n": "nothing: a run sends one choice per request",
}


def check_extra_body(extra: object) -> dict[str, Any]:
    """Fields to merge into every request body (vLLM's ``--extra-body``): a JSON object
    that sets none of ``RUN_FIELDS``. ``ValueError`` saying which flag sets a field."""
    if not isinstance(extra, dict):
        raise ValueError(f"must be a JSON object, not {type(extra).__name__}")
    taken = [k for k in extra if k in RUN_FIELDS]
    if taken:
        raise ValueError("; ".join(f"{k!r} is set by {RUN_FIELDS[k]}" for k in taken))
    return dict(extra)


def parse_body(raw: bytes, charset: str | None = None) -> dict[str, Any]:
    """A request's JSON object from its bytes, decoded as ``charset`` (UTF-8 if None).
    ``APIError`` 400 if the charset is not a text encoding Python knows, if the bytes are
    not JSON (nested too deeply included), if a string in it holds a lone surrogate
    (``"\\ud800"``: JSON can write one, no tokenizer can encode it) or if it is not an
    object."""
    try:
        text = raw.decode(charset or "utf-8")
    except UnicodeError as e:  # bytes the charset cannot decode
        raise APIError(400, f"request body is not valid JSON: {e}") from e
    except (LookupError, ValueError):  # unknown, not a text encoding ("zlib"), or garbled
        raise APIError(400, f"unsupported charset {_show(charset)} in the Content-Type") from None
    try:
        body = json.loads(text)
    except RecursionError:
        raise APIError(400, "request body is not valid JSON: it is nested too deeply") from None
    except ValueError as e:
        raise APIError(400, f"request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    # Strict decoding leaves no surrogate in ``text`` but what an escape writes, or what a
    # lax codec (UTF-7) made: look for either before walking the whole object.
    if _SURROGATE_ESCAPE.search(text) or _SURROGATE.search(text):
        _refuse_lone_surrogates(body)
    return body


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _refuse_lone_surrogates(obj: object) -> None:
    # A loop, not recursion: the object can be as deep as the JSON decoder allows.
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as e:
                raise APIError(400, f"request body holds text that is not valid Unicode: {e}") from None
        elif isinstance(item, dict):
            stack += item.keys()
            stack += item.values()
        elif isinstance(item, list):
            stack += item


def _show(value: object, limit: int = 60) -> str:
    """A value as an error message quotes it: its repr, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _invalid(name: str, kind: str) -> APIError:
    """A value of the wrong type, in the words of vLLM's request validation."""
    return APIError(400, f"{name}: Input should be a valid {kind}", param=name)


def read_bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    """Field ``name`` as a boolean; ``default`` when absent or null. ``APIError`` 400 if
    it is anything but a JSON boolean."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _invalid(name, "boolean")
    return value


def _read_int(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if type(value) is not int:  # (a bool is an int to Python, not to JSON)
        raise _invalid(name, "integer")
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise APIError(400, f"{name}: Input should be a 64-bit integer, got {_show(value)}", param=name)
    return value


def _read_number(body: Mapping[str, Any], name: str) -> float | int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _invalid(name, "number")
    return value


def _finite(value: float | int) -> bool:
    # (an int is finite, and math.isfinite cannot take one too large for a float)
    return isinstance(value, int) or math.isfinite(value)


def read_model(body: Mapping[str, Any]) -> str | None:
    """A request's ``model``: a string, or None when absent. ``APIError`` 400 otherwise."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _invalid("model", "string")
    return model


def read_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A chat request's ``messages``: a non-empty list of objects with known ``role``s
    (``ROLES``) whose ``content`` is absent, null, a string, or a list of content parts
    (objects with a string ``type``; a ``text`` part with a string ``text``).
    ``APIError`` 400 otherwise."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
        raise APIError(400, "'messages' must be a non-empty list of message objects", param="messages")
    for i, m in enumerate(msgs):
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise APIError(400, f"unknown message role {_show(role)}", param=f"messages[{i}].role")
        _check_content(m.get("content"), f"messages[{i}].content")
    return msgs


def _check_content(content: object, where: str) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise APIError(400, f"{where} must be a string or a list of content parts", param=where)
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise APIError(400, f"{where}[{j}] must be a content part: an object with a string 'type'", param=where)
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise APIError(400, f"{where}[{j}].text: Input should be a valid string", param=where)


def read_chat_template(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """A chat request's ``(add_generation_prompt, continue_final_message)``, vLLM's
    extensions (true and false when absent). ``APIError`` 400 if either is not a boolean
    or both are true."""
    add = read_bool(body, "add_generation_prompt", True)
    cont = read_bool(body, "continue_final_message", False)
    if add and cont:
        raise APIError(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    return add, cont


#: Who refuses a batch of prompts in one request, and why (``read_prompt``): the simulated server's words.
SIMULATOR_BATCH = "not supported by the simulated server (vLLM would answer a choice per prompt)"


def read_prompt(body: Mapping[str, Any], batch: str = SIMULATOR_BATCH) -> str | list[int]:
    """A completions request's ``prompt``: non-empty text, or a non-empty list of token ids
    (their range is the server's to check). A batch of one (``["text"]``, ``[[1, 2]]``)
    is taken as its element. ``APIError`` 400 otherwise; a batch of several is refused in
    ``batch``'s words (who does not take it, and why)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    elif isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise APIError(
            400,
            f"prompt: a batch of {len(prompt)} prompts in one request is {batch}: send one prompt per request.",
            param="prompt",
        )
    if prompt is None or prompt == "":
        raise APIError(400, "Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return prompt
    raise APIError(400, "'prompt' must be a string or a non-empty list of token ids", param="prompt")


@dataclass(frozen=True)
class GenerationParams:
    """How much to generate, where to stop and how to answer, as a request asks.

    ``max_tokens``: ``max_completion_tokens``, else ``max_tokens``; None lets the server
    decide. ``min_tokens`` and ``ignore_eos`` are vLLM's extensions. ``include_usage``: a
    stream ends with a usage chunk. ``stop``: the stop strings; ``stop_token_ids``
    vLLM's stop tokens. ``logprobs``: how many alternatives to give with each token's
    log-probability (chat: ``top_logprobs`` when ``logprobs`` is true; completions:
    ``logprobs``), None for none. ``n`` and ``prompt_logprobs`` are as asked (within
    vLLM's rules), for the server to serve or refuse. ``include_stop_str``: vLLM's
    ``include_stop_str_in_output``, the stop string (or stop token's text) kept in the
    text."""

    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None
    n: int = 1
    prompt_logprobs: int | None = None
    include_stop_str: bool = False


def limit_field(body: Mapping[str, Any]) -> str:
    """The field a request's output limit is read from: ``max_completion_tokens`` where
    given (not null), else ``max_tokens``."""
    return "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"


def read_params(body: Mapping[str, Any], api: Api) -> GenerationParams:
    """A generation request's parameters for ``api``, checked as vLLM checks them: the
    types of the fields above and of the sampling fields the output does not depend on
    (``temperature``, ``top_p``, ``top_k``, ``min_p``, the penalties, ``seed``), and
    their ranges. ``APIError`` 400 with the first fault found."""
    stream = read_bool(body, "stream", False)
    include_usage = _read_stream_options(body, stream)
    limit = limit_field(body)
    max_tokens = _read_int(body, limit)
    if max_tokens is not None and max_tokens < 1:
        raise APIError(400, f"{limit} must be at least 1, got {max_tokens}.", param=limit)
    min_tokens = _read_int(body, "min_tokens") or 0
    if min_tokens < 0:
        raise APIError(400, f"min_tokens must be greater than or equal to 0, got {min_tokens}.", param="min_tokens")
    if max_tokens is not None and min_tokens > max_tokens:
        raise APIError(
            400, f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.", param="min_tokens"
        )
    n = _read_int(body, "n")
    if n is not None and n < 1:
        raise APIError(400, f"n must be at least 1, got {n}.", param="n")
    _check_sampling(body)
    logprobs, prompt_logprobs = _read_logprobs(body, api, stream)
    return GenerationParams(
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=read_bool(body, "ignore_eos", False),
        stop=_read_stop(body),
        stop_token_ids=_read_stop_token_ids(body),
        logprobs=logprobs,
        n=1 if n is None else n,
        prompt_logprobs=prompt_logprobs,
        include_stop_str=read_bool(body, "include_stop_str_in_output", False),
    )


def _read_stream_options(body: Mapping[str, Any], stream: bool) -> bool:
    """``stream_options.include_usage``."""
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise _invalid("stream_options", "dictionary")
    if opts and not stream:
        raise APIError(400, "Stream options can only be defined when `stream=True`.", param="stream_options")
    read_bool(opts, "continuous_usage_stats", False)
    try:
        return read_bool(opts, "include_usage", False)
    except APIError:
        raise _invalid("stream_options.include_usage", "boolean") from None


def _check_sampling(body: Mapping[str, Any]) -> None:
    """The sampling fields that change which tokens a real model draws, not how many:
    the simulated model's text does not depend on them, but vLLM refuses the same values."""

    def refuse(name: str, rule: str, value: float | int) -> APIError:
        return APIError(400, f"{name} must {rule}, got {value}.", param=name)

    temperature = _read_number(body, "temperature")
    if temperature is not None:
        if not _finite(temperature):
            raise refuse("temperature", "be a finite number", temperature)
        if temperature < 0:
            raise refuse("temperature", "be non-negative", temperature)
        if temperature > 2:
            raise refuse("temperature", "be in [0, 2]", temperature)
    top_p = _read_number(body, "top_p")
    if top_p is not None and not 0 < top_p <= 1:
        raise refuse("top_p", "be in (0, 1]", top_p)
    top_k = _read_int(body, "top_k")
    if top_k is not None and top_k < -1:
        raise refuse("top_k", "be 0 (disable), or at least 1", top_k)
    min_p = _read_number(body, "min_p")
    if min_p is not None and not 0 <= min_p <= 1:
        raise refuse("min_p", "be in [0, 1]", min_p)
    for name in ("presence_penalty", "frequency_penalty"):
        penalty = _read_number(body, name)
        if penalty is not None and not -2 <= penalty <= 2:
            raise refuse(name, "be in [-2, 2]", penalty)
    repetition = _read_number(body, "repetition_penalty")
    if repetition is not None:
        if not _finite(repetition):
            raise refuse("repetition_penalty", "be a finite number", repetition)
        if repetition <= 0:
            raise refuse("repetition_penalty", "be greater than zero", repetition)
    _read_int(body, "seed")


def _read_stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise APIError(400, "stop: Input should be a valid string or a list of strings", param="stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise APIError(
            400, f"stop: List should have at most {MAX_STOP_STRINGS} items after validation, not {len(stops)}", param="stop"
        )
    if not all(stops):
        raise APIError(400, "stop cannot contain an empty string.", param="stop")
    return tuple(stops)


def _read_stop_token_ids(body: Mapping[str, Any]) -> tuple[int, ...]:
    ids = body.get("stop_token_ids")
    if ids is None:
        return ()
    if not isinstance(ids, list) or not all(type(t) is int and _INT64_MIN <= t <= _INT64_MAX for t in ids):
        raise APIError(400, "stop_token_ids must contain only integers.", param="stop_token_ids")
    return tuple(ids)


def _read_logprobs(body: Mapping[str, Any], api: Api, stream: bool) -> tuple[int | None, int | None]:
    """(alternatives per generated token, or None for no log-probabilities; the
    ``prompt_logprobs`` asked for)."""

    def count(name: str) -> int | None:
        value = body.get(name)
        if value is None:
            return None
        if type(value) is not int or not _INT64_MIN <= value <= _INT64_MAX:
            raise APIError(400, f"`{name}` must be an integer.", param=name)
        if value < -1:
            raise APIError(400, f"`{name}` must be a positive value or -1.", param=name)
        return value

    prompt_logprobs = count("prompt_logprobs")
    if prompt_logprobs is not None and stream and prompt_logprobs != 0:
        raise APIError(400, "`prompt_logprobs` are not available when `stream=True`.", param="prompt_logprobs")
    if api == "chat":
        top = count("top_logprobs") or 0
        wanted = read_bool(body, "logprobs", False)
        if top != 0 and not wanted:
            raise APIError(400, "when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")
        n = top if wanted else None
    else:
        n = count("logprobs")
    if n is not None and (n == -1 or n > MAX_LOGPROBS):
        asked = "the whole vocabulary (-1)" if n == -1 else str(n)
        raise APIError(
            400, f"Requested sample logprobs of {asked}, which is greater than max allowed: {MAX_LOGPROBS}",
            param="top_logprobs" if api == "chat" else "logprobs",
        )
    return n, prompt_logprobs
