"""``sim run``: the same workloads and metrics as bench, in virtual time."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from inferlab._errors import InferlabError
from inferlab.load.schedules import ClosedLoop, LoadConfig, OpenLoop, Schedule
from inferlab.load.virtual import simulate
from inferlab.results.metrics import request_metrics
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.results.summary import Summary, summarize
from inferlab.sim.engine.engine import Engine, EngineConfig
from inferlab.workload.config import WorkloadConfig
from inferlab.workload.spec import RequestSpec


def run(load: LoadConfig, inp: int = 200, out: int = 20, **engine: object) -> Summary:
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
    assert run(load).ttft_ms != run(LoadConfig(OpenLoop(20.0), num_requests=50, seed=5)).ttft_ms


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
    assert heavy.output_token_throughput_tps > 4 * light.output_token_throughput_tps
    assert heavy.tpot_ms.mean > light.tpot_ms.mean


def test_smaller_token_budget_lowers_ttft_under_long_prompts_less_interference() -> None:
    # 3,000-token prompts arriving while others decode: a smaller budget chunks the
    # prefill, so running decodes are stalled for less time per step (lower max ITL)
    load = LoadConfig(OpenLoop(8.0, "constant"), num_requests=24)
    big = run(load, inp=3000, out=64, max_num_batched_tokens=8192)
    small = run(load, inp=3000, out=64, max_num_batched_tokens=512, max_num_seqs=256)
    assert small.itl_ms.max < big.itl_ms.max
    assert small.ttft_ms.mean > big.ttft_ms.mean


def test_offline_rate_inf_sends_all_at_time_zero() -> None:
    records = simulate(Engine(EngineConfig()), LoadConfig(OpenLoop(math.inf), num_requests=30), WorkloadConfig(100, 5).build(0))
    assert {r.send_ns for r in records} == {0}
    assert all(r.output_tokens == 5 and r.input_tokens == 100 for r in records)


@pytest.mark.parametrize("exact", [True, False])
def test_output_lengths_and_finish_reasons_are_the_simulated_servers(exact: bool) -> None:
    """Without an exact length asked (--no-exact-output) the simulated model stops at its
    own end-of-sequence, cut by max_tokens: the answer sim serve plans for the body the
    client sends, token for token and reason for reason."""
    from inferlab.openai.request import completion_request, read_params
    from inferlab.sim.server.app import ServerConfig, SimServer

    config = EngineConfig(max_model_len=4096)
    server = SimServer(ServerConfig(config))
    specs = [RequestSpec(list(range(7 * k, 7 * k + 100)), (40, 150, 400)[k % 3], exact) for k in range(24)]
    records = simulate(Engine(config), LoadConfig(ClosedLoop(4), num_requests=len(specs)), iter(specs))
    got, planned = [], []
    for spec, r in zip(specs, records, strict=True):
        assert isinstance(spec.prompt, list)
        body = completion_request("m", "completions", prompt=spec.prompt, max_tokens=spec.max_tokens, exact_output=exact)
        plan = server._plan(read_params(body, "completions"), spec.prompt)
        assert plan.limit == spec.max_tokens  # (what sim serve tells the engine beside the length)
        got.append((r.output_tokens, r.finish_reason))
        planned.append((plan.tokens, plan.finish_reason))
    assert got == planned
    if exact:
        assert got == [(s.max_tokens, "length") for s in specs]
    else:  # (the prompts are chosen so that some answers end early and some are cut)
        assert {reason for _, reason in got} == {"stop", "length"}


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
    assert summarize(records).queue_delay_ms.max == 0.0
    # with a concurrency cap the wait for a free slot is client queue delay
    capped = LoadConfig(OpenLoop(20.0, max_concurrency=2), num_requests=40, seed=2)
    records = simulate(Engine(EngineConfig(max_num_batched_tokens=2048)), capped, WorkloadConfig(3000, 8).build(2))
    assert max(r.send_ns - r.intended_send_ns for r in records) > 0  # type: ignore[operator]
    assert peak_in_flight(records) == 2


# --- rejected requests, interruptions and CLI errors ----------------------------------


def sim_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferlab", "sim", "run", *args], capture_output=True, text=True, timeout=timeout)


def test_a_request_too_long_for_the_model_is_a_failed_record_and_the_run_goes_on() -> None:
    from inferlab.results.records import ErrorKind

    for load in (LoadConfig(OpenLoop(10.0), num_requests=12, seed=1), LoadConfig(ClosedLoop(2), num_requests=12, seed=1)):
        seen: list[RequestRecord] = []
        records = simulate(  # (a release that refuses prompt + max_tokens over the context: test_bench_context_edge)
            Engine(EngineConfig(max_model_len=1024, engine_version="0.31")), load,
            WorkloadConfig("uniform:100:2000", 8).build(1), on_record=seen.append,
        )
        assert len(records) == len(seen) == 12
        failed = [r for r in records if not r.ok]
        assert failed and len(failed) < 12
        for r in failed:
            assert r.input_tokens is not None and r.input_tokens + 8 > 1024
            assert (r.error_kind, r.status) == (ErrorKind.HTTP_STATUS, 400)
            assert r.error is not None and "maximum context length is 1024" in r.error
            # no HTTP in virtual time: the kind and status bench would record, and words that say so
            assert r.error.startswith("rejected by the engine (a server answers HTTP 400): ")
        assert all(r.output_tokens == 8 for r in records if r.ok)
        c = summarize(records).counts
        assert (c.completed, c.failed, c.errors) == (12 - len(failed), len(failed), {"http_status": len(failed)})


@pytest.mark.parametrize(("engine", "refused", "answered"), [
    # SGLang before 0.5.11 refuses prompt + max_tokens of the context or more; from 0.5.11
    # over it, and each answer ends two tokens short of the context (1016 + 8 = 1024: 6)
    ({"engine_family": "sglang", "engine_version": "0.5.10"}, {1016: 3, 1017: 3}, {1014: 8, 1015: 7}),
    ({"engine_family": "sglang"}, {1017: 3}, {1014: 8, 1015: 7, 1016: 6}),
    ({}, {1017: 3}, {1014: 8, 1015: 8, 1016: 8}),  # (vLLM: over the context only)
    ({"engine_version": "0.31"}, {1017: 3}, {1014: 8, 1015: 8, 1016: 8}),
])
def test_sim_run_refuses_at_the_context_as_the_family_and_release_do(
    engine: dict[str, Any], refused: dict[int, int], answered: dict[int, int],
) -> None:
    """Three requests of each prompt length, 8 tokens asked for exactly, on a 1024-token
    context: how many each refuses (HTTP 400), and the answer's length otherwise."""
    load = LoadConfig(ClosedLoop(1), num_requests=3, seed=1)
    for prompt in range(1014, 1018):
        records = simulate(Engine(EngineConfig(max_model_len=1024, **engine)), load,
                           WorkloadConfig(prompt, 8, exact_output=True).build(1))
        assert all(r.input_tokens == prompt for r in records)
        failed = [r for r in records if not r.ok]
        assert len(failed) == refused.get(prompt, 0), (prompt, [r.error for r in failed])
        assert all((r.error_kind, r.status) == (ErrorKind.HTTP_STATUS, 400) for r in failed)
        if prompt in answered:
            assert [r.output_tokens for r in records] == [answered[prompt]] * 3


