"""llama.cpp's own /metrics around a run: its prompt and generation token counters,
mapped to inferlab's names, move by exactly the run's usage totals."""

from __future__ import annotations

import asyncio

import pytest

from inferlab import ClosedLoop, HttpTarget, LoadConfig, RunConfig, WorkloadConfig, run
from inferlab.engines.llamacpp import LlamaServer
from inferlab.results.telemetry import ServerMetrics

pytestmark = [pytest.mark.engines, pytest.mark.slow]


def test_token_counters_match_the_runs_usage_totals(llama: LlamaServer) -> None:
    config = RunConfig(LoadConfig(ClosedLoop(2), num_requests=6), WorkloadConfig(input_tokens=120, output_tokens=12))

    async def go() -> ServerMetrics:
        async with asyncio.timeout(180):
            result = await run(config, HttpTarget(llama.url, timeout_s=60.0))
        m = result.summary.server_metrics
        assert isinstance(m, ServerMetrics)
        s = result.summary
        assert m.available and m.server == "llama.cpp", m
        assert s.counts.completed == 6 and s.input_tokens is not None
        assert m.counters["prompt_tokens"] == s.input_tokens
        assert m.counters["generation_tokens"] == s.output_tokens
        return m

    m = asyncio.run(go())
    assert (m.counters["prompt_seconds"] or 0) > 0 and (m.counters["generation_seconds"] or 0) > 0
