"""Stale keep-alive connections: a request that a pooled connection failed before the
server read it is sent again, once, on a new connection; nothing else is resent.

The fault server's ``stale_after_s`` drops a request that arrives on a connection idle
longer than that, unanswered: deterministically what a client sees when its request
crosses a server's idle close (llama.cpp's and uvicorn's 5 s) on the wire. Each test
runs on both HTTP stacks (aiohttp, httptools).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import pytest
from faultserver import FaultServer
from test_client_faults import assert_full_reply

from inferlab import BenchConfig, LoadConfig, OpenLoop, RequestRecord, WallClock, bench_async
from inferlab.client.http import Endpoint, Sender, _Attempt
from inferlab.load.http import open_client
from inferlab.workload.spec import RequestSpec

STALE_S = 0.2  # the server drops requests on connections idle longer than this
IDLE_S = 0.35  # how long the tests leave a pooled connection idle: past STALE_S
SPEC = RequestSpec(prompt="hi", max_tokens=5)

T = TypeVar("T")

#: The HTTP stack under test (``_stack`` sets it for each test).
STACK = "aiohttp"


@pytest.fixture(autouse=True, params=["aiohttp", "httptools"])
def _stack(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(sys.modules[__name__], "STACK", request.param)
    return str(request.param)


def with_client(
    body: Callable[[FaultServer, Sender], Awaitable[T]], model: str = "normal", **server_kw: Any
) -> T:
    """Run ``body`` with a fault server and a client of ``STACK`` for ``model`` on one
    pool of connections (as a run has), in a fresh event loop."""

    async def main() -> T:
        clock = WallClock()
        async with FaultServer(**server_kw) as srv:
            endpoint = Endpoint(base_url=srv.url + "/v1", model=model, timeout_s=10.0)
            async with open_client(endpoint, clock, STACK, 0) as client:
                client.t0_ns = clock.now_ns()
                return await body(srv, client)

    return asyncio.run(main())


async def send(client: Sender) -> RequestRecord:
    record = RequestRecord(index=0)
    await client.send(SPEC, record)
    return record


def test_the_fault_server_fails_a_plain_request_on_a_stale_connection() -> None:
    """Without the client's resend (one attempt of the stack alone), the second request
    fails on the stale pooled connection: the fault is real, and the stack raises what
    the resend rule looks for."""

    async def body(srv: FaultServer, client: Sender) -> None:
        payload = json.dumps({"model": "normal", "messages": []}).encode()
        first = RequestRecord(index=0)
        await client._exchange(False, payload, first, _Attempt(lambda: None), None)
        assert first.status == 200
        await asyncio.sleep(IDLE_S)
        attempt = _Attempt(lambda: None)
        with pytest.raises(aiohttp.ClientConnectionError):
            await client._exchange(False, payload, RequestRecord(index=1), attempt, None)
        assert attempt.reused
        assert srv.dropped == 1

    with_client(body, stale_after_s=STALE_S)


def test_a_request_failed_by_a_stale_connection_is_resent_and_succeeds() -> None:
    async def body(srv: FaultServer, client: Sender) -> tuple[RequestRecord, RequestRecord, int]:
        first = await send(client)
        await asyncio.sleep(IDLE_S)
        before = client.clock.now_ns() - client.t0_ns
        second = await send(client)
        assert second.send_ns is not None and second.send_ns >= before
        return first, second, srv.dropped

    first, second, dropped = with_client(body, stale_after_s=STALE_S)
    assert_full_reply(first)
    assert_full_reply(second)
    assert dropped == 1


def test_the_resend_is_counted_and_happens_once() -> None:
    async def body(srv: FaultServer, client: Sender) -> tuple[int, int, int]:
        for _ in range(3):
            assert (await send(client)).ok
            await asyncio.sleep(IDLE_S)
        return client.resent, srv.dropped, srv.served["normal"]

    resent, dropped, served = with_client(body, stale_after_s=STALE_S)
    # the 2nd found the 1st's connection stale and was resent on a connection of its own,
    # closed after it; so the 3rd opened a new one: one resend, and no request twice
    assert (resent, dropped, served) == (1, 1, 3)


def test_a_server_that_closes_idle_connections_itself_needs_no_resend() -> None:
    """aiohttp's server closes idle connections at its keep-alive timeout: the client
    sees the close before it sends, and opens a new connection."""

    async def body(srv: FaultServer, client: Sender) -> tuple[bool, bool, int]:
        first = await send(client)
        await asyncio.sleep(IDLE_S)
        second = await send(client)
        return first.ok, second.ok, client.resent

    assert with_client(body, keepalive_s=0.05) == (True, True, 0)


def test_a_resent_request_that_fails_again_says_so() -> None:
    async def body(srv: FaultServer, client: Sender) -> tuple[RequestRecord, int, int]:
        assert (await send(client)).ok  # a pooled connection
        r = await send(client)  # hangs up, and again when resent
        return r, client.resent, srv.served["hangup"]

    r, resent, hangups = with_client(body, "cycle:normal,hangup,hangup")
    assert (resent, hangups) == (1, 2)
    assert r.error_kind is not None and r.error_kind.value == "disconnect"
    assert r.error == (
        "the server closed the connection before responding (also when sent again on a new "
        "connection): ServerDisconnectedError: Server disconnected"
    )
    assert (r.status, r.ttfb_ns, r.end_ns, r.content_ns) == (None, None, None, [])


def test_a_failure_on_a_new_connection_is_not_resent() -> None:
    async def body(srv: FaultServer, client: Sender) -> tuple[RequestRecord, int, int]:
        r = await send(client)
        return r, client.resent, srv.served["hangup"]

    r, resent, hangups = with_client(body, "hangup")
    assert (resent, hangups) == (0, 1)
    assert r.error == "the server closed the connection before responding: ServerDisconnectedError: Server disconnected"


def test_a_failure_after_the_response_began_is_not_resent() -> None:
    async def body(srv: FaultServer, client: Sender) -> tuple[RequestRecord, int, int]:
        assert (await send(client)).ok
        r = await send(client)
        return r, client.resent, srv.served["disconnect"]

    r, resent, served = with_client(body, "cycle:normal,disconnect")
    assert (resent, served) == (0, 1)
    assert r.status == 200 and r.error is not None and r.error.startswith("connection closed mid-response: ")


def test_a_run_with_idle_gaps_past_the_servers_keep_alive_fails_no_request() -> None:
    """An open loop whose requests are further apart than the server keeps idle
    connections: every request reuses a stale connection or opens a new one, and none
    fails."""
    cfg = BenchConfig(
        load=LoadConfig(schedule=OpenLoop(1 / IDLE_S, arrival="constant"), num_requests=4),
        model="normal", timeout_s=10.0, preflight=False, http_client=STACK,
    )

    async def body(srv: FaultServer) -> tuple[Any, int]:
        return await bench_async(cfg, srv.url), srv.dropped

    async def main() -> tuple[Any, int]:
        async with FaultServer(stale_after_s=STALE_S) as srv:
            return await body(srv)

    result, dropped = asyncio.run(main())
    assert result.summary.counts.completed == 4
    assert result.summary.counts.failed == 0
    assert dropped >= 1  # the fault did happen during the run
