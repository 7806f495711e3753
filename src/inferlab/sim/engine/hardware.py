"""Model shapes and GPU specs for the simulator.

Presets come from ``data/presets.json``. A model is named by its preset name
(``Qwen2.5-7B-Instruct``), an HF id (``Qwen/Qwen2.5-7B-Instruct``), or a path to an HF
``config.json`` (or a directory holding one). A GPU is named by a short name (``H100``),
a preset name (``H100-SXM-80GB``), or a path to a JSON file with the preset keys.
Unknown names raise ``UsageError`` with the known names.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferlab._errors import UsageError
from inferlab.sim.engine.dtypes import SIMULATED_QUANTIZATIONS, Quantization

_PRESETS_PATH = Path(__file__).parents[1] / "data" / "presets.json"
_GIB = 2**30

# Per-direction bus bandwidth that an all-reduce sees, in GB/s. NVLink figures are the
# datasheet per-direction numbers; PCIe cards get an effective ~25 GB/s (Gen4 x16 without
# P2P, through host memory).
_BUS_GBS: dict[str, float] = {
    "A100-SXM-80GB": 300.0,
    "H100-SXM-80GB": 450.0,
    "H200-SXM-141GB": 450.0,
    "L40S-48GB": 25.0,
    "RTX-4090-24GB": 25.0,
    "H100-PCIe-80GB": 50.0,  # PCIe Gen5 x16 (pairs with an NVLink bridge do better)
    "H100-NVL-94GB": 300.0,  # NVLink bridge, within a pair
    "H20-96GB": 450.0,
    "A100-SXM-40GB": 300.0,
    "A100-PCIe-80GB": 25.0,
    "L4-24GB": 25.0,
    "A10-24GB": 25.0,
    "B200-180GB": 900.0,
    "H800-SXM-80GB": 200.0,
    "A800-SXM-80GB": 200.0,
}
_DEFAULT_BUS_GBS = 25.0
# GeForce cards: no peer-to-peer access between them (the driver disables it)
_NO_PEER_TO_PEER = frozenset({"RTX-4090-24GB"})

# Cards with GDDR memory reach a larger fraction of their datasheet bandwidth than the HBM
# parts the efficiencies were fit on (A100/H100/H200): a smaller bandwidth-latency product
# takes fewer bytes in flight to saturate (copy benchmarks as usually published: ~92 % of
# peak against ~86-88 %; recalled, not measured here).
# Decode measured on GDDR cards with vLLM ran 11-17 % faster than the HBM-fit prediction
# in 11 of 13 rows, 20 and 27 % in the two loaded ones (RTX 4090, Llama-3-8B, 1-32 req/s;
# L4, Qwen2.5-0.5B at 1-32 users and Qwen3-0.6B; three sources, bench/data/
# published_holdout.csv): 1.12, a little under their median.
_GDDR_STREAM_FACTOR = 1.12
# The same factor for HBM cards that differ from the H100 the efficiencies were fit on.
# H200: HBM3e at 4.8 TB/s on the H100's SMs and L2, a larger bandwidth-latency product to
# fill; fitted on the 26 `fit` rows on H200 (TensorRT-LLM's v1.0 overview, vLLM's CI,
# DataCrunch's SGLang runs) by a rule written before the grid 0.86-1.00 was run: 0.92
# (mean of the throughput, TPOT-ITL and E2E medians 8.61 -> 6.68 %; the same grid on the
# H100 rows picks 1.00). docs/validation.md, "H200's bandwidth". Every other card: 1.0.
_STREAM_FACTORS: dict[str, float] = {
    **dict.fromkeys(("L40S-48GB", "RTX-4090-24GB", "L4-24GB", "A10-24GB"), _GDDR_STREAM_FACTOR),
    "H200-SXM-141GB": 0.92,
}

_GPU_ALIASES: dict[str, str] = {
    "h100": "H100-SXM-80GB",
    "h200": "H200-SXM-141GB",
    "a100": "A100-SXM-80GB",
    "a100-80g": "A100-SXM-80GB",
    "a100-80gb": "A100-SXM-80GB",
    "l40s": "L40S-48GB",
    "rtx4090": "RTX-4090-24GB",
    "rtx-4090": "RTX-4090-24GB",
    "4090": "RTX-4090-24GB",
    "h100-pcie": "H100-PCIe-80GB",
    "h100-nvl": "H100-NVL-94GB",
    "h20": "H20-96GB",
    "a100-40g": "A100-SXM-40GB",
    "a100-40gb": "A100-SXM-40GB",
    "a100-pcie": "A100-PCIe-80GB",
    "l4": "L4-24GB",
    "a10": "A10-24GB",
    "b200": "B200-180GB",
    "h800": "H800-SXM-80GB",
    "a800": "A800-SXM-80GB",
}

# Suffixes that name a fine-tuned variant with the same shapes as its base model.
_VARIANT_SUFFIXES = ("-instruct", "-chat", "-hf", "-it")


@dataclass(frozen=True)
class ModelSpec:
    """Shapes of a decoder-only transformer (parameter counts exclude norms/biases).

    Mixture of experts: ``moe_layers`` of the layers replace their SwiGLU MLP of
    ``intermediate_size`` by ``num_experts`` routed experts of
    ``expert_intermediate_size`` (each token runs ``experts_per_token`` of them) plus an
    always-on shared expert of ``shared_intermediate_size``. ``params_per_layer`` is the
    mean over layers of every weight, all experts included (memory); a dense model has
    ``num_experts`` 0."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    params_per_layer: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    shared_intermediate_size: int = 0
    moe_layers: int = 0
    # the checkpoint's own weight quantization (its config's ``quantization_config``), as
    # vLLM reads it when ``--quantization`` is not given; None: unquantized, unknown, or
    # one the step-time model does not cost, which ``unsimulated_quantization`` then names
    # (bitsandbytes, 3-bit GPTQ, ...): the engine refuses it unless told how to model it
    quantization: Quantization | None = None
    unsimulated_quantization: str | None = None
    # the method its config's ``quant_method`` names, as vLLM reads it (awq, gptq, fp8,
    # compressed-tensors, modelopt, ...): which ``--quantization`` names vLLM runs it with
    # depends on it, not on the scheme; None: no config states one (a preset, a name)
    quant_method: str | None = None

    @property
    def routed_params_per_layer(self) -> float:
        """Mean over layers of the routed experts' weights (all of them)."""
        return self.moe_layers * self.num_experts * 3 * self.hidden_size * self.expert_intermediate_size / self.num_layers

    @property
    def active_params_per_layer(self) -> float:
        """Mean over layers of the weights one token runs through."""
        if not self.num_experts:
            return float(self.params_per_layer)
        routed = self.routed_params_per_layer
        return self.params_per_layer - routed + routed * self.experts_per_token / self.num_experts

    @property
    def active_params_total(self) -> float:
        """The parameters one token runs through, embedding and LM head included."""
        return self.params_total - self.num_layers * (self.params_per_layer - self.active_params_per_layer)

    @property
    def mlp_width_per_token(self) -> float:
        """Mean over layers of the MLP intermediate width one token computes (activations)."""
        if not self.num_experts:
            return float(self.intermediate_size)
        moe = self.experts_per_token * self.expert_intermediate_size + self.shared_intermediate_size
        dense = self.num_layers - self.moe_layers
        return (dense * self.intermediate_size + self.moe_layers * moe) / self.num_layers

    @property
    def embedding_params(self) -> int:
        """Input embedding parameters (the LM head has as many again unless tied)."""
        return self.vocab_size * self.hidden_size

    @property
    def params_total(self) -> int:
        lm_head = 0 if self.tie_word_embeddings else self.embedding_params
        return self.num_layers * self.params_per_layer + self.embedding_params + lm_head


