"""The calibration-CSV harness: parsing rows into scenarios, the closed-loop driver, and a
golden bound on the simulator's median errors over a fast subset of published rows."""

import csv
import dataclasses
import itertools
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

import pytest

from inferlab.sim import Engine, EngineConfig
from inferlab.sim.validation.calibration import (
    _lengths,
    _number,
    _stat_for,
    distribution_cell,
    load_rows,
    parse_row,
    parse_rows,
)
from inferlab.sim.validation.engines import build_engine
from inferlab.sim.validation.scenario import Lengths, ScenarioError
from inferlab.sim.validation.validate import (
    Comparison,
    _gaps_s,
    _predict_or_reason,
    _run,
    _serve,
    _stat,
    distribution_medians,
    error_medians,
    length_mismatches,
    predict_scenario,
    source_interval,
    validate,
    validate_files,
    workload,
)

# the published measurements the README's accuracy numbers come from, in the repository
CSV = Path(__file__).parents[3] / "bench" / "data" / "calibration.csv"

# Rows that run in well under a second each and cover every family and scenario kind.
FAST_ROWS = [
    *("4", "10", "13", "16"),  # TRT-LLM offline, prefill-heavy
    *("46", "47", "48", "50", "51", "52", "54", "55", "58", "59"),  # vLLM V0 nightly
    *("60", "61", "62", "63", "64", "66", "70", "72", "74"),  # vLLM V0 batch 1
    *("114", "116", "118", "120", "123"),  # LMDeploy closed loop
    *("141", "142", "143", "145"),  # vLLM 0.5 burst
]

BASE_ROW = {
    "row_id": "x1",
    "engine": "vLLM",
    "engine_version": "0.9.2",
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "weight_precision": "bf16",
    "kv_cache_dtype": "auto",
    "gpu": "H100-SXM-80GB",
    "num_gpus": "1",
    "tp": "1",
    "scenario": "fixed concurrency",
    "batch_or_concurrency": "32",
    "num_requests": "320",
    "input_len": "512",
    "output_len": "256",
    "length_distribution": "fixed",
    "ttft_ms": "80",
    "metric_stat": "median",
}


def row(**changes: str) -> dict[str, str]:
    return {**BASE_ROW, **changes}


# --- parsing -------------------------------------------------------------------------------


def test_most_calibration_rows_are_expressed_and_every_skip_has_a_reason() -> None:
    rows = load_rows(CSV)
    scenarios, skipped = parse_rows(rows)
    assert len(scenarios) >= 60
    ids = {s.row_id for s in scenarios}
    assert {"1", "46", "58", "60", "114", "125", "141"} <= ids
    reasons = {s.row_id: s.reason for s in skipped}
    assert "69" in ids  # Qwen2.5-14B: a preset inferlab added
    assert "no preset" in reasons["100"]  # a laptop GPU
    assert "engine not stated" in reasons["95"]
    assert all(s.reason for s in skipped)
    kinds = {s.kind for s in scenarios}
    assert kinds == {"offline", "static", "poisson", "closed", "burst"}


def test_trtllm_fp8_row_maps_to_engine_and_workload() -> None:
    rows = {r["row_id"]: r for r in load_rows(CSV)}
    sc = parse_row(rows["1"])
    assert (sc.family, sc.model, sc.gpu, sc.tp) == ("trtllm", "Llama-3.1-8B", "H100-SXM-80GB", 1)
    assert (sc.quantization, sc.kv_cache_dtype) == ("fp8", "fp8")
    assert (sc.kind, sc.num_requests, sc.via_server) == ("offline", 30000, False)
    assert sc.input_len == Lengths("fixed", 128) and sc.output_len == Lengths("fixed", 128)
    assert [(m.metric, m.stat, m.value) for m in sc.measurements] == [
        ("output_tok_per_s", "aggregate", 28312.0)
    ]
    cfg = build_engine(sc, 256).config
    # trtllm-bench sizing: >1024 requests fit, so max_num_tokens is capped at 8192 for
    # ISL = OSL; the KV cache is 0.9 of the free memory, in fp8.
    assert cfg.max_num_batched_tokens == 8192 and cfg.max_num_seqs > 1024
    assert cfg.num_gpu_blocks_override is not None and cfg.api_overhead_s == 0.0
    assert cfg.quantization == "fp8" and cfg.kv_cache_dtype == "fp8"


def test_vllm_v0_serving_row_keeps_its_stated_flags_and_drops_chunk_itl() -> None:
    rows = {r["row_id"]: r for r in load_rows(CSV)}
    sc = parse_row(rows["141"])
    assert (sc.family, sc.kind, sc.num_requests, sc.via_server) == ("vllm-v0.5", "burst", 320, True)  # 0.5.4
    assert sc.input_len == Lengths("sharegpt", 204.9)
    assert sc.output_len.kind == "sharegpt"
    assert sc.output_len.a == pytest.approx(204.3 / (1 - 17 / 320))  # 17 empty requests
    cfg = build_engine(sc, 2048).config
    assert (cfg.max_num_seqs, cfg.enable_chunked_prefill) == (256, False)
    assert cfg.max_num_batched_tokens == 2048 and cfg.api_overhead_s > 0
    scenarios, skipped = parse_rows([rows["141"]])
    assert "itl_ms" not in {m.metric for m in scenarios[0].measurements}
    assert any(s.reason.startswith("itl_ms:") for s in skipped)


def test_a_pipeline_of_one_stage_runs_and_a_real_pipeline_or_speculation_is_refused() -> None:
    for flags in ("vllm serve m --tensor-parallel-size 2 --pipeline-parallel-size 1", "TP=2, PP=1",
                  "--pipeline_parallel_size=1 --seed 0"):
        assert parse_row(row(engine_config=flags)).tp == 1, flags
    for flags, reason in (("--pipeline-parallel-size 2", "pipeline"), ("--pipeline-parallel-size 16", "pipeline"),
                          ("pipeline parallel across nodes", "pipeline"), ("PP=4", "pipeline"),
                          ("--speculative-config '{\"method\": \"eagle\"}'", "speculative")):
        with pytest.raises(ScenarioError, match=reason):
            parse_row(row(engine_config=flags))


def test_vllm_versions_choose_v0_or_v1_scheduler_defaults() -> None:
    v1 = build_engine(parse_row(row()), 768).config
    assert (v1.max_num_seqs, v1.max_num_batched_tokens, v1.enable_chunked_prefill) == (
        1024,
        8192,
        True,
    )
    a100 = build_engine(parse_row(row(gpu="A100 80GB SXM")), 768).config
    assert (a100.max_num_seqs, a100.max_num_batched_tokens) == (256, 2048)
    v0 = parse_row(row(engine_version="0.6.3", model="Qwen2.5-7B-Instruct"))
    assert v0.family == "vllm-v0"
    # vLLM V0 chunks only past 32,768 tokens of context: Qwen2.5's 32K is not past it
    cfg = build_engine(v0, 768).config
    assert (cfg.enable_chunked_prefill, cfg.max_num_batched_tokens) == (False, 32768)
    long_ctx = build_engine(parse_row(row(engine_version="0.6.3", model="Llama-3.1-8B-Instruct")), 768)
    assert (long_ctx.config.enable_chunked_prefill, long_ctx.config.max_num_batched_tokens) == (True, 512)


def test_sglang_overlap_scheduling_follows_the_version_and_the_stated_flags() -> None:
    def overlap(**changes: str) -> bool | None:
        return build_engine(parse_row(row(engine="SGLang", **changes)), 768).config.overlap_schedule

    assert overlap(engine_version="0.4.1") is True  # the default since 0.4
    assert overlap(engine_version="0.3.0") is False  # opt-in before
    assert overlap(engine_version="0.4.1", engine_config="--disable-overlap-schedule") is False
    assert overlap(engine_version="0.3.6", engine_config="--enable-overlap-schedule") is True
    assert overlap(engine_version="0.4.1", engine_config="disable_overlap_schedule=false") is True
    assert overlap(engine_version="0.4.1", engine_config="async_scheduling=False") is False
    assert build_engine(parse_row(row()), 768).config.overlap_schedule is False  # vLLM 0.9


