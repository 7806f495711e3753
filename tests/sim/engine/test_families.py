"""The engine-family table: every family has every rule, the engine applies exactly the
table's rules, and names and releases map to the right family."""

import dataclasses

import pytest

from inferlab._errors import UsageError
from inferlab.sim import Engine, EngineConfig
from inferlab.sim.engine.families import (
    FAMILY_RULES,
    BatchMixing,
    EngineFamily,
    FamilyRules,
    family_for_engine,
    vllm_batch_defaults,
)
from inferlab.sim.engine.hardware import resolve_gpu
from inferlab.sim.engine.steptime import DEFAULT_EFFICIENCIES, Efficiencies

FIELDS = [f.name for f in dataclasses.fields(FamilyRules)]


def test_every_family_has_one_row_with_every_rule() -> None:
    assert list(FAMILY_RULES) == list(EngineFamily)
    for family in EngineFamily:
        rules = family.rules
        assert rules is FAMILY_RULES[family]
        assert rules.engine, family
        # either both sizes come from vLLM V1's GPU defaults or both are the family's own
        assert (rules.max_num_batched_tokens is None) == (rules.max_num_seqs is None), family
        assert isinstance(rules.mixed_batches, BatchMixing), family
        assert isinstance(rules.efficiencies, Efficiencies), family
        assert rules.kv_free_fraction is None or 0 < rules.kv_free_fraction <= 1, family


def test_the_table_says_what_each_family_changes() -> None:
    """The documented differences, read off the table (a change to a row shows here)."""
    v1, v0, v05 = EngineFamily.VLLM.rules, EngineFamily.VLLM_V0.rules, EngineFamily.VLLM_V05.rules
    sglang, trt, lmd = EngineFamily.SGLANG.rules, EngineFamily.TRTLLM.rules, EngineFamily.LMDEPLOY.rules
    # vLLM V1 is the defaults but for its API front end, its own resource (``frontend``),
    # and the engine core's host cost per sequence, fitted with the front end's latency
    front_end = {"api_overhead_s", "api_intake_s", "api_intake_per_token_s", "api_stream_s", "api_stream_per_step_s", "api_per_seq_s"}
    changed = {f.name for f in dataclasses.fields(Efficiencies) if getattr(v1.efficiencies, f.name) != getattr(DEFAULT_EFFICIENCIES, f.name)}
    assert changed <= front_end | {"per_seq_s"} and v1.efficiencies.api_stream_s > 0 and v1.efficiencies.api_per_seq_s == 0
    assert EngineFamily.GENERIC.rules.efficiencies == v1.efficiencies
    assert all(f.rules.efficiencies.api_stream_s == 0 for f in EngineFamily if f not in (EngineFamily.VLLM, EngineFamily.GENERIC))
    # another engine takes V1's rules but not vLLM's asynchronous scheduler, nor vLLM's releases
    assert [f for f in FIELDS if getattr(v1, f) != getattr(EngineFamily.GENERIC.rules, f)] == [
        "engine", "overlap_schedule", "overlap_schedule_since", "reserve_full_sequence_since", "evict_unhashed_first_since",
        "clamp_max_tokens", "clamp_max_tokens_since"]
    # only vLLM V1 lowers a max_tokens over the context left (0.32 on): the others refuse it
    assert [f for f in EngineFamily if f.rules.clamp_max_tokens] == [EngineFamily.VLLM]
    assert v1.release_dated and EngineFamily.SGLANG.rules.release_dated
    assert not any(f.rules.release_dated for f in EngineFamily if f not in (EngineFamily.VLLM, EngineFamily.SGLANG))
    # vLLM <= 0.5 is V0 with the front end in the engine's process, and its intake cost
    assert [f for f in FIELDS if getattr(v0, f) != getattr(v05, f)] == ["engine", "front_end_in_process", "efficiencies"]
    assert dataclasses.replace(v05.efficiencies, api_intake_s=0.0) == v0.efficiencies
    assert v05.efficiencies.api_intake_s > 0 and v05.front_end_in_process
    assert not v0.prefix_caching and not lmd.prefix_caching and sglang.prefix_caching and trt.prefix_caching
    assert sglang.mixed_batches is BatchMixing.NEVER and v0.mixed_batches is BatchMixing.WHEN_CHUNKED
    assert [f for f in EngineFamily if f.rules.overlap_schedule] == [EngineFamily.VLLM, EngineFamily.SGLANG]
    assert (trt.kv_free_fraction, lmd.kv_free_fraction) == (0.9, 0.8)
    assert [f for f in EngineFamily if f.rules.kv_free_fraction is not None] == [EngineFamily.TRTLLM, EngineFamily.LMDEPLOY]