@dataclass(frozen=True)
class GpuSpec:
    """Dense tensor-core peaks, memory and interconnect of one GPU, in SI units."""

    name: str
    bf16_flops_per_s: float
    fp8_flops_per_s: float | None  # None: no fp8 tensor cores (fp8 weights run weight-only)
    int8_ops_per_s: float
    hbm_bytes: float
    hbm_bytes_per_s: float
    bus_bytes_per_s: float  # per-direction link bandwidth seen by all-reduce
    # achieved share of ``hbm_bytes_per_s`` relative to the HBM cards the efficiencies
    # were fit on: ``_STREAM_FACTORS`` (1.0 for HBM but H200's 0.92, ``_GDDR_STREAM_FACTOR``
    # for GDDR cards), or what a spec file states
    stream_factor: float = 1.0
    # False for GeForce cards, whose driver disables peer-to-peer access: an all-reduce goes
    # through host memory (NCCL's shared-memory transport; vLLM's custom all-reduce needs
    # P2P and stays off), at ``Efficiencies.allreduce_latency_no_p2p_s`` each
    peer_to_peer: bool = True


@functools.cache
def _presets() -> dict[str, Any]:
    with _PRESETS_PATH.open() as f:
        data: dict[str, Any] = json.load(f)
    return data


# a quantized checkpoint's name ends with its scheme: ...-AWQ, -GPTQ-Int4, -FP8-dynamic,
# -quantized.w4a16, -AWQ-INT4, -Int8; the shapes are its base model's
_QUANT_SUFFIX = re.compile(
    r"[-_.](?:quantized[-_.])?(?:awq|gptq|fp8|int4|int8|w4a16|w8a8|w8a16|marlin|dynamic|static)"
    r"(?:[-_.](?:int4|int8|dynamic|static|marlin))*$"
)


