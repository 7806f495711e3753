"""Roofline step-time model: how long one engine step takes on the GPU plus host overheads.

A step runs sequences *i*, each with ``q_i`` new tokens over ``c_i`` cached context
tokens (T = Σ q_i). Per layer and TP rank: GEMM FLOPs ``2·T·P_layer/t`` against the layer
weights read once; attention FLOPs ``Σ 4·heads·head_dim·q_i·(c_i + (q_i+1)/2)/t`` against
the KV bytes read; each operator's time is the soft knee ``sqrt(t_compute² + t_memory²)``.
Then elementwise work, two ring all-reduces of the hidden state per layer under TP
(``α + 2·(t−1)/t · bytes / bus_bandwidth``, which is ``α + bytes/bus_bandwidth`` at t = 2),
the LM head for sequences that emit a token, a sampler, and per-step and per-sequence host
costs; when serving, the API server's cost for every token it streams. Every calibration
constant lives in ``Efficiencies`` (one set per engine family: ``families.FAMILY_RULES``);
the fixed per-request front-end cost (``api_overhead_s``) is applied by the engine before
a request queues.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import mul
from pathlib import Path
from typing import Any, Protocol

from inferlab._errors import ConfigError, UsageError
from inferlab.sim.engine.dtypes import DType, KVCacheDType, Quantization
from inferlab.sim.engine.hardware import GpuSpec, ModelSpec

_GIB = 2**30
_ACT_BYTES = 2  # activations, LM head and embedding stay bf16 under every quantization
_INT4_BYTES_PER_WEIGHT = 0.52  # 4-bit weights + fp16 group-128 scales/zeros
# No kernel streams faster than a copy: published copy benchmarks (recalled, not measured
# here) reach ~0.92 of datasheet bandwidth on GDDR cards, the ceiling for their scaled
# streaming shares (``GpuSpec.stream_factor``).
_STREAM_CEILING = 0.92


@dataclass(frozen=True)
class Efficiencies:
    """Achieved fractions of peak and fixed costs; the model's only calibration constants."""

    # bf16 cuBLAS GEMMs at large T: 0.6–0.8 of dense peak (the literature); 0.60 fitted on
    # the fit rows of bench/data, every family at once (docs/validation.md, "GEMMs' share of peak")
    gemm_compute: float = 0.60
    gemm_compute_w8a8: float = 0.65  # fp8/int8 W8A8 GEMMs: 0.6–0.8 of their (2x) peak
    int4_compute_factor: float = 0.80  # Marlin int4 at large batch: 0.7–0.9 of bf16 GEMM rate
    weight_stream: float = 0.75  # GEMV weight streaming: 0.7–0.9 of HBM bandwidth (vLLM CI fit)
    # A one-token row's GEMM work (a decode, and every row of the LM head) as a fraction
    # of the layer GEMMs' peak, where the kernels for a few rows reuse nothing across a
    # batch: llama.cpp on one CPU thread pays each decode in a batch of 8 as much as one
    # alone. 0: such rows run at ``gemm_compute`` (GPUs, where they are bound by weight
    # streaming instead and a batch shares the weights).
    decode_compute: float = 0.0
    int4_stream_factor: float = 0.70  # int4 dequant kernels stream at ~0.7 of bf16's efficiency
    w8_stream_factor: float = 0.85  # fp8/int8 small-batch GEMMs stream at ~0.85 of bf16's
    attention_compute: float = 0.60  # flash-attention prefill: 0.55–0.75 of bf16 peak
    kv_stream: float = 0.75  # paged decode attention reads KV at 0.6–0.85 of bandwidth
    activation_stream: float = 0.70  # elementwise/activation traffic: 0.6–0.8 of bandwidth
    elementwise_per_layer_s: float = 20e-6  # norms, rope, act, residual: 15–30 µs/layer small T
    allreduce_latency_s: float = 10e-6  # custom all-reduce / NCCL small message: 5–20 µs
    # ... between cards without peer-to-peer access (GeForce), through host memory, times
    # the ring's 2(t-1)/t: fitted on IOG's multi-RTX-4090 rows at 1 req/s (bench/fit_no_p2p.py)
    allreduce_latency_no_p2p_s: float = 68e-6
    allreduce_bus: float = 0.75  # achieved fraction of per-direction link bandwidth: 0.6–0.85
    sampler_s: float = 100e-6  # sampling kernels + GPU→CPU sync: 50–200 µs per step
    cpu_step_s: float = 0.7e-3  # vLLM V1 host cost per step with CUDA graphs: 0.5–1 ms
    cpu_step_eager_s: float = 2.0e-3  # the same without CUDA graphs / older engines: ~2 ms
    eager_launch_per_layer_s: float = 30e-6  # eager launch gaps: ~10 kernels x 3 µs per layer
    per_seq_s: float = 5e-6  # host cost per scheduled sequence (inputs, outputs): 1–10 µs (vLLM V1: 20, ``families``)
    # Mixture of experts: the fused expert GEMMs (one grouped kernel over every expert a
    # step's tokens chose) run at this fraction of the dense GEMMs' rate, computing and
    # streaming weights alike; routing (top-k softmax, sorting tokens by expert) and the
    # second kernel launch cost a fixed time per MoE layer.
    moe_gemm_factor: float = 0.80
    moe_routing_per_layer_s: float = 15e-6
    # Serving over HTTP, per sequence that streams a token: the API server detokenizes and
    # writes an SSE chunk (tens of µs of Python, an estimate). Fit: ITL rising 0.15-0.19 ms per extra
    # stream at small batch (vLLM 0.11, SGLang 0.3/0.4), TPOT 2x the GPU's at 600-1000
    # streams (vLLM 0.9-0.11); offline runs (--rate inf) have no API server.
    api_per_seq_s: float = 45e-6
    reserve_fixed_bytes: float = 1.5 * _GIB  # CUDA context, NCCL, CUDA graphs: 1–2 GiB per GPU
    # per request before it queues (HTTP, template, tokenize, IPC) and on the way back:
    # published low-load TTFTs of vLLM V1 sit 33 ms (0.19, Qwen3-0.6B, 16 req/s) to
    # 46 ms (0.11, Qwen3-8B, one to four users) above prefill + scheduling alone: 40 ms
    api_overhead_s: float = 0.040
    # CPU the API front end spends accepting one request (HTTP, validation, template,
    # tokenization), one request at a time: a burst queues at the door. 0: not modelled
    # (the front-end processes of vLLM >= 0.6, SGLang, TRT-LLM keep up with the rates
    # measured); vLLM <= 0.5 ran it in the engine's own process, see ``vllm-v0.5``.
    api_intake_s: float = 0.0
    # The same front end's CPU per prompt token (tokenization) and per streamed token
    # (detokenization, SSE framing) when it runs as its own resource (``frontend``):
    # 0 for families whose streaming cost is charged to the engine step instead
    # (``api_per_seq_s``). Fitted for vLLM V1 in ``families``.
    api_intake_per_token_s: float = 0.0
    api_stream_s: float = 0.0
    # ... and per engine step that emits tokens, whatever their number (the API server
    # takes each step's outputs as one message: receives, decodes and counts them in its
    # metrics before it streams any; ``bench/vllm_front_end_cost.py``)
    api_stream_per_step_s: float = 0.0


