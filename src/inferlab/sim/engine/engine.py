"""The simulated engine: scheduler + KV/prefix cache + step-time model, without a clock.

The caller owns time. It adds requests and calls ``step(now_s)``; each step reports its
duration and the tokens it emits at ``now_s + duration_s``. The same engine runs behind
the HTTP server in real time and in virtual time (``_virtual.run_virtual``). The engine
decides nothing about text: a request emits exactly ``output_len`` tokens.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from inferlab._errors import UsageError
from inferlab.sim.engine.hardware import GpuSpec, quantization_from_name, resolve_gpu, resolve_model
from inferlab.sim.engine.kvcache import KVCacheManager, hash_blocks
from inferlab.sim.engine.scheduler import Batch, Request, SchedulerConfig
from inferlab.sim.engine.steady import SteadyScheduler
from inferlab.sim.engine.steptime import (
    QUANTIZATIONS,
    RooflineStepTime,
    StepTimeModel,
    activation_reserve_bytes,
    family_efficiencies,
    kv_bytes_per_token,
    load_efficiencies,
    weight_bytes_per_rank,
)

_GIB = 2**30
# a step starting within this of the previous one's end follows it back to back
_BACK_TO_BACK_S = 1e-6


@dataclass(frozen=True)
class EngineConfig:
    """vLLM-named engine flags with vLLM's defaults.

    ``None`` means "the engine family's default" (``family_defaults``): for vLLM V1,
    ``max_num_batched_tokens`` / ``max_num_seqs`` from the GPU and whether the engine runs
    offline (vLLM's ``LLM`` class) or as a server; the other families start from their
    own documented defaults. ``max_model_len`` is the model's context length, capped to
    what the KV cache holds.
    """

    model: str = "Qwen/Qwen2.5-7B-Instruct"
    gpu: str = "H100"
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    block_size: int = 16
    enable_prefix_caching: bool | None = None  # None: the family's (on; off for vLLM V0, TurboMind)
    enable_chunked_prefill: bool | None = None  # None: the family's default
    enforce_eager: bool = False
    dtype: str = "auto"  # auto|bfloat16|float16
    quantization: str | None = None  # None|fp8|int8|awq|gptq
    kv_cache_dtype: str = "auto"  # auto|fp8
    efficiencies_path: str | None = None
    engine_family: str = "vllm"  # vllm (V1), vllm-v0 (0.6-0.7), vllm-v0.5, sglang, trtllm, lmdeploy
    api_overhead_s: float | None = None  # per-request API cost before queueing; None: the family's
    num_gpu_blocks_override: int | None = None  # fix the KV cache size (tests, what-ifs)
    # TRT-LLM / LMDeploy size the KV cache as this share of the memory left after weights
    # and activations (not gpu_memory_utilization of the GPU); None: the family's way
    kv_cache_free_fraction: float | None = None
    offline: bool = False  # size the scheduler like vLLM's offline LLM class, not its server
    # vLLM 0.5.5-0.7 --num-scheduler-steps: a decode batch runs this many steps before the
    # scheduler runs again (new requests wait for the group to end); 1: every step
    num_scheduler_steps: int = 1
    # a step mixes decodes with prefill chunks (vLLM V1, V0 with chunked prefill, TRT-LLM)
    # or runs prefill and decode steps apart (SGLang; vLLM V0 without chunking); None: the
    # family's way
    mixed_batches: bool | None = None
    # the host schedules step k+1 while the GPU runs step k (SGLang's overlap scheduler,
    # on by default since 0.4; vLLM's --async-scheduling): a request that arrives during
    # a step is seen one step later. None: the family's way (on for sglang)
    overlap_schedule: bool | None = None


_VLLM_V0 = ("vllm-v0", "vllm-v0.5")


def family_mixes_batches(family: str, enable_chunked_prefill: bool) -> bool:
    """Whether an engine family's steps mix decodes with prefills by default."""
    if family == "sglang":
        return False
    return not (family in _VLLM_V0 and not enable_chunked_prefill)


def family_front_end_in_process(family: str) -> bool:
    """Whether the API server shares the engine's process and event loop (vLLM <= 0.5):
    its work on a request stalls the engine instead of running beside it."""
    return family == "vllm-v0.5"


def family_chunked_default(family: str, declared_len: int) -> bool:
    """Whether an engine family chunks prefills by default. vLLM V0 (0.5/0.6) turns it on
    only for a ``max_model_len`` over 32,768 tokens; TurboMind (LMDeploy 2023-24) prefills
    whole prompts; vLLM V1, SGLang and TRT-LLM chunk."""
    if family in _VLLM_V0:
        return declared_len > 32768  # vLLM's ``use_long_context``
    return family != "lmdeploy"


def family_prefix_caching_default(family: str) -> bool:
    """Whether an engine family caches prompt prefixes by default: vLLM V1, SGLang's radix
    cache and TRT-LLM's KV reuse do; vLLM V0 (opt-in ``--enable-prefix-caching``) and
    TurboMind (2023-24) do not."""
    return family not in _VLLM_V0 and family != "lmdeploy"


def family_overlap_default(family: str) -> bool:
    """Whether an engine family schedules the next step while the GPU runs this one by
    default: SGLang (>= 0.4) does; the vLLM families here and TRT-LLM's C++ batch manager,
    whose rows set the constants, do not."""
    return family == "sglang"


def _with_family_switches(config: EngineConfig, declared_len: int) -> EngineConfig:
    """``config`` with the on/off switches it leaves open (chunked prefill, prefix
    caching, mixed batches, overlap scheduling) set to its engine family's defaults."""
    family = config.engine_family
    chunked = config.enable_chunked_prefill
    if chunked is None:
        chunked = family_chunked_default(family, declared_len)
    caching = config.enable_prefix_caching
    if caching is None:
        caching = family_prefix_caching_default(family)
    mixed = config.mixed_batches
    if mixed is None:
        mixed = family_mixes_batches(family, chunked)
    overlap = config.overlap_schedule
    if overlap is None:
        overlap = family_overlap_default(family)
    return dataclasses.replace(
        config, enable_chunked_prefill=chunked, enable_prefix_caching=caching, mixed_batches=mixed,
        overlap_schedule=overlap,
    )


# The fraction of the memory left after weights and activations that TRT-LLM
# (``kv_cache_free_gpu_mem_fraction``) and LMDeploy (``cache_max_entry_count``) give the
# KV cache; the other families size it as ``gpu_memory_utilization`` of the whole GPU.
KV_FREE_FRACTION: dict[str, float] = {"trtllm": 0.9, "lmdeploy": 0.8}


def family_defaults(
    family: str, gpu: GpuSpec, *, offline: bool, chunked: bool, declared_len: int
) -> tuple[int, int]:
    """An engine family's default ``(max_num_batched_tokens, max_num_seqs)``: each
    engine's documented start-up values, none fitted.

    - vLLM V1 (and engines without a set of their own): ``vllm_batch_defaults``.
    - vLLM V0: 256 sequences; a prefill step takes up to ``max(max_model_len, 2048)``
      tokens, or 512 a step when chunked.
    - SGLang: ``--chunked-prefill-size`` 8192, effectively no sequence cap.
    - TRT-LLM: ``max_num_tokens`` 8192, ``max_batch_size`` 2048.
    - LMDeploy TurboMind: ``max_batch_size`` 128 and no token budget (it prefills every
      admitted request before the next decode).
    """
    if family in _VLLM_V0:
        return (512 if chunked else max(declared_len, 2048)), 256
    if family == "sglang":
        return 8192, 4096
    if family == "trtllm":
        return 8192, 2048
    if family == "lmdeploy":
        return 2**20, 128
    return vllm_batch_defaults(gpu, offline)


def vllm_batch_defaults(gpu: GpuSpec, offline: bool = False) -> tuple[int, int]:
    """vLLM V1's default ``(max_num_batched_tokens, max_num_seqs)`` for a GPU: larger on
    GPUs with >= 70 GiB other than the A100 (vLLM found large budgets slower there), and
    a doubled token budget for the offline ``LLM`` class (``EngineArgs.get_batch_defaults``)."""
    big = gpu.hbm_bytes >= 70 * _GIB and not gpu.name.upper().startswith("A100")
    if big:
        return (16384 if offline else 8192), 1024
    return (8192 if offline else 2048), 256


@dataclass
class RequestTimeline:
    """The engine's own view of one request, in seconds on the caller's timeline.

    ``scheduled_s`` is the start of the first step that ran it; ``first_token_s`` and
    ``finished_s`` the ends of the steps that emitted its first and last tokens.
    ``cached_tokens`` are prefix-cache hits at first scheduling. ``None``: not yet.
    """

    arrival_s: float
    scheduled_s: float | None
    first_token_s: float | None
    finished_s: float | None
    cached_tokens: int
    preemptions: int
    prompt_tokens: int
    output_tokens: int
    token_times_s: list[float] = field(default_factory=list)  # filled with record_token_times


@dataclass(frozen=True)
class TokenEvent:
    """Request ``request_id`` emitted token ``token_index`` (from 0); ``finished``: its last."""

    request_id: str
    token_index: int
    finished: bool


@dataclass(frozen=True)
class StepStats:
    """One step: counts after it ran; ``preemptions`` and ``prefix_hit_tokens`` during it."""

    start_s: float
    duration_s: float
    num_running: int
    num_waiting: int
    prefill_tokens: int
    decode_tokens: int
    kv_usage: float
    preemptions: int
    prefix_hit_tokens: int


@dataclass(frozen=True)
class StepResult:
    """A step's duration and the tokens it emits at ``stats.start_s + duration_s``."""

    duration_s: float
    events: list[TokenEvent]
    stats: StepStats
    finished: list[str] = field(default_factory=list)  # ids of the requests that ended


class Engine:
    """A vLLM-V1-like engine in simulation; see the module docstring.

    Construction raises ``UsageError`` for unknown model/GPU/dtype names and
    ``ValueError`` for configurations vLLM would refuse (weights that do not fit, no room
    for one ``max_model_len`` sequence in the KV cache, TP not dividing the heads, ...).
    """

    def __init__(
        self,
        config: EngineConfig,
        step_time: StepTimeModel | None = None,
        *,
        record_token_times: bool = False,
    ) -> None:
        """``record_token_times``: keep every token's emission time in each request's
        timeline (virtual-time runs need them for ITL; the HTTP server does not)."""
        self._record_token_times = record_token_times
        model = resolve_model(config.model)
        if config.quantization is None:  # vLLM takes it from the checkpoint: its config, ...-AWQ, -FP8
            if model.quantization is not None and model.quantization not in QUANTIZATIONS:
                raise UsageError(
                    f"{config.model}: the checkpoint's quantization {model.quantization!r} is not simulated; "
                    f"give --quantization {'|'.join(QUANTIZATIONS)} to model it as one of those"
                )
            config = dataclasses.replace(config, quantization=model.quantization or quantization_from_name(config.model))
        elif config.quantization == "gptq" and "w8a16" in (model.quantization, quantization_from_name(config.model)):
            # vLLM's gptq/gptq_marlin name a format; the checkpoint says 8 bits
            config = dataclasses.replace(config, quantization="w8a16")
        gpu = resolve_gpu(config.gpu)
        self.gpu: GpuSpec = gpu  # the preset ``config.gpu`` names
        path = config.efficiencies_path
        family = family_efficiencies(config.engine_family)
        eff = load_efficiencies(path, family) if path else family
        tp = config.tensor_parallel_size
        _validate_flags(config, model.max_position_embeddings)
        auto_budget = config.max_num_batched_tokens is None
        declared_len = config.max_model_len or model.max_position_embeddings
        config = _with_family_switches(config, declared_len)
        chunked, caching, mixed = config.enable_chunked_prefill, config.enable_prefix_caching, config.mixed_batches
        assert chunked is not None and caching is not None and mixed is not None
        batched, seqs = family_defaults(
            config.engine_family, gpu, offline=config.offline, chunked=chunked, declared_len=declared_len
        )
        batched = config.max_num_batched_tokens or batched
        # a default sequence cap never exceeds a given token budget
        seqs = config.max_num_seqs or min(seqs, batched)
        roofline = RooflineStepTime(
            model,
            gpu,
            tp,
            config.dtype,
            config.quantization,
            config.kv_cache_dtype,
            config.enforce_eager,
            eff,
            serving=not config.offline,
        )
        self._step_time: StepTimeModel = step_time or roofline
        # the roofline when it is the step time: steady decodes (``Scheduler.lazy``) need
        # its step time from sums, and multi-step groups its scheduling cost
        self._roofline = roofline if step_time is None else None
        #: keep decodes with nothing to do out of the per-step passes in virtual-time
        #: steps (same results; False visits every request every step)
        self.steady_decodes = True

        usable = config.gpu_memory_utilization * gpu.hbm_bytes
        weights = weight_bytes_per_rank(model, tp, config.quantization)
        if weights >= usable:
            raise ValueError(
                f"{model.name} weights need {weights / _GIB:.1f} GiB per GPU but "
                f"gpu_memory_utilization={config.gpu_memory_utilization} of {gpu.name} gives "
                f"{usable / _GIB:.1f} GiB; use a larger tensor_parallel_size, quantization "
                "or GPU."
            )
        block_bytes = kv_bytes_per_token(model, tp, config.kv_cache_dtype) * config.block_size
        free_fraction = config.kv_cache_free_fraction
        if free_fraction is None:
            free_fraction = KV_FREE_FRACTION.get(config.engine_family)
        if free_fraction is None:
            reserve = activation_reserve_bytes(model, tp, batched, seqs, eff)
            num_blocks = int(max(0.0, usable - weights - reserve) // block_bytes)
        else:  # a share of what is left after weights and a profile run of <= 8192 tokens
            reserve = activation_reserve_bytes(model, tp, min(batched, 8192), seqs, eff)
            num_blocks = max(0, int(free_fraction * (gpu.hbm_bytes - weights - reserve) // block_bytes))
        if config.num_gpu_blocks_override is not None:
            num_blocks = config.num_gpu_blocks_override
        if num_blocks < 1:
            raise ValueError(
                f"No available memory for the cache blocks: {model.name} weights take "
                f"{weights / _GIB:.1f} GiB and activations {reserve / _GIB:.1f} GiB of the "
                f"{usable / _GIB:.1f} GiB gpu_memory_utilization allows on {gpu.name}."
            )
        # the model's context when not given, as much of it as the cache holds
        max_len = config.max_model_len or min(model.max_position_embeddings, num_blocks * config.block_size)
        if auto_budget:  # unchunked, the default budget holds one prompt; and all seqs
            batched = max(batched, seqs, 0 if chunked else max_len)
        api_s = config.api_overhead_s
        if api_s is None:  # offline (vLLM's LLM class) there is no API server
            api_s = 0.0 if config.offline else eff.api_overhead_s
        config = dataclasses.replace(
            config, max_model_len=max_len, max_num_batched_tokens=batched, max_num_seqs=seqs,
            api_overhead_s=api_s,
        )
        self.api_overhead_s = api_s
        # the API front end accepts requests one at a time (offline: there is none)
        self._intake_s = 0.0 if config.offline else eff.api_intake_s
        self._intake_stalls_engine = family_front_end_in_process(config.engine_family)
        self._front_free_s = 0.0  # when the front end has accepted every request so far
        # (ready time, intake cost, id) of requests the engine still has to accept, when
        # the front end runs in the engine's process: vLLM <= 0.5 tokenized and registered
        # new requests inside its engine loop, in the step that can first schedule them.
        self._intake_queue: deque[tuple[float, float, str]] = deque()
        # overlap scheduling: a step that follows another back to back was scheduled
        # while that one ran, so it sees only the requests ready by that one's start
        self._overlap = bool(config.overlap_schedule)
        self._last_start_s = -math.inf  # the last step that ran a batch: its start ...
        self._last_end_s = -math.inf  # ... and end
        _validate_sizes(config)
        if num_blocks * config.block_size < max_len:
            raise ValueError(
                f"The model's max seq len ({config.max_model_len}) is larger than the maximum "
                f"number of tokens that can be stored in KV cache "
                f"({num_blocks * config.block_size}). Try increasing gpu_memory_utilization "
                "or decreasing max_model_len when initializing the engine."
            )
        self._kv = KVCacheManager(num_blocks, config.block_size, caching)
        self.config = config
        #: the resolved scheduler sizes (``config`` holds the same numbers, typed optional)
        self.limits = SchedulerConfig(batched, seqs, max_len, chunked, mixed, config.num_scheduler_steps)
        # the reference scheduler, with steady decodes kept as sums in virtual-time steps
        self._scheduler = SteadyScheduler(self.limits, self._kv)
        self._active: dict[str, Request] = {}
        self._timelines: dict[str, RequestTimeline] = {}
        self._num_added = 0
        self.preemptions_total = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    @property
    def record_token_times(self) -> bool:
        """Whether each token's emission time is kept in its request's timeline."""
        return self._record_token_times

    @record_token_times.setter
    def record_token_times(self, on: bool) -> None:  # (also for requests already queued)
        self._scheduler.wake_all()
        self._record_token_times = on
        for rid, req in self._active.items():
            req.token_times = self._timelines[rid].token_times_s if on else None

    # --- requests -------------------------------------------------------------------

    def add_request(
        self, request_id: str, prompt_ids: Sequence[int], output_len: int, now_s: float
    ) -> None:
        """Queue a request arriving at ``now_s``; it becomes schedulable after the API cost.
        ``prompt_ids`` are read (length, block hashes), not kept.

        Raises ``ValueError`` if it exceeds ``max_model_len``, can never fit in the KV
        cache, is empty, or reuses the id of an unfinished request.
        """
        if request_id in self._active:
            raise ValueError(f"request id {request_id!r} is already running")
        self._scheduler.check_fits(len(prompt_ids), output_len)
        bs = self.config.block_size
        hashes = hash_blocks(prompt_ids, bs) if self.config.enable_prefix_caching else []
        timeline = RequestTimeline(now_s, None, None, None, 0, 0, len(prompt_ids), 0)
        ready_s = now_s + self.api_overhead_s
        if self._intake_s:
            if self._intake_stalls_engine:  # the engine loop waits while it is accepted
                self._intake_queue.append((ready_s, self._intake_s, request_id))
            else:  # a burst queues at the front end
                self._front_free_s = max(self._front_free_s, now_s) + self._intake_s
                ready_s = max(ready_s, self._front_free_s)
        req = Request(request_id, len(prompt_ids), output_len, hashes, self._num_added, ready_s)
        if self._record_token_times:
            req.token_times = timeline.token_times_s
        self._num_added += 1
        self._active[request_id] = req
        self._timelines[request_id] = timeline
        self._scheduler.add(req)

    def abort(self, request_id: str) -> None:
        """Stop a request and free its blocks; its timeline stays. Unknown ids: no-op."""
        req = self._active.pop(request_id, None)
        if req is not None:
            self._scheduler.abort(req)  # (writes back a steady request's counters first)
            self._timelines[request_id].output_tokens = req.num_output_tokens

    def timeline(self, request_id: str) -> RequestTimeline:
        """A copy of the request's timeline; ``KeyError`` if unknown or forgotten."""
        tl = dataclasses.replace(self._timelines[request_id])
        tl.token_times_s = list(tl.token_times_s)  # a snapshot, like the rest of the copy
        req = self._active.get(request_id)
        if req is not None:  # (kept up to date here, not at every token)
            since = self._scheduler.steady_since(req)
            tl.output_tokens = req.num_output_tokens + len(since)
            if since and req.token_times is not None:
                tl.token_times_s += since
        return tl

    def forget(self, request_id: str) -> RequestTimeline | None:
        """Drop a request's timeline (aborting it if still active) and return it, complete
        (no longer the engine's, so not a copy); ``None`` if unknown."""
        self.abort(request_id)
        return self._timelines.pop(request_id, None)

    # --- stepping -------------------------------------------------------------------

    def has_work(self) -> bool:
        return self._scheduler.has_work()

    def step(self, now_s: float, *, token_events: bool = True) -> StepResult | None:
        """Run one step starting at ``now_s``; ``None`` only when ``has_work()`` is False.

        When the only waiting requests are still inside their API cost, the result is an
        idle step: no tokens, lasting until the first of them becomes schedulable.
        """
        return self._step(now_s, [] if token_events else None)

    def _step(self, now_s: float, events: list[TokenEvent] | None) -> StepResult | None:
        """``step``; with ``events=None`` no TokenEvents are built (virtual-time runs)."""
        sched = self._scheduler
        if not sched.has_work():
            return None
        # without per-token events, decodes with nothing to do may stay steady
        sched.lazy = events is None and self.steady_decodes and self._roofline is not None
        # the time up to which arrivals are seen: with overlap scheduling, a step that
        # follows another back to back was chosen while that one ran, at its start
        busy = self._overlap and now_s <= self._last_end_s + _BACK_TO_BACK_S
        seen_s = self._last_start_s if busy else now_s
        batch = sched.schedule(seen_s)
        preempted = batch.preempted
        if not batch.num_seqs and preempted:
            batch = sched.schedule(seen_s)  # everything was preempted; now the head fits
            preempted = preempted + batch.preempted
        if busy and not batch.num_seqs:  # nothing was scheduled ahead: the host schedules now
            seen_s = now_s
            batch = sched.schedule(now_s)
            preempted = preempted + batch.preempted
        timelines = self._timelines
        for req in preempted:
            timelines[req.request_id].preemptions = req.num_preemptions
        if not batch.num_seqs:
            ready_s = sched.next_ready_s()
            if ready_s is None or ready_s <= now_s:
                raise RuntimeError("scheduler made no progress with a schedulable request")
            stats = self._stats(now_s, ready_s - now_s, batch, len(preempted))
            return StepResult(ready_s - now_s, events if events is not None else [], stats)
        if batch.steady and self._roofline is not None:
            duration_s = self._roofline.step_time_s(batch.seqs, batch.emitting, batch.steady, batch.steady_context)
        else:
            duration_s = self._step_time.step_time_s(batch.seqs, batch.emitting)
        if batch.continuation and self._roofline is not None:  # scheduled with the group's first step
            duration_s -= self._roofline.scheduling_s(batch.num_seqs)
        intake, active = self._intake_queue, self._active
        while intake and intake[0][0] <= seen_s + 1e-9:
            _, cost, rid = intake.popleft()
            if rid in active:  # (one aborted before it reached the engine costs nothing)
                duration_s += cost
        end_s = now_s + duration_s
        self._last_start_s, self._last_end_s = now_s, end_s
        for req in batch.admitted:
            tl = timelines[req.request_id]
            if tl.scheduled_s is None:
                tl.scheduled_s = now_s
                tl.cached_tokens = req.num_computed_tokens
        emitted: list[Request] | None = [] if events is not None else None
        first, finished = sched.finish_step(batch, end_s, emitted)
        for req in first:
            timelines[req.request_id].first_token_s = end_s
            self.prompt_tokens_total += req.num_prompt_tokens
        if events is not None and emitted is not None:
            for req in emitted:
                done = req.num_output_tokens == req.max_output_tokens
                events.append(TokenEvent(req.request_id, req.num_output_tokens - 1, done))
        for req in finished:
            tl = timelines[req.request_id]
            tl.finished_s = end_s
            tl.output_tokens = req.num_output_tokens
            del self._active[req.request_id]
        self.generation_tokens_total += batch.emitting
        self.preemptions_total += len(preempted)
        stats = self._stats(now_s, duration_s, batch, len(preempted))
        ids = [req.request_id for req in finished]
        return StepResult(duration_s, events if events is not None else [], stats, ids)

    def _stats(self, now_s: float, duration_s: float, batch: Batch, preemptions: int) -> StepStats:
        return StepStats(
            start_s=now_s,
            duration_s=duration_s,
            num_running=len(self._scheduler.running),
            num_waiting=len(self._scheduler.waiting),
            prefill_tokens=batch.prefill_tokens,
            decode_tokens=batch.decode_tokens,
            kv_usage=self._kv.usage,
            preemptions=preemptions,
            prefix_hit_tokens=batch.prefix_hit_tokens,
        )

    # --- gauges and counters (read-only, for /metrics) ------------------------------

    @property
    def num_running(self) -> int:
        return len(self._scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self._scheduler.waiting)

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks held by requests, 0..1."""
        return self._kv.usage

    @property
    def num_kv_blocks(self) -> int:
        return self._kv.num_blocks

    @property
    def kv_capacity_tokens(self) -> int:
        return self._kv.num_blocks * self._kv.block_size

    @property
    def prefix_queries_tokens(self) -> int:
        return self._kv.prefix_queries_tokens

    @property
    def prefix_hits_tokens(self) -> int:
        return self._kv.prefix_hits_tokens


def _validate_flags(config: EngineConfig, max_position_embeddings: int) -> None:
    """Raise ``ValueError`` for flags vLLM rejects at start-up (before sizes are resolved)."""
    if config.tensor_parallel_size < 1:
        raise ValueError("tensor_parallel_size must be at least 1")
    if not 0.0 < config.gpu_memory_utilization <= 1.0:
        raise ValueError("gpu_memory_utilization must be in (0, 1]")
    for name in ("max_model_len", "max_num_batched_tokens", "max_num_seqs", "block_size", "num_scheduler_steps"):
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1")
    if config.api_overhead_s is not None and config.api_overhead_s < 0:
        raise ValueError("api_overhead_s must not be negative")
    if config.max_model_len is not None and config.max_model_len > max_position_embeddings:
        raise ValueError(
            f"User-specified max_model_len ({config.max_model_len}) is greater than the "
            f"derived max_model_len (max_position_embeddings={max_position_embeddings} in "
            "model's config.json)."
        )
    if config.block_size not in (1, 8, 16, 32, 64, 128):
        raise ValueError(f"block_size ({config.block_size}) must be one of 1, 8, 16, 32, 64, 128")


def _validate_sizes(config: EngineConfig) -> None:
    """Raise ``ValueError`` for resolved scheduler sizes vLLM rejects."""
    assert config.max_num_batched_tokens and config.max_num_seqs and config.max_model_len
    if config.max_num_batched_tokens < config.max_num_seqs:
        raise ValueError(
            f"max_num_batched_tokens ({config.max_num_batched_tokens}) must be greater than or "
            f"equal to max_num_seqs ({config.max_num_seqs})."
        )
    if not config.enable_chunked_prefill and config.max_num_batched_tokens < config.max_model_len:
        raise ValueError(
            f"max_num_batched_tokens ({config.max_num_batched_tokens}) is smaller than "
            f"max_model_len ({config.max_model_len}). This effectively limits the maximum "
            "sequence length to max_num_batched_tokens and makes vLLM reject longer "
            "sequences. Please increase max_num_batched_tokens or decrease max_model_len."
        )