def _normalize(name: str) -> str:
    name = "-".join(name.strip().lower().replace(":", " ").split())  # 'Mixtral 8x7B', 'llama3.1:8b'
    name = re.sub(r"llama-?v?(\d)", r"llama-\1", name)  # 'LLaMA v3.1', 'Llama3' are 'llama-3...'
    name = _QUANT_SUFFIX.sub("", name)
    stripped = True
    while stripped:  # -chat-hf, -instruct-2407, ...
        stripped = False
        for suffix in _VARIANT_SUFFIXES:
            if name.endswith(suffix):
                name, stripped = name[: -len(suffix)], True
    return name.removeprefix("meta-")


def quantization_from_name(name: str) -> Quantization | None:
    """The weight quantization a checkpoint's name states (vLLM reads it from the
    checkpoint's config): ``awq``, ``gptq`` (int4 W4A16), ``w8a16`` (GPTQ-Int8), ``fp8``
    or ``int8`` (W8A8); ``None`` when the name says none."""
    tail = name.rsplit("/", 1)[-1].lower()
    if "awq" in tail:
        return Quantization.AWQ
    if re.search(r"gptq[-_.]?int8|w8a16", tail):
        return Quantization.W8A16  # 8-bit weights, bf16 activations
    if re.search(r"gptq|int4|w4a16", tail):
        return Quantization.GPTQ
    if "fp8" in tail:
        return Quantization.FP8
    if re.search(r"int8|w8a8", tail):
        return Quantization.INT8
    return None


def _params_per_layer(hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int) -> int:
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim  # q,o + k,v
    return attention + 3 * hidden * inter  # SwiGLU gate, up, down


def _moe_shape(cfg: dict[str, Any], layers: int, hidden: int, inter: int) -> tuple[int, int, int, int, int, int]:
    """(experts, experts per token, expert width, shared width, MoE layers, dense-layer
    width) from the config keys of Mixtral, Qwen-MoE, GLM-4.5 / DeepSeek-style and
    Llama 4 checkpoints; experts 0 for a dense model. Which layers are MoE follows each
    family's rule in transformers: Llama 4's ``moe_layers`` list when given; DeepSeek /
    GLM: ``i >= first_k_dense_replace`` and ``i % moe_layer_freq == 0``; Qwen: not in
    ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0``; Llama 4:
    ``(i + 1) % interleave_moe_layer_step == 0``."""
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0)
    if experts <= 1:
        return 0, 0, 0, 0, 0, inter
    top_k = int(cfg["num_experts_per_tok"])
    if not 1 <= top_k <= experts:
        raise ValueError(f"num_experts_per_tok {top_k} of {experts} experts")
    width = int(cfg.get("moe_intermediate_size") or inter)
    shared = int(cfg.get("shared_expert_intermediate_size") or 0)
    shared += int(cfg.get("n_shared_experts") or 0) * width
    dense_width = inter
    if str(cfg.get("model_type", "")).startswith("llama4"):
        shared = inter  # every MoE layer also runs a shared expert as wide as one expert
        dense_width = int(cfg.get("intermediate_size_mlp") or inter)
    listed = cfg.get("moe_layers")
    if isinstance(listed, list):
        moe = {int(i) for i in listed} & set(range(layers))
    elif cfg.get("n_routed_experts"):
        first, freq = int(cfg.get("first_k_dense_replace") or 0), int(cfg.get("moe_layer_freq") or 1)
        moe = {i for i in range(layers) if i >= first and i % freq == 0}
    else:
        step = int(cfg.get("decoder_sparse_step") or cfg.get("interleave_moe_layer_step") or 1)
        dense = {int(i) for i in cfg.get("mlp_only_layers") or ()}
        moe = {i for i in range(layers) if i not in dense and (i + 1) % step == 0}
    return experts, top_k, width, shared, len(moe), dense_width


