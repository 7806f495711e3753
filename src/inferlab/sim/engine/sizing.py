"""Engine sizing: what memory leaves for the KV cache, and the scheduler sizes and API
costs a configuration leaves to the engine family, resolved once before the engine runs.

vLLM's way: ``gpu_memory_utilization`` of the GPU, less the weights and a profile run's
activations, in KV blocks. TRT-LLM and LMDeploy give the KV cache a share of what the
weights and activations leave (``FamilyRules.kv_free_fraction``). Every byte count is per
tensor-parallel rank.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from inferlab._errors import ConfigError
from inferlab.sim.engine.config import EngineConfig, ResolvedConfig
from inferlab.sim.engine.frontend import NO_FRONT_END, FrontEndCosts
from inferlab.sim.engine.steptime import (
    activation_reserve_bytes,
    kv_bytes_per_token,
    weight_bytes_per_rank,
)

_GIB = 2**30
# the profile run that sizes activations when the KV cache takes a share of what is left
# (TRT-LLM, LMDeploy) holds at most this many tokens
_FREE_FRACTION_PROFILE_TOKENS = 8192


@dataclass(frozen=True)
class EngineSizes:
    """An engine's resolved memory, scheduler sizes and API costs."""

    weight_bytes: float  # per TP rank
    reserve_bytes: float  # activations and fixed reserve kept out of the KV cache, per rank
    num_kv_blocks: int  # blocks that hold tokens (vLLM V1's null block left out)
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    api_overhead_s: float  # per request, before it can be scheduled (0 offline)
    api_intake_s: float  # front-end CPU per request, one at a time (0 offline or not modelled)
    # the API server as its own resource (``frontend``): its latency and CPU costs at host
    # speed 1.0 (all 0 offline; no intake when the front end runs in the engine's process)
    front_end: FrontEndCosts = NO_FRONT_END

    def applied_to(self, config: EngineConfig) -> EngineConfig:
        """``config`` with every size and the API cost it left open filled in."""
        return dataclasses.replace(
            config, max_model_len=self.max_model_len, max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs, api_overhead_s=self.api_overhead_s,
        )


