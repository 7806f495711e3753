"""The real client over loopback against a misbehaving server (``tests/faultserver.py``).

Each behaviour is one real HTTP exchange, and the record must say exactly what
happened: error kind and message, status, which timestamps exist and their order,
content chunks, usage. Then whole runs over a mix of faults, an interrupted run and an
unreachable server, through ``bench_async`` and its results directory. Every test runs
on each HTTP stack (``client.exchange.HTTP_CLIENTS``: aiohttp and httptools): both must
record every fault alike.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from faultserver import ERROR_MESSAGE, OUTPUT_CHARS, TEXTS, USAGE, FaultServer

from inferlab import (
    BenchConfig,
    ClosedLoop,
    ErrorKind,
    LoadConfig,
    RequestRecord,
    RunFailedError,
    ServerUnreachableError,
    WallClock,
    bench_async,
    request_metrics,
)
from inferlab.client.http import Endpoint
from inferlab.load.http import open_client
from inferlab.workload.spec import RequestSpec

IDLE_S = 0.5  # the client's idle timeout; the server stalls for STALL_S, well past it (a loaded CI machine must not reach it by chance)
STALL_S = 2.0
SPEC = RequestSpec(prompt="hi", max_tokens=5)

T = TypeVar("T")

#: The HTTP stack under test (``_stack`` sets it for each test).
STACK = "aiohttp"


@pytest.fixture(autouse=True, params=["aiohttp", "httptools"])
def _stack(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(sys.modules[__name__], "STACK", request.param)
    return str(request.param)


def with_server(body: Callable[[FaultServer], Awaitable[T]], **server_kw: Any) -> T:
    """Run ``body`` against a fresh fault server, in a fresh event loop."""

    async def main() -> T:
        async with FaultServer(stall_s=STALL_S, **server_kw) as srv:
            return await body(srv)

    return asyncio.run(main())


async def send_to(base_url: str, model: str, record: RequestRecord | None = None,
                  **endpoint_kw: Any) -> RequestRecord:
    """One request through the real client of ``STACK``, as the runner sends it."""
    endpoint_kw.setdefault("idle_timeout_s", IDLE_S)
    endpoint = Endpoint(base_url=base_url, model=model, **endpoint_kw)
    clock = WallClock()
    record = record or RequestRecord(index=0)
    async with open_client(endpoint, clock, STACK, 0) as client:
        client.t0_ns = clock.now_ns()
        await client.send(SPEC, record)
    return record


def send(model: str, **endpoint_kw: Any) -> RequestRecord:
    return with_server(lambda srv: send_to(srv.url + "/v1", model, **endpoint_kw))


def timeline(r: RequestRecord) -> list[int]:
    """Every stamp the record has, in the order they must have happened."""
    assert r.send_ns is not None
    stamps = [r.send_ns]
    if r.ttfb_ns is not None:
        stamps.append(r.ttfb_ns)
    stamps += r.content_ns
    if r.end_ns is not None:
        stamps.append(r.end_ns)
    return stamps


def assert_in_order(r: RequestRecord) -> None:
    stamps = timeline(r)
    assert stamps == sorted(stamps), stamps


def assert_full_reply(r: RequestRecord) -> None:
    """What every well-formed stream of the fault server's one reply must give."""
    assert r.ok, (r.error_kind, r.error)
    assert (r.status, r.error_kind, r.error) == (200, None, None)
    assert r.ttfb_ns is not None and r.end_ns is not None
    assert_in_order(r)
    assert len(r.content_ns) == len(TEXTS)  # role-only and empty deltas are not content
    assert r.output_chars == OUTPUT_CHARS
    assert r.finish_reason == "stop"


def assert_failed_midway(r: RequestRecord, kind: ErrorKind, content_chunks: int) -> None:
    """A stream that started, delivered ``content_chunks`` chunks, then failed."""
    assert not r.ok
    assert r.error_kind is kind
    assert r.status == 200
    assert r.ttfb_ns is not None and r.end_ns is None
    assert_in_order(r)
    assert len(r.content_ns) == content_chunks
    assert r.output_chars == sum(len(t) for t in TEXTS[:content_chunks])
    assert r.usage_source == "none" and r.output_tokens is None


