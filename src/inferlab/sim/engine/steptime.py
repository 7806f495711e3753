"""Roofline step-time model: how long one engine step takes on the GPU plus host overheads.

A step runs sequences *i*, each with ``q_i`` new tokens over ``c_i`` cached context
tokens (T = Σ q_i). Per layer and TP rank: GEMM FLOPs ``2·T·P_layer/t`` against the layer
weights read once; attention FLOPs ``Σ 4·heads·head_dim·q_i·(c_i + (q_i+1)/2)/t`` against
the KV bytes read; each operator's time is the soft knee ``sqrt(t_compute² + t_memory²)``.
Then elementwise work, two ring all-reduces of the hidden state per layer under TP
(``α + 2·(t−1)/t · bytes / bus_bandwidth``, which is ``α + bytes/bus_bandwidth`` at t = 2),
the LM head for sequences that emit a token, a sampler, and per-step and per-sequence host
costs; when serving, the API server's cost for every token it streams. Every calibration
constant lives in ``Efficiencies`` (with one override set per engine family); the fixed
per-request front-end cost (``api_overhead_s``) is applied by the engine before a request
queues.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import mul
from pathlib import Path
from typing import Protocol

from inferlab._errors import UsageError
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

    gemm_compute: float = 0.70  # bf16 cuBLAS GEMMs at large T: 0.6–0.8 of dense peak
    gemm_compute_w8a8: float = 0.65  # fp8/int8 W8A8 GEMMs: 0.6–0.8 of their (2x) peak
    int4_compute_factor: float = 0.80  # Marlin int4 at large batch: 0.7–0.9 of bf16 GEMM rate
    weight_stream: float = 0.75  # GEMV weight streaming: 0.7–0.9 of HBM bandwidth (vLLM CI fit)
    int4_stream_factor: float = 0.70  # int4 dequant kernels stream at ~0.7 of bf16's efficiency
    w8_stream_factor: float = 0.85  # fp8/int8 small-batch GEMMs stream at ~0.85 of bf16's
    attention_compute: float = 0.60  # flash-attention prefill: 0.55–0.75 of bf16 peak
    kv_stream: float = 0.75  # paged decode attention reads KV at 0.6–0.85 of bandwidth
    activation_stream: float = 0.70  # elementwise/activation traffic: 0.6–0.8 of bandwidth
    elementwise_per_layer_s: float = 20e-6  # norms, rope, act, residual: 15–30 µs/layer small T
    allreduce_latency_s: float = 10e-6  # custom all-reduce / NCCL small message: 5–20 µs
    allreduce_bus: float = 0.75  # achieved fraction of per-direction link bandwidth: 0.6–0.85
    sampler_s: float = 100e-6  # sampling kernels + GPU→CPU sync: 50–200 µs per step
    cpu_step_s: float = 0.7e-3  # vLLM V1 host cost per step with CUDA graphs: 0.5–1 ms
    cpu_step_eager_s: float = 2.0e-3  # the same without CUDA graphs / older engines: ~2 ms
    eager_launch_per_layer_s: float = 30e-6  # eager launch gaps: ~10 kernels x 3 µs per layer
    per_seq_s: float = 5e-6  # host cost per scheduled sequence (inputs, outputs): 1–10 µs
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


DEFAULT_EFFICIENCIES = Efficiencies()


# One Efficiencies override set per engine family; every row of a family uses it. The
# defaults in ``Efficiencies`` are vLLM V1's (CUDA graphs, ~0.7 ms host cost per step).
FAMILY_EFFICIENCIES: dict[str, dict[str, float]] = {
    "vllm": {},
    # vLLM V0 (< 0.8): scheduling, input preparation and output processing run between
    # GPU steps in the engine process (no overlap), about twice V1's host cost per step;
    # its API server path adds ~28 ms before a request is scheduled (fit: vLLM's own CI,
    # Llama-3-70B TP4 at 1 req/s on H100 and H200, mean TTFT 62.4 / 65.9 ms against
    # 39.0 / 32.2 ms of prefill and scheduling alone: offsets of 23.5 and 33.7 ms, whose
    # least-squares fit in relative error is 28.3 ms).
    "vllm-v0": {"cpu_step_s": 1.5e-3, "api_overhead_s": 0.028},
    # vLLM <= 0.5: the same engine with the OpenAI server in its own process and event
    # loop (vLLM's v0.6.0 post: 33 % of 0.5.3's time went to the HTTP server). Accepting
    # a request stalls the engine loop: a burst of 1,280 requests got its first token
    # after 3.26 s on an H100 (Lambda's 0.5.4 runs), 2.5 ms per request.
    "vllm-v0.5": {"cpu_step_s": 1.5e-3, "api_overhead_s": 0.028, "api_intake_s": 2.5e-3},
    # SGLang: the overlap scheduler hides most host work behind the GPU step (and makes
    # an arrival wait one step more, modelled in the engine: ``overlap_schedule``);
    # low-load TTFTs sit 6-19 ms (0.3, A100/H100, no overlap), 10 ms (0.5, H100) and
    # ~40 ms (0.4, H200 TP4; ~28 ms beyond the overlap step) above prefill + scheduling:
    # median ~15 ms.
    "sglang": {"cpu_step_s": 0.3e-3, "api_overhead_s": 0.015},
    # TensorRT-LLM: C++ batch manager (~1 us per sequence), overlap scheduler, XQA decode
    # attention streaming the (fp8) KV cache closer to peak bandwidth.
    # Its fp8 GEMMs are tuned per shape and stream weights as well as bf16's.
    "trtllm": {
        "cpu_step_s": 0.3e-3,
        "per_seq_s": 1e-6,
        "kv_stream": 0.85,
        "w8_stream_factor": 1.0,
        "api_overhead_s": 0.015,
    },
    # LMDeploy TurboMind: C++ persistent batch, FasterTransformer-style decode attention;
    # its 2023-24 releases all-reduce through NCCL (no custom all-reduce): ~25 us each.
    "lmdeploy": {
        "cpu_step_s": 0.3e-3,
        "per_seq_s": 1e-6,
        "kv_stream": 0.85,
        "allreduce_latency_s": 25e-6,
        "api_overhead_s": 0.002,  # its benchmarks drive the engine in-process
        "api_per_seq_s": 0.0,
    },
    # Named engines without a set of their own (TGI, nano-vllm, ...): vLLM V1's, untuned.
    "generic": {},
}



def family_efficiencies(family: str) -> Efficiencies:
    """The constants of one engine family (``vllm`` = the defaults); ``UsageError`` for
    an unknown family."""
    if family not in FAMILY_EFFICIENCIES:
        raise UsageError(f"unknown engine family {family!r}; known: {', '.join(FAMILY_EFFICIENCIES)}")
    return dataclasses.replace(DEFAULT_EFFICIENCIES, **FAMILY_EFFICIENCIES[family])


def load_efficiencies(path: str | Path, base: Efficiencies = DEFAULT_EFFICIENCIES) -> Efficiencies:
    """``base`` (the defaults) overridden by a JSON object of ``{field: number}``.

    Raises ``UsageError`` for an unreadable file, an unknown field or a non-number.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"cannot read efficiencies file {path}: {e}") from e
    if not isinstance(data, dict):
        raise UsageError(f"{path}: efficiencies must be a JSON object")
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