def test_vllm_async_scheduling_follows_the_release_and_the_stated_flags() -> None:
    def overlap(**changes: str) -> bool | None:
        return build_engine(parse_row(row(**changes)), 768).config.overlap_schedule

    assert overlap(engine_version="0.13.0") is False  # opt-in before 0.14
    assert overlap(engine_version="0.14.1") is True  # the default from 0.14
    assert overlap(engine_version="not stated") is True  # no release named: a current one
    assert overlap(engine_version="0.19.0", engine_config="vllm serve M --no-async-scheduling") is False
    assert overlap(engine_version="0.10.2", engine_config="async-scheduling: true") is True
    assert overlap(engine="TGI", engine_version="not stated") is False  # generic: not vLLM's scheduler


# vLLM V1 before 0.14, 0.19 and 0.24: sim run as a user of that release states it
_V1_BEFORE_0_19 = {"scheduler_reserve_full_isl": False, "evict_unhashed_first": False}
_V1_BEFORE_0_14 = {**_V1_BEFORE_0_19, "overlap_schedule": False}


@pytest.mark.parametrize(
    ("engine", "version", "flags"),
    [("vLLM", "0.9.2", _V1_BEFORE_0_14), ("vLLM", "0.13.0", _V1_BEFORE_0_14), ("vLLM", "0.18.1", _V1_BEFORE_0_19),
     ("vLLM", "0.23.0", {"evict_unhashed_first": False}), ("vLLM", "0.24.0", {}), ("vLLM", "0.32.0", {}), ("vLLM", "0.6.3", {}), ("vLLM", "0.5.4", {}), ("SGLang", "0.4.1", {}),
     ("LMDeploy", "0.2.0", {}), ("TGI", "2.0", {})],
)
def test_a_row_runs_on_the_engine_sim_run_builds_for_its_family(engine: str, version: str, flags: dict[str, bool]) -> None:
    """``inferlab sim run --engine-family F`` and the validation run the same rules: a row
    that states no flag (and whose harness adds none) gets exactly that engine, with
    the KV admission, free-queue order and scheduling of its release (vLLM V1's changed
    in 0.14, 0.19 and 0.24: ``sim run --no-async-scheduling --no-scheduler-reserve-full-isl
    --no-evict-unhashed-first``)."""
    sc = parse_row(row(engine=engine, engine_version=version))
    assert sc.via_server and sc.kind == "closed"
    sim_run = EngineConfig(model=sc.model, gpu=sc.gpu, engine_family=sc.family, **flags)
    # (the row records its release too: sim run --engine-version sets these same switches)
    assert dataclasses.replace(build_engine(sc, 768).config, engine_version=None) == Engine(sim_run).config


def test_harness_rules_come_on_top_of_the_familys() -> None:
    # LMDeploy's profiling scripts raise max_batch_size to the user count
    lmdeploy = parse_row(row(engine="LMDeploy", batch_or_concurrency="256", num_requests="2560"))
    assert build_engine(lmdeploy, 768).config.max_num_seqs == 256
    assert build_engine(parse_row(row(engine="LMDeploy")), 768).config.max_num_seqs == 128  # its default
    # TRT-LLM admits only what its KV cache holds to each output's limit: the engine's
    # admission, as sim run's, not a cap on the sequences by the row's mean lengths
    trt = build_engine(parse_row(row(engine="TensorRT-LLM")), 768)
    assert trt.limits.no_evict and trt.limits.max_num_seqs == 2048


@pytest.mark.parametrize(
    ("cell", "preset"),
    [
        ("H100 SXM5 80GB", "H100-SXM-80GB"),
        ("H100-80GB (form factor not stated)", "H100-SXM-80GB"),
        ("NVIDIA H100 PCIe 80GB", "H100-PCIe-80GB"),
        ("H100 NVL 94GB", "H100-NVL-94GB"),
        ("NVIDIA H20", "H20-96GB"),
        ("A100-SXM4-40GB", "A100-SXM-40GB"),
        ("A100 PCIe 80GB", "A100-PCIe-80GB"),
        ("A100-80GB (SXM/PCIe not stated)", "A100-SXM-80GB"),
        ("NVIDIA L4", "L4-24GB"),
        ("1x A10 24GB", "A10-24GB"),
        ("L40S", "L40S-48GB"),
        ("8x H100 SXM (NVLink 4.0)", "H100-SXM-80GB"),  # NVLink is not NVL
        ("H100 SXM (not PCIe)", "H100-SXM-80GB"),
        ("A100 80GB PCIe (not SXM)", "A100-PCIe-80GB"),
        ("8x A100 80GB (640GB total)", "A100-SXM-80GB"),  # 640GB is not 40GB
        ("A100 (40 GiB)", "A100-SXM-40GB"),
        ("H800 SXM", "H800-SXM-80GB"),
    ],
)
def test_gpu_cells_map_to_the_preset_of_that_exact_card(cell: str, preset: str) -> None:
    assert parse_row(row(gpu=cell)).gpu == preset


def test_an_engine_named_anywhere_in_the_cell_picks_its_family() -> None:
    nim = parse_row(row(engine="NVIDIA NIM (TensorRT-LLM backend assumed, not stated on page)"))
    assert nim.family == "trtllm"
    assert parse_row(row(engine="SGLang (version not stated)")).family == "sglang"
    assert parse_row(row(engine="Triton Inference Server (vLLM backend)")).family == "vllm"


def test_mixture_of_experts_rows_run_on_their_presets() -> None:
    assert parse_row(row(model="mistralai/Mixtral-8x7B-Instruct-v0.1", tp="2", num_gpus="2")).model == "Mixtral-8x7B"
    assert parse_row(row(model="Mixtral 8x22B (doc name)", tp="8", num_gpus="8")).model == "Mixtral-8x22B"
    assert parse_row(row(model="Qwen/Qwen3-30B-A3B")).model == "Qwen3-30B-A3B"


def test_a_distilled_dense_model_is_not_taken_for_its_moe_teacher() -> None:
    assert parse_row(row(model="deepseek-ai/DeepSeek-R1-Distill-Qwen-32B")).model == "Qwen2.5-32B-Instruct"
    with pytest.raises(ScenarioError, match="mixture-of-experts"):
        parse_row(row(model="deepseek-ai/DeepSeek-R1"))


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"model": "deepseek-ai/DeepSeek-V3"}, "mixture-of-experts"),  # latent attention
        ({"model": "openai/gpt-oss-120b"}, "mixture-of-experts"),
        ({"engine_config": "--tp-size 4 --ep-size 4"}, "expert-parallel"),
        ({"model": "tiiuae/falcon-40b-instruct"}, "no preset"),
        ({"gpu": "AMD MI300X"}, "GPU"),
        ({"gpu": "NVIDIA A10G (AWS)"}, "GPU"),
        ({"gpu": "GB200 NVL72"}, "Grace"),
        ({"engine_config": "EAGLE-3 speculative decoding, 3 draft tokens"}, "speculative"),
        ({"engine": "llama.cpp"}, "engine"),
        ({"engine": "not stated"}, "engine not stated"),
        ({"engine": ""}, "engine not stated"),
        ({"input_len": "", "length_distribution": "random"}, "input length"),
        ({"input_len": "unknown (prompts filtered to 5000-10000)"}, "not known"),
        ({"weight_precision": "nvfp4"}, "precision"),
        ({"num_gpus": "8"}, "num_gpus"),
        ({"ttft_ms": ""}, "no measured metric"),
        ({"scenario": "static batch", "batch_or_concurrency": ""}, "batch size"),
    ],
)
def test_unexpressible_rows_raise_with_the_reason(changes: dict[str, str], reason: str) -> None:
    with pytest.raises(ScenarioError, match=reason):
        parse_row(row(**changes))
    _, skipped = parse_rows([row(**changes)])
    assert len(skipped) == 1 and reason in skipped[0].reason


