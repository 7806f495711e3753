"""How the client maps a ``RequestSpec`` and an ``Endpoint`` onto a request body."""

from __future__ import annotations

import pytest

from inferlab.client.http import Endpoint, request_body
from inferlab.workload.spec import RequestSpec

CHAT = Endpoint(base_url="http://h/v1", model="m")
COMPLETIONS = Endpoint(base_url="http://h/v1", model="m", api="completions", stream=False)


def test_urls_per_api() -> None:
    assert CHAT.url == "http://h/v1/chat/completions"
    assert COMPLETIONS.url == "http://h/v1/completions"


def test_a_chat_spec_sends_its_messages_and_exact_length() -> None:
    spec = RequestSpec("q", max_tokens=9, exact_output=True, system="s", extra_body={"temperature": 0.5})
    assert request_body(CHAT, spec) == {
        "model": "m",
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
        "max_tokens": 9, "ignore_eos": True, "min_tokens": 9,
        "stream": True, "stream_options": {"include_usage": True},
        "temperature": 0.5,
    }


def test_a_completions_spec_sends_its_prompt() -> None:
    assert request_body(COMPLETIONS, RequestSpec("q", system="s")) == {"model": "m", "prompt": "s\n\nq"}
    assert request_body(COMPLETIONS, RequestSpec([1, 2], max_tokens=3)) == {"model": "m", "prompt": [1, 2], "max_tokens": 3}


def test_token_ids_cannot_go_to_the_chat_api() -> None:
    with pytest.raises(TypeError):
        request_body(CHAT, RequestSpec([1, 2]))


def test_the_endpoints_fields_go_with_every_request_and_a_specs_own_win() -> None:
    sampling = Endpoint(base_url="http://h/v1", model="m", api="completions", stream=False, extra_body={"temperature": 0.7, "top_p": 0.9})
    assert request_body(sampling, RequestSpec("q")) == {"model": "m", "prompt": "q", "temperature": 0.7, "top_p": 0.9}
    own = RequestSpec("q", extra_body={"temperature": 0.0})
    assert request_body(sampling, own) == {"model": "m", "prompt": "q", "temperature": 0.0, "top_p": 0.9}
