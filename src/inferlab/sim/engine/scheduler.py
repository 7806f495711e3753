"""Continuous-batching scheduler with vLLM V1 semantics: the plain reference.

Pure bookkeeping, no cost model. The caller ``add``s requests, then steps:
``schedule`` (pick the batch, allocate its KV blocks) → run it (the engine's step-time
model) → ``finish_step`` (advance counters, emit tokens, free what finished).

The policy, step by step:

- One token budget (``max_num_batched_tokens``) is shared by decodes and prefill chunks.
- Running requests go first, in admission order, each taking all the tokens it has left
  to compute: one for a decode, the rest of its prompt (chunked to what is left of the
  budget) for a prefill.
- Then waiting requests, in arrival order, while the budget, ``max_num_seqs`` and free KV
  blocks allow. A cached prefix is not recomputed. Without chunked prefill a prompt that
  does not fit whole waits, and everything behind it. With ``reserve_full_sequence``
  (vLLM's ``--scheduler-reserve-full-isl``, on in 0.32) a waiting or preempted request is
  admitted only when free blocks hold its whole current sequence (prompt and tokens
  generated before a preemption), not just the chunk it computes first.
- When a running request needs a block and none is free, the most recently admitted
  running request is preempted: its blocks are freed (its full blocks stay in the prefix
  cache) and it goes back to the front of the waiting queue, to be recomputed. A step
  with a preemption admits no waiting request.
- ``mixed_batches=False`` (SGLang; vLLM V0 without chunked prefill): a step either
  prefills or decodes. Whenever a prompt (or its next chunk) can be scheduled, the step
  runs prefill work only (unfinished prompts first, then waiting requests) and every
  running decode waits for it.
- ``reserve_outputs`` (SGLang): a waiting request is admitted only while the free
  blocks (its own cached prefix not counted: SGLang locks it first) hold more than its
  prompt and its whole output (at most ``CLIP_NEW_TOKENS``) beyond an estimate of what
  the running requests will still generate: each one's tokens left (clipped the same
  way) times ``new_token_ratio``. Outputs are counted to ``Request.max_new_tokens``, the
  request's own limit, which may exceed the length it generates (it ends at its
  end-of-sequence). The ratio starts at 0.7, falls by a 600th of the way to 0.098 each
  decode step, and after a preemption is set to the running requests' progress,
  (tokens generated + 20 each) / (their output lengths + 1); an idle scheduler resets
  it. A request that does not fit stops admission until a running request has left
  and a decode step has run (SGLang's ``batch_is_full``, cleared where it drops finished
  requests from its batch), or a preemption. What is left out: SGLang picks the request
  with the fewest tokens generated to retract (here, as for vLLM, the most recently
  admitted: the same one under first come first served) and retracts until 20 steps of
  decodes fit; a prompt being chunked counts here as running, where SGLang reserves
  nothing for its output until its last chunk, and closed admission waits for it,
  where SGLang goes on trying waiting requests beside it.
- ``no_evict`` (TensorRT-LLM's default capacity scheduler, GUARANTEED_NO_EVICT): a
  waiting request is admitted only while the free blocks hold the blocks it needs to
  reach its output limit (``Request.max_new_tokens``; its cached prefix not counted)
  beyond the blocks every running request still needs to reach its own. Nothing
  admitted can then be preempted for want of blocks.
- ``num_scheduler_steps > 1`` (vLLM 0.5.5-0.7 multi-step): a decode-only batch is followed
  by that many steps less one over the running requests without admitting anyone.

``steady.SteadyScheduler`` runs this same policy faster in virtual time, and is tested
step for step against this class.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from inferlab.openai.context import ContextError, over_context
from inferlab.sim.engine.block_manager import GeneratedTokens

_READY_SLACK_S = 1e-9  # absorbs float rounding when a clock lands exactly on a ready time

# SGLang's output estimate (``SchedulerConfig.reserve_outputs``), its defaults from 0.4
# on (``SGLANG_INIT_NEW_TOKEN_RATIO``, ``..._MIN_NEW_TOKEN_RATIO_FACTOR``,
# ``..._NEW_TOKEN_RATIO_DECAY_STEPS``, ``..._CLIP_MAX_NEW_TOKENS_ESTIMATION``,
# ``..._RETRACT_DECODE_STEPS``; ``--schedule-conservativeness`` 1)
NEW_TOKEN_RATIO_INIT = 0.7
NEW_TOKEN_RATIO_MIN = NEW_TOKEN_RATIO_INIT * 0.14
NEW_TOKEN_RATIO_DECAY = (NEW_TOKEN_RATIO_INIT - NEW_TOKEN_RATIO_MIN) / 600
CLIP_NEW_TOKENS = 4096
RETRACT_DECODE_STEPS = 20


class Request:
    """One request's scheduling state. ``num_tokens`` = prompt + generated so far; the
    tokens in ``[num_computed_tokens, num_tokens)`` are still to be computed (one, for a
    decode)."""

    __slots__ = (
        "block_hashes",
        "block_ids",
        "generated",
        "hash_salt",
        "max_new_tokens",
        "max_output_tokens",
        "num_cached_blocks",
        "num_computed_tokens",
        "num_output_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "num_tokens",
        "ready_s",
        "request_id",
        "seq",
        "steady_exit",
        "steady_tick",
        "token_times",
    )

    def __init__(
        self,
        request_id: str,
        num_prompt_tokens: int,
        max_output_tokens: int,
        block_hashes: list[int],
        hash_salt: int,
        ready_s: float,
        max_new_tokens: int | None = None,
    ) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.max_output_tokens = max_output_tokens
        # the request's own limit, where it ends sooner (its end-of-sequence): what
        # SGLang's admission estimates its output from (``reserve_outputs``)
        self.max_new_tokens = max_output_tokens if max_new_tokens is None else max_new_tokens
        self.num_output_tokens = 0
        self.num_tokens = num_prompt_tokens
        self.num_computed_tokens = 0  # tokens whose KV is in the cache
        self.num_preemptions = 0
        self.ready_s = ready_s  # not schedulable before this time
        # the block manager's (``block_manager.KVRequest``)
        self.block_ids: list[int] = []
        self.block_hashes = block_hashes
        self.num_cached_blocks = 0
        self.hash_salt = hash_salt
        # what it generates, where the server knows (``block_manager.GeneratedTokens``):
        # its generated blocks are then cached by content when it ends, as vLLM caches
        # them, for a later prompt that holds its answer (the next turn of a conversation)
        self.generated: GeneratedTokens | None = None
        self.token_times: list[float] | None = None  # set: each token's emission time goes here
        # ``steady.SteadyScheduler``'s: admission order, and the ticks it is steady between
        self.seq = 0
        self.steady_tick = -1  # (-1: not steady)
        self.steady_exit = 0


class KVCache(Protocol):
    """What the scheduler uses of a KV block manager: ``block_manager.BlockManager`` (the
    plain reference, where the contracts are) or ``kvcache.KVCacheManager`` (the engine's)."""

    num_blocks: int
    block_size: int

    @property
    def num_free_blocks(self) -> int: ...  # (cached ones not held by a request included)
    def num_free_among(self, blocks: Sequence[int]) -> int: ...
    def lookup(self, req: Request) -> list[int]: ...
    def can_allocate(self, req: Request, num_tokens: int, cached: Sequence[int] = ()) -> bool: ...
    def allocate(self, req: Request, num_tokens: int, cached: Sequence[int] = ()) -> bool: ...
    def append_block(self, req: Request) -> bool: ...  # (``SteadyScheduler``'s shortcut)
    def cache_generated(self, req: Request, num_computed_tokens: int) -> None: ...
    def free(self, req: Request) -> None: ...


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_model_len: int = 4096
    enable_chunked_prefill: bool = True
    mixed_batches: bool = True  # False: prefill steps and decode steps apart, prefill first
    # vLLM 0.5.5-0.7 multi-step scheduling: a decode-only batch runs this many steps
    # without rescheduling (nothing admitted meanwhile); steps with a prefill run alone
    num_scheduler_steps: int = 1
    # vLLM's --scheduler-reserve-full-isl: admit a waiting (or preempted) request only when
    # free blocks hold its whole current sequence, not just its first chunk
    reserve_full_sequence: bool = False
    # SGLang's admission: free blocks must hold a waiting request's prompt and output
    # beyond the running requests' estimated outputs (the module doc)
    reserve_outputs: bool = False
    # TensorRT-LLM's GUARANTEED_NO_EVICT admission: free blocks must hold a waiting
    # request's whole sequence to its output limit beyond what every running request may
    # still take to its own (the module doc)
    no_evict: bool = False
    # the budget bounds decodes too (vLLM); False (SGLang): every running request decodes
    # in a decode step, and a mixed step's prompt chunk gets the budget less its decodes
    budget_bounds_decodes: bool = True


@dataclass
class Batch:
    """One step's work: ``requests[i]`` computes ``seqs[i] = (new tokens, cached tokens)``."""

    requests: list[Request] = field(default_factory=list)
    seqs: list[tuple[int, int]] = field(default_factory=list)
    emitting: int = 0  # requests whose scheduled tokens complete them, so they sample a token
    prefill_tokens: int = 0
    decode_tokens: int = 0
    admitted: list[Request] = field(default_factory=list)  # moved from waiting this step
    prefix_hit_tokens: int = 0  # cached tokens of the requests admitted this step for the first time
    preempted_hit_tokens: int = 0  # ... and of those re-admitted after a preemption
    preempted: list[Request] = field(default_factory=list)  # sent back to waiting this step
    continuation: bool = False  # a later step of a multi-step group: nothing was admitted
    # ``steady.SteadyScheduler``'s decodes kept as sums, one token each and not in
    # ``requests`` (counted in ``emitting`` and ``decode_tokens``); 0 here
    steady: int = 0
    steady_context: int = 0  # their cached context, summed

    @property
    def num_seqs(self) -> int:
        return len(self.seqs) + self.steady


class Scheduler:
    """``add`` → (``schedule`` → run the batch → ``finish_step``)*; see the module doc.

    ``running`` is in admission order, ``waiting`` in arrival order (preempted requests
    at its front)."""

    def __init__(self, config: SchedulerConfig, kv: KVCache) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._group_steps_left = 0  # steps left in the current multi-step decode group
        # ``reserve_outputs``: the share of their tokens left that running requests are
        # expected to generate, and whether admission waits for one to leave
        self.new_token_ratio = NEW_TOKEN_RATIO_INIT
        self._batch_full = False
        self._shrunk = False  # a running request left since the last decode step

    def check_fits(self, num_prompt_tokens: int, max_output_tokens: int) -> None:
        """Raise ``ValueError`` for a request this engine can never serve: one that
        would generate past the context (``ContextError``; the HTTP server and ``sim
        run`` first apply ``output_limit``, which lowers its length where the release
        does), or that the whole KV cache cannot hold."""
        if num_prompt_tokens < 1:
            raise ValueError("The prompt must contain at least one token.")
        if max_output_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_output_tokens}.")
        total = num_prompt_tokens + max_output_tokens
        if total > self.config.max_model_len:  # (a front end lowers max_tokens first where its release does)
            raise ContextError(over_context(self.config.max_model_len, num_prompt_tokens, max_output_tokens))
        capacity = self.kv.num_blocks * self.kv.block_size
        if total > capacity:
            raise ValueError(
                f"The request needs {total} tokens of KV cache but the cache holds only "
                f"{capacity} tokens."
            )

    def add(self, req: Request) -> None:
        """Queue ``req`` behind the waiting requests (call ``check_fits`` first)."""
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def next_ready_s(self) -> float | None:
        """When the head of the waiting queue becomes schedulable (None: queue empty)."""
        return self.waiting[0].ready_s if self.waiting else None

    # --- schedule -------------------------------------------------------------------

    def schedule(self, now_s: float) -> Batch:
        """Pick this step's requests and token counts and allocate their KV blocks;
        waiting requests count from their ``ready_s`` on. The batch may be empty (nothing
        ready, or every running request preempted)."""
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        if self._group_steps_left > 0 and self.running:  # a multi-step group goes on
            self._group_steps_left -= 1
            batch = Batch(continuation=True)
            self._schedule_running(batch, budget)
            if cfg.reserve_outputs:
                self._update_ratio(batch)
            return batch
        self._group_steps_left = 0  # (a group ends early when its last request does)
        batch = Batch()
        if cfg.mixed_batches:
            left = self._schedule_running(batch, budget)
            if not batch.preempted:
                self._admit(batch, left, now_s)
        else:
            self._admit(batch, self._schedule_prefills(batch, budget), now_s)
            if batch.requests:
                return batch  # a prefill step (it starts no multi-step group)
            self._schedule_running(batch, budget)  # no prompt to work on: a decode step
        if cfg.reserve_outputs:
            self._update_ratio(batch)
        if cfg.num_scheduler_steps > 1 and batch.decode_tokens and not batch.prefill_tokens:
            self._group_steps_left = cfg.num_scheduler_steps - 1
        return batch

    def _update_ratio(self, batch: Batch) -> None:
        """``reserve_outputs``' estimate after scheduling ``batch`` (not a prefill step):
        set from the running requests' progress after a preemption, lowered after a
        decode step, reset when the engine is idle. Admission, closed when a request did
        not fit, opens at the first decode step after a running request left (SGLang
        drops finished requests from its batch there, ``update_running_batch``)."""
        if batch.preempted:
            _, left, total = self._outputs_left()
            generated = total - left
            ratio = (generated + RETRACT_DECODE_STEPS * len(self.running)) / (total + 1)
            self.new_token_ratio = min(1.0, ratio)
            self._batch_full = self._shrunk = False
        elif batch.decode_tokens and not batch.prefill_tokens:
            self.new_token_ratio = max(self.new_token_ratio - NEW_TOKEN_RATIO_DECAY, NEW_TOKEN_RATIO_MIN)
            if self._shrunk:
                self._batch_full = self._shrunk = False
        elif not batch.num_seqs and not self.running:
            self.new_token_ratio = NEW_TOKEN_RATIO_INIT

    def _left_running(self) -> None:
        """``reserve_outputs``: running requests finished or were aborted. With some still
        running, admission stays as it is until the next decode step; with none, SGLang's
        batch is empty: admission opens, and the estimate goes back to its start when the
        scheduler idles (nothing waits, or the request that did not fit waited)."""
        if self.running:
            self._shrunk = True
            return
        if self._batch_full or not self.waiting:
            self.new_token_ratio = NEW_TOKEN_RATIO_INIT
        self._batch_full = self._shrunk = False

    def _outputs_left(self) -> tuple[int, int, int]:
        """``_sum_outputs_left`` over the running requests."""
        return _sum_outputs_left(self.running)

    def _schedule_running(self, batch: Batch, budget: int) -> int:
        """Each running request, in admission order, gets its remaining tokens up to the
        budget, preempting for KV blocks; returns the budget left. Where the budget does
        not bound decodes (``budget_bounds_decodes`` off) every decode runs, each still
        taking one token of the budget (which may go below 0), and a prompt chunk gets
        what the decodes before it left."""
        free = not self.config.budget_bounds_decodes
        # (a preemption pops the last request of ``running``: the loop never reaches it)
        for req in self.running:
            remaining = req.num_tokens - req.num_computed_tokens
            if budget <= 0:
                if not free:
                    break
                if not (remaining == 1 and req.num_output_tokens):
                    continue  # a prompt chunk: nothing left for it
            n = 1 if budget <= 0 else min(remaining, budget)
            if not self._allocate(req, req.num_computed_tokens + n, batch):
                break  # req itself was preempted: it was the last one running
            self._add_to_batch(batch, req, n)
            budget -= n
        return budget

    def _schedule_prefills(self, batch: Batch, budget: int) -> int:
        """A prefill-only step's running part: the next chunk of each unfinished prompt
        (a preempted request recomputing is one), no decodes; returns the budget left."""
        for req in self._may_prefill():
            remaining = req.num_tokens - req.num_computed_tokens
            if remaining == 1 and req.num_output_tokens:
                continue  # a decode
            if budget < 1:
                break
            n = min(remaining, budget)
            if not self.kv.allocate(req, req.num_computed_tokens + n):
                break  # memory is short: the decode step that follows preempts
            self._add_to_batch(batch, req, n)
            budget -= n
        return budget

    def _may_prefill(self) -> list[Request]:
        """The running requests that may have prompt tokens left, in admission order:
        all of them here (``SteadyScheduler`` leaves out decodes it knows of)."""
        return self.running

    def _allocate(self, req: Request, num_tokens: int, batch: Batch) -> bool:
        """Give running ``req`` blocks for its first ``num_tokens`` tokens, preempting the
        most recently admitted running requests until they fit. False when ``req``
        itself had to be preempted."""
        while not self.kv.allocate(req, num_tokens):
            victim = self.running.pop()
            self._preempt(victim)
            batch.preempted.append(victim)
            if victim is req:
                return False
        return True

    def _admit(self, batch: Batch, budget: int, now_s: float) -> None:
        """Move ready waiting requests into ``running`` (and the batch), in order, while
        the budget, ``max_num_seqs`` and free blocks allow."""
        cfg, kv, running = self.config, self.kv, self.running
        waiting = self.waiting
        reserve = cfg.reserve_outputs
        room = 0.0  # (``reserve_outputs``: free tokens beyond the outputs reserved so far)
        # (``no_evict``: free blocks beyond what the running requests need to finish)
        spare = kv.num_free_blocks - sum(self._blocks_to_finish(r) for r in running) if cfg.no_evict and waiting else 0
        if reserve and waiting:
            if self._batch_full:
                return
            clipped, _, _ = self._outputs_left()
            room = kv.num_free_blocks * kv.block_size - clipped * self.new_token_ratio
        while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            req = waiting[0]
            if req.ready_s > now_s + _READY_SLACK_S:
                break
            cached = kv.lookup(req)
            num_cached = len(cached) * kv.block_size
            n = req.num_tokens - num_cached
            if not cfg.enable_chunked_prefill and n > budget:
                break
            if cfg.reserve_full_sequence and not kv.can_allocate(req, req.num_tokens, cached):
                break  # its whole sequence does not fit in the free blocks
            if cfg.no_evict:
                need = self._blocks_to_finish(req) - len(cached) + (kv.num_free_among(cached) if cached else 0)
                if need > spare and running:  # (alone, it is admitted: nothing else could be)
                    break  # its sequence to its output limit does not fit beside the running ones'
                spare -= need
            out_left = pinned = 0
            if reserve:
                out_left = min(req.max_new_tokens - req.num_output_tokens, CLIP_NEW_TOKENS)
                # (SGLang locks a request's cached prefix before it checks: those blocks
                # are no longer room for it, if they sat free)
                pinned = kv.num_free_among(cached) * kv.block_size if cached else 0
                if n + out_left >= room - pinned and running:
                    self._batch_full = True  # (alone, a request the cache holds is admitted)
                    break
            whole = n <= budget
            n = min(n, budget)
            if not kv.allocate(req, num_cached + n, cached):
                self._batch_full = reserve
                break
            waiting.popleft()
            running.append(req)
            req.num_computed_tokens = num_cached
            batch.admitted.append(req)
            if req.num_preemptions:
                batch.preempted_hit_tokens += num_cached
            else:
                batch.prefix_hit_tokens += num_cached
            self._add_to_batch(batch, req, n)
            budget -= n
            if reserve:  # (a chunk reserves no output: its prompt's last chunk will)
                room -= pinned + n + (out_left if whole else 0)
                if room <= 0:
                    self._batch_full = True
                    break

    def _blocks_to_finish(self, req: Request) -> int:
        """Blocks ``req`` still needs to hold its prompt and output to its limit
        (``no_evict``); its own blocks' counters are exact even for a steady request."""
        size = self.kv.block_size
        total = min(req.num_prompt_tokens + req.max_new_tokens, max(self.config.max_model_len, req.num_prompt_tokens + 1))
        return max(0, -(-total // size) - len(req.block_ids))

    def _add_to_batch(self, batch: Batch, req: Request, n: int) -> None:
        """``req`` computes ``n`` more tokens this step: a decode when it is one token
        that completes a request with output, else prefill tokens."""
        computed = req.num_computed_tokens
        batch.requests.append(req)
        batch.seqs.append((n, computed))
        if computed + n == req.num_tokens:
            batch.emitting += 1
            if n == 1 and req.num_output_tokens:
                batch.decode_tokens += 1
                return
        batch.prefill_tokens += n

    def _preempt(self, req: Request) -> None:
        """Free ``req``'s blocks (registering its full generated ones for its own later
        prefix hit) and queue it first, to be recomputed from its first token."""
        self.kv.cache_generated(req, req.num_computed_tokens)
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.waiting.appendleft(req)

    # --- after the step ---------------------------------------------------------------

    def postprocess(self, batch: Batch) -> tuple[list[Request], list[Request]]:
        """Apply a finished step: returns (requests that emitted a token, of those the
        ones now finished). Finished requests leave ``running`` and free their blocks."""
        emitted: list[Request] = []
        _, finished = self.finish_step(batch, None, emitted)
        return emitted, finished

    def finish_step(
        self, batch: Batch, end_s: float | None, emitted: list[Request] | None = None
    ) -> tuple[list[Request], list[Request]]:
        """``postprocess`` for a step ending at ``end_s``, appended to the ``token_times``
        of each request that emits a token (None: no time is known, none is appended) and
        to ``emitted``, when given. Returns (the requests that emitted their first token,
        the requests now finished)."""
        first: list[Request] = []
        finished: list[Request] = []
        for req, (n, _) in zip(batch.requests, batch.seqs, strict=True):
            computed = req.num_computed_tokens + n
            req.num_computed_tokens = computed
            if computed < req.num_tokens:
                continue  # a prefill chunk short of the prompt's end: no token yet
            out = req.num_output_tokens + 1
            req.num_output_tokens = out
            req.num_tokens = computed + 1
            times = req.token_times
            if times is not None and end_s is not None:
                times.append(end_s)
            if emitted is not None:
                emitted.append(req)
            if out == 1:
                first.append(req)
            if out == req.max_output_tokens:
                finished.append(req)
        for req in finished:
            self._release(req)
            self.running.remove(req)
        if finished and self.config.reserve_outputs:
            self._left_running()
        return first, finished

    def _release(self, req: Request) -> None:
        """Free the blocks of ``req``, which ended or was aborted, its generated ones
        cached first when their content is known (``Request.generated``)."""
        if req.generated is not None:
            self.kv.cache_generated(req, req.num_computed_tokens)
        self.kv.free(req)

    def abort(self, req: Request) -> None:
        """Drop ``req`` from either queue and free its blocks; no-op if in neither."""
        if req in self.running:
            self.running.remove(req)
            self._release(req)
            if self.config.reserve_outputs:
                self._left_running()
        elif req in self.waiting:
            self.waiting.remove(req)


def _sum_outputs_left(reqs: Iterable[Request]) -> tuple[int, int, int]:
    """Over ``reqs``: (tokens they may still generate, ``max_new_tokens`` less what they
    did, each clipped at ``CLIP_NEW_TOKENS``; the same unclipped; their
    ``max_new_tokens``), summed."""
    clipped = left = total = 0
    for req in reqs:
        n = req.max_new_tokens - req.num_output_tokens
        clipped += min(n, CLIP_NEW_TOKENS)
        left += n
        total += req.max_new_tokens
    return clipped, left, total
