"""Routing policies and upstream health, as plain bookkeeping."""

from __future__ import annotations

import aiohttp
import pytest
from fakeupstream import FakeUpstream
from gateway_helpers import chat_body, post, serving

from inferlab._clock import NS_PER_S, VirtualClock
from inferlab.gateway.config import CacheConfig, GatewayConfig, UpstreamConfig
from inferlab.gateway.routing import (
    OVERLOAD_SLACK_TOKENS,
    Health,
    LeastOutstanding,
    PrefixAffinity,
    RoundRobin,
    make_router,
    text_prefix,
)


def test_round_robin_takes_each_in_turn_skipping_those_without_room() -> None:
    rr = RoundRobin(3)
    assert [rr([0, 1, 2], b"", 0) for _ in range(4)] == [0, 1, 2, 0]
    assert rr([0, 2], b"", 0) == 2  # next was 1: no room


def test_least_outstanding_prefers_fewer_tokens_then_fewer_requests() -> None:
    tokens, requests = [100, 50, 50], [1, 3, 2]
    assert LeastOutstanding(tokens, requests)([0, 1, 2]) == 2
    assert LeastOutstanding(tokens, requests)([0, 1]) == 1


def test_prefix_affinity_sends_a_prefix_home_unless_home_is_overloaded() -> None:
    tokens, requests = [0] * 4, [0] * 4
    pa = PrefixAffinity(tokens, requests)
    homes = {p: pa(range(4), text_prefix(f"system prompt {p} " * 20), 0) for p in range(64)}
    assert all(pa(range(4), text_prefix(f"system prompt {p} " * 20), 0) == h for p, h in homes.items())
    assert set(homes.values()) == {0, 1, 2, 3}  # different prefixes spread
    key = text_prefix("system prompt 7 " * 20)
    home = homes[7]
    tokens[home] = OVERLOAD_SLACK_TOKENS + 1
    assert pa(range(4), key, 0) != home
    assert pa([i for i in range(4) if i != home], key, 0) != home


def test_an_unknown_router_is_refused() -> None:
    with pytest.raises(ValueError, match="round-robin"):
        make_router("random", [0], [0])


def test_health_ejects_after_three_failures_with_doubling_backoff() -> None:
    clock = VirtualClock()
    h = Health(2, clock)
    for _ in range(3):
        h.failed(0)
    assert h.healthy([0, 1]) == [1]
    clock.advance_to_ns(NS_PER_S + 1)
    assert h.healthy([0, 1]) == [0, 1]
    for _ in range(3):
        h.failed(0)
    clock.advance_to_ns(2 * NS_PER_S)
    assert h.healthy([0, 1]) == [1]  # second ejection: 2 s
    assert h.healthy([0]) == [0]  # every candidate ejected: try anyway
    h.succeeded(0)
    assert h.healthy([0, 1]) == [0, 1]


async def test_the_gateway_routes_a_shared_prefix_to_one_upstream_by_prefix_affinity() -> None:
    async with FakeUpstream() as a, FakeUpstream() as b:
        cfg = GatewayConfig(upstreams=(UpstreamConfig(a.url), UpstreamConfig(b.url)), cache=CacheConfig(enabled=False),
                            router="prefix-affinity")
        async with serving(cfg) as (url, _), aiohttp.ClientSession() as s:
            system = "You are a careful assistant. " * 20
            for i in range(6):
                body = chat_body("ok", stream=False)
                body["messages"] = [{"role": "system", "content": system}, {"role": "user", "content": f"q{i}"}]
                assert (await post(s, url, body)).status == 200
        counts = sorted(sum(1 for r in u.seen if r["method"] == "POST") for u in (a, b))
        assert counts == [0, 6]