# Layers that are not full attention (Mamba/SSM, linear or lightning attention): the KV
# cache and attention cost of such hybrids are not what this model computes.
_HYBRID_TYPES = frozenset({
    "jamba", "qwen3_next", "minimax", "minimax_m1", "minimax_text_01", "granitemoehybrid",
    "falcon_h1", "nemotron_h", "zamba", "zamba2", "bamba", "mamba", "mamba2", "rwkv",
    "recurrent_gemma", "lfm2", "plamo2",
})
_HYBRID_KEYS = ("attn_layer_period", "expert_layer_period", "full_attention_interval",
                "ssm_state_size", "mamba_d_state", "mamba_expand", "linear_num_value_heads")
# MoE configs whose expert keys this reader does not know (ERNIE 4.5, Hunyuan): refused
# rather than read as the dense model their other keys describe
_UNREAD_MOE_KEYS = ("moe_num_experts", "moe_topk", "moe_k", "num_experts_per_token")


def _refusal(cfg: dict[str, Any]) -> str | None:
    """Why this config is an architecture the step-time model does not cover, or None."""
    kind = str(cfg.get("model_type", ""))
    if cfg.get("kv_lora_rank"):
        return "multi-head latent attention (DeepSeek-V2/V3 style) is not simulated"
    if kind == "gpt_oss":
        return "gpt-oss (MXFP4 experts, attention sinks, sliding windows) is not simulated"
    kinds = {str(t) for t in cfg.get("layer_types") or ()} - {"full_attention", "sliding_attention", "attention"}
    if kind in _HYBRID_TYPES or any(k in cfg for k in _HYBRID_KEYS) or kinds:
        return f"hybrid layers ({kind or ', '.join(sorted(kinds))}: Mamba / linear attention) are not simulated"
    unread = [k for k in _UNREAD_MOE_KEYS if k in cfg]
    if unread and "num_experts_per_tok" not in cfg:
        return f"this mixture-of-experts config layout ({', '.join(unread)}) is not read"
    return None


def quant_method(qc: Any) -> str:
    """The method a ``quantization_config`` names, as vLLM's ``ModelConfig._verify_quantization``
    reads it (vllm/config/model.py, commit 0052a5b8): ``quant_method`` in lower case,
    ``compressed_tensors`` spelled ``compressed-tensors``; "" for none."""
    if not isinstance(qc, dict):
        return ""
    return str(qc.get("quant_method") or "").lower().replace("compressed_tensors", "compressed-tensors")


def quantization_from_config(qc: Any) -> str | None:
    """The weight quantization a checkpoint's ``quantization_config`` states, in
    ``--quantization``'s names: fp8, int8 (W8A8), w8a16, awq, gptq (int4 W4A16); another
    method or bit width comes back as its own description (``ModelSpec`` keeps it as
    ``unsimulated_quantization``). ``ValueError`` for a config of the wrong shape."""
    if not isinstance(qc, dict):
        return None
    method = quant_method(qc)
    if method in ("fp8", "fbgemm_fp8") or (method == "modelopt" and "fp8" in str(qc.get("quant_algo", "")).lower()):
        return "fp8"
    if method in ("awq", "awq_marlin"):
        return "awq"
    if method in ("gptq", "gptq_marlin"):
        bits = int(qc.get("bits") or 4)
        return {4: "gptq", 8: "w8a16"}.get(bits, f"{method} {bits}-bit")
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        if not isinstance(groups, dict):
            raise ValueError("quantization_config.config_groups is not an object")
        group: Any = next(iter(groups.values()), {})
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(weights, dict):
            raise ValueError("quantization_config.config_groups has no weights object")
        acts = group.get("input_activations")
        bits, kind = int(weights.get("num_bits") or 16), str(weights.get("type", "int"))
        if bits == 8 and kind == "float":
            return "fp8"
        if bits == 8:
            return "int8" if acts else "w8a16"
        if bits == 4 and not acts:
            return "gptq"  # W4A16
        return f"compressed-tensors {kind}{bits}"
    return method or None