def test_rule_methods() -> None:
    v0, sglang = EngineFamily.VLLM_V0.rules, EngineFamily.SGLANG.rules
    assert not v0.chunked_prefill_default(32768) and v0.chunked_prefill_default(32769)
    assert not EngineFamily.LMDEPLOY.rules.chunked_prefill_default(10**6)
    assert EngineFamily.VLLM.rules.chunked_prefill_default(128)
    assert v0.mixes_batches(True) and not v0.mixes_batches(False)
    assert not sglang.mixes_batches(True) and EngineFamily.TRTLLM.rules.mixes_batches(False)
    assert sglang.overlap_schedule_in(None) and sglang.overlap_schedule_in((0, 4))
    assert not sglang.overlap_schedule_in((0, 3))
    assert not EngineFamily.VLLM.rules.overlap_schedule_in((0, 9))
    # vLLM's --async-scheduling: on by default from 0.14, and in a current release
    v1 = EngineFamily.VLLM.rules
    assert not v1.overlap_schedule_in((0, 13)) and v1.overlap_schedule_in((0, 14)) and v1.overlap_schedule_in(None)
    assert not EngineFamily.GENERIC.rules.overlap_schedule_in(None)  # TGI and others: vLLM's rules, not its scheduler
    h100, a100 = resolve_gpu("H100"), resolve_gpu("A100")
    # vLLM V0: a whole prompt a step unchunked (at least 2048 tokens), 512 chunked
    assert v0.batch_defaults(h100, offline=False, chunked_prefill=False, max_model_len=8192) == (8192, 256)
    assert v0.batch_defaults(h100, offline=False, chunked_prefill=False, max_model_len=1024) == (2048, 256)
    assert v0.batch_defaults(h100, offline=False, chunked_prefill=True, max_model_len=8192) == (512, 256)
    assert sglang.batch_defaults(h100, offline=True, chunked_prefill=False, max_model_len=8192) == (8192, 4096)
    for gpu, offline, want in ((h100, False, (8192, 1024)), (h100, True, (16384, 1024)),
                               (a100, False, (2048, 256)), (a100, True, (8192, 256))):
        assert vllm_batch_defaults(gpu, offline) == want
        assert EngineFamily.VLLM.rules.batch_defaults(gpu, offline=offline, chunked_prefill=True, max_model_len=4096) == want


@pytest.mark.parametrize("family", list(EngineFamily))
def test_the_engine_runs_exactly_its_familys_rules(family: EngineFamily) -> None:
    rules = family.rules
    engine = Engine(EngineConfig(model="Qwen/Qwen2.5-7B-Instruct", engine_family=family, max_model_len=8192))
    cfg = engine.config
    chunked = rules.chunked_prefill_default(8192)
    assert cfg.engine_family is family
    assert cfg.enable_chunked_prefill is chunked and cfg.enable_prefix_caching is rules.prefix_caching
    assert cfg.mixed_batches is rules.mixes_batches(chunked) and cfg.overlap_schedule is rules.overlap_schedule
    budget, seqs = rules.batch_defaults(engine.gpu, offline=False, chunked_prefill=chunked, max_model_len=8192)
    assert engine.limits.max_num_seqs == seqs
    assert engine.limits.max_num_batched_tokens == max(budget, seqs, 0 if chunked else 8192)
    assert cfg.api_overhead_s == engine.api_overhead_s == rules.efficiencies.api_overhead_s
    # a flag wins over every rule
    flags = dict(enable_chunked_prefill=not chunked, enable_prefix_caching=not rules.prefix_caching,
                 mixed_batches=False, overlap_schedule=not rules.overlap_schedule, max_num_seqs=8,
                 max_num_batched_tokens=8192, api_overhead_s=0.5)
    given = Engine(dataclasses.replace(engine.config, **flags)).config
    assert {k: getattr(given, k) for k in flags} == flags


def test_family_names_parse_and_a_bad_one_lists_them_on_one_line() -> None:
    for family in EngineFamily:
        assert EngineFamily.parse(family.value) is family
        assert EngineFamily.parse(f" {family.value.upper()} ") is family
        assert EngineConfig(engine_family=family.value).engine_family is family
    with pytest.raises(UsageError) as e:
        EngineFamily.parse("tgi-2")
    assert str(e.value) == (
        "unknown engine family 'tgi-2'; known: vllm, vllm-v0, vllm-v0.5, sglang, trtllm, lmdeploy, generic"
    )
    with pytest.raises(UsageError, match="engine family"):
        EngineConfig(engine_family="tgi-2")


@pytest.mark.parametrize(
    ("engine", "version", "family"),
    [
        ("vLLM", None, EngineFamily.VLLM),
        ("vLLM", (0, 5), EngineFamily.VLLM_V05),
        ("vllm", (0, 6), EngineFamily.VLLM_V0),
        ("vLLM", (0, 7), EngineFamily.VLLM_V0),
        ("vLLM", (0, 8), EngineFamily.VLLM),
        ("SGLang (version not stated)", (0, 3), EngineFamily.SGLANG),
        ("TensorRT-LLM", None, EngineFamily.TRTLLM),
        ("trtllm-serve", None, EngineFamily.TRTLLM),
        ("NVIDIA NIM (TensorRT-LLM backend assumed)", None, EngineFamily.TRTLLM),
        ("NIM", None, EngineFamily.TRTLLM),
        ("Triton Inference Server (vLLM backend)", (0, 6), EngineFamily.VLLM_V0),
        ("LMDeploy TurboMind", None, EngineFamily.LMDEPLOY),
        ("TGI", None, EngineFamily.GENERIC),
        ("nano-vllm", None, EngineFamily.GENERIC),
    ],
)
def test_engines_and_releases_map_to_families(engine: str, version: tuple[int, int] | None, family: EngineFamily) -> None:
    assert family_for_engine(engine, version) is family


@pytest.mark.parametrize(("engine", "reason"), [("llama.cpp", "not a continuous-batching"),
                                                 ("Ollama", "not a continuous-batching"),
                                                 ("not stated", "engine not stated"), ("", "engine not stated")])
def test_engines_not_modelled_are_refused_with_the_reason(engine: str, reason: str) -> None:
    with pytest.raises(UsageError, match=reason):
        family_for_engine(engine, None)
