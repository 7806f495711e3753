"""``split-by-length``: long prompts to upstreams of their own, the rest to the others.

The bookkeeping in virtual time (which pool, least-outstanding inside it, which upstreams
a request may wait for when its pool is busy or ejected), the config that turns it on
(and refuses it half given, or given to another router), and the gateway over loopback
HTTP in front of two ``sim serve`` upstreams."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner
from fakeupstream import FakeUpstream
from gateway_helpers import chat_body, metrics, post, serving, total

from inferlab._clock import VirtualClock
from inferlab._errors import UsageError
from inferlab.cli.main import main
from inferlab.gateway.admission import Admission, Ticket, Waiter
from inferlab.gateway.config import (
    AdmissionConfig,
    CacheConfig,
    GatewayConfig,
    UpstreamConfig,
    load_config,
)
from inferlab.gateway.routing import SPLIT, Health, LongPool, SplitByLength, eligible, make_router
from inferlab.sim.server.launch import ChildServer

LONG = 1000  # tokens: a prompt this long is long


def split(count: int = 3, long: frozenset[int] = frozenset({2})) -> tuple[SplitByLength, list[int], list[int]]:
    tokens, requests = [0] * count, [0] * count
    router = make_router(SPLIT, tokens, requests, long_pool=LongPool(LONG, long))
    assert isinstance(router, SplitByLength)
    return router, tokens, requests


# --- the bookkeeping -----------------------------------------------------------------------


def test_long_prompts_go_to_their_pool_and_the_rest_to_the_least_loaded_other() -> None:
    router, tokens, _ = split()
    assert router(range(3), b"", LONG) == 2
    assert router(range(3), b"", LONG - 1) in (0, 1)
    tokens[0] = 500
    assert [router(range(3), b"", 10) for _ in range(3)] == [1, 1, 1]
    tokens[2] = 10**6  # a loaded long pool takes the long prompts all the same
    assert router(range(3), b"", 5 * LONG) == 2
    # with none of its pool among those with room, it picks among the others
    assert router([0, 1], b"", 5 * LONG) in (0, 1)


def test_a_request_waits_for_its_own_pool_unless_every_one_of_it_is_ejected() -> None:
    router, _, _ = split(long=frozenset({1, 2}))
    clock = VirtualClock()
    health = Health(3, clock)
    assert eligible(router, range(3), LONG, health) == [1, 2]
    assert eligible(router, range(3), 10, health) == [0]
    for _ in range(3):
        health.failed(0)
    assert eligible(router, range(3), 10, health) == [1, 2]  # the short pool is down: the long one serves
    for _ in range(3):
        health.failed(1)
    assert eligible(router, range(3), LONG, health) == [2]  # one of its pool still up
    for _ in range(3):
        health.failed(2)
    assert eligible(router, range(3), LONG, health) == [1, 2]  # every upstream down: its own are tried
    assert eligible(router, [0], LONG) == [0]  # its pool already tried (a retry): the other's
    # another router: the healthy ones, as before
    assert eligible(make_router("least-outstanding", [0] * 3, [0] * 3), range(3), LONG, Health(3, clock)) == [0, 1, 2]


def test_a_long_prompt_waits_for_room_in_its_pool_while_the_short_pool_has_room() -> None:
    router, _, _ = split(2, frozenset({1}))
    adm = Admission("tokens", [2 * LONG, 2 * LONG], [1, 1], queue_max=8, queue_timeout_s=30, starvation_s=5,
                    clock=VirtualClock())
    granted: list[Ticket] = []

    def offer(prompt: int) -> Ticket | Waiter:
        return adm.offer(prompt, eligible(router, range(2), prompt),
                         lambda room: router(room, b"", prompt), granted.append)

    first = offer(2 * LONG)
    assert isinstance(first, Ticket) and first.upstream == 1
    assert isinstance(offer(2 * LONG), Waiter)  # not sent to the short upstream, though it has room
    offer(10)  # (queued behind the long waiter, and let in at once: the line stops on the long pool only)
    assert [t.upstream for t in granted] == [0]
    adm.release(first)
    assert [t.upstream for t in granted] == [0, 1]


@pytest.mark.parametrize(("kw", "words"), [
    ({}, "goes with router"),
    ({"long_pool": LongPool(LONG, frozenset())}, "one upstream or more"),
    ({"long_pool": LongPool(LONG, frozenset({0, 1}))}, "not all"),
    ({"long_pool": LongPool(LONG, frozenset({5}))}, "not all"),
])
def test_the_split_router_is_refused_without_a_proper_pool(kw: dict[str, LongPool], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        make_router(SPLIT, [0, 0], [0, 0], **kw)


def test_a_pool_for_another_router_is_refused() -> None:
    with pytest.raises(ValueError, match="only with it"):
        make_router("least-outstanding", [0, 0], [0, 0], long_pool=LongPool(LONG, frozenset({1})))


# --- the config ------------------------------------------------------------------------------


UPSTREAMS = ["http://10.0.0.5:8000", "http://10.0.0.6:8000"]


def config(tmp_path: Path, gateway: str) -> GatewayConfig:
    path = tmp_path / "gw.toml"
    path.write_text("[gateway]\n" + gateway)
    return load_config(UPSTREAMS, host="127.0.0.1", port=8080, path=str(path))


def test_the_config_names_the_long_pool_by_url(tmp_path: Path) -> None:
    cfg = config(tmp_path, f'router = "{SPLIT}"\nlong_prompt_tokens = 8192\nlong_upstreams = ["http://10.0.0.6:8000/v1"]\n')
    assert cfg.long_pool() == LongPool(8192, frozenset({1}))
    # what a run through it records says which upstreams take the long prompts
    assert [u.get("long_prompts", False) for u in cfg.setup()["upstreams"]] == [False, True]


@pytest.mark.parametrize(("gateway", "words"), [
    ('long_prompt_tokens = 8192\n', 'only router = "split-by-length" acts on it'),
    ('router = "prefix-affinity"\nlong_upstreams = ["http://10.0.0.6:8000"]\n', "acts on it"),
    (f'router = "{SPLIT}"\nlong_prompt_tokens = 8192\n', "needs long_prompt_tokens"),
    (f'router = "{SPLIT}"\nlong_upstreams = ["http://10.0.0.6:8000"]\n', "needs long_prompt_tokens"),
    (f'router = "{SPLIT}"\nlong_prompt_tokens = 8192\nlong_upstreams = ["http://10.0.0.7:8000"]\n', "is not an upstream"),
    (f'router = "{SPLIT}"\nlong_prompt_tokens = 8192\nlong_upstreams = {UPSTREAMS}\n'.replace("'", '"'), "every upstream"),
    (f'router = "{SPLIT}"\nlong_prompt_tokens = 8192\nlong_upstreams = ["http://10.0.0.6:8000", "http://10.0.0.6:8000/v1"]\n',
     "named twice"),
    (f'router = "{SPLIT}"\nlong_prompt_tokens = 0\nlong_upstreams = ["http://10.0.0.6:8000"]\n', "at least 1"),
    (f'router = "{SPLIT}"\nlong_prompt_tokens = 8192\nlong_upstreams = "http://10.0.0.6:8000"\n', "a list"),
])
def test_a_split_half_given_or_given_to_another_router_is_refused(tmp_path: Path, gateway: str, words: str) -> None:
    with pytest.raises(UsageError, match=words) as e:
        config(tmp_path, gateway)
    assert "\n" not in str(e.value)


# --- the gateway, over loopback HTTP ---------------------------------------------------------


@pytest.fixture(scope="module")
def engines() -> Iterator[list[str]]:
    with ChildServer() as a, ChildServer() as b:
        yield [a.url, b.url]


def split_config(upstreams: list[str], long: str) -> GatewayConfig:
    return GatewayConfig(upstreams=tuple(UpstreamConfig(u) for u in upstreams), cache=CacheConfig(enabled=False),
                         admission=AdmissionConfig(tokenizer="builtin"), router=SPLIT, long_prompt_tokens=LONG,
                         long_upstreams=(long,))


async def test_the_gateway_sends_long_prompts_to_the_long_upstream_and_short_ones_to_the_other(engines: list[str]) -> None:
    async with serving(split_config(engines, engines[1])) as (url, _), aiohttp.ClientSession() as s:
        async with s.get(url + "/v1/models") as resp:
            model = (await resp.json())["data"][0]["id"]
        for i in range(6):
            text = f"question {i} " + ("about a long document " * 300 if i % 3 == 0 else "")
            answer = await post(s, url, chat_body(model, text))
            assert answer.status == 200, answer.body
        seen = await metrics(s, url)
    served = [total(seen, "gen_ai_server_request_duration_seconds_count", server_address=u.removeprefix("http://"))
              for u in engines]
    assert served == [4, 2]


async def test_a_long_prompt_goes_to_the_short_pool_when_its_own_upstream_is_down() -> None:
    async with FakeUpstream() as short, FakeUpstream() as long:
        async with serving(split_config([short.url, long.url], long.url)) as (url, gw), aiohttp.ClientSession() as s:
            assert (await post(s, url, chat_body("ok", "a long document " * 1000))).status == 200
            await long.__aexit__(None, None, None)  # (the gateway saw it list the model: it stays a candidate)
            for _ in range(5):
                answer = await post(s, url, chat_body("ok", "a long document " * 1000))
                assert answer.status == 200, answer.body  # tried on its own pool, then on the other
            assert gw.health.ejected(1)  # three failures: the last two went to the short pool at once
        posts = [sum(1 for r in u.seen if r["method"] == "POST") for u in (short, long)]
    assert posts == [5, 1]


def test_the_cli_refuses_a_split_without_its_pool_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(f'[gateway]\nrouter = "{SPLIT}"\nlong_prompt_tokens = 8192\n')
    r = CliRunner().invoke(main, ["gateway", "--upstream", UPSTREAMS[0], "--upstream", UPSTREAMS[1], "--config", str(path)])
    assert r.exit_code == 2 and "needs long_prompt_tokens" in r.output and len(r.output.strip().splitlines()) == 1, r.output
