"""Opt-in (``pytest -m vllm``): ``bench`` against vLLM's own OpenAI server, and the
simulator's scheduler against vLLM's, step by step, on the three preempting workloads of
``engines.vllm_steps``.

vLLM's CPU build is installed once per machine (``inferlab.engines.vllm``: a few minutes
and 3.5 GB the first time); each server start takes a minute or more (torch.compile).
Left out of every other run, whatever ``-m`` says, unless ``-m`` names ``vllm``
(``tests/engines/conftest.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferlab.client.preflight import EXACT_SERVER
from inferlab.engines.llamacpp import EngineUnavailable
from inferlab.engines.tinymodel import TinyModel
from inferlab.engines.vllm import VllmServer, hf_model, install_vllm
from inferlab.engines.vllm_steps import SCENARIOS, check, prometheus_value, vllm_flags
from inferlab.load.run import HttpTarget, RunConfig, RunResult, run
from inferlab.load.schedules import ClosedLoop, LoadConfig
from inferlab.openai.request import Api
from inferlab.workload.config import WorkloadConfig

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    try:
        return install_vllm()
    except EngineUnavailable as e:
        pytest.skip(f"vLLM's CPU build cannot be installed here: {e}")


@pytest.fixture(scope="module")
def vllm(vllm_python: Path, tiny: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with VllmServer(vllm_python, hf_model(tiny), name="tiny", flags=vllm_flags(), log_path=log) as server:
        yield server


def bench(server: VllmServer, api: Api, **workload: object) -> RunResult:
    config = RunConfig(LoadConfig(ClosedLoop(4), num_requests=8), WorkloadConfig(**workload), api)  # type: ignore[arg-type]

    async def go() -> RunResult:
        async with asyncio.timeout(600):
            return await run(config, HttpTarget(server.url, "tiny", timeout_s=300.0, workers=1))

    return asyncio.run(go())


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_bench_against_vllm_has_usage_and_exact_lengths_from_tokenize(vllm: VllmServer, api: Api) -> None:
    result = bench(vllm, api, input_tokens=300, output_tokens=16)
    s = result.summary
    assert s.counts.completed == 8 and s.counts.failed == 0
    assert s.input_length_source == EXACT_SERVER
    overhead = s.prompt_overhead_tokens
    assert overhead is not None and (overhead > 0) == (api == "chat")
    for r in result.records:
        assert r.input_tokens == 300 + overhead and r.output_tokens == 16 == len(r.content_ns)
        assert r.usage_source == "server" and r.cached_tokens is not None  # --enable-prompt-tokens-details
    text = vllm.metrics()
    for name in ("vllm:num_preemptions_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:kv_cache_usage_perc"):
        assert prometheus_value(text, name) is not None, name


# A closed loop's next request reaches vLLM through its HTTP server while the engine keeps
# stepping: on vLLM 0.32's CPU build the first requests arrived a step apart and 12 of
# 3,075 steps differed from the replay (which sends each user's next request the moment
# the previous one ends), with 20 preemptions against 22. The bursts match on every step.
_ARRIVAL_TIMING = pytest.mark.xfail(
    reason="request arrival over HTTP, not scheduling: a closed-loop user's next request can reach vLLM a step later",
    strict=False,
)


@pytest.mark.parametrize("name", [pytest.param(n, marks=_ARRIVAL_TIMING) if n == "closed-loop" else n for n in sorted(SCENARIOS)])
def test_the_simulator_schedules_every_step_as_vllm(name: str, vllm_python: Path, tmp_path: Path) -> None:
    result = check(name, str(tmp_path), str(vllm_python))
    assert result.completed == SCENARIOS[name].load.num_requests
    assert result.vllm_steps, "vLLM logged no iterations (--enable-logging-iteration-details)"
    assert result.first_difference is None, result.line()
    assert result.vllm_preemptions == result.sim_preemptions, result.line()
    assert result.vllm_prefix_hits == result.sim_prefix_hits, result.line()
