"""Admission: which request may go to which upstream now, and which must wait.

Each upstream has a budget: tokens in flight (mode ``tokens``: a request holds its
estimated prompt plus output tokens from dispatch to its end) or requests in flight
(mode ``requests``, what most gateways count). A request that fits no upstream waits in
one bounded queue, at most ``queue_timeout_s``.

The queue is size-aware in mode ``tokens``: when room frees, the smallest waiting
requests go first, so short chats are not stuck behind huge prompts; a request that has
waited ``starvation_s`` goes before every newer one (and room is held for it on the
upstreams it may go to), so huge prompts are not starved either. Mode ``requests``
serves the queue in arrival order (a waiter that does not fit holds up those behind it
on its own upstreams). A
request larger than a whole budget goes alone, to an upstream with nothing in flight.

Plain bookkeeping, with no timer and no clock but the one it is given: ``offer`` lets
a request in or queues it, ``release`` lets waiters in, ``expire`` ends the waits past
``queue_timeout_s``. The gateway drives it on its event loop (``acquire``: nothing
awaits between a check and its charge, so no two requests can take the same room);
``sim run --admission`` drives the same code in virtual time, in front of simulated
engines (``inferlab.load.admitted``). The caller must ``release`` every ``Ticket`` it was
given, however its request ends.

Several gateway instances can hold one set of budgets (``[redis] admission``): then
``shared`` (``inferlab.gateway.shared.SharedAdmission``) holds the count in Redis, and
``others_tokens`` / ``others_requests`` are what the other instances held when Redis
last said. The local decision uses them; ``acquire`` then asks Redis to take the room
atomically across instances, and a request Redis refuses (the view was stale) goes back
to its place in the queue.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from inferlab._clock import NS_PER_S, Clock
from inferlab.gateway.config import AdmissionMode


class Rejected(Exception):
    """No room for the request: ``reason`` is ``queue_full`` or ``queue_timeout``;
    ``retry_after_s`` when a client may try again."""

    def __init__(self, reason: str, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after_s = retry_after_s


@dataclass
class Ticket:
    """Room held on ``upstream`` for one request: ``tokens`` of it, and one request."""

    upstream: int
    tokens: int
    queued_ns: int = 0  # how long the request waited for it
    released: bool = False
    shared: bool = False  # also held in the instances' shared count (``SharedBudgets``)
    charged: int = 0  # tokens of it in the shared count (grows in steps of ``SHARED_GROW_STEP``)


class SharedBudgets(Protocol):
    """The budgets' count across gateway instances (``inferlab.gateway.shared``)."""

    async def take(self, ticket: Ticket) -> bool:
        """Charge ``ticket`` to the shared count if it fits there (atomically across
        instances) and no other instance's request has waited longer than starvation
        and longer than this one (``ticket.queued_ns``); False, and nothing charged, if
        not."""
        ...

    def give(self, upstream: int, tokens: int, requests: int) -> None:
        """Add ``tokens`` and ``requests`` (negative: give back) to this instance's share
        of ``upstream``'s count; sent in the background."""
        ...

    def wake(self) -> None:
        """A request is waiting: read the other instances' counts soon."""
        ...


#: A request that outgrows its reservation is charged to the shared count this many
#: tokens ahead at a time (one call to Redis per step, not per token).
SHARED_GROW_STEP = 64


#: Picks one upstream among those with room (each index into the budgets).
Chooser = Callable[[Sequence[int]], int]


#: Told the ticket when a waiting request is let in (from inside ``release`` or ``offer``).
Granted = Callable[[Ticket], None]


@dataclass
class Waiter:
    """A request waiting in the queue, since ``since_ns`` on the admission's clock."""

    tokens: int
    candidates: Sequence[int]
    since_ns: int
    seq: int
    choose: Chooser = field(repr=False)
    granted: Granted = field(repr=False)
    not_before: int = 0  # not let in before the shared count's batch of this number (``batches``)


