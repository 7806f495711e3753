"""The httptools client next to aiohttp's: the same record for every behaviour of the
fault server, the framings and answers only a hand-fed parser has to get right
(``Content-Length`` streams, bodies that run to the close, interim 1xx answers, a
compressed answer), its pool of keep-alive connections, and which stack a run picks."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from faultserver import BEHAVIOURS, OUTPUT_CHARS, TEXTS, FaultServer, reply_events, sse
from test_client_faults import assert_full_reply

from inferlab import (
    BenchConfig,
    ClosedLoop,
    LoadConfig,
    RequestRecord,
    UsageError,
    WallClock,
    bench_async,
)
from inferlab.client.exchange import resolve_http_client
from inferlab.client.http import Endpoint
from inferlab.client.httptools_http import HttptoolsClient, Pool
from inferlab.load.http import open_client
from inferlab.results.records import ErrorKind
from inferlab.workload.spec import RequestSpec

SPEC = RequestSpec(prompt="hi", max_tokens=5)
IDLE_S = 0.5  # (the stall below is 2 s: a loaded CI machine must not reach it by chance)
STACKS = ("aiohttp", "httptools")


async def send(stack: str, base_url: str, model: str = "m", **endpoint_kw: Any) -> RequestRecord:
    endpoint_kw.setdefault("idle_timeout_s", IDLE_S)
    endpoint = Endpoint(base_url=base_url, model=model, **endpoint_kw)
    clock = WallClock()
    record = RequestRecord(index=0)
    async with open_client(endpoint, clock, stack, 0) as client:
        client.t0_ns = clock.now_ns()
        await client.send(SPEC, record)
    return record


def what_it_said(r: RequestRecord) -> dict[str, Any]:
    """A record less its times (which differ from run to run): what the two stacks must
    agree on. The count of content stamps stays."""
    d = dataclasses.asdict(r)
    for key in ("send_ns", "ttfb_ns", "end_ns", "content_ns", "connect_wait_ns"):
        d[key] = None if d[key] is None else (len(d[key]) if key == "content_ns" else "set")
    return d


# --- the same record, whatever the stack -----------------------------------------------------


@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
def test_both_stacks_record_every_behaviour_alike(behaviour: str) -> None:
    async def main() -> list[dict[str, Any]]:
        async with FaultServer(stall_s=2.0, slow_chunks=3, slow_gap_s=0.01) as srv:
            return [what_it_said(await send(stack, srv.url + "/v1", behaviour)) for stack in STACKS]

    on_aiohttp, on_httptools = asyncio.run(main())
    assert on_httptools == on_aiohttp


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def raw_server(answer: bytes, *, close: bool = True, linger_s: float = 0.0) -> Callable[[str], Awaitable[RequestRecord]]:
    """A server that reads one request and writes ``answer`` as it is (then closes, or
    keeps the connection ``linger_s``); returns a function that sends to it on a stack."""

    async def for_stack(stack: str) -> RequestRecord:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")).split(b":")[1])
            await reader.readexactly(length)
            writer.write(answer)
            await writer.drain()
            await asyncio.sleep(linger_s)
            if close:
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            # Nothing here waits on the idle timeout: a generous one keeps a loaded machine
            # from turning a slow first byte into an idle timeout (a CI run saw one at 0.2 s).
            return await send(stack, f"http://127.0.0.1:{port}/v1", idle_timeout_s=10.0)

    return for_stack


def stream_bytes() -> bytes:
    return b"".join(sse(e) for e in reply_events()) + sse("[DONE]")


def on_both(for_stack: Callable[[str], Awaitable[RequestRecord]]) -> tuple[RequestRecord, RequestRecord]:
    async def main() -> tuple[RequestRecord, RequestRecord]:
        return await for_stack("aiohttp"), await for_stack("httptools")

    return asyncio.run(main())


def test_a_stream_with_a_content_length_is_read_whole_and_alike() -> None:
    body = stream_bytes()
    head = f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    a, h = on_both(raw_server(head + body, close=False, linger_s=0.5))
    assert_full_reply(h)
    assert h.stream_done is True
    assert what_it_said(h) == what_it_said(a)


@pytest.mark.parametrize("media_type", ["text/event-stream", "application/json"])
def test_a_body_that_runs_to_the_close_is_read_whole_and_alike(media_type: str) -> None:
    if media_type == "text/event-stream":
        body = b"".join(sse(e) for e in reply_events())  # (no [DONE]: the close ends it)
    else:
        body = (
            b'{"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", '
            b'"content": "' + "".join(TEXTS[1:]).encode() + b'"}, "finish_reason": "stop"}]}'
        )
    head = f"HTTP/1.1 200 OK\r\nContent-Type: {media_type}\r\nConnection: close\r\n\r\n".encode()
    a, h = on_both(raw_server(head + body))
    assert h.ok and h.end_ns is not None, h.error
    assert h.output_chars == (OUTPUT_CHARS if media_type == "text/event-stream" else OUTPUT_CHARS - len(TEXTS[0]))
    assert what_it_said(h) == what_it_said(a)


def test_a_body_cut_short_of_its_content_length_is_a_disconnect_in_the_same_words() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 99\r\n\r\n"
    a, h = on_both(raw_server(head + b'{"choices": '))
    assert h.error_kind is ErrorKind.DISCONNECT and h.status == 200
    assert h.error is not None and "(received 12 of 99 bytes)" in h.error
    assert what_it_said(h) == what_it_said(a)


def test_an_interim_answer_before_the_response_is_skipped() -> None:
    body = stream_bytes()
    answer = (
        b"HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n"
        + f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    a, h = on_both(raw_server(answer))
    assert_full_reply(h)
    assert what_it_said(h) == what_it_said(a)


def test_a_compressed_answer_to_an_identity_request_is_malformed() -> None:
    """httptools asks for ``identity`` and does not decompress (aiohttp would)."""
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\n\x1f\x8b\x08\x00"
    r = asyncio.run(raw_server(answer)("httptools"))
    assert r.error_kind is ErrorKind.MALFORMED and r.status == 200
    assert r.error == "the response is compressed (gzip), though identity was asked for"
    assert (r.ttfb_ns, r.end_ns) == (None, None)


def test_bytes_that_are_no_http_response_are_a_disconnect() -> None:
    r = asyncio.run(raw_server(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")("httptools"))
    assert r.error_kind is ErrorKind.DISCONNECT and r.status is None
    assert r.error is not None and r.error.startswith("InvalidResponse: invalid HTTP response: ")


# --- the pool ------------------------------------------------------------------------------


async def connections_for(requests: int, model: str) -> tuple[int, list[RequestRecord]]:
    """Send ``requests`` one after another on one httptools client; how many
    connections it opened, and the records. The server stalls (``stall``) past the idle
    timeout, and lingers after ``[DONE]`` (``done_linger``) within the drain's second."""
    opened = 0

    async with FaultServer(stall_s=0.6) as srv:
        endpoint = Endpoint(base_url=srv.url + "/v1", model=model, idle_timeout_s=0.3)
        clock = WallClock()
        async with Pool(endpoint.base_url) as pool:
            client = HttptoolsClient(endpoint, clock, pool, clock.now_ns())
            connect = pool.connect

            async def counted() -> Any:
                nonlocal opened
                opened += 1
                return await connect()

            pool.connect = counted  # type: ignore[method-assign]
            records = []
            for i in range(requests):
                records.append(RequestRecord(index=i))
                await client.send(SPEC, records[-1])
    return opened, records


