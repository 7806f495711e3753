"""Fuzzing the simulated server: whatever a client sends, it answers with no 5xx, every
error it answers is OpenAI's error object, and it logs no traceback.

Property-based (Hypothesis), offline and deterministic (``derandomize``: the same
examples on every run), bounded (a few hundred requests against one in-process server on
loopback, a fast engine so the valid ones finish at once). Bodies are JSON of any shape,
requests with wrong types in every field, text with lone surrogates, deep nesting, huge
numbers, bytes that are not JSON at all, under odd content types, charsets and content
encodings, on every route; a second test breaks the HTTP framing itself.
"""

from __future__ import annotations

import gzip
import json
import logging
import socket
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
MAX_MODEL_LEN = 160  # short answers: a valid request the fuzzer happens to make ends fast
HTTP_TIMEOUT_S = 30.0
SOCKET_TIMEOUT_S = 10.0
FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    max_examples=400,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

#: Every route, the ones that read a body more often than the rest.
ROUTES = [
    *[("POST", "/v1/chat/completions")] * 6,
    *[("POST", "/v1/completions")] * 6,
    *[("POST", "/tokenize")] * 3,
    *[("POST", "/detokenize")] * 2,
    ("GET", "/v1/models"),
    ("GET", "/health"),
    ("GET", "/ping"),
    ("POST", "/ping"),
    ("GET", "/version"),
    ("GET", "/metrics"),
    ("GET", "/v1/chat/completions"),  # wrong method
    ("PUT", "/v1/completions"),
    ("DELETE", "/tokenize"),
    ("POST", "/v1/embeddings"),  # no such route
    ("POST", "/"),
]

#: Every field the routes read, and a few they do not.
FIELDS = [
    "model", "messages", "prompt", "tokens", "max_tokens", "max_completion_tokens", "min_tokens",
    "stream", "stream_options", "stop", "stop_token_ids", "temperature", "top_p", "top_k", "min_p",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "n", "logprobs",
    "top_logprobs", "prompt_logprobs", "ignore_eos", "add_generation_prompt",
    "continue_final_message", "add_special_tokens", "echo", "best_of", "user", "logit_bias",
]

_ANY_CHAR = st.characters(exclude_categories=())  # lone surrogates included
_TEXT = st.text(max_size=12) | st.text(_ANY_CHAR, max_size=6) | st.sampled_from(["", "\n", " the", "\ud800", "<|im_start|>"])
_NUMBER = st.sampled_from(
    [0, 1, -1, 2, 20, 21, 4, 2**63 - 1, 2**63, -(2**63) - 1, 10**300, 0.5, 1.0, 2.0, 2.5, -0.0,
     1e-300, float("nan"), float("inf"), float("-inf")]
) | st.integers(-(2**70), 2**70) | st.floats()
_LEAF = st.none() | st.booleans() | _NUMBER | _TEXT
_JSON = st.recursive(
    _LEAF, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4), max_leaves=12
)
_PART = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]) | _JSON, "text": _TEXT | _JSON})
_MESSAGE = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "system", "assistant", "tool", "developer", "wizard"]) | _JSON,
        "content": _TEXT | st.lists(_PART, max_size=3) | _JSON,
        "name": _JSON,
    },
)
_VALUE = {
    "messages": st.lists(_MESSAGE, max_size=3) | _JSON,
    "prompt": _TEXT | st.lists(st.integers(-5, 3000), max_size=8) | st.lists(_TEXT, max_size=2) | _JSON,
    "tokens": st.lists(st.integers(-5, 3000), max_size=8) | _JSON,
    "stop": _TEXT | st.lists(_TEXT, max_size=6) | _JSON,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": _LEAF, "continuous_usage_stats": _LEAF}) | _JSON,
    "model": st.just(MODEL) | _JSON,
}


