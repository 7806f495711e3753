"""Runs that would silently measure something else: a rerun hitting the prefix cache the
last run left on the server, and a replay sending the chat template on top of the
lengths it replays."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferlab import (
    BenchConfig,
    ClosedLoop,
    LoadConfig,
    RequestRecord,
    RunConfig,
    SimTarget,
    WorkloadConfig,
    bench_async,
    run,
)
from inferlab.gateway.app import Gateway, start
from inferlab.gateway.config import CacheConfig, GatewayConfig, UpstreamConfig
from inferlab.load.run import _unintended_cache_hits
from inferlab.load.schedules import Replay
from inferlab.results.runfiles import read_records
from inferlab.results.summary import foreign_cache
from inferlab.results.telemetry import ServerMetrics
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer
from inferlab.workload.traces import TraceConfig


@pytest.fixture(scope="module")
def sim() -> Iterator[EmbeddedServer]:
    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=4096), enable_prompt_tokens_details=True)) as server:
        yield server


def config(salt: str | None, out: Path | None = None) -> BenchConfig:
    return BenchConfig(
        LoadConfig(ClosedLoop(4), num_requests=8),
        WorkloadConfig(input_tokens=400, output_tokens=4, prompt_salt=salt),
        out_dir=None if out is None else str(out),
    )


async def test_each_run_sends_fresh_prompts_so_a_rerun_does_not_measure_the_cache(sim: EmbeddedServer, tmp_path: Path) -> None:
    first = await bench_async(config(None, tmp_path / "a"), sim.url)
    again = await bench_async(config(None, tmp_path / "b"), sim.url)
    assert first.summary.cached_tokens == again.summary.cached_tokens == 0
    salts = [json.loads((tmp_path / d / "config.json").read_text())["resolved"]["prompt_salt"] for d in "ab"]
    assert salts[0] != salts[1] and all(salts)  # recorded: the run can be repeated with its salt


async def test_the_same_salt_repeats_a_run_and_the_cache_hits_are_called_out(sim: EmbeddedServer) -> None:
    await bench_async(config("repeat"), sim.url)
    again = await bench_async(config("repeat"), sim.url)
    assert again.summary.cached_tokens is not None and again.summary.input_tokens is not None
    assert again.summary.cached_tokens > again.summary.input_tokens / 2
    assert any("from its prefix cache, though this run's prompts share no prefix" in w for w in again.summary.warnings)


async def test_the_same_prompt_every_request_is_called_out_as_measuring_the_cache(sim: EmbeddedServer) -> None:
    long = " ".join(f"word{i}" for i in range(120))  # several cache blocks beyond the template
    fixed = await bench_async(BenchConfig(LoadConfig(ClosedLoop(1), num_requests=4), WorkloadConfig(prompt=long)), sim.url)
    assert fixed.summary.cached_tokens is not None and fixed.summary.cached_tokens > 0
    assert any("every request sent the same prompt" in w for w in fixed.summary.warnings)
    fresh = await bench_async(config(None), sim.url)
    assert not any("prefix cache" in w for w in fresh.summary.warnings)


def test_a_fixed_prompts_hits_are_counted_per_answer_beyond_the_template() -> None:
    """llama.cpp (started with its defaults: 4 slots), four answers to bench's default
    prompt of 19 tokens, 10 of them the chat template's, two users: the first answers of
    two cold slots said 0 and 3 cached tokens, the next two 18. The template's 10 were
    taken off every answer, also off the two that missed, and the warning stayed silent
    though half the answers were served from the cache."""
    records = [RequestRecord(i, end_ns=1, input_tokens=19, cached_tokens=c) for i, c in enumerate((0, 3, 18, 18))]
    warning = _unintended_cache_hits(records, template_tokens=10, fixed=True)
    assert warning is not None and "39 of 76 prompt tokens" in warning and "every request sent the same prompt" in warning
    fresh = [RequestRecord(i, end_ns=1, input_tokens=19, cached_tokens=c) for i, c in enumerate((0, 3, 3, 3))]
    assert _unintended_cache_hits(fresh, template_tokens=10, fixed=True) is None  # (the template alone)


def test_the_metrics_counts_in_the_warning_say_the_warm_ups_they_hold_as_the_tokens_row_does() -> None:
    """The server's counters over the run hold the warm-ups' prompts too: the tokens row
    said "(warm-ups included)" beside them, the warning quoting the same counts did not,
    so its "of 5,104 prompt tokens over the run" read as the run's 3,828 measured ones."""
    records = [RequestRecord(i, warmup=i < 4, end_ns=1, input_tokens=319) for i in range(16)]
    metrics = ServerMetrics(True, counters={"prefix_cache_hits_tokens": 4864.0, "prefix_cache_queries_tokens": 5104.0})
    warning = _unintended_cache_hits(records, template_tokens=19, server_metrics=metrics)
    assert warning is not None
    assert "counted 4,864 of 5,104 prompt tokens over the run (warm-ups included) as served" in warning
    measured = [r for r in records if not r.warmup]
    warning = _unintended_cache_hits(measured, template_tokens=19, server_metrics=metrics)
    assert warning is not None and "over the run as served" in warning and "warm-ups" not in warning


@pytest.fixture(scope="module")
def plain_vllm() -> Iterator[EmbeddedServer]:
    """A server whose answers do not say their cached tokens (vLLM's default: no
    ``--enable-prompt-tokens-details``); its /metrics counts prefix-cache hits."""
    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=4096))) as server:
        yield server