# --- one request per behaviour -------------------------------------------------------------


@pytest.mark.parametrize("framing", ["normal", "batched", "split", "nospace", "comments", "crlf"])
def test_every_legal_framing_gives_the_same_record(framing: str) -> None:
    r = send(framing)
    assert_full_reply(r)
    assert r.stream_done is True
    assert (r.input_tokens, r.output_tokens) == (USAGE["prompt_tokens"], USAGE["completion_tokens"])
    assert r.cached_tokens == 2
    assert r.usage_source == "server"


def test_a_stream_without_done_still_completes() -> None:
    r = send("no_done")
    assert_full_reply(r)
    assert r.stream_done is False
    assert r.usage_source == "server" and r.output_tokens == USAGE["completion_tokens"]


def test_without_usage_the_token_count_falls_back_to_content_chunks() -> None:
    r = send("no_usage")
    assert_full_reply(r)
    assert r.stream_done is True
    assert r.usage_source == "none"
    assert (r.input_tokens, r.output_tokens) == (None, None)
    assert request_metrics(r).output_tokens == len(TEXTS)


def test_a_json_answer_to_a_streaming_request_is_read_as_a_body() -> None:
    r = send("json")
    assert r.ok and r.status == 200
    assert r.ttfb_ns is not None and r.end_ns is not None
    assert_in_order(r)
    assert r.content_ns == []  # one body, no chunks: TTFT is undefined, not invented
    assert r.output_chars == OUTPUT_CHARS
    assert r.usage_source == "server" and r.output_tokens == USAGE["completion_tokens"]
    assert r.finish_reason == "stop"
    assert r.stream_done is None


@pytest.mark.parametrize(
    ("behaviour", "status", "message"),
    [
        ("http_500", 500, f"HTTP 500: {ERROR_MESSAGE}"),
        ("http_429", 429, "HTTP 429: Rate limit reached"),
        ("http_text", 503, "HTTP 503: upstream unavailable"),
        ("no_such_model", 404, "HTTP 404: The model `no_such_model` does not exist."),
    ],
)
def test_an_error_status_is_recorded_with_the_servers_message(
    behaviour: str, status: int, message: str
) -> None:
    r = send(behaviour)
    assert not r.ok
    assert (r.error_kind, r.status, r.error) == (ErrorKind.HTTP_STATUS, status, message)
    assert r.send_ns is not None
    assert (r.ttfb_ns, r.end_ns, r.content_ns) == (None, None, [])


def test_an_error_body_in_two_pieces_is_still_parsed() -> None:
    r = send("http_500_chunked")
    assert (r.error_kind, r.status) == (ErrorKind.HTTP_STATUS, 500)
    assert r.error == f"HTTP 500: {ERROR_MESSAGE}"


def test_a_connection_dropped_mid_stream_is_a_disconnect() -> None:
    r = send("disconnect")
    assert_failed_midway(r, ErrorKind.DISCONNECT, content_chunks=2)
    assert r.error is not None and r.error.startswith("connection closed mid-response: ")
    assert r.stream_done is None


def test_a_connection_dropped_before_any_response_is_a_disconnect() -> None:
    r = send("hangup")
    assert r.error_kind is ErrorKind.DISCONNECT
    assert r.error is not None and "Server disconnected" in r.error
    assert (r.status, r.ttfb_ns, r.end_ns, r.content_ns) == (None, None, None, [])


def test_a_stall_past_the_idle_timeout_is_an_idle_timeout() -> None:
    r = send("stall")
    assert_failed_midway(r, ErrorKind.IDLE_TIMEOUT, content_chunks=1)
    assert r.error == f"no data for {IDLE_S:g} s"


