"""Engine families: what ``--engine-family`` changes, in one table.

The simulated engine is vLLM V1 unless told otherwise. Each other engine it can be set up
as differs in its documented start-up defaults (token budget, sequence cap, chunked
prefill, prefix caching), in how it batches (prefill and decode in one step or apart,
scheduling the next step while the GPU runs this one), in how it sizes its KV cache,
in where its API front end runs, and in its step-time constants. ``FAMILY_RULES`` holds
all of that, one ``FamilyRules`` row per family, each value with its source; ``inferlab
sim run --engine-family`` and the validation against published rows
(``sim.validation``) read the same rows. What a benchmark *harness* adds on top of the
engine (trtllm-bench sizing the batch from the workload, LMDeploy's scripts raising the
batch to the user count) lives with the validation, not here.

A flag the user gives always wins over the family's default (``EngineConfig``).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from dataclasses import dataclass

from inferlab._errors import UsageError
from inferlab.sim.engine.dtypes import CapacityPolicy, parse_name
from inferlab.sim.engine.hardware import GpuSpec
from inferlab.sim.engine.steptime import DEFAULT_EFFICIENCIES, Efficiencies

_GIB = 2**30


class EngineFamily(enum.StrEnum):
    """An engine the simulator can be set up as (``--engine-family``)."""

    VLLM = "vllm"  # vLLM V1 (0.8 on)
    VLLM_V0 = "vllm-v0"  # vLLM V0 (0.6, 0.7)
    VLLM_V05 = "vllm-v0.5"  # vLLM <= 0.5: V0 with the API server in the engine's process
    SGLANG = "sglang"
    TRTLLM = "trtllm"  # TensorRT-LLM's C++ batch manager
    LMDEPLOY = "lmdeploy"  # LMDeploy's TurboMind (2023-24 releases)
    GENERIC = "generic"  # a named engine without rules of its own (TGI, ...): vLLM V1's

    @classmethod
    def parse(cls, value: str) -> EngineFamily:
        """The family ``value`` names; a one-line ``UsageError`` listing them if none."""
        return parse_name(_FAMILY_NAMES, value, "engine family")

    @property
    def rules(self) -> FamilyRules:
        """This family's row of ``FAMILY_RULES``."""
        return FAMILY_RULES[self]


_FAMILY_NAMES = {f.value: f for f in EngineFamily}


class BatchMixing(enum.StrEnum):
    """Whether one step may hold decodes and prefill (chunks) together."""

    ALWAYS = "always"
    NEVER = "never"  # prefill steps and decode steps apart
    WHEN_CHUNKED = "when chunked"  # only with chunked prefill; whole prompts run apart


