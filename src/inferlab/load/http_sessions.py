"""Multi-turn sessions over HTTP (``bench --sessions``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from inferlab._clock import NS_PER_S, Clock
from inferlab.load.http import RunResult
from inferlab.load.schedules import LoadConfig, OpenLoop
from inferlab.results.records import RequestRecord
from inferlab.workload.sessions import SessionWorkload

if TYPE_CHECKING:  # (aiohttp loads with the first HTTP call: `sim run` makes none)
    from inferlab.client.http import Endpoint


OnRecord = Callable[[RequestRecord], None]


async def run_sessions(
    endpoint: Endpoint, load: LoadConfig, workload: SessionWorkload, clock: Clock,
    *, users: int, on_record: OnRecord | None = None, stop: asyncio.Event | None = None,
) -> RunResult:
    """Run the sessions against ``endpoint``: ``users`` closed-loop users, or sessions
    arriving at an ``OpenLoop`` schedule's times. ``load.duration_s`` stops new turns."""
    import aiohttp

    from inferlab.client.http import Client

    result = RunResult()
    cfg = workload.config
    counter = iter(range(1 << 62))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        result.t0_ns = t0 = clock.now_ns()
        client = Client(endpoint, clock, http, t0)
        deadline = None if load.duration_s is None else t0 + int(load.duration_s * NS_PER_S)

        async def converse(index: int, start_ns: int) -> None:
            s = workload.session(index)
            due = start_ns
            while not s.done and (deadline is None or due < deadline):
                await clock.sleep_until_ns(due)
                spec = s.next_spec()
                record = RequestRecord(index=next(counter), intended_send_ns=due - t0)
                text: list[str] = []
                try:
                    await client.send(spec, record, text)
                finally:
                    result.records.append(record)
                    if on_record is not None:
                        on_record(record)
                if not record.ok:
                    return  # a failed turn ends its session: its context is unknown
                s.answer("".join(text), record.output_tokens or len(record.content_ns))
                due = clock.now_ns() + int(cfg.think_time_s * NS_PER_S)

        body: asyncio.Future[list[None]]
        if isinstance(load.schedule, OpenLoop):
            times = load.schedule.arrival_times_s(load.seed, cfg.sessions, None)
            body = asyncio.gather(*(converse(i, t0 + int(t * NS_PER_S)) for i, t in enumerate(times)))
        else:
            queue = iter(range(cfg.sessions))

            async def user() -> None:
                for i in queue:
                    await converse(i, clock.now_ns())

            body = asyncio.gather(*(user() for _ in range(min(users, cfg.sessions))))
        main: asyncio.Future[Any] = asyncio.ensure_future(body)
        waiter: asyncio.Future[Any] | None = asyncio.ensure_future(stop.wait()) if stop is not None else None
        await asyncio.wait([main, *([waiter] if waiter else [])], return_when="FIRST_COMPLETED")
        if not main.done():
            result.interrupted = True
            main.cancel()
            await asyncio.gather(main, return_exceptions=True)
        if waiter is not None:
            waiter.cancel()
    result.records.sort(key=lambda r: r.index)
    return result
