"""Reading a server's Prometheus ``/metrics`` around and during a run.

``MetricsSampler`` reads the page once before the run (``start``), every ``interval_s``
while it runs, and once after (``stop``), and gives back the run's ``ServerMetrics``
(``results.telemetry``) and the time series of every page read. A server without the
page (404, not Prometheus text, no answer) is no error: the telemetry says "not
available" and why. Where the page is inferlab gateway's own, no engine's, it is read
before and after the run for the gateway's queue (``gateway_queue``). Given pages of
their own (``bench --metrics-url``: the engines behind a gateway, a separate metrics
port), the sampler reads those instead, every one each time, as one server's (put
together by ``results.telemetry.merge``; one page under two names is refused first,
``one_name_each``), and the
API URL's page only before and after the run, for a gateway's queue; ``check_pages``
refuses such a page that does not answer before the run. Reading never raises and never
slows the run down: one request at a time, a short timeout, on a session of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from inferlab._clock import NS_PER_S, Clock
from inferlab._errors import ServerUnreachableError
from inferlab.results.telemetry import (
    GATEWAY_QUEUE_WAIT,
    GATEWAY_REJECTIONS,
    GatewayQueue,
    Samples,
    ServerMetrics,
    Snapshot,
    gateway_queue,
    merge,
    not_available,
    parse_prometheus,
    server_metrics,
    server_names,
    snapshot,
)

if TYPE_CHECKING:
    import aiohttp

#: Seconds between pages read during a run.
INTERVAL_S = 1.0
#: Seconds one read may take.
TIMEOUT_S = 5.0
#: What the names of inferlab gateway's own metrics begin with (``gateway.metrics``).
GATEWAY_METRICS = "inferlab_gateway_"


def metrics_url(api_base: str) -> str:
    """``/metrics`` beside the API root (``http://h:8000/v1`` → ``http://h:8000/metrics``)."""
    return api_base.rstrip("/").removesuffix("/v1") + "/metrics"


def page_url(url: str) -> str:
    """A metrics page's address as given (``--metrics-url``), or ValueError: http(s), a
    host and the page's path (``http://engine:8000/metrics``, not ``http://engine:8000``)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018  (read to check it: out of range or not a number)
    except ValueError as e:
        raise ValueError(f"--metrics-url {url!r}: {e}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise ValueError(f"--metrics-url {url!r}: not an http(s) URL with a host (e.g. http://engine:8000/metrics)")
    if parts.path.strip("/") == "":
        raise ValueError(f"--metrics-url {url!r}: no path; give the page itself (e.g. {url.rstrip('/')}/metrics)")
    return url


async def check_pages(urls: Sequence[str], headers: dict[str, str] | None = None) -> None:
    """``ServerUnreachableError`` (one line) for the first of the pages the user named
    (checked by ``page_url`` and ``one_name_each``) that does not answer, or answers
    with nothing inferlab reads (not Prometheus text, no engine's names, inferlab
    gateway's own page): read as "not available", the run's server metrics would say
    nothing of the server the user pointed at."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        for url in urls:
            snap = await scrape(session, url, headers)
            if isinstance(snap, str):
                raise ServerUnreachableError(f"--metrics-url {url}: {snap.removeprefix(f'GET {url}: ')}")


def one_name_each(urls: Sequence[str]) -> None:
    """ValueError for two pages (``page_url``'s) at one address: the same scheme, port,
    path and query on hosts whose addresses (as this machine resolves them) meet, one
    name written two ways or one of them named by its address or as ``localhost``
    (``localhost`` and ``127.0.0.1``: one server's counts would be added twice). Two
    names of one address are not refused: a server that routes by name (an ingress's
    virtual hosts) serves each its own page. A name that does not resolve is left to the
    read that follows, which says so."""
    if len(urls) < 2:  # (nothing to resolve)
        return
    seen: list[tuple[str, tuple[str, int, str, str], set[str], bool, str]] = []
    for url in urls:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        where = (parts.scheme, port, parts.path.rstrip("/") or "/", parts.query)
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            continue
        addresses = {_plain(str(info[4][0])) for info in infos}
        # (this machine, as a destination: its loopback of the same family too)
        addresses |= {"127.0.0.1"} if "0.0.0.0" in addresses else set()
        addresses |= {"::1"} if "::" in addresses else set()
        literal = host == "localhost" or _is_address(host)
        name = host.lower().rstrip(".")
        for other, other_where, other_addresses, other_literal, other_name in seen:
            if where == other_where and addresses & other_addresses and (literal or other_literal or name == other_name):
                raise ValueError(
                    f"--metrics-url {url} is the page of --metrics-url {other} (both {min(addresses & other_addresses)} "
                    f"port {port}): one server named twice would have its counts added twice; name each server once"
                )
        seen.append((url, where, addresses, literal, name))


def _is_address(host: str) -> bool:
    """Whether ``host`` is an address, not a name (``127.1`` too, as the resolver reads it)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not host.replace(".", "").isdigit():
            return False
        try:
            socket.inet_aton(host)
        except OSError:
            return False
    return True


def _plain(address: str) -> str:
    """An address as written, IPv4 for an IPv4-mapped IPv6 one (``::ffff:127.0.0.1``)."""
    try:
        mapped = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return address
    v4 = mapped.ipv4_mapped if isinstance(mapped, ipaddress.IPv6Address) else None
    return str(v4) if v4 is not None else address


async def scrape(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None, timeout_s: float = TIMEOUT_S,
    only: Sequence[str] = (),
) -> Snapshot | str:
    """One page in our names, or why there is none (a one-line reason). ``only``: the
    names of ours to read (default: every one); the rest of the page is skipped unread."""
    text = await _page(session, url, headers, timeout_s)
    return str(text) if isinstance(text, Failed) else _snapshot(url, text, only)


class Failed(str):
    """Why a page could not be read (a one-line reason), told apart from a page's text."""


async def _page(session: aiohttp.ClientSession, url: str, headers: dict[str, str] | None, timeout_s: float) -> str:
    """The page's text, or why there is none (a ``Failed``)."""
    import aiohttp

    try:
        async with session.get(url, headers=headers or {}, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                return Failed(f"GET {url}: HTTP {resp.status}")
            return await resp.text(errors="replace")
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        return Failed(f"GET {url}: {type(e).__name__}: {e}".strip().rstrip(":"))


def _snapshot(url: str, text: str, only: Sequence[str] = ()) -> Snapshot | str:
    """One page's text in our names, or why it has none of them."""
    snap = snapshot(parse_prometheus(text, server_names(only)))
    if not snap.values and not snap.histograms:
        if only:
            return f"GET {url}: no {', '.join(only)} (by vLLM's, SGLang's or llama.cpp's names)"
        if GATEWAY_METRICS in text:  # (its own page: the engines behind it are not on it)
            return (f"GET {url}: inferlab gateway's own metrics ({GATEWAY_METRICS}*), not an engine's: the engines "
                    "behind it are not read (bench --metrics-url reads theirs); its queue's wait is the summary's "
                    "gateway_queue")
        return f"GET {url}: no metric inferlab knows (not vLLM's, SGLang's or llama.cpp's names)"
    return snap


class MetricsSampler:
    """The server's ``/metrics`` before, during and after a run (see the module)."""

    def __init__(self, api_base: str, clock: Clock, headers: dict[str, str] | None = None, interval_s: float = INTERVAL_S,
                 pages: Sequence[str] = ()) -> None:
        self.own = tuple(pages)  # pages of their own (``--metrics-url``); empty: the API URL's
        self.urls = self.own or (metrics_url(api_base),)  # the pages read as one server's
        self.api_page = metrics_url(api_base)  # (with pages of their own: read for a gateway's queue)
        self.clock = clock
        self.headers = headers or {}
        self.interval_s = interval_s
        self.series: list[dict[str, Any]] = []  # every page read: {"t_s": since start, ...our names}
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._before: Snapshot | str = "not read"
        self._during: list[Snapshot] = []
        self._t0_ns = 0
        # inferlab gateway's page before and after the run (its queue: ``gateway_queue``)
        self._gateway: list[Samples] = []
        self._gateway_after: Samples | str = "not read"

    async def start(self) -> None:
        import aiohttp

        self._t0_ns = self.clock.now_ns()
        self._session = aiohttp.ClientSession()
        self._before = await self._read()
        if self.own:
            await self._read_gateway()
        if isinstance(self._before, Snapshot):
            self._task = asyncio.ensure_future(self._sample())

    async def _read(self) -> Snapshot | str:
        """Every page once, as one server's; why not, where one failed (a page missing
        would take its counts off the sum)."""
        assert self._session is not None
        pages: list[Snapshot] = []
        for i, url in enumerate(self.urls):
            text = await _page(self._session, url, self.headers, TIMEOUT_S)
            if isinstance(text, Failed):
                return str(text)
            if not self.own and i == 0:  # (the API URL's page: inferlab gateway's holds its queue)
                self._gateway_page(text)
            page = _snapshot(url, text)
            if isinstance(page, str):
                return page
            pages.append(page)
        snap = merge(pages)
        t_s = (self.clock.now_ns() - self._t0_ns) / NS_PER_S
        self.series.append({"t_s": round(t_s, 3), **snap.to_json()})
        return snap

    def _gateway_page(self, page: str) -> bool:
        """Keep inferlab gateway's queue figures off ``page``, where it is the gateway's."""
        if GATEWAY_METRICS not in page:
            return False
        self._gateway.append(parse_prometheus(page, (GATEWAY_QUEUE_WAIT, GATEWAY_REJECTIONS)))
        return True

    async def _read_gateway(self) -> str:
        """The API URL's page for a gateway's queue (pages of their own given); why none
        was kept (a one-line reason)."""
        assert self._session is not None
        page = await _page(self._session, self.api_page, self.headers, TIMEOUT_S)
        if isinstance(page, Failed):
            return str(page)
        return "" if self._gateway_page(page) else f"GET {self.api_page}: no longer inferlab gateway's page"

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            snap = await self._read()
            if isinstance(snap, Snapshot):
                self._during.append(snap)

    async def stop(self) -> ServerMetrics:
        """Stop sampling, read the page after the run; the run's telemetry."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            if self.own and self._gateway:  # (the gateway's page, read again for its queue)
                why = await self._read_gateway()
                self._gateway_after = f"the page after the run: {why}" if why else self._gateway[-1]
            if isinstance(self._before, str):
                if self._gateway and not self.own:  # (the gateway's page: read again for its queue)
                    read = len(self._gateway)
                    after_page = await self._read()
                    self._gateway_after = self._gateway[-1] if len(self._gateway) > read else (
                        f"the page after the run: {after_page}")
                return not_available(self._before)
            after = await self._read()
            if isinstance(after, str) and self._during:  # (a server gone by the end: what was read is kept)
                last = self.series[-1]["t_s"]
                kept = server_metrics(self._before, self._during[:-1], self._during[-1])
                return dataclasses.replace(kept, reason=f"the page after the run could not be read ({after}): the counters "
                                           f"end at the last page sampled during it, {last:g} s in")
            if isinstance(after, str):
                return not_available(f"after the run: {after}")
            return server_metrics(self._before, self._during, after)
        finally:
            if self._session is not None:
                await self._session.close()
                self._session = None

    def gateway_queue(self) -> GatewayQueue | None:
        """inferlab gateway's queue over the run (``results.telemetry.gateway_queue``),
        once stopped; None where the page before the run was no gateway's."""
        if not self._gateway:
            return None
        if isinstance(self._gateway_after, str):
            return GatewayQueue(False, self._gateway_after)
        return gateway_queue(self._gateway[0], self._gateway_after)