@dataclass(frozen=True)
class FamilyRules:
    """Everything an engine family sets that a flag does not: its start-up defaults,
    how it batches and sizes its KV cache, and its step-time constants.

    The sizes are the engine's documented defaults, none fitted; only ``efficiencies``
    holds calibrated numbers (see ``steptime.Efficiencies``; fields not set there are
    vLLM V1's).
    """

    engine: str  # the engine and releases this family stands for
    # default token budget per step and cap on running sequences; None: vLLM V1's, which
    # depend on the GPU and on offline use (``vllm_batch_defaults``)
    max_num_batched_tokens: int | None
    max_num_seqs: int | None
    # without chunked prefill the default budget holds a whole prompt: max(max_model_len,
    # this) (vLLM V0's SchedulerConfig); None: ``max_num_batched_tokens`` either way
    whole_prompt_budget_floor: int | None
    chunked_prefill: bool  # chunks prefills by default ...
    chunked_prefill_above_len: int | None  # ... or only for a max_model_len over this
    prefix_caching: bool  # caches prompt prefixes by default
    mixed_batches: BatchMixing
    # schedules step k+1 while the GPU runs step k by default (from release
    # ``overlap_schedule_since`` on, when a release is known)
    overlap_schedule: bool
    overlap_schedule_since: tuple[int, int] | None
    # the API server shares the engine's process and event loop: accepting a request
    # stalls the engine (``Efficiencies.api_intake_s``) instead of running beside it
    front_end_in_process: bool
    # the KV cache gets this share of the memory left after weights and activations
    # (TRT-LLM's kv_cache_free_gpu_mem_fraction, LMDeploy's cache_max_entry_count);
    # None: gpu_memory_utilization of the whole GPU, less weights and activations (vLLM)
    kv_free_fraction: float | None
    efficiencies: Efficiencies
    # a token budget given below the default sequence cap lowers the cap to it; False:
    # the engine refuses to start, as vLLM does ("max_num_batched_tokens must be greater
    # than or equal to max_num_seqs"), until the cap is given too
    default_seqs_follow_budget: bool = True
    # the token budget bounds a step's decodes as well as its prompt chunks (vLLM, where a
    # decode is one of the step's tokens); False: it bounds prompt chunks only and every
    # running request decodes each decode step (SGLang's --chunked-prefill-size; its
    # mixed steps give the chunk the budget less the decodes), so the budget neither
    # lowers the sequence cap nor has to be at least as large
    budget_bounds_decodes: bool = True
    # vLLM V1 keeps one block of the KV cache as its null block: of N blocks (memory's
    # count, or --num-gpu-blocks-override N), N - 1 hold tokens
    null_block: bool = False
    # vLLM's --scheduler-reserve-full-isl default (0.19 on): a waiting or preempted
    # request is admitted only when free blocks hold its whole current sequence
    reserve_full_sequence: bool = False
    # SGLang's admission (``scheduler.SchedulerConfig.reserve_outputs``): a waiting
    # request is admitted only while free blocks hold its prompt and output beyond the
    # running requests' estimated outputs (``new_token_ratio``), and a retraction raises
    # the estimate
    reserve_outputs: bool = False
    # TensorRT-LLM's capacity scheduler when no flag says: GUARANTEED_NO_EVICT
    # (``scheduler.SchedulerConfig.no_evict``) admits a waiting request only while the
    # cache holds it to its output limit beside what the running requests may still take
    # to theirs; MAX_UTILIZATION, every other engine's way, admits on the first chunk
    capacity_policy: CapacityPolicy = CapacityPolicy.MAX_UTILIZATION
    # vLLM's free queue (0.24 on): a freed block without a hash (the partly filled tail)
    # goes to the front, to be reused first; hashed ones to the back (LRU)
    evict_unhashed_first: bool = False
    # the first releases with those two on by default (None: every release), for
    # validation rows that state their release
    reserve_full_sequence_since: tuple[int, int] | None = None
    evict_unhashed_first_since: tuple[int, int] | None = None
    # vLLM 0.5.5-0.7's multi-step scheduling (--num-scheduler-steps); V1 dropped the flag
    multi_step: bool = False
    # a max_tokens over what the context leaves after the prompt is lowered to it (the
    # answer ends "length") instead of refused with HTTP 400 (from release
    # ``clamp_max_tokens_since`` on, when a release is known; ``openai.context.output_limit``)
    clamp_max_tokens: bool = False
    clamp_max_tokens_since: tuple[int, int] | None = None
    # the OpenAI server is SGLang's: its checks against the context (a prompt of the whole
    # context refused, an answer cut two tokens short of it: ``openai.context.SGLangLimits``)
    # and its error body ({"object": "error", "message", "type", "param", "code"})
    sglang_api: bool = False

    def chunked_prefill_default(self, max_model_len: int) -> bool:
        """Whether prefills are chunked when no flag says, for this (declared) context."""
        above = self.chunked_prefill_above_len
        return self.chunked_prefill or (above is not None and max_model_len > above)

    def mixes_batches(self, chunked_prefill: bool) -> bool:
        """Whether a step mixes decodes with prefills when no flag says."""
        if self.mixed_batches is BatchMixing.WHEN_CHUNKED:
            return chunked_prefill
        return self.mixed_batches is BatchMixing.ALWAYS

    def reserve_full_sequence_in(self, version: tuple[int, int] | None) -> bool:
        """Whether release ``version`` (None: a current one) admits on the whole sequence."""
        return _on_in(self.reserve_full_sequence, self.reserve_full_sequence_since, version)

    def evict_unhashed_first_in(self, version: tuple[int, int] | None) -> bool:
        """Whether release ``version`` (None: a current one) reuses unhashed blocks first."""
        return _on_in(self.evict_unhashed_first, self.evict_unhashed_first_since, version)

    def clamp_max_tokens_in(self, version: tuple[int, int] | None) -> bool:
        """Whether release ``version`` (None: a current one) lowers a max_tokens over the
        context left instead of refusing the request."""
        return _on_in(self.clamp_max_tokens, self.clamp_max_tokens_since, version)

    @property
    def release_dated(self) -> bool:
        """Whether a default here changed with a release (``*_since``), so that stating a
        release (``--engine-version``) changes something."""
        return any(s is not None for s in (self.overlap_schedule_since, self.reserve_full_sequence_since,
                                           self.evict_unhashed_first_since, self.clamp_max_tokens_since))

    def overlap_schedule_in(self, version: tuple[int, int] | None) -> bool:
        """Whether release ``version`` (None: a current one) overlaps scheduling by default."""
        return _on_in(self.overlap_schedule, self.overlap_schedule_since, version)

    def batch_defaults(
        self, gpu: GpuSpec, *, offline: bool, chunked_prefill: bool, max_model_len: int
    ) -> tuple[int, int]:
        """The default ``(max_num_batched_tokens, max_num_seqs)`` on ``gpu`` for a
        declared context of ``max_model_len`` tokens."""
        if self.max_num_batched_tokens is None or self.max_num_seqs is None:
            return vllm_batch_defaults(gpu, offline)
        floor = self.whole_prompt_budget_floor
        if floor is not None and not chunked_prefill:
            return max(max_model_len, floor), self.max_num_seqs
        return self.max_num_batched_tokens, self.max_num_seqs


