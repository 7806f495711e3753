"""When vLLM received each request, in its steps (``engines.vllm_arrivals``), and the
simulator placed at those steps; no vLLM needed: the log excerpt below was captured from
vLLM 0.32's CPU build running the closed loop of ``engines.vllm_steps`` with the arrival
logging scheduler (its first steps, and a successor arriving at step 385)."""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest

from inferlab.engines.vllm_arrivals import (
    STEP_S,
    Arrival,
    arrival_s,
    placed_rows,
    replay_placed,
    vllm_arrivals,
)
from inferlab.engines.vllm_steps import (
    SCENARIOS,
    StepKey,
    TokenStep,
    engine_config,
    first_difference,
    replay_engine_config,
    sim_steps,
    sim_token_steps,
    vllm_iterations,
)
from inferlab.load.run import RunConfig, RunResult, SimTarget, run
from inferlab.sim.engine.config import EngineConfig
from inferlab.workload.traces import TraceRow
from inferlab.workload.traces.requests import read_requests

EXCERPT = (
    "(EngineCore pid=16566) INFO 12-03 22:45:13 [inferlab_arrivals.py:48] Arrivals before Iteration(0): cmpl-a67b4fb1e9188284-0-b2157759:384:384\n"
    "(EngineCore pid=16566) INFO 12-03 22:45:13 [inferlab_arrivals.py:48] Arrivals before Iteration(1): cmpl-b1bfe8bc7b0ad6dd-0-abc4d3c2:384:384 cmpl-905f22c7f2fd8372-0-b074af52:384:384 cmpl-b36e9b3b80d55685-0-9be53bc8:384:384 cmpl-b155cd7db2f238a6-0-8d5e45df:384:384 cmpl-a07d5b55b7c04231-0-b37703ea:384:384 cmpl-916539a36850879d-0-a9bc9176:384:384 cmpl-8700b22cc7edd4f2-0-905807a7:384:384\n"
    "(APIServer pid=16425) INFO 12-03 22:45:13 [loggers.py:199] Engine 000: Iteration(0): 1 context requests, 384 context tokens, 0 generation requests, 0 generation tokens, iteration elapsed time: 26.82 ms, CPU KV cache usage: 13.0%\n"
    "(APIServer pid=16425) INFO 12-03 22:45:13 [loggers.py:199] Engine 000: Iteration(1): 2 context requests, 511 context tokens, 1 generation requests, 1 generation tokens, iteration elapsed time: 28.26 ms, CPU KV cache usage: 34.8%\n"
    "(APIServer pid=16425) INFO 12-03 22:45:13 [loggers.py:199] Engine 000: Iteration(2): 2 context requests, 510 context tokens, 2 generation requests, 2 generation tokens, iteration elapsed time: 29.17 ms, CPU KV cache usage: 56.5%\n"
    "(APIServer pid=16425) INFO 12-03 22:45:13 [loggers.py:199] Engine 000: Iteration(3): 2 context requests, 509 context tokens, 3 generation requests, 3 generation tokens, iteration elapsed time: 27.51 ms, CPU KV cache usage: 78.3%\n"
    "(APIServer pid=16425) INFO 12-03 22:45:13 [loggers.py:199] Engine 000: Iteration(4): 2 context requests, 390 context tokens, 4 generation requests, 4 generation tokens, iteration elapsed time: 24.12 ms, CPU KV cache usage: 95.7%\n"
    "(APIServer pid=16425) INFO 12-03 22:45:13 [loggers.py:199] Engine 000: Iteration(5): 0 context requests, 0 context tokens, 5 generation requests, 5 generation tokens, iteration elapsed time: 5.44 ms, CPU KV cache usage: 87.0%\n"
    "(EngineCore pid=16566) INFO 12-03 22:45:14 [inferlab_arrivals.py:48] Arrivals before Iteration(385): cmpl-9a91adfd6d2cf546-0-b07b0f23:384:384\n"
    "(APIServer pid=16425) INFO 12-03 22:45:14 [loggers.py:199] Engine 000: Iteration(385): 1 context requests, 122 context tokens, 4 generation requests, 390 generation tokens, iteration elapsed time: 27.17 ms, CPU KV cache usage: 65.2%\n"
)


def test_arrivals_and_steps_are_read_from_the_server_log() -> None:
    arrivals = vllm_arrivals(EXCERPT)
    # the first request woke the idle engine: step 0 ran it alone; the other seven users'
    # requests reached the scheduler during step 0
    assert [a.iteration for a in arrivals] == [0] + [1] * 7 + [385]
    assert arrivals[0] == Arrival("cmpl-a67b4fb1e9188284-0-b2157759", 0, 384, 384)
    assert {(a.prompt_tokens, a.max_tokens) for a in arrivals} == {(384, 384)}
    assert vllm_iterations(EXCERPT) == [
        TokenStep(384, 13.0), TokenStep(512, 34.8), TokenStep(512, 56.5), TokenStep(512, 78.3),
        TokenStep(394, 95.7), TokenStep(5, 87.0), TokenStep(512, 65.2),
    ]


def test_a_malformed_arrival_is_an_error() -> None:
    with pytest.raises(ValueError):
        vllm_arrivals("Arrivals before Iteration(3): cmpl-1:384\n")


