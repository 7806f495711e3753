"""The multi-process executor: the same dispatcher and load policy as ``load.http``, with
the requests sent by worker processes, each with its own event loop and connections.

One Python process saturates its core at a few hundred concurrent streams, and then the
latency it reports includes its own delay. Here the parent process keeps the policy
(what is sent when: the aggregate is exactly the requested arrival process, and a
closed loop's users are served by whichever worker has the fewest requests in flight;
a session's turns stay on one worker) and the run's records; the workers do the
per-chunk work (HTTP, SSE parsing, timestamps). They talk over a Unix socket, one
length-prefixed pickle per message:

- parent → worker: ``("t0", t0_ns)`` once, then ``("send", index, spec, record, text)``
  per request, ``("stop",)`` to cancel what is in flight and finish;
- worker → parent: ``("ready", number)`` once its connections are warm, ``("done",
  index, record, text)`` per request, ``("stopped", load)`` with its loop lag and CPU
  (``load.monitor``).

A worker whose socket ends without ``stopped`` died (killed, or crashed): the parent
records each request it held as cancelled, saying so, sends it nothing more, and stops
the run (``Outcome.cause``); the summary says which worker died (``Outcome.warnings``).

Times are on the machine's monotonic clock, shared by the processes, relative to the
parent's ``t0``. Workers ignore Ctrl-C (the terminal sends it to every process of the
group): the parent stops them, and every record they hold comes back, cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import pickle
import signal
import struct
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferlab._clock import Clock, WallClock
from inferlab._errors import InferlabError
from inferlab._loop import run as run_loop
from inferlab.load.http import (
    MAX_WARM_CONNECTIONS,
    Dispatcher,
    OnRecord,
    Outcome,
    dispatch,
    open_client,
)
from inferlab.load.monitor import LoopMonitor
from inferlab.load.policy import Policy, Send
from inferlab.results.clientload import ProcessLoad
from inferlab.results.records import ErrorKind, RequestRecord

if TYPE_CHECKING:  # (the client, and aiohttp, load in the worker that sends)
    from inferlab.client.http import Endpoint

#: How long worker processes may take to start and warm their connections.
START_TIMEOUT_S = 60.0
#: How long stopped workers may take to hand back their cancelled records.
STOP_TIMEOUT_S = 10.0
_LENGTH = struct.Struct("!I")


async def _read(reader: asyncio.StreamReader) -> Any:
    """One message, or ``None`` at the end of the stream."""
    try:
        head = await reader.readexactly(_LENGTH.size)
        return pickle.loads(await reader.readexactly(_LENGTH.unpack(head)[0]))
    except (asyncio.IncompleteReadError, ConnectionError):  # (a worker killed: reset)
        return None


def _write(writer: asyncio.StreamWriter, msg: tuple[Any, ...]) -> None:
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    writer.write(_LENGTH.pack(len(data)) + data)


def _tell(conn: _Conn, msg: tuple[Any, ...]) -> None:
    """``msg`` to a worker that may have died: then nothing (uvloop raises
    ``RuntimeError`` on a closed transport; its end of the socket says the rest)."""
    with contextlib.suppress(ConnectionError, RuntimeError):
        _write(conn.writer, msg)


async def run_workers(
    endpoint: Endpoint,
    policy: Policy,
    clock: Clock,
    *,
    workers: int,
    warm_connections: int = 1,
    on_record: OnRecord | None = None,
    stop: asyncio.Event | None = None,
    http_client: str = "aiohttp",
) -> Outcome:
    """Run ``policy`` against ``endpoint`` with ``workers`` worker processes; return
    every record, as ``load.http.run_http`` does (each worker sends with the HTTP stack
    ``http_client``). ``InferlabError`` if the workers cannot be started."""
    if workers < 1:
        raise ValueError("workers must be at least 1")
    with tempfile.TemporaryDirectory(prefix="inferlab-") as tmp:
        path = str(Path(tmp) / "workers.sock")
        context = multiprocessing.get_context("spawn")  # (no fork of a running event loop)
        warm_each = -(-min(warm_connections, MAX_WARM_CONNECTIONS) // workers)
        procs = [
            context.Process(target=_worker_main, args=(path, endpoint, warm_each, n, http_client), daemon=True)
            for n in range(1, workers + 1)
        ]
        result = Outcome()
        dispatcher = Dispatcher(policy, clock, result, on_record)
        pool = _Pool(procs, dispatcher)
        server = await asyncio.start_unix_server(pool.connected, path)
        for p in procs:
            p.start()
        try:
            await pool.wait_ready()
            result.t0_ns = clock.now_ns()
            for conn in pool.conns:
                _tell(conn, ("t0", result.t0_ns))
            monitor = LoopMonitor(clock, "parent")  # (it dispatches every send)
            monitor.start()
            try:
                await dispatch(dispatcher, pool, stop)
            finally:
                result.client.append(await monitor.stop())
        finally:
            await pool.close()
            result.client += sorted(pool.loads, key=lambda load: int(load.role.split()[-1]))
            result.warnings += pool.deaths
            server.close()
            for p in procs:
                p.join(timeout=STOP_TIMEOUT_S)
                if p.is_alive():
                    p.kill()
                    p.join()
    return result


class _Conn:
    """The parent's end of one worker's socket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        self.reader = reader
        self.writer = writer
        self.number = number  # its worker's (from 1)
        self.pending: dict[int, tuple[Send, RequestRecord]] = {}  # requests it holds, by index
        self.stopped = asyncio.Event()  # (also set when it died)


