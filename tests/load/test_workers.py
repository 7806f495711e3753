"""The multi-process executor: worker processes send, the parent keeps the policy, so
the aggregate is exactly the requested load and every record comes back once."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest

from inferlab import BenchConfig, ClosedLoop, LoadConfig, OpenLoop, WorkloadConfig, bench_async
from inferlab.load.run import auto_workers
from inferlab.load.schedules import Replay
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer


@pytest.fixture(scope="module")
def sim() -> Iterator[EmbeddedServer]:
    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=4096, api_overhead_s=0.0))) as server:
        yield server


def peak_in_flight(records: list[RequestRecord]) -> int:
    events = sorted([(r.send_ns, 1) for r in records if r.send_ns is not None]
                    + [(r.end_ns, -1) for r in records if r.end_ns is not None])
    peak = level = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


async def test_open_loop_with_two_workers_is_exactly_the_arrival_process(sim: EmbeddedServer) -> None:
    schedule = OpenLoop(200.0)
    load = LoadConfig(schedule, num_requests=60, warmup=4, seed=3)
    cfg = BenchConfig(load, WorkloadConfig(input_tokens=50, output_tokens=3), workers=2)
    result = await bench_async(cfg, sim.url)
    assert [r.index for r in result.records] == list(range(64))  # each once, merged
    intended = [r.intended_send_ns for r in result.records]
    expected = [round(t * 1e9) for t in schedule.arrival_times_s(3, 64, None)]
    assert intended == expected  # the parent's schedule, to the ns
    assert result.summary.counts.completed == 60 and result.summary.counts.warmup == 4
    assert result.summary.config["resolved"]["workers"] == 2


@pytest.mark.parametrize("http_client", ["aiohttp", "httptools"])
async def test_a_closed_loop_over_workers_keeps_its_users(sim: EmbeddedServer, http_client: str) -> None:
    cfg = BenchConfig(
        LoadConfig(ClosedLoop(6), num_requests=30), WorkloadConfig(input_tokens=50, output_tokens=8), workers=2,
        http_client=http_client,
    )
    result = await bench_async(cfg, sim.url)
    assert result.summary.counts.completed == 30
    assert peak_in_flight(result.records) <= 6
    assert result.summary.config["resolved"]["client_stack"]["http"] == http_client


async def test_sessions_over_workers_keep_their_turns_in_order(sim: EmbeddedServer) -> None:
    wl = WorkloadConfig(sessions=4, turns=3, input_tokens=20, output_tokens=4)
    result = await bench_async(BenchConfig(LoadConfig(ClosedLoop(4), num_requests=12), wl, workers=2), sim.url)
    assert result.summary.counts.completed == 12
    for session in range(4):
        turns = sorted((r for r in result.records if r.session == session), key=lambda r: r.turn or 0)
        assert [r.turn for r in turns] == [0, 1, 2]
        assert all(a.end_ns is not None and b.send_ns is not None and a.end_ns <= b.send_ns
                   for a, b in itertools.pairwise(turns))  # each turn after the answer
        # the context grew: later turns send more tokens
        assert [r.input_tokens for r in turns] == sorted(r.input_tokens or 0 for r in turns)


async def test_a_stop_cancels_in_the_workers_and_keeps_every_record(sim: EmbeddedServer) -> None:
    stop = asyncio.Event()
    seen: list[RequestRecord] = []

    def on_record(r: RequestRecord) -> None:
        seen.append(r)
        if len(seen) == 5:
            stop.set()

    cfg = BenchConfig(LoadConfig(ClosedLoop(6), num_requests=200), WorkloadConfig(input_tokens=50, output_tokens=200), workers=2)
    result = await bench_async(cfg, sim.url, stop=stop, on_record=on_record)
    assert result.interrupted and result.summary.interrupted
    cancelled = [r for r in result.records if r.error_kind is ErrorKind.CANCELLED]
    assert cancelled and len(result.records) == len(seen) == len({r.index for r in result.records})
    assert result.summary.counts.completed + result.summary.counts.cancelled == len(result.records)


def test_auto_workers_follow_the_load_and_the_cores() -> None:
    assert auto_workers(LoadConfig(ClosedLoop(32), 10), cores=16) == 1
    assert auto_workers(LoadConfig(ClosedLoop(512), 10), cores=16) == 4
    assert auto_workers(LoadConfig(ClosedLoop(512), 10), cores=2) == 1  # one core is the parent's
    assert auto_workers(LoadConfig(OpenLoop(1000.0), 10), cores=16) == 5
    assert auto_workers(LoadConfig(Replay(max_concurrency=300)), cores=8) == 3


async def test_an_open_loop_over_two_workers_sends_nothing_early_and_each_request_once(sim: EmbeddedServer) -> None:
    # The parent keeps the schedule and the workers send: a worker stamping on its own
    # clock, or the parent handing a request over before its time, would show as a send
    # before the intended time; a resend, as one request more at the server.
    load = LoadConfig(OpenLoop(400.0), num_requests=120, seed=5)
    cfg = BenchConfig(load, WorkloadConfig(input_tokens=20, output_tokens=2), workers=2, preflight=False)
    before = sim.server.requests_ok
    result = await bench_async(cfg, sim.url)
    assert sim.server.requests_ok - before == 120  # what the server finished, each once
    assert sorted(r.index for r in result.records) == list(range(120))
    assert all(r.send_ns is not None and r.send_ns >= r.intended_send_ns for r in result.records)
    assert result.summary.queue_delay_ms is not None and result.summary.queue_delay_ms.min >= 0
