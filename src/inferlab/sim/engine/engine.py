"""The simulated engine: scheduler + KV/prefix cache + step-time model, without a clock.

The caller owns time. It adds requests and calls ``step(now_s)``; each step reports its
duration and the tokens it emits at ``now_s + duration_s``. The same engine runs behind
the HTTP server in real time and in virtual time (``step(now_s, token_events=False)``).
The engine decides nothing about text: a request emits exactly ``output_len`` tokens.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from inferlab.openai.context import SGLangLimits, output_limit
from inferlab.sim.engine.block_manager import GeneratedTokens
from inferlab.sim.engine.config import EngineConfig, engine_release, release_with_patch, resolve
from inferlab.sim.engine.dtypes import CapacityPolicy
from inferlab.sim.engine.frontend import FrontEnd
from inferlab.sim.engine.hardware import GpuSpec
from inferlab.sim.engine.kvcache import KVCacheManager, hash_blocks
from inferlab.sim.engine.scheduler import Batch, Request, SchedulerConfig
from inferlab.sim.engine.sizing import EngineSizes, size_engine
from inferlab.sim.engine.steady import SteadyScheduler
from inferlab.sim.engine.steptime import RooflineStepTime, StepTimeModel

__all__ = ["Engine", "EngineConfig", "RequestTimeline", "StepResult", "StepStats", "TokenEvent"]

# a step starting within this of the previous one's end follows it back to back
_BACK_TO_BACK_S = 1e-6


@dataclass
class RequestTimeline:
    """The engine's own view of one request, in seconds on the caller's timeline.

    ``scheduled_s`` is the start of the first step that ran it; ``first_token_s`` and
    ``finished_s`` when the API front end delivered its first and last tokens (the ends
    of the steps that emitted them, unless streaming queued at the front end; the same
    for ``token_times_s``).
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

    def to_json_ms(self, received_s: float) -> dict[str, float | int | None]:
        """The timeline as the simulated server reports it (``inferlab_timeline``): times
        in ms since ``received_s``, when the server received the request (4 decimals)."""

        def ms(t: float | None) -> float | None:
            return None if t is None else round((t - received_s) * 1e3, 4)

        return {
            "queued_ms": ms(self.arrival_s),
            "scheduled_ms": ms(self.scheduled_s),
            "first_token_ms": ms(self.first_token_s),
            "finished_ms": ms(self.finished_s),
            "cached_tokens": self.cached_tokens,
            "preemptions": self.preemptions,
        }


@dataclass(frozen=True)
class TokenEvent:
    """Request ``request_id`` emitted token ``token_index`` (from 0); ``finished``: its last."""

    request_id: str
    token_index: int
    finished: bool


@dataclass(frozen=True)
class StepStats:
    """One step: counts after it ran; ``preemptions`` and the prefix-cache hits of the
    requests it admitted, first admissions apart from re-admissions after a preemption
    (which vLLM's prefix-cache counters leave out), during it."""

    start_s: float
    duration_s: float
    num_running: int
    num_waiting: int
    prefill_tokens: int
    decode_tokens: int
    kv_usage: float
    preemptions: int
    prefix_hit_tokens: int  # of requests admitted for the first time (vLLM's counters)
    preempted_hit_tokens: int  # of requests re-admitted after a preemption


@dataclass(frozen=True)
class StepResult:
    """A step's duration and the tokens it emits at ``stats.start_s + duration_s``."""

    duration_s: float
    events: list[TokenEvent]
    stats: StepStats
    finished: list[str] = field(default_factory=list)  # ids of the requests that ended
    # when the API front end has streamed the step's tokens to their clients (the step's
    # end, or later when streaming queues at the front end); None: an idle step
    delivered_s: float | None = None