def _model_from_config(name: str, cfg: dict[str, Any]) -> ModelSpec:
    qc = cfg.get("quantization_config")
    try:
        stated = quantization_from_config(qc)
    except (TypeError, ValueError) as e:
        raise UsageError(f"{name}: not a usable quantization_config ({e})") from e
    # only a simulated scheme's own name is read as it (no alias: 'smoothquant' stays unsimulated)
    quantization = Quantization(stated) if stated in SIMULATED_QUANTIZATIONS else None
    if isinstance(cfg.get("text_config"), dict) and "hidden_size" not in cfg:
        cfg = cfg["text_config"]  # a multimodal checkpoint's language model
    why = _refusal(cfg)
    if why is not None:
        raise UsageError(f"{name}: {why}")
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        inter = int(cfg["intermediate_size"])
        layers = int(cfg["num_hidden_layers"])
        experts, top_k, width, shared, moe_layers, dense_width = _moe_shape(cfg, layers, hidden, inter)
        per_layer = _params_per_layer(hidden, heads, kv_heads, head_dim, dense_width)
        if experts:
            attention = _params_per_layer(hidden, heads, kv_heads, head_dim, 0)
            moe_layer = attention + hidden * experts + 3 * hidden * (experts * width + shared)  # router too
            per_layer = round(((layers - moe_layers) * per_layer + moe_layers * moe_layer) / layers)
        return ModelSpec(
            name=name,
            num_layers=layers,
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=dense_width,
            vocab_size=int(cfg["vocab_size"]),
            params_per_layer=per_layer,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=int(cfg.get("max_position_embeddings") or 2**31 - 1),
            num_experts=experts,
            experts_per_token=top_k,
            expert_intermediate_size=width,
            shared_intermediate_size=shared,
            moe_layers=moe_layers,
            quantization=quantization,
            unsimulated_quantization=stated if quantization is None else None,
            quant_method=quant_method(qc) or None,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"{name}: not a usable model config ({e!r} missing or invalid)") from e


def model_names() -> list[str]:
    """Preset model names, in file order."""
    return list(_presets()["models"])


def gpu_presets() -> dict[str, list[str]]:
    """Each preset GPU name, in file order, with the short names that alias it."""
    out: dict[str, list[str]] = {name: [] for name in _presets()["gpus"]}
    for short, preset in _GPU_ALIASES.items():
        out[preset].append(short)
    return out


def gpu_memory_source(preset: str) -> str | None:
    """Where a preset GPU's memory comes from (its ``memory_source``): the published
    nvidia-smi output its ``memory_mib`` was read from; None where none was found and
    its datasheet's GB are read as GiB (``hbm_gb``)."""
    source = _presets()["gpus"][preset].get("memory_source")
    return None if source is None else str(source)


def gpu_names() -> list[str]:
    """Short GPU names followed by preset names."""
    return ["H100", "H200", "A100", "L40S", "RTX4090", *_presets()["gpus"]]


