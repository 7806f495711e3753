"""The simulated server as strict as vLLM, over real loopback HTTP: what it refuses (with
vLLM's messages, in OpenAI's error format, never a 5xx), stop strings and stop token ids,
logprobs, ``/tokenize``'s flags, ``/version`` and ``/ping``, and vLLM's request
histograms in ``/metrics``.

Every assertion is about content, counts or statuses; none is about how long anything
took on the wall clock.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import socket
import time
from typing import Any

import httpx
import pytest
from aiohttp import web
from aiohttp.http_exceptions import TransferEncodingError
from prometheus_client.parser import text_string_to_metric_families
from simserver import MODEL
from test_sim_server import metric, parse_prometheus, scrape, sse_events, words

from inferlab.openai.errors import APIError
from inferlab.sim.server.app import ServerConfig, _json_body
from inferlab.sim.server.launch import EmbeddedServer
from inferlab.sim.server.output import OutputText
from inferlab.workload.builtin_tokenizer import BuiltinTokenizer

SOCKET_TIMEOUT_S = 10.0
CHAT = [{"role": "user", "content": "Say something about retrieval."}]
OUTPUT = OutputText(BuiltinTokenizer())


def check_error(r: httpx.Response, status: int, message: str | None = None, param: str | None = None) -> dict[str, Any]:
    """``r`` is an OpenAI error body with ``status``; its message starts with ``message``."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err: dict[str, Any] = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    assert isinstance(err["message"], str) and err["message"]
    if message is not None:
        assert err["message"].startswith(message), err["message"]
    if param is not None:
        assert err["param"] == param
    return err


# --- what vLLM refuses ---------------------------------------------------------------

