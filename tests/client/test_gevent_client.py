"""The gevent client (``client.gevent_http``: what Locust's users send with) against the
same misbehaving server as the asyncio client: for every behaviour both must fill the
same record, but for the times themselves (which exist, and in what order, must agree).

gevent is imported, never monkey-patched: the client uses gevent's own sockets, and the
server runs on asyncio in a thread of its own."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from faultserver import BEHAVIOURS, FaultServer

from inferlab._clock import WallClock
from inferlab.client.exchange import request_body
from inferlab.client.http import Client, Endpoint, session_trace
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.workload.spec import RequestSpec

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gevent") is None, reason="the locust extra is not installed")

IDLE_S = 0.5
SPEC = RequestSpec(prompt="hi", max_tokens=5)
#: Where the two stacks word a failure of the connection differently (the kind agrees).
OWN_WORDS = {ErrorKind.DISCONNECT, ErrorKind.IDLE_TIMEOUT, ErrorKind.CONNECT, ErrorKind.TIMEOUT}


class ServerThread:
    """A ``FaultServer`` on an event loop in a thread of its own."""

    def __init__(self, **kw: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = FaultServer(**kw)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> FaultServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.__aenter__(), self.loop).result(10)
        return self.server

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.__aexit__(None, None, None), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def server() -> Iterator[FaultServer]:
    with ServerThread(stall_s=2.0, slow_chunks=20, slow_gap_s=0.01) as srv:
        yield srv


def via_asyncio(url: str, model: str) -> RequestRecord:
    async def main() -> RequestRecord:
        endpoint = Endpoint(base_url=url, model=model, idle_timeout_s=IDLE_S)
        clock = WallClock()
        record = RequestRecord(index=0)
        async with aiohttp.ClientSession(trace_configs=[session_trace()]) as session:
            await Client(endpoint, clock, session, clock.now_ns()).send(SPEC, record)
        return record

    return asyncio.run(main())


def via_gevent(url: str, model: str) -> RequestRecord:
    from inferlab.client.gevent_http import GeventClient

    endpoint = Endpoint(base_url=url, model=model, idle_timeout_s=IDLE_S)
    clock = WallClock()
    t0 = clock.now_ns()
    client = GeventClient(endpoint, lambda: clock.now_ns() - t0)
    record = RequestRecord(index=0)
    record.requested_input_tokens, record.requested_output_tokens = SPEC.input_tokens, SPEC.max_tokens
    try:
        client.send(json.dumps(request_body(endpoint, SPEC)).encode(), record)
    finally:
        client.close()
    return record


def comparable(r: RequestRecord) -> dict[str, Any]:
    """The record but for its times: which of them exist, and how many chunks."""
    d = r.to_json()
    for k in ("send_ns", "ttfb_ns", "end_ns", "intended_send_ns", "connect_wait_ns"):
        d[k] = d[k] is not None
    d["content_ns"] = len(r.content_ns)
    if r.error_kind in OWN_WORDS:
        d["error"] = None
    return d


def ordered(r: RequestRecord) -> bool:
    stamps = [t for t in (r.send_ns, r.ttfb_ns, *r.content_ns, r.end_ns) if t is not None]
    return stamps == sorted(stamps)


@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
def test_the_gevent_client_records_what_the_asyncio_client_records(server: FaultServer, behaviour: str) -> None:
    url = server.url + "/v1"
    a, g = via_asyncio(url, behaviour), via_gevent(url, behaviour)
    assert comparable(g) == comparable(a)
    assert ordered(g) and ordered(a)


# --- stale keep-alive connections (as tests/client/test_keepalive.py for client.http) ------

STALE_S = 0.1


@pytest.fixture()
def stale_server() -> Iterator[FaultServer]:
    with ServerThread(stale_after_s=STALE_S) as srv:
        yield srv


def client_for(srv: FaultServer, model: str) -> Any:
    from inferlab.client.gevent_http import GeventClient

    endpoint = Endpoint(base_url=srv.url + "/v1", model=model, idle_timeout_s=5.0)
    clock = WallClock()
    return GeventClient(endpoint, clock.now_ns)


def send(client: Any) -> RequestRecord:
    record = RequestRecord(index=0)
    client.send(json.dumps(request_body(client.endpoint, SPEC)).encode(), record)
    return record


def test_a_request_failed_by_a_stale_connection_is_resent_once_and_succeeds(stale_server: FaultServer) -> None:
    import gevent

    client = client_for(stale_server, "normal")
    try:
        for _ in range(3):
            assert send(client).ok
            gevent.sleep(STALE_S * 3)
    finally:
        client.close()
    # the 2nd and 3rd each found their connection stale: dropped unanswered, sent again
    assert (client.resent, stale_server.dropped, stale_server.served["normal"]) == (2, 2, 3)


def test_a_resent_request_that_fails_again_says_so(stale_server: FaultServer) -> None:
    client = client_for(stale_server, "cycle:normal,hangup,hangup")
    try:
        assert send(client).ok  # a kept-alive connection
        r = send(client)  # hangs up, and again when sent on a new connection
    finally:
        client.close()
    assert client.resent == 1 and stale_server.served["hangup"] == 2
    assert r.error_kind is ErrorKind.DISCONNECT and r.status is None
    assert r.error is not None and r.error.startswith(
        "the server closed the connection before responding (also when sent again on a new connection)"
    )


def test_a_failure_on_a_new_connection_is_not_resent(stale_server: FaultServer) -> None:
    client = client_for(stale_server, "hangup")
    try:
        r = send(client)
    finally:
        client.close()
    assert (client.resent, stale_server.served["hangup"]) == (0, 1)
    assert r.error is not None and r.error.startswith("the server closed the connection before responding: ")
