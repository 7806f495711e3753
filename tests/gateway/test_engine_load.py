"""Routing that sees the load other clients put on an engine: the gateway reads each
engine's own ``/metrics`` (running and waiting requests) and counts, on top of its own
requests in flight, those the engine holds that the gateway did not send.

End to end: two ``sim serve`` upstreams (child processes, vLLM's metric names) behind
the gateway with least-outstanding routing. A side client holds a fixed number of long
requests open on the first engine, straight, not through the gateway; then requests
sent through the gateway go to the other engine when the gateway reads the engines'
pages, and split between the two when it does not (the control). Which upstream served
a request is read from the gateway's own per-upstream metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from fakeupstream import FakeUpstream
from gateway_helpers import chat_body, metrics, post, serving, total

from inferlab._clock import NS_PER_S, VirtualClock
from inferlab.gateway.app import _load
from inferlab.gateway.config import CacheConfig, GatewayConfig, UpstreamConfig
from inferlab.gateway.routing import EngineLoad, LeastOutstanding, PrefixAffinity, text_prefix
from inferlab.results.telemetry import parse_prometheus, snapshot
from inferlab.sim.server.launch import ChildServer

#: Long requests the side client holds open on the first engine.
SIDE = 8
#: Requests then sent through the gateway.
N = 8
REFRESH_S = 0.3
#: The most time any wait below may take (every wait is also bounded in count).
WAIT_S = 30.0
POLL_S = 0.05

DURATION = "gen_ai_server_request_duration_seconds_count"
REPORTED = "inferlab_gateway_upstream_reported_requests"
FOREIGN = "inferlab_gateway_upstream_foreign_requests"
KV = "inferlab_gateway_upstream_reported_kv_usage"


# --- the bookkeeping, in virtual time ---------------------------------------------------


def test_foreign_requests_are_what_the_engine_holds_beyond_the_callers_own() -> None:
    engines = EngineLoad(2, VirtualClock(), max_age_s=1.0)
    r = engines.report(0, running=5, waiting=2, kv_usage=0.4, own=3)
    assert (r.running, r.waiting, r.kv_usage, r.foreign) == (5, 2, 0.4, 4)
    # the engine has not seen some of the caller's requests yet: none is foreign
    assert engines.report(1, running=1, waiting=0, kv_usage=None, own=3).foreign == 0


def test_least_outstanding_counts_foreign_requests_at_the_callers_mean_request_size() -> None:
    tokens, requests = [3000, 1000], [3, 1]
    engines = EngineLoad(2, VirtualClock(), max_age_s=1.0)
    lo = LeastOutstanding(tokens, requests, engines)
    assert lo([0, 1]) == 1  # its own counts alone
    engines.report(1, running=4, waiting=0, kv_usage=None, own=1)  # 3 the caller did not send
    load = lo.outstanding([0, 1])
    assert load[1][1] == requests[1] + 3
    assert load[1][0] == tokens[1] + 3 * sum(tokens) / sum(requests)
    assert lo([0, 1]) == 0
    # without reports, the same lists route as before
    assert LeastOutstanding(tokens, requests)([0, 1]) == 1


def test_with_nothing_of_its_own_in_flight_the_router_follows_the_engines_reports() -> None:
    tokens, requests = [0, 0, 0], [0, 0, 0]
    engines = EngineLoad(3, VirtualClock(), max_age_s=1.0)
    for i, held in enumerate((7, 2, 5)):
        engines.report(i, running=held, waiting=0, kv_usage=None, own=0)
    lo = LeastOutstanding(tokens, requests, engines)
    assert [lo([0, 1, 2]) for _ in range(3)] == [1, 1, 1]
    assert lo([0, 2]) == 2


def test_kv_usage_breaks_a_tie_in_tokens_and_requests() -> None:
    tokens, requests = [100, 100], [1, 1]
    engines = EngineLoad(2, VirtualClock(), max_age_s=1.0)
    engines.report(0, running=1, waiting=0, kv_usage=0.9, own=1)
    engines.report(1, running=1, waiting=0, kv_usage=0.2, own=1)
    lo = LeastOutstanding(tokens, requests, engines)
    assert [lo([0, 1]) for _ in range(3)] == [1, 1, 1]
    plain = LeastOutstanding(tokens, requests)
    assert [plain([0, 1]) for _ in range(2)] == [0, 1]  # without reports: in turn


def test_a_report_older_than_its_max_age_is_dropped() -> None:
    clock = VirtualClock()
    engines = EngineLoad(2, clock, max_age_s=1.0)
    engines.report(0, running=9, waiting=9, kv_usage=None, own=0)
    lo = LeastOutstanding([0, 0], [0, 0], engines)
    assert engines.reading(0) is not None and lo([0, 1]) == 1
    clock.advance_to_ns(NS_PER_S + 1)
    assert engines.reading(0) is None
    assert lo.outstanding([0, 1]) == {0: (0, 0, 0.0), 1: (0, 0, 0.0)}
    assert {lo([0, 1]) for _ in range(4)} == {0, 1}  # least recently picked again


def test_prefix_affinity_leaves_a_home_loaded_by_foreign_requests() -> None:
    tokens, requests = [0, 0], [0, 0]
    engines = EngineLoad(2, VirtualClock(), max_age_s=1.0)
    pa = PrefixAffinity(tokens, requests, slack_tokens=10, engines=engines)
    key = text_prefix("a system prompt " * 20)
    home = pa([0, 1], key, 0)
    other = 1 - home
    tokens[other], requests[other] = 5, 1  # the caller's own: one request of 5 tokens
    assert pa([0, 1], key, 0) == home
    engines.report(home, running=4, waiting=0, kv_usage=None, own=0)  # 4 × 5 tokens > 5 + slack
    assert pa([0, 1], key, 0) == other


def test_the_simulators_page_gives_running_waiting_and_kv_usage() -> None:
    page = 'vllm:num_requests_running{model_name="m"} 3\nvllm:num_requests_waiting{model_name="m"} 2\n' \
           'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
    assert _load(snapshot(parse_prometheus(page))) == (3.0, 2.0, 0.25)
    assert isinstance(_load(snapshot(parse_prometheus('vllm:prompt_tokens_total{model_name="m"} 3\n'))), str)


# --- end to end: sim serve engines over loopback HTTP -------------------------------------


@pytest.fixture(scope="module")
def engines() -> Iterator[list[str]]:
    servers: list[ChildServer] = []
    try:
        for _ in range(2):
            servers.append(ChildServer())
        yield [s.url for s in servers]
    finally:
        for s in servers:
            s.close()


async def engine_load(s: aiohttp.ClientSession, url: str) -> float:
    """Running + waiting requests on a ``sim serve`` engine, from its own page."""
    async with s.get(url + "/metrics") as resp:
        v = snapshot(parse_prometheus(await resp.text())).values
    return v["running"] + v["waiting"]


async def until(check: Any, what: str) -> None:
    """Poll ``check()`` (async, truthy when done), at most ``WAIT_S``."""
    for _ in range(int(WAIT_S / POLL_S)):
        if await check():
            return
        await asyncio.sleep(POLL_S)
    raise AssertionError(f"not within {WAIT_S} s: {what}")


@contextlib.asynccontextmanager
async def side_load(url: str, model: str) -> AsyncIterator[None]:
    """``SIDE`` long streams held open on the engine at ``url`` (straight, not through the
    gateway) until the block ends; then closed, and the engine idle again."""
    stop = asyncio.Event()
    started = asyncio.Semaphore(0)
    async with aiohttp.ClientSession() as s:

        async def hold(i: int) -> None:
            body = chat_body(model, f"side load {i}", max_tokens=3000, ignore_eos=True)
            async with s.post(url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                await resp.content.readany()
                started.release()
                await stop.wait()

        tasks = [asyncio.create_task(hold(i)) for i in range(SIDE)]
        try:
            async with asyncio.timeout(WAIT_S):
                for _ in range(SIDE):
                    await started.acquire()
            yield
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        await until(lambda: _idle(s, url), "the engine let the side load go")


async def _idle(s: aiohttp.ClientSession, url: str) -> bool:
    return await engine_load(s, url) == 0


async def served(refresh_s: float, upstreams: list[str]) -> tuple[float, float]:
    """Requests through the gateway that each upstream served, with ``SIDE`` long
    requests held on the first one by a side client."""
    async with aiohttp.ClientSession() as s, s.get(upstreams[0] + "/v1/models") as resp:
        model = (await resp.json())["data"][0]["id"]
    cfg = GatewayConfig(upstreams=tuple(UpstreamConfig(u) for u in upstreams), cache=CacheConfig(enabled=False),
                        router="least-outstanding", metrics_refresh_s=refresh_s)
    names = [u.name for u in cfg.upstreams]
    async with serving(cfg) as (url, _), aiohttp.ClientSession() as s, side_load(upstreams[0], model):
        if refresh_s > 0:  # the gateway has read the side load
            async def seen() -> bool:
                return total(await metrics(s, url), REPORTED, server_address=names[0]) >= SIDE
            await until(seen, "the gateway read the side load")
            assert total(await metrics(s, url), FOREIGN, server_address=names[0]) >= SIDE  # none of them its own
        else:  # the engine holds it (the gateway does not look)
            async def held() -> bool:
                return await engine_load(s, upstreams[0]) >= SIDE
            await until(held, "the engine holds the side load")
        async with asyncio.timeout(WAIT_S):
            answers = await asyncio.gather(*(post(s, url, chat_body(model, f"q{i}", max_tokens=16)) for i in range(N)))
        assert [a.status for a in answers] == [200] * N
        samples = await metrics(s, url)
    counts = [total(samples, DURATION, server_address=n) for n in names]
    assert sum(counts) == N
    return counts[0], counts[1]


async def test_requests_avoid_the_engine_other_clients_loaded_when_the_gateway_reads_its_metrics(
    engines: list[str],
) -> None:
    loaded, other = await served(REFRESH_S, engines)
    print(f"refresh {REFRESH_S} s: loaded engine {loaded:g}, the other {other:g}")
    assert other >= N - 1


async def test_without_reading_the_metrics_the_gateway_splits_them(engines: list[str]) -> None:
    loaded, other = await served(0, engines)
    print(f"refresh off: loaded engine {loaded:g}, the other {other:g}")
    assert min(loaded, other) >= N // 4


async def test_an_upstream_without_metrics_still_routes_and_the_log_says_so_once(
    engines: list[str], caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "inferlab.gateway")
    async with FakeUpstream(models=("ok",)) as fake:
        cfg = GatewayConfig(upstreams=(UpstreamConfig(fake.url), UpstreamConfig(engines[0])),
                            cache=CacheConfig(enabled=False), router="least-outstanding", metrics_refresh_s=0.1)
        name = cfg.upstreams[0].name
        async with serving(cfg) as (url, _), aiohttp.ClientSession() as s:
            async def read_thrice() -> bool:
                return sum(1 for r in fake.seen if r["path"] == "/metrics") >= 3
            await until(read_thrice, "the gateway read the page three times")
            for i in range(4):
                assert (await post(s, url, chat_body("ok", f"q{i}", stream=False))).status == 200
            samples = await metrics(s, url)
            # the engine's report shows; the upstream without a page has none
            assert total(samples, REPORTED, server_address=cfg.upstreams[1].name, state="running") == 0
            assert not any(n == REPORTED and ("server_address", name) in ls for (n, ls) in samples)
        assert total(samples, DURATION, server_address=name) == 4  # only it serves "ok"
    said = [r.getMessage() for r in caplog.records if name in r.getMessage() and "/metrics" in r.getMessage()]
    assert len(said) == 1 and "HTTP 404" in said[0]


async def test_a_page_that_stops_giving_the_load_ages_out_of_the_metrics_and_the_log_says_so_once_each_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "inferlab.gateway")
    page = "vllm:num_requests_running{model_name=\"m\"} 4\nvllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.5\n"
    async with FakeUpstream(models=("ok",)) as fake:
        fake.metrics_page = page
        cfg = GatewayConfig(upstreams=(UpstreamConfig(fake.url),), metrics_refresh_s=0.1)
        name = cfg.upstreams[0].name
        async with serving(cfg) as (url, _), aiohttp.ClientSession() as s:
            async def reported() -> bool:
                return total(await metrics(s, url), REPORTED, server_address=name, state="running") == 4
            await until(reported, "the gateway reported the page's load")
            samples = await metrics(s, url)
            assert total(samples, REPORTED, state="waiting") == 1 and total(samples, KV) == 0.5
            assert total(samples, FOREIGN) == 5

            fake.metrics_page = "<html>not a metrics page</html>"

            async def gone() -> bool:
                return not any(n in (REPORTED, FOREIGN, KV) for (n, _) in await metrics(s, url))
            await until(gone, "the old report left the gateway's metrics")
            fake.metrics_page = page
            await until(reported, "the gateway reported the page's load again")
            reads = sum(1 for r in fake.seen if r["path"] == "/metrics")
    said = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert len(said) == 2 and reads >= 4
    assert "no running, waiting, kv_usage" in said[0] and "reads again" in said[1]


async def test_the_scrape_stops_when_the_gateway_does() -> None:
    async with FakeUpstream(models=("ok",)) as fake:
        cfg = GatewayConfig(upstreams=(UpstreamConfig(fake.url),), metrics_refresh_s=0.1)
        async with serving(cfg) as (_, gw):
            async def read_once() -> bool:
                return any(r["path"] == "/metrics" for r in fake.seen)
            await until(read_once, "the gateway read the page")
            tasks = list(gw._watchers)
        assert tasks and all(t.done() for t in tasks)
        reads = sum(1 for r in fake.seen if r["path"] == "/metrics")
        await asyncio.sleep(3 * 0.1)
        assert sum(1 for r in fake.seen if r["path"] == "/metrics") == reads
