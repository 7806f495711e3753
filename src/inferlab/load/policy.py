"""The load policy: which request is sent when, written once for every executor.

A policy is plain bookkeeping over time in seconds from the run's start. An executor
drives it: it asks ``due(now_s)`` for the sends that fall due by ``now_s`` and sends each
one; it reports every request's end with ``ended`` (by the send's index; ``answer`` is the reply's text and
token count for a request that completed, ``None`` for one that failed); when nothing is
in flight it jumps (virtual time) or sleeps (wall time) to ``next_s()``. The HTTP
executor (``load.http``) and the virtual-time executor (``load.virtual``) run the same
policies, so ``bench`` and ``sim run`` send the same requests at the same moments.

- ``ClosedLoopPolicy``: N users, each sending its next request when its previous one
  ends; ``duration_s`` counts from the first measured send.
- ``OpenLoopPolicy``: requests at given arrival times (a schedule's draws, a trace's
  timestamps; a schedule's ``duration_s`` counts from the first measured arrival, after
  the warm-ups, as a closed loop's does); ``max_concurrency`` holds a request back until a slot frees, so the hold
  shows as queue delay.
- ``UserReplayPolicy``: a recorded closed loop replayed as it ran: each user sends its
  recorded requests in order, the first at its recorded time, each next one when the
  previous one ends.
- ``SessionPolicy``: multi-turn sessions; each turn is sent ``think_time_s`` after the
  previous answer, closed loop (users running sessions back to back) or with sessions
  arriving at given times.

Specs are drawn from the workload as they are sent, never ahead of their send: a
dataset that runs out ends the run there, and an ``InferlabError`` raised while drawing
(a prompt the tokenizer cannot make) reaches the executor from ``due``.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from inferlab._errors import UsageError
from inferlab.load.schedules import ClosedLoop, LoadConfig, OpenLoop, Replay, replay_times_s
from inferlab.workload.sessions import Session, SessionWorkload
from inferlab.workload.spec import RequestSpec, Trace

#: A completed request's reply: its text and its number of output tokens.
Answer = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Send:
    """One request to send. ``index`` counts sends from 0 (warm-up ones first);
    ``intended_s`` is when the schedule meant it to go and ``at_s`` when it may go
    (later when a concurrency cap held it back), both in seconds from the run's start.
    ``user``: the closed-loop user sending it (None: not a closed loop)."""

    index: int
    spec: RequestSpec
    intended_s: float
    at_s: float
    warmup: bool = False
    user: int | None = None


class Policy(Protocol):
    """What every executor drives (see the module doc)."""

    #: whether ``ended`` wants each completed request's reply text (sessions do)
    wants_answers: bool

    def start_s(self) -> float:
        """Where the run's time starts (virtual time jumps to the first arrival)."""
        ...

    def due(self, now_s: float) -> Iterator[Send]:
        """The sends due by ``now_s``, in order. ``ended`` may be called between two of
        them (a request rejected at once); the next one sees its effect."""
        ...

    def ended(self, index: int, end_s: float, answer: Answer | None) -> None:
        """The request of send ``index`` ended at ``end_s``: completed with ``answer``,
        or failed."""
        ...

    def next_s(self) -> float | None:
        """When the next send falls due if no request ends first; ``None`` when only an
        end (or nothing) can release one."""
        ...


class ClosedLoopPolicy:
    """``users`` users, each sending its next request when its previous one ends.

    At most ``total`` sends (None: no limit); the first ``warmup`` are warm-up; no send
    starts ``duration_s`` or more after the first measured one. A spec iterator that runs
    out ends the run. Every user sends its first request at ``start_s`` (0: the run's
    start; later for a run that follows another on one engine in virtual time)."""

    wants_answers = False

    def __init__(
        self, users: int, specs: Iterator[RequestSpec], *, total: int | None, warmup: int, duration_s: float | None,
        start_s: float = 0.0,
    ) -> None:
        self._start_s = start_s
        self._ready = [(start_s, u) for u in range(users)]  # (when, user): each idle user's next send (a heap)
        self._users: dict[int, int] = {}  # send index -> its user, while in flight
        self._specs = specs
        self._total = total
        self._warmup = warmup
        self._duration_s = duration_s
        self._sent = 0
        self._first_measured_s: float | None = None

    def start_s(self) -> float:
        return self._start_s

    def due(self, now_s: float) -> Iterator[Send]:
        ready, total = self._ready, self._total
        while ready and ready[0][0] <= now_s and (total is None or self._sent < total):
            first = self._first_measured_s
            if self._duration_s is not None and first is not None and now_s >= first + self._duration_s:
                ready.clear()
                return
            spec = next(self._specs, None)
            if spec is None:  # a dataset sampled without replacement ran out
                ready.clear()
                return
            t, user = heapq.heappop(ready)
            i = self._sent
            if i == self._warmup:
                self._first_measured_s = t
            self._sent = i + 1
            self._users[i] = user
            yield Send(i, spec, t, t, i < self._warmup, user)

    def ended(self, index: int, end_s: float, answer: Answer | None) -> None:
        heapq.heappush(self._ready, (end_s, self._users.pop(index)))  # the user sends its next request

    def next_s(self) -> float | None:
        if not self._ready or (self._total is not None and self._sent >= self._total):
            return None
        return self._ready[0][0]


