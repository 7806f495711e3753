"""``sim serve --engine-family sglang`` serves SGLang's /metrics page (names, labels and
buckets of SGLang 0.5.11's collectors), not vLLM's, and bench reads its summary's
server metrics off it as off a real SGLang: the gauges, the histograms and the
prefix-cache counters (``sglang:cached_tokens_total`` over ``sglang:prompt_tokens_total``)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from simserver import HTTP_TIMEOUT_S, MAX_MODEL_LEN, MODEL

from inferlab import BenchConfig, ClosedLoop, LoadConfig, WorkloadConfig, bench_async
from inferlab.report.console import server_metrics_line
from inferlab.results.summary import FOREIGN_CACHE
from inferlab.results.telemetry import parse_prometheus, snapshot
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer
from inferlab.sim.server.prometheus import SGLANG_TTFT_BUCKETS_S


@pytest.fixture(scope="module")
def sglang() -> Iterator[EmbeddedServer]:
    config = ServerConfig(engine=EngineConfig(model=MODEL, max_model_len=MAX_MODEL_LEN, engine_family="sglang"))
    with EmbeddedServer(config) as srv:
        yield srv


def test_the_page_has_sglangs_names_labels_and_buckets_and_none_of_vllms(sglang: EmbeddedServer) -> None:
    with httpx.Client(base_url=sglang.url, timeout=HTTP_TIMEOUT_S) as http:
        r = http.post("/v1/completions", json={"model": MODEL, "prompt": "hello there", "max_tokens": 4})
        assert r.status_code == 200, r.text
        page = http.get("/metrics").text
    assert "vllm:" not in page
    samples = parse_prometheus(page)
    running = samples["sglang:num_running_reqs"]
    assert [list(labels) for labels, _ in running] == [["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]]
    assert running[0][0]["model_name"] == MODEL
    for name in ("sglang:num_queue_reqs", "sglang:token_usage", "sglang:cache_hit_rate", "sglang:prompt_tokens_total",
                 "sglang:generation_tokens_total", "sglang:num_requests_total", "inferlab:token_emit_lag_seconds_bucket"):
        assert name in samples, name
    assert samples["sglang:num_requests_total"][0][1] >= 1
    ttft = samples["sglang:time_to_first_token_seconds_bucket"]
    assert [float(labels["le"]) for labels, _ in ttft][:-1] == list(SGLANG_TTFT_BUCKETS_S)
    assert set(ttft[0][0]) == {"model_name", "engine_type", "le"}
    assert "# TYPE sglang:prompt_tokens counter" in page  # (prometheus_client's family name)
    assert "sglang:cached_tokens_total{" not in page  # (SGLang never adds a 0: no hit yet)
    # bench's vocabulary reads every gauge of its summary off the page (those of the pages
    # sampled during a run; a run under a second samples none)
    snap = snapshot(samples)
    assert snap.server == "sglang" and {"running", "waiting", "kv_usage"} <= set(snap.values)


def config(**workload: object) -> BenchConfig:
    return BenchConfig(LoadConfig(ClosedLoop(2), num_requests=6),
                       WorkloadConfig(output_tokens=4, **workload),  # type: ignore[arg-type]
                       preflight=False)


async def test_bench_reads_its_summary_off_the_sglang_page_and_the_seed_reruns_cache_hits(sglang: EmbeddedServer) -> None:
    first = await bench_async(config(input_tokens=300, prompt_salt="sglang-rerun"), sglang.url)
    m = first.summary.server_metrics
    assert m is not None and m.available and m.server == "sglang"
    assert server_metrics_line(m).startswith("sglang: ")  # (the console's "server /metrics" row)
    assert {"ttft_ms", "itl_ms", "e2e_ms", "queue_ms"} <= set(m.histograms)
    assert m.histograms["ttft_ms"].count == m.histograms["e2e_ms"].count >= 6
    assert m.counters["generation_tokens"] == first.summary.output_tokens  # (no warm-up here)
    # no retraction: its counter declared on the page with no sample yet is 0, not missing
    assert m.counters["preemptions"] == 0 and "preemptions" not in m.missing
    assert first.summary.cached_tokens is None  # (the simulated SGLang, like SGLang, says none without the flag)
    again = await bench_async(config(input_tokens=300, prompt_salt="sglang-rerun"), sglang.url)
    counted = again.summary.server_metrics.prefix_cache_tokens() if again.summary.server_metrics else None
    assert counted is not None and 0 < counted[0] <= counted[1]
    said = [w for w in again.summary.warnings if FOREIGN_CACHE in w]
    assert said and "/metrics counted" in said[0] and "as SGLang's do not without --enable-cache-report" in said[0]
    assert "vLLM" not in said[0], said[0]  # (the flag of the server measured, not another engine's)


def test_retractions_show_from_the_first_with_the_schedulers_labels() -> None:
    """``sglang:num_retracted_requests_total`` as SGLang 0.5.11's scheduler shows it: its
    HELP and TYPE always, a sample (the scheduler's labels) from the first retraction
    (the simulator's preemption); bench reads it as preemptions, 0 before the first."""
    from types import SimpleNamespace

    from inferlab.sim.server.prometheus import Histogram, SGLangRequests, render_sglang_metrics

    def page(retracted: int) -> str:
        engine = SimpleNamespace(num_running=1, num_waiting=0, kv_usage=0.5, preemptions_total=retracted)
        return render_sglang_metrics(MODEL, engine, SGLangRequests(), 0.0, Histogram((0.1,)), 0)  # type: ignore[arg-type]

    none, three = page(0), page(3)
    assert "# TYPE sglang:num_retracted_requests counter" in none and "sglang:num_retracted_requests_total{" not in none
    (row,) = parse_prometheus(three)["sglang:num_retracted_requests_total"]
    assert row == ({"model_name": MODEL, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}, 3.0)
    assert snapshot(parse_prometheus(none)).values["preemptions"] == 0
    assert snapshot(parse_prometheus(three)).values["preemptions"] == 3


async def test_bench_counts_the_simulated_sglangs_retractions_over_the_run() -> None:
    """A KV pool too small for eight answers of 200 tokens at once: whatever the simulated
    SGLang retracted during the run (how many depends on when the requests arrived), the
    summary's preemptions are the page's count, which was 0 before the run."""
    engine = EngineConfig(model=MODEL, max_model_len=512, engine_family="sglang", num_gpu_blocks_override=33)
    with EmbeddedServer(ServerConfig(engine=engine)) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=HTTP_TIMEOUT_S) as http:
            run = await bench_async(BenchConfig(LoadConfig(ClosedLoop(8), num_requests=16),
                                                WorkloadConfig(input_tokens=40, output_tokens=200), preflight=False), srv.url)
            page = (await http.get("/metrics")).text
    rows = parse_prometheus(page)["sglang:num_retracted_requests_total"]
    m = run.summary.server_metrics
    assert m is not None and m.available and m.counters["preemptions"] == sum(v for _, v in rows)
    assert run.summary.counts.completed == 16
