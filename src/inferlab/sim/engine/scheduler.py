"""Continuous-batching scheduler with vLLM V1 semantics; pure bookkeeping, no cost model.

Each step has one token budget (``max_num_batched_tokens``) shared by decodes and prefill
chunks. Running requests are served first, in admission order; then waiting requests in
arrival order while the budget, ``max_num_seqs`` and free KV blocks allow. When a running
request needs a block and none is free, the most recently admitted running request is
preempted: its blocks are freed and it goes back to the front of the waiting queue, to be
recomputed (with prefix caching its freed blocks may still hit). A step with a preemption
admits no waiting request.

With ``mixed_batches=False`` (SGLang's default, and vLLM V0 without chunked prefill) a
step either prefills or decodes: whenever a prompt (or its next chunk) can be scheduled,
the step runs prefill work only (unfinished chunked prompts first, then waiting requests)
and every running decode waits for it.

Steady decodes (``lazy`` steps, virtual time): a running request that only decodes, with
room in its blocks and more than one token to go, needs nothing from the scheduler
until its next block or its last token. Such a request leaves the per-step passes: it
counts in ``Batch.steady`` (and its context in ``steady_context``), its counters advance
by the number of decode steps ("ticks") since it became steady, and its token times are
the ticks' end times, both written back when it is next needed (``_wake``): before its
last token, or when it is preempted. At a block boundary it stays steady: the pass gives
it its next block in ``running`` order, as it would a woken one. Every step sees exactly
the batch, allocations, preemptions and finishing order of the per-request pass; a step
whose token budget could not hold every request wakes them all and runs it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from inferlab.sim.engine.kvcache import KVCacheManager

_READY_SLACK_S = 1e-9  # absorbs float rounding when a clock lands exactly on a ready time


def _by_seq(req: Request) -> int:
    return req.seq


class Request:
    """One request's scheduling state. ``num_tokens`` = prompt + generated so far."""

    __slots__ = (
        "block_hashes",
        "block_ids",
        "hash_salt",
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
    ) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.max_output_tokens = max_output_tokens
        self.num_output_tokens = 0
        self.num_tokens = num_prompt_tokens
        self.num_computed_tokens = 0  # tokens whose KV is in the cache
        self.num_preemptions = 0
        self.ready_s = ready_s  # not schedulable before this time
        self.block_ids: list[int] = []
        self.block_hashes = block_hashes
        self.num_cached_blocks = 0
        self.hash_salt = hash_salt
        self.token_times: list[float] | None = None  # set: each token's emission time goes here
        self.seq = 0  # admission order (the order of ``running``)
        self.steady_tick = -1  # steady since this tick (-1: not steady) ...
        self.steady_exit = 0  # ... until this one


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


@dataclass
class Batch:
    """One step's work: ``requests[i]`` computes ``seqs[i] = (new tokens, cached tokens)``."""

    requests: list[Request] = field(default_factory=list)
    seqs: list[tuple[int, int]] = field(default_factory=list)
    emitting: int = 0  # requests whose scheduled tokens complete them, so they sample a token
    prefill_tokens: int = 0
    decode_tokens: int = 0
    admitted: list[Request] = field(default_factory=list)  # moved from waiting this step
    prefix_hit_tokens: int = 0  # cached tokens of the requests admitted this step
    preempted: list[Request] = field(default_factory=list)  # sent back to waiting this step
    continuation: bool = False  # a later step of a multi-step group: nothing was scheduled
    steady: int = 0  # steady decodes also in this step (one token each; not in ``requests``)
    steady_context: int = 0  # their cached context, summed

    @property
    def num_seqs(self) -> int:
        return len(self.seqs) + self.steady