def _on_in(on: bool, since: tuple[int, int] | None, version: tuple[int, int] | None) -> bool:
    """A default that is ``on`` from release ``since`` (None: always), in ``version``
    (None: a current release)."""
    return on and (version is None or since is None or version >= since)


def vllm_batch_defaults(gpu: GpuSpec, offline: bool = False) -> tuple[int, int]:
    """vLLM V1's default ``(max_num_batched_tokens, max_num_seqs)`` for a GPU: larger on
    GPUs with >= 70 GiB other than the A100 (vLLM found large budgets slower there), and
    a doubled token budget for the offline ``LLM`` class (``EngineArgs.get_batch_defaults``)."""
    big = gpu.hbm_bytes >= 70 * _GIB and not gpu.name.upper().startswith("A100")
    if big:
        return (16384 if offline else 8192), 1024
    return (8192 if offline else 2048), 256


# vLLM V1's API server (``AsyncLLM`` in its own process): see ``_VLLM_V1``
# Its CPU costs are measured on vLLM's own API server (0.32, its CPU build serving the
# tiny generated model; ``python bench/vllm_front_end_cost.py``, three rounds, medians,
# this repository's 2-core dev VM taken as the typical host): intake 1.15 ms a request
# through the completions API and 0.35 ms more through the chat API's template (the
# chat API's 1.5 ms is kept: the common way in), 1.5 us a prompt token (tokenization,
# 1.4-1.6 measured), 38 us a streamed token (detokenization, SSE chunk; 31-47) and 0.3
# ms an engine step that streams any (the step's outputs taken as one message and
# counted in the metrics; 0.28-0.33). The fixed latency is what requests wait for
# outside the engine core on the fit hosts beyond that CPU (vLLM's own server on
# loopback here: 2.3 ms at one stream, CPU included): fitted on the `fit` rows of
# bench/data only, the vLLM V1 online rows of IOG (H100 PCIe and RTX 4090 nodes, 130
# rows), kvcached (H100), Musgrave (A100), llm-d and ai.wmx.dev (L4)
# (`python bench/fit_front_end.py --jobs 2`; docs/validation.md, "The front end's fit":
# 5 ms since IOG's whole published sweep came in; 27.5 ms on the first 15 rows). The
# engine core's per-sequence output cost stays 0 (the earlier grid over 0-45 us found none).
# Its host cost per scheduled sequence (scheduling, input preparation, output processing)
# is 20 us: fitted with the latency on the same rows once the front end's queue took
# arrivals in time order (`bench/fit_front_end.py --per-seq-us 5,10,15,20,25,30`: 5 ms and
# 20 us by the grid's rule; docs/validation.md, "A request that arrived during a step"),
# on a grid bounded by the 22-28 us of host time a sequence measured on vLLM's own engine
# core and worker (`bench/vllm_host_cost.py`); past 30 us the fit rows would take more.
_V1_FRONT_END = dataclasses.replace(
    DEFAULT_EFFICIENCIES,
    per_seq_s=20e-6,  # the engine core's host cost per scheduled sequence, fitted (see above)
    api_overhead_s=0.005,  # latency off the CPU queue, fitted (see above)
    api_intake_s=1.5e-3,  # CPU per request: HTTP, validation, chat template (measured)
    api_intake_per_token_s=1.5e-6,  # CPU per prompt token: tokenization (measured)
    api_stream_s=38e-6,  # CPU per streamed token: detokenize, SSE chunk (measured)
    api_stream_per_step_s=0.3e-3,  # CPU per engine step streamed: its outputs as one message (measured)
    api_per_seq_s=0.0,  # the engine core's per-sequence output cost: the fit found none
)