REFUSED = [
    # (route, fields added to a valid request, message, param)
    ("chat", {"n": 2}, "n must be 1: the simulated server answers with one choice, got 2.", "n"),
    ("completions", {"n": 0}, "n must be at least 1, got 0.", "n"),
    ("chat", {"temperature": -1}, "temperature must be non-negative, got -1.", "temperature"),
    ("completions", {"temperature": "warm"}, "temperature: Input should be a valid number", "temperature"),
    ("chat", {"top_p": 0}, "top_p must be in (0, 1], got 0.", "top_p"),
    ("completions", {"top_p": 1.01}, "top_p must be in (0, 1], got 1.01.", "top_p"),
    ("chat", {"seed": 1.5}, "seed: Input should be a valid integer", "seed"),
    ("completions", {"seed": "7"}, "seed: Input should be a valid integer", "seed"),
    ("chat", {"min_tokens": -1}, "min_tokens must be greater than or equal to 0, got -1.", "min_tokens"),
    ("completions", {"max_tokens": 3, "min_tokens": 4}, "min_tokens must be less than or equal to max_tokens=3, got 4.", "min_tokens"),
    ("chat", {"max_tokens": 0}, "max_tokens must be at least 1, got 0.", "max_tokens"),
    ("chat", {"ignore_eos": "yes"}, "ignore_eos: Input should be a valid boolean", "ignore_eos"),
    ("chat", {"top_k": "5"}, "top_k: Input should be a valid integer", "top_k"),
    ("chat", {"presence_penalty": 9}, "presence_penalty must be in [-2, 2], got 9.", "presence_penalty"),
    ("chat", {"stop": ""}, "stop cannot contain an empty string.", "stop"),
    ("completions", {"stop": [1]}, "stop: Input should be a valid string or a list of strings", "stop"),
    ("chat", {"top_logprobs": 2}, "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "Requested sample logprobs of 21, which is greater than max allowed: 20", "top_logprobs"),
    ("completions", {"logprobs": True}, "`logprobs` must be an integer.", "logprobs"),
    ("completions", {"prompt_logprobs": 1}, "prompt_logprobs is not supported by the simulated server.", "prompt_logprobs"),
    ("chat", {"stream_options": {"include_usage": True}}, "Stream options can only be defined when `stream=True`.", "stream_options"),
    ("chat", {"add_generation_prompt": True, "continue_final_message": True}, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.", None),
    ("chat", {"add_generation_prompt": False, "continue_final_message": True}, "continue_final_message is not supported", "continue_final_message"),
    ("chat", {"add_special_tokens": 1}, "add_special_tokens: Input should be a valid boolean", "add_special_tokens"),
    ("chat", {"model": 7}, "model: Input should be a valid string", "model"),
    ("chat", {"messages": []}, "'messages' must be a non-empty list of message objects", "messages"),
    ("chat", {"messages": [{}]}, "unknown message role None", "messages[0].role"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text: Input should be a valid string", "messages[0].content"),
    ("completions", {"prompt": ""}, "Either prompt or prompt_embeds must be provided and non-empty.", "prompt"),
]


def valid(route: str, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 4}
    body.update({"messages": CHAT} if route == "chat" else {"prompt": words(12, seed=30)})
    body.update(fields)
    return body


PATH = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@pytest.mark.parametrize(("route", "fields", "message", "param"), REFUSED)
def test_refused_as_vllm_refuses(http: httpx.Client, route: str, fields: dict[str, Any], message: str, param: str | None) -> None:
    check_error(http.post(PATH[route], json=valid(route, **fields)), 400, message, param)


@pytest.mark.parametrize("model", [None, "", MODEL])
def test_no_model_named_means_the_served_one(http: httpx.Client, model: str | None) -> None:
    assert http.post(PATH["completions"], json=valid("completions", model=model)).status_code == 200
    assert http.post("/tokenize", json={"model": model, "prompt": "hi"}).status_code == 200


def test_what_vllm_accepts_is_accepted(http: httpx.Client) -> None:
    fields = {
        "temperature": 0.7, "top_p": 0.9, "top_k": 50, "min_p": 0.05, "seed": 123, "n": 1,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
        "stop": [], "stop_token_ids": [], "logprobs": False, "stream_options": {}, "user": "u",
    }
    r = http.post(PATH["chat"], json=valid("chat", **fields))
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 4


_TOOL = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]


@pytest.mark.parametrize(("route", "fields", "param"), [
    ("chat", {"tools": _TOOL}, "tools"),
    ("chat", {"tool_choice": "required"}, "tool_choice"),
    ("chat", {"response_format": {"type": "json_object"}}, "response_format"),
    ("completions", {"guided_json": {"type": "object"}}, "guided_json"),
    ("completions", {"echo": True}, "echo"),
    ("completions", {"best_of": 3}, "best_of"),
    ("chat", {"use_beam_search": True}, "use_beam_search"),
    ("chat", {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}, "stream_options"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
     "messages"),
])
def test_what_the_simulated_server_would_take_and_not_honour_is_refused(
    http: httpx.Client, route: str, fields: dict[str, Any], param: str
) -> None:
    """Each was answered 200 with the usual prose: no tool call even when one was
    required, no JSON for a JSON format, no echo, an image counted as no tokens, no
    usage in the chunks. A 400 naming the parameter now; the same request without it is
    served, and a plain text format or tool_choice "none" still is."""
    err = check_error(http.post(PATH[route], json=valid(route, **fields)), 400, param=param)
    assert "not simulated" in err["message"], err["message"]
    assert http.post(PATH[route], json=valid(route)).status_code == 200
    for ok in ({"response_format": {"type": "text"}}, {"tool_choice": "none"}, {"best_of": 1}, {"echo": False}):
        assert http.post(PATH[route], json=valid(route, **ok)).status_code == 200, ok


@pytest.mark.parametrize(("fields", "param"), [
    ({"tools": _TOOL}, "tools"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
     "messages"),
])
def test_tokenize_refuses_what_it_would_count_as_no_tokens(http: httpx.Client, fields: dict[str, Any], param: str) -> None:
    """``/tokenize`` counted chat messages without their tools' definitions, and an
    image as no tokens: a count the generation routes (which refuse both) would never
    see. Refused as they are, naming the parameter; the messages alone still count."""
    body = {"messages": [{"role": "user", "content": "hi"}], **fields}
    err = check_error(http.post("/tokenize", json=body), 400, param=param)
    assert "not simulated" in err["message"], err["message"]
    assert http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()["count"] > 0


# --- no 5xx for what a client sends ------------------------------------------------


def test_lone_surrogate_is_a_400(http: httpx.Client) -> None:
    raw = b'{"prompt": "\\ud800"}'
    for path in ("/tokenize", "/v1/completions"):
        r = http.post(path, content=raw, headers={"Content-Type": "application/json"})
        check_error(r, 400, "request body holds text that is not valid Unicode")


def test_huge_nesting_is_a_400(http: httpx.Client) -> None:
    r = http.post(PATH["chat"], content=b"[" * 100_000, headers={"Content-Type": "application/json"})
    check_error(r, 400, "request body is not valid JSON: it is nested too deeply")


def test_unknown_charset_is_a_400(http: httpx.Client) -> None:
    r = http.post(PATH["chat"], content=b"{}", headers={"Content-Type": "application/json; charset=no-such"})
    check_error(r, 400, "unsupported charset 'no-such'")


def test_the_body_is_read_as_sent_whatever_its_content_encoding(http: httpx.Client) -> None:
    """As vLLM's server: a plain body labelled gzip is read as it is; a gzipped one is not
    JSON. Neither is a 500."""
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    plain = json.dumps(valid("chat")).encode()
    assert http.post(PATH["chat"], content=plain, headers=headers).status_code == 200
    check_error(http.post(PATH["chat"], content=gzip.compress(plain), headers=headers), 400, "request body is not valid JSON")


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "text/plain"])
@pytest.mark.parametrize("path", [PATH["chat"], PATH["completions"], "/tokenize", "/detokenize"])
def test_a_body_not_labelled_json_is_refused_as_vllm_refuses_it(
    http: httpx.Client, path: str, content_type: str | None
) -> None:
    """It was read as JSON whatever its label (curl's ``-d`` sends a form type): a client
    that forgot the header worked here and got a 400 from vLLM. vLLM's 400 and message
    now; JSON with a charset, or its type in capitals, is still JSON."""
    route = "chat" if path == PATH["chat"] else "completions"
    body = {"tokens": [1, 2]} if path == "/detokenize" else valid(route)
    raw = json.dumps(body).encode()
    headers = {} if content_type is None else {"Content-Type": content_type}
    check_error(http.post(path, content=raw, headers=headers), 400,
                "Unsupported Media Type: Only 'application/json' is allowed")
    for ok in ("application/json; charset=utf-8", "Application/JSON"):
        assert http.post(path, content=raw, headers={"Content-Type": ok}).status_code == 200, ok


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("GET", PATH["chat"], "POST"), ("PUT", PATH["completions"], "POST"), ("DELETE", "/v1/models", "GET"),
])
def test_a_method_a_route_does_not_take_is_a_405_that_says_which_it_takes(
    http: httpx.Client, method: str, path: str, allowed: str
) -> None:
    """The 405 came without the ``Allow`` header HTTP requires (vLLM's has it)."""
    r = http.request(method, path)
    check_error(r, 405)
    assert allowed in {m.strip() for m in r.headers["allow"].split(",")}