def resolve_model(name: str) -> ModelSpec:
    """A preset name, an HF id (``org/Name``), or a path to an HF ``config.json``.

    HF ids match a preset's ``hf`` field, or case-insensitively on the part after the
    slash (``-Instruct``/``-chat``/``-hf`` variants share their base model's shapes).
    Raises ``UsageError`` for an unknown name or an unreadable config.
    """
    models: dict[str, dict[str, Any]] = _presets()["models"]
    if name in models:
        return _model_from_config(name, models[name])
    for key, cfg in models.items():
        if cfg.get("hf") == name:
            return _model_from_config(key, cfg)
    path = Path(name).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            cfg = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UsageError(f"cannot read model config {path}: {e}") from e
        if not isinstance(cfg, dict):
            raise UsageError(f"{path}: a model config must be a JSON object")
        return _model_from_config(str(path), cfg)
    wanted = _normalize(name.rsplit("/", 1)[-1])
    for key, cfg in models.items():
        names = [key, str(cfg.get("hf", "")), *cfg.get("aliases", [])]
        if wanted in {_normalize(n.rsplit("/", 1)[-1]) for n in names}:
            return _model_from_config(key, cfg)
    raise UsageError(
        f"unknown model {name!r}; known: {', '.join(model_names())} "
        "(or an HF id of one of them, or a path to a config.json)"
    )


def _positive(key: str, value: object) -> float:
    """``value`` as a number above 0; ValueError naming ``key`` otherwise."""
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        x = float("nan")
    if not x > 0:
        raise ValueError(f"{key} must be a number above 0, not {value!r}")
    return x


def _flag(key: str, value: object) -> bool:
    """``value`` if it is a JSON true or false; ValueError naming ``key`` otherwise."""
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, not {value!r}")
    return value


def _device_memory_bytes(d: dict[str, Any]) -> float:
    """The device memory a spec states: ``memory_mib``, the total nvidia-smi reports
    (``memory.total``, MiB), where given; else ``hbm_gb`` read as GiB. A datasheet's
    "48GB" is neither: an L40S reports 46,068 MiB (44.99 GiB), an H100 81,559 MiB
    (79.65 GiB), an A100 80GB 81,920 MiB (80 GiB), so the presets state ``memory_mib``
    from published nvidia-smi output (``memory_source``) and keep ``hbm_gb`` as the
    datasheet's figure."""
    if "memory_mib" in d:
        return _positive("memory_mib", d["memory_mib"]) * 2**20
    return float(d["hbm_gb"]) * _GIB


def _gpu_from_dict(name: str, d: dict[str, Any], source: str | None = None) -> GpuSpec:
    """``source``: the file ``d`` came from, named in the ``UsageError`` if it is unusable."""
    try:
        fp8 = d.get("fp8_dense_tflops")
        bf16 = float(d["bf16_dense_tflops"])
        return GpuSpec(
            name=name,
            bf16_flops_per_s=bf16 * 1e12,
            fp8_flops_per_s=float(fp8) * 1e12 if fp8 else None,
            int8_ops_per_s=float(d.get("int8_dense_tops") or 2 * bf16) * 1e12,
            hbm_bytes=_device_memory_bytes(d),
            hbm_bytes_per_s=float(d["hbm_bw_tbs"]) * 1e12,
            bus_bytes_per_s=float(d.get("bus_bw_gbs") or _BUS_GBS.get(name, _DEFAULT_BUS_GBS))
            * 1e9,
            stream_factor=_positive("stream_factor", d["stream_factor"] if "stream_factor" in d else _STREAM_FACTORS.get(name, 1.0)),
            peer_to_peer=_flag("peer_to_peer", d["peer_to_peer"]) if "peer_to_peer" in d else name not in _NO_PEER_TO_PEER,
        )
    except KeyError as e:
        raise UsageError(f"{source or name}: not a usable GPU spec ({e.args[0]!r} missing)") from e
    except (TypeError, ValueError) as e:
        raise UsageError(f"{source or name}: not a usable GPU spec (invalid value: {e})") from e