class UserReplayPolicy:
    """A recorded closed loop, replayed as it ran: ``requests`` are ``(arrival_s, user,
    spec)`` in recorded order; each user sends its own in that order, the first at its
    recorded time, each next one when its previous one ends (so a slower or faster
    server changes the sends as it changed them in the run). The first ``warmup``
    requests of the trace are warm-up. ``trace_positions[i]`` is the position in
    ``requests`` of send ``i`` (sends need not go in recorded order)."""

    wants_answers = False

    def __init__(self, requests: Sequence[tuple[float, int, RequestSpec]], *, warmup: int) -> None:
        self._queues: dict[int, list[tuple[float, RequestSpec, int]]] = {}
        for pos, (t, user, spec) in enumerate(requests):
            self._queues.setdefault(user, []).append((t, spec, pos))
        self.trace_positions: list[int] = []
        for q in self._queues.values():
            q.reverse()  # (popped from the end)
        # (when, user): each idle user's next send, from its first recorded time
        self._ready = [(q[-1][0], u) for u, q in self._queues.items()]
        heapq.heapify(self._ready)
        self._users: dict[int, int] = {}  # send index -> its user, while in flight
        self._warmup = warmup
        self._sent = 0

    def start_s(self) -> float:
        return self._ready[0][0] if self._ready else 0.0

    def due(self, now_s: float) -> Iterator[Send]:
        ready = self._ready
        while ready and ready[0][0] <= now_s:
            t, user = heapq.heappop(ready)
            _, spec, pos = self._queues[user].pop()
            self.trace_positions.append(pos)
            i = self._sent
            self._sent = i + 1
            self._users[i] = user
            yield Send(i, spec, t, t, pos < self._warmup, user)  # (a recorded warm-up is one again)

    def ended(self, index: int, end_s: float, answer: Answer | None) -> None:
        user = self._users.pop(index)
        if self._queues[user]:
            heapq.heappush(self._ready, (end_s, user))

    def next_s(self) -> float | None:
        return self._ready[0][0] if self._ready else None


class OpenLoopPolicy:
    """Each ``(arrival_s, spec)`` of ``arrivals`` (in time order) sent at its arrival, or,
    with ``max_concurrency``, once one of that many slots is free. The first ``warmup``
    are warm-up."""

    wants_answers = False

    def __init__(
        self, arrivals: Iterator[tuple[float, RequestSpec]], *, max_concurrency: int | None, warmup: int
    ) -> None:
        self._arrivals = arrivals
        self._head: tuple[float, RequestSpec] | None = None  # the next request to send
        self._started = False
        self._taken = False  # the head was sent: the next one is drawn before use
        # with a cap: when each free slot became free (a heap)
        self._free: list[float] | None = [0.0] * max_concurrency if max_concurrency else None
        self._warmup = warmup
        self._sent = 0

    def start_s(self) -> float:
        head = self._peek()
        return head[0] if head is not None else 0.0

    def _peek(self) -> tuple[float, RequestSpec] | None:
        """The next request to send. Each spec is drawn once the one before it was sent,
        never earlier (a dataset may run out, a prompt may fail to build, right there)."""
        if not self._started or self._taken:
            self._started, self._taken = True, False
            self._head = next(self._arrivals, None)
        return self._head

    def due(self, now_s: float) -> Iterator[Send]:
        free = self._free
        while (head := self._peek()) is not None and head[0] <= now_s and (free is None or free):
            arrival_s, spec = head
            at_s = arrival_s if free is None else max(arrival_s, heapq.heappop(free))
            i = self._sent
            self._sent = i + 1
            self._taken = True
            yield Send(i, spec, arrival_s, at_s, i < self._warmup)

    def ended(self, index: int, end_s: float, answer: Answer | None) -> None:
        if self._free is not None:
            heapq.heappush(self._free, end_s)

    def next_s(self) -> float | None:
        head = self._peek()
        if head is None or (self._free is not None and not self._free):
            return None  # (every slot busy: only an end can release the next send)
        return head[0]