DEFAULT_EFFICIENCIES = Efficiencies()  # the defaults; vLLM V1 replaces its front end and per_seq_s (``families``)

#: The key of an efficiencies file that is no constant: ``sim calibrate``'s record of how
#: well the constants predicted (``sim.engine.bands.calibrated_bands`` reads it).
CALIBRATION_KEY = "calibration"


def efficiencies_json(path: str | Path) -> dict[str, Any]:
    """An efficiencies file as written: ``{field: number}``, and a ``calibration``
    record where ``sim calibrate`` wrote it."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"cannot read efficiencies file {path}: {e}") from e
    if not isinstance(data, dict):
        raise UsageError(f"{path}: efficiencies must be a JSON object")
    return data


def load_efficiencies(path: str | Path, base: Efficiencies = DEFAULT_EFFICIENCIES) -> Efficiencies:
    """``base`` (the defaults) overridden by a JSON object of ``{field: number}`` (its
    ``calibration`` record, if any, set aside).

    Raises ``UsageError`` for an unreadable file, an unknown field or a non-number.
    """
    data = {k: v for k, v in efficiencies_json(path).items() if k != CALIBRATION_KEY}
    known = {f.name for f in dataclasses.fields(Efficiencies)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UsageError(f"{path}: unknown efficiencies {unknown}; known: {sorted(known)}")
    bad = [k for k, v in data.items() if isinstance(v, bool) or not isinstance(v, (int, float))]
    if bad:
        raise UsageError(f"{path}: efficiencies must be numbers: {bad}")
    return dataclasses.replace(base, **{k: float(v) for k, v in data.items()})


class StepTimeModel(Protocol):
    """The seam between scheduling and cost: one engine step's duration."""

    def step_time_s(self, seqs: Sequence[tuple[int, int]], emitting: int) -> float:
        """Seconds for a step over ``(new tokens q_i, cached context c_i)`` per sequence,
        of which ``emitting`` sequences produce a token."""
        ...