def test_speculation_mentioned_as_disabled_is_not_a_reason_to_skip() -> None:
    assert parse_row(row(engine_config="defaults; no speculative decoding")).kind == "closed"


def test_odd_cells_parse() -> None:
    assert _number("inf (all requests queued; CUDA-graph batch sizes up to 8192)") is None
    assert _number("all at once (320)") is None
    assert _number("1,234.5 mean (derived)") == 1234.5
    assert _number(" ") is None and _number("n/a") is None
    sc = parse_row(row(scenario="burst", batch_or_concurrency="all at once (40)", num_requests=""))
    assert (sc.kind, sc.num_requests) == ("burst", 40)
    assert _lengths("U[100,1024]", "uniform", "input")[0] == Lengths("uniform", 100, 1024)
    spec, note = _lengths("", "ShareGPT V3 sample (~mean 200-250 in / ~180-250 out)", "output")
    assert spec == Lengths("sharegpt", 215.0) and note is not None
    assert _lengths("204.9 mean", "ShareGPT V3 (fixed seed)", "input")[0].kind == "sharegpt"
    assert _lengths("128", "fixed (token-norm-dist, stdev 0)", "input")[0] == Lengths("fixed", 128)
    # a measured mean of lengths drawn from a stated range: the range, not ShareGPT's
    # shape, keeping the mean measured
    ranged = "sglang.bench_serving random, random_range_ratio 0.0 (lengths uniform in [1,1024])"
    assert _lengths("508.7 mean", ranged, "input")[0] == Lengths("uniform", 1, 1024, measured=508.7)
    # ... unless the mean is not the range's middle (then the range was not what was
    # drawn), or the cell states a length of its own rather than a mean
    assert _lengths("220 mean", "ShareGPT; lengths uniform in [1,1024]", "input")[0].kind == "sharegpt"
    assert _lengths("500", "input lengths uniform in [1,1024]; output fixed", "output")[0] == Lengths("fixed", 500)
    # a burst that names no concurrency limit is a burst
    no_cap = parse_row(row(scenario="burst (all requests at t=0)", batch_or_concurrency="500 (no max-concurrency)",
                           num_requests="500", request_rate_rps="inf"))
    assert (no_cap.kind, no_cap.num_requests) == ("burst", 500)


def test_statistic_per_metric() -> None:
    text = "TTFT = mean first-token latency; ITL = p50 per-token latency"
    assert _stat_for("ttft_ms", text) == "mean"
    assert _stat_for("itl_ms", text) == "median"
    assert _stat_for("tpot_ms", "median of 5 runs") == "median"
    assert _stat_for("e2e_latency_ms", "mean (medians in notes)") == "mean"
    assert _stat_for("ttft_ms", "p99") == "p99"
    assert _stat_for("ttft_ms", "single run") == "mean"


def test_sharegpt_workload_is_deterministic_with_the_stated_mean_and_caps() -> None:
    sc = parse_row(
        row(input_len="220 mean", output_len="200 mean", length_distribution="ShareGPT V3")
    )
    jobs = workload(sc)
    assert jobs == workload(sc)
    assert statistics.fmean(i for i, _ in jobs) == pytest.approx(220, rel=0.01)
    assert statistics.fmean(o for _, o in jobs) == pytest.approx(200, rel=0.01)
    assert all(1 <= i <= 1024 and o >= 1 and i + o <= 2048 for i, o in jobs)
    assert max(o for _, o in jobs) > 3 * 200  # a long tail, not fixed lengths


def test_a_uniform_range_runs_with_the_mean_its_source_measured() -> None:
    sc = parse_row(row(
        input_len="540 mean", output_len="480 mean", num_requests="300",
        length_distribution="random, random_range_ratio 0.0 (lengths uniform in [1,1024])",
    ))
    jobs = workload(sc)
    assert statistics.fmean(i for i, _ in jobs) == pytest.approx(540, rel=0.005)
    assert statistics.fmean(o for _, o in jobs) == pytest.approx(480, rel=0.005)
    assert all(1 <= i <= 1024 and 1 <= o <= 1024 for i, o in jobs)
    assert len({i for i, _ in jobs}) > 200  # drawn from the range, not one length


def test_empty_requests_are_the_stated_share_and_the_rest_keep_the_stated_mean() -> None:
    # the source counted 78 of 320 requests with no text; its mean output over the
    # others is what the row's mean becomes
    sc = parse_row(row(
        input_len="204.9 mean", output_len="176.7 mean (measured)", num_requests="320",
        length_distribution="ShareGPT V3", notes="requests with 0 generated tokens (...): 78/320",
    ))
    outs = [o for _, o in workload(sc)]
    empty = [k for k, o in enumerate(outs) if o == 1]
    assert len(empty) == 78
    counted = [0 if k in empty else o for k, o in enumerate(outs)]  # as the source counts them
    assert statistics.fmean(counted) == pytest.approx(176.7, rel=2e-3)
    # the same with a uniform range and a measured mean, and with a count the share
    # does not divide (3 of 13 requests for 78/320 = 24 %)
    ranged = parse_row(row(
        input_len="512", output_len="500 mean", num_requests="13",
        length_distribution="random (lengths uniform in [1,1024])",
        notes="requests with 0 generated tokens (...): 78/320",
    ))
    outs = [o for _, o in workload(ranged)]
    assert sum(1 for o in outs if o == 1) == 3
    assert statistics.fmean(0 if o == 1 else o for o in outs) == pytest.approx(500, rel=2e-3)
    assert ranged.output_len.mean == pytest.approx(500 / (1 - 78 / 320))  # what sizing sees


def test_sharegpt_workload_keeps_a_long_mean_that_the_prompt_cap_cuts() -> None:
    # scaled to a mean of 600, ShareGPT's long prompts pass the 1,024-token cap; the
    # others scale up further so that the run still has the mean the source measured
    sc = parse_row(
        row(input_len="600 mean", output_len="200 mean", length_distribution="ShareGPT V3")
    )
    ins = [i for i, _ in workload(sc)]
    assert sum(1 for i in ins if i == 1024) > len(ins) // 20  # the cap binds
    assert statistics.fmean(ins) == pytest.approx(600, rel=0.01)


# --- the closed-loop driver ------------------------------------------------------------------


class FixedStep:
    """Every step takes 10 ms."""

    def step_time_s(self, seqs: Sequence[tuple[int, int]], emitting: int) -> float:
        return 0.01


def test_closed_loop_keeps_each_user_busy_with_one_request() -> None:
    engine = Engine(  # (an infinitely fast host: no front-end CPU)
        EngineConfig(max_model_len=512, api_overhead_s=0.0, host_speed=math.inf), FixedStep(), record_token_times=True
    )
    jobs = [(32, 5)] * 7
    timelines = _serve(engine, jobs, None, users=3)
    gaps = _gaps_s(timelines)
    arrivals = sorted(t.arrival_s for t in timelines)
    finishes = sorted(t.finished_s or 0.0 for t in timelines)
    assert arrivals[:3] == [0.0, 0.0, 0.0]
    assert arrivals[3:] == pytest.approx(finishes[:4])  # each next request: on a completion
    for t in timelines:  # never more than 3 requests in flight
        in_flight = sum(1 for u in timelines if u.arrival_s <= t.arrival_s < (u.finished_s or 0))
        assert in_flight <= 3
    assert len(gaps) == 7 * 4 and gaps == pytest.approx([0.01] * 28)


