"""The reference scheduler with steady decodes kept as sums: the same steps, faster.

In a saturated run most running requests are decodes with nothing to decide: one token
a step, room in their last KV block. ``SteadyScheduler`` takes such a request out of the
per-step passes while ``lazy`` is set (virtual time: no per-token events wanted):

- It is *steady* from a tick (``Request.steady_tick``) on. A tick is a step that ran
  every steady decode; ``tick`` counts them and ``_tick_ends`` keeps their end times.
  A steady request's counters stay as they were at its ``steady_tick``: at tick ``t`` it
  has computed ``t - steady_tick`` more tokens and emitted as many, at ``_tick_ends``.
- Each step counts the steady decodes in ``Batch.steady`` (one token each, within the
  token budget) and their context in ``Batch.steady_context`` (kept as a running sum,
  ``_steady_c0 + steady · tick``), not in ``Batch.requests``.
- It needs the scheduler again at its next block or its last token (``steady_exit``,
  filed in ``_due``). At a block boundary it stays steady: the pass gives it its block
  in admission order, as the reference would. Before its last token it is woken
  (``_wake``: counters and token times written back) and runs as an ordinary request;
  so is a steady request that is preempted, aborted, or read (``steady_since``).
- A step whose budget cannot hold every running request's tokens, or any step while
  ``lazy`` is off, wakes them all (``wake_all``) and visits every request in turn.
- Under ``reserve_outputs`` (SGLang's admission) the tokens steady requests may still
  generate are kept as sums too (``_outputs_left``); one with more than
  ``CLIP_NEW_TOKENS`` left counts as that many, and is woken at the tick its tokens left
  come down to it.

The engine always schedules with this class; in real time (per-token events wanted)
``lazy`` is off, and what remains of the fast path is the common decode handled inline.

Contract: for any sequence of calls, every step has the batch, allocations, preemptions,
admissions and finishing order of ``Scheduler`` (counting steady decodes as the
``(1, context)`` sequences they stand for), and every request the same counters and
token times once woken. ``tests/sim/engine/test_steady.py`` checks this step by step.
"""

from __future__ import annotations

from inferlab.sim.engine.scheduler import (
    CLIP_NEW_TOKENS,
    Batch,
    KVCache,
    Request,
    Scheduler,
    SchedulerConfig,
    _sum_outputs_left,
)


def _by_seq(req: Request) -> int:
    return req.seq


