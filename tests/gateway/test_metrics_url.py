"""``bench --metrics-url``: the engines' own /metrics read where the API URL's page is not
theirs (inferlab gateway in front), several pages read as one server's, and the pages a
user named refused before the run when they do not answer. Real loopback HTTP: the
simulated server (as vLLM by default: its answers do not say their cached tokens)
behind the gateway."""

from __future__ import annotations

import asyncio
import io
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from gateway_helpers import serving
from rich.console import Console

from inferlab import BenchConfig, ClosedLoop, LoadConfig, WorkloadConfig, bench_async
from inferlab.cli.main import main
from inferlab.gateway.config import AdmissionConfig, CacheConfig, GatewayConfig, UpstreamConfig
from inferlab.load.run import RunResult
from inferlab.report.console import render_summary
from inferlab.results.summary import Summary
from inferlab.results.telemetry import ServerMetrics
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer

LIMIT_S = 120.0
#: One request in flight upstream: with two users, requests wait in the gateway's queue.
ONE_AT_A_TIME = AdmissionConfig(mode="requests", max_requests_in_flight=1, max_tokens_in_flight=None)


@pytest.fixture
def plain() -> Iterator[EmbeddedServer]:
    """A simulated server started without ``--enable-prompt-tokens-details``."""
    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=4096))) as server:
        yield server


def gateway(*upstreams: str, admission: AdmissionConfig | None = None) -> GatewayConfig:
    return GatewayConfig(tuple(UpstreamConfig(u) for u in upstreams), cache=CacheConfig(enabled=False),
                         **({"admission": admission} if admission else {}))  # type: ignore[arg-type]


def config(salt: str | None, *pages: str, out: Path | None = None, requests: int = 8) -> BenchConfig:
    return BenchConfig(LoadConfig(ClosedLoop(2), num_requests=requests), WorkloadConfig(input_tokens=400, output_tokens=4,
                       prompt_salt=salt), preflight=False, workers=1, metrics_urls=pages,
                       out_dir=None if out is None else str(out))


async def bench(cfg: BenchConfig, url: str) -> RunResult:
    async with asyncio.timeout(LIMIT_S):
        return await bench_async(cfg, url)


def console(summary: Summary) -> str:
    buf = io.StringIO()
    render_summary(Console(file=buf, width=400), summary, "run")
    return " ".join(buf.getvalue().split())


async def test_behind_the_gateway_the_engines_metrics_say_a_rerun_was_served_from_its_cache(
        plain: EmbeddedServer, tmp_path: Path) -> None:
    """The gateway's /metrics are its own: a rerun with the same --seed could only be
    said unchecked. With --metrics-url naming the engine's page, its counters say how
    much of the rerun its prefix cache served, and the gateway's queue is still read
    off the gateway's own page."""
    engine = f"{plain.url}/metrics"
    async with serving(gateway(plain.url, admission=ONE_AT_A_TIME)) as (url, _):
        await bench(config("again", engine), url)
        read = await bench(config("again", engine, out=tmp_path / "read"), url)
        await bench(config("unread"), url)
        unread = await bench(config("unread"), url)
    s = read.summary
    assert s.cached_tokens is None  # (the answers said nothing)
    (warning,) = [w for w in s.warnings if "prefix cache" in w]
    assert "/metrics counted" in warning and "though this run's prompts share no prefix" in warning
    m = s.server_metrics
    assert isinstance(m, ServerMetrics) and m.available and m.server == "vllm"
    counted = m.prefix_cache_tokens()
    assert counted is not None and f"{counted[0]:,} of {counted[1]:,} prompt tokens" in warning
    assert m.counters["requests_finished"] == 8 == s.counts.completed  # (the engine's own, through the gateway)
    line = console(s)
    assert f"the server's /metrics counted {counted[0]:,} of {counted[1]:,} prompt tokens cached" in line
    assert f"read from {engine} (--metrics-url)" in line
    # the gateway's queue, from its own page
    q = s.gateway_queue
    assert not isinstance(q, str) and q.available and q.admitted == 8 and q.wait is not None
    b = s.latency_breakdown
    assert b is not None and b.gateway_queue_ms is not None and b.gateway_queue_ms.mean == q.wait.mean_ms
    written = json.loads((tmp_path / "read" / "config.json").read_text())
    assert written["metrics_urls"] == [engine] and written["resolved"]["metrics_urls"] == [engine]
    # without it: unchecked, and the warning says what reads the engine's page
    (warning,) = [w for w in unread.summary.warnings if "prefix" in w]
    assert "this run cannot tell" in warning and "--metrics-url" in warning
    q = unread.summary.gateway_queue
    assert not isinstance(q, str) and q.available and q.admitted == 8