def test_open_loop_requests_arrive_on_schedule() -> None:
    engine = Engine(EngineConfig(max_model_len=512, api_overhead_s=0.0, host_speed=math.inf), FixedStep())
    timelines = _serve(engine, [(16, 2)] * 3, [0.0, 1.0, 2.5], users=1)
    assert [t.arrival_s for t in timelines] == [0.0, 1.0, 2.5]
    assert [t.first_token_s for t in timelines] == pytest.approx([0.01, 1.01, 2.51])


def test_prompts_share_no_prefix_but_a_preempted_request_finds_its_own_blocks() -> None:
    # prefix caching as the family has it (vLLM V1: on), as `sim run` runs it; the
    # harness's prompts share no cached block
    engine = Engine(EngineConfig(max_model_len=512, api_overhead_s=0.0), FixedStep())
    _serve(engine, [(256, 2)] * 4, [0.0, 0.0, 1.0, 1.0], users=1)
    assert engine.prefix_queries_tokens == 4 * 256 and engine.prefix_hits_tokens == 0
    # two requests of 64 + 150 tokens (14 blocks of 16 each) in 24 blocks: the second is
    # preempted, and when it runs again it finds its own blocks instead of computing them
    cached = Engine(EngineConfig(max_model_len=256, api_overhead_s=0.0, num_gpu_blocks_override=24), FixedStep())
    _serve(cached, [(64, 150)] * 2, [0.0] * 2, users=1)
    assert cached.preemptions_total > 0 and cached.preempted_hits_tokens >= 64
    flags = parse_row(row(engine_config="python -m sglang.launch_server --disable-radix-cache")).engine_flags
    assert ("enable_prefix_caching", 0.0) in flags
    assert ("enable_prefix_caching", 1.0) in parse_row(row(engine_config="--enable-prefix-caching")).engine_flags
    # the harness runs the engine as `sim run` does: the family's default unless stated
    assert build_engine(parse_row(row()), 1000).config.enable_prefix_caching is True
    off = parse_row(row(engine_config="vllm serve M --no-enable-prefix-caching"))
    assert build_engine(off, 1000).config.enable_prefix_caching is False


# --- golden ---------------------------------------------------------------------------------


def test_median_errors_on_a_fast_subset_stay_within_regression_bounds() -> None:
    report = validate(CSV, FAST_ROWS)
    assert len({c.scenario.row_id for c in report.comparisons}) >= 30
    medians = {cls: med for cls, (med, _, _) in error_medians(report.comparisons).items()}
    # Measured on this subset when written: throughput ~7%, TPOT/ITL ~10%, TTFT ~35%,
    # E2E ~9%. The bounds catch regressions, not noise (the run is deterministic).
    assert medians["throughput"] < 25
    assert medians["TPOT/ITL"] < 30
    assert medians["TTFT"] < 60
    assert medians["E2E"] < 30


def test_other_files_in_the_same_format_validate(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    rows = [
        row(),
        row(row_id="x2", model="Mixtral-8x7B"),
        row(row_id="x3", scenario="poisson", request_rate_rps="2", batch_or_concurrency=""),
    ]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*BASE_ROW, "request_rate_rps"])
        writer.writeheader()
        writer.writerows(rows)
    report = validate(path)
    assert {c.scenario.row_id for c in report.comparisons} == {"x1", "x3"}
    assert [s.row_id for s in report.skipped] == ["x2"]
    assert all(c.predicted > 0 for c in report.comparisons)


def test_a_stated_context_beyond_the_models_is_skipped_with_that_reason(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    long = row(row_id="y1", model="Qwen/Qwen2.5-7B-Instruct", engine_config="vllm serve M --max-model-len 65536",
               input_len="60000", output_len="100")
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(long))
        w.writeheader()
        w.writerow(long)
    report = validate(path)
    assert [s.row_id for s in report.skipped] == ["y1"]
    assert "--max-model-len 65536 is beyond" in report.skipped[0].reason and "YaRN" in report.skipped[0].reason


def test_rows_whose_throughputs_disagree_are_flagged_as_running_other_lengths() -> None:
    sc = parse_row(row())
    # one run: output tok/s 11 % low but req/s 7 % low -> 4 % fewer output tokens per request
    off = [Comparison(sc, "output_tok_per_s", "aggregate", 100.0, 89.0),
           Comparison(sc, "req_per_s", "aggregate", 10.0, 9.3),
           Comparison(sc, "total_tok_per_s", "aggregate", 200.0, 178.0)]
    assert length_mismatches(off) == {sc.row_id: "output tokens per request -4.3%"}
    agree = [Comparison(sc, "output_tok_per_s", "aggregate", 100.0, 92.8),
             Comparison(sc, "req_per_s", "aggregate", 10.0, 9.3)]
    assert length_mismatches(agree) == {}


def test_percentiles_interpolate_like_the_sources_numpy() -> None:
    # vLLM's and SGLang's benchmark clients report np.median / np.percentile: a median of
    # two equal halves (lockstep users prefilled in two steps) is their midpoint
    assert _stat([74.0] * 8 + [103.0] * 8, "median") == pytest.approx(88.5)
    assert _stat([1.0, 2.0, 3.0, 4.0, 10.0], "p90") == pytest.approx(7.6)  # numpy's value
    assert _stat([74.0, 103.0], "median", [8.0, 8.0]) == pytest.approx(88.5)
    assert _stat([5.0], "p99", [3.5]) == 5.0


def test_weighted_statistics_count_each_value_its_weight_in_times() -> None:
    """A steady-state request standing for k of the row's requests counts k times: the
    weighted mean and percentiles equal those of the list with each value repeated."""
    import random

    rng = random.Random(7)
    for _ in range(50):
        values = [rng.uniform(0, 100) for _ in range(rng.randint(1, 30))]
        weights = [rng.randint(1, 5) for _ in values]
        expanded = [v for v, w in zip(values, weights, strict=True) for _ in range(w)]
        for stat in ("mean", "median", "p90", "p99"):
            assert _stat(values, stat, [float(w) for w in weights]) == pytest.approx(_stat(expanded, stat)), stat


# --- the split by source ---------------------------------------------------------------------

DATA = CSV.parent


def test_every_row_names_its_source_and_every_source_is_on_one_side_of_the_split() -> None:
    sides: dict[str, set[str]] = {}
    for path in sorted(DATA.glob("*.csv")):
        for r in load_rows(path):
            assert r["source_id"].strip(), f"{path.name} row {r['row_id']}: no source_id"
            assert r["split"] in ("fit", "holdout"), f"{path.name} row {r['row_id']}: split {r['split']!r}"
            sides.setdefault(r["source_id"], set()).add(r["split"])
    assert all(len(s) == 1 for s in sides.values()), {k: s for k, s in sides.items() if len(s) > 1}
    # the reference set, which every constant has seen, is all in the fit set
    assert {r["split"] for r in load_rows(CSV)} == {"fit"}
    assert "holdout" in {s for v in sides.values() for s in v}


def test_rows_gathered_after_the_split_are_held_out_and_row_ids_are_unique_across_files() -> None:
    # a source added after the split goes in as holdout (docs/validation.md, rule 3)
    held_out = (
        "published_v1.csv",
        "published_inferencemax.csv",
        "published_v1_more.csv",
        "published_threads.csv",
    )
    for name in held_out:
        assert {r["split"] for r in load_rows(DATA / name)} == {"holdout"}, name
    ids = [r["row_id"] for path in sorted(DATA.glob("*.csv")) for r in load_rows(path)]
    assert len(ids) == len(set(ids)), sorted(i for i in set(ids) if ids.count(i) > 1)


