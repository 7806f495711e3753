"""The gateway's admission in front of simulated engines, in virtual time (``sim run
--admission MODE``): the same ``inferlab.gateway.admission.Admission`` the gateway runs,
driven by a ``VirtualClock`` instead of its event loop, so admission policies can be
compared before they are deployed.

A send reserves its prompt tokens (counted exactly, as the gateway counts them for
``sim serve`` with ``tokenizer = "builtin"``) plus ``max_tokens`` (or
``default_max_tokens``) on one engine (``Replicas``: the one the router picks among
those with room) and goes to it at once, or waits in the gateway's queue. A waiter goes
to its engine when room frees: when a request's last token has reached its client (the
gateway sees its stream end), the moment its ticket is released. A request refused by
the queue (full, or its wait reached ``queue_timeout_s``) is a failed record as the
gateway answers it: kind ``http_status``, status 503, its error beginning
``REFUSED_PREFIX``. Records that went through the gateway carry the wait in their
``server_timeline`` (``gateway_queue_ms``; the engine's times are then measured from
the send, as a client behind the gateway sees them).

As every send in virtual time, one due while the engines step (or while the gateway's
own bookkeeping is due) is handled when that ends: it reaches its engine at its send
time if there is room, but joins the queue, and sees room given back, only then.

Unlike the gateway, a request's hold does not grow when its output passes the tokens
reserved for it (a request without ``max_tokens`` generating more than
``default_max_tokens``): it holds what was reserved until it ends.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from inferlab._clock import NS_PER_S, VirtualClock
from inferlab._errors import InferlabError
from inferlab.gateway.admission import Admission, Rejected, Ticket, Waiter
from inferlab.gateway.routing import eligible, ids_prefix
from inferlab.load.policy import Answer, Send
from inferlab.load.replicas import Replicas
from inferlab.load.virtual import _MIN_REJECT_S, Interrupted, SimulatedServer
from inferlab.results.records import ErrorKind, RequestRecord

#: How a request the gateway's queue refused has its error begin: no HTTP in virtual
#: time, but the status the gateway answers with.
REFUSED_PREFIX = "refused by the gateway's admission (it answers HTTP 503): "

Step = tuple[float, float, list[int], list[Answer] | None]


class Admitted:
    """``engines`` (one ``SimulatedServer``, or ``Replicas`` behind their router) behind
    ``admission``, whose clock is ``clock``. Stands where they would for ``serve``."""

    def __init__(
        self, engines: SimulatedServer | Replicas, admission: Admission, clock: VirtualClock, *,
        default_max_tokens: int,
    ) -> None:
        self.engines = engines
        self.admission = admission
        self.clock = clock
        self.default_max_tokens = default_max_tokens
        self._first = engines.servers[0] if isinstance(engines, Replicas) else engines
        self._count = len(engines.servers) if isinstance(engines, Replicas) else 1
        self._tickets: dict[int, Ticket] = {}  # send index → its room, while on an engine
        self._waiting: dict[int, tuple[Send, Waiter]] = {}  # send index → in the queue
        self._granted: list[tuple[Send, Ticket]] = []  # let in, not yet sent on
        self._pending: Step | None = None  # the engines' step under way, not yet reported
        self._releases: list[tuple[float, int]] = []  # (when, send index): a heap
        self._ended: list[tuple[float, int]] = []  # (when, send index) ended, not yet reported: a heap

    @property
    def done(self) -> list[RequestRecord]:
        return self.engines.done

    def _at(self, t_s: float) -> None:
        self.clock.advance_to_ns(max(self.clock.now_ns(), round(t_s * NS_PER_S)))

    def add(self, send: Send) -> float | None:
        self._at(send.at_s)
        ids = self._first.prompt_ids(send.spec)
        tokens = len(ids) + (send.spec.max_tokens or self.default_max_tokens)
        upstreams: Sequence[int] = range(self._count)
        if isinstance(self.engines, Replicas):
            prefix, router = ids_prefix(ids), self.engines.router
            upstreams = eligible(router, upstreams, len(ids))  # (split-by-length: its own pool's room)

            def choose(room: Sequence[int]) -> int:
                return router(room, prefix, len(ids))
        else:
            def choose(room: Sequence[int]) -> int:
                return room[0]

        try:
            got = self.admission.offer(tokens, upstreams, choose, lambda t: self._granted.append((send, t)))
        except Rejected as e:
            end_s = send.at_s + _MIN_REJECT_S
            self._refuse(send, e, end_s)
            return end_s
        if isinstance(got, Waiter):
            self._waiting[send.index] = (send, got)
            return self._send_granted(send.at_s, send.index)
        return self._send(send, got, send.at_s)

    def _send(self, send: Send, ticket: Ticket, at_s: float) -> float | None:
        """``send`` on to its engine, arriving at ``at_s``; the end if the engine refused it
        (its room is given back then, as the gateway's when the upstream answers 400)."""
        self._tickets[send.index] = ticket
        if isinstance(self.engines, Replicas):
            end_s = self.engines.add(send, at_s, ticket.upstream)
        else:
            end_s = self.engines.add(send, at_s)
        if end_s is not None:
            heapq.heappush(self._releases, (at_s, send.index))
        return end_s

    def _send_granted(self, at_s: float, adding: int | None = None) -> float | None:
        """Send on every waiter let in, at ``at_s``; the end of send ``adding`` if the
        engine refused it (the others' ends are reported by ``step``)."""
        out = None
        while self._granted:
            send, ticket = self._granted.pop(0)
            del self._waiting[send.index]
            end_s = self._send(send, ticket, at_s)
            if end_s is not None and send.index == adding:
                out = end_s
            elif end_s is not None:
                heapq.heappush(self._ended, (end_s, send.index))
        return out

    def _refuse(self, send: Send, e: Rejected, end_s: float) -> None:
        record = self._first.record(send, self._first.prompt_ids(send.spec))
        record.status = 503
        record.error_kind = ErrorKind.HTTP_STATUS
        record.error = f"{REFUSED_PREFIX}{e}"
        record.ttfb_ns = record.end_ns = round(end_s * NS_PER_S)
        record.usage_source = "none"
        record.input_tokens = None
        record.server_timeline = {"gateway_queue_ms": round((end_s - send.at_s) * 1e3, 4), "gateway_refused": e.reason}
        self._first.finish(record)

    def has_work(self) -> bool:
        return bool(
            self._pending is not None or self.engines.has_work() or self._releases or self._ended
            or self.admission.queue_length
        )

    def _bookkeeping(self) -> tuple[float, float, float]:
        """When the next room is given back, the next wait times out, the next end not
        yet reported is due (inf: none)."""
        deadline_ns = self.admission.next_deadline_ns
        return (
            self._releases[0][0] if self._releases else math.inf,
            math.inf if deadline_ns is None else deadline_ns / NS_PER_S,
            self._ended[0][0] if self._ended else math.inf,
        )

    def step(self, now_s: float) -> Step:
        """The next thing that happens from ``now_s``: the engines' step ending, a
        request's room given back (reported with nothing ended; the waiters it lets in
        go at the next call, after the sends due by then have joined the queue), a wait
        timed out, or an end not yet reported."""
        self._at(now_s)
        self._release_due(now_s)
        if self._pending is None and self.engines.has_work():
            self._pending = self.engines.step(now_s)
        times = (self._pending[0] if self._pending is not None else math.inf, *self._bookkeeping())
        t = min(times)
        if math.isinf(t):  # (the last room given back: nothing more to do)
            return now_s, now_s, [], None
        self._at(t)
        if t == times[0]:
            assert self._pending is not None
            result, self._pending = self._pending, None
            for index in result[2]:
                heapq.heappush(self._releases, (result[1], index))  # the gateway sees the stream end
            return result
        if t == times[1]:
            return t, t, [], None
        if t == times[2]:
            deadline_ns = self.admission.next_deadline_ns
            assert deadline_ns is not None
            self.clock.advance_to_ns(max(self.clock.now_ns(), deadline_ns))  # (exactly: t is rounded)
            late = []
            for w in self.admission.expire():
                index = next(i for i, (_, waiter) in self._waiting.items() if waiter is w)
                self._refuse(self._waiting.pop(index)[0], self.admission.timed_out(), t)
                late.append(index)
            return t, t, late, None
        ended = []
        while self._ended and self._ended[0][0] <= t:
            ended.append(heapq.heappop(self._ended)[1])
        return t, t, ended, None

    def _release_due(self, now_s: float) -> None:
        while self._releases and self._releases[0][0] <= now_s:
            _, index = heapq.heappop(self._releases)
            self.admission.release(self._tickets.pop(index))
        self._send_granted(now_s)

    def interrupted(self, cause: InferlabError | None = None) -> Interrupted:
        """Cancel what waits in the queue and what is in flight; every record."""
        for send, _ in sorted(self._waiting.values(), key=lambda sw: sw[0].index):
            record = self._first.record(send, self._first.prompt_ids(send.spec))
            record.status = None
            record.error_kind = ErrorKind.CANCELLED
            record.error = "run interrupted" if cause is None else f"run stopped: {cause}"
            self._first.finish(record)
        self._waiting.clear()
        return self.engines.interrupted(cause)
