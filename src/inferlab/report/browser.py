"""Headless Chromium, driven over its DevTools protocol: open a page offline, say what it
asked the network for and what it logged, and photograph elements.

Used by ``inferlab report --png`` (each plot as a PNG) and by the report's tests (the
page renders, every plot is drawn, no console error, no request but the file itself).
The browser is ``$INFERLAB_CHROMIUM``, else the first of ``chromium``,
``chromium-browser``, ``google-chrome`` on PATH (Debian: ``apt-get install chromium``).
It runs with a fresh profile in a temporary folder and every host unresolvable, and is
closed afterwards.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferlab._errors import InferlabError, UsageError

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
START_TIMEOUT_S = 30.0
PAGE_TIMEOUT_S = 30.0


def find_browser() -> str | None:
    """The Chromium to use, or None."""
    chosen = os.environ.get("INFERLAB_CHROMIUM")
    if chosen:
        return chosen if shutil.which(chosen) or os.path.exists(chosen) else None
    return next((path for b in BROWSERS if (path := shutil.which(b))), None)


@dataclass
class PageLoad:
    """What opening a page did: every URL requested, console messages of level error or
    warning, uncaught exceptions, and the value of each expression evaluated."""

    requests: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)
    shots: dict[str, bytes] = field(default_factory=dict)
    load_ms: float | None = None  # navigation start → load event, as the page measured it


class _Session:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.loaded = asyncio.Event()

    async def reader(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self.pending:
                fut = self.pending.pop(data["id"])
                if "error" in data:
                    fut.set_exception(InferlabError(f"chromium: {data['error'].get('message')}"))
                else:
                    fut.set_result(data.get("result", {}))
            elif "method" in data:
                self.events.append(data)
                if data["method"] == "Page.loadEventFired":
                    self.loaded.set()

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        i = next(self.ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[i] = fut
        await self.ws.send_str(json.dumps({"id": i, "method": method, "params": params or {}}))
        return await asyncio.wait_for(fut, PAGE_TIMEOUT_S)


def _start(browser: str, profile: str, width: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
         "--disable-extensions", "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={profile}",
         "--remote-debugging-port=0", f"--window-size={width},900", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


async def _connect(proc: subprocess.Popen[bytes], port_file: Path, uri: str, expressions: Sequence[str], shoot: Sequence[str]) -> PageLoad:
    import aiohttp

    for _ in range(int(START_TIMEOUT_S * 20)):
        if await asyncio.to_thread(lambda: port_file.exists() and port_file.read_text().count("\n") >= 1):
            break
        if proc.poll() is not None:
            raise InferlabError(f"chromium exited ({proc.returncode}) before it was ready")
        await asyncio.sleep(0.05)
    else:
        raise InferlabError(f"chromium did not start its DevTools endpoint in {START_TIMEOUT_S:.0f} s")
    port = int((await asyncio.to_thread(port_file.read_text)).split()[0])
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
            targets = await resp.json()
        ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
        async with http.ws_connect(ws_url, max_msg_size=0) as ws:
            s = _Session(ws)
            reader = asyncio.create_task(s.reader())
            try:
                return await _drive(s, uri, expressions, shoot)
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader


async def _drive(s: _Session, uri: str, expressions: Sequence[str], shoot: Sequence[str]) -> PageLoad:
    for domain in ("Page", "Network", "Runtime", "Log"):
        await s.call(f"{domain}.enable")
    s.events.clear()
    await s.call("Page.navigate", {"url": uri})
    await asyncio.wait_for(s.loaded.wait(), PAGE_TIMEOUT_S)
    out = PageLoad()
    timing = await s.call("Runtime.evaluate", {"expression": "(() => { const n = performance.getEntriesByType('navigation')[0]; return n ? n.loadEventStart - n.startTime : null })()", "returnByValue": True})
    out.load_ms = timing.get("result", {}).get("value")
    for e in expressions:
        r = await s.call("Runtime.evaluate", {"expression": e, "returnByValue": True, "awaitPromise": True})
        out.values.append(r.get("result", {}).get("value"))
    for element_id in shoot:
        box = await s.call("Runtime.evaluate", {
            "expression": f"(() => {{ const r = document.getElementById({json.dumps(element_id)}).getBoundingClientRect(); "
                          "return [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height] })()",
            "returnByValue": True})
        x, y, w, h = box["result"]["value"]
        shot = await s.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                       "clip": {"x": x, "y": y, "width": w, "height": h, "scale": 1}})
        out.shots[element_id] = base64.b64decode(shot["data"])
    for ev in s.events:
        method, params = ev["method"], ev.get("params", {})
        if method == "Network.requestWillBeSent":
            out.requests.append(params["request"]["url"])
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
            out.console_errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            out.exceptions.append(str(params.get("exceptionDetails", {}).get("text")))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
            out.console_errors.append(str(params["entry"].get("text")))
    return out


def open_page(page: Path, expressions: Sequence[str] = (), shoot: Sequence[str] = (), *, browser: str | None = None, width: int = 1400) -> PageLoad:
    """Open ``page`` (a local file) in headless Chromium, evaluate ``expressions`` once it
    has loaded (a promise is awaited), and photograph the elements with the ids in ``shoot``. ``UsageError``
    when no Chromium is found; ``InferlabError`` when it fails."""
    chosen = browser or find_browser()
    if chosen is None:
        raise UsageError("no Chromium found (set $INFERLAB_CHROMIUM, or install one: apt-get install chromium)")
    import aiohttp

    with tempfile.TemporaryDirectory(prefix="inferlab-chromium-", ignore_cleanup_errors=True) as profile:
        proc = _start(chosen, profile, width)
        try:
            return asyncio.run(_connect(proc, Path(profile) / "DevToolsActivePort", page.resolve().as_uri(), expressions, shoot))
        except (OSError, ValueError, StopIteration, TimeoutError, aiohttp.ClientError) as e:
            raise InferlabError(f"chromium ({chosen}): {e!r}") from e
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def screenshot_figures(page: Path, out_dir: Path, ids: Sequence[str]) -> list[Path]:
    """Each element of ``ids`` in ``page`` as ``out_dir/<id>.png``; the files written."""
    load = open_page(page, shoot=ids)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for element_id, data in load.shots.items():
            path = out_dir / f"{element_id}.png"
            path.write_bytes(data)
            written.append(path)
    except OSError as e:
        raise UsageError(f"cannot write PNGs to {out_dir}: {e.strerror or e}") from e
    return written
