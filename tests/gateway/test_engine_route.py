"""``inferlab gateway``'s ``/inferlab/engine``: its upstreams' answers when every one is
``inferlab sim serve``, so that a run through it is labelled a prediction
(``results.provenance``: kind ``gateway to sim serve``); 404 when any upstream is another
server or does not answer, so that a run through it is measured. A gateway run is never
rerun on one bare engine: advise, what-ifs and ``sim run --trace`` treat it as a
measured server's. Real loopback HTTP: ``sim serve`` and the gateway in child
processes, ``bench`` and ``sim run`` by their command line."""

from __future__ import annotations

import asyncio
import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fakeupstream import FakeUpstream
from faultserver import FaultServer
from gateway_helpers import serving

from inferlab._errors import InferlabError
from inferlab.analysis.advise import advise
from inferlab.analysis.whatif import WhatIf
from inferlab.gateway.config import (
    AdmissionConfig,
    GatewayConfig,
    KeyConfig,
    UpstreamConfig,
    hash_key,
)
from inferlab.load.run import HttpTarget, RunConfig, RunResult, run
from inferlab.load.schedules import ClosedLoop, LoadConfig
from inferlab.results.provenance import ENGINE_ROUTE, SERVER, ServerInfo, gateway_answer
from inferlab.sim.server.launch import ChildServer
from inferlab.workload.config import WorkloadConfig

SERVE = ["--max-model-len", "4096", "--gpu", "H100"]
#: The gateway's setup in words, as a run through a gateway of the defaults records it.
SETUP = "1 upstream, least-outstanding routing, admission by tokens (65,536 tokens per upstream, prompts counted by estimate), cache on"
BENCH = ["-n", "6", "-c", "2", "--input-tokens", "64", "--output-tokens", "16", "--api", "completions", "--no-history"]


def inferlab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferlab", *args], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "COLUMNS": "250"})