def _base(path: str) -> dict[str, Any]:
    """A valid body for ``path`` that the fuzzer then breaks."""
    if path.endswith("chat/completions"):
        return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    if path == "/detokenize":
        return {"model": MODEL, "tokens": [300, 301]}
    return {"model": MODEL, "prompt": "the model", "max_tokens": 3}


@st.composite
def request_bodies(draw: st.DrawFn, path: str) -> Any:
    """A request-shaped object: the route's valid body with fields replaced by values of
    any type (or the right type at the edge of its range), added or removed; or any JSON."""
    if draw(st.integers(0, 9)) == 0:
        return draw(_JSON)
    body = _base(path)
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=4, unique=True)):
        body[name] = draw(_VALUE.get(name, _LEAF | _JSON))
    for name in draw(st.lists(st.sampled_from(sorted(body)), max_size=2, unique=True)):
        body.pop(name, None)
    return body


@st.composite
def payloads(draw: st.DrawFn, path: str) -> bytes:
    """The bytes of a body: JSON written in several ways, or bytes that are not JSON."""
    kind = draw(st.sampled_from(["json", "json", "json", "ascii", "truncated", "binary", "nested", "digits"]))
    if kind == "binary":
        return draw(st.binary(max_size=64))
    if kind == "nested":
        depth = draw(st.sampled_from([10, 900, 5000, 100_000]))
        opener = draw(st.sampled_from([b"[", b'{"a":', b'{"messages":[']))
        return opener * depth + draw(st.sampled_from([b"", b"1", b"]" * depth]))
    if kind == "digits":
        field = draw(st.sampled_from([b"max_tokens", b"seed", b"temperature", b"n"]))
        digits = draw(st.sampled_from([20, 400, 4300, 5000]))
        return b'{"prompt": "x", "' + field + b'": ' + draw(st.sampled_from([b"", b"-", b"0."])) + b"9" * digits + b"}"
    text = json.dumps(draw(request_bodies(path)), ensure_ascii=kind == "ascii")
    raw = text.encode("utf-8", "surrogatepass")  # a lone surrogate becomes bytes no UTF-8 decoder takes
    if kind == "truncated":
        return raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
    return raw


_CONTENT_TYPES = [
    None, "application/json", "application/json", "application/json", "application/json", "application/json; charset=utf-8", "application/json; charset=latin-1",
    "application/json; charset=utf-16", "application/json; charset=utf-7", "application/json; charset=zlib",
    "application/json; charset=no-such", "application/json; charset=", "text/plain",
    "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "multipart/form-data",
    "application/json; charset=\"utf-8\"; boundary=", ";;;", "*/*",
]
_ENCODINGS = [None, None, None, None, None, "gzip", "deflate", "br", "identity", "x-nope", "gzip, deflate"]


def _encode(raw: bytes, encoding: str | None, compress: bool) -> bytes:
    if not compress or encoding is None:
        return raw
    if encoding.startswith("gzip"):
        return gzip.compress(raw)
    if encoding == "deflate":
        return zlib.compress(raw)
    return raw


class _Records(logging.Handler):
    """Keeps every record logged while the fuzzer runs."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer]:
    engine = EngineConfig(model=MODEL, max_model_len=MAX_MODEL_LEN, api_overhead_s=0.0)
    with EmbeddedServer(ServerConfig(engine=engine, natural_output_median_tokens=4)) as srv:
        yield srv


@pytest.fixture(scope="module")
def logs() -> Iterator[_Records]:
    handler = _Records()
    aiohttp_logger = logging.getLogger("aiohttp")
    level = aiohttp_logger.level
    aiohttp_logger.addHandler(handler)
    aiohttp_logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        aiohttp_logger.removeHandler(handler)
        aiohttp_logger.setLevel(level)


@pytest.fixture(scope="module")
def client(server: EmbeddedServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=HTTP_TIMEOUT_S) as c:
        yield c


def check_answer(r: httpx.Response) -> None:
    """No 5xx; an error is OpenAI's error object with the status as its code."""
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        assert r.headers["content-type"].startswith("application/json"), r.text[:300]
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert isinstance(err["message"], str) and err["message"]
        assert isinstance(err["type"], str) and err["code"] == r.status_code
        assert err["param"] is None or isinstance(err["param"], str)