class _Pool:
    """The workers, as the dispatcher's ``Launcher``."""

    def __init__(self, procs: Sequence[multiprocessing.process.BaseProcess], dispatcher: Dispatcher) -> None:
        self.procs = procs
        self.size = len(procs)
        self.conns: list[_Conn] = []
        self.dispatcher = dispatcher
        self.loads: list[ProcessLoad] = []  # each worker's, as it stopped
        self.deaths: list[str] = []  # a sentence for each worker that died
        self._all_ready = asyncio.Event()
        self._readers: list[asyncio.Task[None]] = []

    async def connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        msg = await _read(reader)
        if not (isinstance(msg, tuple) and len(msg) == 2 and msg[0] == "ready"):
            writer.close()
            return
        conn = _Conn(reader, writer, msg[1])
        self.conns.append(conn)
        if len(self.conns) == self.size:
            self._all_ready.set()
        self._readers.append(asyncio.ensure_future(self._receive(conn)))

    async def wait_ready(self) -> None:
        async def watch() -> None:  # a worker that dies on start (a bad import, say)
            while not self._all_ready.is_set():
                if any(p.exitcode is not None for p in self.procs):
                    raise InferlabError("a load worker process exited while starting")
                await asyncio.sleep(0.05)

        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await asyncio.gather(self._all_ready.wait(), watch())
        except TimeoutError:
            raise InferlabError(f"the load worker processes did not start within {START_TIMEOUT_S:g} s") from None

    def launch(self, send: Send, record: RequestRecord, text: list[str] | None) -> None:
        spec = send.spec
        # what the worker fills in first, so that a record it never sends back has it too
        record.session, record.turn = spec.session, spec.turn
        record.prefix_group, record.prefix_tokens = spec.prefix_group, spec.prefix_tokens
        record.hash_ids = list(spec.hash_ids) or None
        record.requested_input_tokens, record.requested_output_tokens = spec.input_tokens, spec.max_tokens
        if spec.session is not None:  # a session's turns stay on one worker
            conn: _Conn | None = self.conns[spec.session % self.size]
        else:  # (never a worker that died: the run is stopping, see ``_receive``)
            conn = min((c for c in self.conns if not c.stopped.is_set()), key=lambda c: len(c.pending), default=None)
        if conn is None or conn.stopped.is_set():
            _lost(record, f"not sent: load worker {conn.number} had died" if conn else "not sent: every load worker had died")
            self.dispatcher.cancelled(record)
            return
        conn.pending[send.index] = send, record
        _tell(conn, ("send", send.index, spec, record, text is not None))

    async def _receive(self, conn: _Conn) -> None:
        while True:
            msg = await _read(conn.reader)
            if msg is None:
                break
            if msg[0] == "done":
                _, index, record, text = msg
                send, _ = conn.pending.pop(index)
                if conn.stopped.is_set() or self._stopping:
                    self.dispatcher.cancelled(record)
                else:
                    self.dispatcher.finished(send, record, text)
            elif msg[0] == "stopped":
                self.loads.append(msg[1])
                conn.stopped.set()
                return
        # its socket ended without "stopped": the worker died (killed, or crashed)
        conn.stopped.set()
        died = f"load worker {conn.number} died ({await self._exit(conn.number)})"
        held = sorted(conn.pending.items())
        conn.pending.clear()
        for _, (_, record) in held:
            _lost(record, f"{died} while this request was in flight")
            self.dispatcher.cancelled(record)
        lost = "no request" if not held else f"{len(held)} request{'' if len(held) == 1 else 's'} (recorded as cancelled)"
        self.deaths.append(f"{died} with {lost} in flight; its loop lag and CPU died with it (not in client.processes)")
        if not self._stopping:  # (no more sends to it, and the run stops: Outcome.cause)
            self.dispatcher.fail(InferlabError(f"{died}: the run stopped; the summary covers what was measured"))

    async def _exit(self, number: int) -> str:
        """How worker ``number`` ended, once it has (its socket may close first)."""
        proc = self.procs[number - 1]
        await asyncio.to_thread(proc.join, STOP_TIMEOUT_S)
        code = proc.exitcode
        if code is None:
            return "its socket closed"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
            return f"killed by signal {-code}"
        return f"exit status {code}"

    _stopping = False

    async def cancel_all(self) -> None:
        self._stopping = True
        for conn in self.conns:
            if not conn.stopped.is_set():
                _tell(conn, ("stop",))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await asyncio.gather(*(c.stopped.wait() for c in self.conns))

    async def close(self) -> None:
        self._stopping = True  # (a worker that dies now ends nothing: the run has)
        for conn in self.conns:
            if not conn.stopped.is_set():
                _tell(conn, ("stop",))
        for conn in self.conns:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await conn.stopped.wait()
            conn.writer.close()
        for task in self._readers:
            task.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)


