"""The simulated engine for a calibration scenario, with nothing tuned per row.

A row runs on the engine ``inferlab sim run --engine-family F`` builds: the same family
rules (``families.FAMILY_RULES``: default sizes, chunking, prefix caching, batching,
overlap, KV sizing, step-time constants), resolved and sized by the same code. On top,
the validation sets only what the row states and what its benchmark harness does:

- from the row (``engine_config``): model, GPU, TP, quantization and KV-cache dtype; the
  engine flags its ``engine_config`` cell states (``--max-num-seqs``, ``--max-num-batched-
  tokens``, ``--max-model-len``, ``--gpu-memory-utilization``, the KV share or block
  count, chunked prefill, prefix caching, eager mode, scheduler steps, overlap); its
  release (``families.family_for_engine``; SGLang before 0.4 ran without its overlap
  scheduler; vLLM V1 before 0.19 admitted on a request's first chunk, not its whole
  sequence, and before 0.24 reused freed blocks in LRU order only); offline (``--offline``) when the benchmark drives the engine without its
  API server; a ``max_model_len`` that holds the row's longest request where the source
  declared a shorter context than the model's.
- harness rules, which belong to a benchmark tool rather than to the engine:
  ``lmdeploy_profile_batch_size`` (LMDeploy's profiling scripts raise max_batch_size to
  the user count), ``sizing.trtllm_bench_sizes`` (trtllm-bench sizes the batch and token budget
  from the workload, offline rows). TRT-LLM's admission (a request only with room for its
  whole sequence to its output limit, GUARANTEED_NO_EVICT) is the engine's, the
  ``trtllm`` family's (``FamilyRules.capacity_policy``), in every run, not a harness rule.
"""

from __future__ import annotations

import dataclasses

from inferlab.sim.engine.config import EngineConfig, resolve
from inferlab.sim.engine.engine import Engine
from inferlab.sim.engine.families import EngineFamily
from inferlab.sim.engine.hardware import resolve_model
from inferlab.sim.engine.sizing import size_engine, trtllm_bench_sizes
from inferlab.sim.validation.scenario import Scenario, ScenarioError


def build_engine(sc: Scenario, max_total_len: int) -> Engine:
    """The simulated engine for a scenario whose longest request holds ``max_total_len``
    tokens; raises ``ValueError`` if the engine would refuse the configuration."""
    config = engine_config(sc, max_total_len)
    if sc.family is EngineFamily.TRTLLM:
        config = _trtllm_harness(sc, config)
    itl = any(m.metric == "itl_ms" for m in sc.measurements)
    return Engine(config, record_token_times=itl)


def engine_config(sc: Scenario, max_total_len: int) -> EngineConfig:
    """The flags a row states (module docstring); sizes it does not state are left to the
    family, as ``inferlab sim run`` leaves them. ``ScenarioError`` for a stated context
    beyond the model's."""
    flags = dict(sc.engine_flags)

    def flag(name: str) -> int | None:
        return int(flags[name]) if name in flags else None

    def switch(name: str) -> bool | None:  # None: the family's default
        return bool(flags[name]) if name in flags else None

    seqs = flag("max_num_seqs")
    if sc.family is EngineFamily.LMDEPLOY and seqs is None:
        seqs = lmdeploy_profile_batch_size(sc)
    # the row's --max-model-len, or its model's own context where the preset standing in
    # for it has a longer one (Llama 3 as Llama 3.1); else vLLM's (the context, capped)
    stated = flag("max_model_len")
    declared = stated or sc.native_max_len
    context = resolve_model(sc.model).max_position_embeddings
    if stated is not None and stated > context:
        raise ScenarioError(
            f"--max-model-len {stated} is beyond {sc.model}'s {context}-token context "
            "(the source extends it with rope scaling such as YaRN, which is not modelled)"
        )
    max_model_len = min(max(max_total_len, declared), context) if declared < context else None
    # the release's defaults where the family has any (SGLang's overlap scheduler from 0.4;
    # vLLM V1's async scheduling, KV admission and free-queue order from 0.14, 0.19, 0.24),
    # as ``sim run --engine-version`` sets them
    release = f"{sc.version[0]}.{sc.version[1]}" if sc.version and sc.family.rules.release_dated else None
    config = EngineConfig(
        model=sc.model,
        engine_family=sc.family,
        gpu=sc.gpu,
        tensor_parallel_size=sc.tp,
        max_model_len=max_model_len,
        gpu_memory_utilization=flags.get("gpu_memory_utilization", 0.9),
        max_num_batched_tokens=flag("max_num_batched_tokens"),
        max_num_seqs=seqs,
        # the family's default unless the row says: no prompt shares a prefix, but a
        # preempted request finds its own blocks again (vLLM V1, SGLang)
        enable_prefix_caching=switch("enable_prefix_caching"),
        enable_chunked_prefill=switch("enable_chunked_prefill"),
        enforce_eager=bool(flags.get("enforce_eager", 0.0)),
        num_scheduler_steps=flag("num_scheduler_steps") or 1,
        overlap_schedule=switch("overlap_schedule"),
        engine_version=release,
        quantization=sc.quantization,
        kv_cache_dtype=sc.kv_cache_dtype,
        offline=not sc.via_server,  # offline: no API server costs
    )
    entries = flags.get("cache_max_entry_count", flags.get("kv_free"))
    if entries is not None and entries > 1:  # old TurboMind: a count of 128-token blocks
        return dataclasses.replace(config, num_gpu_blocks_override=int(entries * 128 // config.block_size))
    if entries is not None:
        return dataclasses.replace(config, kv_cache_free_fraction=entries)
    return config


# --- harness rules ------------------------------------------------------------------------


def lmdeploy_profile_batch_size(sc: Scenario) -> int:
    """LMDeploy's profiling scripts raise the engine's max_batch_size to the number of
    concurrent users (never below TurboMind's default)."""
    default = EngineFamily.LMDEPLOY.rules.max_num_seqs
    assert default is not None
    return max(default, sc.concurrency or 0)


def _trtllm_harness(sc: Scenario, config: EngineConfig) -> EngineConfig:
    """``config`` sized as the engine would size it, then as trtllm-bench sizes it from
    the workload (offline rows); the KV cache keeps its size."""
    resolved = resolve(config)
    sizes = size_engine(resolved)
    seqs, tokens = sizes.max_num_seqs, sizes.max_num_batched_tokens
    kv_tokens = sizes.num_kv_blocks * resolved.config.block_size
    if sc.kind == "offline":
        flags = dict(sc.engine_flags)
        bs, tok = trtllm_bench_sizes(sc.input_len.mean, sc.output_len.mean, kv_tokens)
        seqs = seqs if "max_num_seqs" in flags else bs
        tokens = tokens if "max_num_batched_tokens" in flags else tok
    return dataclasses.replace(
        sizes.applied_to(resolved.config),
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        num_gpu_blocks_override=sizes.num_kv_blocks,
    )