_BF16_NAMES = ("auto", "bfloat16", "bf16", "float16", "fp16", "half")
_INT4_NAMES = ("awq", "gptq", "awq_marlin", "gptq_marlin")
#: the weight quantizations the model costs (``none``: unquantized)
QUANTIZATIONS = ("fp8", "int8", "w8a16", "awq", "gptq")
_KV_FP8_NAMES = ("fp8", "fp8_e4m3", "fp8_e5m2")


def _weight_bytes(quantization: str | None) -> float:
    q = (quantization or "none").lower()
    if q == "none":
        return float(_ACT_BYTES)
    if q in ("fp8", "int8", "w8a16"):
        return 1.0
    if q in _INT4_NAMES:
        return _INT4_BYTES_PER_WEIGHT
    raise UsageError(f"unknown quantization {quantization!r}; known: {', '.join(QUANTIZATIONS)}")


def _kv_bytes(kv_cache_dtype: str) -> int:
    if kv_cache_dtype.lower() == "auto":
        return _ACT_BYTES
    if kv_cache_dtype.lower() in _KV_FP8_NAMES:
        return 1
    raise UsageError(f"unknown kv_cache_dtype {kv_cache_dtype!r}; known: auto, fp8")


def resolve_precision(
    gpu: GpuSpec,
    dtype: str = "auto",
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
    eff: Efficiencies = DEFAULT_EFFICIENCIES,
) -> Precision:
    """Map engine dtype flags to bytes and peaks; raises ``UsageError`` for unknown names."""
    if dtype.lower() not in _BF16_NAMES:
        raise UsageError(f"unknown dtype {dtype!r}; known: auto, bfloat16, float16")
    q = (quantization or "none").lower()
    bpw = _weight_bytes(quantization)
    kv = _kv_bytes(kv_cache_dtype)
    if q == "fp8" and gpu.fp8_flops_per_s is not None:
        return Precision(bpw, gpu.fp8_flops_per_s, eff.gemm_compute_w8a8, eff.weight_stream * eff.w8_stream_factor, kv)
    if q == "int8":
        return Precision(bpw, gpu.int8_ops_per_s, eff.gemm_compute_w8a8, eff.weight_stream * eff.w8_stream_factor, kv)
    if q == "w8a16":  # 8-bit weights dequantized into bf16 GEMMs (GPTQ-Int8)
        return Precision(bpw, gpu.bf16_flops_per_s, eff.gemm_compute, eff.weight_stream * eff.w8_stream_factor, kv)
    if q in _INT4_NAMES:
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