def test_a_row_carries_its_split_and_regime_and_an_unknown_split_is_refused() -> None:
    sc = parse_row(row(split="holdout", source_id="someone"))
    assert (sc.split, sc.source_id, sc.regime) == ("holdout", "someone", "closed loop")
    assert parse_row(row()).split == "fit"  # a row without the column: the fit set
    assert parse_row(row(scenario="burst", batch_or_concurrency="", request_rate_rps="inf")).regime == "saturated"
    assert parse_row(row(scenario="poisson", request_rate_rps="2", batch_or_concurrency="")).regime == "Poisson"
    # vLLM's --burstiness 1.0 is Poisson arrivals, not a burst (a row that said so ran as one)
    assert parse_row(row(scenario="request rate 2 (burstiness 1.0)", request_rate_rps="2",
                         batch_or_concurrency="")).regime == "Poisson"
    with pytest.raises(ScenarioError, match="split 'test'"):
        parse_row(row(split="test"))


def test_several_files_validate_together_and_in_processes_alike(tmp_path: Path) -> None:
    paths = []
    for name, rid in (("a.csv", "x1"), ("b.csv", "x3")):
        path = tmp_path / name
        r = row(row_id=rid) if rid == "x1" else row(row_id=rid, scenario="poisson", request_rate_rps="2", batch_or_concurrency="")
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=[*BASE_ROW, "request_rate_rps"])
            w.writeheader()
            w.writerow(r)
        paths.append(path)
    one = validate_files(paths)
    two = validate_files(paths, jobs=2)
    assert [(c.scenario.row_id, c.predicted) for c in one.comparisons] == [
        (c.scenario.row_id, c.predicted) for c in two.comparisons
    ]
    assert {c.scenario.row_id for c in one.comparisons} == {"x1", "x3"}


# --- prompts that share prefixes (the prefix_sharing column) ---------------------------------


def test_prefix_sharing_is_stated_in_its_column_and_unstated_sharing_is_skipped() -> None:
    from inferlab.sim.validation.calibration import prompt_sharing
    from inferlab.sim.validation.scenario import PromptSharing

    assert prompt_sharing("") is None
    assert prompt_sharing("prefix=1000 groups=8") == PromptSharing(1000, 8, 1)
    assert prompt_sharing("turns=5; prefix=200") == PromptSharing(200, 1, 5)
    for bad in ("prefix=abc", "share=0.5", "prefix=0", "groups=0 prefix=10"):
        with pytest.raises(ScenarioError, match="prefix_sharing"):
            prompt_sharing(bad)
    with pytest.raises(ScenarioError, match="not shorter"):
        parse_row(row(prefix_sharing="prefix=512"))
    sc = parse_row(row(prefix_sharing="prefix=400 groups=4"))
    assert sc.sharing == PromptSharing(400, 4, 1) and any("shared prefixes" in a for a in sc.assumptions)
    _, skipped = parse_rows([row(scenario="fixed concurrency, shared-prefix workload")])
    assert "prefix_sharing column" in skipped[0].reason


def test_shared_prefixes_and_turns_build_prompts_that_share_what_they_say() -> None:
    from inferlab.sim.validation.scenario import PromptSharing
    from inferlab.sim.validation.validate import prompts

    jobs = [(100, 4)] * 6
    alone = prompts(jobs)
    assert len({p[0] for p in alone}) == 6 and all(len(p) == 100 for p in alone)
    grouped = prompts(jobs, PromptSharing(60, 2, 1))
    assert all(len(p) == 100 for p in grouped)
    assert grouped[0][:60] == grouped[2][:60] != grouped[1][:60]  # requests 0, 2, 4 share one
    assert grouped[0][60] != grouped[2][60]  # and part ways after it
    chats = prompts([(50, 4), (80, 4), (120, 4), (50, 4)], PromptSharing(0, 1, 3))
    assert chats[1][:50] == chats[0] and chats[2][:80] == chats[1]  # each turn holds the last
    assert chats[3][0] != chats[0][0]  # the next conversation starts afresh


def test_a_shared_system_prompt_lowers_ttft_through_the_prefix_cache() -> None:
    """Same lengths, same load: with 3,000 of 3,200 prompt tokens shared, each prefill
    is mostly cache hits and TTFT drops; without prefix caching it does not."""
    base = row(batch_or_concurrency="16", num_requests="64", input_len="3200", output_len="64")
    plain = predict_scenario(parse_row(base))[0]["ttft_ms"]
    shared = predict_scenario(parse_row({**base, "prefix_sharing": "prefix=3000 groups=1"}))[0]["ttft_ms"]
    uncached = predict_scenario(parse_row({
        **base, "prefix_sharing": "prefix=3000 groups=1", "engine_config": "--no-enable-prefix-caching",
    }))[0]["ttft_ms"]
    assert shared < 0.7 * plain
    assert uncached == pytest.approx(plain, rel=0.02)


def test_a_rerun_is_stated_in_the_sharing_column_and_refused_where_no_server_keeps_a_cache() -> None:
    from inferlab.sim.validation.calibration import prompt_sharing
    from inferlab.sim.validation.scenario import PromptSharing

    assert prompt_sharing("rerun=2") == PromptSharing(0, 1, 1, 2)
    assert prompt_sharing("prefix=100 rerun=1") == PromptSharing(100, 1, 1, 1)
    for bad in ("rerun=0", "rerun=1 rerun=2", "rerun", "rerun=yes"):
        with pytest.raises(ScenarioError, match="prefix_sharing"):
            prompt_sharing(bad)
    sc = parse_row(row(prefix_sharing="rerun=1"))
    assert any("sent once before" in a for a in sc.assumptions)
    with pytest.raises(ScenarioError, match="rerun"):
        parse_row(row(scenario="offline", batch_or_concurrency="", prefix_sharing="rerun=1"))


def test_a_rerun_finds_its_prompts_in_the_cache_and_only_its_own_pass_is_measured() -> None:
    """The same prompts sent once before on one engine: the measured pass's prompts are
    mostly cache hits, its TTFT drops, its timelines are its own (they start after the
    first pass ended) and its duration is its own pass's (its throughput at least the
    cold run's, not diluted by the pass before)."""
    base = row(batch_or_concurrency="8", num_requests="64", input_len="2048", output_len="64", req_per_s="5")
    cold, warm = parse_row(base), parse_row({**base, "prefix_sharing": "rerun=1"})
    run = _run(warm)
    assert all(t.cached_tokens >= 2048 - 16 for t in run.timelines)
    assert min(t.arrival_s for t in run.timelines) > max(t.finished_s or 0 for t in _run(cold).timelines) / 2
    assert all(t.cached_tokens == 0 for t in _run(cold).timelines)
    hot, plain = predict_scenario(warm)[0], predict_scenario(cold)[0]
    assert hot["ttft_ms"] < 0.5 * plain["ttft_ms"]
    assert plain["req_per_s"] <= hot["req_per_s"] < 3 * plain["req_per_s"]


def test_an_open_loop_rerun_runs_its_passes_in_turn_and_a_rerun_without_a_cache_is_refused() -> None:
    """Poisson arrivals at a low rate, the engine idle between requests: both passes run
    to the end (each at its own arrival times, the second after the first), and the
    measured pass hits the cache. Where the engine caches no prefixes a rerun would
    change nothing, and the row is refused rather than run as if it did."""
    import signal

    def hung(*_: object) -> None:
        raise TimeoutError("the rerun's passes never ended")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    try:
        base = row(scenario="poisson", batch_or_concurrency="", request_rate_rps="0.1", num_requests="20",
                   input_len="2048", output_len="16", prefix_sharing="rerun=1")
        run = _run(parse_row(base))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert len(run.timelines) == 20 and all(t.cached_tokens >= 2048 - 16 for t in run.timelines)
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(run.timelines)]
    assert min(t.arrival_s for t in run.timelines) > 20 and statistics.fmean(gaps) > 5  # ~10 s apart
    off = row(batch_or_concurrency="8", num_requests="64", prefix_sharing="rerun=1",
              engine_config="--no-enable-prefix-caching")
    with pytest.raises(ScenarioError, match="caches no prefixes"):
        predict_scenario(parse_row(off))
    assert "caches no prefixes" in str(_predict_or_reason(parse_row(off)))  # validation skips it, saying why