def test_sends_are_matched_with_receipts_in_order_and_placed_within_the_step_before() -> None:
    rows = [TraceRow(0.0, 384, 384, user=u, prefix_group="g", prefix_tokens=128) for u in range(3)]
    arrivals = [Arrival("a", 0, 384, 384), Arrival("b", 1, 384, 384), Arrival("c", 385, 384, 384)]
    placed = placed_rows(rows, arrivals)
    assert [r.arrival_s for r in placed] == [0.0, 0.5 * STEP_S, 384.5 * STEP_S] == list(map(arrival_s, (0, 1, 385)))
    assert {r.user for r in placed} == {None}  # an open loop at those times
    assert {(r.prefix_group, r.prefix_tokens) for r in placed} == {("g", 128)}
    with pytest.raises(ValueError, match="2 received"):
        placed_rows(rows, arrivals[:2])
    with pytest.raises(ValueError, match="has 384 / 100"):
        placed_rows(rows, [*arrivals[:2], Arrival("c", 385, 384, 100)])


def placed_steps(rows: list[TraceRow], config: EngineConfig | None = None) -> list[dict[str, Any]]:
    log = io.StringIO()
    replay_placed(rows, config or engine_config(), log)
    return [json.loads(line) for line in log.getvalue().splitlines()]


def test_the_simulator_given_vllms_arrivals_runs_vllms_first_steps() -> None:
    arrivals = vllm_arrivals(EXCERPT)[:8]
    rows = [TraceRow(0.0, 384, 384, user=u) for u in range(8)]
    logged = vllm_iterations(EXCERPT)[:6]
    assert sim_token_steps(placed_steps(placed_rows(rows, arrivals)))[:6] == logged
    # all eight at the first step, as a replay of the users' sends (all at 0) has them
    at_once = [dataclasses.replace(a, iteration=0) for a in arrivals]
    assert sim_token_steps(placed_steps(placed_rows(rows, at_once)))[0] == TokenStep(512, 17.4)


def simulate(tmp: Path, name: str, config: EngineConfig) -> tuple[RunResult, list[dict[str, Any]]]:
    sc, log = SCENARIOS[name], tmp / f"{name}-steps.jsonl"
    tmp.mkdir(exist_ok=True)
    result = asyncio.run(run(RunConfig(sc.load, sc.workload, "completions", out_dir=str(tmp / name)),
                             SimTarget(config, step_log=str(log))))
    return result, [json.loads(line) for line in log.read_text().splitlines()]


def seen_at(steps: list[dict[str, Any]], t_s: float) -> int:
    """The first step (with tokens) that starts at or after ``t_s``."""
    starts = [d["start_s"] for d in steps if d["prefill_tokens"] + d["decode_tokens"]]
    return bisect.bisect_left(starts, t_s - 1e-9)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_placing_each_request_at_the_step_the_engine_received_it_reproduces_the_run(tmp_path: Path, name: str) -> None:
    result, steps = simulate(tmp_path, name, engine_config())
    # (no API cost here: a request reaches the engine when sent)
    records = sorted(result.records, key=lambda r: (r.send_ns or 0, r.index))
    arrivals = [Arrival(str(r.index), seen_at(steps, (r.send_ns or 0) / 1e9), r.input_tokens or 0, r.output_tokens or 0)
                for r in records]
    rows = read_requests(str(tmp_path / name / "requests.jsonl"))
    placed = placed_steps(placed_rows(rows, arrivals))
    assert first_difference(sim_steps(steps), sim_steps(placed)) is None
    assert sum(d["preemptions"] for d in placed) == sum(d["preemptions"] for d in steps) > 0
    # one request a step late is another run
    late = [*arrivals[:-1], dataclasses.replace(arrivals[-1], iteration=arrivals[-1].iteration + 1)]
    assert first_difference(sim_steps(steps), sim_steps(placed_steps(placed_rows(rows, late)))) is not None


def test_the_replay_engine_takes_requests_sent_together_one_at_a_time(tmp_path: Path) -> None:
    # vLLM's API server hands requests to the engine core one at a time, and streams a
    # step's tokens after the step: the first of the closed loop's users starts the
    # engine alone, and each next request is seen one step after its predecessor's last
    result, steps = simulate(tmp_path, "closed-loop", replay_engine_config())
    keys = sim_steps(steps)
    assert keys[0] == StepKey(384, 0, 1, 7, 0, 0)
    ends = [d["start_s"] + d["duration_s"] for d in steps if d["prefill_tokens"] + d["decode_tokens"]]
    last: dict[int | None, int] = {}
    lags = []
    for r in sorted(result.records, key=lambda r: r.send_ns or 0):
        if r.user in last:
            lags.append(seen_at(steps, (r.send_ns or 0) / 1e9) - last[r.user] - 1)
        # the step whose end emitted its last token (delivered microseconds later)
        last[r.user] = bisect.bisect_left(ends, (r.end_ns or 0) / 1e9 - 1e-5)
    assert lags == [1] * 24
    # without the front end's costs all eight start together, each next one at once
    _, at_once = simulate(tmp_path / "free", "closed-loop", engine_config())
    assert sim_steps(at_once)[0] == StepKey(512, 0, 2, 6, 0, 0)
