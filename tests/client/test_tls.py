"""bench against an https server whose certificate the system's CAs do not know (a
private CA, a self-signed server): one line that says what to do, and, done, a whole run
over TLS. The server is the simulated one behind a certificate of a CA made here
(``trustme``); bench runs as a user runs it, in a process of its own, since OpenSSL reads
``SSL_CERT_FILE`` when a client makes its context."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig, SimServer

trustme = pytest.importorskip("trustme", reason="the test extra is not installed")


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The simulated server on https://127.0.0.1:PORT, and its CA's certificate (PEM)."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca_pem = tmp_path_factory.mktemp("tls") / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_pem))
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict[str, object] = {}

    async def start() -> None:
        runner = web.AppRunner(SimServer(ServerConfig(EngineConfig(max_model_len=4096))).app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
        await site.start()
        state["runner"], state["port"] = runner, runner.addresses[0][1]

    def main() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(state["runner"].cleanup())  # type: ignore[attr-defined]
        loop.close()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        yield f"https://127.0.0.1:{state['port']}", ca_pem
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


def bench(url: str, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")} | env
    return subprocess.run(
        [sys.executable, "-m", "inferlab", "bench", "--url", url, "-n", "4", "-c", "2", "--input-tokens", "50",
         "--output-tokens", "3", "--no-history", "-o", str(out)],
        capture_output=True, text=True, timeout=300, env=environ,
    )


def test_an_unknown_certificate_is_one_line_saying_what_to_do(tls_server: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = tls_server
    res = bench(url, tmp_path / "run")
    assert res.returncode == 1, res.stderr
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("inferlab: error:")]
    assert "certificate verify failed" in line and "point SSL_CERT_FILE at that CA's certificate" in line
    assert "Traceback" not in res.stderr


def test_with_its_ca_given_the_whole_run_goes_over_tls(tls_server: tuple[str, Path], tmp_path: Path) -> None:
    url, ca_pem = tls_server
    res = bench(url, tmp_path / "run", SSL_CERT_FILE=str(ca_pem))
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["counts"]["completed"] == 4 and summary["counts"]["failed"] == 0