@dataclass(frozen=True)
class Precision:
    """What a weight/KV dtype choice means for bytes and compute."""

    bytes_per_weight: float
    gemm_flops_per_s: float  # peak the layer GEMMs run at
    gemm_compute: float  # fraction of that peak reached at large T
    weight_stream: float  # fraction of HBM bandwidth reached streaming layer weights
    kv_bytes: int  # bytes per KV element


# bytes a layer weight takes: int4 is 4-bit weights + fp16 group-128 scales/zeros
_BYTES_PER_WEIGHT: dict[Quantization, float] = {
    Quantization.NONE: float(_ACT_BYTES),
    Quantization.FP8: 1.0,
    Quantization.INT8: 1.0,
    Quantization.W8A16: 1.0,
    Quantization.AWQ: _INT4_BYTES_PER_WEIGHT,
    Quantization.GPTQ: _INT4_BYTES_PER_WEIGHT,
}
_KV_BYTES: dict[KVCacheDType, int] = {KVCacheDType.AUTO: _ACT_BYTES, KVCacheDType.FP8: 1}


def resolve_precision(
    gpu: GpuSpec,
    dtype: DType = DType.AUTO,
    quantization: Quantization | None = None,
    kv_cache_dtype: KVCacheDType = KVCacheDType.AUTO,
    eff: Efficiencies = DEFAULT_EFFICIENCIES,
) -> Precision:
    """Bytes and peaks for the engine's data types (``quantization`` None: unquantized).
    bf16 and fp16 (``dtype``) cost the same."""
    q = quantization or Quantization.NONE
    bpw = _BYTES_PER_WEIGHT[q]
    kv = _KV_BYTES[kv_cache_dtype]
    w8_stream = eff.weight_stream * eff.w8_stream_factor
    if q is Quantization.FP8 and gpu.fp8_flops_per_s is not None:
        return Precision(bpw, gpu.fp8_flops_per_s, eff.gemm_compute_w8a8, w8_stream, kv)
    if q is Quantization.INT8:
        return Precision(bpw, gpu.int8_ops_per_s, eff.gemm_compute_w8a8, w8_stream, kv)
    if q is Quantization.W8A16:  # 8-bit weights dequantized into bf16 GEMMs (GPTQ-Int8)
        return Precision(bpw, gpu.bf16_flops_per_s, eff.gemm_compute, w8_stream, kv)
    if q.is_int4:
        return Precision(
            bpw,
            gpu.bf16_flops_per_s,
            eff.gemm_compute * eff.int4_compute_factor,
            eff.weight_stream * eff.int4_stream_factor,
            kv,
        )
    # bf16/fp16, and fp8 weights on GPUs without fp8 tensor cores (weight-only, bf16 math)
    return Precision(bpw, gpu.bf16_flops_per_s, eff.gemm_compute, eff.weight_stream, kv)


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """KV heads each rank holds; heads are replicated when ``tp`` exceeds their number."""
    return max(1, model.num_kv_heads // tp)


def kv_bytes_per_token(model: ModelSpec, tp: int, kv_cache_dtype: KVCacheDType = KVCacheDType.AUTO) -> int:
    """KV-cache bytes one token occupies on one TP rank (K and V, all layers)."""
    kv = _KV_BYTES[kv_cache_dtype]
    return 2 * model.num_layers * kv_heads_per_rank(model, tp) * model.head_dim * kv


def weight_bytes_per_rank(model: ModelSpec, tp: int, quantization: Quantization | None = None) -> float:
    """Weight bytes on one TP rank (``quantization`` None: unquantized); embedding and
    LM head stay bf16 and are vocab-sharded."""
    layers = model.num_layers * model.params_per_layer * _BYTES_PER_WEIGHT[quantization or Quantization.NONE]
    lm_head = 0 if model.tie_word_embeddings else model.embedding_params
    return (layers + (model.embedding_params + lm_head) * _ACT_BYTES) / tp


def activation_reserve_bytes(
    model: ModelSpec,
    tp: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    eff: Efficiencies = DEFAULT_EFFICIENCIES,
) -> float:
    """Memory kept out of the KV cache: fixed reserve plus a profile-run activation peak
    (hidden states and the gate/up output of the widest layer for a full token budget;
    in a MoE layer, k gate/up outputs per token and its k permuted hidden states; fp32
    logits and probabilities for ``max_num_seqs`` sampled sequences)."""
    h, k = model.hidden_size, model.experts_per_token
    widest = model.intermediate_size if model.moe_layers < model.num_layers else 0
    if model.num_experts:
        widest = max(widest, k * model.expert_intermediate_size + model.shared_intermediate_size)
    per_token = _ACT_BYTES * (4 * h + 2 * widest / tp + (k * h if model.num_experts else 0))
    logits = max_num_seqs * model.vocab_size * 4 * 2
    return eff.reserve_fixed_bytes + max_num_batched_tokens * per_token + logits


def check_tensor_parallel(model: ModelSpec, tp: int) -> None:
    """Raise ``ConfigError`` unless ``tp`` splits the attention heads evenly."""
    if tp < 1 or model.num_heads % tp:
        raise ConfigError(
            f"Total number of attention heads ({model.num_heads}) must be divisible "
            f"by tensor parallel size ({tp})."
        )


def _knee(t_compute_s: float, t_memory_s: float) -> float:
    return math.sqrt(t_compute_s * t_compute_s + t_memory_s * t_memory_s)


class RooflineStepTime:
    """``StepTimeModel`` from model shapes, GPU peaks and ``Efficiencies`` (see module doc).

    ``tp`` must divide the attention heads (``ConfigError``, as vLLM says it).
    """

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        tp: int = 1,
        dtype: DType = DType.AUTO,
        quantization: Quantization | None = None,
        kv_cache_dtype: KVCacheDType = KVCacheDType.AUTO,
        enforce_eager: bool = False,
        efficiencies: Efficiencies = DEFAULT_EFFICIENCIES,
        serving: bool = True,
    ) -> None:
        """``serving``: requests come through an API server that streams every token
        (``api_per_seq_s``); False for offline runs."""
        check_tensor_parallel(model, tp)
        eff = efficiencies
        p = resolve_precision(gpu, dtype, quantization, kv_cache_dtype, eff)
        h, inter, hd = model.hidden_size, model.mlp_width_per_token, model.head_dim
        heads, kv_heads = model.num_heads // tp, kv_heads_per_rank(model, tp)
        bw = gpu.hbm_bytes_per_s
        if gpu.stream_factor != 1.0:  # GDDR cards and H200: each streaming share scaled, below the copy ceiling
            f = gpu.stream_factor

            def scaled(share: float) -> float:
                return min(share * f, _STREAM_CEILING)

            p = dataclasses.replace(p, weight_stream=scaled(p.weight_stream))
            eff = dataclasses.replace(
                eff,
                weight_stream=scaled(eff.weight_stream),
                kv_stream=scaled(eff.kv_stream),
                activation_stream=scaled(eff.activation_stream),
            )
        self.model, self.gpu, self.tp, self.precision, self.eff = model, gpu, tp, p, eff
        self.num_layers = model.num_layers
        # GEMMs, per layer: seconds per token of compute, fixed seconds for the weights,
        # seconds per token of activation traffic (inputs and outputs of the 4 GEMMs).
        # Routed experts (mean per layer): a token computes through experts_per_token of
        # them; a step reads the weights of every expert at least one of its T tokens
        # chose, E·(1 − (1 − k/E)^T) of E in expectation.
        routed = model.routed_params_per_layer
        dense = model.params_per_layer - routed
        flops = p.gemm_flops_per_s * p.gemm_compute
        stream = bw * p.weight_stream
        moe = eff.moe_gemm_factor
        gemm_flops_per_token = 2 * (dense + routed / moe * model.experts_per_token / max(1, model.num_experts)) / tp
        self._gemm_s_per_token = gemm_flops_per_token / flops
        # one-token rows (q = 1) at ``decode_compute``: the extra over a GEMM row
        self._single_extra_s = (
            gemm_flops_per_token / (p.gemm_flops_per_s * eff.decode_compute) - self._gemm_s_per_token
            if eff.decode_compute else 0.0
        )
        self._weights_s = dense * p.bytes_per_weight / tp / stream
        self._experts_s = routed * p.bytes_per_weight / tp / (stream * moe)
        self._expert_missed = 1 - model.experts_per_token / model.num_experts if model.num_experts else 1.0
        # tokens permuted into expert order and back: k copies of the hidden state each way
        permute = 2 * model.experts_per_token * h if model.num_experts else 0
        gemm_act_elems = 4 * h + ((heads + 2 * kv_heads) * hd + heads * hd + 3 * inter / tp) + permute
        act_bw = bw * eff.activation_stream
        self._gemm_act_s_per_token = _ACT_BYTES * gemm_act_elems / act_bw
        self._routing_s = eff.moe_routing_per_layer_s * model.moe_layers / model.num_layers
        # Attention: compute per unit of Σ q_i·(c_i + (q_i+1)/2), memory per KV token touched.
        self._attn_s_per_unit = 4 * heads * hd / (gpu.bf16_flops_per_s * eff.attention_compute)
        self._kv_s_per_token = 2 * kv_heads * hd * p.kv_bytes / (bw * eff.kv_stream)
        # Elementwise: 2 norms, 2 residual adds, rope on q/k, SiLU-and-mul.
        ew_elems = 10 * h + 2 * (heads + kv_heads) * hd + 3 * inter / tp
        self._ew_s_per_token = _ACT_BYTES * ew_elems / act_bw
        # Two ring all-reduces of the hidden state per layer.
        ring = 2 * (tp - 1) / tp
        self._ar_latency_s = eff.allreduce_latency_s if gpu.peer_to_peer else eff.allreduce_latency_no_p2p_s * ring
        self._ar_s_per_token = ring * _ACT_BYTES * h / (gpu.bus_bytes_per_s * eff.allreduce_bus)
        # LM head (bf16 whatever the quantization) and sampler over fp32 logits.
        vocab = model.vocab_size
        self._lm_s_per_seq = 2 * h * vocab / tp / (gpu.bf16_flops_per_s * (eff.decode_compute or eff.gemm_compute))
        self._lm_weights_s = h * vocab * _ACT_BYTES / tp / (bw * eff.weight_stream)
        self._sampler_s_per_seq = 3 * vocab * 4 / act_bw
        self._host_step_s = eff.cpu_step_eager_s if enforce_eager else eff.cpu_step_s
        self._eager_layer_s = eff.eager_launch_per_layer_s if enforce_eager else 0.0
        self._stream_s_per_seq = eff.api_per_seq_s if serving else 0.0

    @property
    def host_costs(self) -> tuple[float, float]:
        """The engine core's host time per step and per scheduled sequence, in seconds
        (CUDA graphs or eager as configured): what ``scheduling_s`` charges."""
        return self._host_step_s, self.eff.per_seq_s

    def scheduling_s(self, num_seqs: int) -> float:
        """The host part of a step that multi-step scheduling pays once per group
        (scheduling and input preparation): the per-step and per-sequence host costs."""
        return self._host_step_s + num_seqs * self.eff.per_seq_s

    def step_time_s(
        self, seqs: Sequence[tuple[int, int]], emitting: int, decodes: int = 0, decode_context: int = 0
    ) -> float:
        """Seconds for one step; see the module docstring for the model. ``decodes`` more
        sequences of one new token each, over ``decode_context`` cached tokens in all,
        may be given as sums instead of in ``seqs`` (the same result)."""
        if not seqs and not decodes:
            return 0.0
        # (sums in C: this runs once per step over every sequence)
        qs, cs = zip(*seqs, strict=True) if seqs else ((), ())
        tokens = sum(qs) + decodes
        context = sum(cs) + decode_context
        # Σ q·(c + (q+1)/2), exactly, from integer sums
        attn_units = (2 * (sum(map(mul, qs, cs)) + decode_context) + sum(map(mul, qs, qs)) + decodes + tokens) / 2
        eff = self.eff
        weights = self._weights_s
        if self._experts_s:
            weights += self._experts_s * (1 - self._expert_missed**tokens)
        compute = tokens * self._gemm_s_per_token
        if self._single_extra_s:
            compute += (qs.count(1) + decodes) * self._single_extra_s
        gemm = _knee(compute, weights + tokens * self._gemm_act_s_per_token)
        # KV read for cached context plus the new tokens' K/V written and attended to.
        attention = _knee(
            attn_units * self._attn_s_per_unit, (context + tokens) * self._kv_s_per_token
        )
        elementwise = _knee(eff.elementwise_per_layer_s, tokens * self._ew_s_per_token)
        layer = gemm + attention + elementwise + self._eager_layer_s + self._routing_s
        if self.tp > 1:
            layer += 2 * (self._ar_latency_s + tokens * self._ar_s_per_token)
        total = self.num_layers * layer
        if emitting > 0:
            total += _knee(emitting * self._lm_s_per_seq, self._lm_weights_s)
            total += eff.sampler_s + emitting * (self._sampler_s_per_seq + self._stream_s_per_seq)
        return total + self.scheduling_s(len(seqs) + decodes)
