"""``sim run``: the same workloads and metrics as bench, in virtual time."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from inferlab._bench import WorkloadConfig
from inferlab._metrics import summarize
from inferlab._records import RequestRecord
from inferlab._runner import LoadConfig
from inferlab._schedule import ClosedLoop, OpenLoop
from inferlab.sim._engine import Engine, EngineConfig
from inferlab.sim._simrun import simulate


def run(load: LoadConfig, inp: int = 200, out: int = 20, **engine: object) -> dict:
    records = simulate(Engine(EngineConfig(**engine)), load, WorkloadConfig(inp, out).build(load.seed))  # type: ignore[arg-type]
    return summarize(records)


def peak_in_flight(records: list[RequestRecord]) -> int:
    """Most requests between send and end at any moment (ends before sends at a tie)."""
    events = sorted([(r.send_ns, 1) for r in records] + [(r.end_ns, -1) for r in records], key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


def test_same_seed_same_numbers() -> None:
    load = LoadConfig(OpenLoop(20.0), num_requests=50, seed=4)
    assert run(load) == run(load)
    assert run(load)["ttft_ms"] != run(LoadConfig(OpenLoop(20.0), num_requests=50, seed=5))["ttft_ms"]


def test_closed_loop_keeps_exactly_n_in_flight() -> None:
    records = simulate(Engine(EngineConfig()), LoadConfig(ClosedLoop(4), num_requests=20), WorkloadConfig(100, 10).build(0))
    assert len(records) == 20
    assert peak_in_flight(records) == 4
    # each user's next request is sent the moment one finishes
    ends = {r.end_ns for r in records}
    assert all(r.send_ns == 0 or r.send_ns in ends for r in records)


def test_more_load_means_more_throughput_and_worse_latency() -> None:
    light = run(LoadConfig(ClosedLoop(1), num_requests=16))
    heavy = run(LoadConfig(ClosedLoop(16), num_requests=64))
    assert heavy["output_token_throughput_tps"] > 4 * light["output_token_throughput_tps"]
    assert heavy["tpot_ms"]["mean"] > light["tpot_ms"]["mean"]


def test_smaller_token_budget_lowers_ttft_under_long_prompts_less_interference() -> None:
    # 3,000-token prompts arriving while others decode: a smaller budget chunks the
    # prefill, so running decodes are stalled for less time per step (lower max ITL)
    load = LoadConfig(OpenLoop(8.0, "constant"), num_requests=24)
    big = run(load, inp=3000, out=64, max_num_batched_tokens=8192)
    small = run(load, inp=3000, out=64, max_num_batched_tokens=512)
    assert small["itl_ms"]["max"] < big["itl_ms"]["max"]
    assert small["ttft_ms"]["mean"] > big["ttft_ms"]["mean"]


def test_offline_rate_inf_sends_all_at_time_zero() -> None:
    records = simulate(Engine(EngineConfig()), LoadConfig(OpenLoop(math.inf), num_requests=30), WorkloadConfig(100, 5).build(0))
    assert {r.send_ns for r in records} == {0}
    assert all(r.output_tokens == 5 and r.input_tokens == 100 for r in records)


def test_cli_sim_run_writes_the_same_files_as_bench(tmp_path: Path) -> None:
    out = tmp_path / "r"
    steps = tmp_path / "steps.jsonl"
    p = subprocess.run(
        [sys.executable, "-m", "inferlab", "sim", "run", "--rate", "10", "-n", "40", "--input-tokens", "300",
         "--output-tokens", "30", "--out", str(out), "--step-log", str(steps), "--gpu", "A100", "--model", "Llama-3.1-8B"],
        capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 0, p.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["counts"]["completed"] == 40 and s["output_tokens"] == 1200
    assert len((out / "requests.jsonl").read_text().splitlines()) == 40
    lines = [json.loads(x) for x in steps.read_text().splitlines()]
    assert sum(x["decode_tokens"] for x in lines) + sum(x["prefill_tokens"] for x in lines) >= 40 * 300
    assert "TTFT" in p.stdout


def test_cli_trace_replay_and_bad_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": 5 + i * 0.5, "input_tokens": 50 + i, "output_tokens": 4}) + "\n" for i in range(6)))
    p = subprocess.run([sys.executable, "-m", "inferlab", "sim", "run", "--trace", str(trace), "--json"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["counts"]["completed"] == 6 and s["input_tokens"] == sum(50 + i for i in range(6))
    assert s["duration_s"] > 2.5  # arrivals span 2.5 s of virtual time
    trace.write_text('{"arrival_s": 0, "input_tokens": 5, "output_tokens": 1}\n{"arrival_s": "x"}\n')
    p = subprocess.run([sys.executable, "-m", "inferlab", "sim", "run", "--trace", str(trace)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and f"{trace}:2:" in p.stderr and "Traceback" not in p.stderr


def test_open_loop_requests_are_sent_at_their_arrival_even_mid_step() -> None:
    # long prefill steps: most arrivals fall inside a step; they are still sent on time
    # (waiting for the next step is server queueing, part of TTFT, not client delay)
    load = LoadConfig(OpenLoop(20.0), num_requests=40, seed=2)
    records = simulate(Engine(EngineConfig(max_num_batched_tokens=2048)), load, WorkloadConfig(3000, 8).build(2))
    assert all(r.send_ns == r.intended_send_ns for r in records)
    assert summarize(records)["queue_delay_ms"]["max"] == 0.0
    # with a concurrency cap the wait for a free slot is client queue delay
    capped = LoadConfig(OpenLoop(20.0, max_concurrency=2), num_requests=40, seed=2)
    records = simulate(Engine(EngineConfig(max_num_batched_tokens=2048)), capped, WorkloadConfig(3000, 8).build(2))
    assert max(r.send_ns - r.intended_send_ns for r in records) > 0  # type: ignore[operator]
    assert peak_in_flight(records) == 2