_VLLM_V1 = FamilyRules(
    engine="vLLM V1 (0.8 on; async scheduling, KV admission and free-queue order as in 0.32)",
    max_num_batched_tokens=None,  # by GPU: 8192 / 1024 on H100/H200, 2048 / 256 elsewhere
    max_num_seqs=None,
    whole_prompt_budget_floor=None,
    chunked_prefill=True,
    chunked_prefill_above_len=None,
    prefix_caching=True,
    mixed_batches=BatchMixing.ALWAYS,
    # --async-scheduling: opt-in since it came (PR #19970, June 2025), on by default since vLLM
    # PR #27614 (the async-scheduling plan, issue #27679; SchedulerConfig.async_scheduling
    # None, which VllmConfig turns on unless a feature in use is incompatible), first
    # released in 0.14 (its release notes: "Async scheduling is now enabled by default",
    # not with pipeline parallelism or the CPU backend; 0.13.0 had it off)
    overlap_schedule=True,
    overlap_schedule_since=(0, 14),
    front_end_in_process=False,
    kv_free_fraction=None,
    # CUDA graphs, ~0.7 ms host cost per step: the defaults of ``Efficiencies``; the API
    # server is its own process (``frontend``): intake and streaming queue on its CPU,
    # apart from the engine core's steps. Fitted on the `fit` rows of bench/data only
    # (bench/fit_front_end.py; docs/validation.md)
    efficiencies=_V1_FRONT_END,
    default_seqs_follow_budget=False,  # vLLM's SchedulerConfig refuses a budget below the cap
    null_block=True,
    # checked step by step against vLLM 0.32's own scheduler (its CPU build): both
    # needed for every step of a preempting 512-in/512-out burst to match
    reserve_full_sequence=True,
    evict_unhashed_first=True,
    # --scheduler-reserve-full-isl came with vLLM PR #37307 (March 2026), first released in
    # 0.19 and on by default there (0.18 has no such option; 0.19.0's SchedulerConfig:
    # scheduler_reserve_full_isl = True); the free queue's order changed in 0.24 (0.23
    # appends every freed block)
    reserve_full_sequence_since=(0, 19),
    evict_unhashed_first_since=(0, 24),
    # prompt + max_tokens over the context: 0.32 lowers max_tokens to what the context
    # leaves (measured on its CPU build: prompt 11 + max_tokens 505 on a 512-token context
    # answered 501 tokens, finish_reason length); 0.31.0 refused it with HTTP 400 (its
    # released renderers/params.py: TokenizeParams.max_input_tokens = max_total_tokens -
    # max_output_tokens, checked by _token_len_check, as in issue #42474 on 0.20; 0.32.0's
    # no longer subtracts, and get_max_tokens lowers max_tokens: the change vLLM PR #57035
    # proposes). First released in 0.32. In both, max_tokens over the whole context is a 400
    clamp_max_tokens=True,
    clamp_max_tokens_since=(0, 32),
)

