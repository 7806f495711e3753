"""The engine's data types as enums: weight quantization, activation dtype, KV-cache dtype.

Users, checkpoints and benchmark pages name these many ways (vLLM's ``awq_marlin``,
``fp8_e4m3``, ``half``, ...). Each enum has one alias table, read once where a string
comes in (CLI flags, ``EngineConfig`` built from strings, checkpoint configs, CSV rows);
past that edge the step-time model and the engine see only enum members. They are
``StrEnum``s, so JSON output and formatted text keep the canonical strings.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TypeVar

from inferlab._errors import UsageError

_E = TypeVar("_E", bound=enum.StrEnum)


def parse_name(aliases: Mapping[str, _E], value: str, what: str) -> _E:
    """The member ``value`` names in ``aliases`` (case and surrounding blanks ignored; a
    member names itself). Raises a one-line ``UsageError`` naming ``what`` and every
    accepted name: the canonical ones first, then the other aliases."""
    found = aliases.get(value.strip().lower())
    if found is not None:
        return found
    canonical = list(dict.fromkeys(aliases.values()))
    others = sorted(set(aliases) - set(canonical))
    also = f" (also {', '.join(others)})" if others else ""
    raise UsageError(f"unknown {what} {value!r}; known: {', '.join(canonical)}{also}")


class Quantization(enum.StrEnum):
    """How the layer weights are stored (``--quantization``); the LM head and the
    activations stay bf16 whatever it is."""

    FP8 = "fp8"  # W8A8 fp8: 8-bit weights and activations on fp8 tensor cores
    INT8 = "int8"  # W8A8 int8 (SmoothQuant)
    W8A16 = "w8a16"  # 8-bit weights dequantized into bf16 GEMMs (GPTQ-Int8)
    AWQ = "awq"  # int4 W4A16
    GPTQ = "gptq"  # int4 W4A16
    NONE = "none"  # unquantized: bf16/fp16 weights, whatever the checkpoint says

    @classmethod
    def parse(cls, value: str) -> Quantization:
        """The quantization ``value`` names (vLLM's names too); ``UsageError`` if none."""
        return parse_name(QUANTIZATION_NAMES, value, "quantization")

    @property
    def is_int4(self) -> bool:
        """4-bit weights (AWQ, GPTQ): dequantizing kernels, ~0.52 bytes a weight."""
        return self in (Quantization.AWQ, Quantization.GPTQ)


#: the quantizations the step-time model costs, as a checkpoint may state them
SIMULATED_QUANTIZATIONS = tuple(q for q in Quantization if q is not Quantization.NONE)

# What each name means, by the names vLLM, its checkpoints and benchmark pages use.
QUANTIZATION_NAMES: dict[str, Quantization] = {
    **{q.value: q for q in Quantization},
    **dict.fromkeys(
        ("fp8_e4m3", "fp8-dynamic", "fp8_dynamic", "modelopt", "fbgemm_fp8", "w8a8-fp8", "w8a8_fp8"),
        Quantization.FP8,
    ),
    **dict.fromkeys(("w8a8", "w8a8-int8", "w8a8_int8", "smoothquant"), Quantization.INT8),
    **dict.fromkeys(("gptq-int8", "gptq_int8"), Quantization.W8A16),
    "awq_marlin": Quantization.AWQ,
    # (gptq/gptq_marlin/marlin name a format: with an 8-bit checkpoint the engine runs w8a16)
    **dict.fromkeys(("gptq_marlin", "marlin", "int4", "w4a16"), Quantization.GPTQ),
    # unquantized, whatever the name says
    **dict.fromkeys(("bf16", "bfloat16", "fp16", "float16"), Quantization.NONE),
}


#: the names above that are vLLM's own ``--quantization`` methods: vLLM decides from the
#: name, not the scheme, whether it runs a checkpoint (``config.vllm_runs``), so these
#: keep their name; the others are this tool's words for a scheme
VLLM_METHODS = frozenset({"fp8", "fbgemm_fp8", "modelopt", "awq", "awq_marlin", "gptq", "gptq_marlin", "marlin"})


class DType(enum.StrEnum):
    """The activation and unquantized weight type (``--dtype``). Both 16-bit types cost
    the same; ``auto`` is the checkpoint's (bf16 for every preset)."""

    AUTO = "auto"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"

    @classmethod
    def parse(cls, value: str) -> DType:
        """The dtype ``value`` names (bf16, fp16, half too); ``UsageError`` if none."""
        return parse_name(DTYPE_NAMES, value, "dtype")


DTYPE_NAMES: dict[str, DType] = {
    **{d.value: d for d in DType},
    "bf16": DType.BFLOAT16,
    **dict.fromkeys(("fp16", "half"), DType.FLOAT16),
}


class KVCacheDType(enum.StrEnum):
    """How the KV cache stores K and V (``--kv-cache-dtype``): ``auto`` as the
    activations (2 bytes), ``fp8`` one byte (half the room and half the reads)."""

    AUTO = "auto"
    FP8 = "fp8"

    @classmethod
    def parse(cls, value: str) -> KVCacheDType:
        """The KV-cache dtype ``value`` names (fp8_e4m3, bf16, ...); ``UsageError`` if none."""
        return parse_name(KV_CACHE_DTYPE_NAMES, value, "kv_cache_dtype")


class CapacityPolicy(enum.StrEnum):
    """TensorRT-LLM's capacity scheduler (``--capacity-scheduler-policy``):
    GUARANTEED_NO_EVICT admits a waiting request only while free KV blocks hold what it
    and every running request need to reach their output limits, so nothing is
    preempted; MAX_UTILIZATION admits on the first chunk and preempts when the cache
    fills, as vLLM does."""

    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
    MAX_UTILIZATION = "MAX_UTILIZATION"

    @classmethod
    def parse(cls, value: str) -> CapacityPolicy:
        """The policy ``value`` names, case ignored; ``UsageError`` for any other, and for
        STATIC_BATCH with how to run one batch instead."""
        if value.strip().lower() == "static_batch":
            raise UsageError("capacity_scheduler_policy STATIC_BATCH (TensorRT-LLM's legacy static batching) is not "
                             "simulated: run one batch of B requests as --rate inf -n B --max-num-seqs B, its latency "
                             "the E2E max")
        found = next((m for m in cls if m.value.lower() == value.strip().lower()), None)
        if found is None:
            raise UsageError(f"unknown capacity_scheduler_policy {value!r}; known: {', '.join(cls)}")
        return found


KV_CACHE_DTYPE_NAMES: dict[str, KVCacheDType] = {
    **{k.value: k for k in KVCacheDType},
    **dict.fromkeys(("bf16", "bfloat16", "fp16", "float16"), KVCacheDType.AUTO),
    **dict.fromkeys(("fp8_e4m3", "fp8_e5m2", "fp8_inc"), KVCacheDType.FP8),
}