def gpu_from_text(text: str) -> str | None:
    """The preset a free-text GPU name means, as sources and tools write it
    ('A100-SXM4-80GB', 'NVIDIA H100 80GB HBM3', 'H100 PCIe', 'NVIDIA GeForce RTX 4090');
    None when no preset fits — another card whose name contains a preset's ('RTX A1000',
    'RTX 4090 Laptop GPU'), or a form factor or memory size no preset has ('H800 PCIe',
    'H100 96GB'). A form factor that is not stated means SXM, the usual card; 'PCIe' alone
    or 'not SXM' means PCIe."""
    t = text.lower().replace(" ", "-")

    def says(pattern: str) -> bool:  # a word of the text, not negated ('not PCIe')
        return re.search(r"(?<!not-)(?<![a-z0-9])" + pattern + r"(?![a-z0-9])", t) is not None

    def names(chip: str) -> bool:  # 'a100' in '8xa100-sxm4', not in 'rtx-a1000'
        return re.search(chip + r"(?!\d)", t) is not None

    def memory(*sizes: str) -> bool:  # any stated memory size is one of ``sizes``
        stated = re.findall(r"(?<![a-z0-9])(\d+)-?g(?:i?b)?(?![a-z])(?!-?(?:total|in-all))", t)  # not '640GB total'
        return all(m in sizes for m in stated)

    if re.search(r"g[hb]200|laptop|mobile|max-q", t):
        return None  # Grace superchips; the laptop parts of desktop names
    pcie = says("pcie") and not says(r"sxm\d?") and "sxm/pcie" not in t
    if names("h200"):
        return "H200-SXM-141GB" if memory("141") and not pcie else None
    if names("h800") or names("a800"):
        return ("H800-SXM-80GB" if names("h800") else "A800-SXM-80GB") if memory("80") and not pcie else None
    if names("b200"):
        return "B200-180GB" if memory("180", "192") else None
    if says("h20"):
        return "H20-96GB" if memory("96") and "h20-3e" not in t else None
    if names("h100"):
        if says("nvl") or (says("94-?gb") and not says(r"sxm\d?")):
            return "H100-NVL-94GB"
        if not memory("80"):
            return None
        return "H100-PCIe-80GB" if pcie else "H100-SXM-80GB"
    if names("a100"):
        if says("40-?g(i?b)?"):
            return "A100-SXM-40GB"  # (the 40GB PCIe card has the same memory system)
        if not memory("80"):
            return None
        return "A100-PCIe-80GB" if pcie else "A100-SXM-80GB"
    if names("l40s"):
        return "L40S-48GB"
    if re.search(r"(?<!\d)4090(?!\d)", t):
        return "RTX-4090-24GB" if memory("24") else None
    if says("l4"):
        return "L4-24GB"
    if says("a10"):
        return "A10-24GB"
    return None


def resolve_gpu(name: str) -> GpuSpec:
    """A short name (``H100``, ``A100-80G``, ``4090``), a preset name, a JSON file path, or
    a name as sources and tools write it (``A100-SXM4-80GB``, ``NVIDIA H100 80GB HBM3``).

    A custom file has the preset keys (``bf16_dense_tflops``, ``fp8_dense_tflops``,
    ``int8_dense_tops``, ``hbm_gb``, ``hbm_bw_tbs``) and optionally ``memory_mib`` (the
    device memory nvidia-smi reports, MiB: it wins over ``hbm_gb``, which is read as
    GiB), ``bus_bw_gbs``,
    ``stream_factor`` (the share of its bandwidth it reaches relative to HBM cards) and
    ``peer_to_peer`` (false for cards whose all-reduce goes through host memory).
    Raises ``UsageError`` for an unknown name or an unusable file.
    """
    gpus: dict[str, dict[str, Any]] = _presets()["gpus"]
    key = _GPU_ALIASES.get(name.strip().lower(), name)
    for preset, spec in gpus.items():
        if preset.lower() == key.lower():
            return _gpu_from_dict(preset, spec)
    path = Path(name).expanduser()
    if path.is_file():
        try:
            d = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UsageError(f"cannot read GPU spec {path}: {e}") from e
        if not isinstance(d, dict):
            raise UsageError(f"{path}: a GPU spec must be a JSON object")
        return _gpu_from_dict(str(d.get("name", path.stem)), d, str(path))
    a_path = name.lower().endswith(".json") or "/" in name
    meant = None if a_path else gpu_from_text(name)
    if meant is not None:  # 'A100-SXM4-80GB', 'NVIDIA H100 80GB HBM3', 'H100 PCIe'
        return _gpu_from_dict(meant, gpus[meant])
    if a_path:  # (a file name: say that the file is missing, not that the name is odd)
        raise UsageError(f"unknown GPU {name!r}: no such file; a GPU is a JSON file with the preset keys, or one of: {', '.join(gpu_names())} (`inferlab sim presets` shows their specs)")
    raise UsageError(f"unknown GPU {name!r}; known: {', '.join(gpu_names())} (or a JSON file; `inferlab sim presets` shows their specs)")
