"""Resolving a configuration and sizing the engine, apart from the step loop."""

import dataclasses

import pytest

from inferlab._errors import ConfigError, UsageError
from inferlab.sim import Engine, EngineConfig
from inferlab.sim.engine.config import parse_release, release_local_label, resolve
from inferlab.sim.engine.families import EngineFamily
from inferlab.sim.engine.sizing import size_engine
from inferlab.sim.engine.steptime import (
    activation_reserve_bytes,
    kv_bytes_per_token,
    weight_bytes_per_rank,
)

LLAMA8B = EngineConfig(model="Llama-3.1-8B", gpu="H100")


@pytest.mark.parametrize("family", list(EngineFamily))
def test_resolve_sets_every_switch_and_leaves_the_sizes(family: EngineFamily) -> None:
    resolved = resolve(dataclasses.replace(LLAMA8B, engine_family=family))
    cfg = resolved.config
    for name in ("enable_chunked_prefill", "enable_prefix_caching", "mixed_batches", "overlap_schedule"):
        assert isinstance(getattr(cfg, name), bool), name
    assert (cfg.max_model_len, cfg.max_num_batched_tokens, cfg.max_num_seqs, cfg.api_overhead_s) == (None,) * 4
    assert resolved.rules is family.rules and resolved.declared_len == resolved.model.max_position_embeddings
    assert resolved.efficiencies == family.rules.efficiencies


def test_the_engine_runs_the_sizes_sizing_gives() -> None:
    for cfg in (LLAMA8B, dataclasses.replace(LLAMA8B, engine_family="trtllm", offline=True)):
        sizes = size_engine(resolve(cfg))
        engine = Engine(cfg)
        assert engine.sizes == sizes
        assert engine.num_kv_blocks == sizes.num_kv_blocks
        assert (engine.limits.max_model_len, engine.limits.max_num_batched_tokens, engine.limits.max_num_seqs) == (
            sizes.max_model_len, sizes.max_num_batched_tokens, sizes.max_num_seqs)
        assert engine.config == sizes.applied_to(resolve(cfg).config)
        assert engine.api_overhead_s == sizes.api_overhead_s