@pytest.mark.parametrize("model", ["normal", "json", "http_500", "done_linger"])
def test_one_connection_carries_request_after_request(model: str) -> None:
    opened, records = asyncio.run(connections_for(4, model))
    assert opened == 1
    assert all(r.status is not None for r in records)


@pytest.mark.parametrize("model", ["disconnect", "stall"])
def test_a_connection_left_mid_response_is_not_reused(model: str) -> None:
    opened, records = asyncio.run(connections_for(3, model))
    assert opened == 3
    assert all(not r.ok for r in records)


def test_a_cancelled_request_leaves_no_connection_behind() -> None:
    async def main() -> tuple[int, int, bool]:
        async with FaultServer(slow_gap_s=0.01) as srv:
            endpoint = Endpoint(base_url=srv.url + "/v1", model="slow", idle_timeout_s=5.0)
            clock = WallClock()
            async with Pool(endpoint.base_url) as pool:
                client = HttptoolsClient(endpoint, clock, pool, clock.now_ns())
                record = RequestRecord(index=0)
                task = asyncio.ensure_future(client.send(SPEC, record))
                while not record.content_ns and not task.done():  # noqa: ASYNC110 (the record is plain data)
                    await asyncio.sleep(0.005)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await asyncio.sleep(0.05)  # (the aborted transport's close)
                return len(pool._idle), len(pool._all), record.error_kind is ErrorKind.CANCELLED

    assert asyncio.run(main()) == (0, 0, True)


def test_warm_connections_are_used_before_new_ones() -> None:
    async def main() -> tuple[int, bool]:
        async with FaultServer() as srv:
            endpoint = Endpoint(base_url=srv.url + "/v1", model="normal")
            clock = WallClock()
            async with Pool(endpoint.base_url) as pool:
                await pool.warm(3)
                warm = len(pool._idle)
                client = HttptoolsClient(endpoint, clock, pool, clock.now_ns())
                record = RequestRecord(index=0)
                await client.send(SPEC, record)
                return warm, record.ok and len(pool._all) == 3

    assert asyncio.run(main()) == (3, True)


# --- which stack ---------------------------------------------------------------------------


def test_auto_picks_httptools_for_plain_http_where_installed() -> None:
    assert importlib.util.find_spec("httptools") is not None  # (the test extra has it)
    assert resolve_http_client("auto", "http://h:8000/v1") == "httptools"
    assert resolve_http_client("auto", "https://h/v1") == "aiohttp"
    assert resolve_http_client("aiohttp", "http://h:8000/v1") == "aiohttp"
    assert resolve_http_client("httptools", "http://h:8000/v1") == "httptools"


def test_auto_picks_aiohttp_without_httptools(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "httptools" else real(name, *a))
    assert resolve_http_client("auto", "http://h:8000/v1") == "aiohttp"
    with pytest.raises(ValueError, match="httptools is not installed"):
        resolve_http_client("httptools", "http://h:8000/v1")


@pytest.mark.parametrize(("choice", "url", "needle"), [
    ("httptools", "https://h/v1", "plain http:// only"),
    ("curl", "http://h/v1", "unknown HTTP client"),
])
def test_a_stack_that_cannot_send_there_is_refused(choice: str, url: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        resolve_http_client(choice, url)


def test_a_run_refuses_httptools_for_https_before_sending() -> None:
    cfg = BenchConfig(LoadConfig(ClosedLoop(1), num_requests=1), model="m", preflight=False, http_client="httptools")
    with pytest.raises(UsageError, match="plain http:// only"):
        asyncio.run(bench_async(cfg, "https://127.0.0.1:1"))