def test_sim_run_records_sglangs_scheduler_refusal_as_an_error_in_the_stream() -> None:
    """A prompt within 6 tokens of the context, 1 token asked for: past SGLang's
    tokenizer manager, refused by its scheduler, which a stream gets after its 200."""
    load = LoadConfig(ClosedLoop(1), num_requests=2, seed=1)
    for prompt, refused in ((1017, 0), (1018, 2)):
        records = simulate(Engine(EngineConfig(engine_family="sglang", max_model_len=1024)), load,
                           WorkloadConfig(prompt, 1).build(1))
        failed = [r for r in records if not r.ok]
        assert len(failed) == refused
        for r in failed:
            assert (r.error_kind, r.status) == (ErrorKind.STREAM_ERROR, 200)
            assert r.error is not None and "Input length (1018 tokens) exceeds the maximum allowed length (1018" in r.error


def test_sim_run_records_sglang_0_5_9s_aborted_stream_as_bench_does() -> None:
    """SGLang 0.5.6-0.5.9 end a stream their scheduler refuses with finish_reason "abort"
    and no error event: a failure (stream_error, 200) as bench records it, the finish
    reason kept."""
    load = LoadConfig(ClosedLoop(1), num_requests=2, seed=1)
    records = simulate(Engine(EngineConfig(engine_family="sglang", engine_version="0.5.9", max_model_len=1024)), load,
                       WorkloadConfig(1018, 1).build(1))
    assert [(r.ok, r.error_kind, r.status, r.finish_reason) for r in records] == [
        (False, ErrorKind.STREAM_ERROR, 200, "abort")] * 2
    assert all(r.error is not None and 'then finish_reason "abort"' in r.error for r in records)


def test_a_closed_loop_under_a_duration_ends_even_when_every_request_is_rejected() -> None:
    load = LoadConfig(ClosedLoop(2), num_requests=None, duration_s=0.1)
    records = simulate(Engine(EngineConfig(max_model_len=64)), load, WorkloadConfig(100, 8).build(0))
    assert records and not any(r.ok for r in records)


def test_stop_ends_the_run_between_steps_and_keeps_every_record() -> None:
    from inferlab.load.virtual import Interrupted
    from inferlab.results.records import ErrorKind

    seen: list[RequestRecord] = []
    load = LoadConfig(OpenLoop(50.0), num_requests=1000)
    with pytest.raises(Interrupted) as e:
        simulate(Engine(EngineConfig()), load, WorkloadConfig(200, 100).build(0), on_record=seen.append, stop=lambda: len(seen) >= 5)
    records = e.value.records
    assert [r.index for r in records] == sorted(r.index for r in seen)  # each one written once
    done = [r for r in records if r.ok]
    cancelled = [r for r in records if r.error_kind is ErrorKind.CANCELLED]
    assert len(done) >= 5 and cancelled and len(done) + len(cancelled) == len(records) < 1000
    s = summarize(records, interrupted=True)
    assert s.interrupted and s.counts.cancelled == len(cancelled)


def _failing_after(n: int, workload: Iterator[RequestSpec]) -> Iterator[RequestSpec]:
    """``workload``'s first ``n`` requests, then the error a prompt builder raises."""
    yield from itertools.islice(workload, n)
    raise InferlabError("cannot make text of exactly 200 tokens with this tokenizer")


@pytest.mark.parametrize("schedule", [OpenLoop(5.0), ClosedLoop(4)])
def test_a_request_the_workload_cannot_make_stops_the_run_with_what_was_measured(schedule: Schedule) -> None:
    from inferlab.load.virtual import Interrupted

    seen: list[RequestRecord] = []
    wl = _failing_after(12, WorkloadConfig(200, 20).build(0))  # type: ignore[arg-type]
    with pytest.raises(Interrupted) as e:
        simulate(Engine(EngineConfig()), LoadConfig(schedule, num_requests=100), wl, on_record=seen.append)
    assert isinstance(e.value.cause, InferlabError) and "exactly 200 tokens" in str(e.value.cause)
    records = e.value.records
    assert len(records) == len(seen) == 12 and [r.index for r in records] == list(range(12))
    done = sum(r.ok for r in records)
    cancelled = [r for r in records if r.error_kind is ErrorKind.CANCELLED]
    assert done >= 1 and done + len(cancelled) == 12
    assert all("exactly 200 tokens" in (r.error or "") for r in cancelled)


def test_cli_a_request_the_workload_cannot_make_keeps_the_summary_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from inferlab.cli.main import main

    build = WorkloadConfig.build
    monkeypatch.setattr(WorkloadConfig, "build", lambda self, *a, **k: _failing_after(12, build(self, *a, **k)))
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["sim", "run", "-n", "100", "--rate", "5", "--out", str(out)])
    assert res.exit_code == 1
    assert res.output.strip().splitlines()[-1] == "inferlab: error: cannot make text of exactly 200 tokens with this tokenizer"
    s = json.loads((out / "summary.json").read_text())
    assert s["interrupted"] is True and s["counts"]["completed"] >= 1
    assert s["counts"]["completed"] + s["counts"]["cancelled"] == 12 == len((out / "requests.jsonl").read_text().splitlines())


def test_stop_ends_a_session_run_too() -> None:
    from inferlab.load.virtual import Interrupted

    wl = WorkloadConfig(input_tokens=50, output_tokens=20, sessions=40, turns=4).build(0, "chat")
    seen: list[RequestRecord] = []
    with pytest.raises(Interrupted) as e:
        simulate(Engine(EngineConfig()), LoadConfig(ClosedLoop(4), 160), wl, chat=True,
                 on_record=seen.append, stop=lambda: len(seen) >= 3)
    assert 3 <= sum(r.ok for r in e.value.records) < 160 and len(e.value.records) == len(seen)