def _lost(record: RequestRecord, why: str) -> None:
    """Mark ``record``, which its worker never sent back, cancelled for ``why``."""
    record.error_kind, record.error, record.end_ns = ErrorKind.CANCELLED, why, None


def _worker_main(path: str, endpoint: Endpoint, warm: int, number: int, http_client: str) -> None:
    """Worker ``number`` (from 1): sends what the parent says, reports each record back."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the workers
    with contextlib.suppress(KeyboardInterrupt):
        run_loop(_worker(path, endpoint, warm, number, http_client))
    os._exit(0)  # (nothing left to flush: the parent has every record)


async def _worker(path: str, endpoint: Endpoint, warm: int, number: int, http_client: str) -> None:
    reader, writer = await asyncio.open_unix_connection(path)
    clock = WallClock()
    async with open_client(endpoint, clock, http_client, warm) as client:
        _write(writer, ("ready", number))
        first = await _read(reader)
        if first is None:
            return
        client.t0_ns = first[1]
        monitor = LoopMonitor(clock, f"worker {number}")
        monitor.start()
        tasks: set[asyncio.Task[None]] = set()

        async def one(index: int, spec: Any, record: RequestRecord, want_text: bool) -> None:
            text: list[str] | None = [] if want_text else None
            try:
                await client.send(spec, record, text)
            finally:  # (also cancelled: the record says so)
                _write(writer, ("done", index, record, text))

        while True:
            msg = await _read(reader)
            if msg is None or msg[0] == "stop":
                break
            _, index, spec, record, want_text = msg
            task = asyncio.ensure_future(one(index, spec, record, want_text))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        _write(writer, ("stopped", await monitor.stop()))
        await writer.drain()
        writer.close()