class SessionPolicy:
    """Multi-turn sessions: ``users`` users running sessions back to back (closed loop),
    or sessions starting at ``arrivals_s``. A session's next turn goes ``think_time_s``
    after its previous answer; a failed turn ends its session (its context is unknown);
    no turn starts at or after ``duration_s``; at most ``total`` turns are sent (None: no
    limit), the first ``warmup`` of them warm-up."""

    wants_answers = True

    def __init__(
        self,
        workload: SessionWorkload,
        *,
        users: int | None = None,
        arrivals_s: Sequence[float] | None = None,
        duration_s: float | None = None,
        total: int | None = None,
        warmup: int = 0,
    ) -> None:
        if (users is None) == (arrivals_s is None):
            raise ValueError("give users (closed loop) or arrivals_s (open loop)")
        self._workload = workload
        self._think_s = workload.config.think_time_s
        self._duration_s = duration_s
        self._total = total
        self._warmup = warmup
        self._closed = users is not None
        self._seq = itertools.count()  # tie-break between sessions due at the same time
        self._ready: list[tuple[float, int, Session]] = []  # (send time, tie-break, session)
        self._waiting = iter(range(workload.config.sessions))
        if arrivals_s is not None:
            for i, t in enumerate(arrivals_s):
                heapq.heappush(self._ready, (t, next(self._seq), workload.session(i)))
        else:
            assert users is not None
            for i in itertools.islice(self._waiting, users):
                heapq.heappush(self._ready, (0.0, next(self._seq), workload.session(i)))
        self._sent = 0
        self._in_flight: dict[int, Session] = {}
        self._cut: dict[int, int] = {}  # session -> its turns not sent after a failed one

    def start_s(self) -> float:
        return 0.0

    def warnings(self) -> list[str]:
        """The summary's word on turns never sent because their session ended at a
        failed turn (a session cannot go on without that turn's answer)."""
        if not self._cut:
            return []
        cut = sum(self._cut.values())
        cfg = self._workload.config
        ids = sorted(self._cut)
        named = ", ".join(map(str, ids[:10])) + (f" and {len(ids) - 10:,} more" if len(ids) > 10 else "")
        return [f"{cut:,} turn{'s' * (cut != 1)} not sent: their session ended at a failed turn (session"
                f"{'s' * (len(ids) != 1)} {named}); {cfg.sessions:,} session{'s' * (cfg.sessions != 1)} × {cfg.turns:,} turns "
                f"planned, "
                f"{self._sent:,} turns sent"]

    def due(self, now_s: float) -> Iterator[Send]:
        ready, total = self._ready, self._total
        while ready and ready[0][0] <= now_s and (total is None or self._sent < total):
            t, _, s = heapq.heappop(ready)
            if self._duration_s is not None and t >= self._duration_s:
                continue
            spec = s.next_spec()
            i = self._sent
            self._sent = i + 1
            self._in_flight[i] = s
            yield Send(i, spec, t, t, i < self._warmup)

    def ended(self, index: int, end_s: float, answer: Answer | None) -> None:
        s = self._in_flight.pop(index)
        if answer is None:  # the session ends with its failed turn (said in ``warnings``)
            left = self._workload.config.turns - s.turn - 1
            if left > 0:
                self._cut[s.index] = left
            self._next_session(end_s)
            return
        s.answer(*answer)
        if not s.done:
            heapq.heappush(self._ready, (end_s + self._think_s, next(self._seq), s))
        else:
            self._next_session(end_s)

    def _next_session(self, t: float) -> None:
        if self._closed:
            nxt = next(self._waiting, None)
            if nxt is not None:
                heapq.heappush(self._ready, (t, next(self._seq), self._workload.session(nxt)))

    def next_s(self) -> float | None:
        if not self._ready or (self._total is not None and self._sent >= self._total):
            return None
        return self._ready[0][0]