class Scheduler:
    """``add`` → (``schedule`` → run the batch → ``postprocess``)*; see the module doc."""

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._group_steps_left = 0  # steps left in the current multi-step decode group
        self._admitted = 0  # admissions so far (``Request.seq``)
        # steady decodes: see the module doc
        self.lazy = False  # whether steps may keep decodes steady (no per-token events wanted)
        self.tick = 0  # decode ticks so far: steps that ran every steady decode
        self._tick_ends: list[float] = []  # each tick's end time
        self._steady_n = 0
        # Σ (num_computed_tokens - steady_tick) over them (counters stay as they were
        # when they became steady): their context at tick t is this + n·t
        self._steady_c0 = 0
        self._due: dict[int, list[Request]] = {}  # tick -> requests whose steadiness ends
        self._busy: set[Request] = set()  # running requests that are not steady

    def check_fits(self, num_prompt_tokens: int, max_output_tokens: int) -> None:
        """Raise ``ValueError`` for a request this engine can never serve."""
        if num_prompt_tokens < 1:
            raise ValueError("The prompt must contain at least one token.")
        if max_output_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_output_tokens}.")
        total = num_prompt_tokens + max_output_tokens
        limit = self.config.max_model_len
        if total > limit:
            raise ValueError(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {total} tokens ({num_prompt_tokens} in the messages, "
                f"{max_output_tokens} in the completion). Please reduce the length of the "
                "messages or completion."
            )
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

    def schedule(self, now_s: float) -> Batch:
        """Pick this step's requests and token counts; allocates their KV blocks."""
        if self._steady_n:
            if not self.lazy:
                self.wake_all()  # (lazy: the due ones are met in ``_schedule``)
        elif self.tick:  # nothing is steady: the ticks so far are no longer needed
            self.tick = 0
            self._tick_ends.clear()
            self._due.clear()
        if self._group_steps_left > 0 and self.running:  # a multi-step group goes on
            self._group_steps_left -= 1
            batch = self._schedule(now_s, admit=False)
            batch.continuation = True
            return batch
        self._group_steps_left = 0  # (a group ends early when its last request does)
        if not self.config.mixed_batches:
            batch = self._prefill_only(now_s)
            if batch.requests:
                return batch
            batch = self._schedule(now_s, admit=False)
        else:
            batch = self._schedule(now_s, admit=True)
        if self.config.num_scheduler_steps > 1 and batch.decode_tokens and not batch.prefill_tokens:
            self._group_steps_left = self.config.num_scheduler_steps - 1
        return batch

    def _prefill_only(self, now_s: float) -> Batch:
        """A prefill step: unfinished chunked prompts, then waiting requests; no decodes."""
        batch = Batch()
        budget = self.config.max_num_batched_tokens
        for req in self._busy_in_order():
            remaining = req.num_tokens - req.num_computed_tokens
            decoding = remaining == 1 and req.num_output_tokens > 0
            if decoding or remaining < 1 or budget < 1:
                continue  # (a preempted request recomputing its tokens is prefilling)
            n = min(remaining, budget)
            if not self.kv.allocate(req, req.num_computed_tokens + n):
                break  # memory is short: the decode step that follows preempts
            self._add_to_batch(batch, req, n)
            budget -= n
        self._admit(batch, budget, now_s)
        return batch

    def _schedule(self, now_s: float, *, admit: bool) -> Batch:
        cfg, kv, running = self.config, self.kv, self.running
        batch = Batch()
        budget = cfg.max_num_batched_tokens
        bs = kv.block_size
        caching = kv.enable_prefix_caching
        requests, seqs = batch.requests, batch.seqs
        decodes = 0
        others = running
        if self._steady_n:  # steady decodes take a token each; the pass visits the rest
            at_boundary = self._take_due()
            others = self._busy_in_order()
            if self._steady_n + sum([r.num_tokens - r.num_computed_tokens for r in others]) > budget:
                self.wake_all()  # the budget runs out inside the list: every request in turn
                others = running
            elif at_boundary:  # their blocks are taken in ``running`` order, like the rest
                others = sorted(others + at_boundary, key=_by_seq)
            budget -= self._steady_n
        # (a preemption pops from the end of ``running``, the highest ``seq``: the
        # iteration stops before it)
        for req in others:
            if req.steady_tick >= 0:  # steady, its next token starts a block (budgeted above)
                prompt_cached = req.num_cached_blocks >= len(req.block_hashes)
                # (a free block, the common case, without ``_make_room``'s call)
                if not (prompt_cached and kv.append_block(req)):
                    total = req.num_computed_tokens + (self.tick - req.steady_tick) + 1
                    if not self._make_room(req, others, batch, total, grow=prompt_cached):
                        break  # req was the last one running
                req.steady_exit = self._exit_tick(req)
                self._due.setdefault(req.steady_exit, []).append(req)
                continue
            if budget <= 0:
                break
            computed = req.num_computed_tokens
            remaining = req.num_tokens - computed
            # The common case inline: a decode whose blocks hold its next token (its full
            # prompt blocks were registered when its prefill ended).
            if remaining == 1 and req.num_output_tokens and computed < len(req.block_ids) * bs:
                requests.append(req)
                seqs.append((1, computed))
                decodes += 1
                budget -= 1
                continue
            n = remaining if remaining < budget else budget
            total = computed + n
            if total > len(req.block_ids) * bs or (
                caching and req.num_cached_blocks < len(req.block_hashes) and total // bs > req.num_cached_blocks
            ):
                # a decode whose next token starts a block (prompt blocks registered):
                # one block at the end, the common case of allocation
                grow = remaining == 1 and req.num_output_tokens and req.num_cached_blocks >= len(req.block_hashes)
                if not self._make_room(req, others, batch, total, grow=bool(grow)):
                    break  # req was the last one running: no later running request is left
            if n == 1 and remaining == 1 and req.num_output_tokens:  # a plain decode, inline
                requests.append(req)
                seqs.append((1, computed))
                decodes += 1
            else:
                self._add_to_batch(batch, req, n)
            budget -= n
        n = self._steady_n
        if n:
            batch.steady = n
            batch.steady_context = self._steady_c0 + n * self.tick
            decodes += n
        batch.emitting += decodes
        batch.decode_tokens += decodes
        if batch.preempted or not admit:
            return batch
        self._admit(batch, budget, now_s)
        return batch

    def _make_room(self, req: Request, others: list[Request], batch: Batch, total: int, *, grow: bool) -> bool:
        """Give ``req`` blocks for ``total`` tokens (``grow``: one more block at the end),
        preempting the most recently admitted running requests until they fit. False when
        ``req`` itself was preempted. A victim still ahead in the pass (``others``, in
        ``seq`` order: it is the last there) leaves it."""
        kv, running = self.kv, self.running
        while not (kv.append_block(req) if grow else kv.allocate(req, total)):
            victim = running.pop()  # the most recently admitted
            if victim.steady_tick >= 0:
                self._wake(victim)
            if others is not running and others and others[-1] is victim:
                others.pop()
            self._preempt(victim)
            batch.preempted.append(victim)
            if victim is req:
                return False
        return True

    def _admit(self, batch: Batch, budget: int, now_s: float) -> None:
        """Move waiting requests into ``running`` (and the batch) while room allows."""
        cfg, kv, running = self.config, self.kv, self.running
        waiting = self.waiting
        while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            req = waiting[0]
            if req.ready_s > now_s + _READY_SLACK_S:
                break
            cached = kv.lookup(req)
            num_cached = len(cached) * kv.block_size
            n = req.num_tokens - num_cached
            if not cfg.enable_chunked_prefill and n > budget:
                break
            n = min(n, budget)
            if not kv.allocate(req, num_cached + n, cached):
                break
            waiting.popleft()
            running.append(req)
            req.seq = self._admitted
            self._admitted += 1
            self._busy.add(req)
            req.num_computed_tokens = num_cached
            batch.admitted.append(req)
            batch.prefix_hit_tokens += num_cached
            self._add_to_batch(batch, req, n)
            budget -= n

    def _add_to_batch(self, batch: Batch, req: Request, n: int) -> None:
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
        self._busy.discard(req)
        self.kv.cache_generated(req, req.num_computed_tokens)
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.waiting.appendleft(req)

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
        record = end_s is not None
        end = end_s or 0.0
        for req, (n, _) in zip(batch.requests, batch.seqs, strict=False):
            computed = req.num_computed_tokens + n
            req.num_computed_tokens = computed
            if computed == req.num_tokens:
                out = req.num_output_tokens + 1
                req.num_output_tokens = out
                req.num_tokens = computed + 1
                if record:
                    times = req.token_times
                    if times is not None:
                        times.append(end)
                if emitted is not None:
                    emitted.append(req)
                if out == 1:
                    first.append(req)
                if out == req.max_output_tokens:
                    finished.append(req)
        if batch.steady:  # a tick: every steady decode emitted a token at end_s
            self._tick_ends.append(end)
            self.tick += 1
        if finished:
            busy, running = self._busy, self.running
            for req in finished:
                self.kv.free(req)
                busy.remove(req)
                running.remove(req)  # (a few a step, each found in C; the order stays)
        if self.lazy:
            self._settle(batch.requests)
        return first, finished

    # --- steady decodes (see the module doc) ------------------------------------------

    def _busy_in_order(self) -> list[Request]:
        """The running requests that are not steady, in ``running`` order."""
        if not self._steady_n:
            return self.running
        return sorted(self._busy, key=_by_seq)

    def _settle(self, reqs: list[Request]) -> None:
        """Make steady each of ``reqs`` (just run) that is running, decodes, and has room
        in its blocks and more than one token to go: until the tick of its next block or
        its last token, whichever comes first."""
        tick, busy, due = self.tick, self._busy, self._due
        for req in reqs:
            computed = req.num_computed_tokens
            if req.num_tokens - computed != 1 or not req.num_output_tokens or req not in busy:
                continue
            steps = self._steady_steps(req)
            if steps < 1:
                continue
            busy.remove(req)
            req.steady_tick = tick
            req.steady_exit = tick + steps
            self._steady_n += 1
            self._steady_c0 += computed - tick
            due.setdefault(tick + steps, []).append(req)

    def _steady_steps(self, req: Request) -> int:
        """Decode steps from ``req``'s counters to its next block or its last token,
        whichever comes first."""
        room = len(req.block_ids) * self.kv.block_size - req.num_computed_tokens
        return min(room, req.max_output_tokens - req.num_output_tokens - 1)

    def _exit_tick(self, req: Request) -> int:
        """The tick of steady ``req``'s next block or last token (its counters are
        still those of ``steady_tick``)."""
        return req.steady_tick + self._steady_steps(req)

    def _take_due(self) -> list[Request]:
        """The steady requests whose steadiness ends at this tick: those whose next token
        is their last are woken; those whose next token starts a block come back, still
        steady (``_schedule`` gives them the block in the pass, in ``seq`` order)."""
        at_boundary: list[Request] = []
        tick = self.tick
        # (once each: one woken and made steady again until the same tick is listed twice)
        for req in dict.fromkeys(self._due.pop(tick, ())):
            if req.steady_tick < 0 or req.steady_exit != tick:
                continue  # woken since (and maybe steady again, until another tick)
            if req.num_output_tokens + (tick - req.steady_tick) + 1 == req.max_output_tokens:
                self._wake(req)
            else:
                at_boundary.append(req)
        return at_boundary

    def _wake(self, req: Request) -> None:
        """Write a steady request's counters and token times up to this tick; it is an
        ordinary running request again."""
        t0, t = req.steady_tick, self.tick
        self._steady_c0 -= req.num_computed_tokens - t0
        if t > t0:
            n = t - t0
            req.num_computed_tokens += n
            req.num_output_tokens += n
            req.num_tokens += n
            if req.token_times is not None:
                req.token_times.extend(self._tick_ends[t0:t])
        self._steady_n -= 1
        req.steady_tick = -1
        self._busy.add(req)

    def wake_all(self) -> None:
        """Every steady request back to an ordinary one (before a per-request step)."""
        if self._steady_n:
            for req in self.running:
                if req.steady_tick >= 0:
                    self._wake(req)
        self._due.clear()

    def steady_since(self, req: Request) -> list[float]:
        """The times of the tokens ``req`` emitted while steady and not yet written to its
        counters (empty unless steady)."""
        if req.steady_tick < 0:
            return []
        return self._tick_ends[req.steady_tick : self.tick]

    def abort(self, req: Request) -> None:
        """Drop ``req`` from either queue and free its blocks; no-op if in neither."""
        if req.steady_tick >= 0:
            self._wake(req)
        if req in self.running:
            self._busy.discard(req)
            self.running.remove(req)
            self.kv.free(req)
        elif req in self.waiting:
            self.waiting.remove(req)
