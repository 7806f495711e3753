"""Connections to the server, against raw-socket stubs (``rawserver``): a server slow to
accept them is charged to the server (the records' connect wait, in TTFT and E2E), not to
the client (its queue delay); a server that died mid-run stops the run, which fails
with its records kept."""

from __future__ import annotations

from pathlib import Path

import pytest
from rawserver import RawServer

from inferlab import BenchConfig, ClosedLoop, LoadConfig, OpenLoop, WorkloadConfig, bench_async
from inferlab.load import http as executor
from inferlab.results.metrics import queue_delay_ms
from inferlab.results.runfiles import read_records
from inferlab.results.summary import Summary

CLIENTS = ("aiohttp", "httptools")


def bench(load: LoadConfig, http_client: str, out: Path | None = None) -> BenchConfig:
    return BenchConfig(
        load, WorkloadConfig(input_tokens=8, output_tokens=2), model="m", preflight=False, server_metrics=False,
        http_client=http_client, out_dir=None if out is None else str(out), timeout_s=30, idle_timeout_s=30,
    )


@pytest.mark.parametrize("http_client", CLIENTS)
async def test_a_server_slow_to_accept_is_in_ttft_and_not_in_queue_delay(http_client: str) -> None:
    # an open loop without a cap warms one connection: the others connect mid-run, to
    # a server that queues one connection and drops the other SYNs (sent again 1 s on)
    with RawServer(accept_every_s=0.3, answer_after_s=0.25) as server:
        load = LoadConfig(OpenLoop(rate_rps=20, arrival="constant"), num_requests=4)
        result = await bench_async(bench(load, http_client), server.url)
    done = [r for r in result.records if r.ok]
    assert len(done) == 4
    waits = [r.connect_wait_ns for r in done]
    assert all(w is not None for w in waits)
    # the wait is in TTFT (from the request's start) ...
    assert all(r.content_ns[0] - (r.send_ns or 0) >= (r.connect_wait_ns or 0) for r in done)
    # ... and not in the client's queue delay: the server's wait is the larger by far
    assert max(w or 0 for w in waits) > 10 * max(queue_delay_ms(r) or 0.0 for r in done) * 1e6
    s = result.summary
    assert s.connect_wait_ms is not None and s.connect_wait_ms.max * 1e6 == pytest.approx(max(w or 0 for w in waits))
    assert any(w.startswith("the server was slow to accept connections") for w in s.warnings)
    assert not any("fell behind its schedule" in w for w in s.warnings)
    assert Summary.from_json(s.to_json()).connect_wait_ms == s.connect_wait_ms


@pytest.mark.parametrize("http_client", CLIENTS)
async def test_pooled_connections_wait_for_none(http_client: str) -> None:
    with RawServer() as server:
        load = LoadConfig(ClosedLoop(1), num_requests=3)
        result = await bench_async(bench(load, http_client), server.url)
    assert [r.connect_wait_ns for r in result.records] == [0, 0, 0]  # (the warmed connection, kept alive)
    assert result.summary.connect_wait_ms is None


@pytest.mark.parametrize("http_client", CLIENTS)
async def test_a_server_that_dies_mid_run_stops_it(http_client: str, tmp_path: Path) -> None:
    n = 20_000
    with RawServer(die_after=10) as server:
        load = LoadConfig(ClosedLoop(2), num_requests=n)
        result = await bench_async(bench(load, http_client, tmp_path / "run"), server.url)
    assert isinstance(result.cause, executor.ServerGoneError)
    assert str(result.cause).startswith("the server stopped answering (connection refused) after ")
    assert str(result.cause).endswith(f"its records are in {tmp_path / 'run'}")
    assert result.interrupted and len(result.records) < n
    assert result.summary.counts.completed <= server.answered
    # every record kept, on disk too
    assert len(list(read_records(tmp_path / "run" / "requests.jsonl"))) == len(result.records)
    s = result.summary
    assert s.counts.errors.get("connect", 0) >= executor.GONE_REQUESTS
    assert str(result.cause) in s.warnings
    # the final streak of refusals is said apart, first
    assert s.counts.after_server_gone >= executor.GONE_REQUESTS
    assert s.warnings[0].startswith(f"{s.counts.after_server_gone:,} requests failed for want of a connection (")


async def test_the_retry_storm_after_the_server_went_is_bounded_and_said_apart(tmp_path: Path) -> None:
    # 4 closed-loop users re-send as soon as a request is refused: the stop rule's count
    # ends the storm, and the summary says it apart from the run before it
    with RawServer(die_after=12) as server:
        load = LoadConfig(ClosedLoop(4), num_requests=100_000)
        result = await bench_async(bench(load, "aiohttp", tmp_path / "run"), server.url)
    assert isinstance(result.cause, executor.ServerGoneError)
    s = result.summary
    # (a second of them was thousands): the cap, and at most one more for each of the 4
    # in flight as the count reached it (their ends can come together, before the run
    # looks again; it sends nothing more once it has)
    assert s.counts.failed <= executor.GONE_CAP_PER_SLOT * 4 + 4 - 1
    assert 0 < s.counts.after_server_gone <= s.counts.failed
    first = s.warnings[0]
    assert first.startswith(f"{s.counts.after_server_gone:,} requests failed for want of a connection (")
    before = s.counts.failed - s.counts.after_server_gone
    assert f"before that, {before:,} of {s.counts.completed + before:,} failed" in first
    # the share warning, if any, is of the run before the server went
    assert not any(f"{s.counts.failed:,} of {s.counts.total:,} measured requests failed" in w for w in s.warnings)


def test_an_answer_to_a_request_sent_before_the_refusals_began_does_not_end_their_count() -> None:
    """A stream the server finishes as it shuts down ends after the refusals began: it says
    nothing of the server now, so the count goes on (it reset the count, and a loaded
    machine's fresh-clone CI saw a Locust run take 448 refusals for a rule of 204)."""
    from inferlab.results.records import ErrorKind, RequestRecord

    def refused(i: int, sent: int) -> RequestRecord:
        return RequestRecord(i, send_ns=sent, end_ns=sent + 1, error_kind=ErrorKind.CONNECT,
                             error="Connect call failed: connection refused")

    def answered(i: int, sent: int) -> RequestRecord:
        return RequestRecord(i, send_ns=sent, ttfb_ns=sent + 5, end_ns=sent + 10, status=200)

    watch = executor.GoneWatch()
    watch.peak = 4
    for i in range(30):
        watch.note(refused(i, 1_000 + i), 0.1)
    watch.note(answered(99, 500), 0.1)  # (sent before the first refusal)
    assert watch.unanswered == 30
    watch.note(answered(100, 2_000), 0.1)  # (sent after it: the server answers again)
    assert watch.unanswered == 0
