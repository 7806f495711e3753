"""The simulated engine for a calibration scenario, with nothing tuned per row.

Model and GPU presets, TP, quantization and KV dtype come from the scenario; the
scheduler sizes are the engine's documented defaults (``_scheduler_defaults``,
version-aware for vLLM) under the flags the row states in ``engine_config``; the step
time uses one ``Efficiencies`` override set per engine family (``FAMILY_EFFICIENCIES``).
"""

from __future__ import annotations

import dataclasses
import math

from inferlab.sim._engine import Engine, EngineConfig, vllm_batch_defaults
from inferlab.sim._hardware import resolve_gpu, resolve_model
from inferlab.sim._scenario import Scenario
from inferlab.sim._steptime import (
    activation_reserve_bytes,
    kv_bytes_per_token,
    weight_bytes_per_rank,
)

# Scheduler defaults per family: max_num_seqs, max_num_batched_tokens, and for TRT-LLM /
# LMDeploy the fraction of free memory (after weights) given to the KV cache.
_SGLANG_DEFAULTS = {"max_num_seqs": 4096.0, "max_num_batched_tokens": 8192.0}  # chunked 8192
# TurboMind (2023-24) prefills every newly admitted request before the next decode
# iteration: no token budget shared with decodes, first tokens only after the whole batch.
_LMDEPLOY_DEFAULTS = {
    "max_num_seqs": 128.0,
    "max_num_batched_tokens": float(2**20),
    "enable_chunked_prefill": 0.0,
    "kv_free": 0.8,
}
_TRTLLM_DEFAULTS = {"max_num_seqs": 2048.0, "max_num_batched_tokens": 8192.0, "kv_free": 0.9}


def _scheduler_defaults(sc: Scenario, declared_len: int) -> dict[str, float]:
    """The engine's documented defaults (not fitted) for the scheduler sizes."""
    if sc.family == "vllm-v0":
        # V0: 256 sequences; chunked prefill only when max_model_len > 32K, at 512 tokens a
        # step; otherwise a prefill step takes up to max(max_model_len, 2048) tokens.
        chunked = declared_len > 32000
        return {
            "max_num_seqs": 256,
            "enable_chunked_prefill": float(chunked),
            "max_num_batched_tokens": 512 if chunked else max(declared_len, 2048),
        }
    if sc.family in ("vllm", "generic"):
        # V1: larger budgets on >= 70 GiB GPUs other than the A100; the LLM class
        # (offline) gets twice the server's token budget.
        tokens, seqs = vllm_batch_defaults(resolve_gpu(sc.gpu), offline=sc.kind in ("offline", "static"))
        return {"max_num_seqs": seqs, "max_num_batched_tokens": tokens}
    if sc.family == "sglang":
        return dict(_SGLANG_DEFAULTS)
    if sc.family == "lmdeploy":  # benchmark scripts raise max_batch_size to the concurrency
        d = dict(_LMDEPLOY_DEFAULTS)
        d["max_num_seqs"] = max(d["max_num_seqs"], float(sc.concurrency or 0))
        return d
    return dict(_TRTLLM_DEFAULTS)


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
    tokens; raises ``ValueError`` if the engine would refuse the configuration."""
    flags = dict(sc.engine_flags)
    declared_len = int(flags.get("max_model_len", sc.native_max_len))
    sched = _scheduler_defaults(sc, declared_len)
    sched.update({k: v for k, v in flags.items() if k in sched or k == "enable_chunked_prefill"})
    chunked = bool(sched.get("enable_chunked_prefill", 1.0))
    max_model_len = min(max_total_len, resolve_model(sc.model).max_position_embeddings)
    batched = int(sched["max_num_batched_tokens"])
    eager = bool(flags.get("enforce_eager", 0.0))
    config = EngineConfig(
        model=sc.model,
        engine_family=sc.family,
        gpu=sc.gpu,
        tensor_parallel_size=sc.tp,
        max_model_len=max_model_len,
        gpu_memory_utilization=flags.get("gpu_memory_utilization", 0.9),
        max_num_batched_tokens=batched if chunked else max(batched, max_model_len),
        max_num_seqs=int(sched["max_num_seqs"]),
        enable_prefix_caching=False,  # no prompt shares a prefix: skip the hashing
        enable_chunked_prefill=chunked,
        enforce_eager=eager,
        quantization=sc.quantization,
        kv_cache_dtype=sc.kv_cache_dtype,
        offline=not sc.via_server,  # offline: no API server costs
    )
    if "kv_free" in sched:
        config = _size_like_trtllm(sc, config, sched, flags)
    itl = any(m.metric == "itl_ms" for m in sc.measurements)
    return Engine(config, record_token_times=itl)


def _size_like_trtllm(
    sc: Scenario, config: EngineConfig, sched: dict[str, float], flags: dict[str, float]
) -> EngineConfig:
    """KV cache and batch limits of TRT-LLM and LMDeploy: the cache is a fraction of the
    memory left after weights and activations (old TurboMind: a count of 128-token
    blocks); TRT-LLM admits a request only with room for its whole sequence
    (GUARANTEED_NO_EVICT), and trtllm-bench sizes the batch from the workload."""
    model, gpu = resolve_model(sc.model), resolve_gpu(sc.gpu)
    seqs, tokens = int(sched["max_num_seqs"]), int(sched["max_num_batched_tokens"])
    block_bytes = kv_bytes_per_token(model, sc.tp, sc.kv_cache_dtype) * config.block_size
    free = (
        gpu.hbm_bytes
        - weight_bytes_per_rank(model, sc.tp, sc.quantization)
        - activation_reserve_bytes(model, sc.tp, min(tokens, 8192), seqs)
    )
    entries = flags.get("cache_max_entry_count", sched["kv_free"])
    if entries > 1:
        blocks = int(entries * 128 // config.block_size)
    else:
        blocks = max(0, int(entries * free // block_bytes))
    config = dataclasses.replace(config, num_gpu_blocks_override=blocks)
    if sc.family != "trtllm":
        return config
    kv_tokens = blocks * config.block_size
    if sc.kind == "offline":
        bs, tok = _trtllm_bench_sizes(sc, kv_tokens)
        seqs = seqs if "max_num_seqs" in flags else bs
        tokens = tokens if "max_num_batched_tokens" in flags else tok
    fit = max(1, int(kv_tokens // (sc.input_len.mean + sc.output_len.mean)))
    return dataclasses.replace(config, max_num_seqs=min(seqs, fit), max_num_batched_tokens=tokens)