_VLLM_V0 = FamilyRules(
    engine="vLLM V0 (0.6, 0.7)",
    # 256 sequences; a prefill step takes up to max(max_model_len, 2048) tokens, or 512 a
    # step when chunked
    max_num_batched_tokens=512,
    max_num_seqs=256,
    whole_prompt_budget_floor=2048,
    # chunked prefill only for a context over 32,768 tokens (vLLM's use_long_context)
    chunked_prefill=False,
    chunked_prefill_above_len=32768,
    prefix_caching=False,  # opt-in --enable-prefix-caching
    mixed_batches=BatchMixing.WHEN_CHUNKED,  # whole prompts run in prefill-only steps
    overlap_schedule=False,
    overlap_schedule_since=None,
    front_end_in_process=False,
    kv_free_fraction=None,
    # Scheduling, input preparation and output processing run between GPU steps in the
    # engine process (no overlap), about twice V1's host cost per step; its API server
    # path adds ~28 ms before a request is scheduled (fit: vLLM's own CI, Llama-3-70B TP4
    # at 1 req/s on H100 and H200, mean TTFT 62.4 / 65.9 ms against 39.0 / 32.2 ms of
    # prefill and scheduling alone: offsets of 23.5 and 33.7 ms, whose least-squares fit
    # in relative error is 28.3 ms).
    efficiencies=Efficiencies(cpu_step_s=1.5e-3, api_overhead_s=0.028),
    default_seqs_follow_budget=False,  # vLLM's SchedulerConfig refuses a budget below the cap
    multi_step=True,
)

FAMILY_RULES: dict[EngineFamily, FamilyRules] = {
    EngineFamily.VLLM: _VLLM_V1,
    EngineFamily.VLLM_V0: _VLLM_V0,
    # the same engine as V0 with the OpenAI server in its own process and event loop
    # (vLLM's v0.6.0 post: 33 % of 0.5.3's time went to the HTTP server): vLLM <= 0.5
    # tokenized and registered new requests inside its engine loop, in the step that can
    # first schedule them. Accepting a request stalls the engine loop: a burst of 1,280
    # requests got its first token after 3.26 s on an H100 (Lambda's 0.5.4 runs), 2.5 ms
    # per request.
    EngineFamily.VLLM_V05: dataclasses.replace(
        _VLLM_V0,
        engine="vLLM 0.5 and earlier",
        front_end_in_process=True,
        efficiencies=dataclasses.replace(_VLLM_V0.efficiencies, api_intake_s=2.5e-3),
    ),
    EngineFamily.SGLANG: FamilyRules(
        engine="SGLang",
        # --chunked-prefill-size 8192, effectively no sequence cap
        max_num_batched_tokens=8192,
        max_num_seqs=4096,
        whole_prompt_budget_floor=None,
        chunked_prefill=True,
        chunked_prefill_above_len=None,
        prefix_caching=True,  # the radix cache
        mixed_batches=BatchMixing.NEVER,  # (--enable-mixed-chunk is opt-in)
        # the overlap scheduler, the default since 0.4: a request that arrives during a
        # step is seen one step later
        overlap_schedule=True,
        overlap_schedule_since=(0, 4),
        reserve_outputs=True,
        # --chunked-prefill-size bounds prefill chunks; a decode batch is every running
        # request (up to --max-running-requests)
        budget_bounds_decodes=False,
        front_end_in_process=False,
        kv_free_fraction=None,
        # The overlap scheduler hides most host work behind the GPU step. The latency
        # outside the engine, fitted on SGLang's fit rows only (``bench/fit_front_end.py
        # --family sglang``: its v0.3 benchmark on A100/H100 and DataCrunch's 0.4 on
        # H200): 20 ms since the GEMMs' share of peak was fitted (0.70 → 0.60; 25 ms
        # before, docs/validation.md, "GEMMs' share of peak"). (It was 15 ms, a median of
        # low-load TTFTs above prefill and scheduling read before the split from three
        # sources, one of them GPUStack's SGLang 0.5 on H100, held out since:
        # docs/validation.md, "SGLang's latency".)
        efficiencies=Efficiencies(cpu_step_s=0.3e-3, api_overhead_s=0.020),
        sglang_api=True,
    ),
    EngineFamily.TRTLLM: FamilyRules(
        engine="TensorRT-LLM",
        max_num_batched_tokens=8192,  # max_num_tokens
        max_num_seqs=2048,  # max_batch_size
        whole_prompt_budget_floor=None,
        chunked_prefill=True,
        chunked_prefill_above_len=None,
        prefix_caching=True,  # KV cache reuse
        mixed_batches=BatchMixing.ALWAYS,
        # (its C++ batch manager, whose rows set the constants, does not overlap)
        overlap_schedule=False,
        overlap_schedule_since=None,
        front_end_in_process=False,
        kv_free_fraction=0.9,  # kv_cache_free_gpu_mem_fraction
        # its default capacity scheduler policy (CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
        # in trtllm-serve, trtllm-bench and the LLM API alike)
        capacity_policy=CapacityPolicy.GUARANTEED_NO_EVICT,
        # C++ batch manager (~1 us per sequence), overlap scheduler, XQA decode attention
        # streaming the (fp8) KV cache closer to peak bandwidth. Its fp8 GEMMs are tuned
        # per shape and stream weights as well as bf16's.
        efficiencies=Efficiencies(
            cpu_step_s=0.3e-3,
            per_seq_s=1e-6,
            kv_stream=0.85,
            w8_stream_factor=1.0,
            api_overhead_s=0.015,
        ),
    ),
    EngineFamily.LMDEPLOY: FamilyRules(
        engine="LMDeploy TurboMind (2023-24)",
        # max_batch_size 128 and no token budget: it prefills every admitted request
        # before the next decode
        max_num_batched_tokens=2**20,
        max_num_seqs=128,
        whole_prompt_budget_floor=None,
        chunked_prefill=False,  # whole prompts
        chunked_prefill_above_len=None,
        prefix_caching=False,
        mixed_batches=BatchMixing.ALWAYS,
        overlap_schedule=False,
        overlap_schedule_since=None,
        front_end_in_process=False,
        kv_free_fraction=0.8,  # cache_max_entry_count
        # C++ persistent batch, FasterTransformer-style decode attention; its 2023-24
        # releases all-reduce through NCCL (no custom all-reduce): ~25 us each.
        efficiencies=Efficiencies(
            cpu_step_s=0.3e-3,
            per_seq_s=1e-6,
            kv_stream=0.85,
            allreduce_latency_s=25e-6,
            api_overhead_s=0.002,  # its benchmarks drive the engine in-process
            api_per_seq_s=0.0,
        ),
    ),
    # a named engine without rules of its own: vLLM V1's, untuned
    # (but no asynchronous scheduling, and no vLLM releases: its version numbers are another engine's)
    EngineFamily.GENERIC: dataclasses.replace(
        _VLLM_V1, engine="another engine (TGI, nano-vllm, ...)", overlap_schedule=False, overlap_schedule_since=None,
        reserve_full_sequence_since=None, evict_unhashed_first_since=None,
        clamp_max_tokens=False, clamp_max_tokens_since=None,  # (its own rule unknown: the 400 kept)
    ),
}