def size_engine(resolved: ResolvedConfig) -> EngineSizes:
    """Size the engine ``resolved`` describes: flags given win; the rest from its family's
    defaults and what memory holds.

    Raises ``ConfigError`` as vLLM refuses to start: weights that do not fit, no room for
    one KV block, sizes that contradict each other, or a ``max_model_len`` the KV cache
    cannot hold.
    """
    config, model, gpu, eff = resolved.config, resolved.model, resolved.gpu, resolved.efficiencies
    tp = config.tensor_parallel_size
    chunked = config.enable_chunked_prefill
    assert chunked is not None  # (``resolve`` sets every switch)
    batched, seqs = resolved.rules.batch_defaults(
        gpu, offline=config.offline, chunked_prefill=chunked, max_model_len=resolved.declared_len
    )
    batched = config.max_num_batched_tokens or batched
    if config.max_num_seqs is not None:
        seqs = config.max_num_seqs
    elif not resolved.rules.budget_bounds_decodes:
        pass  # (the budget bounds prompt chunks only: no relation to the cap)
    elif resolved.rules.default_seqs_follow_budget:
        seqs = min(seqs, batched)
    elif batched < seqs:  # vLLM keeps its default cap and refuses the budget
        raise ConfigError(
            f"max_num_batched_tokens ({batched}) must be greater than or equal to max_num_seqs "
            f"({seqs}, {config.engine_family}'s default on {gpu.name}): give --max-num-seqs too"
        )

    # TensorRT-LLM and LMDeploy take the whole card and give the KV cache a share of what
    # weights and activations leave (``kv_cache_free_fraction``); vLLM and SGLang a share of
    # the card for all three (``gpu_memory_utilization``)
    free_share = config.kv_cache_free_fraction is not None or resolved.rules.kv_free_fraction is not None
    usable = gpu.hbm_bytes if free_share else config.gpu_memory_utilization * gpu.hbm_bytes
    allows = (f"the {usable / _GIB:.1f} GiB of {gpu.name}" if free_share else
              f"the {usable / _GIB:.1f} GiB gpu_memory_utilization={config.gpu_memory_utilization} allows on {gpu.name}")
    weights = weight_bytes_per_rank(model, tp, config.quantization)
    if weights >= usable:
        raise ConfigError(
            f"{model.name} weights need {weights / _GIB:.1f} GiB per GPU, more than {allows}; "
            "use a larger tensor_parallel_size, quantization or GPU."
        )
    block_bytes = kv_bytes_per_token(model, tp, config.kv_cache_dtype) * config.block_size
    free_fraction = config.kv_cache_free_fraction
    if free_fraction is None:
        free_fraction = resolved.rules.kv_free_fraction
    if free_fraction is None:
        reserve = activation_reserve_bytes(model, tp, batched, seqs, eff)
        num_blocks = int(max(0.0, usable - weights - reserve) // block_bytes)
    else:  # a share of what is left after weights and a profile run
        reserve = activation_reserve_bytes(model, tp, min(batched, _FREE_FRACTION_PROFILE_TOKENS), seqs, eff)
        num_blocks = max(0, int(free_fraction * (gpu.hbm_bytes - weights - reserve) // block_bytes))
    if config.num_gpu_blocks_override is not None:
        num_blocks = config.num_gpu_blocks_override
        if num_blocks * block_bytes > gpu.hbm_bytes - weights:  # (vLLM would fail to allocate them)
            raise ConfigError(
                f"num_gpu_blocks_override={num_blocks} needs {num_blocks * block_bytes / _GIB:,.1f} GiB of KV cache "
                f"per GPU, more than the {(gpu.hbm_bytes - weights) / _GIB:.1f} GiB {gpu.name} has beside "
                f"{model.name}'s weights"
            )
    if resolved.rules.null_block:  # (vLLM V1: one block is the null block, holding no tokens)
        num_blocks -= 1
    if num_blocks < 1 and config.num_gpu_blocks_override is not None:
        raise ConfigError(
            f"num_gpu_blocks_override={config.num_gpu_blocks_override} leaves no KV block for tokens"
            + (" (one is the null block)" if resolved.rules.null_block else "")
        )
    if num_blocks < 1:
        raise ConfigError(
            f"No available memory for the cache blocks: {model.name} weights take "
            f"{weights / _GIB:.1f} GiB and activations {reserve / _GIB:.1f} GiB of {allows}."
        )
    # the model's context when not given, as much of it as the cache holds
    max_len = config.max_model_len or min(model.max_position_embeddings, num_blocks * config.block_size)
    if config.max_num_batched_tokens is None:  # unchunked, the default budget holds one prompt; and all seqs
        batched = max(batched, seqs, 0 if chunked else max_len)
    api_s = config.api_overhead_s
    if api_s is None:  # offline (vLLM's LLM class) there is no API server
        api_s = 0.0 if config.offline else eff.api_overhead_s
    # the API front end accepts requests one at a time (offline: there is none)
    intake_s = 0.0 if config.offline else eff.api_intake_s
    serving = not config.offline
    in_process = resolved.rules.front_end_in_process
    front_end = FrontEndCosts(
        latency_s=api_s,
        intake_s=intake_s if serving and not in_process else 0.0,
        intake_per_token_s=eff.api_intake_per_token_s if serving and not in_process else 0.0,
        stream_per_token_s=eff.api_stream_s if serving else 0.0,
        stream_per_step_s=eff.api_stream_per_step_s if serving else 0.0,
    )
    _validate_sizes(batched, seqs, max_len, chunked, resolved.rules.budget_bounds_decodes)
    if num_blocks * config.block_size < max_len:
        raise ConfigError(
            f"The model's max seq len ({max_len}) is larger than the maximum "
            f"number of tokens that can be stored in KV cache "
            f"({num_blocks * config.block_size}). Try increasing "
            + ("kv_cache_free_fraction (--kv-cache-free-gpu-mem-fraction)" if free_share else "gpu_memory_utilization")
            + " or decreasing max_model_len when initializing the engine."
        )
    return EngineSizes(weights, reserve, num_blocks, max_len, batched, seqs, api_s, intake_s, front_end)


def _validate_sizes(
    max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int, chunked: bool, budget_bounds_decodes: bool = True
) -> None:
    """Raise ``ConfigError`` for resolved scheduler sizes vLLM rejects (a budget below
    the sequence cap only where the budget bounds decodes too)."""
    if budget_bounds_decodes and max_num_batched_tokens < max_num_seqs:
        raise ConfigError(
            f"max_num_batched_tokens ({max_num_batched_tokens}) must be greater than or "
            f"equal to max_num_seqs ({max_num_seqs})."
        )
    if not chunked and max_num_batched_tokens < max_model_len:
        raise ConfigError(
            f"max_num_batched_tokens ({max_num_batched_tokens}) is smaller than "
            f"max_model_len ({max_model_len}). This effectively limits the maximum "
            "sequence length to max_num_batched_tokens and makes the engine reject longer "
            "sequences. Please increase max_num_batched_tokens or decrease max_model_len."
        )


def trtllm_bench_sizes(isl: float, osl: float, kv_tokens: int) -> tuple[int, int]:
    """trtllm-bench's max_batch_size / max_num_tokens heuristic for a workload of mean
    prompt ``isl`` and answer ``osl`` tokens and a KV cache of ``kv_tokens``: the batch
    the cache holds whole (at most 4,096), rounded up; the tokens that batch computes a
    step, rounded up (at least 2,048, at most 32,768)."""
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
