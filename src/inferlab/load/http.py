"""The asyncio + HTTP executor: a load policy against a real endpoint, on the wall clock.

The policy decides what is sent when (``load.policy``); the client sends and records
(``client.http``). One dispatcher task asks the policy for the sends due now, hands each
to a *launcher*, and sleeps until the policy's next send or until a request ends (which
may release the next one: a closed-loop user, a freed concurrency slot, a session's next
turn). The launcher here runs each request as a task of this process; ``load.workers``
hands them to worker processes instead, under the same dispatcher. Every request keeps
its intended send time, so a client falling behind shows as queue delay. Setting
``stop`` ends the run early, cancelling requests in flight (recorded as ``cancelled``);
so does a workload that cannot make its next request, and a server that stopped
answering (``ServerGoneError``), both ``Outcome.cause``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from inferlab._clock import NS_PER_S, Clock
from inferlab._errors import InferlabError
from inferlab.load.monitor import LoopMonitor
from inferlab.load.policy import Answer, Policy, Send
from inferlab.results.clientload import ProcessLoad
from inferlab.results.records import RequestRecord, unanswered

if TYPE_CHECKING:  # (aiohttp loads with the first HTTP call: `sim run` makes none)
    import aiohttp

    from inferlab.client.http import Endpoint, Sender

#: Keep-alive connections opened before the clock starts, at most.
MAX_WARM_CONNECTIONS = 256
#: The server has stopped answering when this many requests in a row (and at least
#: ``GONE_PER_SLOT`` times the most that were in flight at once: every user or slot
#: failed that often) failed for want of a connection, with no answer in between, over
#: ``GONE_S`` or more, or ``GONE_CAP_PER_SLOT`` times the most in flight at once of them,
#: or up to the run's end: see ``ServerGoneError``. A second: long enough that a blip (a
#: listen queue full for a moment) or a restart stops no run whose failures come slower
#: than ``GONE_CAP_PER_SLOT`` a slot a second, short enough that a dead server adds at
#: most about a second of failures to the records. The count: a closed-loop user re-sends
#: as soon as its request fails (as vLLM's ``bench serve``, which has no retry), and a
#: refused connection on loopback fails in well under a millisecond, so a second of them
#: was thousands a user; 50 a slot bounds that storm in count too (give or take the
#: requests in flight as the count is reached, whose ends can come together).
GONE_REQUESTS = 20
GONE_PER_SLOT = 3
GONE_S = 1.0
GONE_CAP_PER_SLOT = 50


class ServerGoneError(InferlabError):
    """The server stopped answering during the run: no connection could be had (refused,
    reset, closed before any answer) for ``GONE_REQUESTS`` requests in a row, and as many
    as ``GONE_PER_SLOT`` for each that was in flight at once, with no answer between
    them, for ``GONE_S`` (or ``GONE_CAP_PER_SLOT`` as many for each in flight at once,
    whichever comes first) or up to the run's end. A restart of a second or a few refused
    connections is no reason to stop; a server that is gone is, before it turns the
    rest of the run into instant failures. The run stops there (the executor's
    ``Outcome.cause``); every record is kept."""

    def __init__(self, reason: str, completed: int, records: str | None = None) -> None:
        where = f"; its records are in {records}" if records else ""
        super().__init__(
            f"the server stopped answering ({reason}) after {completed:,} completed requests; the run stopped{where}")
        self.reason = reason
        self.completed = completed


class GoneWatch:
    """``ServerGoneError``'s rule, fed each request's record as it ends: the failures for
    want of a connection since the last answer, when the first of them ended (seconds on
    the caller's clock), why; ``peak``, the most in flight at once (the caller keeps it);
    the completed requests. An answer ends the count only if its request was sent after
    the first of those failures was: one sent before (a stream the server finishes as it
    shuts down, ending after the refusals began) says nothing of the server now."""

    def __init__(self) -> None:
        self.unanswered = 0
        self.since_s = 0.0
        self.first_sent_ns: int | None = None  # (the earliest send of the failures counted)
        self.why = ""
        self.peak = 0
        self.completed = 0

    def note(self, record: RequestRecord, now_s: float) -> None:
        """Count ``record`` towards (or against) the server having stopped answering."""
        why = unanswered(record)
        sent = record.send_ns if record.send_ns is not None else record.intended_send_ns
        if why is not None:
            if not self.unanswered:
                self.since_s, self.first_sent_ns = now_s, sent
            elif sent is not None and self.first_sent_ns is not None:
                self.first_sent_ns = min(self.first_sent_ns, sent)
            self.unanswered += 1
            self.why = why
        elif record.status is not None and not (  # (it answered: a timeout or a cancel says nothing)
            sent is not None and self.first_sent_ns is not None and sent < self.first_sent_ns
        ):
            self.unanswered = 0
        if record.ok and not record.warmup:
            self.completed += 1

    def gone(self, now_s: float, at_end: bool) -> bool:
        """Whether the server has stopped answering (``ServerGoneError``'s rule)."""
        if self.unanswered < max(GONE_REQUESTS, GONE_PER_SLOT * self.peak):
            return False
        # (at the end, a run in which nothing completed is "all failed": ``run``'s own rule)
        return ((at_end and self.completed > 0) or now_s - self.since_s >= GONE_S
                or self.unanswered >= GONE_CAP_PER_SLOT * max(1, self.peak))

    def error(self) -> ServerGoneError:
        """The error that stops the run, once ``gone``."""
        return ServerGoneError(self.why, self.completed)


OnRecord = Callable[[RequestRecord], None]


@dataclass
class Outcome:
    """What an executor ran: every record (failed and cancelled ones too), sorted by
    index; ``interrupted`` when it ended early, ``cause`` the workload's error when that
    was why; ``t0_ns`` the clock time the records' times are relative to."""

    records: list[RequestRecord] = field(default_factory=list)
    interrupted: bool = False
    cause: InferlabError | None = None
    t0_ns: int = 0
    # each sending process's loop lag and CPU (``load.monitor``); empty in virtual time
    client: list[ProcessLoad] = field(default_factory=list)
    # what the executor saw that the summary must say (a load worker process that died)
    warnings: list[str] = field(default_factory=list)


class Launcher(Protocol):
    """Sends requests for a ``Dispatcher``: each ``launch`` ends in exactly one call of
    the dispatcher's ``finished`` (or ``cancelled``, once ``cancel_all`` runs)."""

    def launch(self, send: Send, record: RequestRecord, text: list[str] | None) -> None: ...

    async def cancel_all(self) -> None: ...


async def run_http(
    endpoint: Endpoint,
    policy: Policy,
    clock: Clock,
    *,
    warm_connections: int = 1,
    on_record: OnRecord | None = None,
    stop: asyncio.Event | None = None,
    http_client: str = "aiohttp",
) -> Outcome:
    """Run ``policy`` against ``endpoint`` from this process; return every record.
    ``warm_connections`` keep-alive connections are opened first (capped at
    ``MAX_WARM_CONNECTIONS``), so TCP set-up is not charged to the first requests.
    ``http_client``: the HTTP stack (resolved: ``resolve_http_client``)."""
    result = Outcome(t0_ns=clock.now_ns())
    async with open_client(endpoint, clock, http_client, min(warm_connections, MAX_WARM_CONNECTIONS)) as client:
        result.t0_ns = client.t0_ns = clock.now_ns()
        dispatcher = Dispatcher(policy, clock, result, on_record)
        launcher = _Tasks(client, dispatcher)
        monitor = LoopMonitor(clock)
        monitor.start()
        try:
            await dispatch(dispatcher, launcher, stop)
        finally:
            result.client.append(await monitor.stop())
    return result


#: Bytes a response may buffer before aiohttp stops reading its socket (its default is
#: 64 KiB): a burst of chunks is taken in as few reads as the socket gives.
READ_BUFFER_BYTES = 1 << 20


@contextlib.asynccontextmanager
async def open_client(endpoint: Endpoint, clock: Clock, http_client: str, warm: int) -> AsyncIterator[Sender]:
    """A client for ``endpoint`` on the stack ``http_client`` (resolved), over a pool of
    its own with ``warm`` connections opened; the caller sets its ``t0_ns``."""
    if http_client == "httptools":
        from inferlab.client.httptools_http import HttptoolsClient, Pool

        async with Pool(endpoint.base_url) as pool:
            await pool.warm(warm)
            yield HttptoolsClient(endpoint, clock, pool, 0)
        return
    from inferlab.client.http import Client

    async with client_session() as session:
        await warm_up(session, endpoint, warm)
        yield Client(endpoint, clock, session, 0)


def client_session() -> aiohttp.ClientSession:
    """The aiohttp session every executor sends with: no connection limit (the load
    policy bounds concurrency, and the pool keeps as many keep-alive connections as
    were in flight at once), the client's header-sent stamp, decompression, large
    read buffers."""
    import aiohttp

    from inferlab.client.http import session_trace

    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    return aiohttp.ClientSession(
        connector=connector, trace_configs=[session_trace()], auto_decompress=True,
        read_bufsize=READ_BUFFER_BYTES,
    )


async def dispatch(dispatcher: Dispatcher, launcher: Launcher, stop: asyncio.Event | None) -> None:
    """Run ``dispatcher`` with ``launcher`` until the policy is done or ``stop`` is set;
    on a stop (or a workload error) cancel what is in flight. Records end up in the
    dispatcher's ``result``, sorted by index."""
    dispatcher.launcher = launcher
    result = dispatcher.result
    main = asyncio.ensure_future(dispatcher.run())
    waiter = asyncio.ensure_future(stop.wait()) if stop is not None else None
    try:
        await asyncio.wait([main, *([waiter] if waiter else [])], return_when="FIRST_COMPLETED")
    finally:
        if not main.done():
            result.interrupted = True
            main.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await main
        if waiter is not None:
            waiter.cancel()
        error = main.exception() if main.done() and not main.cancelled() else None
        if isinstance(error, InferlabError):  # the workload could not make a request
            result.interrupted, result.cause = True, error
        if result.interrupted:
            await launcher.cancel_all()
    if error is not None and result.cause is None:
        raise error  # a bug in the executor, not a request
    result.records.sort(key=lambda r: r.index)


async def warm_up(session: aiohttp.ClientSession, endpoint: Endpoint, n: int) -> None:
    """Open ``n`` keep-alive connections (``GET /models`` in parallel). Best effort: a
    server without that route still leaves its connections open, and any failure is
    ignored."""
    import aiohttp

    async def one() -> None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(
                endpoint.base_url + "/models",
                headers=endpoint.request_headers(),
                timeout=aiohttp.ClientTimeout(total=10),
            ) as resp:
                await resp.read()

    await asyncio.gather(*(one() for _ in range(n)))


class Dispatcher:
    """Starts the policy's sends as they fall due (through its ``launcher``) and reports
    their ends back to it. Times are relative to ``result.t0_ns`` on ``clock``."""

    def __init__(self, policy: Policy, clock: Clock, result: Outcome, on_record: OnRecord | None) -> None:
        self.policy = policy
        self.clock = clock
        self.result = result
        self.on_record = on_record
        self.launcher: Launcher | None = None
        self.in_flight = 0
        self._ended = asyncio.Event()  # a request ended since the dispatcher last looked
        self._error: BaseException | None = None  # a launcher's own failure (a bug)
        self.watch = GoneWatch()  # (``ServerGoneError``'s rule)

    def _now_s(self) -> float:
        return (self.clock.now_ns() - self.result.t0_ns) / NS_PER_S

    async def run(self) -> None:
        policy = self.policy
        now_s = max(self._now_s(), policy.start_s())
        while True:
            if self._error is not None:
                raise self._error
            if self.watch.gone(self._now_s(), at_end=False):  # (before sending more to it)
                raise self.watch.error()
            for send in policy.due(now_s):
                self._start(send)
            next_s = policy.next_s()
            if next_s is None and not self.in_flight:
                if self.watch.gone(self._now_s(), at_end=True):
                    raise self.watch.error()
                return
            self._ended.clear()  # (ends before this line were seen by ``due`` above)
            if next_s is None:
                await self._ended.wait()
                now_s = self._now_s()
            elif await self._sleep_until(next_s):
                now_s = max(self._now_s(), next_s)  # (what the ns clock rounded down is due)
            else:
                now_s = self._now_s()

    async def _sleep_until(self, t_s: float) -> bool:
        """Sleep until ``t_s``, or until a request ends first if any is in flight (an end
        may release an earlier send). True when ``t_s`` was reached."""
        sleep = self.clock.sleep_until_ns(self.result.t0_ns + round(t_s * NS_PER_S))
        if not self.in_flight:
            await sleep
            return True
        sleeper = asyncio.ensure_future(sleep)
        ended = asyncio.ensure_future(self._ended.wait())
        try:
            await asyncio.wait([sleeper, ended], return_when="FIRST_COMPLETED")
        finally:
            sleeper.cancel()
            ended.cancel()
        return sleeper.done() and not sleeper.cancelled()

    def _start(self, send: Send) -> None:
        assert self.launcher is not None
        record = RequestRecord(
            index=send.index, warmup=send.warmup, intended_send_ns=round(send.intended_s * NS_PER_S),
            user=send.user,
        )
        self.in_flight += 1
        self.watch.peak = max(self.watch.peak, self.in_flight)
        self.launcher.launch(send, record, [] if self.policy.wants_answers else None)

    def finished(self, send: Send, record: RequestRecord, text: list[str] | None) -> None:
        """``send``'s request ended (``record`` filled, ``text`` its reply if asked for)."""
        self.cancelled(record)
        self.watch.note(record, self._now_s())
        answer: Answer | None = None
        if text is not None and record.ok:
            answer = "".join(text), record.output_tokens or len(record.content_ns)
        self.in_flight -= 1
        self.policy.ended(send.index, self._now_s(), answer)
        self._ended.set()

    def fail(self, error: BaseException) -> None:
        """A launcher broke (not a request: a bug): the run stops with ``error``."""
        self._error = error
        self._ended.set()

    def cancelled(self, record: RequestRecord) -> None:
        """Keep ``record`` (also one cancelled in flight) and pass it on."""
        self.result.records.append(record)
        if self.on_record is not None:
            self.on_record(record)


class _Tasks:
    """Runs each request as a task of this process."""

    def __init__(self, client: Sender, dispatcher: Dispatcher) -> None:
        self.client = client
        self.dispatcher = dispatcher
        self.tasks: set[asyncio.Task[None]] = set()

    def launch(self, send: Send, record: RequestRecord, text: list[str] | None) -> None:
        task = asyncio.ensure_future(self._one(send, record, text))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _one(self, send: Send, record: RequestRecord, text: list[str] | None) -> None:
        try:
            await self.client.send(send.spec, record, text)
        except asyncio.CancelledError:  # (the record says cancelled)
            self.dispatcher.cancelled(record)
            raise
        except Exception as e:  # the client never raises for a request: this is a bug
            self.dispatcher.fail(e)
            return
        self.dispatcher.finished(send, record, text)

    async def cancel_all(self) -> None:
        tasks = list(self.tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