def test_cli_a_rejected_request_does_not_abort_the_run(tmp_path: Path) -> None:
    p = sim_cli("-n", "8", "--max-model-len", "4096", "--input-tokens", "uniform:100:5000", "--output-tokens", "100", "--out", str(tmp_path / "r"))
    assert p.returncode == 0, p.stderr
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["counts"]["failed"] >= 1 and s["counts"]["completed"] >= 1
    assert s["counts"]["failed"] + s["counts"]["completed"] == 8
    assert "maximum context length" in s["error_examples"]["http_status"]


def test_cli_a_prompt_longer_than_max_model_len_says_so_in_one_line() -> None:
    p = sim_cli("-n", "4", "--max-model-len", "10")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    # (the completions API's default max_tokens, 16, as vLLM's: its own message)
    assert "all 4 requests failed" in last and "max_tokens=16 cannot be greater than max_model_len=10" in last
    assert "max_tokens must be at least 1" not in p.stderr
    chat = sim_cli("-n", "4", "--max-model-len", "10", "--api", "chat")  # (no default there: the context left)
    assert chat.returncode == 1 and "maximum context length is 10 tokens" in chat.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(("flag", "needle"), [("--step-log", "cannot write the step log"), ("--out", "cannot write results")])
def test_cli_unwritable_outputs_are_usage_errors(tmp_path: Path, flag: str, needle: str) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    p = sim_cli("-n", "2", flag, str(blocker / "sub" / "x.jsonl"))
    assert p.returncode == 2 and needle in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_cli_interrupt_summarizes_what_completed(tmp_path: Path, sig: str) -> None:
    import signal
    import time

    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferlab", "sim", "run", "-n", "60000", "--rate", "50", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    requests = out / "requests.jsonl"
    deadline = time.monotonic() + 60  # bounded wait for the first finished request
    while time.monotonic() < deadline and not (requests.exists() and requests.read_text().strip()):
        time.sleep(0.05)
    proc.send_signal(getattr(signal, sig))
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "Aborted" not in stderr
    s = json.loads((out / "summary.json").read_text())
    lines = requests.read_text().splitlines()
    assert s["interrupted"] is True
    assert 1 <= s["counts"]["completed"] < 60000
    assert s["counts"]["completed"] + s["counts"]["cancelled"] == len(lines)
    assert "TTFT" in stdout and "interrupted" in stdout


def test_cli_an_overloaded_open_loop_run_warns() -> None:
    p = sim_cli("--model", "Qwen/Qwen2.5-7B-Instruct", "--quantization", "awq", "--gpu", "L40S", "--max-model-len", "8192",
                "--rate", "20", "-n", "200", "--input-tokens", "4000", "--output-tokens", "200", "--json")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert any(w.startswith("the server could not keep up: offered") for w in s["warnings"])
    p = sim_cli("--rate", "2", "-n", "40", "--json")
    assert p.returncode == 0 and not any("keep up" in w for w in json.loads(p.stdout)["warnings"])


def test_cli_sim_run_sizes_the_engine_like_vllm_by_default() -> None:
    """sim run answers what-ifs with vLLM's own defaults: CUDA graphs, the model's
    context length, and vLLM V1's GPU-dependent scheduler sizes (server vs offline)."""

    def engine(*args: str) -> dict:  # type: ignore[type-arg]
        p = sim_cli("-n", "2", "--input-tokens", "64", "--output-tokens", "4", "--json", *args)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["config"]["engine"]  # type: ignore[no-any-return]

    h100 = engine()
    assert (h100["max_model_len"], h100["max_num_batched_tokens"], h100["max_num_seqs"]) == (32768, 8192, 1024)
    assert h100["enforce_eager"] is False
    a100 = engine("--gpu", "A100")
    assert (a100["max_num_batched_tokens"], a100["max_num_seqs"]) == (2048, 256)
    assert engine("--rate", "inf")["max_num_batched_tokens"] == 16384  # vLLM's offline LLM class
    given = engine("--max-model-len", "2048", "--max-num-batched-tokens", "512", "--max-num-seqs", "128", "--enforce-eager")
    assert (given["max_model_len"], given["max_num_batched_tokens"], given["max_num_seqs"], given["enforce_eager"]) == (2048, 512, 128, True)
    # a budget below vLLM's default cap: vLLM refuses to start, and so does sim run
    p = sim_cli("-n", "2", "--max-num-batched-tokens", "512")
    assert p.returncode == 2 and "must be greater than or equal to max_num_seqs (1024" in p.stderr


