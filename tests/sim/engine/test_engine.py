import dataclasses
import math
import random
from collections.abc import Sequence
from typing import Any

import pytest

from inferlab._errors import ConfigError, UsageError
from inferlab.load.virtual import serve_timelines
from inferlab.sim import Engine, EngineConfig, RequestTimeline, StepResult

# (an infinitely fast host: the API front end is its fixed latency alone, no CPU queue)
SMALL = EngineConfig(
    max_model_len=2048, max_num_batched_tokens=2048, max_num_seqs=16, api_overhead_s=0.002, host_speed=math.inf
)


def drain(engine: Engine, now_s: float = 0.0) -> tuple[float, list[StepResult]]:
    """Step until idle; checks block accounting after every step."""
    results = []
    while (r := engine.step(now_s)) is not None:
        results.append(r)
        now_s += r.duration_s
        engine._kv.check_invariants()
    return now_s, results


def prompt(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


class FixedStep:
    """A step-time model that takes 10 ms per step whatever it holds."""

    def step_time_s(self, seqs: Sequence[tuple[int, int]], emitting: int) -> float:
        return 0.01


def test_each_request_gets_exactly_output_len_tokens_in_order() -> None:
    engine = Engine(SMALL)
    wanted = {"a": 1, "b": 7, "c": 40}
    for i, (rid, n) in enumerate(wanted.items()):
        engine.add_request(rid, prompt(100 + 50 * i, 1000 * i), n, now_s=0.0)
    _, results = drain(engine)
    seen: dict[str, list[int]] = {rid: [] for rid in wanted}
    for r in results:
        for ev in r.events:
            seen[ev.request_id].append(ev.token_index)
            assert ev.finished == (ev.token_index == wanted[ev.request_id] - 1)
    assert seen == {rid: list(range(n)) for rid, n in wanted.items()}
    assert engine.generation_tokens_total == 48
    assert engine.prompt_tokens_total == 100 + 150 + 200
    for rid, n in wanted.items():
        tl = engine.timeline(rid)
        assert tl.output_tokens == n
        assert tl.scheduled_s is not None and tl.first_token_s is not None
        assert tl.finished_s is not None
        assert tl.arrival_s + SMALL.api_overhead_s <= tl.scheduled_s < tl.first_token_s
        assert tl.first_token_s <= tl.finished_s
    assert engine.kv_usage == 0.0 and not engine.has_work()


def test_first_token_comes_at_the_end_of_the_step_that_finishes_prefill() -> None:
    engine = Engine(dataclasses.replace(SMALL, max_num_batched_tokens=1024), FixedStep())
    engine.add_request("a", prompt(2000), 3, now_s=0.0)  # chunked over 2 steps
    idle = engine.step(0.0)
    assert idle is not None and idle.events == []
    assert idle.duration_s == pytest.approx(SMALL.api_overhead_s)
    now_s = idle.duration_s
    _, results = drain(engine, now_s)
    assert [len(r.events) for r in results] == [0, 1, 1, 1]
    tl = engine.timeline("a")
    assert tl.scheduled_s == pytest.approx(0.002)
    assert tl.first_token_s == pytest.approx(0.022)
    assert tl.finished_s == pytest.approx(0.042)
    assert results[0].stats.prefill_tokens == 1024 and results[2].stats.decode_tokens == 1


def test_random_workload_never_leaks_blocks_or_breaks_limits() -> None:
    rng = random.Random(42)
    cfg = dataclasses.replace(SMALL, num_gpu_blocks_override=300, max_num_batched_tokens=512)
    engine = Engine(cfg)
    shared = prompt(300, 50_000)
    wanted: dict[str, int] = {}
    now_s, i = 0.0, 0
    got: dict[str, int] = {}
    while i < 120 or engine.has_work():
        while i < 120 and rng.random() < 0.3:
            p = (shared if i % 2 else []) + prompt(rng.randint(1, 600), 1000 * i)
            out = rng.randint(1, 200)
            engine.add_request(f"r{i}", p, out, now_s)
            wanted[f"r{i}"] = out
            i += 1
        r = engine.step(now_s)
        if r is None:
            now_s += 0.01
            continue
        assert r.stats.prefill_tokens + r.stats.decode_tokens <= 512
        assert r.stats.num_running <= 16
        engine._kv.check_invariants()
        for ev in r.events:
            got[ev.request_id] = got.get(ev.request_id, 0) + 1
        now_s += r.duration_s
    assert got == wanted
    assert engine.preemptions_total > 0
    assert engine.prefix_hits_tokens > 0
    assert engine.kv_usage == 0.0
    assert engine._kv.num_free_blocks == engine.num_kv_blocks == 299  # (300 less the null block)


def test_preemption_under_a_tiny_kv_cache_still_finishes_everything() -> None:
    cfg = dataclasses.replace(SMALL, num_gpu_blocks_override=140)  # 2,240 tokens
    engine = Engine(cfg)
    for i in range(8):
        engine.add_request(f"r{i}", prompt(200, 1000 * i), 400, now_s=0.0)
    drain(engine)
    timelines = [engine.timeline(f"r{i}") for i in range(8)]
    assert all(t.output_tokens == 400 and t.finished_s is not None for t in timelines)
    assert engine.preemptions_total == sum(t.preemptions for t in timelines) > 0
    assert timelines[0].preemptions == 0  # the oldest request is never the victim


def _shared_prefix_ttfts(caching: bool) -> tuple[RequestTimeline, RequestTimeline]:
    engine = Engine(dataclasses.replace(SMALL, enable_prefix_caching=caching))
    system = prompt(1000, 7)
    engine.add_request("first", system + prompt(50, 90_000), 10, now_s=0.0)
    now_s, _ = drain(engine)
    engine.add_request("second", system + prompt(50, 80_000), 10, now_s=now_s)
    drain(engine, now_s)
    return engine.timeline("first"), engine.timeline("second")


def test_prefix_caching_skips_a_shared_prefix() -> None:
    first, second = _shared_prefix_ttfts(caching=True)
    assert first.cached_tokens == 0
    assert second.cached_tokens >= 992
    assert first.first_token_s is not None and second.first_token_s is not None
    ttft_first = first.first_token_s - first.arrival_s
    ttft_second = second.first_token_s - second.arrival_s
    assert ttft_second < ttft_first
    _, off_second = _shared_prefix_ttfts(caching=False)
    assert off_second.cached_tokens == 0


def test_prefix_counters_count_queries_and_hits_in_tokens() -> None:
    engine = Engine(SMALL)
    engine.add_request("a", prompt(100), 2, 0.0)
    now_s, _ = drain(engine)
    engine.add_request("b", prompt(100), 2, now_s)
    drain(engine, now_s)
    assert engine.prefix_queries_tokens == 200
    assert engine.prefix_hits_tokens == 96


def test_requests_that_can_never_run_are_rejected() -> None:
    engine = Engine(EngineConfig(max_model_len=4096))
    with pytest.raises(ValueError, match=r"maximum context length is 4096 tokens.*5000 tokens"):
        engine.add_request("x", prompt(4900), 100, 0.0)
    with pytest.raises(ValueError):
        engine.add_request("x", [], 10, 0.0)
    with pytest.raises(ValueError):
        engine.add_request("x", prompt(10), 0, 0.0)
    engine.add_request("x", prompt(10), 1, 0.0)
    with pytest.raises(ValueError, match="already"):
        engine.add_request("x", prompt(10), 1, 0.0)
    assert engine.num_waiting == 1


def test_construction_refuses_what_vllm_refuses() -> None:
    with pytest.raises(ValueError, match="weights need"):
        Engine(EngineConfig(model="meta-llama/Llama-3.1-70B-Instruct", gpu="H100"))
    Engine(EngineConfig(model="meta-llama/Llama-3.1-70B-Instruct", tensor_parallel_size=4))
    with pytest.raises(ValueError, match="KV cache"):
        Engine(dataclasses.replace(SMALL, num_gpu_blocks_override=10))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        Engine(EngineConfig(model="meta-llama/Llama-2-7b-hf", max_model_len=8192))
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        Engine(EngineConfig(enable_chunked_prefill=False, max_num_batched_tokens=2048))
    with pytest.raises(UsageError):
        Engine(EngineConfig(gpu="MI300X"))


def test_kv_capacity_is_memory_left_after_weights_and_reserve() -> None:
    engine = Engine(EngineConfig())
    gib = 2**30
    # Qwen2.5-7B, one H100 at 0.9: 72 GiB - 14.2 GiB weights - ~3 GiB reserve, 56 KiB/token
    assert 50 * gib / 57_344 < engine.kv_capacity_tokens < 58 * gib / 57_344
    fp8 = Engine(EngineConfig(kv_cache_dtype="fp8"))
    assert fp8.kv_capacity_tokens == pytest.approx(2 * engine.kv_capacity_tokens, rel=1e-3)
    assert engine.kv_capacity_tokens == engine.num_kv_blocks * 16


def test_abort_and_forget() -> None:
    engine = Engine(SMALL)
    engine.add_request("a", prompt(500), 50, 0.0)
    engine.add_request("b", prompt(500, 10_000), 50, 0.0)
    engine.step(0.0)
    engine.step(0.01)
    assert engine.kv_usage > 0
    engine.abort("a")
    engine.abort("b")
    engine.abort("nope")
    assert engine.kv_usage == 0.0 and not engine.has_work()
    assert engine.timeline("a").finished_s is None
    assert engine.step(1.0) is None
    engine.forget("a")
    with pytest.raises(KeyError):
        engine.timeline("a")


def _workload(n: int, seed: int) -> list[tuple[float, str, list[int], int]]:
    rng = random.Random(seed)
    t = 0.0
    arrivals = []
    for i in range(n):
        t += rng.expovariate(20.0)
        p = prompt(rng.randint(20, 600), rng.randrange(4) * 10_000)  # 4 shared prefixes
        arrivals.append((t, f"r{i}", p, rng.randint(1, 100)))
    return arrivals


def test_virtual_run_is_deterministic_and_complete() -> None:
    arrivals = _workload(200, seed=5)
    a = serve_timelines(Engine(SMALL), arrivals)
    b = serve_timelines(Engine(SMALL), arrivals)
    assert a == b
    assert set(a) == {rid for _, rid, _, _ in arrivals}
    for arrival_s, rid, _, out in arrivals:
        tl = a[rid]
        assert tl.arrival_s == arrival_s and tl.output_tokens == out
        assert tl.scheduled_s is not None and tl.scheduled_s >= arrival_s + SMALL.api_overhead_s
        assert tl.finished_s is not None


def test_virtual_run_jumps_idle_time() -> None:
    engine = Engine(SMALL)
    timelines = serve_timelines(engine, [(0.0, "a", prompt(10), 2), (100.0, "b", prompt(10), 2)])
    b = timelines["b"]
    assert b.scheduled_s == pytest.approx(100.0 + SMALL.api_overhead_s)
    assert b.cached_tokens == 0  # 10 tokens: no full block
    with pytest.raises(KeyError):
        engine.timeline("a")  # serve_timelines hands the timelines over and forgets them


def test_vllm_startup_checks_on_budget_and_block_size() -> None:


    with pytest.raises(ValueError, match="max_num_seqs"):
        Engine(EngineConfig(max_num_batched_tokens=64, max_num_seqs=128))
    with pytest.raises(ValueError, match="block_size"):
        Engine(EngineConfig(block_size=7))
    Engine(EngineConfig(max_num_batched_tokens=128, max_num_seqs=128, block_size=32))


def decode_step_s(config: EngineConfig) -> float:
    engine = Engine(config)
    engine.add_request("r", list(range(100, 164)), 3, 0.0)
    steps = []
    t = 0.0
    while (res := engine.step(t)) is not None:
        steps.append(res.duration_s)
        t += res.duration_s
    return steps[-1]  # the last step is a pure batch-1 decode


def test_engine_family_selects_its_constants(tmp_path: Any) -> None:
    v1 = decode_step_s(EngineConfig())
    v0 = decode_step_s(EngineConfig(engine_family="vllm-v0"))
    sglang = decode_step_s(EngineConfig(engine_family="sglang"))
    assert sglang < v1 < v0  # host cost per step: overlap scheduler < V1 < V0
    with pytest.raises(UsageError, match="engine family"):
        Engine(EngineConfig(engine_family="tgi-2"))
    # a constants file applies on top of the family's
    f = tmp_path / "eff.json"
    f.write_text('{"cpu_step_s": 0.0105}')
    on_v0 = decode_step_s(EngineConfig(engine_family="vllm-v0", efficiencies_path=str(f)))
    assert on_v0 > v0 + 0.008


def test_no_room_for_any_kv_block_is_a_clear_error_even_with_the_default_context() -> None:
    with pytest.raises(ValueError, match="No available memory for the cache blocks"):
        Engine(EngineConfig(model="Qwen/Qwen2.5-7B-Instruct", gpu="RTX4090", gpu_memory_utilization=0.66))


def step_shapes(config: EngineConfig, prompts: Sequence[int], out: int = 4) -> list[tuple[int, int]]:
    """(prefill tokens, decode tokens) of every step, all requests arriving at t=0."""
    engine = Engine(config)
    for i, n in enumerate(prompts):
        engine.add_request(str(i), prompt(n, 10_000 * i), out, 0.0)
    _, results = drain(engine)
    return [(r.stats.prefill_tokens, r.stats.decode_tokens) for r in results if r.stats.prefill_tokens or r.stats.decode_tokens]


def test_engine_families_schedule_like_their_engines() -> None:
    base = EngineConfig(model="Qwen/Qwen2.5-7B-Instruct", max_model_len=8192, api_overhead_s=0.0)
    # vLLM V1: a 6,000-token prompt is chunked under the 2,048-token budget and its chunks
    # share steps with the decodes of a running request
    v1 = step_shapes(dataclasses.replace(base, gpu="A100"), [100, 6000])
    assert max(p for p, _ in v1) <= 2048 and any(p and d for p, d in v1)
    # vLLM V0 (8K context): whole prompts in prefill-only steps of up to 8,192 tokens
    v0 = step_shapes(dataclasses.replace(base, engine_family="vllm-v0"), [3000, 6000])
    assert [p for p, _ in v0 if p] == [3000, 6000] and not any(p and d for p, d in v0)
    # SGLang: prefill and decode never share a step
    sglang = step_shapes(dataclasses.replace(base, engine_family="sglang"), [100, 3000, 500])
    assert not any(p and d for p, d in sglang)
    # TurboMind: every admitted prompt is prefilled before the first decode
    lmdeploy = step_shapes(dataclasses.replace(base, engine_family="lmdeploy"), [100, 3000, 500])
    assert lmdeploy[0] == (3600, 0)


def test_trtllm_and_lmdeploy_size_the_kv_cache_from_what_weights_leave() -> None:
    """TRT-LLM/LMDeploy give the KV cache a share of the memory after weights; a larger
    share means more blocks. gpu_memory_utilization, which would size nothing there, is
    refused, as is their share for the families that size by gpu_memory_utilization."""
    trt = Engine(EngineConfig(model="Llama-3.1-8B", engine_family="trtllm"))
    more = Engine(EngineConfig(model="Llama-3.1-8B", engine_family="trtllm", kv_cache_free_fraction=0.95))
    assert more.num_kv_blocks > trt.num_kv_blocks
    for family in ("trtllm", "lmdeploy"):
        with pytest.raises(ConfigError, match="give --kv-cache-free-gpu-mem-fraction"):
            Engine(EngineConfig(model="Llama-3.1-8B", engine_family=family, gpu_memory_utilization=0.6))
    for family in ("vllm", "sglang", "vllm-v0"):
        with pytest.raises(ConfigError, match="sizes its KV cache with --gpu-memory-utilization"):
            Engine(EngineConfig(model="Llama-3.1-8B", engine_family=family, kv_cache_free_fraction=0.5))
    # they take the whole card: 70B in bf16 (131 GiB) fits one H200 (140 GiB), where vLLM's
    # 0.9 of it does not
    assert Engine(EngineConfig(model="Llama-3.1-70B", gpu="H200", engine_family="trtllm")).num_kv_blocks > 0
    with pytest.raises(ConfigError, match=r"gpu_memory_utilization=0\.9 allows"):
        Engine(EngineConfig(model="Llama-3.1-70B", gpu="H200"))
    # (and TurboMind has no fp8 KV cache to simulate: its int8/int4 ones are not)
    with pytest.raises(ConfigError, match="TurboMind has no fp8 KV cache"):
        Engine(EngineConfig(model="Llama-3.1-8B", engine_family="lmdeploy", kv_cache_dtype="fp8"))
    lmdeploy = Engine(EngineConfig(model="Llama-3.1-8B", engine_family="lmdeploy"))
    assert lmdeploy.num_kv_blocks < trt.num_kv_blocks  # 0.8 of it, not 0.9


def test_multi_step_scheduling_runs_decode_groups_and_new_requests_wait_for_the_end() -> None:
    """--num-scheduler-steps N (vLLM 0.6): a decode batch runs N steps before the scheduler
    runs again, so an arrival waits for the group; the later steps skip the host's
    scheduling cost."""

    def run(steps: int) -> tuple[list[float], int]:
        engine = Engine(dataclasses.replace(SMALL, num_scheduler_steps=steps, api_overhead_s=0.0, engine_family="vllm-v0", host_speed=1.0))
        engine.add_request("a", prompt(64), 40, 0.0)
        durations, t = [], 0.0
        for _ in range(3):  # the prefill, then decodes
            r = engine.step(t)
            assert r is not None
            durations.append(r.duration_s)
            t += r.duration_s
        engine.add_request("b", prompt(64, 5000), 4, t)
        n_before_b = 3
        while engine.timeline("b").scheduled_s is None:
            r = engine.step(t)
            assert r is not None
            durations.append(r.duration_s)
            t += r.duration_s
            n_before_b += 1
        return durations, n_before_b

    single, b_single = run(1)
    multi, b_multi = run(8)
    assert b_single == 4  # b prefills in the step right after it arrives
    # with groups of 8 decode steps from step 2 (1 prefill + 8 decodes), b waits to step 10
    assert b_multi == 10
    # inside a group, steps after the first cost less (scheduling paid once per group)
    assert multi[2] < multi[1] and multi[1] == pytest.approx(single[1])


def test_multi_step_group_ends_when_its_last_request_finishes() -> None:
    engine = Engine(dataclasses.replace(SMALL, num_scheduler_steps=16, api_overhead_s=0.0, engine_family="vllm-v0", host_speed=1.0))
    engine.add_request("a", prompt(64), 3, 0.0)
    t, _ = drain(engine)
    engine.add_request("b", prompt(64, 5000), 2, t)
    r = engine.step(t)
    assert r is not None and r.stats.prefill_tokens == 64  # no leftover group holds b back


def test_multi_step_is_refused_where_the_engine_has_none() -> None:
    for family in ("vllm", "sglang", "trtllm", "lmdeploy"):
        with pytest.raises(ConfigError, match="no multi-step scheduling"):
            Engine(dataclasses.replace(SMALL, num_scheduler_steps=8, engine_family=family))


def test_a_front_end_accepts_requests_one_at_a_time(tmp_path: Any) -> None:
    """api_intake_s: a burst queues at the API server's door. In its own process (vLLM
    >= 0.6) the k-th request reaches the scheduler k intakes after the burst; inside the
    engine's process (vLLM <= 0.5) accepting requests stalls the engine loop instead."""
    f = tmp_path / "eff.json"
    f.write_text('{"api_intake_s": 0.004}')
    queued = Engine(dataclasses.replace(SMALL, api_overhead_s=0.0, host_speed=1.0, efficiencies_path=str(f)), FixedStep())
    for i in range(10):
        queued.add_request(str(i), prompt(32, 100 * i), 2, 0.0)
    drain(queued)
    scheduled = [queued.timeline(str(i)).scheduled_s for i in range(10)]
    assert all(s is not None and s >= 0.004 * (i + 1) - 1e-9 for i, s in enumerate(scheduled))
    assert scheduled[9] > scheduled[0] + 0.03  # not all at once
    in_process = Engine(
        dataclasses.replace(SMALL, api_overhead_s=0.0, engine_family="vllm-v0.5", max_num_batched_tokens=4096, host_speed=1.0),
        FixedStep(),
    )
    for i in range(100):
        in_process.add_request(str(i), prompt(32, 100 * i), 2, 0.0)
    r = in_process.step(0.0)
    assert r is not None and r.duration_s == pytest.approx(0.01 + 100 * 0.0025)  # the stall
    # the engine accepts a request when it arrives from the API path (25 ms), in the step
    # that can schedule it; a step already running when the requests arrive is not charged
    for n, first_step_s in ((4, 0.01 + 4 * 0.0025), (100, 0.01 + 100 * 0.0025)):
        eng = Engine(
            dataclasses.replace(SMALL, api_overhead_s=0.025, engine_family="vllm-v0.5", max_num_batched_tokens=4096, host_speed=1.0),
            FixedStep(),
        )
        for i in range(n):
            eng.add_request(str(i), prompt(32, 100 * i), 2, 0.0)
        idle = eng.step(0.0)
        assert idle is not None and idle.duration_s == pytest.approx(0.025) and not idle.events
        r = eng.step(0.025)
        assert r is not None and r.duration_s == pytest.approx(first_step_s)
    busy = Engine(
        dataclasses.replace(SMALL, api_overhead_s=0.025, engine_family="vllm-v0.5", max_num_batched_tokens=4096, host_speed=1.0),
        FixedStep(),
    )
    busy.add_request("running", prompt(32), 50, 0.0)
    now = 0.0
    while now < 0.025 + 1e-9:  # up to and including the step that prefills it
        r = busy.step(now)
        assert r is not None
        now += r.duration_s
    busy.add_request("late", prompt(32, 999), 2, now)  # ready 25 ms from now
    durations = []
    while now < busy.timeline("late").arrival_s + 0.025 + 0.03:
        r = busy.step(now)
        assert r is not None
        durations.append((now, r.duration_s))
        now += r.duration_s
    charged = [d for t, d in durations if d > 0.01 + 1e-9]
    assert charged == [pytest.approx(0.01 + 0.0025)]  # once, in the step that admits it
    tl = busy.timeline("late")
    assert tl.scheduled_s is not None and tl.scheduled_s >= tl.arrival_s + 0.025 - 1e-9
    # a request aborted before the engine accepted it costs the engine nothing, even
    # when the engine sat idle in between
    gone = Engine(
        dataclasses.replace(SMALL, api_overhead_s=0.0, engine_family="vllm-v0.5", max_num_batched_tokens=4096, host_speed=1.0),
        FixedStep(),
    )
    for i in range(100):
        gone.add_request(str(i), prompt(32, 100 * i), 2, 0.0)
        gone.abort(str(i))
    assert not gone.has_work()
    gone.add_request("later", prompt(32, 7), 2, 50.0)
    r = gone.step(50.0)
    assert r is not None and r.duration_s == pytest.approx(0.01 + 0.0025)
    # offline (no API server) there is no intake
    offline = Engine(
        dataclasses.replace(SMALL, engine_family="vllm-v0.5", offline=True, api_overhead_s=0.0, host_speed=1.0), FixedStep()
    )
    offline.add_request("a", prompt(32), 2, 0.0)
    r = offline.step(0.0)
    assert r is not None and r.duration_s == pytest.approx(0.01)


def test_overlap_scheduling_sees_a_mid_step_arrival_one_step_later() -> None:
    """--overlap-schedule (SGLang's default): step k+1 is scheduled while step k runs, so a
    request that becomes ready during step k is first scheduled in step k+2; an idle
    engine schedules it as soon as it is ready."""

    def scheduled_at(overlap: bool, running: bool) -> float:
        engine = Engine(dataclasses.replace(SMALL, api_overhead_s=0.0, overlap_schedule=overlap), FixedStep())
        if running:
            engine.add_request("long", prompt(32), 100, 0.0)
        t = 0.0
        while t < 0.05 - 1e-9:  # five 10 ms steps (or one idle jump)
            r = engine.step(t) if engine.has_work() else None
            t = t + r.duration_s if r is not None else 0.05
        engine.add_request("new", prompt(32, 999), 2, 0.053)  # ready 3 ms into the step at 50 ms
        while engine.timeline("new").scheduled_s is None:
            r = engine.step(max(t, 0.0 if running else 0.053))
            assert r is not None
            t = max(t, 0.0 if running else 0.053) + r.duration_s
        s = engine.timeline("new").scheduled_s
        assert s is not None
        return s

    assert scheduled_at(False, running=True) == pytest.approx(0.06)  # the next step
    assert scheduled_at(True, running=True) == pytest.approx(0.07)  # one step later
    assert scheduled_at(True, running=False) == pytest.approx(0.053)  # idle: at once
    assert Engine(EngineConfig(engine_family="sglang")).config.overlap_schedule is True
    assert Engine(EngineConfig()).config.overlap_schedule is True  # vLLM's async scheduling (0.14 on)
    assert Engine(EngineConfig(engine_family="generic")).config.overlap_schedule is False


def test_token_times_recorded_for_requests_queued_before_recording_was_switched_on() -> None:
    engine = Engine(SMALL)
    engine.add_request("a", prompt(100), 5, 0.0)
    engine.record_token_times = True
    end, _ = drain(engine)
    tl = engine.timeline("a")
    assert len(tl.token_times_s) == 5 and tl.token_times_s[-1] == pytest.approx(end)
    assert tl.token_times_s[0] == tl.first_token_s and tl.output_tokens == 5


def test_sglang_admission_reserves_outputs_and_preempts_less() -> None:
    """A burst of long generations on a small cache: SGLang's admission (the sglang
    family's) runs three at a time, as many as the cache holds with their whole outputs
    (2,240 tokens, 600 each), and never preempts; admitting on the prompt alone (as vLLM)
    starts more and recomputes some."""
    base = EngineConfig(engine_family="sglang", max_model_len=2048, num_gpu_blocks_override=140, api_overhead_s=0.0)
    runs = {}
    for reserve in (None, True, False):
        engine = Engine(dataclasses.replace(base, reserve_outputs=reserve))
        for i in range(8):
            engine.add_request(f"r{i}", prompt(200, 1000 * i), 400, now_s=0.0)
        drain(engine)
        timelines = [engine.timeline(f"r{i}") for i in range(8)]
        assert all(t.output_tokens == 400 and t.finished_s is not None for t in timelines)
        runs[reserve] = (engine.preemptions_total, timelines)
    assert runs[None] == runs[True]  # (the family's default)
    preemptions, timelines = runs[True]
    first_done = min(t.finished_s or 0.0 for t in timelines)
    assert preemptions == 0
    assert sum((t.first_token_s or 0.0) < first_done for t in timelines) == 3
    preemptions, timelines = runs[False]
    first_done = min(t.finished_s or 0.0 for t in timelines)
    assert preemptions > 0 and sum((t.first_token_s or 0.0) < first_done for t in timelines) > 3