def kv_bytes_per_token(model: ModelSpec, tp: int, kv_cache_dtype: str = "auto") -> int:
    """KV-cache bytes one token occupies on one TP rank (K and V, all layers)."""
    kv = _kv_bytes(kv_cache_dtype)
    return 2 * model.num_layers * kv_heads_per_rank(model, tp) * model.head_dim * kv


def weight_bytes_per_rank(model: ModelSpec, tp: int, quantization: str | None = None) -> float:
    """Weight bytes on one TP rank; embedding and LM head stay bf16 and are vocab-sharded."""
    layers = model.num_layers * model.params_per_layer * _weight_bytes(quantization)
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


def _knee(t_compute_s: float, t_memory_s: float) -> float:
    return math.sqrt(t_compute_s * t_compute_s + t_memory_s * t_memory_s)


class RooflineStepTime:
    """``StepTimeModel`` from model shapes, GPU peaks and ``Efficiencies`` (see module doc).

    ``tp`` must divide the attention heads. Raises ``UsageError`` for unknown dtype names.
    """

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        tp: int = 1,
        dtype: str = "auto",
        quantization: str | None = None,
        kv_cache_dtype: str = "auto",
        enforce_eager: bool = False,
        efficiencies: Efficiencies = DEFAULT_EFFICIENCIES,
        serving: bool = True,
    ) -> None:
        """``serving``: requests come through an API server that streams every token
        (``api_per_seq_s``); False for offline runs."""
        if tp < 1 or model.num_heads % tp:
            raise ValueError(
                f"Total number of attention heads ({model.num_heads}) must be divisible "
                f"by tensor parallel size ({tp})."
            )
        eff = efficiencies
        p = resolve_precision(gpu, dtype, quantization, kv_cache_dtype, eff)
        h, inter, hd = model.hidden_size, model.mlp_width_per_token, model.head_dim
        heads, kv_heads = model.num_heads // tp, kv_heads_per_rank(model, tp)
        bw = gpu.hbm_bytes_per_s
        if gpu.stream_factor != 1.0:  # GDDR cards: each streaming share scaled, below the copy ceiling
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
        self._gemm_s_per_token = 2 * (dense + routed / moe * model.experts_per_token / max(1, model.num_experts)) / tp / flops
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
        self._ar_s_per_token = ring * _ACT_BYTES * h / (gpu.bus_bytes_per_s * eff.allreduce_bus)
        # LM head (bf16 whatever the quantization) and sampler over fp32 logits.
        vocab = model.vocab_size
        self._lm_s_per_seq = 2 * h * vocab / tp / (gpu.bf16_flops_per_s * eff.gemm_compute)
        self._lm_weights_s = h * vocab * _ACT_BYTES / tp / (bw * eff.weight_stream)
        self._sampler_s_per_seq = 3 * vocab * 4 / act_bw
        self._host_step_s = eff.cpu_step_eager_s if enforce_eager else eff.cpu_step_s
        self._eager_layer_s = eff.eager_launch_per_layer_s if enforce_eager else 0.0
        self._stream_s_per_seq = eff.api_per_seq_s if serving else 0.0

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
        gemm = _knee(tokens * self._gemm_s_per_token, weights + tokens * self._gemm_act_s_per_token)
        # KV read for cached context plus the new tokens' K/V written and attended to.
        attention = _knee(
            attn_units * self._attn_s_per_unit, (context + tokens) * self._kv_s_per_token
        )
        elementwise = _knee(eff.elementwise_per_layer_s, tokens * self._ew_s_per_token)
        layer = gemm + attention + elementwise + self._eager_layer_s + self._routing_s
        if self.tp > 1:
            layer += 2 * (eff.allreduce_latency_s + tokens * self._ar_s_per_token)
        total = self.num_layers * layer
        if emitting > 0:
            total += _knee(emitting * self._lm_s_per_seq, self._lm_weights_s)
            total += eff.sampler_s + emitting * (self._sampler_s_per_seq + self._stream_s_per_seq)
        return total + self.scheduling_s(len(seqs) + decodes)