def check_logs(logs: _Records) -> None:
    bad = [r for r in logs.records if r.exc_info or r.levelno >= logging.ERROR]
    logs.records.clear()
    assert not bad, [r.getMessage() for r in bad]


@FUZZ
@given(data=st.data())
def test_no_request_gets_a_5xx_or_a_traceback(
    data: st.DataObject, server: EmbeddedServer, client: httpx.Client, logs: _Records
) -> None:
    method, path = data.draw(st.sampled_from(ROUTES), label="route")
    raw = data.draw(payloads(path), label="body")
    content_type = data.draw(st.sampled_from(_CONTENT_TYPES), label="content-type")
    encoding = data.draw(st.sampled_from(_ENCODINGS), label="content-encoding")
    compress = data.draw(st.booleans(), label="compressed")
    headers = {"Content-Type": content_type} if content_type else {}
    if encoding:
        headers["Content-Encoding"] = encoding
    with client.stream(method, path, content=_encode(raw, encoding, compress), headers=headers) as r:
        r.read()  # (a stream to its end)
    check_answer(r)
    check_logs(logs)


# --- the HTTP framing itself ------------------------------------------------------------

_LENGTHS = st.sampled_from([b"abc", b"-1", b"99999999999999999999999", b"1 2", b"+3", b"0x10", b""]) | st.integers(0, 40).map(
    lambda n: str(n).encode()
)
_HEADER_VALUES = st.binary(max_size=20).filter(lambda b: b"\r" not in b and b"\n" not in b)


@st.composite
def framings(draw: st.DrawFn) -> bytes:
    """One request, whole in one write, with broken or odd framing."""
    method = draw(st.sampled_from([b"POST", b"GET", b"P\x00ST", b"post", b""]))
    target = draw(st.sampled_from([b"/v1/completions", b"/tokenize", b"*", b"/%zz", b"/\xff", b"http://x/health"]))
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1x", b""]))
    lines = [method + b" " + target + b" " + version, b"Host: x"]
    body = b'{"prompt": "the", "max_tokens": 2}'
    framing = draw(st.sampled_from(["length", "chunked", "both", "none"]))
    if framing in ("length", "both"):
        lines += [b"Content-Length: " + draw(_LENGTHS) for _ in range(draw(st.integers(1, 2)))]
    if framing in ("chunked", "both"):
        lines.append(b"Transfer-Encoding: " + draw(st.sampled_from([b"chunked", b"gzip, chunked", b"chunked, gzip", b"bogus"])))
        size = draw(st.sampled_from([b"%x" % len(body), b"zz", b"-1", b"ffffffffffffffffff", b"3;ext=1"]))
        body = size + b"\r\n" + body + b"\r\n" + draw(st.sampled_from([b"0\r\n\r\n", b"", b"0\r\n", b"x\r\n\r\n"]))
    lines += [draw(_HEADER_VALUES) + b": " + draw(_HEADER_VALUES) for _ in range(draw(st.integers(0, 2)))]
    if draw(st.booleans()):
        lines.append(draw(st.sampled_from([b"Bad Header", b": empty name", b"X-Folded: a\r\n b", b"Content-Encoding: gzip"])))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


@settings(FUZZ, max_examples=100)
@given(data=framings())
def test_broken_framing_gets_no_5xx_or_traceback(data: bytes, server: EmbeddedServer, logs: _Records) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=SOCKET_TIMEOUT_S) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)  # nothing more comes: a body cut short ends here
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status = answer.split(b" ", 2)[1:2]
    assert not status or not status[0].startswith(b"5"), answer[:300]
    check_logs(logs)