class Engine:
    """A vLLM-V1-like engine in simulation; see the module docstring.

    Construction resolves ``config`` (``config.resolve``), sizes it (``sizing``), then
    builds the KV cache and the scheduler. It raises ``UsageError`` for unknown model or
    GPU names and ``ValueError`` for configurations vLLM would refuse (weights that do not
    fit, no room for one ``max_model_len`` sequence in the KV cache, TP not dividing the
    heads, ...).
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
        # resolve the names and the family's switches -> the cost model -> the sizes ->
        # the KV cache and the scheduler
        resolved = resolve(config)
        config = resolved.config
        self.gpu: GpuSpec = resolved.gpu  # the preset ``config.gpu`` names
        roofline = RooflineStepTime(
            resolved.model,
            resolved.gpu,
            config.tensor_parallel_size,
            config.dtype,
            config.quantization,
            config.kv_cache_dtype,
            config.enforce_eager,
            resolved.efficiencies,
            serving=not config.offline,
        )
        self._step_time: StepTimeModel = step_time or roofline
        # the roofline when it is the step time: steady decodes (``SteadyScheduler.lazy``) need
        # its step time from sums, and multi-step groups its scheduling cost
        self._roofline = roofline if step_time is None else None
        #: keep decodes with nothing to do out of the per-step passes in virtual-time
        #: steps (same results; False visits every request every step)
        self.steady_decodes = True

        sizes = size_engine(resolved)
        #: memory, scheduler sizes and API costs as resolved (``config`` holds the sizes too)
        self.sizes: EngineSizes = sizes
        config = sizes.applied_to(config)
        self.config = config
        self.api_overhead_s = sizes.api_overhead_s
        self._intake_stalls_engine = resolved.rules.front_end_in_process
        # in the engine's process (vLLM <= 0.5) intake stalls the engine loop; otherwise
        # the API server is its own resource (``frontend``): intake and streaming queue there
        self._intake_s = sizes.api_intake_s / config.host_speed if self._intake_stalls_engine else 0.0
        #: the API front end: when requests reach the engine and tokens reach the client
        self.front_end = FrontEnd(sizes.front_end, config.api_server_count, config.host_speed)
        # (ready time, intake cost, id) of requests the engine still has to accept, when
        # the front end runs in the engine's process: vLLM <= 0.5 tokenized and registered
        # new requests inside its engine loop, in the step that can first schedule them.
        self._intake_queue: deque[tuple[float, float, str]] = deque()
        # overlap scheduling: a step that follows another back to back was scheduled
        # while that one ran, so it sees only the requests ready by that one's start
        self._overlap = bool(config.overlap_schedule)
        self._last_start_s = -math.inf  # the last step that ran a batch: its start ...
        self._last_end_s = -math.inf  # ... and end
        chunked, caching, mixed = config.enable_chunked_prefill, config.enable_prefix_caching, config.mixed_batches
        assert chunked is not None and caching is not None and mixed is not None  # (resolved)
        reserve, unhashed_first = config.scheduler_reserve_full_isl, config.evict_unhashed_first
        reserve_outputs = config.reserve_outputs
        assert reserve is not None and unhashed_first is not None and reserve_outputs is not None  # (resolved)
        no_evict = config.capacity_scheduler_policy is CapacityPolicy.GUARANTEED_NO_EVICT
        self._kv = KVCacheManager(sizes.num_kv_blocks, config.block_size, caching, unhashed_first)
        #: the resolved scheduler sizes (``config`` holds the same numbers, typed optional)
        self.limits = SchedulerConfig(
            sizes.max_num_batched_tokens, sizes.max_num_seqs, sizes.max_model_len, chunked, mixed,
            config.num_scheduler_steps, reserve, reserve_outputs, no_evict=no_evict,
            budget_bounds_decodes=config.engine_family.rules.budget_bounds_decodes,
        )
        #: a max_tokens over the context left is lowered to it, not refused (vLLM 0.32 on)
        self.clamps_max_tokens = resolved.rules.clamp_max_tokens_in(engine_release(config))
        #: the API server is SGLang's (``FamilyRules.sglang_api``) ...
        self.sglang_api = resolved.rules.sglang_api
        # ... whose checks follow its release (to the patch: ``SGLangLimits``)
        self._sglang_release = None if config.engine_version is None else release_with_patch(config.engine_version)
        # the reference scheduler, with steady decodes kept as sums in virtual-time steps
        self._scheduler = SteadyScheduler(self.limits, self._kv)
        self._active: dict[str, Request] = {}
        self._timelines: dict[str, RequestTimeline] = {}
        self._num_added = 0
        #: The id of the ``k``-th token the simulated model writes in every answer (the
        #: server's output passage), set by a server whose clients may send an answer back
        #: in a later prompt (a conversation's next turn): each request's generated
        #: blocks are then cached by content when it ends, as vLLM caches them, and the
        #: next turn hits them. None: they are not (no prompt will hold an answer).
        self.output_token: Callable[[int], int] | None = None
        self.preemptions_total = 0
        #: The most requests it ran at once (after a step): a closed loop of more users
        #: than this left some waiting for a place in the batch.
        self.peak_running = 0
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

    @property
    def sglang_limits(self) -> SGLangLimits:
        """SGLang's limits on a request to this engine (its context, KV pool and release)."""
        return SGLangLimits(self.limits.max_model_len, self.kv_capacity_tokens, self._sglang_release)

    def output_limit(self, prompt_tokens: int, max_tokens: int | None, param: str = "max_tokens") -> int:
        """The most tokens a request may generate, as this engine's API server decides
        (``openai.context.output_limit`` in its release, ``SGLangLimits.output_limit`` for SGLang's);
        ``ContextError`` for what it refuses."""
        if self.sglang_api:
            return self.sglang_limits.output_limit(prompt_tokens, max_tokens)
        return output_limit(prompt_tokens, max_tokens, self.limits.max_model_len, clamp=self.clamps_max_tokens,
                            param=param)

    def add_request(
        self, request_id: str, prompt_ids: Sequence[int], output_len: int, now_s: float,
        max_tokens: int | None = None,
    ) -> None:
        """Queue a request arriving at ``now_s``; it becomes schedulable after the API cost.
        ``prompt_ids`` are read (length, block hashes), not kept. It generates
        ``output_len`` tokens; ``max_tokens``, its own limit where it ends sooner (at its
        end-of-sequence; None: ``output_len``), is what SGLang's admission estimates its
        output from (``reserve_outputs``) and TensorRT-LLM's reserves it to (``no_evict``).

        Raises ``ValueError`` if it exceeds ``max_model_len``, can never fit in the KV
        cache, is empty, or reuses the id of an unfinished request.
        """
        if request_id in self._active:
            raise ValueError(f"request id {request_id!r} is already running")
        self._scheduler.check_fits(len(prompt_ids), output_len)
        bs = self.config.block_size
        hashes = hash_blocks(prompt_ids, bs) if self.config.enable_prefix_caching else []
        timeline = RequestTimeline(now_s, None, None, None, 0, 0, len(prompt_ids), 0)
        ready_s = self.front_end.admit(now_s, len(prompt_ids))
        if self._intake_s:  # the engine loop waits while it is accepted
            self._intake_queue.append((ready_s, self._intake_s, request_id))
        if max_tokens is not None and max_tokens < output_len:
            raise ValueError(f"max_tokens {max_tokens} is below the output length {output_len}")
        req = Request(request_id, len(prompt_ids), output_len, hashes, self._num_added, ready_s, max_tokens)
        if self.output_token is not None and self.config.enable_prefix_caching:
            n = len(prompt_ids)
            req.generated = GeneratedTokens(n, tuple(prompt_ids[n - n % bs :]), self.output_token)
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
        # every request that arrives from now on arrives at ``now_s`` or later
        self.front_end.forget_before(now_s)
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
        # the client sees this step's tokens when the front end has streamed them
        seen_at_s = self.front_end.deliver(end_s, batch.emitting)
        for req in batch.admitted:
            tl = timelines[req.request_id]
            if tl.scheduled_s is None:
                tl.scheduled_s = now_s
                tl.cached_tokens = req.num_computed_tokens
        emitted: list[Request] | None = [] if events is not None else None
        first, finished = sched.finish_step(batch, seen_at_s, emitted)
        for req in first:
            timelines[req.request_id].first_token_s = seen_at_s
            self.prompt_tokens_total += req.num_prompt_tokens
        if events is not None and emitted is not None:
            for req in emitted:
                done = req.num_output_tokens == req.max_output_tokens
                events.append(TokenEvent(req.request_id, req.num_output_tokens - 1, done))
        for req in finished:
            tl = timelines[req.request_id]
            tl.finished_s = seen_at_s
            tl.output_tokens = req.num_output_tokens
            del self._active[req.request_id]
        self.generation_tokens_total += batch.emitting
        self.preemptions_total += len(preempted)
        stats = self._stats(now_s, duration_s, batch, len(preempted))
        ids = [req.request_id for req in finished]
        return StepResult(duration_s, events if events is not None else [], stats, ids, seen_at_s)

    def _stats(self, now_s: float, duration_s: float, batch: Batch, preemptions: int) -> StepStats:
        running = len(self._scheduler.running)
        self.peak_running = max(self.peak_running, running)
        return StepStats(
            start_s=now_s,
            duration_s=duration_s,
            num_running=running,
            num_waiting=len(self._scheduler.waiting),
            prefill_tokens=batch.prefill_tokens,
            decode_tokens=batch.decode_tokens,
            kv_usage=self._kv.usage,
            preemptions=preemptions,
            prefix_hit_tokens=batch.prefix_hit_tokens,
            preempted_hit_tokens=batch.preempted_hit_tokens,
        )

    @property
    def host_costs(self) -> tuple[float, float] | None:
        """The engine core's host seconds per step and per scheduled sequence when the
        roofline is the step time; None when another step-time model was given."""
        return self._roofline.host_costs if self._roofline is not None else None

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
        """Prompt tokens found in the prefix cache at first admissions (vLLM's counter)."""
        return self._kv.prefix_hits_tokens

    @property
    def preempted_hits_tokens(self) -> int:
        """Tokens found in the prefix cache by requests re-admitted after a preemption."""
        return self._kv.preempted_hits_tokens

