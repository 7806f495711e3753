"""The simulator's scheduler against vLLM's, step by step: three workloads that force
preemption in a small KV cache, the engine flags both sides run with, and the per-step
records compared.

The setup is the one checked against vLLM 0.32's CPU build: 24 KV blocks of 128 tokens
(``--num-gpu-blocks-override 24``: 23 hold tokens, one is vLLM's null block), a
512-token budget per step, 16 sequences, prefix caching on. The workloads (``SCENARIOS``):

- ``closed-loop``: 8 users, 32 requests of 384 tokens in and 384 out: their sequences
  outgrow the cache, running requests are preempted;
- ``shared-prefix-burst``: 16 requests at once sharing a 1,024-token prefix (each with
  its own 128 tokens, 256 out): prefix-cache hits, and preemptions;
- ``burst-512``: 16 requests at once of 512 tokens in and 512 out, where vLLM 0.32's
  full-sequence admission and free-queue order decide when preempted requests come back.

A step is compared on what both sides log (``StepKey``): tokens scheduled (prefill and
decode), the running and waiting counts after it, preemptions in it, and the prefix-cache
hits of first admissions (vLLM's counters leave out what a re-admission finds).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferlab.load.schedules import ClosedLoop, LoadConfig, OpenLoop
from inferlab.sim.engine.config import EngineConfig
from inferlab.workload.config import WorkloadConfig

#: vLLM's CPU KV block size, and the cache of the check: 24 blocks, 23 usable
BLOCK_SIZE = 128
NUM_GPU_BLOCKS = 24
MAX_NUM_BATCHED_TOKENS = 512
MAX_NUM_SEQS = 16
MAX_MODEL_LEN = 2048


@dataclass(frozen=True)
class Scenario:
    """One workload of the check: what ``sim run`` or ``bench`` sends, and how."""

    name: str
    load: LoadConfig
    workload: WorkloadConfig
    about: str

    def cli_flags(self) -> list[str]:
        """The same workload as ``inferlab sim run`` / ``bench`` flags."""
        s, w = self.load.schedule, self.workload
        flags = ["-n", str(self.load.num_requests)]
        if isinstance(s, ClosedLoop):
            flags += ["-c", str(s.concurrency)]
        else:
            flags += ["--rate", "inf"]
        if w.prefix_tokens is not None:
            flags += ["--prefix-groups", str(w.prefix_groups or 1), "--prefix-tokens", str(w.prefix_tokens),
                      "--suffix-tokens", str(w.suffix_tokens)]
        else:
            flags += ["--input-tokens", str(w.input_tokens)]
        return [*flags, "--output-tokens", str(w.output_tokens)]


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("closed-loop", LoadConfig(ClosedLoop(8), num_requests=32),
                 WorkloadConfig(input_tokens=384, output_tokens=384),
                 "8 users, 384 in / 384 out: running sequences outgrow the cache"),
        Scenario("shared-prefix-burst", LoadConfig(OpenLoop(float("inf")), num_requests=16),
                 WorkloadConfig(output_tokens=256, prefix_groups=1, prefix_tokens=1024, suffix_tokens=128),
                 "16 at once sharing a 1,024-token prefix: cache hits and preemptions"),
        Scenario("burst-512", LoadConfig(OpenLoop(float("inf")), num_requests=16),
                 WorkloadConfig(input_tokens=512, output_tokens=512),
                 "16 at once, 512 in / 512 out: re-admissions decided by full-sequence admission"),
    )
}


def engine_config(model: str = "Llama-3.2-1B", **flags: Any) -> EngineConfig:
    """The simulated engine of the check (vLLM V1 rules, vLLM 0.32's switches unless
    ``flags`` say otherwise); no API cost, so that a request is schedulable when sent."""
    base: dict[str, Any] = {
        "model": model, "block_size": BLOCK_SIZE, "num_gpu_blocks_override": NUM_GPU_BLOCKS,
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS, "max_num_seqs": MAX_NUM_SEQS,
        "max_model_len": MAX_MODEL_LEN, "enable_prefix_caching": True, "api_overhead_s": 0.0,
    }
    return EngineConfig(**{**base, **flags})


@dataclass(frozen=True)
class StepKey:
    """What a step is compared on."""

    prefill_tokens: int
    decode_tokens: int
    num_running: int
    num_waiting: int
    preemptions: int
    prefix_hit_tokens: int


def sim_steps(lines: Iterable[Mapping[str, Any]]) -> list[StepKey]:
    """``sim run --step-log`` lines as compared steps (idle steps, with no tokens, left out)."""
    keys = []
    for d in lines:
        if d["prefill_tokens"] + d["decode_tokens"] == 0:
            continue
        keys.append(StepKey(d["prefill_tokens"], d["decode_tokens"], d["num_running"], d["num_waiting"],
                            d["preemptions"], d["prefix_hit_tokens"]))
    return keys


def first_difference(a: Sequence[StepKey], b: Sequence[StepKey]) -> int | None:
    """The index of the first step where ``a`` and ``b`` differ (a length counts); None
    when they are the same."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