def test_validate_sim_set_changes_one_constant_of_one_family_for_a_sensitivity_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``validate_sim.py --set FAMILY.NAME=VALUE`` changes that constant of that family
    only, refuses what it cannot read, and never writes error bands from changed constants."""
    import runpy

    from inferlab.sim.engine import families
    from inferlab.sim.engine.families import EngineFamily

    script = runpy.run_path(str(Path(__file__).resolve().parents[3] / "bench" / "validate_sim.py"))
    monkeypatch.setattr(families, "FAMILY_RULES", dict(families.FAMILY_RULES))
    before = dict(families.FAMILY_RULES)
    shipped = before[EngineFamily.VLLM].efficiencies
    script["apply_overrides"](["vllm.api_per_seq_s=15e-6"])
    changed = families.FAMILY_RULES[EngineFamily.VLLM].efficiencies
    assert changed.api_per_seq_s == 15e-6 != shipped.api_per_seq_s
    assert changed.cpu_step_s == shipped.cpu_step_s
    assert all(families.FAMILY_RULES[f] is before[f] for f in before if f != EngineFamily.VLLM)
    for bad in ("vllm.no_such_constant=1", "no-such-engine.api_per_seq_s=1", "vllm.api_per_seq_s", "vllm.cpu_step_s=fast"):
        with pytest.raises(ValueError):
            script["apply_overrides"]([bad])
    assert script["main"](["--all", "--write-bands", "--set", "vllm.api_per_seq_s=1e-6"]) == 2
    # ``all.``: that constant of every family, nothing else of theirs
    script["apply_overrides"](["all.attention_compute=0.4"])
    for f, rules in families.FAMILY_RULES.items():
        assert rules.efficiencies.attention_compute == 0.4 != before[f].efficiencies.attention_compute
        assert rules.efficiencies.gemm_compute == before[f].efficiencies.gemm_compute


def test_fit_gpu_stream_runs_fit_rows_of_that_gpu_only_and_its_rule_prefers_the_least_change() -> None:
    """bench/fit_gpu_stream.py: the rows it fits on are `fit` rows of the named card and
    no other (held-out rows never run); of factors within 0.2 of the best it takes the
    one closest to 1.0; bad arguments are usage errors."""
    import runpy

    from inferlab.sim.validation.calibration import load_rows

    script = runpy.run_path(str(Path(__file__).resolve().parents[3] / "bench" / "fit_gpu_stream.py"))
    ids = script["fit_rows"]("H200-SXM-141GB")
    rows = {r["row_id"]: r for path in sorted(CSV.parent.glob("*.csv")) for r in load_rows(path)}
    assert ids and all(rows[i]["split"] == "fit" and "H200" in rows[i]["gpu"] for i in ids)
    held_h200 = [i for i, r in rows.items() if r["split"] == "holdout" and "H200" in r["gpu"]]
    assert held_h200 and not set(held_h200) & set(ids)
    choose = script["choose"]
    assert choose({0.90: 6.92, 0.92: 6.68, 0.94: 7.12}) == 0.92  # 0.90 is 0.24 away
    assert choose({0.90: 6.70, 0.92: 6.68, 0.94: 6.85}) == 0.94  # all within 0.2: the least change
    assert choose({0.98: 8.0, 1.0: 8.1, 1.02: 8.0}) == 1.0
    assert script["main"](["--gpu", "no-such-gpu"]) == 2
    assert script["main"](["--grid", "fast"]) == 2
    assert script["main"](["--grid", "3"]) == 2



def test_fit_gemm_runs_every_familys_fit_rows_and_no_held_out_one_and_its_rule_prefers_the_least_change() -> None:
    """bench/fit_gemm.py: every `fit` row of every family (offline ones too), never a
    held-out one; of values within 0.2 of the best it takes the one closest to 0.70, the
    literature's middle; the host objective counts a host once however many rows it has;
    bad grids are usage errors."""
    import runpy

    from inferlab.sim.engine.families import EngineFamily
    from inferlab.sim.validation.calibration import load_rows, parse_rows
    from inferlab.sim.validation.scenario import OFFLINE

    script = runpy.run_path(str(Path(__file__).resolve().parents[3] / "bench" / "fit_gemm.py"))
    ids = script["fit_rows"]()
    rows = [r for path in sorted(CSV.parent.glob("*.csv")) for r in load_rows(path)]
    scenarios = {sc.row_id: sc for sc in parse_rows(rows)[0]}
    assert ids and all(scenarios[i].split == "fit" for i in ids)
    held = {i for i, sc in scenarios.items() if sc.split == "holdout"}
    assert held and not held & set(ids)
    fit = {i for i, sc in scenarios.items() if sc.split == "fit"}
    assert set(ids) == fit  # every one, offline rows and every family's
    assert {scenarios[i].family for i in ids} >= {EngineFamily.VLLM, EngineFamily.SGLANG, EngineFamily.TRTLLM}
    assert any(scenarios[i].regime == OFFLINE for i in ids)
    choose = script["choose"]
    assert choose({0.55: 11.2, 0.60: 10.9, 0.65: 11.2, 0.70: 11.3}) == 0.60  # the others are 0.3 away
    assert choose({0.60: 10.9, 0.65: 11.0, 0.70: 11.05}) == 0.70  # all within 0.2: the least change
    assert choose({0.75: 10.0, 0.80: 10.1}) == 0.75
    # one host of 3 rows and one of 1: over rows the 3 rows decide, over hosts each host is one
    errors = {("a", "H100"): {"TTFT": {"1": 10.0, "2": 10.0, "3": 10.0}}, ("b", "A100"): {"TTFT": {"4": 50.0}}}
    assert script["objective"](errors, list(errors)) == 10.0
    assert script["host_objective"](errors) == 30.0
    assert script["objective"](errors, [("b", "A100"), ("b", "A100")]) == 50.0
    for bad in (["--grid", "fast"], ["--grid", "0.1"], ["--grid", "1.5"]):
        assert script["main"](bad) == 2


def test_fit_front_end_runs_the_named_familys_served_fit_rows_only() -> None:
    """bench/fit_front_end.py --family sglang fits on SGLang's `fit` rows that go through an
    API server: never a held-out row, another family's, or an offline one; vLLM V1's
    rows stay the default; an unknown family is a usage error."""
    import runpy

    from inferlab.sim.engine.families import EngineFamily
    from inferlab.sim.validation.calibration import load_rows, parse_rows
    from inferlab.sim.validation.scenario import OFFLINE

    script = runpy.run_path(str(Path(__file__).resolve().parents[3] / "bench" / "fit_front_end.py"))
    rows = [r for path in sorted(CSV.parent.glob("*.csv")) for r in load_rows(path)]
    scenarios = {sc.row_id: sc for sc in parse_rows(rows)[0]}
    sglang = script["fit_rows"](EngineFamily.SGLANG)
    assert sglang and all(
        scenarios[i].split == "fit" and scenarios[i].family == EngineFamily.SGLANG and scenarios[i].regime != OFFLINE
        for i in sglang
    )
    held = {i for i, sc in scenarios.items() if sc.family == EngineFamily.SGLANG and sc.split == "holdout"}
    assert held and not held & set(sglang)
    vllm = script["fit_rows"]()
    assert vllm and not set(vllm) & set(sglang)
    assert all(scenarios[i].family == EngineFamily.VLLM and scenarios[i].split == "fit" for i in vllm)
    # an offline row of the family is left out (vLLM V0's fit rows have both)
    v0 = [sc for sc in scenarios.values() if sc.family == EngineFamily.VLLM_V0 and sc.split == "fit"]
    assert {sc.regime == OFFLINE for sc in v0} == {True, False}
    assert set(script["fit_rows"](EngineFamily.VLLM_V0)) == {sc.row_id for sc in v0 if sc.regime != OFFLINE}
    with pytest.raises(SystemExit) as e:
        script["main"](["--family", "tgi"])
    assert e.value.code == 2

# --- distributions: the other statistics of a row's run ------------------------------------


def test_a_distribution_cell_reads_stats_per_metric_and_refuses_what_it_cannot_compare() -> None:
    spread = parse_row(row(metric_stat="mean", distribution="ttft_ms p50=70 p99=250; tpot_ms mean=9.5 p90=11")).distribution
    assert [(m.metric, m.stat, m.value) for m in spread] == [
        ("ttft_ms", "median", 70.0), ("ttft_ms", "p99", 250.0), ("tpot_ms", "mean", 9.5), ("tpot_ms", "p90", 11.0),
    ]
    assert parse_row(row()).distribution == ()
    for cell, reason in (
        ("ttft_ms median=80", "given twice"),  # the row's own TTFT column is its median
        ("ttft_ms p99=250 p99=260", "given twice"),
        ("tokens p99=3", "expected one of"),
        ("ttft_ms", "expected one of"),
        ("ttft_ms p99:250", "not STAT=VALUE"),
        ("ttft_ms p99=0", "not STAT=VALUE"),
        ("ttft_ms max=900", "not STAT=VALUE"),
    ):
        with pytest.raises(ScenarioError, match=reason):
            parse_row(row(distribution=cell))
    with pytest.raises(ScenarioError, match="no per-request latencies"):
        distribution_cell("ttft_ms p99=250", "static")


def test_distribution_statistics_come_from_the_same_run_and_stay_out_of_the_headline(tmp_path: Path) -> None:
    """A closed loop of 32 users who start at once: their prefills queue behind each
    other, so the simulated TTFT p99 is well above the median; the headline is the same
    with or without the cell, and an ITL the row may not compare is left out of both."""
    plain = row(row_id="d1", ttft_ms="80", metric_stat="mean", itl_ms="12")
    spread = {**plain, "row_id": "d2", "distribution": "ttft_ms median=70 p99=900; itl_ms p99=40"}
    chunked = {**spread, "row_id": "d3", "notes": "stream chunks carry several tokens"}
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(chunked))
        writer.writeheader()
        writer.writerows([{**plain, "distribution": "", "notes": ""}, {**spread, "notes": ""}, chunked])
    report = validate(path)
    by_row = {(c.scenario.row_id, c.metric, c.stat): c.predicted for c in report.distribution}
    assert set(by_row) == {("d2", "ttft_ms", "median"), ("d2", "ttft_ms", "p99"), ("d2", "itl_ms", "p99"),
                           ("d3", "ttft_ms", "median"), ("d3", "ttft_ms", "p99")}
    assert by_row["d2", "ttft_ms", "p99"] > 1.3 * by_row["d2", "ttft_ms", "median"]
    headline = {(c.scenario.row_id, c.metric): c.predicted for c in report.comparisons}
    assert headline["d1", "ttft_ms"] == headline["d2", "ttft_ms"] == headline["d3", "ttft_ms"]
    assert ("d3", "itl_ms") not in headline
    assert [s.reason.split(":")[0] for s in report.skipped] == ["itl_ms"]  # said once, for d3
    # the tail of the same run lies above its typical request and its mean (in lockstep
    # waves the mean may fall on either side of the median)
    assert max(by_row["d2", "ttft_ms", "median"], headline["d2", "ttft_ms"]) < by_row["d2", "ttft_ms", "p99"]


def test_distribution_medians_are_per_metric_and_statistic_with_their_sign() -> None:
    sc = parse_row(row())
    comps = [Comparison(sc, "ttft_ms", "p99", 100.0, p) for p in (110.0, 80.0, 130.0)]
    comps += [Comparison(sc, "ttft_ms", "median", 50.0, 45.0), Comparison(sc, "tpot_ms", "median", 10.0, 12.0)]
    medians = distribution_medians(comps)
    assert list(medians) == [("ttft_ms", "median"), ("ttft_ms", "p99"), ("tpot_ms", "median")]
    assert medians["ttft_ms", "p99"] == pytest.approx((20.0, 10.0, 3))  # |err| 10, 20, 30; signed +10, -20, +30
    assert medians["ttft_ms", "median"] == pytest.approx((10.0, -10.0, 1))


def test_shipped_distribution_cells_are_what_the_rows_notes_quote() -> None:
    """Every value in a ``distribution`` cell is a number the row's notes quote (in ms,
    or in seconds), and ``bench/distribution_cells.py --check`` finds nothing to change."""
    import re
    import runpy

    bench = Path(__file__).resolve().parents[3] / "bench"
    filled = 0
    for path in sorted((bench / "data").glob("*.csv")):
        for r in load_rows(path):
            quoted = {float(x) for x in re.findall(r"\d+(?:\.\d+)?", r.get("notes", ""))}
            for value in re.findall(r"=(\d+(?:\.\d+)?)", r.get("distribution", "")):
                filled += 1
                v = float(value)
                assert v in quoted or any(math.isclose(v / 1000, q) for q in quoted), (path.name, r["row_id"], value)
    assert filled > 500
    assert runpy.run_path(str(bench / "distribution_cells.py"))["main"](["--check"]) == 0


# --- answers that stop at EOS -----------------------------------------------------------------


def test_outputs_that_stop_at_eos_differ_in_length_up_to_the_clients_limit() -> None:
    sc = parse_row(row(output_len="100.5 mean (EOS; max_tokens 128)", num_requests="300"))
    assert (sc.output_len.kind, sc.output_len.a, sc.output_len.b) == ("eos", 100.5, 128.0)
    assert any("stop at EOS" in a for a in sc.assumptions)
    outs = [o for _, o in workload(sc)]
    assert statistics.fmean(outs) == pytest.approx(100.5, rel=0.01)
    assert max(outs) == 128 and min(outs) < 50 and len(set(outs)) > 20
    assert workload(sc) == workload(sc)  # deterministic
    for cell in ("130 mean (EOS; max_tokens 128)", "128 mean (EOS; max_tokens 128)"):
        with pytest.raises(ScenarioError, match="below max_tokens"):
            parse_row(row(output_len=cell))
    # one form only: anything else that names the limit or EOS is refused, not guessed
    for cell in ("100.5 mean (EOS; max_tokens=128)", "100.5 (EOS; max_tokens 128)", "100.5 mean (EOS; max tokens 128)",
                 "100.5 mean (EOS; max_tokens 2,048)", "120 mean (ignore-eos; max_tokens 128)", "100 mean (stops at EOS)"):
        with pytest.raises(ScenarioError, match="written 'MEAN mean"):
            parse_row(row(output_len=cell))
    # (an input length is never read so, and a client's --ignore-eos is no EOS)
    assert parse_row(row(output_len="128 (--ignore-eos)")).output_len.kind == "fixed"
    # without EOS stated, a mean stays one length for every request
    assert parse_row(row(output_len="100.5 mean", length_distribution="fixed")).output_len.kind == "fixed"


def test_a_closed_loop_whose_answers_stop_at_eos_drifts_out_of_lockstep() -> None:
    """Eight users with answers of one length stay in step: every wave's prefills run
    together and every user waits for all of them. Answers of different lengths (the
    same mean) spread the users out, and the median request meets fewer prefills."""
    base = row(batch_or_concurrency="8", num_requests="400", input_len="2000", metric_stat="median")
    fixed = predict_scenario(parse_row({**base, "output_len": "100"}))[0]["ttft_ms"]
    spread = predict_scenario(parse_row({**base, "output_len": "100 mean (EOS; max_tokens 128)"}))[0]["ttft_ms"]
    assert spread < 0.6 * fixed


def test_validate_sim_prints_a_rows_distribution_apart_from_its_headline(capsys: pytest.CaptureFixture[str]) -> None:
    import re
    import runpy

    bench = Path(__file__).resolve().parents[3] / "bench"
    script = runpy.run_path(str(bench / "validate_sim.py"))
    assert script["main"](["--csv", str(bench / "data" / "published_v1.csv"), "--rows", "4001"]) == 0
    out = capsys.readouterr().out
    headline, _, spread = out.partition("distributions:")
    table, _, rest = headline.partition("median over rows of |error| per metric class")
    assert "ttft_ms/mea" in table and "ttft_ms/p99" not in table  # the headline: the row's own columns
    assert "ttft_ms/p99" in rest and "tpot_ms/med" in rest  # then each distribution value
    assert "| vllm | holdout | ttft_ms | p99 |" in spread and "| vllm, vllm-benchmark-simon-mo | holdout | tpot_ms | median |" in spread
    # the headline medians count the row's one TTFT (its mean), not its median and p99
    assert re.search(r"TTFT +[\d.]+%  \(1 rows, 1 values", rest)


def _distribution_script() -> dict:
    import runpy

    return runpy.run_path(str(Path(__file__).resolve().parents[3] / "bench" / "distribution_cells.py"))


@pytest.mark.parametrize(("notes", "expected"), [
    ("duration 18.11 s; median TTFT 23.69, p99 66.39; median TPOT 6.97, p99 7.05; median ITL 7.09, p99 12.71",
     {"ttft_ms": {"median": "23.69", "p99": "66.39"}, "tpot_ms": {"median": "6.97", "p99": "7.05"},
      "itl_ms": {"median": "7.09", "p99": "12.71"}}),
    ("median TTFT 58.6838 ms, p99 TTFT 117.731; median ITL 15.9126, p99 ITL 57.2564",
     {"ttft_ms": {"median": "58.6838", "p99": "117.731"}, "itl_ms": {"median": "15.9126", "p99": "57.2564"}}),
    ("median TTFT 9088.74, p99 24363.57; median TPOT 107.16; median ITL 0.12 (multi-token chunks)",
     {"ttft_ms": {"median": "9088.74", "p99": "24363.57"}, "tpot_ms": {"median": "107.16"}}),
    ("TTFT mean/median/p99 16383.88/16164.27/19975.18 ms; TPOT mean/median/p99 134.47/105.53/276.78 ms",
     {"ttft_ms": {"mean": "16383.88", "median": "16164.27", "p99": "19975.18"},
      "tpot_ms": {"mean": "134.47", "median": "105.53", "p99": "276.78"}}),
    ("Quote (table 'Max Concurrency | Req/s | Output Tok/s | Mean TTFT (ms) | Median TTFT (ms) | P99 TTFT (ms)'): "
     "'16 | 6.44 | 644 | 155 | 97 | 503'.",
     {"ttft_ms": {"mean": "155", "median": "97", "p99": "503"}}),
    ("'TTFT  p50 0.051s  p95 0.052s  p99 0.508s  mean 0.060s' / 'TOTAL p50 1.486s  p95 1.487s  p99 1.953s  mean 1.495s'",
     {"ttft_ms": {"median": "51", "p95": "52", "p99": "508", "mean": "60"},
      "e2e_latency_ms": {"median": "1486", "p95": "1487", "p99": "1953", "mean": "1495"}}),
    ("'per-req latency p50 1.741s p95 1.763s mean 1.735s'", {"e2e_latency_ms": {"median": "1741", "p95": "1763", "mean": "1735"}}),
    ("mean_ttft_ms 137.06 (median 109.60), mean_tpot_ms 54.29 (median 58.04), mean_itl_ms 54.80 (median 57.77)",
     {"ttft_ms": {"mean": "137.06", "median": "109.60"}, "tpot_ms": {"mean": "54.29", "median": "58.04"},
      "itl_ms": {"mean": "54.80", "median": "57.77"}}),
    ("FTL(min/max) = 143/3576 ms; Per-token latency p75/p95/p99 = 21/22/25 ms.", {"itl_ms": {"p75": "21", "p95": "22", "p99": "25"}}),
    ("Medians: TTFT 3697, TPOT 40.9, ITL 261, E2E 10637 ms. JSON also holds",
     {"ttft_ms": {"median": "3697"}, "tpot_ms": {"median": "40.9"}, "itl_ms": {"median": "261"}, "e2e_latency_ms": {"median": "10637"}}),
    ("mean E2E 7840.62 ms; duration 298.37 s", {"e2e_latency_ms": {"mean": "7840.62"}}),
    ("Published: req/s 2.63, TTFT p50/p95/p99 68.74/108.45/134.84 ms, TPOT p99 11.33 ms, E2E p99 2977.45 ms.",
     {"ttft_ms": {"median": "68.74", "p95": "108.45", "p99": "134.84"}, "tpot_ms": {"p99": "11.33"},
      "e2e_latency_ms": {"p99": "2977.45"}}),
    ("Std TTFT 100.847 ms, Std ITL 8.11108 ms", {}),
])
def test_each_form_of_quote_reads_as_its_metric_and_statistic(notes: str, expected: dict) -> None:
    assert _distribution_script()["read_notes"]({"notes": notes}) == expected


def test_every_row_whose_notes_hold_its_other_statistics_has_a_distribution_cell() -> None:
    import re

    data = Path(__file__).resolve().parents[3] / "bench" / "data"
    missing = [
        r["row_id"] for path in sorted(data.glob("*.csv")) for r in load_rows(path)
        if re.search(r"(median|p\d\d)[^)]*in notes", r.get("metric_stat", ""), re.IGNORECASE)
        and "static" not in r.get("scenario", "") and not r.get("distribution")
    ]
    assert missing == []


def test_a_distribution_cell_that_cannot_be_read_leaves_the_rows_headline_in() -> None:
    scenarios, skipped = parse_rows([row(distribution="ttft_ms p99=250."), row(row_id="x2", distribution="ttft_ms p99=250")])
    assert [sc.row_id for sc in scenarios] == ["x1", "x2"]
    assert scenarios[0].distribution == ()
    assert [(s.row_id, s.reason.split(":")[0]) for s in skipped] == [("x1", "distribution")]


def test_the_interval_over_sources_says_how_much_a_median_rests_on_one_source() -> None:
    """One large source that agrees with itself and a few small ones far off: the median
    over rows is the large source's, but drawing whole sources, some draws leave it out,
    so the interval reaches the small ones' errors; sources that agree give a narrow one;
    one source alone gives its own median; the same seed the same interval."""
    lopsided = {"big": [5.0] * 100, "a": [40.0] * 5, "b": [45.0] * 5, "c": [50.0] * 5}
    lo, hi = source_interval(lopsided)
    assert lo == 5.0 and hi >= 40.0
    agreeing = {s: [9.0, 10.0, 11.0] for s in "abcdef"}
    assert source_interval(agreeing) == (10.0, 10.0)
    assert source_interval({"only": [1.0, 2.0, 30.0]}) == (2.0, 2.0)
    assert source_interval(lopsided, seed=3) == source_interval(lopsided, seed=3)
    with pytest.raises(ValueError):
        source_interval({})