_NOT_BATCHING = re.compile(r"llama\.?cpp|ollama|exllama|mlc|ctranslate|deepspeed|onnx|mlx")
_NO_ENGINE = re.compile(r"not stated|unknown|unspecified|^\s*$", re.IGNORECASE)


def family_for_engine(engine: str, version: tuple[int, int] | None) -> EngineFamily:
    """The family that models an engine named in free text, as benchmark pages write it
    ('vLLM', 'TensorRT-LLM', 'NIM, TensorRT-LLM backend assumed'), at release ``version``
    (None: not stated). An engine named anywhere in the text counts.

    vLLM before 0.6 is ``vllm-v0.5`` (the OpenAI server in the engine's process), before
    0.8 ``vllm-v0``. Raises ``UsageError`` for an engine that is not a continuous-batching
    server modelled here, and for text that names no engine: no family's constants are
    evidence for an unknown stack."""
    e = engine.lower()
    if _NOT_BATCHING.search(e):
        raise UsageError(f"engine {engine!r}: not a continuous-batching engine we model")
    if "sglang" in e:
        return EngineFamily.SGLANG
    if re.search(r"tensorrt|trt-?llm", e):
        return EngineFamily.TRTLLM
    if re.search(r"lmdeploy|turbomind", e):
        return EngineFamily.LMDEPLOY
    if "vllm" in e and "nano" not in e:  # also NIM or Triton with their vLLM backend
        if version is not None and version < (0, 6):
            return EngineFamily.VLLM_V05
        return EngineFamily.VLLM_V0 if version is not None and version < (0, 8) else EngineFamily.VLLM
    if re.search(r"triton|\bnim\b", e):  # serving these models through TensorRT-LLM
        return EngineFamily.TRTLLM
    if _NO_ENGINE.search(e):
        raise UsageError("engine not stated: no engine family to take constants from")
    return EngineFamily.GENERIC