def _counter(url: str, name: str) -> float:
    """A counter off a server's page read with a plain GET, its label sets added up."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith((name + "{", name + " ")))


async def test_two_pages_are_read_as_one_servers(tmp_path: Path) -> None:
    """Two engines behind the gateway (round-robin), both pages named: the summary's
    counters are the two servers' own counters' moves added up."""
    names = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total")
    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=4096))) as a, \
            EmbeddedServer(ServerConfig(EngineConfig(max_model_len=4096))) as b:
        pages = (f"{a.url}/metrics", f"{b.url}/metrics")
        before = {(p, n): _counter(p, n) for p in pages for n in names}
        async with serving(gateway(a.url, b.url)) as (url, _):
            result = await bench(config(None, *pages, out=tmp_path, requests=10), url)
        moved = {(p, n): _counter(p, n) - before[p, n] for p in pages for n in names}
    m = result.summary.server_metrics
    assert isinstance(m, ServerMetrics) and m.available
    assert all(moved[p, "vllm:request_success_total"] > 0 for p in pages)  # (each served some)
    for ours, theirs in zip(("prompt_tokens", "generation_tokens", "requests_finished"), names, strict=True):
        assert m.counters[ours] == moved[pages[0], theirs] + moved[pages[1], theirs]
    assert m.counters["requests_finished"] == 10 == m.histograms["ttft_ms"].count  # (histograms summed too)
    resolved = json.loads((tmp_path / "config.json").read_text())["resolved"]
    assert resolved["metrics_urls"] == list(pages)
    assert f"read from {pages[0]} + {pages[1]} (--metrics-url)" in console(result.summary)


def _bench_cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["bench", "-n", "2", "-c", "1", "--no-preflight", *args])
    return res.exit_code, res.output


def test_pages_that_cannot_be_read_are_refused_before_the_run(plain: EmbeddedServer, tmp_path: Path) -> None:
    """A page the user named that does not answer, or answers with no metrics an engine
    has, was never read: refused before the run (exit 1, one line, no run written),
    rather than "not available" afterwards; bad URLs and flags that cannot go together
    are usage errors (exit 2)."""
    with EmbeddedServer(ServerConfig()) as dead:
        gone = f"{dead.url}/metrics"
    for page, said in ((gone, "cannot connect"), (f"{plain.url}/v1/models", "no metric inferlab knows"),
                       (f"{plain.url}/nothing", "http 404")):
        out = tmp_path / said.replace(" ", "-")
        code, output = _bench_cli("--url", plain.url, "--metrics-url", f"{plain.url}/metrics", "--metrics-url", page,
                                  "--out", str(out))
        assert code == 1, output
        assert f"--metrics-url {page}: " in output and said in output.lower() and len(output.strip().splitlines()) == 1
        assert not (out / "summary.json").exists()
    for args, said in (
        (("--url", plain.url, "--metrics-url", "ftp://127.0.0.1/metrics"), "not an http(s) URL"),
        (("--url", plain.url, "--metrics-url", plain.url), "no path"),
        (("--url", plain.url, "--metrics-url", f"{plain.url}/metrics", "--no-server-metrics"), "--no-server-metrics"),
        (("--metrics-url", f"{plain.url}/metrics"), "needs --url"),
        # one page under two names (this machine's localhost is 127.0.0.1): refused, not added twice
        (("--url", plain.url, "--metrics-url", f"{plain.url}/metrics", "--metrics-url",
          f"{plain.url.replace('127.0.0.1', 'localhost')}/metrics/"), "name each server once"),
    ):
        code, output = _bench_cli(*args)
        assert code == 2 and said in output and len(output.strip().splitlines()) == 1, output


async def test_a_page_that_stops_answering_during_the_run_is_recorded_not_refused(plain: EmbeddedServer) -> None:
    """Refused before the run only: a named page gone during it leaves the run going on
    and its server metrics saying which page failed, as a single page's would; no sum of
    the pages left is passed off as the server's."""
    other = EmbeddedServer(ServerConfig(EngineConfig(max_model_len=4096)))
    page = f"{other.url}/metrics"
    done = 0

    def stop_it(_: object) -> None:
        nonlocal done
        done += 1
        if done == 2:
            other.close()

    cfg = config(None, f"{plain.url}/metrics", page, requests=6)
    try:
        async with asyncio.timeout(LIMIT_S):
            result = await bench_async(cfg, plain.url, on_record=stop_it)
    finally:
        other.close()
    assert result.summary.counts.completed == 6
    m = result.summary.server_metrics
    assert isinstance(m, ServerMetrics) and m.reason is not None and page in m.reason
    assert not m.available or "the counters end at the last page sampled during it" in m.reason