@pytest.mark.parametrize("answer", [b"", b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 99\r\n\r\n{"])
def test_silence_before_the_head_or_inside_a_body_is_an_idle_timeout(answer: bytes) -> None:
    """A server that reads the request, then says nothing (or a piece of a whole body)."""

    async def main() -> RequestRecord:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await asyncio.sleep(STALL_S)
            writer.close()

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await send_to(f"http://127.0.0.1:{port}/v1", "m")

    r = asyncio.run(main())
    assert r.error_kind is ErrorKind.IDLE_TIMEOUT and r.error == f"no data for {IDLE_S:g} s"
    assert r.status == (200 if answer else None) and r.end_ns is None


def test_a_stream_longer_than_the_total_timeout_is_a_timeout() -> None:
    # The stream never goes quiet (a chunk every 20 ms), so only the total timeout can end it.
    r = with_server(
        lambda srv: send_to(srv.url + "/v1", "slow", timeout_s=0.3, idle_timeout_s=5.0),
        slow_gap_s=0.02,
    )
    assert r.error_kind is ErrorKind.TIMEOUT
    assert r.error == "request took over 0.3 s"
    assert r.status == 200 and r.end_ns is None
    assert_in_order(r)


def test_a_malformed_event_stops_the_stream() -> None:
    r = send("malformed")
    assert_failed_midway(r, ErrorKind.MALFORMED, content_chunks=2)
    assert r.error == "event is not JSON: '{not json'"
    assert r.stream_done is False


def test_an_error_object_in_the_stream_is_a_stream_error() -> None:
    r = send("stream_error")
    assert_failed_midway(r, ErrorKind.STREAM_ERROR, content_chunks=2)
    assert r.error == ERROR_MESSAGE
    assert r.stream_done is False


@pytest.mark.parametrize(
    "timeouts",
    [{"idle_timeout_s": IDLE_S}, {"timeout_s": 0.3, "idle_timeout_s": 5.0}],
    ids=["idle", "total"],
)
def test_a_server_lingering_after_done_does_not_fail_the_request(timeouts: dict[str, float]) -> None:
    r = send("done_linger", **timeouts)
    assert_full_reply(r)
    assert r.stream_done is True
    assert r.usage_source == "server"


def test_a_closed_port_is_a_connect_error() -> None:
    port = free_port()
    r = asyncio.run(send_to(f"http://127.0.0.1:{port}/v1", "normal"))
    assert r.error_kind is ErrorKind.CONNECT
    assert r.error is not None
    assert r.error.startswith(f"cannot connect to http://127.0.0.1:{port}/v1/chat/completions")
    assert (r.status, r.ttfb_ns, r.end_ns) == (None, None, None)


def test_cancelling_a_request_in_flight_records_it_as_cancelled() -> None:
    async def body(srv: FaultServer) -> RequestRecord:
        record = RequestRecord(index=0)
        task = asyncio.ensure_future(send_to(srv.url + "/v1", "slow", record, idle_timeout_s=5.0))
        # Polling is the point: the record is plain data, and the client offers no hook.
        while not record.content_ns and not task.done():  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return record

    r = with_server(body, slow_gap_s=0.01)
    assert r.error_kind is ErrorKind.CANCELLED
    assert r.error == "run interrupted"
    assert r.status == 200 and r.ttfb_ns is not None and r.end_ns is None
    assert_in_order(r)


# --- whole runs -------------------------------------------------------------------------


def free_port() -> int:
    """A port nothing listens on (bound once by us, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def bench_config(model: str | None, out_dir: Path, num_requests: int, concurrency: int) -> BenchConfig:
    return BenchConfig(
        load=LoadConfig(schedule=ClosedLoop(concurrency), num_requests=num_requests),
        model=model,
        idle_timeout_s=IDLE_S,
        timeout_s=10.0,
        out_dir=str(out_dir),
        preflight=False,  # the fault mix counts every request; the probe is tested elsewhere
        http_client=STACK,
    )


FINE = ["normal", "batched", "split", "nospace", "comments", "crlf", "no_done", "no_usage", "json"]
FAULTS = {
    "http_500": "http_status",
    "http_429": "http_status",
    "disconnect": "disconnect",
    "stall": "idle_timeout",
    "malformed": "malformed",
    "stream_error": "stream_error",
}


def test_a_run_over_every_fault_accounts_for_every_request(tmp_path: Path) -> None:
    mix = FINE + list(FAULTS)
    rounds = 2
    total = rounds * len(mix)
    cfg = bench_config("cycle:" + ",".join(mix), tmp_path, total, concurrency=4)

    async def body(srv: FaultServer) -> tuple[Any, Counter[str]]:
        return await bench_async(cfg, srv.url), srv.served

    result, served = with_server(body)
    assert served == Counter({b: rounds for b in mix})
    assert result.summary.config["resolved"]["client_stack"]["http"] == STACK
    assert result.summary.config["http_client"] == STACK

    counts = result.summary.counts
    assert counts.total == total
    assert counts.completed == rounds * len(FINE)
    assert counts.failed == rounds * len(FAULTS)
    assert counts.cancelled == 0
    assert counts.errors == dict(Counter(k for k in FAULTS.values() for _ in range(rounds)))
    assert set(result.summary.error_examples) == set(FAULTS.values())
    with_usage = rounds * (len(FINE) - 1)  # every fine stream but no_usage sends usage
    assert result.summary.token_source.startswith(
        f"server usage for {with_usage} of {rounds * len(FINE)} requests"
    )
    assert result.summary.interrupted is False

    assert sorted(r.index for r in result.records) == list(range(total))
    for r in result.records:
        assert_in_order(r)
        assert r.ok != (r.error_kind is not None)

    lines = read_jsonl(tmp_path / "requests.jsonl")
    assert sorted(d["index"] for d in lines) == list(range(total))
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["counts"] == counts.to_json()


def test_an_interrupted_run_keeps_what_it_measured(tmp_path: Path) -> None:
    # One user in four gets a normal reply, then (like the others) a slow stream that
    # only ends when the run is stopped: exactly two requests can complete.
    cfg = bench_config("cycle:normal,slow,slow,slow", tmp_path, 50, concurrency=4)
    completed: list[int] = []

    async def body(srv: FaultServer) -> Any:
        stop = asyncio.Event()

        def on_record(r: RequestRecord) -> None:
            if r.ok:
                completed.append(r.index)
                if len(completed) == 2:
                    stop.set()

        return await bench_async(cfg, srv.url, stop=stop, on_record=on_record)

    result = with_server(body)
    assert result.summary.interrupted is True
    counts = result.summary.counts
    assert counts.completed == 2
    assert counts.failed == 0
    assert counts.cancelled == counts.total - 2 >= 3
    kinds = {r.index: r.error_kind for r in result.records}
    assert all(kinds[i] is None for i in completed)
    assert all(kinds[i] is ErrorKind.CANCELLED for i in kinds if i not in completed)

    lines = read_jsonl(tmp_path / "requests.jsonl")
    assert len(lines) == len(result.records)
    assert {d["index"]: d["error_kind"] for d in lines} == {
        i: (k.value if k else None) for i, k in kinds.items()
    }
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["interrupted"] is True
    assert on_disk["counts"] == counts.to_json()
    assert on_disk["e2e_ms"]["max"] > 0


def test_the_model_is_discovered_from_the_models_route(tmp_path: Path) -> None:
    cfg = bench_config(None, tmp_path, 3, concurrency=1)
    result = with_server(lambda srv: bench_async(cfg, srv.url))
    assert result.summary.config["resolved"]["model"] == "normal"
    assert result.summary.counts.completed == 3


def test_an_unreachable_server_without_a_model_fails_before_the_run(tmp_path: Path) -> None:
    cfg = bench_config(None, tmp_path / "run", 3, concurrency=1)
    with pytest.raises(ServerUnreachableError):
        asyncio.run(bench_async(cfg, f"http://127.0.0.1:{free_port()}"))
    assert not (tmp_path / "run").exists()


def test_an_unreachable_server_with_a_model_fails_after_recording_the_run(tmp_path: Path) -> None:
    cfg = bench_config("normal", tmp_path, 4, concurrency=2)
    with pytest.raises(RunFailedError) as info:
        asyncio.run(bench_async(cfg, f"http://127.0.0.1:{free_port()}"))
    summary = info.value.summary
    assert summary is not None
    assert summary.counts.errors == {"connect": 4}
    assert summary.counts.completed == 0
    lines = read_jsonl(tmp_path / "requests.jsonl")
    assert [d["error_kind"] for d in lines] == ["connect"] * 4
    assert json.loads((tmp_path / "summary.json").read_text())["counts"] == summary.counts.to_json()