def test_vllm_gives_the_kv_cache_what_utilization_leaves_after_weights_and_activations() -> None:
    resolved = resolve(LLAMA8B)
    sizes = size_engine(resolved)
    model, gpu = resolved.model, resolved.gpu
    assert sizes.weight_bytes == weight_bytes_per_rank(model, 1)
    assert sizes.reserve_bytes == activation_reserve_bytes(model, 1, 8192, 1024)  # H100 serving defaults
    block_bytes = kv_bytes_per_token(model, 1) * 16
    # less the null block vLLM V1 keeps out of what memory holds
    assert sizes.num_kv_blocks == int((0.9 * gpu.hbm_bytes - sizes.weight_bytes - sizes.reserve_bytes) // block_bytes) - 1
    # the context is capped to what the cache holds; the served API cost is the family's
    assert sizes.max_model_len == min(model.max_position_embeddings, sizes.num_kv_blocks * 16)
    eff = resolved.efficiencies
    assert sizes.api_overhead_s == sizes.front_end.latency_s == eff.api_overhead_s
    assert (sizes.front_end.intake_s, sizes.front_end.stream_per_token_s) == (eff.api_intake_s, eff.api_stream_s)
    assert sizes.front_end.stream_per_step_s == eff.api_stream_per_step_s > 0
    offline = size_engine(resolve(dataclasses.replace(LLAMA8B, offline=True)))
    assert offline.api_overhead_s == 0.0 and offline.max_num_batched_tokens == 16384
    assert not offline.front_end.queues and offline.front_end.latency_s == 0.0  # no API server


def test_trtllm_gives_it_a_share_of_what_weights_and_a_profile_run_leave() -> None:
    resolved = resolve(dataclasses.replace(LLAMA8B, engine_family="trtllm"))
    sizes = size_engine(resolved)
    model, gpu = resolved.model, resolved.gpu
    reserve = activation_reserve_bytes(model, 1, 8192, 2048, resolved.efficiencies)
    assert sizes.reserve_bytes == reserve
    block_bytes = kv_bytes_per_token(model, 1) * 16
    assert sizes.num_kv_blocks == int(0.9 * (gpu.hbm_bytes - sizes.weight_bytes - reserve) // block_bytes)


def test_unchunked_default_budget_holds_one_prompt_and_a_given_one_wins() -> None:
    unchunked = dataclasses.replace(LLAMA8B, max_model_len=20000, enable_chunked_prefill=False)
    assert size_engine(resolve(unchunked)).max_num_batched_tokens == 20000
    with pytest.raises(ValueError, match="is smaller than max_model_len"):
        size_engine(resolve(dataclasses.replace(unchunked, max_num_batched_tokens=8192)))
    # vLLM keeps its default sequence cap (1,024 on an H100) and refuses a budget below it
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(512\) must be greater than or equal to max_num_seqs \(1024"):
        size_engine(resolve(dataclasses.replace(LLAMA8B, max_num_batched_tokens=512)))
    # TensorRT-LLM's default cap follows a smaller budget (its max_num_tokens counts decodes too);
    # SGLang's stays, its --chunked-prefill-size bounding prompt chunks only
    trtllm = dataclasses.replace(LLAMA8B, engine_family="trtllm", max_num_batched_tokens=512)
    assert size_engine(resolve(trtllm)).max_num_seqs == 512
    sglang = dataclasses.replace(LLAMA8B, engine_family="sglang", max_num_batched_tokens=512)
    assert size_engine(resolve(sglang)).max_num_seqs == size_engine(resolve(
        dataclasses.replace(sglang, max_num_batched_tokens=None))).max_num_seqs > 512


def test_sizing_refuses_what_vllm_refuses() -> None:
    with pytest.raises(ValueError, match="weights need"):
        size_engine(resolve(EngineConfig(model="Llama-3.1-70B", gpu="H100")))
    with pytest.raises(ValueError, match="larger than the maximum number of tokens"):
        size_engine(resolve(dataclasses.replace(LLAMA8B, max_model_len=4096, num_gpu_blocks_override=100)))
    with pytest.raises(ValueError, match="must be greater than or equal to max_num_seqs"):
        size_engine(resolve(dataclasses.replace(LLAMA8B, max_num_batched_tokens=64, max_num_seqs=128)))
    # vLLM's meaning of the override: N blocks, one of them the null block (vLLM V1 only)
    assert size_engine(resolve(dataclasses.replace(LLAMA8B, max_model_len=1584, num_gpu_blocks_override=100))).num_kv_blocks == 99
    with pytest.raises(ValueError, match="larger than the maximum number of tokens"):
        size_engine(resolve(dataclasses.replace(LLAMA8B, max_model_len=1600, num_gpu_blocks_override=100)))
    trtllm = dataclasses.replace(LLAMA8B, engine_family="trtllm", max_model_len=1600, num_gpu_blocks_override=100)
    assert size_engine(resolve(trtllm)).num_kv_blocks == 100
    with pytest.raises(ValueError, match=r"leaves no KV block for tokens \(one is the null block"):
        size_engine(resolve(dataclasses.replace(LLAMA8B, max_model_len=16, num_gpu_blocks_override=1)))


def test_resolve_refuses_flags_and_names_before_sizing() -> None:
    with pytest.raises(ValueError, match="divisible by tensor parallel size"):
        resolve(dataclasses.replace(LLAMA8B, tensor_parallel_size=3))
    with pytest.raises(ValueError, match="block_size"):
        resolve(dataclasses.replace(LLAMA8B, block_size=12))
    with pytest.raises(UsageError, match="unknown GPU"):
        resolve(dataclasses.replace(LLAMA8B, gpu="TPUv5", block_size=12))  # names first, as vLLM


def test_an_engine_version_sets_the_defaults_that_release_had() -> None:
    """--engine-version: the switches a release turned on (vLLM's async scheduling 0.14,
    full-sequence admission 0.19, unhashed blocks first 0.24; SGLang's overlap scheduler
    0.4) follow it where no flag is given; a flag given wins."""

    def switches(**changes: object) -> tuple[bool | None, bool | None, bool | None]:
        cfg = resolve(dataclasses.replace(LLAMA8B, **changes)).config  # type: ignore[arg-type]
        return cfg.overlap_schedule, cfg.scheduler_reserve_full_isl, cfg.evict_unhashed_first

    assert switches() == (True, True, True)  # a current vLLM
    assert switches(engine_version="0.13.0") == (False, False, False)
    assert switches(engine_version="v0.14") == (True, False, False)
    assert switches(engine_version="0.19.1") == (True, True, False)
    assert switches(engine_version="0.24.0rc1") == switches(engine_version="0.32") == (True, True, True)
    assert switches(engine_version="0.13", overlap_schedule=True, evict_unhashed_first=True) == (True, False, True)
    sglang = {"engine_family": EngineFamily.SGLANG}
    assert switches(**sglang, engine_version="0.3.6")[0] is False and switches(**sglang, engine_version="0.4.0")[0] is True


def test_a_release_of_vllms_v0_families_is_taken_by_the_family_it_names() -> None:
    """vllm-v0 with 0.6.3, vllm-v0.5 with 0.5.4: the release that says which family (the
    message for 0.6.3 alone says to add the family, so the two together run)."""
    for family, text in ((EngineFamily.VLLM_V0, "0.6.3"), (EngineFamily.VLLM_V05, "0.5.4")):
        resolved = resolve(dataclasses.replace(LLAMA8B, engine_family=family, engine_version=text))
        assert resolved.config.engine_version == text


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"engine_version": "latest"}, "expected a release such as 0.15"),
        ({"engine_version": "0.6.3"}, "that release is the vllm-v0 family: --engine-family vllm-v0"),
        ({"engine_version": "0.5.4"}, "--engine-family vllm-v0.5"),
        ({"engine_version": "1.0", "engine_family": EngineFamily.TRTLLM}, "no release-dated defaults"),
        ({"engine_version": "2.0", "engine_family": EngineFamily.GENERIC}, "no release-dated defaults"),
        ({"engine_version": "0.5.4", "engine_family": EngineFamily.VLLM_V0}, "that release is the vllm-v0.5 family"),
        ({"engine_version": "0.9", "engine_family": EngineFamily.VLLM_V0}, "that release is the vllm family"),
        ({"engine_version": "0.10", "engine_family": EngineFamily.LMDEPLOY}, "no release-dated defaults"),
        ({"engine_version": "0.13.x"}, "expected a release"),
    ],
)
def test_an_engine_version_the_rules_cannot_follow_is_refused(changes: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        resolve(dataclasses.replace(LLAMA8B, **changes))  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "release", "local"), [
    ("0.15", (0, 15), ""), ("v0.15.1", (0, 15), ""), ("0.14.0rc1", (0, 14), ""), ("0.4.3.post1", (0, 4), ""),
    ("0.13.0+cu128", (0, 13), "cu128"), ("0.11.0+CPU", (0, 11), "cpu"),
    # a dev build of main, as vLLM's /version reports one
    ("0.10.2rc2.dev123+g1a2b3c4.cpu", (0, 10), "g1a2b3c4.cpu"), ("0.14.0.dev50", (0, 14), ""),
])
def test_a_release_is_read_in_the_shapes_pep_440_gives_it(text: str, release: tuple[int, int], local: str) -> None:
    assert (parse_release(text), release_local_label(text)) == (release, local)


@pytest.mark.parametrize("text", ["0.13.x", "0.13-foo", "0.13rc1rc2", "0.13.0ab", "0.13.0.dev.dev", "13", "latest", ""])
def test_text_that_is_not_a_release_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="expected a release"):
        parse_release(text)