class SteadyScheduler(Scheduler):
    """``Scheduler`` with the steady-decode fast path; see the module doc. With ``lazy``
    off it visits every running request each step, as the reference does.

    (It calls the reference's methods as ``Scheduler.f(self, ...)``: on Python 3.11
    ``super()`` builds an object per call, 1 % of a step in virtual time.)"""

    def __init__(self, config: SchedulerConfig, kv: KVCache) -> None:
        super().__init__(config, kv)
        self.lazy = False  # whether steps may keep decodes steady (set per step)
        self._admitted = 0  # admissions so far (``Request.seq``: ``running`` is sorted by it)
        self._busy: set[Request] = set()  # the running requests that are not steady
        self.tick = 0  # ticks so far (since nothing was last steady)
        self._tick_ends: list[float] = []  # each tick's end time
        self._steady_n = 0  # steady requests
        # Σ (num_computed_tokens - steady_tick) over them: with their counters frozen at
        # their ``steady_tick``, their context at tick t is this + _steady_n · t
        self._steady_c0 = 0
        self._due: dict[int, list[Request]] = {}  # tick -> requests whose steadiness ends
        # Σ (max_new_tokens - num_output_tokens + steady_tick) and Σ max_new_tokens over
        # them: the tokens they may still generate at tick t are the first less _steady_n · t
        self._steady_l0 = 0
        self._steady_max = 0
        # ``reserve_outputs``: the steady requests with more than ``CLIP_NEW_TOKENS`` left
        # (each counts as that many in the clipped sum until the tick its tokens left come
        # down to it, when it is woken), and the first sum over the others
        self._steady_n_clipped = 0
        self._steady_l0_unclipped = 0

    # --- the reference's steps, with steady decodes -----------------------------------

    def schedule(self, now_s: float) -> Batch:
        if self._steady_n:
            if not self.lazy:
                self.wake_all()  # (lazy: the due ones are met in ``_schedule_running``)
        elif self.tick:  # nothing is steady: the ticks so far are no longer needed
            self.tick = 0
            self._tick_ends.clear()
            self._due.clear()
        batch = Scheduler.schedule(self, now_s)
        for req in batch.admitted:  # (here, not in ``_admit``: one call less per step)
            req.seq = self._admitted
            self._admitted += 1
            self._busy.add(req)
        return batch

    def _schedule_running(self, batch: Batch, budget: int) -> int:
        """The reference's pass over running requests. With steady requests, when the
        budget holds every running request's tokens (so none is cut short), it visits
        only those that are not steady and the steady ones that reach a block boundary;
        else it wakes them all first. The common case of a decode runs inline."""
        reqs = self.running
        free = not self.config.budget_bounds_decodes  # (every decode runs: ``Scheduler._schedule_running``)
        if self._steady_n:
            at_boundary = self._take_due()
            reqs = self._busy_in_order()
            if self._steady_n + sum([r.num_tokens - r.num_computed_tokens for r in reqs]) > budget and not (
                # (decodes outside the budget and no prompt chunk to share it: none is cut
                # short, so the order does not matter)
                free and all(r.num_tokens - r.num_computed_tokens == 1 and r.num_output_tokens for r in reqs)
            ):
                self.wake_all()  # every request in turn, the budget running out among them
                reqs = self.running
            else:
                if at_boundary:  # their blocks are taken in ``running`` order, like the rest
                    reqs = sorted(reqs + at_boundary, key=_by_seq)
                budget -= self._steady_n
        kv, busy, bs = self.kv, self._busy, self.kv.block_size
        requests, seqs = batch.requests, batch.seqs
        decodes = 0
        for req in reqs:
            if req.steady_tick >= 0:  # steady, its next token starts a block (budgeted above)
                # (its prompt blocks are registered: ``append_block`` is what ``allocate``
                # does, without the call)
                if not kv.append_block(req):
                    total = req.num_computed_tokens + (self.tick - req.steady_tick) + 1
                    if not self._allocate(req, total, batch):
                        break  # req was the last one running
                self._file_exit(req)
                continue
            if budget <= 0 and not free:
                break
            computed = req.num_computed_tokens
            remaining = req.num_tokens - computed
            if budget <= 0 and not (remaining == 1 and req.num_output_tokens):
                continue  # (free) a prompt chunk: nothing left for it
            if remaining == 1 and req.num_output_tokens and computed < len(req.block_ids) * bs:
                # the common case: a decode whose blocks hold its next token (nothing
                # to allocate, its prompt blocks registered when its prefill ended)
                requests.append(req)
                seqs.append((1, computed))
                decodes += 1
                budget -= 1
                continue
            if req not in busy:  # preempted earlier in this pass (``reqs`` was a copy)...
                break  # ... and so was every later one: the most recently admitted go first
            n = 1 if budget <= 0 else min(remaining, budget)
            decode = remaining == 1 and req.num_output_tokens > 0  # (starting a block)
            # (a decode's one more block: ``allocate``'s common case, without the call)
            if not (decode and kv.append_block(req)) and not self._allocate(req, computed + n, batch):
                break  # req itself was preempted: it was the last one running
            self._add_to_batch(batch, req, n)
            budget -= n
        n = self._steady_n  # (now: a steady request preempted in the pass no longer is)
        batch.steady = n
        batch.steady_context = self._steady_c0 + n * self.tick
        batch.emitting += decodes + n
        batch.decode_tokens += decodes + n
        # (the reference's budget left unless a steady request was preempted, taking back
        # the token budgeted for it: then no one is admitted)
        return budget

    def _may_prefill(self) -> list[Request]:
        return self._busy_in_order()  # (steady requests are decodes)

    def _outputs_left(self) -> tuple[int, int, int]:
        clipped, left, total = _sum_outputs_left(self._busy)
        t, n_clipped = self.tick, self._steady_n_clipped
        steady_left = self._steady_l0 - self._steady_n * t
        below = self._steady_l0_unclipped - (self._steady_n - n_clipped) * t
        return clipped + below + n_clipped * CLIP_NEW_TOKENS, left + steady_left, total + self._steady_max

    def _clipped(self, req: Request) -> bool:
        """Whether steady ``req`` (its counters as at its ``steady_tick``) has more tokens
        left than ``reserve_outputs`` counts."""
        return self.config.reserve_outputs and req.max_new_tokens - req.num_output_tokens > CLIP_NEW_TOKENS

    def _preempt(self, req: Request) -> None:
        if req.steady_tick >= 0:
            self._wake(req)
        self._busy.discard(req)
        Scheduler._preempt(self, req)

    def finish_step(
        self, batch: Batch, end_s: float | None, emitted: list[Request] | None = None
    ) -> tuple[list[Request], list[Request]]:
        """The reference's; a step with steady decodes is a tick (each emitted a token at
        ``end_s``); with ``lazy``, requests that now only decode become steady. Steady
        requests are not in ``emitted``."""
        first, finished = Scheduler.finish_step(self, batch, end_s, emitted)
        if batch.steady:
            self._tick_ends.append(end_s or 0.0)
            self.tick += 1
        if finished:
            self._busy.difference_update(finished)
        if self.lazy:
            self._settle(batch.requests)
        return first, finished

    def abort(self, req: Request) -> None:
        if req.steady_tick >= 0:
            self._wake(req)
        self._busy.discard(req)
        Scheduler.abort(self, req)

    # --- steady requests ----------------------------------------------------------------

    def steady_since(self, req: Request) -> list[float]:
        """The times of the tokens ``req`` emitted while steady and not yet written to its
        counters (empty unless steady)."""
        if req.steady_tick < 0:
            return []
        return self._tick_ends[req.steady_tick : self.tick]

    def wake_all(self) -> None:
        """Every steady request back to an ordinary one (before a per-request step)."""
        if self._steady_n:
            for req in self.running:
                if req.steady_tick >= 0:
                    self._wake(req)
        self._due.clear()

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
            l0 = req.max_new_tokens - req.num_output_tokens + tick
            self._steady_l0 += l0
            self._steady_max += req.max_new_tokens
            if self._clipped(req):
                self._steady_n_clipped += 1
            else:
                self._steady_l0_unclipped += l0
            due.setdefault(tick + steps, []).append(req)

    def _steady_steps(self, req: Request) -> int:
        """Decode steps from ``req``'s counters to its next block or its last token,
        whichever comes first, or (``reserve_outputs``) to where its tokens left come
        down to ``CLIP_NEW_TOKENS``."""
        room = len(req.block_ids) * self.kv.block_size - req.num_computed_tokens
        steps = min(room, req.max_output_tokens - req.num_output_tokens - 1)
        if self._clipped(req):
            steps = min(steps, req.max_new_tokens - req.num_output_tokens - CLIP_NEW_TOKENS)
        return steps

    def _file_exit(self, req: Request) -> None:
        """File steady ``req`` (counters still those of its ``steady_tick``) under the
        tick of its next block or last token."""
        req.steady_exit = req.steady_tick + self._steady_steps(req)
        self._due.setdefault(req.steady_exit, []).append(req)

    def _take_due(self) -> list[Request]:
        """The steady requests whose steadiness ends at this tick: those whose next token
        is their last, or whose tokens left came down to ``CLIP_NEW_TOKENS``, are woken;
        those whose next token starts a block come back, still steady
        (``_schedule_running`` gives them the block in the pass, in order)."""
        at_boundary: list[Request] = []
        tick = self.tick
        # (once each: one woken and made steady again until the same tick is listed twice)
        for req in dict.fromkeys(self._due.pop(tick, ())):
            if req.steady_tick < 0 or req.steady_exit != tick:
                continue  # woken since (and maybe steady again, until another tick)
            out = req.num_output_tokens + (tick - req.steady_tick)
            if out + 1 == req.max_output_tokens or (self._clipped(req) and req.max_new_tokens - out <= CLIP_NEW_TOKENS):
                self._wake(req)
            else:
                at_boundary.append(req)
        return at_boundary

    def _wake(self, req: Request) -> None:
        """Write a steady request's counters and token times up to this tick; it is an
        ordinary running request again."""
        t0, t = req.steady_tick, self.tick
        self._steady_c0 -= req.num_computed_tokens - t0
        l0 = req.max_new_tokens - req.num_output_tokens + t0
        self._steady_l0 -= l0
        self._steady_max -= req.max_new_tokens
        if self._clipped(req):  # (its counters still those of its steady_tick)
            self._steady_n_clipped -= 1
        else:
            self._steady_l0_unclipped -= l0
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
