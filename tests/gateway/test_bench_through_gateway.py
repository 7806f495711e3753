"""What ``bench`` says of a run through ``inferlab gateway``, over loopback: how much of
its latency was the gateway's queue (from the gateway's own /metrics, gateway-wide over
the run), and the software behind it (the gateway identifies each upstream as bench
identifies a server, and says so at /inferlab/gateway)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
from fakeupstream import FakeUpstream
from gateway_helpers import serving
from rich.console import Console

from inferlab.gateway.config import AdmissionConfig, CacheConfig, GatewayConfig, UpstreamConfig
from inferlab.load.run import HttpTarget, RunConfig, RunResult, run
from inferlab.load.schedules import ClosedLoop, LoadConfig
from inferlab.report.console import render_summary
from inferlab.results.provenance import GATEWAY_ROUTE
from inferlab.results.summary import Summary
from inferlab.workload.config import WorkloadConfig


def config(*urls: str, **kw: object) -> GatewayConfig:
    return GatewayConfig(upstreams=tuple(UpstreamConfig(u) for u in urls), cache=CacheConfig(enabled=False),
                         **kw)  # type: ignore[arg-type]


async def _bench(url: str, out: Path, users: int, requests: int = 6) -> RunResult:
    cfg = RunConfig(LoadConfig(ClosedLoop(users), num_requests=requests), WorkloadConfig(input_tokens=32, output_tokens=4),
                    "chat", out_dir=str(out))
    async with asyncio.timeout(120):
        return await run(cfg, HttpTarget(url, None, preflight=False, workers=1))


def inferlab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferlab", *args], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "COLUMNS": "250"})


def _console(summary: Summary) -> str:
    buf = io.StringIO()
    render_summary(Console(file=buf, width=300), summary, "run")
    return " ".join(buf.getvalue().split())


async def test_a_run_through_the_gateway_says_how_long_its_queue_held_the_requests(tmp_path: Path) -> None:
    """One slot upstream (admission by requests, 1 in flight) and 3 users: requests wait
    in the gateway's queue, and the summary counts them, their wait a part of the TTFT
    measured; one user alone is admitted at once every time (no wait, not "queued")."""
    adm = AdmissionConfig(mode="requests", max_requests_in_flight=1, max_tokens_in_flight=None)
    async with FakeUpstream(("long",), long_chunks=4, gap_s=0.02, owned_by="vllm", version="0.11.0") as up, \
            serving(config(up.url, admission=adm)) as (url, _):
        busy = await _bench(url, tmp_path / "busy", users=3)
        alone = await _bench(url, tmp_path / "alone", users=1, requests=3)
    q = busy.summary.gateway_queue
    assert not isinstance(q, str) and q.available  # (not OMITTED: a dataclass)
    assert q.admitted == 6 and q.queued is not None and 1 <= q.queued < 6  # (each admitted once; the first at once)
    assert q.wait is not None and q.queued_mean_ms is not None
    assert 0 < q.wait.mean_ms <= q.queued_mean_ms
    ttft = busy.summary.ttft_ms
    assert ttft is not None and q.wait.mean_ms <= ttft.mean  # (the wait is part of each request's TTFT)
    assert q.refused == {"queue_full": 0, "queue_timeout": 0}
    a = alone.summary.gateway_queue
    assert not isinstance(a, str) and a.available and (a.admitted, a.queued) == (3, 0)
    assert a.wait is not None and a.wait.mean_ms == 0 and a.queued_mean_ms is None
    # summary.json's field, read back; the console's line; compare and report read the run
    d = json.loads((tmp_path / "busy" / "summary.json").read_text())["gateway_queue"]
    assert d["available"] and d["scope"].startswith("gateway-wide over the run") and d["admitted"] == 6
    assert Summary.from_json(json.loads((tmp_path / "busy" / "summary.json").read_text())).gateway_queue == q
    line = _console(busy.summary)
    assert f"gateway queue {q.queued} of 6 admissions waited" in line and "gateway-wide over the run" in line
    # (the client's own lag behind its schedule, above it, is not read as the gateway's queue)
    assert "Client send lag" in line and "Queue delay" not in line
    reason = json.loads((tmp_path / "busy" / "summary.json").read_text())["server_metrics"]["reason"]
    assert "inferlab gateway's own metrics" in reason and "gateway_queue" in reason
    p = inferlab("compare", str(tmp_path / "busy"), str(tmp_path / "alone"))
    assert p.returncode == 0 and "in front of vLLM 0.11.0" in " ".join(p.stdout.split()), p.stderr
    p = inferlab("report", str(tmp_path / "busy"), "-o", str(tmp_path / "report.html"))
    assert p.returncode == 0 and (tmp_path / "report.html").exists(), p.stderr


async def test_requests_that_timed_out_in_the_queue_are_not_in_the_wait_set_beside_the_ttft(tmp_path: Path) -> None:
    """A queue timeout (50 ms) far shorter than a request's hold on the one slot (4
    chunks 50 ms apart): some requests are refused after waiting, never admitted, and
    have no TTFT. The wait set beside the TTFT mean is the admitted requests' alone (one
    per completed request); the timed-out ones are named apart, as the failed 503s."""
    adm = AdmissionConfig(mode="requests", max_requests_in_flight=1, max_tokens_in_flight=None, queue_timeout_s=0.05)
    async with FakeUpstream(("long",), long_chunks=4, gap_s=0.05, owned_by="vllm") as up, \
            serving(config(up.url, admission=adm)) as (url, _):
        result = await _bench(url, tmp_path / "run", users=3, requests=6)
    counts, q = result.summary.counts, result.summary.gateway_queue
    assert not isinstance(q, str) and q.available
    assert counts.completed >= 1 and counts.failed >= 1  # (the first admitted at once; the others waited)
    assert q.admitted == counts.completed and q.refused["queue_timeout"] == counts.failed
    assert q.wait is not None and q.wait.count == counts.completed
    line = _console(result.summary)
    assert f"refused, not admitted (503): {counts.failed} timed out waiting" in line
    assert f"of {counts.completed} admissions waited; admitted requests' wait mean" in line


async def test_a_run_through_the_gateway_names_the_engine_release_behind_it(tmp_path: Path) -> None:
    """The gateway asks its upstream what it is (vLLM's /version), as bench asks a
    server, and says so at /inferlab/gateway (no URL, no key): the run reads "inferlab
    gateway at URL in front of vLLM 0.11.0", where before it knew the name alone."""
    async with FakeUpstream(("ok",), owned_by="vllm", version="0.11.0") as up, serving(config(up.url)) as (url, _):
        result = await _bench(url, tmp_path / "run", users=1, requests=2)
    server = result.summary.server
    assert server.software == "vLLM 0.11.0"
    assert server.where.startswith(f"inferlab gateway at {url}/v1 in front of vLLM 0.11.0 (1 upstream")
    resolved = json.loads((tmp_path / "run" / "config.json").read_text())["resolved"]
    assert resolved["gateway"]["upstreams"] == [
        {"name": f"127.0.0.1:{up.port}", "software": {"name": "vLLM", "version": "0.11.0", "source": "GET /version"},
         "answered": True, "max_model_len": {}}]


async def _setup(url: str) -> dict[str, object]:
    async with aiohttp.ClientSession() as s, s.get(url + GATEWAY_ROUTE) as resp:
        assert resp.status == 200
        body = await resp.json()
        assert isinstance(body, dict)
        return body


async def test_upstreams_that_differ_are_each_named_and_no_release_is_made_up() -> None:
    """Two upstreams of different software are listed each with its own (by name,
    host:port); one that states no release is named without one; one that names no
    software bench knows is "an unidentified server"; all the same: said once."""
    from inferlab.results.provenance import describe_behind_gateway

    async with FakeUpstream(("ok",), owned_by="vllm", version="0.11.0") as v, \
            FakeUpstream(("ok",), owned_by="llamacpp", build_info="b6000-1a2b3c4") as ll, \
            FakeUpstream(("ok",), owned_by="vllm") as quiet, FakeUpstream(("ok",)) as other, \
            FakeUpstream(("ok",), owned_by="vllm", version="0.11.0") as v2:
        async with serving(config(v.url, ll.url)) as (url, _):
            mixed = await _setup(url)
        async with serving(config(v.url, quiet.url, other.url)) as (url, _):
            partial = await _setup(url)
        async with serving(config(v.url, v2.url)) as (url, _):
            same = await _setup(url)
            asked = sum(1 for r in v.seen if r["path"] == "/version")
            await _setup(url)  # (known: not asked again)
            assert sum(1 for r in v.seen if r["path"] == "/version") == asked
    assert describe_behind_gateway(mixed) == f"vLLM 0.11.0 (127.0.0.1:{v.port}), llama.cpp b6000-1a2b3c4 (127.0.0.1:{ll.port})"
    assert describe_behind_gateway(partial) == (f"vLLM 0.11.0 (127.0.0.1:{v.port}), vLLM (127.0.0.1:{quiet.port}), "
                                                f"an unidentified server (127.0.0.1:{other.port})")
    assert describe_behind_gateway(same) == "vLLM 0.11.0"
    for setup in (mixed, partial, same):
        text = json.dumps(setup)
        assert "http://" not in text


async def test_an_upstream_that_did_not_answer_is_not_called_one_that_named_nothing() -> None:
    """Beside a vLLM, one upstream answers but names no software bench knows, another is
    down (its port closed): the setup says which answered, and the summary's words
    tell "an unidentified server" from "an upstream that did not answer"."""
    from inferlab.results.provenance import describe_behind_gateway

    async with FakeUpstream(("ok",)) as gone:
        dead = gone.url
    async with FakeUpstream(("ok",), owned_by="vllm", version="0.11.0") as v, FakeUpstream(("ok",)) as other, \
            serving(config(v.url, other.url, dead)) as (url, _):
        setup = await _setup(url)
    ups = setup["upstreams"]
    assert isinstance(ups, list)
    assert [(u["software"] is None, u["answered"]) for u in ups] == [(False, True), (True, True), (True, False)]
    assert describe_behind_gateway(setup) == (f"vLLM 0.11.0 (127.0.0.1:{v.port}), an unidentified server "
                                              f"(127.0.0.1:{other.port}), an upstream that did not answer "
                                              f"({dead.removeprefix('http://')})")


async def test_the_gateway_states_the_context_a_request_has_through_it() -> None:
    """Two llama.cpp upstreams (their slot contexts in /props, none in /v1/models): the
    gateway's card and setup state the larger (a prompt over it every upstream refuses),
    its setup each upstream's own; beside an upstream that states none, nothing."""
    async with FakeUpstream(("ok",), owned_by="llamacpp", n_ctx=2048) as small, \
            FakeUpstream(("ok",), owned_by="llamacpp", n_ctx=4096) as large, FakeUpstream(("ok",)) as silent:
        async with serving(config(small.url, large.url)) as (url, _), aiohttp.ClientSession() as s:
            async with s.get(url + "/v1/models") as resp:
                (card,) = (await resp.json())["data"]
            setup = await _setup(url)
        async with serving(config(small.url, silent.url)) as (url, _), aiohttp.ClientSession() as s:
            async with s.get(url + "/v1/models") as resp:
                (unknown,) = (await resp.json())["data"]
            partial = await _setup(url)
    assert card["max_model_len"] == 4096 and setup["max_model_len"] == {"ok": 4096}
    assert [u["max_model_len"] for u in setup["upstreams"]] == [{"ok": 2048}, {"ok": 4096}]  # type: ignore[index, union-attr]
    assert "max_model_len" not in unknown and partial["max_model_len"] == {}


async def test_compare_names_the_gateway_one_run_went_through_and_its_setup(tmp_path: Path) -> None:
    """The same load straight at an upstream, through a gateway over it, and through one
    over two upstreams admitting by requests: compare names the gateway as a server
    difference (there or not; its setup), and warns that one run's TTFT includes it."""
    adm = AdmissionConfig(mode="requests", max_requests_in_flight=1, max_tokens_in_flight=None)
    async with FakeUpstream(("ok",), owned_by="vllm") as a, FakeUpstream(("ok",), owned_by="vllm") as b:
        await _bench(a.url, tmp_path / "direct", users=1, requests=2)
        async with serving(config(a.url)) as (url, _):
            await _bench(url, tmp_path / "one", users=1, requests=2)
        async with serving(config(a.url, b.url, admission=adm)) as (url, _):
            await _bench(url, tmp_path / "two", users=1, requests=2)
    p = inferlab("compare", str(tmp_path / "direct"), str(tmp_path / "one"), str(tmp_path / "two"), "--json")
    assert p.returncode == 0, p.stderr
    one, two = json.loads(p.stdout)["comparisons"]
    assert [(d["setting"], d["a"]) for d in one["engine_differences"]] == [("resolved.gateway", "no gateway")]
    assert one["engine_differences"][0]["b"].startswith("inferlab gateway (1 upstream")
    assert "one went through inferlab gateway and direct did not" in p.stderr
    p = inferlab("compare", str(tmp_path / "one"), str(tmp_path / "two"), "--json")
    (two,) = json.loads(p.stdout)["comparisons"]
    changed = {d["setting"]: (d["a"], d["b"]) for d in two["engine_differences"]}
    assert changed["resolved.gateway.upstreams"] == (1, 2)
    assert changed["resolved.gateway.admission.mode"] == ("tokens", "requests")
    assert "went through inferlab gateway" not in p.stderr  # (both did)
    p = inferlab("compare", str(tmp_path / "direct"), str(tmp_path / "one"))
    text = " ".join(p.stdout.split())
    assert "warning: one went through inferlab gateway and direct did not" in text
    assert "one's server differs from direct's" in text


async def test_through_the_gateway_its_queue_is_named_in_the_ttft_line_and_is_a_part_of_the_breakdown(tmp_path: Path) -> None:
    """inferlab gateway (one request in flight) in front of the simulated server, 3 users:
    the client-vs-server TTFT line named only the network, the HTTP stacks, the client and
    the simulator, and the breakdown put the gateway's queue in "other"."""
    from inferlab.sim.engine.engine import EngineConfig
    from inferlab.sim.server.app import ServerConfig
    from inferlab.sim.server.launch import EmbeddedServer

    adm = AdmissionConfig(mode="requests", max_requests_in_flight=1, max_tokens_in_flight=None)
    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=4096))) as sim:
        async with serving(config(sim.url, admission=adm)) as (url, _):
            result = await _bench(url, tmp_path / "run", users=3, requests=9)
    s = result.summary
    q, b = s.gateway_queue, s.latency_breakdown
    assert not isinstance(q, str) and q.available and q.wait is not None and q.wait.mean_ms > 0
    assert b is not None and b.gateway_queue_ms is not None and b.gateway_queue_ms.mean == q.wait.mean_ms
    assert "gateway queue" in b.source
    line = _console(s)
    assert "the simulator's own lateness" in line
    assert "(server TTFT p50" in line and "inferlab gateway's queue (its admitted requests' wait mean" in line
    assert f"gateway queue {q.wait.mean_ms:,.1f}" in line.split("latency breakdown", 1)[1]
