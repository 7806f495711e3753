"""``POST /tokenize`` and ``/detokenize`` through the gateway: relayed to an upstream
serving the model, so that ``bench`` through the gateway sizes its prompts with the
engine's own counts, as it does straight at the engine. Without them bench fell back on
lengths calibrated from usage, and one trace sent 6 % fewer prompt tokens through the
gateway than straight at llama.cpp. Real loopback HTTP: ``sim serve`` in a child process
(vLLM's routes), the fake upstream (no such route), ``bench`` and ``compare`` by their
command line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from fakeupstream import FakeUpstream
from gateway_helpers import serving
from test_engine_route import GatewayProcess

from inferlab.gateway.config import GatewayConfig, KeyConfig, UpstreamConfig, hash_key
from inferlab.sim.server.launch import ChildServer

T = TypeVar("T")

BENCH = ["-n", "8", "-c", "2", "--input-tokens", "uniform:50:400", "--output-tokens", "4", "--seed", "5", "--no-history"]


@pytest.fixture(scope="module")
def sim() -> Iterator[ChildServer]:
    with ChildServer(["--max-model-len", "4096"]) as server:
        yield server


async def _post(url: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(url + path, json=body, headers=headers or {}) as resp:
        return resp.status, await resp.json(content_type=None)


async def test_tokenize_and_detokenize_answer_as_the_upstream_does(sim: ChildServer) -> None:
    async with aiohttp.ClientSession() as s, s.get(sim.url + "/v1/models") as resp:
        model = (await resp.json())["data"][0]["id"]
    text = {"model": model, "prompt": "the lighthouse keeper counts the ships at dusk", "add_special_tokens": False}
    chat = {"model": model, "messages": [{"role": "user", "content": "hello there"}]}
    async with serving(GatewayConfig((UpstreamConfig(sim.url),))) as (url, _):
        for body in (text, chat):
            assert await _post(url, "/tokenize", body) == await _post(sim.url, "/tokenize", body)
        _, counted = await _post(url, "/tokenize", text)
        assert await _post(url, "/detokenize", {"model": model, "tokens": counted["tokens"]}) == (200, {"prompt": text["prompt"]})
        # no model (llama.cpp's body has none): the one model the upstreams list
        assert await _post(url, "/tokenize", {"prompt": text["prompt"]}) == (200, counted)
        status, answer = await _post(url, "/tokenize", {**text, "model": "no-such-model"})
        assert status == 404 and answer["error"]["param"] == "model"


async def test_the_upstream_is_asked_with_its_own_key_at_the_same_route() -> None:
    keys = (KeyConfig("alice", hash_key("sk-alice")),)
    async with FakeUpstream() as up:
        config = GatewayConfig((UpstreamConfig(up.url, api_key="sk-upstream"),), keys=keys)
        async with serving(config) as (url, _):
            status, answer = await _post(url, "/tokenize", {"model": "ok", "prompt": "hi"})
            assert (status, answer["error"]["type"]) == (401, "AuthenticationError")
            # the fake upstream has no such route: its 404 comes back as it answered it
            status, answer = await _post(url, "/tokenize", {"model": "ok", "prompt": "hi"}, {"Authorization": "Bearer sk-alice"})
            assert status == 404 and answer["error"]["message"] == "no such route"
        (asked,) = [s for s in up.seen if s["path"] == "/tokenize"]
        assert asked["method"] == "POST" and asked["headers"]["Authorization"] == "Bearer sk-upstream"


def test_bench_through_the_gateway_sends_what_it_sends_straight_at_the_engine(sim: ChildServer, tmp_path: Path) -> None:
    def bench(url: str, out: Path) -> dict[str, Any]:
        p = subprocess.run([sys.executable, "-m", "inferlab", "bench", "--url", url, *BENCH, "-o", str(out)],
                           capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, p.stderr
        summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
        return summary

    direct, through = _direct_and_through(sim, lambda url, name: bench(url, tmp_path / name))
    assert direct["input_length_source"] == through["input_length_source"] == "exact (server /tokenize)"
    assert through["input_tokens"] == direct["input_tokens"]
    p = subprocess.run([sys.executable, "-m", "inferlab", "compare", str(tmp_path / "direct"), str(tmp_path / "gw"), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    # (compare finds no difference in what was sent: the same lengths, from the same
    # source; the gateway run's prompts, sent twice with one seed, come from the cache the
    # direct run filled, which compare says apart, as a caveat of that run)
    differences = json.loads(p.stdout)["comparisons"][0]["workload_differences"]
    assert differences == [], differences


def test_bench_through_the_gateway_refuses_prompts_over_the_context_as_straight_at_the_engine(
        sim: ChildServer, tmp_path: Path) -> None:
    """Prompts over the engine's 4,096-token context: bench straight at it refuses the run
    before sending (exit 2, the context named); through the gateway, which states that
    context, it refuses the same, where before it sent the requests to fail."""
    def bench(url: str, out: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "inferlab", "bench", "--url", url, "-n", "2", "-c", "1",
                               "--input-tokens", "5000", "--output-tokens", "4", "--no-history", "-o", str(out)],
                              capture_output=True, text=True, timeout=180)

    direct, through = _direct_and_through(sim, lambda url, name: bench(url, tmp_path / name))
    assert direct.returncode == through.returncode == 2, through.stderr
    assert "the server's 4,096-token context" in direct.stderr and "the server's 4,096-token context" in through.stderr
    assert not (tmp_path / "gw" / "requests.jsonl").exists()


def _direct_and_through(sim: ChildServer, run: Callable[[str, str], T]) -> tuple[T, T]:
    """``run(url, name)`` straight at ``sim`` ("direct") and then through a gateway in
    front of it ("gw")."""
    direct = run(sim.url, "direct")
    gw = GatewayProcess(sim.url)
    try:
        return direct, run(gw.url, "gw")
    finally:
        gw.close()