def raw_exchange(server: EmbeddedServer, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection; read all that comes back until the server
    closes it (it does after an error)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=SOCKET_TIMEOUT_S) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


BROKEN_FRAMING = [
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    b"NOT-HTTP\r\n\r\n",
]


@pytest.mark.parametrize("data", BROKEN_FRAMING)
def test_broken_framing_is_a_400_without_a_traceback(
    server: EmbeddedServer, data: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    answer = raw_exchange(server, data)
    assert answer.startswith((b"HTTP/1.0 400", b"HTTP/1.1 400")), answer[:200]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert any("Error handling request" in r.getMessage() for r in caplog.records)


def test_a_body_cut_short_mid_chunk_is_not_a_500(server: EmbeddedServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    answer = raw_exchange(server, head + b"5\r\n{\"pro\r\nzz\r\n")
    assert answer.startswith((b"HTTP/1.0 4", b"HTTP/1.1 4")), answer[:200]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


class _BrokenBody:
    """A request whose body reading fails as aiohttp fails it."""

    charset = None
    content_type = "application/json"

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def read(self) -> bytes:
        raise self.error


@pytest.mark.parametrize(
    "error",
    [
        TransferEncodingError("Not enough data to satisfy transfer length header."),  # pure-Python parser
        web.RequestPayloadError("Response payload is not completed"),  # C parser
    ],
)
async def test_a_body_that_cannot_be_read_is_a_400(error: Exception) -> None:
    # (over a socket, aiohttp's C parser reports a chunk broken mid-body to no handler:
    # the request waits until the client closes; its pure-Python parser raises this)
    with pytest.raises(APIError) as e:
        await _json_body(_BrokenBody(error))  # type: ignore[arg-type]
    assert e.value.status == 400 and e.value.message.startswith("the request body could not be read")


# --- stop strings and stop token ids ---------------------------------------------------


def test_stop_string_ends_the_answer_before_it(http: httpx.Client) -> None:
    full = OUTPUT.text(0, 5000)
    stop = " passages"
    at = full.index(stop)
    expected = OUTPUT.stop([stop], [], 0)
    assert expected is not None
    body = valid("completions", max_tokens=500, ignore_eos=True, stop=[" nowhere at all", stop])
    r = http.post(PATH["completions"], json=body).json()
    choice = r["choices"][0]
    assert choice["text"] == full[:at]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert r["usage"]["completion_tokens"] == expected.tokens  # what the engine generated


def test_stop_string_in_a_stream_never_shows_and_matches_the_whole_answer(http: httpx.Client) -> None:
    stop = "prefill"
    body = valid("chat", max_tokens=1000, ignore_eos=True, stop=stop, stream=True, stream_options={"include_usage": True})
    with http.stream("POST", PATH["chat"], json=body) as r:
        chunks = [json.loads(p) for p in sse_events(b"".join(r.iter_raw()).decode())[:-1]]
    deltas = [c["choices"][0]["delta"]["content"] for c in chunks if c["choices"] and "delta" in c["choices"][0]]
    text = "".join(deltas)
    assert stop not in text and all(stop not in d for d in deltas)
    whole = http.post(PATH["chat"], json={**body, "stream": False, "stream_options": None}).json()
    assert text == whole["choices"][0]["message"]["content"] == OUTPUT.text(0, OUTPUT.text(0, 10_000).index(stop))
    finish = chunks[-2]["choices"][0]
    assert finish["finish_reason"] == "stop" and finish["stop_reason"] == stop
    expected = OUTPUT.stop([stop], [], 0)
    assert expected is not None
    # one delta per token after the role chunk, the last with the finish reason
    assert chunks[-1]["usage"]["completion_tokens"] == expected.tokens == len(deltas) - 1


def test_min_tokens_defers_a_stop_string(http: httpx.Client) -> None:
    early = OUTPUT.stop(["."], [], 0)
    assert early is not None
    body = valid("completions", max_tokens=300, min_tokens=early.tokens, stop=".")
    r = http.post(PATH["completions"], json=body).json()
    late = OUTPUT.stop(["."], [], early.tokens)
    assert late is not None and r["usage"]["completion_tokens"] == late.tokens > early.tokens
    assert r["choices"][0]["text"] == OUTPUT.text(0, late.text_chars)


def test_a_stop_past_max_tokens_does_not_stop(http: httpx.Client) -> None:
    body = valid("completions", max_tokens=3, ignore_eos=True, stop=["learned"])
    r = http.post(PATH["completions"], json=body).json()
    assert r["choices"][0]["finish_reason"] == "length" and r["choices"][0]["stop_reason"] is None
    assert r["choices"][0]["text"] == OUTPUT.text(0, OUTPUT.chars(3))


#: The keys of each choice as vLLM 0.32's CPU build wrote them (``--max-tokens`` ended the
#: answer, no stop did), less the token-id fields it writes null unless asked
#: (``token_ids``, ``prompt_token_ids``, ``prompt_logprobs``, ``routed_experts``) and the
#: chat message's null fields. ``stop_reason`` is null on the finishing choice and on every
#: text-completion chunk, absent from a chat stream's other chunks.
VLLM_CHOICE_KEYS = {
    ("completions", False): [("index", "text", "logprobs", "finish_reason", "stop_reason")],
    ("chat", False): [("index", "message", "logprobs", "finish_reason", "stop_reason")],
    ("completions", True): [("index", "text", "logprobs", "finish_reason", "stop_reason")] * 4,
    ("chat", True): [("index", "delta", "logprobs", "finish_reason")] * 4
                    + [("index", "delta", "logprobs", "finish_reason", "stop_reason")],
}


@pytest.mark.parametrize(("route", "stream"), list(VLLM_CHOICE_KEYS))
def test_stop_reason_is_null_where_vllm_writes_it_null(http: httpx.Client, route: str, stream: bool) -> None:
    """No stop ended the answer: vLLM writes ``"stop_reason": null``; the key was left out."""
    body = valid(route, ignore_eos=True, stream=stream)
    if stream:
        with http.stream("POST", PATH[route], json=body) as r:
            choices = [json.loads(p)["choices"][0] for p in sse_events(b"".join(r.iter_raw()).decode())[:-1]]
    else:
        choices = http.post(PATH[route], json=body).json()["choices"]
    assert [tuple(c) for c in choices] == VLLM_CHOICE_KEYS[route, stream]
    assert choices[-1]["finish_reason"] == "length" and all(c.get("stop_reason") is None for c in choices)


def test_stop_token_id_ends_the_answer_without_its_text(http: httpx.Client) -> None:
    token = BuiltinTokenizer().output_token(6)
    expected = OUTPUT.stop([], [token], 0)
    assert expected is not None and expected.tokens <= 7
    r = http.post(PATH["completions"], json=valid("completions", max_tokens=50, ignore_eos=True, stop_token_ids=[token])).json()
    assert r["choices"][0]["finish_reason"] == "stop" and r["choices"][0]["stop_reason"] == token
    assert r["usage"]["completion_tokens"] == expected.tokens
    assert r["choices"][0]["text"] == OUTPUT.text(0, OUTPUT.chars(expected.tokens - 1))


# --- logprobs ------------------------------------------------------------------------


def test_chat_logprobs_streamed_and_whole_agree(http: httpx.Client) -> None:
    body = valid("chat", max_tokens=5, ignore_eos=True, logprobs=True, top_logprobs=3)
    whole = http.post(PATH["chat"], json=body).json()["choices"][0]
    content = whole["logprobs"]["content"]
    assert [c["token"] for c in content] == [OUTPUT.pieces[i] for i in range(5)]
    assert "".join(c["token"] for c in content) == whole["message"]["content"]
    for c in content:
        assert c["bytes"] == list(c["token"].encode()) and c["logprob"] < 0
        assert len(c["top_logprobs"]) == 3 and c["top_logprobs"][0]["token"] == c["token"]
        assert sum(math.exp(t["logprob"]) for t in c["top_logprobs"]) <= 1
    with http.stream("POST", PATH["chat"], json={**body, "stream": True}) as r:
        chunks = [json.loads(p) for p in sse_events(b"".join(r.iter_raw()).decode())[:-1]]
    streamed = [e for c in chunks if c["choices"] and c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == content


def test_completion_logprobs_are_the_legacy_format(http: httpx.Client) -> None:
    r = http.post(PATH["completions"], json=valid("completions", max_tokens=4, ignore_eos=True, logprobs=2)).json()
    lp = r["choices"][0]["logprobs"]
    assert lp["tokens"] == [OUTPUT.pieces[i] for i in range(4)]
    assert lp["text_offset"] == [OUTPUT.chars(i) for i in range(4)]
    assert len(lp["token_logprobs"]) == 4 and all(x < 0 for x in lp["token_logprobs"])
    assert all(len(top) == 2 and top[t] == x for top, t, x in zip(lp["top_logprobs"], lp["tokens"], lp["token_logprobs"], strict=True))


def test_no_logprobs_unless_asked(http: httpx.Client) -> None:
    r = http.post(PATH["completions"], json=valid("completions", max_tokens=2)).json()
    assert r["choices"][0]["logprobs"] is None


# --- /tokenize, /version, /ping ----------------------------------------------------------


def test_tokenize_honours_add_generation_prompt(http: httpx.Client) -> None:
    default = http.post("/tokenize", json={"messages": CHAT}).json()
    with_prompt = http.post("/tokenize", json={"messages": CHAT, "add_generation_prompt": True}).json()
    without = http.post("/tokenize", json={"messages": CHAT, "add_generation_prompt": False}).json()
    assert default == with_prompt
    assert without["tokens"] == with_prompt["tokens"][: without["count"]] and without["count"] < with_prompt["count"]
    text = http.post("/detokenize", json={"tokens": without["tokens"]}).json()["prompt"]
    assert text == f"<|im_start|>user\n{CHAT[0]['content']}<|im_end|>\n"
    # the chat API's prompt follows the same flag
    usage = http.post(PATH["chat"], json=valid("chat", max_tokens=1, add_generation_prompt=False)).json()["usage"]
    assert usage["prompt_tokens"] == without["count"]


def test_tokenize_checks_add_special_tokens(http: httpx.Client) -> None:
    plain = http.post("/tokenize", json={"prompt": "hello world"}).json()
    for flag in (True, False):
        assert http.post("/tokenize", json={"prompt": "hello world", "add_special_tokens": flag}).json() == plain
    check_error(http.post("/tokenize", json={"prompt": "x", "add_special_tokens": "no"}), 400, "add_special_tokens: Input should be a valid boolean")
    check_error(http.post("/tokenize", json={"messages": CHAT, "add_generation_prompt": 0}), 400, "add_generation_prompt: Input should be a valid boolean")


def test_tokenize_refuses_token_strings_it_cannot_give(http: httpx.Client) -> None:
    """``return_token_strs`` was ignored: the answer had no ``token_strs``, as if not
    asked. Refused, naming it; false is still served."""
    err = check_error(http.post("/tokenize", json={"prompt": "hello world", "return_token_strs": True}), 400,
                      param="return_token_strs")
    assert "not simulated" in err["message"]
    assert http.post("/tokenize", json={"prompt": "hello world", "return_token_strs": False}).json()["count"] > 0


def test_version_and_ping(http: httpx.Client) -> None:
    version = http.get("/version").json()
    assert list(version) == ["version"] and isinstance(version["version"], str) and version["version"]
    assert http.get("/ping").status_code == 200
    assert http.post("/ping").status_code == 200


# --- /metrics ------------------------------------------------------------------------

NEW_HISTOGRAMS = [
    "vllm:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:request_params_max_tokens",
    "vllm:iteration_tokens_total",
]


def test_metrics_have_vllms_request_histograms(http: httpx.Client) -> None:
    before = scrape(http)
    prompt_tokens, out_tokens = 23, 7
    body = {"model": MODEL, "prompt": words(prompt_tokens, seed=31), "max_tokens": out_tokens, "ignore_eos": True}
    assert http.post(PATH["completions"], json=body).status_code == 200
    text = http.get("/metrics").text
    after = parse_prometheus(text)
    for name in NEW_HISTOGRAMS:
        assert f"# TYPE {name} histogram" in text

    def delta(name: str) -> float:
        return metric(after, name) - metric(before, name)

    assert delta("vllm:inter_token_latency_seconds_count") == out_tokens - 1
    assert delta("vllm:time_per_output_token_seconds_count") == out_tokens - 1
    assert delta("vllm:inter_token_latency_seconds_sum") > 0
    for name in ("request_time_per_output_token", "request_queue_time", "request_prefill_time",
                 "request_decode_time", "request_inference_time"):
        assert delta(f"vllm:{name}_seconds_count") == 1
    assert delta("vllm:request_prefill_time_seconds_sum") > 0
    assert delta("vllm:request_decode_time_seconds_sum") > 0
    assert delta("vllm:request_prompt_tokens_sum") == prompt_tokens
    assert delta("vllm:request_generation_tokens_sum") == out_tokens
    assert delta("vllm:request_params_max_tokens_sum") == out_tokens
    assert delta("vllm:iteration_tokens_total_sum") == prompt_tokens + out_tokens  # computed + emitted
    # decode time spreads over the tokens after the first (vLLM's per-request TPOT)
    tpot = delta("vllm:request_time_per_output_token_seconds_sum")
    assert tpot == pytest.approx(delta("vllm:request_decode_time_seconds_sum") / (out_tokens - 1))


#: A served name with each character the text format escapes in a label value.
ODD_NAME = 'my"mo\\del\nv2'


def test_metrics_label_every_sample_as_vllm_does_whatever_the_served_name() -> None:
    """vLLM V1 labels its engine's samples ``engine="0"`` beside ``model_name`` (as its
    0.32 CPU build writes them); a name with a quote, a backslash or a newline was
    written raw, and Prometheus refused the whole page. Read here by prometheus_client's
    own parser, not ours."""
    with EmbeddedServer(ServerConfig(served_model_name=ODD_NAME)) as sim, \
            httpx.Client(base_url=sim.url, timeout=SOCKET_TIMEOUT_S) as http:
        body = {"model": ODD_NAME, "prompt": "hello", "max_tokens": 3, "ignore_eos": True}
        assert http.post(PATH["completions"], json=body).status_code == 200
        families = list(text_string_to_metric_families(http.get("/metrics").text))
    samples = [s for f in families for s in f.samples]
    assert {f.name for f in families} >= {"vllm:num_requests_running", "vllm:time_to_first_token_seconds"}
    for s in samples:
        assert {k: v for k, v in s.labels.items() if k not in ("le", "finished_reason")} == \
            {"engine": "0", "model_name": ODD_NAME}, s
    assert sum(s.value for s in samples if s.name == "vllm:request_success_total") == 1


def finished(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> dict[str, float]:
    """``vllm:request_success_total`` by its ``finished_reason`` label."""
    return {dict(labels).get("finished_reason", ""): v for (name, labels), v in samples.items()
            if name == "vllm:request_success_total"}


def test_request_success_is_counted_by_vllms_finished_reason(http: httpx.Client) -> None:
    """It was one series without vLLM's ``finished_reason`` label: a dashboard's
    ``{finished_reason="stop"}`` read nothing, and a request the client abandoned counted
    nowhere. Each request now counts under the reason it ended by, as vLLM counts it."""
    before = finished(scrape(http))
    assert set(before) == {"stop", "length", "abort", "error", "repetition"}
    length = valid("completions", max_tokens=5, ignore_eos=True)
    assert http.post(PATH["completions"], json=length).json()["choices"][0]["finish_reason"] == "length"
    stop_word = OUTPUT.text(0, 40).split()[2]
    stopped = valid("completions", max_tokens=40, stop=[stop_word])
    assert http.post(PATH["completions"], json=stopped).json()["choices"][0]["finish_reason"] == "stop"
    with http.stream("POST", PATH["completions"], json=valid("completions", max_tokens=3000, ignore_eos=True,
                                                              stream=True)) as r:
        assert next(r.iter_lines()).startswith("data: ")  # running; the client goes away
    after = finished(scrape(http))
    for _ in range(100):  # (the server learns of the disconnection at its next write)
        if after["abort"] > before["abort"]:
            break
        time.sleep(0.1)
        after = finished(scrape(http))
    assert {k: after[k] - before[k] for k in after} == {"stop": 1, "length": 1, "abort": 1, "error": 0, "repetition": 0}


def test_metric_buckets_are_vllms(http: httpx.Client) -> None:
    samples = scrape(http)

    def bounds(name: str) -> list[str]:
        return [dict(lbl)["le"] for (n, lbl) in samples if n == f"{name}_bucket"]

    assert bounds("vllm:inter_token_latency_seconds") == [
        "0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "0.3", "0.4", "0.5", "0.75", "1", "2.5",
        "5", "7.5", "10", "20", "40", "80", "+Inf",
    ]
    assert bounds("vllm:request_queue_time_seconds")[-3:] == ["1920", "7680", "+Inf"]
    assert bounds("vllm:time_to_first_token_seconds")[-4:] == ["160", "640", "2560", "+Inf"]
    assert bounds("vllm:request_prompt_tokens") == ["1", "2", "5", "10", "20", "50", "100", "200", "500", "1000", "2000", "+Inf"]
    assert bounds("vllm:iteration_tokens_total")[-2:] == ["16384", "+Inf"]


# --- fields that were accepted and ignored --------------------------------------------


@pytest.mark.parametrize(("route", "fields", "param", "message"), [
    ("chat", {"echo": True}, "echo", None),
    ("completions", {"suffix": "the end"}, "suffix", "suffix is not currently supported"),
    ("completions", {"truncate_prompt_tokens": 3}, "truncate_prompt_tokens", None),
    ("chat", {"truncate_prompt_tokens": 3}, "truncate_prompt_tokens", None),
    ("completions", {"logit_bias": {"1": -100}}, "logit_bias", None),
    ("chat", {"allowed_token_ids": [1, 2]}, "allowed_token_ids", None),
    ("chat", {"bad_words": ["retrieval"]}, "bad_words", None),
    ("completions", {"cache_salt": "s3cret"}, "cache_salt", None),
    ("completions", {"logprobs": 1, "return_tokens_as_token_ids": True}, "return_tokens_as_token_ids", None),
    ("completions", {"return_token_ids": True}, "return_token_ids", None),
    ("chat", {"chat_template": "{{ messages[0].content }}"}, "chat_template", None),
    ("chat", {"chat_template_kwargs": {"enable_thinking": True}}, "chat_template_kwargs", None),
    ("chat", {"documents": [{"title": "t", "text": "x"}]}, "documents", None),
    ("chat", {"reasoning_effort": "high"}, "reasoning_effort", None),
    ("completions", {"structural_tag": "{}"}, "structural_tag", None),
    ("completions", {"logits_processors": ["m.P"]}, "logits_processors", "The `logits_processors` argument is not supported"),
    ("chat", {"priority": 5}, "priority", "Got priority 5 but Priority scheduling is not enabled."),
    ("completions", {"prompt": ["one prompt", "another"]}, "prompt", "prompt: a batch of 2 prompts"),
    ("completions", {"prompt": [[1, 2], [3, 4], [5]]}, "prompt", "prompt: a batch of 3 prompts"),
])
def test_a_field_that_would_change_the_answer_is_refused_not_ignored(
    http: httpx.Client, route: str, fields: dict[str, Any], param: str, message: str | None
) -> None:
    """Each was answered 200 as if it had not been sent: chat echo without the echo, a
    suffix, a prompt not truncated, bad words written, a salt that salted nothing, a
    priority that scheduled nothing, ... A 400 naming the field now (vLLM's own message
    where vLLM refuses it too); the neutral values are still served."""
    err = check_error(http.post(PATH[route], json=valid(route, **fields)), 400, message, param)
    if message is None:
        assert "not simulated" in err["message"], err["message"]
    neutral = {"echo": False, "logit_bias": {}, "bad_words": [], "priority": 0, "return_token_ids": False,
               "chat_template_kwargs": {}}
    for key, value in neutral.items():
        assert http.post(PATH[route], json=valid(route, **{key: value})).status_code == 200, key


@pytest.mark.parametrize("stream", [False, True])
def test_include_stop_str_in_output_keeps_the_stop_string(http: httpx.Client, stream: bool) -> None:
    """It was ignored: the text ended before the stop string all the same. vLLM keeps
    the stop string (the text cut right after it), with the same tokens generated."""
    stop = " passages"
    expected = OUTPUT.stop([stop], [], 0)
    assert expected is not None
    body = valid("completions", max_tokens=500, ignore_eos=True, stop=[stop], include_stop_str_in_output=True)
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
        with http.stream("POST", PATH["completions"], json=body) as r:
            chunks = [json.loads(p) for p in sse_events(b"".join(r.iter_raw()).decode())[:-1]]
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        finish = chunks[-2]["choices"][0]
        usage = chunks[-1]["usage"]
    else:
        r = http.post(PATH["completions"], json=body).json()
        text, finish, usage = r["choices"][0]["text"], r["choices"][0], r["usage"]
    assert text == OUTPUT.text(0, expected.text_chars + len(stop)) and text.endswith(stop)
    assert finish["finish_reason"] == "stop" and finish["stop_reason"] == stop
    assert usage["completion_tokens"] == expected.tokens


def test_include_stop_str_in_output_keeps_a_stop_tokens_text(http: httpx.Client) -> None:
    token = BuiltinTokenizer().output_token(6)
    expected = OUTPUT.stop([], [token], 0)
    assert expected is not None
    body = valid("completions", max_tokens=50, ignore_eos=True, stop_token_ids=[token], include_stop_str_in_output=True)
    r = http.post(PATH["completions"], json=body).json()
    assert r["choices"][0]["stop_reason"] == token
    assert r["choices"][0]["text"] == OUTPUT.text(0, OUTPUT.chars(expected.tokens))


@pytest.mark.parametrize(("route", "prefix"), [("chat", "chatcmpl-"), ("completions", "cmpl-")])
def test_request_id_names_the_answer(http: httpx.Client, route: str, prefix: str) -> None:
    """vLLM makes the answer's id of the request's ``request_id``; it was ignored."""
    assert http.post(PATH[route], json=valid(route, request_id="abc-1")).json()["id"] == prefix + "abc-1"
    check_error(http.post(PATH[route], json=valid(route, request_id=7)), 400, param="request_id")


def test_a_completions_request_without_max_tokens_gets_vllms_16(http: httpx.Client) -> None:
    """vLLM's completions API answers a request that gives no max_tokens in at most 16
    tokens (``CompletionRequest.max_tokens = 16``); the simulated server answered in the
    model's natural length, and honoured the chat field max_completion_tokens, which
    vLLM's completions API ignores."""
    body = {k: v for k, v in valid("completions", ignore_eos=True).items() if k != "max_tokens"}
    r = http.post(PATH["completions"], json=body).json()
    assert r["usage"]["completion_tokens"] == 16 and r["choices"][0]["finish_reason"] == "length"
    # an explicit null is vLLM's "the context that is left"
    long = http.post(PATH["completions"], json={**body, "max_tokens": None, "ignore_eos": False, "min_tokens": 40}).json()
    assert long["usage"]["completion_tokens"] >= 40
    check_error(http.post(PATH["completions"], json={**body, "max_completion_tokens": 40}), 400, param="max_completion_tokens")
    check_error(http.post(PATH["completions"], json={**body, "min_tokens": 20}), 400,
                "min_tokens must be less than or equal to max_tokens=16", "min_tokens")
