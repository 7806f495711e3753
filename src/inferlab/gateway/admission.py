"""Admission: which request may go to which upstream now, and which must wait.

Each upstream has a budget: tokens in flight (mode ``tokens``: a request holds its
estimated prompt plus output tokens from dispatch to its end) or requests in flight
(mode ``requests``, what most gateways count). A request that fits no upstream waits in
one bounded queue, at most ``queue_timeout_s``.

The queue is size-aware in mode ``tokens``: when room frees, the smallest waiting
requests go first, so short chats are not stuck behind huge prompts; a request that has
waited ``starvation_s`` goes before every newer one (and room is held for it), so huge
prompts are not starved either. Mode ``requests`` serves the queue in arrival order. A
request larger than a whole budget goes alone, to an upstream with nothing in flight.

Plain bookkeeping on one event loop: nothing awaits between a check and its charge,
so no two requests can take the same room. The caller must ``release`` every
``Ticket`` it was given, however its request ends.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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


#: Picks one upstream among those with room (each index into the budgets).
Chooser = Callable[[Sequence[int]], int]


@dataclass
class _Waiter:
    tokens: int
    candidates: Sequence[int]
    since_ns: int
    seq: int
    choose: Chooser = field(repr=False)
    future: asyncio.Future[Ticket] = field(repr=False)


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
        self.queue_max = queue_max
        self.queue_timeout_s = queue_timeout_s
        self.starvation_ns = int(starvation_s * NS_PER_S)
        self.clock = clock
        self._waiting: list[_Waiter] = []
        self._seq = itertools.count()

    @property
    def queue_length(self) -> int:
        return len(self._waiting)

    def fits(self, upstream: int, tokens: int) -> bool:
        """Whether ``upstream`` has room for a request of ``tokens`` now."""
        if self.mode == "tokens":
            held = self.tokens_in_flight[upstream]
            return held == 0 or held + tokens <= self.max_tokens[upstream]
        if self.mode == "requests":
            return self.requests_in_flight[upstream] < self.max_requests[upstream]
        return True

    async def acquire(self, tokens: int, candidates: Sequence[int], choose: Chooser) -> Ticket:
        """Room for a request of ``tokens`` on one of ``candidates`` (picked by ``choose``
        among those with room), waiting in the queue if none has any. ``Rejected`` if
        the queue is full or the wait times out. If the caller is cancelled while
        waiting, nothing stays held."""
        now = self.clock.now_ns()
        if not self._waiting:
            room = [i for i in candidates if self.fits(i, tokens)]
            if room:
                return self._take(choose(room), tokens, 0)
        if len(self._waiting) >= self.queue_max:
            raise Rejected("queue_full", f"the gateway's queue is full ({self.queue_max} requests waiting)", 1.0)
        waiter = _Waiter(tokens, candidates, now, next(self._seq), choose, asyncio.get_running_loop().create_future())
        self._waiting.append(waiter)
        self._grant()
        try:
            return await asyncio.wait_for(asyncio.shield(waiter.future), self.queue_timeout_s)
        except BaseException as e:  # timed out, or the caller was cancelled
            if waiter in self._waiting:
                self._waiting.remove(waiter)
            elif waiter.future.done() and not waiter.future.cancelled():
                self.release(waiter.future.result())  # granted just as the wait ended
            if isinstance(e, TimeoutError):
                raise Rejected(
                    "queue_timeout", f"no upstream had room for this request within {self.queue_timeout_s:g} s",
                    self.queue_timeout_s,
                ) from None
            raise

    def resize(self, ticket: Ticket, tokens: int) -> None:
        """Hold ``tokens`` instead of what ``ticket`` holds (a request that produced more
        than its estimate). Never shrinks below nothing."""
        if ticket.released or self.mode == "off":
            return
        tokens = max(tokens, 0)
        self.tokens_in_flight[ticket.upstream] += tokens - ticket.tokens
        ticket.tokens = tokens

    def release(self, ticket: Ticket) -> None:
        """Give ``ticket``'s room back (once; a second call does nothing), and let
        waiting requests in."""
        if ticket.released:
            return
        ticket.released = True
        self.tokens_in_flight[ticket.upstream] -= ticket.tokens
        self.requests_in_flight[ticket.upstream] -= 1
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
        for n, w in enumerate(order):
            if w.future.done():  # (cancelled: its acquire is leaving)
                continue
            room = [i for i in w.candidates if self.fits(i, w.tokens)]
            if not room:
                if n < hold:
                    return
                continue
            self._waiting.remove(w)
            w.future.set_result(self._take(w.choose(room), w.tokens, now - w.since_ns))

