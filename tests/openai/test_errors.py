"""The error body: what a server answers, and the message a client reads out of it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from inferlab._errors import InferlabError
from inferlab.openai.errors import MAX_ERROR_CHARS, APIError, error_body, error_message, one_line


def test_error_body_is_openais() -> None:
    assert error_body(404, "no such model", "NotFoundError") == {
        "error": {"message": "no such model", "type": "NotFoundError", "param": None, "code": 404}
    }


def test_api_error_carries_its_answer() -> None:
    e = APIError(429, "too many", "RateLimitError")
    assert isinstance(e, InferlabError) and str(e) == "too many"
    assert e.body() == error_body(429, "too many", "RateLimitError")
    assert APIError(400, "bad").error_type == "BadRequestError"


def test_api_error_names_the_field_at_fault() -> None:
    e = APIError(400, "top_p must be in (0, 1], got 2.", param="top_p")
    assert e.body() == {"error": {"message": "top_p must be in (0, 1], got 2.", "type": "BadRequestError", "param": "top_p", "code": 400}}


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (error_body(400, "bad request", "BadRequestError"), "bad request"),  # OpenAI, vLLM
        ({"error": {"detail": "d"}}, "d"),
        ({"error": {"msg": "m"}}, "m"),
        ({"error": "plain string"}, "plain string"),  # TGI, llama.cpp
        ({"detail": "Not Found"}, "Not Found"),  # FastAPI
        ({"message": "top level"}, "top level"),
        ({"object": "error", "message": "sglang"}, "sglang"),
        ({"error": {"code": 1}}, '{"error": {"code": 1}}'),
        ([1, 2], "[1, 2]"),
    ],
)
def test_error_message_finds_the_message(obj: Any, message: str) -> None:
    assert error_message(obj) == message


def test_error_message_of_a_big_unknown_object_is_cut() -> None:
    obj = {"unknown": "x" * 1000}
    assert error_message(obj) == json.dumps(obj)[:MAX_ERROR_CHARS]


def test_error_message_reads_back_what_error_body_wrote() -> None:
    assert error_message(json.loads(json.dumps(APIError(400, "ünïcode").body()))) == "ünïcode"


def test_one_line_strips_html_and_folds_whitespace() -> None:
    page = "<html><head><style>p {}</style></head><body>\n<h1>502 Bad\n Gateway</h1>\n</body></html>"
    assert one_line(page) == "502 Bad Gateway"
    assert one_line("word " * 100, limit=20) == "word word word word…"
    assert len(one_line("x" * 500)) == 200
