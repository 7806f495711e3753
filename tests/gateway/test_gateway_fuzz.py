"""No client input gets a 5xx: bodies drawn by hypothesis (any JSON, and a valid request
with any field replaced by any value), sent over loopback to a gateway in front of a
scripted upstream."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fakeupstream import FakeUpstream
from gateway_helpers import serving
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferlab.gateway.config import AdmissionConfig, CacheConfig, GatewayConfig, UpstreamConfig

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
FIELDS = ["model", "messages", "prompt", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n",
          "temperature", "seed", "logprobs", "top_logprobs", "stop", "min_tokens", "ignore_eos", "top_p"]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop = asyncio.Event()
    box: dict[str, str] = {}

    async def main() -> None:
        async with FakeUpstream() as up:
            cfg = GatewayConfig(upstreams=(UpstreamConfig(up.url),), cache=CacheConfig(max_entries=8),
                                admission=AdmissionConfig(queue_timeout_s=5), max_body_bytes=65536)
            async with serving(cfg) as (u, _):
                box["url"] = u
                ready.set()
                await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(30)
    yield box["url"]
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)


def check(url: str, path: str, body: bytes) -> None:
    with httpx.Client(timeout=20) as c:
        r = c.post(url + path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code < 500, (body[:200], r.status_code, r.text[:300])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["code"] == r.status_code and isinstance(err["message"], str)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=JSON, chat=st.booleans())
def test_any_json_body_gets_no_5xx(url: str, body: Any, chat: bool) -> None:
    check(url, "/v1/chat/completions" if chat else "/v1/completions", json.dumps(body).encode())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=JSON, stream=st.booleans(), chat=st.booleans())
def test_a_valid_request_with_any_field_replaced_gets_no_5xx(url: str, field: str, value: Any, stream: bool, chat: bool) -> None:
    body: dict[str, Any] = {"model": "ok", "max_tokens": 4, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    body[field] = value
    check(url, "/v1/chat/completions" if chat else "/v1/completions", json.dumps(body).encode())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200))
def test_any_bytes_get_no_5xx(url: str, raw: bytes) -> None:
    check(url, "/v1/chat/completions", raw)
