"""The response cache, /metrics, the access log and per-key limits, through the
gateway over loopback."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
from fakeupstream import TEXTS, USAGE, FakeUpstream
from gateway_helpers import chat_body, metrics, post, serving, total

from inferlab._clock import NS_PER_S, VirtualClock
from inferlab.gateway.config import CacheConfig, GatewayConfig, KeyConfig, UpstreamConfig, hash_key
from inferlab.results.metrics import request_metrics
from inferlab.results.runfiles import read_records

KEYS = {"alice": "sk-alice", "bob": "sk-bob"}


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def config(url: str, cache: CacheConfig | None = None, **key_limits: int) -> GatewayConfig:
    return GatewayConfig(
        upstreams=(UpstreamConfig(url),),
        keys=tuple(KeyConfig(n, hash_key(k), **key_limits) for n, k in KEYS.items()),  # type: ignore[arg-type]
        cache=cache or CacheConfig(),
    )


def posts(up: FakeUpstream) -> int:
    return sum(1 for r in up.seen if r["method"] == "POST")


async def test_a_repeated_temperature_0_request_is_answered_from_the_cache_also_as_a_stream() -> None:
    async with FakeUpstream() as up, serving(config(up.url)) as (url, _), aiohttp.ClientSession() as s:
        body = chat_body("ok", temperature=0)
        first = await post(s, url, body, auth("alice"))
        again = await post(s, url, body, auth("alice"))
        assert posts(up) == 1
        assert again.replays(first) and again.text() == "".join(TEXTS)
        # the same entry answers a whole body, and a stream that asks for usage
        whole = await post(s, url, {**body, "stream": False}, auth("alice"))
        assert whole.json()["choices"][0]["message"]["content"] == "".join(TEXTS)
        assert whole.json()["usage"] == USAGE
        usage = await post(s, url, {**body, "stream_options": {"include_usage": True}}, auth("alice"))
        assert usage.objects()[-1]["usage"] == USAGE
        assert posts(up) == 1
        m = await metrics(s, url)
        assert total(m, "inferlab_gateway_cache_hits_total", key="alice") == 3
        assert total(m, "inferlab_gateway_cache_misses_total", key="alice") == 1
        assert total(m, "inferlab_gateway_cache_tokens_saved_total") == 3 * USAGE["total_tokens"]
        assert total(m, "gen_ai_server_time_to_first_token_seconds_count", server_address="cache") == 2


async def test_a_cached_body_is_served_as_a_stream() -> None:
    async with FakeUpstream() as up, serving(config(up.url)) as (url, _), aiohttp.ClientSession() as s:
        body = chat_body("ok", stream=False, seed=7)
        assert (await post(s, url, body, auth("alice"))).status == 200
        stream = await post(s, url, {**body, "stream": True}, auth("alice"))
        assert stream.text() == "".join(TEXTS) and stream.events[-1] == "[DONE]"
        assert not any("usage" in o for o in stream.objects())
        assert posts(up) == 1


async def test_what_is_not_deterministic_or_belongs_to_another_key_is_not_served_from_the_cache() -> None:
    async with FakeUpstream() as up, serving(config(up.url)) as (url, _), aiohttp.ClientSession() as s:
        for _ in range(2):
            await post(s, url, chat_body("ok", temperature=0.7), auth("alice"))
        assert posts(up) == 2
        await post(s, url, chat_body("ok", temperature=0), auth("alice"))
        await post(s, url, chat_body("ok", temperature=0), auth("bob"))
        assert posts(up) == 4
    async with FakeUpstream() as up, serving(config(up.url, CacheConfig(shared_across_keys=True))) as (url, _), \
            aiohttp.ClientSession() as s:
        await post(s, url, chat_body("ok", temperature=0), auth("alice"))
        await post(s, url, chat_body("ok", temperature=0), auth("bob"))
        assert posts(up) == 1


async def test_one_number_in_two_json_spellings_is_one_cache_entry() -> None:
    async with FakeUpstream() as up, serving(config(up.url)) as (url, _), aiohttp.ClientSession() as s:
        answers = [await post(s, url, chat_body("ok", temperature=t, top_p=p), auth("alice"))
                   for t, p in ((0, 1), (0.0, 1.0), (-0.0, 1e0))]
        assert [a.headers["x-inferlab-cache"] for a in answers] == ["miss", "hit", "hit"] and posts(up) == 1
        await post(s, url, chat_body("ok", temperature=0, top_p=0.5), auth("alice"))
        assert posts(up) == 2  # (another number: another entry)


async def test_entries_expire_and_the_size_bound_evicts_the_least_recently_used() -> None:
    clock = VirtualClock()
    async with FakeUpstream() as up, serving(config(up.url, CacheConfig(ttl_s=10, max_entries=1)), clock) as (url, gw), \
            aiohttp.ClientSession() as s:
        a, b = chat_body("ok", "a", temperature=0), chat_body("ok", "b", temperature=0)
        await post(s, url, a, auth("alice"))
        await post(s, url, a, auth("alice"))
        assert posts(up) == 1
        await post(s, url, b, auth("alice"))  # evicts a
        await post(s, url, a, auth("alice"))
        assert posts(up) == 3
        clock.advance_to_ns(11 * NS_PER_S)
        await post(s, url, a, auth("alice"))
        assert posts(up) == 4
        assert gw.cache is not None and len(gw.cache) == 1


async def test_concurrent_identical_misses_make_one_upstream_request() -> None:
    async with FakeUpstream(long_chunks=20, gap_s=0.01) as up, serving(config(up.url)) as (url, _), \
            aiohttp.ClientSession() as s:
        body = chat_body("long", temperature=0)
        answers = await asyncio.gather(*(post(s, url, body, auth("alice")) for _ in range(8)))
        assert {a.status for a in answers} == {200}
        assert {a.text() for a in answers} == {"x" * 20}
        assert posts(up) == 1


async def test_metrics_have_the_ttft_histogram_and_token_counters_by_model_upstream_and_key() -> None:
    async with FakeUpstream() as up, serving(config(up.url, CacheConfig(enabled=False))) as (url, _), \
            aiohttp.ClientSession() as s:
        for _ in range(3):
            await post(s, url, chat_body("ok"), auth("alice"))
        await post(s, url, chat_body("ok", stream=False), auth("bob"))
        await post(s, url, chat_body("ok"), {"Authorization": "Bearer nope"})
        m = await metrics(s, url)
        where = {"gen_ai_request_model": "ok", "server_address": f"127.0.0.1:{up.port}"}
        assert total(m, "gen_ai_server_time_to_first_token_seconds_count", key="alice", **where) == 3
        assert total(m, "gen_ai_client_token_usage_total", key="alice", gen_ai_token_type="input", **where) == 3 * USAGE["prompt_tokens"]
        assert total(m, "gen_ai_client_token_usage_total", key="bob", gen_ai_token_type="output", **where) == USAGE["completion_tokens"]
        assert total(m, "gen_ai_server_request_duration_seconds_count", **where) == 4
        assert total(m, "gen_ai_server_inter_token_latency_seconds_count", key="alice") == 3 * (len(TEXTS) - 1)
        assert total(m, "gen_ai_server_time_per_output_token_seconds_bucket", le="0.001") > 0  # sub-ms buckets exist
        assert total(m, "inferlab_gateway_rejections_total", reason="unauthenticated") == 1
        assert total(m, "inferlab_gateway_requests_in_flight") == 0


async def test_the_access_log_is_a_run_directory_that_the_metrics_read(tmp_path: Path) -> None:
    cfg = config("http://placeholder:1")
    async with FakeUpstream() as up:
        cfg = GatewayConfig(upstreams=(UpstreamConfig(up.url),), keys=cfg.keys, cache=CacheConfig(enabled=False),
                            access_log=str(tmp_path / "log"))
        async with serving(cfg) as (url, _), aiohttp.ClientSession() as s:
            await post(s, url, chat_body("ok"), auth("alice"))
            await post(s, url, chat_body("die"), auth("alice"))
    records = list(read_records(tmp_path / "log" / "requests.jsonl"))
    assert [r.ok for r in records] == [True, False]
    ok, died = records
    assert ok.input_tokens == USAGE["prompt_tokens"] and ok.output_tokens == USAGE["completion_tokens"]
    m = request_metrics(ok)
    assert m.ttft_ms is not None and m.e2e_ms is not None and 0 < m.ttft_ms <= m.e2e_ms
    assert len(m.itl_ms) == len(TEXTS) - 1
    assert died.error_kind is not None and died.error_kind.value == "disconnect"
    text = (tmp_path / "log" / "requests.jsonl").read_text() + (tmp_path / "log" / "config.json").read_text()
    assert KEYS["alice"] not in text and json.loads((tmp_path / "log" / "config.json").read_text())["gateway"]["keys"] == ["alice", "bob"]


async def test_the_access_log_holds_the_cache_s_answers_and_the_refusals_as_such(tmp_path: Path) -> None:
    """A key of 3 requests a minute sends the same temperature-0 request 4 times: one
    goes upstream, two are the cache's answers, one is refused (429); a wrong key is
    refused before its request is read (401). The log has all five, the cache's marked
    as such (no prompt token of theirs from a prefix cache), the refusals failed with
    their status, as the clients saw them."""
    async with FakeUpstream() as up:
        cfg = config(up.url, CacheConfig(enabled=True), rpm=3)
        cfg = GatewayConfig(upstreams=cfg.upstreams, keys=cfg.keys, cache=cfg.cache, access_log=str(tmp_path / "log"))
        async with serving(cfg) as (url, _), aiohttp.ClientSession() as s:
            answers = [await post(s, url, chat_body("ok", temperature=0), auth("alice")) for _ in range(4)]
            answers.append(await post(s, url, chat_body("ok", temperature=0), {"Authorization": "Bearer sk-wrong"}))
        assert [a.status for a in answers] == [200, 200, 200, 429, 401] and posts(up) == 1
    records = sorted(read_records(tmp_path / "log" / "requests.jsonl"), key=lambda r: r.index)
    assert [r.status for r in records] == [200, 200, 200, 429, 401]
    assert [r.response_cache_hit for r in records] == [False, True, True, None, None]  # (refused: never looked up)
    assert [r.cached_tokens for r in records[1:3]] == [0, 0]
    assert [r.ok for r in records] == [True, True, True, False, False]
    assert records[3].error is not None and "429" in records[3].error
    assert records[4].error is not None and "401" in records[4].error and records[4].end_ns is not None


async def test_a_tpm_limit_under_64_concurrent_clients_admits_exactly_what_fits() -> None:
    # Each request reserves its estimate (prompt by 4 characters a token + max_tokens) before
    # it is sent; 64 arrive at once, none finishes before all are decided ("long" streams).
    async with FakeUpstream(long_chunks=100, gap_s=0.01) as up:
        probe = chat_body("long", max_tokens=100)
        from inferlab.gateway.estimate import prompt_counter, prompt_tokens

        reservation = prompt_tokens(probe, True, prompt_counter("estimate")) + 100
        cfg = config(up.url, CacheConfig(enabled=False), tpm=5 * reservation + reservation // 2)
        async with serving(cfg) as (url, _), aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            answers = await asyncio.gather(*(post(s, url, probe, auth("alice")) for _ in range(64)))
        statuses = sorted(a.status for a in answers)
        assert statuses == [200] * 5 + [429] * 59
        refused = next(a for a in answers if a.status == 429)
        assert int(refused.headers["Retry-After"]) >= 1
        assert refused.headers["x-ratelimit-limit-tokens"] == str(cfg.keys[0].tpm)
        assert refused.json()["error"]["type"] == "RateLimitError"


async def test_a_client_that_leaves_mid_stream_keeps_its_charge_and_one_refused_before_dispatch_does_not() -> None:
    async with FakeUpstream(long_chunks=500, gap_s=0.01) as up:
        cfg = config(up.url, CacheConfig(enabled=False), tpm=10**6)
        async with serving(cfg) as (url, gw):
            async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=chat_body("long"),
                                                            headers=auth("alice")) as resp:
                await resp.content.readany()
            for _ in range(200):  # bounded: 2 s
                if gw.admission.requests_in_flight == [0]:
                    break
                await asyncio.sleep(0.01)
            window = gw.limiter._windows["alice"]
            assert window.tokens > 0 and len(window.charges) == 1  # the estimate stays charged
            async with aiohttp.ClientSession() as s:
                unknown = await post(s, url, chat_body("no-such-model"), auth("bob"))
            assert unknown.status == 404 and "bob" not in gw.limiter._windows  # refused before any charge


async def test_a_request_the_gateway_refuses_at_its_queue_gives_back_the_request_and_its_tokens() -> None:
    """A key of 2 requests a minute: one stream holds the only slot, a second is refused
    at the full queue (503). That one counts for nothing, so a third, once the slot is
    free, is the key's second request of the minute, not a 429."""
    from inferlab.gateway.config import AdmissionConfig

    async with FakeUpstream(long_chunks=20, gap_s=0.01) as up:
        keyed = config(up.url, CacheConfig(enabled=False), rpm=2, tpm=10**6)
        cfg = GatewayConfig(upstreams=keyed.upstreams, keys=keyed.keys, cache=keyed.cache,
                            admission=AdmissionConfig(mode="requests", max_requests_in_flight=1, queue_max=0))
        async with serving(cfg) as (url, gw), aiohttp.ClientSession() as s:
            holding = asyncio.create_task(post(s, url, chat_body("long"), auth("alice")))
            for _ in range(400):  # bounded: 2 s
                if gw.admission.requests_in_flight == [1]:
                    break
                await asyncio.sleep(0.005)
            window = gw.limiter._windows["alice"]
            held = window.tokens
            refused = await post(s, url, chat_body("ok"), auth("alice"))
            assert refused.status == 503 and len(window.charges) == 1 and window.tokens == held
            assert (await holding).status == 200
            third = await post(s, url, chat_body("ok"), auth("alice"))
            assert third.status == 200 and third.headers["x-ratelimit-remaining-requests"] == "0"
            assert len(window.charges) == 2