async def test_a_rerun_is_called_out_from_the_servers_metrics_where_its_answers_do_not_say(plain_vllm: EmbeddedServer) -> None:
    """vLLM by default writes no cached tokens in its answers: the warning that a rerun
    measured the cache read nothing and stayed silent. The server's own /metrics counters
    over the run say it instead; a fresh run's counters do not set it off."""
    await bench_async(config("again"), plain_vllm.url)
    again = await bench_async(config("again"), plain_vllm.url)
    assert again.summary.cached_tokens is None  # (the answers said nothing)
    (warning,) = [w for w in again.summary.warnings if "prefix cache" in w]
    assert "/metrics counted" in warning and "though this run's prompts share no prefix" in warning
    assert "--enable-prompt-tokens-details" in warning
    fresh = await bench_async(config(None), plain_vllm.url)
    assert not any("prefix cache" in w for w in fresh.summary.warnings)
    fixed = await bench_async(BenchConfig(LoadConfig(ClosedLoop(1), num_requests=4),
                                          WorkloadConfig(prompt=" ".join(f"word{i}" for i in range(120)))), plain_vllm.url)
    assert any("/metrics counted" in w and "every request sent the same prompt" in w for w in fixed.summary.warnings)


async def test_behind_a_gateway_a_fixed_prompt_and_a_rerun_are_said_unchecked(plain_vllm: EmbeddedServer) -> None:
    """inferlab gateway in front of a server whose answers do not say their cached tokens:
    the gateway's /metrics are its own, not the engine's, so neither source said them, and
    the default prompt and a rerun with the same --seed were passed over in silence (from
    the CLI, 20 requests each: the engine's /metrics counted 608 of 940 and 4,160 of 4,380
    prompt tokens as hits). They are said to be unchecked; a fresh run is not, and
    neither is a compare caveat (nothing says they were cached)."""
    gw = Gateway(GatewayConfig((UpstreamConfig(plain_vllm.url),), cache=CacheConfig(enabled=False)))
    runner, port = await start(gw, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{port}"
        fixed = await bench_async(BenchConfig(LoadConfig(ClosedLoop(1), num_requests=4), WorkloadConfig()), url)
        await bench_async(config("behind"), url)
        again = await bench_async(config("behind"), url)
        fresh = await bench_async(config(None), url)
    finally:
        await runner.cleanup()
    assert fixed.summary.cached_tokens is again.summary.cached_tokens is None  # (nothing said them)
    (warning,) = [w for w in fixed.summary.warnings if "prefix" in w]
    assert "every request sent the same prompt" in warning and "this run cannot tell" in warning
    (warning,) = [w for w in again.summary.warnings if "prefix" in w]
    assert "same --seed" in warning and "this run cannot tell" in warning
    assert not any("prefix" in w for w in fresh.summary.warnings)
    assert not foreign_cache(again.summary.warnings)  # (compare refuses --fail-if on what it names)


async def test_a_replay_sends_the_lengths_it_replays_template_included(sim: EmbeddedServer, tmp_path: Path) -> None:
    await bench_async(config(None, tmp_path / "run"), sim.url)  # chat: the server counts the template too
    recorded = sorted(r.input_tokens for r in read_records(tmp_path / "run" / "requests.jsonl") if r.input_tokens)
    trace = TraceConfig(str(tmp_path / "run" / "requests.jsonl"))  # (a closed loop: its users' pace, no speedup)
    replay = BenchConfig(LoadConfig(Replay()), WorkloadConfig(trace=trace))
    result = await bench_async(replay, sim.url)
    assert sorted(r.input_tokens for r in result.records if r.input_tokens) == recorded
    # and in virtual time, on either API
    for api in ("chat", "completions"):
        sim_run = await run(RunConfig(LoadConfig(Replay()), WorkloadConfig(trace=trace), api), SimTarget())
        assert sorted(r.input_tokens for r in sim_run.records if r.input_tokens) == recorded


def test_a_run_against_the_simulated_server_records_its_engine_and_a_replay_runs_it(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from inferlab.cli.main import main

    engine = EngineConfig(model="Llama-3.1-8B", gpu="L40S", max_model_len=4096, max_num_batched_tokens=4096, enforce_eager=True)
    with EmbeddedServer(ServerConfig(engine)) as server:
        asyncio.run(bench_async(config(None, tmp_path / "run"), server.url))
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())["resolved"]["engine"]
    assert (recorded["model"], recorded["gpu_preset"], recorded["max_num_batched_tokens"]) == ("Llama-3.1-8B", "L40S-48GB", 4096)
    assert recorded["enforce_eager"] is True and recorded["max_num_seqs"] == 256  # resolved, not left to defaults

    trace = str(tmp_path / "run" / "requests.jsonl")
    res = CliRunner().invoke(main, ["sim", "run", "--trace", trace, "--json"])
    assert res.exit_code == 0, res.output
    ran = json.loads(res.stdout)["config"]["engine"]
    assert {k: ran[k] for k in ("model", "gpu_preset", "max_model_len", "max_num_batched_tokens", "enforce_eager")} == {
        "model": "Llama-3.1-8B", "gpu_preset": "L40S-48GB", "max_model_len": 4096, "max_num_batched_tokens": 4096,
        "enforce_eager": True}
    res = CliRunner().invoke(main, ["sim", "run", "--trace", trace, "--json", "--no-enforce-eager"])
    assert json.loads(res.stdout)["config"]["engine"]["enforce_eager"] is False  # a flag given here wins
