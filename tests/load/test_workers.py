"""The multi-process executor: worker processes send, the parent keeps the policy, so
the aggregate is exactly the requested load and every record comes back once."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferlab import BenchConfig, ClosedLoop, LoadConfig, OpenLoop, WorkloadConfig, bench_async
from inferlab._cores import usable_cores
from inferlab._errors import UsageError
from inferlab.load.policy import Send
from inferlab.load.run import auto_workers
from inferlab.load.schedules import Replay
from inferlab.load.workers import _Pool
from inferlab.results.clientload import ClientLoad
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


def kill_worker(conn: Any) -> None:
    """Kill -9 the worker at the other end of ``conn`` (the parent's end of its socket),
    and wait until it is dead (a zombie: the parent has not reaped it)."""
    sock = conn.writer.get_extra_info("socket")
    pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
    os.kill(pid, signal.SIGKILL)
    while Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z":
        time.sleep(0.001)


async def test_a_worker_killed_mid_run_leaves_a_record_of_each_request_it_held(
    sim: EmbeddedServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    launched: list[int] = []
    held: list[int] = []
    launch = _Pool.launch

    def launch_then_kill(pool: _Pool, send: Send, record: RequestRecord, text: list[str] | None) -> None:
        launch(pool, send, record, text)
        launched.append(send.index)
        if len(launched) == 4:  # each worker holds two: kill one of them
            conn = next(c for c in pool.conns if c.pending)
            held.extend(conn.pending)
            kill_worker(conn)

    monkeypatch.setattr(_Pool, "launch", launch_then_kill)
    cfg = BenchConfig(LoadConfig(ClosedLoop(4), num_requests=40), WorkloadConfig(input_tokens=50, output_tokens=400),
                      workers=2)
    result = await asyncio.wait_for(bench_async(cfg, sim.url), 30)
    assert len(held) == 2
    assert [r.index for r in result.records] == sorted(launched)  # each request sent has its record
    assert result.summary.counts.total == len(launched)
    lost = [r for r in result.records if r.index in held]
    assert all(r.error_kind is ErrorKind.CANCELLED and "died" in (r.error or "") for r in lost)
    assert result.interrupted and result.cause is not None and "died" in str(result.cause)
    assert any("died" in w for w in result.summary.warnings)  # and its load is not in client.processes
    assert isinstance(result.summary.client, ClientLoad) and len(result.summary.client.processes) == 2


async def test_a_worker_killed_while_idle_gets_no_more_requests_and_the_run_ends(
    sim: EmbeddedServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Request 0 goes to the first worker; once it has answered, that worker is killed:
    # the next requests (due later) must not go to it, and the run ends with what it has.
    first: list[Any] = []
    launch = _Pool.launch

    def launch_remember(pool: _Pool, send: Send, record: RequestRecord, text: list[str] | None) -> None:
        launch(pool, send, record, text)
        if not first:
            first.append(next(c for c in pool.conns if c.pending))

    def on_record(r: RequestRecord) -> None:
        if r.index == 0:
            kill_worker(first[0])

    monkeypatch.setattr(_Pool, "launch", launch_remember)
    load = LoadConfig(OpenLoop(4.0, arrival="constant"), num_requests=8)
    cfg = BenchConfig(load, WorkloadConfig(input_tokens=20, output_tokens=2), workers=2, preflight=False)
    result = await asyncio.wait_for(bench_async(cfg, sim.url, on_record=on_record), 30)
    assert result.records[0].ok
    assert [r.index for r in result.records] == list(range(len(result.records)))
    assert len(result.records) < 8 and result.interrupted
    assert result.cause is not None and "died" in str(result.cause)


async def test_more_workers_than_cores_are_refused_before_the_run(sim: EmbeddedServer) -> None:
    cores = usable_cores()
    cfg = BenchConfig(LoadConfig(ClosedLoop(1), num_requests=1), WorkloadConfig(input_tokens=20, output_tokens=2),
                      workers=cores + 1)
    before = sim.server.requests_ok
    with pytest.raises(UsageError, match=f"--workers {cores + 1} is more than the {cores} cores this process may run on"):
        await bench_async(cfg, sim.url)
    assert sim.server.requests_ok == before
