"""Running the simulated server: on a port (``start_site``), in a child process
(``ChildServer``, what ``bench`` starts by default) or in a thread (``EmbeddedServer``)."""

from __future__ import annotations

import asyncio
import select
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Self

from aiohttp import web

from inferlab._errors import InferlabError
from inferlab._serverlog import quiet_server_logger
from inferlab.sim.server.app import ServerConfig, SimServer


async def start_site(server: SimServer, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving; return the runner and the bound port (``port=0`` picks a free one)."""
    # handler_cancellation: a client that disconnects aborts its request (as vLLM does)
    # instead of leaving it queued in the engine. auto_decompress off: like vLLM's server,
    # the body is read as sent, whatever its Content-Encoding says (a body that is not
    # JSON is a 400), and no client can make the server inflate a compressed bomb.
    runner = web.AppRunner(
        server.app,
        access_log=None,
        handle_signals=False,
        handler_cancellation=True,
        auto_decompress=False,
        logger=quiet_server_logger(),
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    sockets = runner.addresses
    bound = sockets[0][1] if sockets else port
    return runner, int(bound)


class ChildServer:
    """``inferlab sim serve`` in a child process on a free loopback port: what ``bench``
    starts when no ``--url`` is given. A separate process keeps the server's timing off
    the client's interpreter lock (bench/README.md has the numbers). ``url`` is its base;
    ``close()`` stops it."""

    def __init__(self, args: Sequence[str] = (), host: str = "127.0.0.1", timeout_s: float = 60.0) -> None:
        cmd = [sys.executable, "-m", "inferlab", "sim", "serve", "--host", host, "--port", "0", "--announce", *args]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout_s)
        line = self._proc.stdout.readline() if ready else ""
        if not line.startswith("http://"):
            self.close()
            err = (self._proc.stderr.read() if self._proc.stderr else "").strip().splitlines()
            reason = err[-1].removeprefix("inferlab: error: ") if err else "no answer"
            raise InferlabError(f"the simulated server did not start: {reason}")
        self.url = line.strip()

    @property
    def pid(self) -> int:
        """The server process's id."""
        return self._proc.pid

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def __enter__(self) -> ChildServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EmbeddedServer:
    """The simulated server on its own event loop in a daemon thread of this process, on
    a free loopback port (fast to start: tests and library use). ``url`` is its base;
    ``close()`` stops it."""

    def __init__(self, config: ServerConfig, host: str = "127.0.0.1") -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.server = SimServer(config)
        self.port = 0
        self._thread = threading.Thread(target=self._main, args=(host,), name="inferlab-sim", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=30)
        if self._error is not None:
            raise self._error
        self.url = f"http://{host}:{self.port}"

    def _main(self, host: str) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._runner, self.port = self._loop.run_until_complete(start_site(self.server, host, 0))
        except BaseException as e:  # re-raised in the caller's thread
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def close(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