async def test_an_error_answer_is_charged_no_tokens_and_a_broken_stream_what_it_streamed() -> None:
    """The upstream's 500 (a 502 after the tries) generated nothing: its charge is
    corrected to no tokens, still one request. A stream the upstream breaks after two
    content chunks is charged its prompt (as counted) and those two."""
    from inferlab.gateway.estimate import prompt_counter, prompt_tokens

    async with FakeUpstream() as up, serving(config(up.url, CacheConfig(enabled=False), tpm=10**6)) as (url, gw), \
            aiohttp.ClientSession() as s:
        assert (await post(s, url, chat_body("e500", stream=False), auth("alice"))).status == 502
        window = gw.limiter._windows["alice"]
        assert len(window.charges) == 1 and window.tokens == 0
        broken = await post(s, url, chat_body("die"), auth("bob"))
        assert broken.status == 200 and "error" in broken.objects()[-1]
        prompt = prompt_tokens(chat_body("die"), True, prompt_counter("estimate"))
        assert gw.limiter._windows["bob"].tokens == prompt + 2


async def test_a_cache_hit_has_its_duration_tokens_and_each_chunk_s_send_time(tmp_path: Path) -> None:
    """Cache hits are in the metrics under server_address "cache" as an upstream's
    answers are (duration, the answer's token usage), and a streamed hit's record has one
    content time per content chunk, as the miss's has."""
    async with FakeUpstream() as up:
        keyed = config(up.url)
        cfg = GatewayConfig(upstreams=keyed.upstreams, keys=keyed.keys, access_log=str(tmp_path / "log"))
        async with serving(cfg) as (url, _), aiohttp.ClientSession() as s:
            body = chat_body("ok", temperature=0)
            for b in (body, body, {**body, "stream": False}):
                assert (await post(s, url, b, auth("alice"))).status == 200
            m = await metrics(s, url)
    cache = {"server_address": "cache", "key": "alice"}
    assert total(m, "gen_ai_server_request_duration_seconds_count", **cache) == 2
    assert total(m, "gen_ai_client_token_usage_total", gen_ai_token_type="input", **cache) == 2 * USAGE["prompt_tokens"]
    assert total(m, "gen_ai_client_token_usage_total", gen_ai_token_type="output", **cache) == 2 * USAGE["completion_tokens"]
    assert total(m, "gen_ai_server_time_to_first_token_seconds_count", **cache) == 1
    assert total(m, "gen_ai_server_time_per_output_token_seconds_count", **cache) == 1
    miss, streamed, whole = sorted(read_records(tmp_path / "log" / "requests.jsonl"), key=lambda r: r.index)
    assert [r.response_cache_hit for r in (miss, streamed, whole)] == [False, True, True]
    assert len(streamed.content_ns) == len(miss.content_ns) == len(TEXTS) and whole.content_ns == []
    assert streamed.ttfb_ns is not None and streamed.end_ns is not None
    assert streamed.content_ns == sorted(streamed.content_ns)
    assert streamed.ttfb_ns <= streamed.content_ns[0] and streamed.content_ns[-1] <= streamed.end_ns
