"""Drives a workload through a load schedule and the client; collects records.

The runner owns *when* (schedule), the client owns *how* (HTTP), the workload owns
*what*. Every request's intended send time is kept. The run is bounded by a request
count and/or a duration, and by each request's own timeout; setting ``stop`` ends it
early, cancelling requests in flight (recorded as ``cancelled``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inferlab._clock import NS_PER_S, Clock
from inferlab._errors import UsageError
from inferlab.load.schedules import ClosedLoop, LoadConfig, OpenLoop, Replay, replay_times_s
from inferlab.results.records import RequestRecord
from inferlab.workload.spec import RequestSpec, TimedSpec

if TYPE_CHECKING:  # (aiohttp loads with the first HTTP call: `sim run` makes none)
    import aiohttp

    from inferlab.client.http import Client, Endpoint


@dataclass
class RunResult:
    records: list[RequestRecord] = field(default_factory=list)
    interrupted: bool = False
    t0_ns: int = 0


OnRecord = Callable[[RequestRecord], None]


async def run_load(
    endpoint: Endpoint,
    load: LoadConfig,
    workload: Iterable[RequestSpec] | Sequence[TimedSpec],
    clock: Clock,
    *,
    on_record: OnRecord | None = None,
    stop: asyncio.Event | None = None,
) -> RunResult:
    """Send the workload; return every record (also those of failed requests).

    A ``Replay`` schedule needs a sequence of ``TimedSpec`` (a trace) and sends each at
    its arrival time; the other schedules take plain specs. ``UsageError`` otherwise."""
    import aiohttp

    from inferlab.client.http import Client, session_trace

    result = RunResult(t0_ns=clock.now_ns())
    timed = isinstance(workload, Sequence) and all(isinstance(t, TimedSpec) for t in workload[:1])
    if isinstance(load.schedule, Replay) != timed:
        raise UsageError("a trace (timed requests) goes with the replay schedule, and only with it")
    arrivals: list[float] = []
    if timed:
        trace = [t for t in workload if isinstance(t, TimedSpec)]
        arrivals = replay_times_s(trace, load)
        specs: Iterator[RequestSpec] = iter([t.spec for t in trace])
    else:
        specs = iter(w for w in workload if isinstance(w, RequestSpec))
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    async with aiohttp.ClientSession(
        connector=connector, trace_configs=[session_trace()], auto_decompress=True
    ) as session:
        await _warm_connections(session, endpoint, _parallelism(load))
        result.t0_ns = clock.now_ns()
        client = Client(endpoint, clock, session, result.t0_ns)
        tracker = _Tracker(client, result, on_record)
        if isinstance(load.schedule, ClosedLoop):
            body = _closed_loop(load.schedule, load, specs, tracker, clock)
        else:
            if isinstance(load.schedule, OpenLoop):
                n = None if load.num_requests is None else load.num_requests + load.warmup
                arrivals = load.schedule.arrival_times_s(load.seed, n, load.duration_s)
            body = _open_loop(arrivals, load.schedule.max_concurrency, load, specs, tracker, clock)
        main = asyncio.ensure_future(body)
        waiter = asyncio.ensure_future(stop.wait()) if stop is not None else None
        try:
            await asyncio.wait([main, *([waiter] if waiter else [])], return_when="FIRST_COMPLETED")
        finally:
            if not main.done():
                result.interrupted = True
                main.cancel()
                await tracker.cancel_all()
                with contextlib.suppress(asyncio.CancelledError):
                    await main
            if waiter is not None:
                waiter.cancel()
        if main.done() and not main.cancelled() and main.exception() is not None:
            raise main.exception()  # type: ignore[misc]  # a bug in the runner, not a request
    result.records.sort(key=lambda r: r.index)
    return result


def _parallelism(load: LoadConfig) -> int:
    s = load.schedule
    n = s.concurrency if isinstance(s, ClosedLoop) else (s.max_concurrency or 1)
    return min(n, load.num_requests or n, _MAX_WARM_CONNECTIONS)


_MAX_WARM_CONNECTIONS = 256


async def _warm_connections(session: aiohttp.ClientSession, endpoint: Endpoint, n: int) -> None:
    """Open ``n`` keep-alive connections before the clock starts (``GET /models`` in
    parallel), so TCP set-up is not charged to the first requests. Best effort: a server
    without that route still leaves its connections open, and any failure is ignored."""
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


class _Tracker:
    """Starts requests, remembers the ones in flight, records them as they end."""

    def __init__(self, client: Client, result: RunResult, on_record: OnRecord | None) -> None:
        self.client = client
        self.result = result
        self.on_record = on_record
        self.in_flight: set[asyncio.Task[None]] = set()

    async def one(self, record: RequestRecord, spec: RequestSpec) -> None:
        try:
            await self.client.send(spec, record)
        finally:
            self.result.records.append(record)
            if self.on_record is not None:
                self.on_record(record)

    def start(self, record: RequestRecord, spec: RequestSpec) -> asyncio.Task[None]:
        task = asyncio.ensure_future(self.one(record, spec))
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)
        return task

    async def cancel_all(self) -> None:
        tasks = list(self.in_flight)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _new_record(index: int, warmup: int, intended_ns: int) -> RequestRecord:
    return RequestRecord(index=index, warmup=index < warmup, intended_send_ns=intended_ns)


async def _closed_loop(
    schedule: ClosedLoop, load: LoadConfig, specs: Iterator[RequestSpec], tracker: _Tracker, clock: Clock
) -> None:
    total = None if load.num_requests is None else load.num_requests + load.warmup
    counter = itertools.count()
    deadline: list[int | None] = [None]  # set when the first measured request is sent

    async def user() -> None:
        while True:
            i = next(counter)
            if total is not None and i >= total:
                return
            now = clock.now_ns()
            if i == load.warmup and deadline[0] is None and load.duration_s is not None:
                deadline[0] = now + int(load.duration_s * NS_PER_S)
            d = deadline[0]
            if d is not None and now >= d:
                return
            spec = next(specs, None)
            if spec is None:
                return
            await tracker.start(_new_record(i, load.warmup, now - tracker.result.t0_ns), spec)

    await asyncio.gather(*(user() for _ in range(schedule.concurrency)))


async def _open_loop(
    arrivals: list[float],
    max_concurrency: int | None,
    load: LoadConfig,
    specs: Iterator[RequestSpec],
    tracker: _Tracker,
    clock: Clock,
) -> None:
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    t0 = tracker.result.t0_ns
    tasks: list[asyncio.Task[None]] = []
    for i, offset_s in enumerate(arrivals):
        intended = round(offset_s * NS_PER_S)
        await clock.sleep_until_ns(t0 + intended)
        spec = next(specs, None)
        if spec is None:
            break
        if limit is not None:
            await limit.acquire()
        task = tracker.start(_new_record(i, load.warmup, intended), spec)
        if limit is not None:
            task.add_done_callback(lambda _t: limit.release())
        tasks.append(task)
    await asyncio.gather(*tasks)
