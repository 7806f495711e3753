"""The server's /metrics around a run, over real loopback HTTP: the simulated server's
counters move by exactly what the run's usage says; a server without the page is no
error."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from faultserver import FaultServer

from inferlab import ClosedLoop, HttpTarget, LoadConfig, RunConfig, WorkloadConfig, run
from inferlab.results.runfiles import read_summary
from inferlab.results.telemetry import SERVER_METRICS_FILE, ServerMetrics
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer

LIMIT_S = 60.0


async def test_the_simulated_servers_counters_match_the_runs_usage(tmp_path: Path) -> None:
    config = RunConfig(
        LoadConfig(ClosedLoop(4), num_requests=12, warmup=2),
        WorkloadConfig(output_tokens=20, prefix_groups=1, prefix_tokens=200, suffix_tokens=100),
        out_dir=str(tmp_path),
    )
    with EmbeddedServer(ServerConfig(engine=EngineConfig(max_model_len=4096), enable_prompt_tokens_details=True)) as sim:
        async with asyncio.timeout(LIMIT_S):
            result = await run(config, HttpTarget(sim.url))
    m = result.summary.server_metrics
    assert isinstance(m, ServerMetrics) and m.available and m.server == "vllm"
    warm = [r for r in result.records if r.warmup]  # the server counts warm-up requests too
    every = [r for r in result.records if r.ok]
    assert m.counters["prompt_tokens"] == sum(r.input_tokens or 0 for r in every)
    assert m.counters["generation_tokens"] == sum(r.output_tokens or 0 for r in every)
    assert m.counters["requests_finished"] == len(every) == 12 + len(warm)
    assert m.counters["prefix_cache_hits_tokens"] == sum(r.cached_tokens or 0 for r in every) > 0
    assert m.histograms["ttft_ms"].count == len(every)
    # gauges only from pages read during the run (a run shorter than the first has none)
    assert m.gauges["running"].max <= 4 if m.samples else m.gauges == {}
    # where the time went, per request, from the simulated server's own timeline
    b = result.summary.latency_breakdown
    assert b is not None and b.source.startswith("the server's timeline") and b.requests == 12
    assert b.prefill_ms is not None and b.decode_ms is not None and b.decode_ms.mean > b.prefill_ms.mean > 0  # 20 tokens out, prefix cached
    # the summary on disk reads back the same, and the pages are in the run directory
    assert read_summary(tmp_path / "summary.json").server_metrics == m
    lines = [json.loads(x) for x in (tmp_path / SERVER_METRICS_FILE).read_text().splitlines()]
    assert len(lines) == m.samples + 2  # before, during, after
    assert [x["t_s"] for x in lines] == sorted(x["t_s"] for x in lines)
    assert lines[-1]["generation_tokens"] - lines[0]["generation_tokens"] == m.counters["generation_tokens"]


async def test_a_served_name_with_a_quote_a_backslash_and_a_newline_is_read_end_to_end(tmp_path: Path) -> None:
    """The simulated server wrote such a name raw: the newline cut every sample line in
    two, and the run's server metrics were "no metric inferlab knows"."""
    name = 'my"mo\\del\nv2'
    config = RunConfig(LoadConfig(ClosedLoop(2), num_requests=4), WorkloadConfig(output_tokens=5), out_dir=str(tmp_path))
    with EmbeddedServer(ServerConfig(served_model_name=name)) as sim:
        async with asyncio.timeout(LIMIT_S):
            result = await run(config, HttpTarget(sim.url))
    m = result.summary.server_metrics
    assert isinstance(m, ServerMetrics) and m.available and m.server == "vllm", m
    assert m.counters["requests_finished"] == 4 == result.summary.counts.completed
    assert m.counters["generation_tokens"] == sum(r.output_tokens or 0 for r in result.records)


async def test_a_server_without_metrics_is_not_available_and_the_run_goes_on(tmp_path: Path) -> None:
    config = RunConfig(LoadConfig(ClosedLoop(1), num_requests=2), out_dir=str(tmp_path))
    async with FaultServer() as srv, asyncio.timeout(LIMIT_S):
        result = await run(config, HttpTarget(srv.url, model="normal", preflight=False))
    m = result.summary.server_metrics
    assert isinstance(m, ServerMetrics) and not m.available
    assert m.reason is not None and "HTTP 404" in m.reason and "/metrics" in m.reason
    assert result.summary.counts.completed == 2
    assert not (tmp_path / SERVER_METRICS_FILE).exists()
    assert json.loads((tmp_path / "summary.json").read_text())["server_metrics"]["available"] is False


