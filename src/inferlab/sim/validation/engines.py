"""The simulated engine for a calibration scenario, with nothing tuned per row.

Model and GPU presets, TP, quantization and KV dtype come from the scenario; the
scheduler sizes are the engine family's documented defaults (``family_defaults``, the
same ``inferlab sim run --engine-family`` uses) under the flags the row states in
``engine_config``; the step time uses one ``Efficiencies`` override set per engine family
(``FAMILY_EFFICIENCIES``).
"""

from __future__ import annotations

import dataclasses
import math

from inferlab.sim.engine.engine import Engine, EngineConfig
from inferlab.sim.engine.hardware import resolve_model
from inferlab.sim.validation.scenario import Scenario, ScenarioError


def _trtllm_bench_sizes(sc: Scenario, kv_tokens: int) -> tuple[int, int]:
    """trtllm-bench's max_batch_size / max_num_tokens heuristic for the mean ISL / OSL."""
    isl, osl = sc.input_len.mean, sc.output_len.mean
    raw_bs = min(kv_tokens / (isl + osl), 4096)
    raw_tok = min(raw_bs * (1 + isl / osl), 32768)
    if raw_bs < 256:
        bs = max(64, 32 * math.ceil(raw_bs / 32))
    else:
        step = 128 if raw_bs < 1024 else 256
        bs = step * math.ceil(raw_bs / step)
    if raw_tok < 4096:
        tok = max(2048, 256 * math.ceil(raw_tok / 256))
    else:
        step = 512 if raw_tok < 8192 else 1024
        tok = step * math.ceil(raw_tok / step)
    return bs, tok


def build_engine(sc: Scenario, max_total_len: int) -> Engine:
    """The simulated engine for a scenario whose longest request holds ``max_total_len``
    tokens; raises ``ValueError`` if the engine would refuse the configuration.

    Sizes the row does not state are the family's defaults, resolved by ``Engine`` exactly
    as for ``inferlab sim run --engine-family``; only what depends on the workload is set
    here (LMDeploy's benchmark raising its batch to the user count, TRT-LLM's sizing)."""
    flags = dict(sc.engine_flags)

    def flag(name: str) -> int | None:
        return int(flags[name]) if name in flags else None

    def switch(name: str) -> bool | None:  # None: the family's default
        return bool(flags[name]) if name in flags else None

    seqs = flag("max_num_seqs")
    if sc.family == "lmdeploy" and seqs is None:  # its scripts raise max_batch_size to the users
        seqs = max(128, sc.concurrency or 0)
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
    overlap = flags.get("overlap_schedule")
    if overlap is None and sc.family == "sglang" and sc.version is not None and sc.version < (0, 4):
        overlap = 0.0  # SGLang's overlap scheduler became the default in 0.4
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
        overlap_schedule=None if overlap is None else bool(overlap),
        quantization=sc.quantization,
        kv_cache_dtype=sc.kv_cache_dtype,
        offline=not sc.via_server,  # offline: no API server costs
    )
    entries = flags.get("cache_max_entry_count", flags.get("kv_free"))
    if entries is not None and entries > 1:  # old TurboMind: a count of 128-token blocks
        config = dataclasses.replace(config, num_gpu_blocks_override=int(entries * 128 // config.block_size))
    elif entries is not None:
        config = dataclasses.replace(config, kv_cache_free_fraction=entries)
    itl = any(m.metric == "itl_ms" for m in sc.measurements)
    engine = Engine(config, record_token_times=itl)
    if sc.family != "trtllm":
        return engine
    # TRT-LLM admits a request only with room for its whole sequence (GUARANTEED_NO_EVICT),
    # and trtllm-bench sizes the batch from the workload.
    seqs, tokens = engine.limits.max_num_seqs, engine.limits.max_num_batched_tokens
    kv_tokens = engine.kv_capacity_tokens
    if sc.kind == "offline":
        bs, tok = _trtllm_bench_sizes(sc, kv_tokens)
        seqs = seqs if "max_num_seqs" in flags else bs
        tokens = tokens if "max_num_batched_tokens" in flags else tok
    fit = max(1, int(kv_tokens // (sc.input_len.mean + sc.output_len.mean)))
    config = dataclasses.replace(
        engine.config,
        max_num_seqs=min(seqs, fit),
        max_num_batched_tokens=tokens,
        num_gpu_blocks_override=engine.num_kv_blocks,
    )
    return Engine(config, record_token_times=itl)