class Admission:
    """The budgets of ``len(max_tokens)`` upstreams, and the queue in front of them.
    ``max_tokens[i]`` and ``max_requests[i]``: upstream ``i``'s budget in its mode."""

    def __init__(
        self, mode: AdmissionMode, max_tokens: Sequence[int], max_requests: Sequence[int], *,
        queue_max: int, queue_timeout_s: float, starvation_s: float, clock: Clock,
    ) -> None:
        self.mode = mode
        self.max_tokens = list(max_tokens)
        self.max_requests = list(max_requests)
        self.tokens_in_flight = [0] * len(max_tokens)
        self.requests_in_flight = [0] * len(max_tokens)
        # what other gateway instances hold, as Redis last said (``shared``; else zeros)
        self.others_tokens = [0] * len(max_tokens)
        self.others_requests = [0] * len(max_tokens)
        # room held by the shared count: for another instance's request that has waited
        # longer than starvation_s, or while Redis's counts are rebuilt
        self.held = [False] * len(max_tokens)
        # tokens charged to the shared count ahead of what requests hold (their growth
        # is charged in steps), counted as held here too
        self.charged_ahead = [0] * len(max_tokens)
        self.batches = 0  # the shared count's answers so far (each lets waiters in again)
        self.shared: SharedBudgets | None = None
        self.queue_max = queue_max
        self.queue_timeout_s = queue_timeout_s
        self.queue_timeout_ns = int(queue_timeout_s * NS_PER_S)
        self.starvation_ns = int(starvation_s * NS_PER_S)
        self.clock = clock
        self._waiting: list[Waiter] = []
        self._seq = itertools.count()

    @property
    def queue_length(self) -> int:
        return len(self._waiting)

    def fits(self, upstream: int, tokens: int) -> bool:
        """Whether ``upstream`` has room for a request of ``tokens`` now."""
        if self.held[upstream]:
            return False
        if self.mode == "tokens":
            held = self.tokens_in_flight[upstream] + self.charged_ahead[upstream] + self.others_tokens[upstream]
            return held == 0 or held + tokens <= self.max_tokens[upstream]
        if self.mode == "requests":
            return self.requests_in_flight[upstream] + self.others_requests[upstream] < self.max_requests[upstream]
        return True

    def offer(
        self, tokens: int, candidates: Sequence[int], choose: Chooser, granted: Granted, *,
        since_ns: int | None = None, seq: int | None = None, not_before: int = 0,
    ) -> Ticket | Waiter:
        """Room for a request of ``tokens`` on one of ``candidates`` (picked by ``choose``
        among those with room) now, as a ``Ticket``; else a place in the queue, a
        ``Waiter``: ``granted(ticket)`` is called when room is given (it must not call
        back into this object: it runs mid-way through a grant). ``Rejected`` if the
        queue is full. The waiter's owner ends its wait at ``queue_timeout_s`` (``expire``
        or ``withdraw``): this class sets no timer, so the same bookkeeping runs on the
        event loop (``acquire``) and in virtual time (``inferlab.load.admitted``).
        ``since_ns`` and ``seq``: a request offered again keeps its wait and its place (and
        is not refused for a full queue: it had its place); ``not_before``: it waits at
        least until the shared count's batch of that number has answered."""
        now = self.clock.now_ns()
        since = now if since_ns is None else since_ns
        if not self._waiting and self.batches >= not_before:
            room = [i for i in candidates if self.fits(i, tokens)]
            if room:
                return self._take(choose(room), tokens, now - since)
        if seq is None and len(self._waiting) >= self.queue_max:
            raise Rejected("queue_full", f"the gateway's queue is full ({self.queue_max} requests waiting)", 1.0)
        waiter = Waiter(tokens, candidates, since, next(self._seq) if seq is None else seq, choose, granted,
                        not_before)
        self._waiting.append(waiter)
        self._grant()
        return waiter

    def withdraw(self, waiter: Waiter) -> bool:
        """Take ``waiter`` out of the queue; False if it was no longer there (granted)."""
        if waiter in self._waiting:
            self._waiting.remove(waiter)
            return True
        return False

    def oldest_waiting_ns(self, upstream: int) -> int | None:
        """Since when the longest waiter that could go to ``upstream`` waits; None: none."""
        since = [w.since_ns for w in self._waiting if upstream in w.candidates]
        return min(since) if since else None

    @property
    def next_deadline_ns(self) -> int | None:
        """When the longest waiter's wait reaches ``queue_timeout_s``; None: none waits."""
        if not self._waiting:
            return None
        return min(w.since_ns for w in self._waiting) + self.queue_timeout_ns

    def expire(self) -> list[Waiter]:
        """Take out of the queue every waiter that has waited ``queue_timeout_s`` by the
        clock, and return them (each to be refused with ``timed_out()``)."""
        now = self.clock.now_ns()
        late = [w for w in self._waiting if now - w.since_ns >= self.queue_timeout_ns]
        for w in late:
            self._waiting.remove(w)
        return late

    def timed_out(self) -> Rejected:
        """What a request that waited ``queue_timeout_s`` in vain is refused with."""
        return Rejected(
            "queue_timeout", f"no upstream had room for this request within {self.queue_timeout_s:g} s",
            self.queue_timeout_s,
        )

    async def acquire(self, tokens: int, candidates: Sequence[int], choose: Chooser) -> Ticket:
        """``offer`` on the event loop: the ``Ticket``, once room is given, waiting at
        most ``queue_timeout_s``. ``Rejected`` if the queue is full or the wait times
        out. If the caller is cancelled while waiting, nothing stays held. With
        ``shared``, the room is then taken in the shared count too; where that refuses,
        the request waits again in its place, within the same ``queue_timeout_s``."""
        since, seq, not_before = self.clock.now_ns(), next(self._seq), 0
        while True:
            ticket = await self._wait(tokens, candidates, choose, since, seq, not_before)
            if self.shared is None or self.mode == "off":
                return ticket
            try:
                taken = await self.shared.take(ticket)
            except BaseException:
                self.release(ticket)  # (not yet shared: only the local room)
                raise
            if taken:
                ticket.shared = True
                ticket.charged = ticket.tokens
                return ticket
            # another instance took the room first: wait again, for the counts of a later
            # batch at least (this one's said there was room: asking again now would spin)
            not_before = self.batches + 1
            self.release(ticket)
            if self.clock.now_ns() - since >= self.queue_timeout_ns:
                raise self.timed_out()

    async def _wait(self, tokens: int, candidates: Sequence[int], choose: Chooser, since: int, seq: int,
                    not_before: int) -> Ticket:
        future: asyncio.Future[Ticket] = asyncio.get_running_loop().create_future()
        # (a first offer counts its wait from its own reading of the clock: let in at once,
        # it waited 0, which the queue-wait histogram's bucket of 0 counts as no wait)
        got = self.offer(tokens, candidates, choose, future.set_result, since_ns=since if not_before else None,
                         seq=seq if not_before else None, not_before=not_before)
        if isinstance(got, Ticket):
            return got
        if self.shared is not None:
            self.shared.wake()
        left = self.queue_timeout_s - (self.clock.now_ns() - since) / NS_PER_S
        try:
            return await asyncio.wait_for(asyncio.shield(future), max(left, 0.0))
        except BaseException as e:  # timed out, or the caller was cancelled
            if not self.withdraw(got) and future.done():
                self.release(future.result())  # granted just as the wait ended
            if isinstance(e, TimeoutError):
                raise self.timed_out() from None
            raise

    def resize(self, ticket: Ticket, tokens: int) -> None:
        """Hold ``tokens`` instead of what ``ticket`` holds (a request that produced more
        than its estimate). Never shrinks below nothing."""
        if ticket.released or self.mode == "off":
            return
        tokens = max(tokens, 0)
        u = ticket.upstream
        self.tokens_in_flight[u] += tokens - ticket.tokens
        if ticket.shared and self.shared is not None and self.mode == "tokens":
            ahead = ticket.charged - ticket.tokens
            if tokens > ticket.charged:
                more = tokens + SHARED_GROW_STEP - ticket.charged
                self.shared.give(u, more, 0)
                ticket.charged += more
            self.charged_ahead[u] += ticket.charged - tokens - ahead
        ticket.tokens = tokens

    def release(self, ticket: Ticket) -> None:
        """Give ``ticket``'s room back (once; a second call does nothing), and let
        waiting requests in."""
        if ticket.released:
            return
        ticket.released = True
        self.tokens_in_flight[ticket.upstream] -= ticket.tokens
        self.requests_in_flight[ticket.upstream] -= 1
        if ticket.shared and self.shared is not None:
            if self.mode == "tokens":  # (where resize charges ahead)
                self.charged_ahead[ticket.upstream] -= ticket.charged - ticket.tokens
            self.shared.give(ticket.upstream, -ticket.charged, -1)
        self._grant()

    def regrant(self) -> None:
        """Let waiters in after ``others_tokens``, ``others_requests`` or ``held`` changed."""
        self._grant()

    def _take(self, upstream: int, tokens: int, queued_ns: int) -> Ticket:
        self.tokens_in_flight[upstream] += tokens
        self.requests_in_flight[upstream] += 1
        return Ticket(upstream, tokens, queued_ns)

    def _grant(self) -> None:
        """Let in every waiter that fits, in the queue's order (module docstring), each
        to the upstream its own chooser picks."""
        if not self._waiting:
            return
        now = self.clock.now_ns()
        if self.mode == "tokens":
            starved = [w for w in self._waiting if now - w.since_ns >= self.starvation_ns]
            rest = sorted((w for w in self._waiting if now - w.since_ns < self.starvation_ns), key=lambda w: (w.tokens, w.seq))
            order = sorted(starved, key=lambda w: w.seq) + rest
            hold = len(starved)  # a starved waiter that does not fit stops the line
        else:
            order = sorted(self._waiting, key=lambda w: w.seq)
            hold = len(order)  # arrival order: the first that does not fit stops the line
        blocked: set[int] = set()  # upstreams whose line is stopped (by a waiter ahead)
        for n, w in enumerate(order):
            room = [] if self.batches < w.not_before else [
                i for i in w.candidates if i not in blocked and self.fits(i, w.tokens)]
            if not room:
                if n < hold:
                    blocked.update(w.candidates)  # it stops the line on its own upstreams only
                continue
            self._waiting.remove(w)
            w.granted(self._take(w.choose(room), w.tokens, now - w.since_ns))