def test_default_context_length_is_capped_to_what_the_kv_cache_holds() -> None:
    small = Engine(EngineConfig(model="meta-llama/Llama-3.1-8B-Instruct", gpu="RTX4090"))
    assert small.limits.max_model_len == small.kv_capacity_tokens < 131072
    big = Engine(EngineConfig(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H200"))
    assert big.limits.max_model_len == 131072 < big.kv_capacity_tokens


def test_cuda_graphs_decode_faster_than_eager_mode() -> None:
    load = LoadConfig(ClosedLoop(1), num_requests=2)
    graphs = run(load, out=64).tpot_ms.mean
    eager = run(load, out=64, enforce_eager=True).tpot_ms.mean
    assert eager > graphs * 1.1


def test_an_api_server_costs_per_streamed_token_and_offline_runs_have_none() -> None:
    """vLLM V1 streams every token through its API server, a CPU of its own that also
    accepts requests: with few streams it keeps up (TPOT is the engine's); with hundreds
    of users it sets the pace, requests wait at its door (TTFT) and throughput is what
    it can stream; more API servers share the work. vLLM's offline LLM class has no
    server: no front-end delay either."""
    common = {"model": "Qwen/Qwen2.5-0.5B-Instruct", "max_num_batched_tokens": 8192, "max_num_seqs": 1024}
    few = LoadConfig(ClosedLoop(8), num_requests=16)
    assert run(few, out=64, **common).tpot_ms.mean < 1.1 * run(few, out=64, offline=True, **common).tpot_ms.mean
    many = LoadConfig(ClosedLoop(512), num_requests=1024)
    served = run(many, out=64, **common)
    offline = run(many, out=64, offline=True, **common)
    four = run(many, out=64, api_server_count=4, **common)
    assert served.output_token_throughput_tps < offline.output_token_throughput_tps / 2
    assert served.ttft_ms.mean > 2 * offline.ttft_ms.mean
    assert served.output_token_throughput_tps < four.output_token_throughput_tps
    assert four.ttft_ms.mean < served.ttft_ms.mean
    single_served = run(LoadConfig(ClosedLoop(1), num_requests=2), inp=200, out=8)
    single_offline = run(LoadConfig(ClosedLoop(1), num_requests=2), inp=200, out=8, offline=True)
    # the API path: at least the family's fixed latency and its intake CPU for 200 tokens
    from inferlab.sim.engine.families import FAMILY_RULES, EngineFamily

    eff = FAMILY_RULES[EngineFamily.VLLM].efficiencies
    api_ms = 1e3 * (eff.api_overhead_s + eff.api_intake_s + 200 * eff.api_intake_per_token_s)
    assert api_ms > 5 and single_served.ttft_ms.mean - single_offline.ttft_ms.mean > 0.95 * api_ms


def test_cli_offline_or_served_can_be_said_explicitly() -> None:
    def engine(*args: str) -> dict:  # type: ignore[type-arg]
        p = sim_cli("-n", "2", "--input-tokens", "64", "--output-tokens", "4", "--json", *args)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["config"]["engine"]  # type: ignore[no-any-return]

    assert engine("--rate", "inf")["offline"] is True
    served = engine("--rate", "inf", "--served")
    assert served["offline"] is False and served["api_overhead_s"] > 0 and served["max_num_batched_tokens"] == 8192
    assert engine("-c", "2", "--offline")["api_overhead_s"] == 0.0


def test_cli_engine_family_starts_from_that_engines_defaults() -> None:
    """--engine-family models the engine, not just its constants: sizes not given come
    from its documented defaults, as the validation runs it."""

    def engine(*args: str) -> dict:  # type: ignore[type-arg]
        p = sim_cli("-n", "2", "--input-tokens", "64", "--output-tokens", "4", "--json", *args)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["config"]["engine"]  # type: ignore[no-any-return]

    # vLLM 0.5/0.6 on an 8K-context model: whole prompts, up to max_model_len a step
    v0 = engine("--engine-family", "vllm-v0", "--model", "Qwen/Qwen2.5-7B-Instruct", "--max-model-len", "8192")
    assert (v0["enable_chunked_prefill"], v0["max_num_batched_tokens"], v0["max_num_seqs"]) == (False, 8192, 256)
    assert v0["mixed_batches"] is False
    assert v0["enable_prefix_caching"] is False  # opt-in in vLLM V0; on in V1 and SGLang
    # ... and over 32,768 tokens of context it chunks, 512 tokens a step
    v0_long = engine("--engine-family", "vllm-v0", "--model", "Llama-3.1-8B", "--gpu", "H200")
    assert (v0_long["enable_chunked_prefill"], v0_long["max_num_batched_tokens"]) == (True, 512)
    sglang = engine("--engine-family", "sglang")
    assert sglang["enable_prefix_caching"] is True
    assert engine("--engine-family", "vllm-v0", "--enable-prefix-caching")["enable_prefix_caching"] is True
    assert (sglang["mixed_batches"], sglang["max_num_batched_tokens"], sglang["max_num_seqs"]) == (False, 8192, 4096)
    lmdeploy = engine("--engine-family", "lmdeploy")
    assert (lmdeploy["enable_chunked_prefill"], lmdeploy["max_num_seqs"]) == (False, 128)
    # a flag still wins over the family's default
    assert engine("--engine-family", "sglang", "--max-num-seqs", "64")["max_num_seqs"] == 64
    assert engine("--engine-family", "vllm-v0", "--enable-chunked-prefill")["enable_chunked_prefill"] is True


def test_sim_presets_lists_every_gpu_and_model_by_a_name_the_engine_accepts() -> None:
    """`inferlab sim presets` is the list to pick --gpu/--model from: every GPU and alias
    it prints resolves to that GPU, every model to that model, and an engine runs on it."""
    from inferlab.sim.engine.hardware import resolve_gpu, resolve_model

    p = subprocess.run([sys.executable, "-m", "inferlab", "sim", "presets", "--json"], capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    listed = json.loads(p.stdout)
    names = {g["name"] for g in listed["gpus"]}
    assert {"H100-SXM-80GB", "A100-SXM-80GB", "L40S-48GB", "H200-SXM-141GB", "H100-PCIe-80GB"} <= names
    for g in listed["gpus"]:
        for alias in (g["name"], *g["aliases"]):
            assert resolve_gpu(alias).name == g["name"]
    h100 = next(g for g in listed["gpus"] if g["name"] == "H100-SXM-80GB")
    assert h100["memory_tb_per_s"] == pytest.approx(3.35) and h100["fp8_tflops"] > h100["bf16_tflops"]
    # GeForce cards all-reduce through host memory: the list says which card that is
    assert [g["name"] for g in listed["gpus"] if not g["peer_to_peer"]] == ["RTX-4090-24GB"]
    assert all(resolve_model(m["name"]).name == m["name"] for m in listed["models"])
    assert len(listed["models"]) >= 30
    table = subprocess.run([sys.executable, "-m", "inferlab", "sim", "presets"], capture_output=True, text=True, timeout=60, check=False)
    assert table.returncode == 0 and "H100-PCIe-80GB" in table.stdout and "Llama-3.1-8B" in table.stdout
    assert table.stdout.count("(no P2P)") == 1


def test_cli_precision_flags_take_the_names_vllm_and_benchmark_pages_use() -> None:
    """vLLM's own quantization names and the schemes pages print mean the modelled kinds;
    anything else is a usage error listing what is accepted."""

    def engine(*args: str) -> dict:  # type: ignore[type-arg]
        p = sim_cli("-n", "2", "--input-tokens", "64", "--output-tokens", "4", "--json", *args)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["config"]["engine"]  # type: ignore[no-any-return]

    for flag, kind in (("awq_marlin", "awq"), ("gptq_marlin", "gptq"), ("W4A16", "gptq"), ("int4", "gptq"),
                       ("FP8", "fp8"), ("modelopt", "fp8"), ("w8a8", "int8")):
        assert engine("--quantization", flag)["quantization"] == kind, flag
    e = engine("--kv-cache-dtype", "fp8_e5m2", "--dtype", "bf16")
    assert (e["kv_cache_dtype"], e["dtype"]) == ("fp8", "bfloat16")
    p = sim_cli("-n", "2", "--quantization", "bitsandbytes")
    assert p.returncode == 2 and "awq_marlin" in p.stderr and "Traceback" not in p.stderr
    # "none" means bf16 weights for an unquantized checkpoint (refused for an AWQ one, as
    # vLLM refuses it); vLLM's gptq format names with an 8-bit checkpoint mean 8-bit weights
    assert engine("--model", "Qwen/Qwen2.5-7B-Instruct", "--quantization", "none")["quantization"] == "none"
    assert sim_cli("-n", "2", "--model", "Qwen/Qwen2.5-7B-Instruct-AWQ", "--quantization", "none").returncode == 2
    assert engine("--model", "Qwen/Qwen2.5-7B-Instruct-AWQ")["quantization"] == "awq"
    assert engine("--model", "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int8", "--quantization", "gptq_marlin")["quantization"] == "w8a16"


def test_cli_a_free_text_gpu_says_which_preset_ran() -> None:
    p = sim_cli("-n", "2", "--input-tokens", "64", "--output-tokens", "4", "--gpu", "NVIDIA H100 80GB HBM3")
    assert p.returncode == 0, p.stderr
    assert "H100-SXM-80GB" in p.stdout  # the engine line
    p = sim_cli("-n", "2", "--input-tokens", "64", "--output-tokens", "4", "--gpu", "A100-SXM4-80GB", "--json")
    assert json.loads(p.stdout)["config"]["engine"]["gpu_preset"] == "A100-SXM-80GB"


def test_sim_run_loads_no_http_stack(tmp_path: Path) -> None:
    # importing aiohttp is a quarter of a second of start-up; the package and `sim run`
    # leave it to the first HTTP call
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['inferlab', 'sim', 'run', '--rate', 'inf', '-n', '2', '--input-tokens', '20', "
        f"'--output-tokens', '3', '--out', {str(tmp_path)!r}]\n"
        "try:\n    runpy.run_module('inferlab', run_name='__main__')\nexcept SystemExit as e:\n    assert not e.code\n"
        "print('aiohttp' in sys.modules)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert p.stdout.splitlines()[-1] == "False"
    assert (tmp_path / "summary.json").exists()


def test_sim_run_shows_each_headline_metric_with_its_validation_error(tmp_path: Path) -> None:
    """Console and summary.json: the numbers are a prediction, each with the error band of
    its engine family and regime (sim.engine.bands), from the shipped bands file."""
    from inferlab.sim.engine.bands import error_band

    p = sim_cli("--rate", "4", "-n", "12", "--input-tokens", "300", "--output-tokens", "20", "--out", str(tmp_path / "r"))
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    block = summary["prediction"]
    assert block["label"].startswith("prediction") and (block["engine_family"], block["regime"]) == ("vllm", "Poisson")
    band = error_band("vllm", "Poisson", "TTFT", stat="median")  # (the p50 shown: its medians' band)
    assert band is not None and block["error_bands"]["ttft_ms"]["text"] == band.describe()
    words = " ".join(p.stdout.split())  # (the console wraps long lines)
    assert "TTFT p50 (prediction)" in words and band.describe() in words
    closed = sim_cli("-c", "2", "-n", "4", "--output-tokens", "8", "--json")
    assert json.loads(closed.stdout)["prediction"]["regime"] == "closed loop"
    offline = sim_cli("--rate", "inf", "-n", "4", "--output-tokens", "8", "--json", "--engine-family", "trtllm")
    block = json.loads(offline.stdout)["prediction"]
    assert (block["engine_family"], block["regime"]) == ("trtllm", "offline")


def _burst(n: int, inp: int, *, max_num_seqs: int = 8) -> tuple[Summary, list[RequestRecord]]:
    """``n`` requests of ``inp`` prompt tokens at once, served (an API front end), on an
    engine that runs ``max_num_seqs`` at a time: a saturated run."""
    import asyncio

    from inferlab.load.run import RunConfig, SimTarget
    from inferlab.load.run import run as run_config

    cfg = RunConfig(LoadConfig(OpenLoop(math.inf), num_requests=n), WorkloadConfig(inp, 16), "completions")
    result = asyncio.run(run_config(cfg, SimTarget(EngineConfig(max_num_seqs=max_num_seqs), offline=False)))
    return result.summary, [r for r in result.records if r.ok and not r.warmup]


def test_a_saturated_sim_run_breaks_each_requests_latency_down_from_the_engines_timeline(tmp_path: Path) -> None:
    """Where the time went, exactly: the engine's timeline of each request and the
    record's own timestamps are two recordings of one run, so the server's parts add up
    to the request's E2E with nothing left for a network, and its first token is its
    TTFT. More requests at once queue longer; longer prompts prefill longer."""
    from inferlab.report.html import breakdown_table
    from inferlab.results.breakdown import VIRTUAL, request_parts
    from inferlab.results.sources import load_run

    light, light_records = _burst(8, 512)
    heavy, heavy_records = _burst(64, 512)
    long, _ = _burst(8, 4096)
    for s, records in ((light, light_records), (heavy, heavy_records)):
        b = s.latency_breakdown
        assert b is not None and b.source == VIRTUAL and b.requests == len(records) == s.counts.completed
        for r in records:
            parts = request_parts(r)
            m = request_metrics(r)
            assert parts is not None and m.e2e_ms is not None and m.ttft_ms is not None
            assert min(parts.server_queue, parts.prefill, parts.decode) >= 0 and parts.other < 1e-3
            assert parts.server_queue + parts.prefill + parts.decode == pytest.approx(m.e2e_ms, abs=1e-3)
            assert parts.server_queue + parts.prefill == pytest.approx(m.ttft_ms, abs=1e-3)
        assert b.server_queue_ms is not None and b.prefill_ms is not None and b.decode_ms is not None and b.other_ms is not None
        total = b.server_queue_ms.mean + b.prefill_ms.mean + b.decode_ms.mean + b.other_ms.mean
        assert s.e2e_ms is not None and total == pytest.approx(s.e2e_ms.mean, abs=1e-3)
    # 64 at once on 8 sequences wait for seats; 8 at once do not
    assert heavy.latency_breakdown.server_queue_ms.mean > 2 * light.latency_breakdown.server_queue_ms.mean  # type: ignore[union-attr]
    assert long.latency_breakdown.prefill_ms.mean > 2 * light.latency_breakdown.prefill_ms.mean  # type: ignore[union-attr]
    # shown as bench shows it: a console line, and the report's table, each naming the source
    p = sim_cli("--rate", "inf", "--served", "-n", "16", "--max-num-seqs", "8", "--input-tokens", "512",
                "--output-tokens", "16", "--out", str(tmp_path / "r"))
    assert p.returncode == 0, p.stderr
    words = " ".join(p.stdout.split())
    assert "latency breakdown client send lag 0.0, server queue" in words and f"(mean; from {VIRTUAL})" in words
    assert "virtual time: exact; a prediction" in breakdown_table(load_run(tmp_path / "r"))


def test_an_open_loop_past_capacity_is_banded_as_saturated_not_poisson() -> None:
    """Arrivals at a rate the engine cannot serve: the queue grows all run and TTFT is the
    queue's, which no in-capacity Poisson row measured; the same engine at a rate it keeps
    up with stays Poisson."""
    engine = ("--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "L40S", "--max-model-len", "8192",
              "--input-tokens", "4000", "--output-tokens", "100", "--json")
    over = json.loads(sim_cli("--rate", "20", "-n", "120", *engine).stdout)
    assert any(w.startswith("the server could not keep up") for w in over["warnings"]), over["warnings"]
    assert over["prediction"]["regime"] == "saturated"
    under = json.loads(sim_cli("--rate", "0.5", "-n", "12", *engine).stdout)
    assert not any(w.startswith("the server could not keep up") for w in under["warnings"])
    assert under["prediction"]["regime"] == "Poisson"


def test_a_closed_loop_past_capacity_is_banded_as_saturated_and_one_within_it_as_a_closed_loop() -> None:
    """Sixty-four users on an engine that runs four at a time wait in its queue for most
    of their time to first token, which no in-capacity closed-loop row measured: the
    saturated bands, as an open loop past capacity gets. A few users it runs at once keep
    the closed-loop bands, though their short prompts wait there too (the front end, a step)."""
    shape = ("--input-tokens", "500", "--output-tokens", "100", "--json")
    over = json.loads(sim_cli("-c", "64", "-n", "200", "--max-num-seqs", "4", *shape).stdout)
    queue, ttft = over["latency_breakdown"]["server_queue_ms"]["mean"], over["ttft_ms"]["mean"]
    assert queue > ttft / 2  # (the run is what the test says it is)
    assert over["prediction"]["regime"] == "saturated"
    assert "saturated" in over["prediction"]["error_bands"]["ttft_ms"]["text"]
    within = json.loads(sim_cli("-c", "4", "-n", "40", "--max-num-seqs", "4", *shape).stdout)
    assert within["prediction"]["regime"] == "closed loop"
    small = json.loads(sim_cli("-c", "8", "-n", "80", "--input-tokens", "50", "--output-tokens", "100", "--json").stdout)
    assert small["latency_breakdown"]["server_queue_ms"]["mean"] > small["latency_breakdown"]["prefill_ms"]["mean"]
    assert small["prediction"]["regime"] == "closed loop"
    # Sixteen users of 4,000-token prompts on an L40S all get a place in the batch and wait
    # behind each other's prefill chunks, for more than half their TTFT and over ten
    # steps: what the closed-loop rows measured (InferenceMAX's 8k-token loops), not a
    # queue for a place; the closed-loop bands.
    long = json.loads(sim_cli("-c", "16", "-n", "48", "--gpu", "L40S", "--input-tokens", "4000",
                              "--output-tokens", "100", "--json").stdout)
    parts = long["latency_breakdown"]
    assert parts["server_queue_ms"]["mean"] > max(parts["prefill_ms"]["mean"], 10 * long["tpot_ms"]["mean"])
    assert long["prediction"]["preemptions"] == 0 and long["prediction"]["regime"] == "closed loop"


def test_a_recorded_closed_loop_replayed_with_its_users_is_banded_as_a_closed_loop(tmp_path: Path) -> None:
    """A requests.jsonl of a closed loop replays with its users (a closed loop again): its
    error bands are the closed loop's, not the Poisson rows' of a timed replay."""
    ran = sim_cli("-c", "3", "-n", "9", "--input-tokens", "64", "--output-tokens", "8", "--out", str(tmp_path / "r"))
    assert ran.returncode == 0, ran.stderr
    replay = sim_cli("--trace", str(tmp_path / "r" / "requests.jsonl"), "--json")
    assert replay.returncode == 0, replay.stderr
    assert json.loads(replay.stdout)["prediction"]["regime"] == "closed loop"
    # each user sends when its last request ends: no speedup changes a send time, so none is taken
    fast = sim_cli("--trace", str(tmp_path / "r" / "requests.jsonl"), "--speedup", "10")
    assert fast.returncode == 2 and "--speedup would change no send time" in fast.stderr, fast.stderr


def test_a_recorded_open_loop_with_a_cap_is_replayed_under_the_same_cap(tmp_path: Path) -> None:
    """requests.jsonl holds each request's intended send time, not when --max-concurrency
    let it go: replayed without the cap, 8 requests at 50 req/s that had queued behind one
    slot ran side by side and the replay "measured" the run's own engine as different.
    The replay takes the cap from config.json, says so, and --max-concurrency still wins."""
    ran = sim_cli("--rate", "50", "--max-concurrency", "1", "-n", "8", "--input-tokens", "200",
                  "--output-tokens", "50", "--out", str(tmp_path / "r"), "--json")
    assert ran.returncode == 0, ran.stderr
    trace = str(tmp_path / "r" / "requests.jsonl")
    replay = sim_cli("--trace", trace, "--json")
    assert replay.returncode == 0 and "--max-concurrency 1 (from the config.json" in replay.stderr, replay.stderr
    recorded, again = json.loads(ran.stdout), json.loads(replay.stdout)
    assert again["config"]["load"]["schedule"]["max_concurrency"] == 1
    assert recorded["queue_delay_ms"]["mean"] > 100 * recorded["ttft_ms"]["mean"] / 16  # (they queued)
    for m in ("ttft_ms", "e2e_ms", "queue_delay_ms"):
        assert again[m]["mean"] == pytest.approx(recorded[m]["mean"], rel=1e-6), m
    uncapped = json.loads(sim_cli("--trace", trace, "--max-concurrency", "8", "--json").stdout)
    assert uncapped["ttft_ms"]["mean"] > 1.2 * recorded["ttft_ms"]["mean"]


def test_a_run_of_a_mooncake_trace_replays_with_its_shared_blocks(tmp_path: Path) -> None:
    """Mooncake rows share prompt blocks by hash id; the run's requests.jsonl records the
    ids, so its replay hits the prefix cache where the run did (it recorded none, and the
    replay sent unique prompts: TTFT +119 % against the run's own engine)."""
    rows = [(0, 1100, [46, 47, 48]), (1535, 1100, [46, 47, 49]), (500, 600, [46, 50])]
    trace = tmp_path / "moon.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 20, "hash_ids": h}) + "\n"
                             for t, n, h in rows))
    ran = sim_cli("--trace", str(trace), "--out", str(tmp_path / "r"), "--json")
    assert ran.returncode == 0, ran.stderr
    recorded = [json.loads(x) for x in (tmp_path / "r" / "requests.jsonl").read_text().splitlines()]
    assert sorted(r["hash_ids"] for r in recorded) == sorted(h for _, _, h in rows)
    # what the blocks share: 512 tokens of block 46 at 0.5 s, 1,024 of 46 and 47 at 1.535 s
    assert sorted(r["cached_tokens"] for r in recorded) == [0, 512, 1024]
    replay = sim_cli("--trace", str(tmp_path / "r" / "requests.jsonl"), "--json")
    assert replay.returncode == 0, replay.stderr
    again = json.loads(replay.stdout)
    assert again["trace_comparison"]["ttft_ms"]["error_pct"] == pytest.approx(0, abs=1e-6)


@pytest.mark.parametrize("load", [("-c", "3"), ("--rate", "20")], ids=["closed-loop", "open-loop"])
def test_a_replayed_run_keeps_its_warm_ups_out_of_the_metrics(tmp_path: Path, load: tuple[str, str]) -> None:
    """The recorded run's warm-ups are warm-ups again in its replay (they load the server,
    they are not counted); -n counts measured requests after them, as in the run."""
    ran = sim_cli(*load, "-n", "9", "--warmup", "4", "--input-tokens", "64", "--output-tokens", "8",
                  "--out", str(tmp_path / "r"))
    assert ran.returncode == 0, ran.stderr
    trace = str(tmp_path / "r" / "requests.jsonl")
    recorded = [json.loads(x) for x in Path(trace).read_text().splitlines()]
    assert sum(r["warmup"] for r in recorded) == 4 and len(recorded) == 13
    whole = json.loads(sim_cli("--trace", trace, "--json").stdout)
    assert (whole["counts"]["completed"], whole["counts"]["warmup"]) == (9, 4)
    part = json.loads(sim_cli("--trace", trace, "-n", "5", "--json").stdout)
    assert (part["counts"]["completed"], part["counts"]["warmup"]) == (5, 4)
    more = json.loads(sim_cli("--trace", trace, "--warmup", "2", "--json").stdout)
    assert (more["counts"]["completed"], more["counts"]["warmup"]) == (7, 6)


def test_a_requests_own_limit_reaches_the_engine() -> None:
    """The engine learns each request's max_tokens beside the length it will generate
    (SGLang's admission estimates outputs from the first): equal with an exact length
    asked; without one (--no-exact-output) the limit stays where answers end sooner."""
    seen: list[tuple[int, int | None]] = []

    class Recording(Engine):
        def add_request(
            self, request_id: str, prompt_ids: Sequence[int], output_len: int, now_s: float,
            max_tokens: int | None = None,
        ) -> None:
            seen.append((output_len, max_tokens))
            super().add_request(request_id, prompt_ids, output_len, now_s, max_tokens)

    config = EngineConfig(engine_family="sglang", max_model_len=4096)
    for exact in (True, False):
        seen.clear()
        specs = [RequestSpec(list(range(7 * k, 7 * k + 100)), 400, exact) for k in range(12)]
        simulate(Recording(config), LoadConfig(ClosedLoop(4), num_requests=len(specs)), iter(specs))
        assert len(seen) == 12 and all(limit == 400 for _, limit in seen)
        lengths = {out for out, _ in seen}
        assert lengths == {400} if exact else min(lengths) < 400


def test_the_engine_line_names_the_host_costs_the_step_time_charges() -> None:
    """The summary's engine line says what the engine core's host costs a step and a
    sequence: the family's own, eager's larger per-step cost, and nothing where the
    step time is another model's (a fitted twin's carries its own)."""
    from inferlab.cli.sim import engine_line
    from inferlab.sim.engine.families import FAMILY_RULES, EngineFamily

    def host_words(engine: Engine) -> str:
        return next((p for p in engine_line(engine).split(", ") if p.startswith("host ")), "")

    v1 = FAMILY_RULES[EngineFamily.VLLM].efficiencies
    graphs, eager = Engine(EngineConfig()), Engine(EngineConfig(enforce_eager=True))
    assert host_words(graphs) == f"host {v1.cpu_step_s * 1e3:g} ms/step + {v1.per_seq_s * 1e6:g} us/scheduled sequence"
    assert host_words(eager).startswith(f"host {v1.cpu_step_eager_s * 1e3:g} ms/step")
    assert host_words(graphs) != host_words(eager)
    # vLLM 0.6's multi-step scheduling pays the host cost once per group of steps
    grouped = Engine(EngineConfig(engine_family=EngineFamily.VLLM_V0, num_scheduler_steps=8))
    assert "ms/8-step schedule + " in host_words(grouped)
    sglang = Engine(EngineConfig(engine_family=EngineFamily.SGLANG))
    assert host_words(sglang) != host_words(graphs)

    class Flat:
        def step_time_s(self, seqs: Sequence[tuple[int, int]], emitting: int) -> float:
            return 0.01

    assert Engine(EngineConfig(), step_time=Flat()).host_costs is None
    # and the card's bandwidth factor where it is not 1 (H200, GDDR cards), nowhere else
    parts = {g: engine_line(Engine(EngineConfig(gpu=g))).split(", ") for g in ("H100", "H200", "L40S")}
    assert "bandwidth factor 0.92" in parts["H200"] and "bandwidth factor 1.12" in parts["L40S"]
    assert not any(p.startswith("bandwidth factor") for p in parts["H100"])
    # and that a GeForce card's all-reduce goes through host memory, where there is one
    no_p2p = "all-reduce through host memory (no P2P)"
    assert no_p2p in engine_line(Engine(EngineConfig(gpu="4090", tensor_parallel_size=2))).split(", ")
    assert no_p2p not in engine_line(Engine(EngineConfig(gpu="4090")))
    assert no_p2p not in engine_line(Engine(EngineConfig(gpu="L40S", tensor_parallel_size=2)))
    assert host_words(Engine(EngineConfig(), step_time=Flat())) == ""


def test_the_engine_line_names_tensorrt_llms_admission() -> None:
    from inferlab.cli.sim import engine_line
    from inferlab.sim.engine.engine import Engine, EngineConfig
    from inferlab.sim.engine.families import EngineFamily

    said = "admitted only with room to the output limit (no eviction)"
    for family in EngineFamily:
        parts = engine_line(Engine(EngineConfig(engine_family=family))).split(", ")
        assert (said in parts) == (family is EngineFamily.TRTLLM), family


def test_a_sim_runs_summary_records_its_kv_cache_and_preemptions(tmp_path: Path) -> None:
    """The KV cache as sized goes into config.json, and the preemptions into the
    prediction block and the console: a 16-block cache preempts under four long answers,
    a large one does not."""
    from click.testing import CliRunner

    from inferlab.cli.main import main

    def run(*flags: str) -> tuple[dict[str, Any], str]:
        out = tmp_path / "x".join(flags).replace("-", "")
        res = CliRunner().invoke(main, ["sim", "run", "--model", "Llama-3.1-8B", "-n", "4", "--rate", "inf", "--served",
                                        "--input-tokens", "64", "--output-tokens", "128", "-o", str(out), *flags])
        assert res.exit_code == 0, res.output
        return json.loads((out / "summary.json").read_text()), res.stdout

    small, text = run("--num-gpu-blocks-override", "17", "--block-size", "16")
    engine = small["config"]["engine"]
    assert (engine["kv_cache_blocks"], engine["kv_cache_tokens"]) == (16, 256)
    assert small["prediction"]["preemptions"] > 0 and "preemptions" in text
    large, text = run()
    assert large["config"]["engine"]["kv_cache_tokens"] > 100_000
    assert large["prediction"]["preemptions"] == 0 and "preemptions" not in text


def test_a_sim_run_longer_than_the_validated_rows_says_so() -> None:
    from click.testing import CliRunner

    from inferlab.cli.main import main

    def run(tokens: str) -> tuple[dict[str, Any], str]:
        res = CliRunner().invoke(main, ["sim", "run", "--model", "Llama-3.1-8B", "-c", "2", "-n", "2",
                                        "--input-tokens", tokens, "--output-tokens", "8", "--json"])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)["prediction"], res.stderr

    long, _ = run("60000")
    assert any("its prompts (60,000 tokens on average) are longer" in s for s in long["beyond_validated"])
    short, _ = run("500")
    assert "beyond_validated" not in short


@pytest.mark.parametrize("load", [(), ("--rate", "2"), ("-c", "2")])
def test_a_count_of_no_requests_is_refused_by_its_own_flag(load: tuple[str, ...]) -> None:
    for n in ("0", "-3"):
        p = sim_cli("-n", n, *load)
        assert p.returncode == 2 and "-n/--num-requests must be at least 1" in p.stderr, p.stderr
        assert "concurrency" not in p.stderr


@pytest.mark.parametrize("mixed", [(), ("--enable-mixed-chunk",)])
def test_sglangs_prefill_chunk_size_bounds_prompt_chunks_not_decodes(tmp_path: Path, mixed: tuple[str, ...]) -> None:
    """SGLang's --chunked-prefill-size bounds the prompt tokens of a step; every running
    request still decodes in a decode step (vLLM's budget bounds both, and vLLM refuses a
    budget below its sequence cap). A budget of 64 with 96 users: no prompt chunk above 64;
    apart, decode steps of more than 64 tokens; mixed (--enable-mixed-chunk), a step's
    chunk gets the budget less its decodes; the cap left where it was given."""
    log = tmp_path / "steps.jsonl"
    p = sim_cli("--engine-family", "sglang", "--chunked-prefill-size", "64", "--max-running-requests", "96", *mixed,
                "-c", "96", "-n", "192", "--input-tokens", "40", "--output-tokens", "30", "--step-log", str(log), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["config"]["engine"]["max_num_seqs"] == 96
    steps = [json.loads(x) for x in log.read_text().splitlines()]
    assert max(s["prefill_tokens"] for s in steps) <= 64
    if mixed:  # a chunk beside decodes takes what they leave of the 64 (so no more than 64 run)
        assert all(s["prefill_tokens"] + s["decode_tokens"] <= 64 + 1 or s["prefill_tokens"] == 0 for s in steps)
        assert any(s["prefill_tokens"] and s["decode_tokens"] for s in steps)
    else:  # prefill steps fill up the running set, then all of it decodes
        assert max(s["decode_tokens"] for s in steps) > 64
    # without a cap the family's own stays (not lowered to the budget, as vLLM's would be refused)
    p = sim_cli("--engine-family", "sglang", "--chunked-prefill-size", "64", "-n", "2", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["config"]["engine"]["max_num_seqs"] > 64
    p = sim_cli("--max-num-batched-tokens", "64", "--max-num-seqs", "96", "-n", "2")
    assert p.returncode == 2 and "must be greater than or equal to max_num_seqs (96)" in p.stderr
    # and the engine line says which tokens the budget bounds
    lines = [sim_cli(*family, "-n", "2").stdout for family in (("--engine-family", "sglang"), ())]
    assert "8,192 prompt tokens/step" in " ".join(lines[0].split()) and "prompt tokens/step" not in lines[1]


def test_a_send_at_the_instant_a_request_ends_is_not_recorded_before_that_end() -> None:
    """Send times and token times went to ns by two roundings (half to even, half up): a
    closed-loop user's next send, at its last answer's end, was recorded 1 ns before
    that end, and a report of 64 users showed 66 in flight for an instant."""
    from inferlab.load.virtual import _ns, _TokenNs

    token_ns = _TokenNs()
    times = [595.1539566925, *((k + 0.5) / 1e9 for k in range(0, 4000, 7)), *(k / 8 for k in range(50))]
    assert [_ns(t) for t in times] == [token_ns[t] for t in times]


def test_sim_run_on_the_completions_api_answers_in_vllms_default_16_tokens() -> None:
    """Without --output-tokens, a completions request carries no max_tokens, and vLLM
    answers it in at most 16 tokens; sim run answered in the model's natural length, as
    on the chat API (where vLLM's default is the context that is left)."""
    done = {api: sim_cli("--api", api, "-n", "12", "--input-tokens", "64", "--json") for api in ("chat", "completions")}
    runs = {api: json.loads(p.stdout) for api, p in done.items()}
    assert runs["completions"]["output_tokens"] <= 16 * 12 < runs["chat"]["output_tokens"]  # (totals of 12 answers)
    # and it is said, where it applies
    assert any("completions requests carried no max_tokens" in w and "(16 tokens median here)" in w
               for w in runs["completions"]["warnings"])
    assert not any("max_tokens" in w for w in runs["chat"]["warnings"])