class GatewayProcess:
    """``inferlab gateway`` in a child process on a free loopback port."""

    def __init__(self, *upstreams: str) -> None:
        args = [a for u in upstreams for a in ("--upstream", u)]
        self.proc = subprocess.Popen([sys.executable, "-m", "inferlab", "gateway", *args, "--port", "0", "--announce"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("http://"):
            self.close()
            raise AssertionError(f"the gateway did not start: {self.proc.stderr.read() if self.proc.stderr else ''}")
        self.url = line.strip()

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


async def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.get(url + ENGINE_ROUTE, headers=headers or {}) as resp:
        return resp.status, await resp.json(content_type=None)


@pytest.fixture(scope="module")
def sim() -> Iterator[ChildServer]:
    with ChildServer(SERVE) as server:
        yield server


@pytest.fixture(scope="module")
def through_gateway(sim: ChildServer, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A ``bench`` through a gateway in front of ``sim serve``: its directory, its console
    output and the gateway's URL."""
    d = tmp_path_factory.mktemp("gw") / "run"
    gw = GatewayProcess(sim.url)
    try:
        p = inferlab("bench", "--url", gw.url, *BENCH, "-o", str(d))
    finally:
        gw.close()
    assert p.returncode == 0, p.stderr
    return d, p.stdout, gw.url


def test_bench_through_a_gateway_to_sim_serve_is_a_prediction(sim: ChildServer, through_gateway: tuple[Path, str, str]) -> None:
    d, out, url = through_gateway
    summary = json.loads((d / "summary.json").read_text())
    assert summary["server"] == {"simulated": True, "kind": "gateway to sim serve", "url": url + "/v1", "engine_family": "vllm",
                                 "gateway": SETUP}
    assert f"@ inferlab gateway at {url}/v1 in front of inferlab sim serve ({SETUP}) (prediction)" in " ".join(out.split())
    _, engine = asyncio.run(get(sim.url))
    recorded = json.loads((d / "config.json").read_text())["resolved"]["engine"]
    assert recorded == {"inferlab_gateway": {"upstreams": 1, "engines": [engine]}}


def test_a_sweep_through_a_gateway_to_sim_serve_names_the_gateway(sim: ChildServer, tmp_path: Path) -> None:
    gw = GatewayProcess(sim.url)
    try:
        p = inferlab("sweep", "--url", gw.url, "-c", "1,2", "-n", "4", "--input-tokens", "64", "--output-tokens", "4",
                     "--api", "completions", "--no-history", "-o", str(tmp_path / "sweep"))
    finally:
        gw.close()
    assert p.returncode == 0, p.stderr
    assert f"prediction (inferlab gateway at {gw.url}/v1 in front of inferlab sim serve ({SETUP}), over HTTP)" in " ".join(p.stdout.split())
    assert f"the server is inferlab gateway at {gw.url}/v1 in front of inferlab sim serve ({SETUP}): every number is a prediction" in p.stderr
    points = [line for line in p.stderr.splitlines() if line.startswith("  c=")]
    assert len(points) == 2 and all(line.endswith(" (prediction)") for line in points)


def _twin(run_dir: Path, to: Path, engine: dict[str, Any] | None) -> Path:
    """The run, as if its server had answered ``engine`` at ``/inferlab/engine``."""
    shutil.copytree(run_dir, to)
    config = json.loads((to / "config.json").read_text())
    config["resolved"]["engine"] = engine
    (to / "config.json").write_text(json.dumps(config))
    return to


def test_advise_and_replay_treat_a_gateway_run_as_a_measured_servers(
    sim: ChildServer, through_gateway: tuple[Path, str, str], tmp_path: Path,
) -> None:
    d, _, _ = through_gateway
    assert json.loads((d / "summary.json").read_text())["server"]["kind"] == "gateway to sim serve"
    measured = _twin(d, tmp_path / "measured", None)  # (what a real server's run records)
    _, engine = asyncio.run(get(sim.url))
    bare = _twin(d, tmp_path / "bare", engine)  # (the gateway's upstream's answer, passed on as its own)

    def rules(path: Path) -> list[tuple[str, list[dict[str, Any]]]]:
        return [(r["rule"], r["gains"]) for r in advise(path, "latency").to_json()["recommendations"]]

    # on the bare engine a what-if is made (so one would be here, were the gateway's answer taken for it) ...
    assert any(g["kind"].startswith("prediction: simulator") for _, gains in rules(bare) for g in gains)
    # ... but not for the gateway's run: the same advice as a measured server's
    assert rules(d) == rules(measured)
    with pytest.raises(InferlabError, match="went through inferlab gateway"):
        WhatIf(d, json.loads((d / "config.json").read_text())).simulate()
    # a replay of its requests runs on the flags given, as for a measured server's run, and says why
    replays, said = {}, {}
    for name, run_dir in (("gateway", d), ("measured", measured)):
        p = inferlab("sim", "run", "--trace", str(run_dir / "requests.jsonl"), "--no-history", "-o", str(tmp_path / name / "replay"))
        assert p.returncode == 0, p.stderr
        replays[name] = json.loads((tmp_path / name / "replay" / "config.json").read_text())["engine"]
        said[name] = p.stderr
    assert replays["gateway"] == replays["measured"]
    assert "replaying on the engine the run simulated" not in said["gateway"] + said["measured"]
    assert "the run went through inferlab gateway" in said["gateway"]


async def _bench(url: str, out: Path) -> RunResult:
    config = RunConfig(LoadConfig(ClosedLoop(2), num_requests=4), WorkloadConfig(input_tokens=64, output_tokens=8),
                       "chat", out_dir=str(out))
    async with asyncio.timeout(120):
        return await run(config, HttpTarget(url, None, preflight=False, workers=1))


async def test_the_gateway_answers_only_when_every_upstream_is_sim_serve(sim: ChildServer, tmp_path: Path) -> None:
    _, engine = await get(sim.url)
    async with FaultServer() as fault:
        async with serving(GatewayConfig((UpstreamConfig(sim.url),))) as (url, _):
            assert await get(url) == (200, gateway_answer([engine]))
        # a real server beside the simulated one: 404, as for a route the gateway does not have
        async with serving(GatewayConfig((UpstreamConfig(sim.url), UpstreamConfig(fault.url)))) as (url, _):
            status, body = await get(url)
            assert status == 404 and body["error"]["type"] == "NotFoundError"
            assert f"upstream 127.0.0.1:{fault.port} did not answer it" in body["error"]["message"]
            mixed = await _bench(url, tmp_path / "mixed")
        async with serving(GatewayConfig((UpstreamConfig(fault.url),))) as (url, _):
            real = await _bench(url, tmp_path / "real")
    # so a run through it is measured, even with its requests served by sim serve
    assert all(r.ok for r in mixed.records + real.records)
    assert mixed.summary.server == ServerInfo(False, SERVER, mixed.summary.server.url, None, None, SETUP.replace("1 upstream", "2 upstreams"))
    assert real.summary.server == ServerInfo(False, SERVER, real.summary.server.url, None, None, SETUP)


async def test_the_upstreams_are_asked_with_their_own_key_and_briefly(tmp_path: Path) -> None:
    silent = await asyncio.start_server(lambda r, w: asyncio.sleep(30), "127.0.0.1", 0)  # accepts, never answers
    silent_url = f"http://127.0.0.1:{silent.sockets[0].getsockname()[1]}"
    keys = (KeyConfig("alice", hash_key("sk-alice")),)
    async with FakeUpstream() as up:
        config = GatewayConfig((UpstreamConfig(up.url, api_key="sk-upstream"),), keys=keys)
        async with serving(config) as (url, _):
            status, body = await get(url)
            assert (status, body["error"]["type"]) == (401, "AuthenticationError")
            status, body = await get(url, {"Authorization": "Bearer sk-alice"})
            assert (status, body["error"]["type"]) == (404, "NotFoundError")  # (the fake upstream is no sim serve)
        asked = [s for s in up.seen if s["path"] == ENGINE_ROUTE]
        assert asked and all(s["method"] == "GET" and s["headers"].get("Authorization") == "Bearer sk-upstream" for s in asked)
    async with silent, serving(GatewayConfig((UpstreamConfig(silent_url),))) as (url, _):
        t0 = time.monotonic()
        status, _ = await get(url)
        assert status == 404 and time.monotonic() - t0 < 5  # (within the client's own wait: load.run)


async def test_a_run_through_the_gateway_to_any_engine_says_the_gateway_was_there(tmp_path: Path) -> None:
    """A run through the gateway to llama.cpp recorded only "@ http://127.0.0.1:18090
    (llama.cpp)", kind "server": the gateway answers /inferlab/engine only in front of
    sim serve. Whatever its upstreams, it now answers /inferlab/gateway with its setup,
    which the run records (``resolved.gateway``) and says, in front of the engine the
    model cards name; and its /metrics is said to be the gateway's own."""
    async with FakeUpstream(("ok",), owned_by="llamacpp") as up:
        config = GatewayConfig((UpstreamConfig(up.url),), admission=AdmissionConfig(max_tokens_in_flight=3500))
        async with serving(config) as (url, _):
            result = await _bench(url, tmp_path / "run")
    setup = "1 upstream, least-outstanding routing, admission by tokens (3,500 tokens per upstream, prompts counted by estimate), cache on"
    assert result.summary.server == ServerInfo(False, SERVER, url + "/v1", None, "llama.cpp", setup)
    assert result.summary.server.where == f"inferlab gateway at {url}/v1 in front of llama.cpp ({setup})"
    resolved = json.loads((tmp_path / "run" / "config.json").read_text())["resolved"]
    assert {k: v for k, v in resolved["gateway"].items() if k != "upstreams"} == {
        **{k: v for k, v in config.setup().items() if k != "upstreams"}, "max_model_len": {}} and resolved["engine"] is None
    # (no URL, no key; the software the upstream said it is: llama.cpp, its /props not answered)
    assert resolved["gateway"]["upstreams"] == [
        {"name": f"127.0.0.1:{up.port}", "software": {"name": "llama.cpp", "version": None, "source": None},
             "answered": True, "max_model_len": {}}]
    reason = json.loads((tmp_path / "run" / "summary.json").read_text())["server_metrics"]["reason"]
    assert "inferlab gateway's own metrics (inferlab_gateway_*" in reason
    p = inferlab("compare", str(tmp_path / "run"), str(tmp_path / "run"))
    assert f"@ inferlab gateway at {url}/v1 in front of llama.cpp ({setup})" in " ".join(p.stdout.split())