def make_policy(load: LoadConfig, workload: Iterator[RequestSpec] | Trace | SessionWorkload) -> Policy:
    """The policy for a load and a workload as ``WorkloadConfig.build`` makes it: a trace
    (``Trace``) is replayed at its timestamps within the load's count
    and duration; sessions run closed loop with the schedule's users, or arrive at an
    open-loop schedule's times; other workloads follow the schedule."""
    s = load.schedule
    total = None if load.num_requests is None else load.num_requests + load.warmup
    if isinstance(workload, SessionWorkload):
        if isinstance(s, OpenLoop):
            if s.max_concurrency is not None:  # (the sessions would not heed it)
                raise UsageError(
                    "--max-concurrency does not cap sessions arriving at --rate: drop it, or run the sessions "
                    "closed loop with -c N (N users)"
                )
            times = s.arrival_times_s(load.seed, workload.config.sessions, None)
            return SessionPolicy(workload, arrivals_s=times, duration_s=load.duration_s, total=total, warmup=load.warmup)
        users = s.concurrency if isinstance(s, ClosedLoop) else 1
        return SessionPolicy(workload, users=users, duration_s=load.duration_s, total=total, warmup=load.warmup)
    if isinstance(s, Replay) != isinstance(workload, Trace):
        raise UsageError("a trace (timed requests) goes with the replay schedule, and only with it")
    if isinstance(workload, Trace):
        # a run's requests.jsonl marks its warm-ups (first in time): warm-ups again, and
        # ``-n``/``--warmup`` count on from them
        recorded = sum(t.warmup for t in workload.requests)
        if recorded:
            load = dataclasses.replace(load, warmup=load.warmup + recorded)
        held = len(workload.requests)
        if load.num_requests is None and load.warmup >= held:  # (every request a warm-up: a run of nothing)
            most = held - 1 - recorded
            raise UsageError(
                f"the trace holds {held} requests and {load.warmup} are warm-ups"
                + (f" ({recorded} recorded as warm-ups in it)" if recorded else "")
                + ": nothing is left to measure" + (f"; give --warmup {most} or fewer" if most >= 0 else "")
            )
        if load.num_requests is not None and load.num_requests + load.warmup > held:
            # (the replay would send what the trace holds, and config.json say -n)
            most = held - load.warmup
            raise UsageError(
                f"-n {load.num_requests} asks for more requests than the trace holds ({held}"
                + (f", {load.warmup} of them warm-ups" if load.warmup else "")
                + (f"): give -n {most} or fewer, or leave -n out" if most >= 1 else "): nothing is left to measure")
            )
        times = replay_times_s(workload.requests, load)
        cap = None if isinstance(s, ClosedLoop) else s.max_concurrency
        senders = [t.user for t in workload.requests[: len(times)]]
        if times and all(u is not None for u in senders):  # a recorded closed loop
            if cap is not None:
                raise UsageError(
                    "the trace is a closed loop (its requests.jsonl names each request's user): it replays "
                    "with its own users; --max-concurrency does not apply"
                )
            if workload.speedup != 1.0:
                raise UsageError(
                    "the trace is a closed loop (its requests.jsonl names each request's user): each user sends "
                    "when its previous request ends, so --speedup would change no send time; drop it"
                )
            return UserReplayPolicy(
                [(t, u, ts.spec) for t, u, ts in zip(times, senders, workload.requests, strict=False) if u is not None],
                warmup=load.warmup,
            )
        timed = sorted(zip(times, (t.spec for t in workload), strict=False), key=_first)
        return OpenLoopPolicy(iter(timed), max_concurrency=cap, warmup=load.warmup)
    if isinstance(s, ClosedLoop):
        return ClosedLoopPolicy(s.concurrency, workload, total=total, warmup=load.warmup, duration_s=load.duration_s)
    if isinstance(s, OpenLoop):
        window = load.duration_s
        if window is not None and load.warmup:
            # the warm-ups before the measured window, as a closed loop runs them: its
            # duration counts from the first measured arrival (the draws' order is fixed)
            window += s.arrival_times_s(load.seed, load.warmup + 1, None)[-1]
        times = s.arrival_times_s(load.seed, total, window)  # in order
        return OpenLoopPolicy(zip(times, workload, strict=False), max_concurrency=s.max_concurrency, warmup=load.warmup)
    raise AssertionError(f"unknown schedule {s!r}")


def _first(arrival: tuple[float, RequestSpec]) -> float:
    return arrival[0]