async def test_reading_metrics_can_be_turned_off(tmp_path: Path) -> None:
    config = RunConfig(LoadConfig(ClosedLoop(1), num_requests=1))
    async with FaultServer() as srv, asyncio.timeout(LIMIT_S):
        result = await run(config, HttpTarget(srv.url, model="normal", preflight=False, server_metrics=False))
    assert "server_metrics" not in result.summary.to_json()


async def test_a_server_gone_by_the_end_keeps_what_was_read_during_the_run() -> None:
    """An engine that died mid-run: the page after the run could not be read, and the
    pages read during it were thrown away ({"available": false}). The counters now end
    at the last page sampled, which is said."""
    from aiohttp import web

    from inferlab._clock import WallClock
    from inferlab.client.metrics import MetricsSampler

    pages = 0
    four = asyncio.Event()  # the page before, and three during the run

    async def metrics(_: web.Request) -> web.Response:
        nonlocal pages
        pages += 1
        if pages >= 4:
            four.set()
        return web.Response(text=f"vllm:prompt_tokens_total {100 * pages}\nvllm:generation_tokens_total {10 * pages}\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    sampler = MetricsSampler(f"http://127.0.0.1:{port}/v1", WallClock(), interval_s=0.02)
    try:
        async with asyncio.timeout(LIMIT_S):
            await sampler.start()
            await four.wait()
            await runner.cleanup()  # the server goes
            m = await sampler.stop()
    finally:
        await runner.cleanup()
    assert m.available and m.reason is not None and "could not be read" in m.reason
    read = len(sampler.series)  # (pages read: the first before the run, the last during it)
    assert m.counters["prompt_tokens"] == 100 * (read - 1) and m.counters["generation_tokens"] == 10 * (read - 1)
    assert ServerMetrics.from_json(m.to_json()) == m


def test_one_page_under_two_names_is_refused_and_pages_a_server_tells_apart_are_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``one_name_each``: one address, port, path and query named by its address (or as
    localhost) and by a name is one page; two names of one address may be an ingress's
    virtual hosts, and another query another page: not refused. A bad port names the URL."""
    import socket

    from inferlab.client.metrics import one_name_each, page_url

    table = {"engine-a.example": "10.0.0.5", "engine-b.example": "10.0.0.5", "10.0.0.5": "10.0.0.5",
             "localhost": "127.0.0.1", "127.0.0.1": "127.0.0.1", "0.0.0.0": "0.0.0.0", "10.0.0.6": "10.0.0.6",
             "127.1": "127.0.0.1", "::ffff:127.0.0.1": "::ffff:127.0.0.1", "::1": "::1"}

    def resolve(host: str, port: int, *args: object, **kw: object) -> list[tuple[object, ...]]:
        if host not in table:
            raise socket.gaierror("not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (table[host], port))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    for pair in (("http://localhost:8000/metrics", "http://127.0.0.1:8000/metrics/"),
                 ("http://engine-a.example/metrics", "http://10.0.0.5:80/metrics"),
                 ("http://0.0.0.0:8000/metrics", "http://127.0.0.1:8000/metrics"),
                 # one name written two ways (a port or a case that changes nothing)
                 ("http://Engine-A.example/metrics", "http://engine-a.example:80/metrics"),
                 ("https://engine-a.example/metrics", "https://engine-a.example:443/metrics"),
                 ("http://127.1:8000/metrics", "http://localhost:8000/metrics"),
                 ("http://[::ffff:127.0.0.1]:8000/metrics", "http://127.0.0.1:8000/metrics")):
        with pytest.raises(ValueError, match="name each server once"):
            one_name_each(pair)
    for pair in (("http://engine-a.example/metrics", "http://engine-b.example/metrics"),  # (virtual hosts)
                 ("http://127.0.0.1:8000/metrics", "http://127.0.0.1:8001/metrics"),
                 ("http://127.0.0.1:8000/probe?target=a", "http://localhost:8000/probe?target=b"),
                 ("http://127.0.0.1:8000/metrics", "https://127.0.0.1:8000/metrics"),
                 ("http://10.0.0.5/metrics", "http://10.0.0.6/metrics"),
                 ("http://0.0.0.0:8000/metrics", "http://[::1]:8000/metrics"),  # (0.0.0.0 reaches 127.0.0.1 only)
                 ("http://nowhere.example/metrics", "http://nowhere.example/metrics")):  # (left to the read)
        one_name_each(pair)
    for bad in ("http://localhost:99999/metrics", "http://localhost:abc/metrics"):
        with pytest.raises(ValueError, match=rf"--metrics-url '{bad}': Port"):
            page_url(bad)
