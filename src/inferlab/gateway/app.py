"""The gateway's HTTP server (aiohttp): OpenAI-compatible routes in front of the
configured upstreams.

Routes: ``/v1/chat/completions`` and ``/v1/completions`` (streamed or not),
``/v1/models`` (the upstreams' lists merged), ``/health``, ``/metrics``, ``/tokenize``
and ``/detokenize`` (relayed to an upstream serving the model), and
``/inferlab/engine``: the upstreams' answers there when every upstream is ``inferlab sim
serve``, so that a run through the gateway is labelled a prediction (else 404, as for
any route the gateway does not have: a run through it is measured); ``/inferlab/gateway``:
its own setup, whatever the upstreams are, with the software each upstream says it is,
so that a run through it says it was there, in front of what. A generation
request goes through, in order: the client key (401 without a valid one, when keys are
configured), the body (413 over the size limit, 400 for bad JSON or fields, checked as
vLLM checks them), the model (404 if no upstream lists it; 503 if one that did not
answer ``/v1/models`` might serve it), the key's RPM/TPM limits (429), the response
cache, admission (503 when the queue is full or the wait too long), then the upstream,
tried on another one if it fails before answering.

Beside the requests, a task per upstream reads its engine's ``/metrics`` every
``metrics_refresh_s`` (``_watch_engine``): the running and waiting requests it reports
go to the router, which counts the ones the gateway did not send
(``inferlab.gateway.routing``). A read never holds a request up: its own task, its own
session, a timeout; an engine without the page routes by the gateway's counts alone.

No request can reach an address that is not a configured upstream: the path and the
headers the client sends choose nothing; only the body is forwarded, with the
upstream's own key. Every refusal is OpenAI's error body with a 4xx (or 503 for
overload), never a traceback.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from inferlab._clock import NS_PER_S, Clock, WallClock
from inferlab._errors import RunFailedError
from inferlab._serverlog import quiet_server_logger
from inferlab.client.metrics import TIMEOUT_S as METRICS_TIMEOUT_S
from inferlab.client.metrics import scrape
from inferlab.client.serverid import identify_server, llamacpp_settings
from inferlab.gateway.admission import Admission, Rejected, Ticket
from inferlab.gateway.cache import CACHE_HEADER, Entry, ResponseCache, cache_key, cacheable
from inferlab.gateway.config import GatewayConfig, KeyConfig, hash_key
from inferlab.gateway.estimate import (
    UPSTREAM,
    UpstreamTokens,
    count_prompt,
    prompt_counter,
    prompt_of,
)
from inferlab.gateway.metrics import GatewayMetrics, Series
from inferlab.gateway.ratelimit import Charge, Limited, RateLimiter, retry_after
from inferlab.gateway.relay import ClientStream, Observed, StreamRelay, read_body
from inferlab.gateway.routing import (
    EngineLoad,
    Health,
    eligible,
    ids_prefix,
    make_router,
    text_prefix,
)
from inferlab.gateway.shared import Outage, SharedAdmission, SharedCache, SharedLimiter, connect
from inferlab.gateway.upstream import Failure, Upstreams, describe
from inferlab.openai.errors import APIError, error_body
from inferlab.openai.request import (
    PATHS,
    Api,
    limit_field,
    parse_body,
    read_messages,
    read_model,
    read_params,
    read_prompt,
)
from inferlab.openai.response import ResponseReader
from inferlab.openai.sse import SSEParser
from inferlab.results.provenance import ENGINE_ROUTE, GATEWAY_ROUTE, gateway_answer
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.results.runfiles import RunWriter, check_out_dir
from inferlab.results.telemetry import Snapshot

log = logging.getLogger("inferlab.gateway")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_T = TypeVar("_T")

#: How long ``/v1/models`` and ``/health`` wait for each upstream.
_PROBE_TIMEOUT_S = 5.0
#: How long ``/inferlab/engine`` waits for each upstream: less than a client asking it
#: waits for the gateway (``load.run``: 5 s), so that the client gets the answer.
_ENGINE_TIMEOUT_S = 2.0
#: How long an upstream's software is known once identified (``_software``): an engine
#: upgraded behind the gateway is seen within this time.
_SOFTWARE_TTL_S = 60.0
#: How long ``/tokenize`` and ``/detokenize`` wait for the upstream they are relayed to
#: (as long as ``bench``'s preflight waits for a count).
_TOKENS_TIMEOUT_S = 30.0
#: The least time between two refreshes of the model list for an unknown model.
_MODELS_REFRESH_S = 2.0
#: An engine's report of its load counts for this many refresh intervals, then is dropped.
STALE_INTERVALS = 3
#: What routing reads off an engine's ``/metrics`` (``results.telemetry``'s names).
ENGINE_LOAD = ("running", "waiting", "kv_usage")
#: The ``server_address`` of what the response cache answered, in metrics.
CACHE_ADDRESS = "cache"
#: Why the gateway refuses a batch of prompts in one request (``read_prompt``).
_GATEWAY_BATCH = ("not relayed by inferlab gateway (its admission, rate limits and cache count one prompt a request; "
                  "the engine behind it may take a batch)")
#: A ``Failure``'s kind, as the access log and metrics record it.
_FAILURE_KINDS = {"connect": ErrorKind.CONNECT, "status": ErrorKind.HTTP_STATUS, "timeout": ErrorKind.TIMEOUT,
                  "disconnect": ErrorKind.DISCONNECT, "malformed": ErrorKind.MALFORMED}


def error_response(status: int, message: str, error_type: str, headers: dict[str, str] | None = None) -> web.Response:
    """An OpenAI error answer."""
    return web.json_response(error_body(status, message, error_type), status=status, headers=headers)


class _Unavailable(APIError):
    """503: the gateway cannot answer now; a client may try again after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(503, message, "ServiceUnavailableError")
        self.retry_after_s = retry_after_s


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except _Unavailable as e:
        return web.json_response(e.body(), status=e.status, headers={"Retry-After": retry_after(e.retry_after_s)})
    except APIError as e:
        return web.json_response(e.body(), status=e.status)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        kind = {404: "NotFoundError", 405: "BadRequestError", 413: "BadRequestError"}.get(e.status, "BadRequestError")
        return error_response(e.status, f"{e.reason}: {request.method} {request.path}", kind)
    except (asyncio.CancelledError, ConnectionError):
        raise  # the client went away: nothing to answer
    except Exception as e:  # a bug: still answer in the API's error format
        log.exception("internal error")
        return error_response(500, f"internal error: {type(e).__name__}", "InternalServerError")


@dataclass
class _Request:
    """One generation request, as the gateway reads it."""

    api: Api
    body: dict[str, Any]  # as the client sent it (the cache's key)
    payload: bytes  # what goes upstream: the body, asking for usage when it streams
    model: str
    key: KeyConfig | None
    stream: bool
    include_usage: bool
    prompt: str | list[Any]  # as its engine will read it (``estimate.prompt_of``)
    input_tokens: int  # counted ([admission] tokenizer) or estimated
    output_tokens: int  # reserved: max_tokens (or the default), times n
    prefix: bytes  # the prompt's beginning, for prefix affinity
    max_tokens: int | None = None  # as asked (max_completion_tokens, else max_tokens): None, not given

    @property
    def key_name(self) -> str:
        return self.key.name if self.key else ""


class Gateway:
    """The gateway: ``app`` to serve. Upstream sessions open with the app and close with it."""

    def __init__(self, config: GatewayConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or WallClock()
        self.t0_ns = self.clock.now_ns()
        self.metrics = GatewayMetrics()
        self._keys = {k.sha256: k for k in config.keys}
        self._count = prompt_counter(config.admission.tokenizer)
        # ``tokenizer = "upstream"``: per upstream, its /tokenize (made with the sessions)
        self._tokenize: list[UpstreamTokens] | None = None
        tokenizer = config.admission.tokenizer
        self._count_source = tokenizer if tokenizer in ("estimate", "builtin") else "tokenizer"
        adm = config.admission
        ups = config.upstreams
        self.admission = Admission(
            adm.mode,
            [u.max_tokens_in_flight or adm.max_tokens_in_flight for u in ups],
            [u.max_requests_in_flight or adm.max_requests_in_flight for u in ups],
            queue_max=adm.queue_max, queue_timeout_s=adm.queue_timeout_s, starvation_s=adm.starvation_s,
            clock=self.clock,
        )
        self.engines: EngineLoad | None = None
        if config.metrics_refresh_s > 0:
            self.engines = EngineLoad(len(ups), self.clock, STALE_INTERVALS * config.metrics_refresh_s)
        self.router = make_router(config.router, self.admission.tokens_in_flight, self.admission.requests_in_flight,
                                  self.engines, config.long_pool())
        self.health = Health(len(ups), self.clock)
        self.limiter = RateLimiter(self.clock)
        self.cache = ResponseCache(config.cache, self.clock) if config.cache.enabled else None
        self._models: dict[str, set[int]] = {}  # model id → the upstreams that list it
        self._listed: set[int] = set()  # the upstreams that ever answered /v1/models with a list
        self._model_objects: dict[str, dict[str, Any]] = {}
        # (model, upstream) -> the context length the upstream listed for it (vLLM's and
        # the simulated server's max_model_len in /v1/models)
        self._context: dict[tuple[str, int], int] = {}
        self._models_at_ns: int | None = None
        # upstream -> (when, what it said it is): ``_software``
        self._identified: dict[int, tuple[int, dict[str, Any]]] = {}
        self._seq = itertools.count()
        self.upstreams = Upstreams(config, self.clock)
        self._redis: Any = None
        self.shared_limiter: SharedLimiter | None = None
        self.shared_cache: SharedCache | None = None
        self.shared_admission: SharedAdmission | None = None
        self.redis_outage = Outage()  # (a failing Redis said once, not once a call)
        self._background: set[asyncio.Task[None]] = set()
        self._watchers: list[asyncio.Task[None]] = []
        self._watch_session: aiohttp.ClientSession | None = None
        self.log: RunWriter | None = None  # (opened once the gateway listens: ``open_log``)
        if config.access_log:
            check_out_dir(config.access_log, setting="[gateway] access_log",
                          remedy="give another folder, or move that run away")
        self.app = web.Application(middlewares=[_errors], client_max_size=config.max_body_bytes)
        self.app.router.add_post("/v1" + PATHS["chat"], self._chat)
        self.app.router.add_post("/v1" + PATHS["completions"], self._completions)
        self.app.router.add_get("/v1/models", self._list_models)
        self.app.router.add_get("/health", self._health)
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get(ENGINE_ROUTE, self._engine)
        self.app.router.add_get(GATEWAY_ROUTE, self._setup)
        self.app.router.add_post("/tokenize", self._tokens)
        self.app.router.add_post("/detokenize", self._tokens)
        self.app.on_startup.append(self._start)
        self.app.on_cleanup.append(self._stop)

    # --- lifecycle ---------------------------------------------------------------------

    def open_log(self) -> None:
        """Start the access log (``config.access_log``), if one is configured."""
        c = self.config
        if c.access_log and self.log is None:
            self.log = RunWriter(c.access_log, {"gateway": {
                "upstreams": [u.name for u in c.upstreams], "admission": c.admission.mode,
                "keys": [k.name for k in c.keys],
            }}, overwrite=True)  # (checked when the gateway was made)

    async def _start(self, app: web.Application) -> None:
        await self._join_redis()  # (first: a Redis it cannot reach stops the start with nothing else open)
        await self.upstreams.open()
        if self.config.admission.tokenizer == UPSTREAM:
            self._tokenize = [UpstreamTokens(self.session, u.url, u.api_key, u.name, self._count, self.clock)
                              for u in self.config.upstreams]
        await self._refresh_models()
        if self.engines is not None:
            # a session of its own: it decompresses (a /metrics page may come gzipped),
            # and its reads share no connection with the requests
            self._watch_session = aiohttp.ClientSession()

    async def _join_redis(self) -> None:
        """Connect to ``[redis]`` and set up what it shares; ``RunFailedError`` (with the
        URL, its password hidden) if Redis does not answer."""
        red = self.config.redis
        if red is None:
            return
        self._redis = connect(red.url)
        try:
            await self._redis.ping()
        except Exception as e:  # (redis' own errors: connection, auth, protocol)
            await self._redis.aclose()
            raise RunFailedError(f"[redis] {red.shown}: {describe(e)}") from None
        if red.limits:
            self.shared_limiter = SharedLimiter(self._redis, red.prefix)
        if red.cache and self.cache is not None:
            self.shared_cache = SharedCache(self._redis, red.prefix, self.config.cache.ttl_s, self.config.cache.max_bytes)
        if red.admission and self.config.admission.mode != "off":
            self.shared_admission = SharedAdmission(self._redis, red.prefix, self.admission,
                                                    [u.url for u in self.config.upstreams], red.lease_s,
                                                    self.redis_outage)
            try:
                await self.shared_admission.start()
            except Exception as e:  # (redis' own errors)
                await self._redis.aclose()
                raise RunFailedError(f"[redis] {red.shown}: {describe(e)}") from None

    def listening(self) -> None:
        """What begins once the gateway listens (``start``): the access log, and reading
        the engines' /metrics (begun before, a first failed read could log a warning
        ahead of the one line that says the port was in use)."""
        self.open_log()
        if self._watch_session is not None and not self._watchers:
            self._watchers = [asyncio.create_task(self._watch_engine(i)) for i in range(len(self.config.upstreams))]

    async def _stop(self, app: web.Application) -> None:
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        self._watchers = []
        if self._watch_session is not None:
            await self._watch_session.close()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self.shared_admission is not None:
            await self.shared_admission.stop()
        if self._redis is not None:
            await self._redis.aclose()
        await self.upstreams.close()
        if self.log is not None:
            self.log.close()

    async def _watch_engine(self, i: int) -> None:
        """Read upstream ``i``'s ``/metrics`` now and every ``metrics_refresh_s``; report
        its running and waiting requests (and KV usage) to ``self.engines``. Without
        them (no page, not Prometheus text, no such names, no answer) the last report
        ages out and the router counts the gateway's own requests only; the log says so
        once, and once more when the page reads again."""
        assert self.engines is not None and self._watch_session is not None
        up = self.config.upstreams[i]
        url = up.url + "/metrics"
        interval = self.config.metrics_refresh_s
        timeout = min(METRICS_TIMEOUT_S, (STALE_INTERVALS - 1) * interval)
        own = self.admission.requests_in_flight
        lost = False
        while True:
            before = own[i]
            try:
                snap = await scrape(self._watch_session, url, self._upstream_headers(i, False), timeout, ENGINE_LOAD)
                why = snap if isinstance(snap, str) else _load(snap)
            except Exception as e:  # (a failure scrape does not foresee: the task goes on, the log says it)
                why = f"GET {url}: {describe(e)}"
            if isinstance(why, tuple):
                self.engines.report(i, *why, own=max(before, own[i]))
                if lost:
                    log.warning("upstream %s: its /metrics reads again; routing counts the load it reports", up.name)
                lost = False
            elif not lost:
                log.warning("upstream %s: no load from its /metrics (%s); routing counts only the requests the "
                            "gateway sent it", up.name, why)
                lost = True
            await asyncio.sleep(interval)

    @property
    def session(self) -> aiohttp.ClientSession:
        return self.upstreams.session

    def _upstream_headers(self, i: int, json_body: bool = True) -> dict[str, str]:
        return self.upstreams.headers(i, json_body)

    # --- simple routes -----------------------------------------------------------------

    async def _metrics(self, request: web.Request) -> web.Response:
        self._gauges()
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    def _gauges(self) -> None:
        m, a = self.metrics, self.admission
        for i, u in enumerate(self.config.upstreams):
            m.in_flight.labels(u.name).set(a.requests_in_flight[i])
            m.tokens_in_flight.labels(u.name).set(a.tokens_in_flight[i])
            m.ejected.labels(u.name).set(1 if self.health.ejected(i) else 0)
            if self.shared_admission is not None:
                m.others_in_flight.labels(u.name).set(a.others_requests[i])
                m.others_tokens_in_flight.labels(u.name).set(a.others_tokens[i])
            r = self.engines.reading(i) if self.engines is not None else None
            if r is None:  # no current report: no value, rather than an old one
                for state in ("running", "waiting"):
                    m.engine_requests.remove(u.name, state)
                m.engine_foreign.remove(u.name)
            else:
                m.engine_requests.labels(u.name, "running").set(r.running)
                m.engine_requests.labels(u.name, "waiting").set(r.waiting)
                m.engine_foreign.labels(u.name).set(r.foreign)
            if r is None or r.kv_usage is None:
                m.engine_kv_usage.remove(u.name)
            else:
                m.engine_kv_usage.labels(u.name).set(r.kv_usage)
        m.queue_length.set(a.queue_length)

    async def _health(self, request: web.Request) -> web.Response:
        """200 if at least one upstream's ``/health`` answers 200, else 503."""
        results = await asyncio.gather(*(self._probe(i, "/health") for i in range(len(self.config.upstreams))))
        upstreams = {u.name: ok is not None for u, ok in zip(self.config.upstreams, results, strict=True)}
        return web.json_response({"upstreams": upstreams}, status=200 if any(upstreams.values()) else 503)

    async def _engine(self, request: web.Request) -> web.Response:
        """Every upstream's ``/inferlab/engine`` answer (``results.provenance.gateway_answer``)
        if each one answered 200 with a JSON object, i.e. each is ``inferlab sim serve``;
        else 404, naming the first upstream that did not."""
        self._authenticate(request)
        ups = self.config.upstreams
        bodies = await asyncio.gather(*(self._probe(i, ENGINE_ROUTE, _ENGINE_TIMEOUT_S) for i in range(len(ups))))
        engines = []
        for up, raw in zip(ups, bodies, strict=True):
            try:
                engine = json.loads(raw) if raw is not None else None
            except ValueError:
                engine = None
            if not isinstance(engine, dict):
                return error_response(404, f"Not Found: {request.method} {request.path} (upstream {up.name} did not "
                                      "answer it: not every upstream is inferlab sim serve)", "NotFoundError")
            engines.append(engine)
        return web.json_response(gateway_answer(engines))

    async def _setup(self, request: web.Request) -> web.Response:
        """The gateway's setup (``GatewayConfig.setup``), whatever its upstreams are: a
        run through it records that the gateway was there; each upstream with the
        software it says it is (``_software``)."""
        self._authenticate(request)
        setup = self.config.setup()
        found = await asyncio.gather(*(self._software(i) for i in range(len(self.config.upstreams))))
        for i, (entry, (software, answered)) in enumerate(zip(setup["upstreams"], found, strict=True)):
            entry["software"], entry["answered"] = software, answered
            entry["max_model_len"] = {m: c for (m, u), c in self._context.items() if u == i}
        setup["max_model_len"] = {m: c for m in self._models if (c := self._model_context(m)) is not None}
        return web.json_response(setup)

    def _model_context(self, model: str) -> int | None:
        """The context a request for ``model`` has through the gateway: the largest any
        upstream serving it states (a prompt over it is refused by every one of them,
        and by the gateway: ``_check_context``); None unless every one states its own."""
        known = [self._context.get((model, i)) for i in self._models.get(model, ())]
        stated = [c for c in known if c is not None]
        return max(stated) if stated and len(stated) == len(known) else None

    async def _software(self, i: int) -> tuple[dict[str, Any] | None, bool]:
        """What upstream ``i`` says it is (``client.serverid.identify_server``, as
        ``bench`` identifies a server: ``{"name": "vLLM", "version": "0.11.0" or None,
        "source": "GET /version" or None}``, no URL, no key, no settings), known for
        ``_SOFTWARE_TTL_S`` once it named itself; None where it names none of the
        software ``bench`` knows or did not answer within ``_ENGINE_TIMEOUT_S`` (asked
        again next time). And whether it answered at all (any HTTP status to
        ``/v1/models``): None from a server that answered is one that named nothing,
        from one that did not, a server down."""
        now = self.clock.now_ns()
        known = self._identified.get(i)
        if known is not None and now - known[0] < _SOFTWARE_TTL_S * NS_PER_S:
            return known[1], True
        said = None
        try:
            async with asyncio.timeout(_ENGINE_TIMEOUT_S):
                said = await identify_server(self.config.upstreams[i].url + "/v1", self._upstream_headers(i, False),
                                             settings=False)
                if said is None:
                    return None, await self._answers(i, "/v1/models")
        except TimeoutError:
            return None, False
        software = {k: said.get(k) for k in ("name", "version", "source")}
        self._identified[i] = (now, software)
        return software, True

    async def _answers(self, i: int, path: str) -> bool:
        """Whether upstream ``i`` answers GET ``path`` with any HTTP status."""
        try:
            async with self.session.get(self.config.upstreams[i].url + path, headers=self._upstream_headers(i, False)):
                return True
        except aiohttp.ClientError:
            return False

    async def _probe(self, i: int, path: str, timeout_s: float = _PROBE_TIMEOUT_S) -> bytes | None:
        """GET ``path`` on upstream ``i``: its body if it answered 200, else None."""
        try:
            async with asyncio.timeout(timeout_s), self.session.get(
                self.config.upstreams[i].url + path, headers=self._upstream_headers(i, False)
            ) as resp:
                return await resp.read() if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def _tokens(self, request: web.Request) -> web.Response:
        """``POST /tokenize`` and ``/detokenize``, relayed to one upstream serving the
        body's ``model`` (the first healthy one; without a ``model``, as llama.cpp's
        ``content`` body has none, one serving the one model the upstreams list): its
        answer as it came, so that a client counts tokens as that engine does (``bench``'s
        preflight sizes its prompts exactly). The body goes as the client wrote it, with
        the upstream's own key; ``APIError`` 404 or 503 as for a generation's model, 400
        without a model where the upstreams list several, 502 or 504 when the upstream
        did not answer."""
        self._authenticate(request)
        raw = await self._raw(request)
        body = parse_body(raw, request.charset)
        model = read_model(body)  # (one that is not a string: 400, not taken for none)
        if model is None:
            if not self._models:
                await self._refresh_models()
            if len(self._models) != 1:
                raise APIError(400, f"'model' is required: the upstreams list {len(self._models)} models", param="model")
            model = next(iter(self._models))
        candidates = await self._candidates(model)
        i = (self.health.healthy(candidates) or candidates)[0]
        up = self.config.upstreams[i]
        try:
            async with asyncio.timeout(_TOKENS_TIMEOUT_S), self.session.post(
                up.url + request.path, data=raw, headers=self._upstream_headers(i)
            ) as resp:
                answer = await resp.read()
                return web.Response(body=answer, status=resp.status, content_type=resp.content_type)
        except TimeoutError:
            raise APIError(504, f"upstream {up.name} did not answer {request.path} within {_TOKENS_TIMEOUT_S:g} s",
                           "TimeoutError") from None
        except aiohttp.ClientError as e:
            raise APIError(502, f"upstream {up.name}: {describe(e)}", "BadGatewayError") from None

    async def _list_models(self, request: web.Request) -> web.Response:
        """The upstreams' models, merged: each model's card as its first upstream listed
        it, with ``max_model_len`` the context it has through the gateway
        (``_model_context``), where every upstream serving it states one."""
        self._authenticate(request)
        await self._refresh_models()
        cards = []
        for model, card in self._model_objects.items():
            context = self._model_context(model)
            cards.append(card if context is None else {**card, "max_model_len": context})
        return web.json_response({"object": "list", "data": cards})

    async def _refresh_models(self) -> None:
        """Ask every upstream for its models; an upstream that does not answer keeps what
        it listed before."""
        self._models_at_ns = self.clock.now_ns()
        lists = await asyncio.gather(*(self._probe(i, "/v1/models") for i in range(len(self.config.upstreams))))
        for i, raw in enumerate(lists):
            if raw is None:
                continue
            try:
                data = json.loads(raw).get("data")
            except (ValueError, AttributeError):
                continue
            if not isinstance(data, list):
                continue
            self._listed.add(i)
            listed = []
            for obj in data:
                if isinstance(obj, dict) and isinstance(obj.get("id"), str):
                    listed.append(obj["id"])
                    self._models.setdefault(obj["id"], set()).add(i)
                    self._model_objects.setdefault(obj["id"], obj)
                    context = obj.get("max_model_len")
                    if isinstance(context, int) and not isinstance(context, bool) and context > 0:
                        self._context[(obj["id"], i)] = context
            if listed and not any((m, i) in self._context for m in listed):
                await self._slot_context(i, listed)

    async def _slot_context(self, i: int, models: list[str]) -> None:
        """llama.cpp states no context in ``/v1/models``: a request has its slot's
        (``/props``' ``n_ctx``, as ``bench`` reads it straight at the engine:
        ``client.serverid.llamacpp_settings``), recorded for the models upstream ``i``
        lists. Nothing from an upstream without the route."""
        raw = await self._probe(i, "/props", _ENGINE_TIMEOUT_S)
        try:
            props = json.loads(raw) if raw is not None else None
        except ValueError:
            return
        context = llamacpp_settings(props).get("max_model_len")
        if context is not None:
            for m in models:
                self._context[(m, i)] = context

    async def _candidates(self, model: str) -> list[int]:
        """The upstreams serving ``model``; ``APIError`` 404 if every upstream listed its
        models and none lists it, 503 if one that did not list them might serve it."""
        found = self._models.get(model)
        if not found and (self._models_at_ns is None or self.clock.now_ns() - self._models_at_ns > _MODELS_REFRESH_S * NS_PER_S):
            await self._refresh_models()
            found = self._models.get(model)
        if found:
            return sorted(found)
        unlisted = [u.name for i, u in enumerate(self.config.upstreams) if i not in self._listed]
        if not unlisted:
            raise APIError(404, f"The model `{model}` does not exist.", "NotFoundError", param="model")
        if len(unlisted) == len(self.config.upstreams):
            raise _Unavailable(f"no upstream answered /v1/models: cannot tell which one serves `{model}`", _MODELS_REFRESH_S)
        raise _Unavailable(f"no upstream that answered /v1/models lists `{model}`, and {', '.join(unlisted)} did not "
                           "answer it", _MODELS_REFRESH_S)

    # --- generation ----------------------------------------------------------------------

    def _authenticate(self, request: web.Request) -> KeyConfig | None:
        """The caller's key (None when no keys are configured); ``APIError`` 401 without
        a valid one. Keys are compared as SHA-256 digests and never logged."""
        if not self._keys:
            return None
        auth = request.headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            self.metrics.rejections.labels("unauthenticated", "").inc()
            raise APIError(401, "Missing API key: send 'Authorization: Bearer <key>'.", "AuthenticationError")
        digest = hash_key(token.strip())
        key = self._keys.get(digest)
        if key is None or not hmac.compare_digest(key.sha256, digest):
            self.metrics.rejections.labels("unauthenticated", "").inc()
            raise APIError(401, "Incorrect API key provided.", "AuthenticationError")
        return key

    async def _shared(self, call: Awaitable[_T], key_name: str) -> _T:
        """A call to Redis; a 503 with ``Retry-After`` (``_Unavailable``) if Redis fails:
        the limits or the budgets cannot be checked. Counted as a rejection
        (``redis_unavailable``), so an outage shows on /metrics, not in the log alone."""
        try:
            return await call
        except (Limited, Rejected, asyncio.CancelledError):
            raise
        except Exception as e:  # (redis' own errors: connection, timeout, protocol)
            self.redis_outage.failed(e)
            self.metrics.rejections.labels("redis_unavailable", key_name).inc()
            raise _Unavailable("the gateway's shared state (Redis) is unavailable", 1.0) from None

    def _later(self, call: Awaitable[None]) -> None:
        """Run ``call`` in the background (kept until done; its failure is logged)."""

        async def run() -> None:
            try:
                await call
            except Exception as e:
                self.redis_outage.failed(e)

        task = asyncio.create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions")

    async def _raw(self, request: web.Request) -> bytes:
        """The request's body; ``APIError`` 413 over ``max_body_bytes``, 400 if it cannot be read."""
        limit = self.config.max_body_bytes
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):  # (read as sent: a compressed body is no JSON)
            raise APIError(415, f"Content-Encoding {encoding!r} is not taken: the gateway reads a request body as sent; "
                           "send it uncompressed", "UnsupportedMediaTypeError")
        if request.content_length is not None and request.content_length > limit:
            raise APIError(413, f"request body is over the gateway's limit of {limit} bytes")
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise APIError(413, f"request body is over the gateway's limit of {limit} bytes") from None
        except (aiohttp.ClientPayloadError, web.RequestPayloadError) as e:
            raise APIError(400, f"request body could not be read: {describe(e)}") from None

    async def _read(self, request: web.Request, api: Api, key: KeyConfig | None) -> _Request:
        raw = await self._raw(request)
        body = parse_body(raw, request.charset)
        params = read_params(body, api)
        if api == "chat":
            read_messages(body)
        else:
            read_prompt(body, _GATEWAY_BATCH)
        model = read_model(body)
        if model is None:
            raise APIError(400, "'model' is required", param="model")
        adm = self.config.admission
        prompt = prompt_of(body, api == "chat")
        stream, include_usage = params.stream, params.include_usage
        if stream and not include_usage:  # the gateway asks for usage (docs: Streams)
            sent = {**body, "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}
            payload = json.dumps(sent).encode()
        elif (request.charset or "utf-8").lower() in ("utf-8", "utf8"):
            payload = raw  # (nothing to change: forwarded as the client wrote it)
        else:
            payload = json.dumps(body).encode()
        return _Request(
            api=api, body=body, payload=payload, model=model, key=key, stream=stream, include_usage=include_usage,
            prompt=prompt, input_tokens=count_prompt(prompt, self._count),
            output_tokens=(params.max_tokens or adm.default_max_tokens) * params.n, max_tokens=params.max_tokens,
            prefix=ids_prefix(prompt) if isinstance(prompt, list) else text_prefix(prompt),
        )

    async def _generate(self, request: web.Request, api: Api) -> web.StreamResponse:
        received = self.clock.now_ns()
        key: KeyConfig | None = None
        try:
            key = self._authenticate(request)
            req = await self._read(request, api, key)
        except APIError as e:  # (refused before it is read: in the access log all the same)
            if self.log is not None:
                self.log.append(RequestRecord(
                    next(self._seq), send_ns=received - self.t0_ns, end_ns=self.clock.now_ns() - self.t0_ns,
                    status=e.status, error_kind=ErrorKind.HTTP_STATUS, error=f"HTTP {e.status}: {e.message}"[:300],
                    key=key.name if key else None))
            raise
        record = RequestRecord(next(self._seq), send_ns=received - self.t0_ns, key=key.name if key else None,
                               requested_input_tokens=req.input_tokens, requested_output_tokens=req.output_tokens)
        obs = Observed(record, self.t0_ns, received)
        try:  # (a refusal from here on is logged as the others are, with what is known of it)
            candidates = await self._candidates(req.model)
            if self._tokenize is not None:  # (the first upstream that may take it counts)
                counter = self._tokenize[(self.health.healthy(candidates) or candidates)[0]]
                req.input_tokens, source = await counter.count(req.body, req.prompt, api == "chat", req.model)
                record.requested_input_tokens = req.input_tokens
                self.metrics.prompt_counts.labels(source).inc()
            else:
                self.metrics.prompt_counts.labels(self._count_source).inc()
            self._check_context(req, candidates)
            charge: Charge | str | None = None
            headers: dict[str, str] = {}
            if key is not None and (key.rpm is not None or key.tpm is not None):
                if self.shared_limiter is not None:
                    charge, headers = await self._shared(
                        self.shared_limiter.reserve(key, req.input_tokens, req.output_tokens), key.name)
                    self.redis_outage.answered()  # (the budget's batches say so themselves)
                else:
                    charge = self.limiter.reserve(key, req.input_tokens, req.output_tokens)
                    headers = self.limiter.headers(key)
        except Limited as e:
            assert key is not None
            self.metrics.rejections.labels("rate_limited", key.name).inc()
            h = dict(e.headers)
            if e.retry_after_s is not None:
                h["Retry-After"] = retry_after(e.retry_after_s)
            obs.fail(ErrorKind.HTTP_STATUS, f"HTTP 429: {e}")  # (logged: a refusal is part of the load)
            record.status = 429
            self._finish(req, obs, None)
            return error_response(429, str(e), "RateLimitError", h)
        except APIError as e:
            obs.fail(ErrorKind.HTTP_STATUS, f"HTTP {e.status}: {e.message}")
            record.status = e.status
            self._finish(req, obs, None)
            raise
        try:
            return await self._answer(request, req, candidates, obs, headers)
        finally:
            self._finish(req, obs, charge)

    def _check_context(self, req: _Request, candidates: list[int]) -> None:
        """No upstream generates past its context: a max_tokens beyond it waited for room
        behind other traffic, to end as a 503 (a retryable 5xx for a client's fault),
        where every upstream would refuse it at once. ``APIError`` 400 when max_tokens
        alone exceeds the largest context (refused by every vLLM release, whatever the
        prompt's count); else what is reserved is capped there (the record keeps what was
        asked). A max_tokens of the whole context is passed on: vLLM from 0.32 lowers it to
        what the prompt leaves and answers (older releases refuse it themselves)."""
        known = [c for c in (self._context.get((req.model, i)) for i in candidates) if c is not None]
        if not known or len(known) != len(candidates):
            return
        if req.max_tokens is not None and req.max_tokens > max(known):
            raise APIError(
                400, f"This model's maximum context length is {max(known)} tokens. However, you requested "
                f"{req.max_tokens} tokens in the completion alone. Please reduce the length of the completion.",
                param=limit_field(req.body))
        req.output_tokens = min(req.output_tokens, max(max(known) - req.input_tokens, 0))

    def _finish(self, req: _Request, obs: Observed, charge: Charge | str | None) -> None:
        """Every request ends here, however it ended: the key's charge corrected, metrics
        and the access log written."""
        r = obs.record
        if r.end_ns is None:  # (not ended by an upstream's answer: the gateway's own end)
            if r.error_kind is None:
                r.error_kind, r.error = ErrorKind.CANCELLED, "the client went away"
            r.end_ns = self.clock.now_ns() - self.t0_ns  # (a failure still: not ``ok``)
        if charge is not None and req.key is not None:
            if not obs.sent and not r.response_cache_hit:  # answered by the gateway alone: no request, no tokens
                if isinstance(charge, Charge):
                    self.limiter.refund(charge)
                elif self.shared_limiter is not None:
                    self._later(self.shared_limiter.refund(req.key, charge))
            elif (used := _used(req, obs)) is not None:
                if isinstance(charge, Charge):
                    self.limiter.correct(req.key, charge, *used)
                elif self.shared_limiter is not None:
                    self._later(self.shared_limiter.correct(req.key, charge, *used))
        if self.log is not None:
            r.content_ns = [t - self.t0_ns for t in obs.content_ns]
            self.log.append(r)

    async def _answer(
        self, request: web.Request, req: _Request, candidates: list[int], obs: Observed, headers: dict[str, str],
    ) -> web.StreamResponse:
        m = self.metrics
        key = None
        if self.cache is not None and cacheable(req.body):
            headers = {**headers, CACHE_HEADER: "miss"}
            obs.record.response_cache_hit = False  # (looked up: _from_cache sets True on a hit)
            scope = "" if self.config.cache.shared_across_keys else req.key_name
            key = cache_key(req.body, req.api == "chat", scope)
            entry = self.cache.get(key)
            pending = self.cache.pending(key) if entry is None else None
            if entry is None and pending is None and self.shared_cache is not None:
                self.cache.lead(key)  # (before the await: identical requests wait for this one)
                try:
                    entry = await self.shared_cache.get(key)
                except Exception as e:  # (redis' own errors): a miss
                    self.redis_outage.failed(e)
                else:
                    self.redis_outage.answered()
                if entry is not None:
                    self.cache.finish(key, entry, store=False)
                else:
                    m.cache_misses.labels(req.model, req.key_name).inc()
                    return await self._upstream(request, req, candidates, obs, headers, key)
            if pending is not None:
                try:
                    entry = await asyncio.wait_for(asyncio.shield(pending), self.config.upstream_timeout_s)
                except TimeoutError:
                    entry = None  # the leader is too slow: go upstream, uncached
            if entry is not None and entry.serves(req.stream):
                m.cache_hits.labels(req.model, req.key_name).inc()
                m.cache_tokens_saved.labels(req.model, req.key_name).inc(entry.answer.tokens)
                return await self._from_cache(request, req, entry, obs, {**headers, CACHE_HEADER: "hit"})
            m.cache_misses.labels(req.model, req.key_name).inc()
            if entry is None and pending is None:
                self.cache.lead(key)
            else:  # the leader failed, or the answer is in the other form and not plain text
                key = None  # (go upstream, uncached: the entry stays as it is)
        return await self._upstream(request, req, candidates, obs, headers, key)

    async def _upstream(
        self, request: web.Request, req: _Request, candidates: list[int], obs: Observed, headers: dict[str, str],
        key: str | None,
    ) -> web.StreamResponse:
        """Dispatch; as the cache's leader for ``key`` (if given), hand the answer on."""
        try:
            return await self._dispatch(request, req, candidates, obs, headers, keep=key is not None)
        finally:
            if key is not None and self.cache is not None:
                self.cache.finish(key, obs.entry, store=self.shared_cache is None)
                if obs.entry is not None and self.shared_cache is not None:
                    self._later(self.shared_cache.put(key, obs.entry))

    async def _from_cache(
        self, request: web.Request, req: _Request, entry: Entry, obs: Observed, headers: dict[str, str],
    ) -> web.StreamResponse:
        r = obs.record
        r.status = 200
        r.response_cache_hit = True  # (no prompt token of it came from an engine's prefix cache)
        r.cached_tokens = 0
        a = entry.answer.usage
        r.input_tokens, r.output_tokens = a.get("prompt_tokens"), a.get("completion_tokens")
        r.usage_source, r.finish_reason = "server", entry.answer.finish_reason
        rid = entry.fresh_id()  # (each answer an id of its own, as from an upstream)
        series = self.metrics.series(req.model, CACHE_ADDRESS, req.key_name)
        if not req.stream:
            resp = web.Response(body=entry.whole(rid), content_type="application/json", headers=headers)
            r.ttfb_ns = r.end_ns = self.clock.now_ns() - self.t0_ns
            self._observe(obs, series)
            return resp
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers})
        await out.prepare(request)
        # each write's content chunks, timed as it is sent (as a relayed stream's are as
        # they arrive): the log's and the metrics' TPOT and ITL are the cache's own
        parser, reader, content = SSEParser(), ResponseReader(), obs.content_ns
        for data in entry.stream(req.include_usage, rid):
            await out.write(data)
            now = self.clock.now_ns()
            if r.ttfb_ns is None:
                r.ttfb_ns = now - self.t0_ns
            arrivals = sum(map(reader.event, parser.feed(data)))  # (the stored answer read once before)
            if arrivals:
                if content:
                    series.itl.observe((now - content[-1]) / NS_PER_S)
                content.extend([now] * arrivals)
        await out.write_eof()
        r.end_ns = self.clock.now_ns() - self.t0_ns
        r.stream_done = True
        self._observe(obs, series)
        return out

    async def _dispatch(
        self, request: web.Request, req: _Request, candidates: list[int], obs: Observed, headers: dict[str, str],
        keep: bool,
    ) -> web.StreamResponse:
        """Send to an upstream with room; on a failure before the first byte, to another
        (the same one once more, if it is the only one). An upstream that answers the
        request with an OpenAI error body (``Failure.answer``) is alive: the request is not
        sent to it again, the tries end once a second upstream answers so too, and the
        last such answer is relayed if no other did better; it counts toward its
        ejection only if another upstream then answered the same request with a success
        (docs/gateway.md, "Streams")."""
        payload = req.payload
        tokens = req.input_tokens + req.output_tokens
        tried: list[int] = []
        failure: Failure | None = None
        answered: tuple[int, Failure] | None = None  # the last upstream that answered with an error body
        for _ in range(max(2, len(candidates))):
            left = [i for i in candidates if i not in tried] or ([] if answered else candidates)
            if not left:
                break
            try:
                ticket = await self._shared(self.admission.acquire(
                    tokens, eligible(self.router, left, req.input_tokens, self.health),
                    lambda room: self.router(room, req.prefix, req.input_tokens)), req.key_name)
            except Rejected as e:
                # (a request that timed out waiting is counted here alone, not in the queue
                # wait, which is the admitted requests' part of their TTFT)
                self.metrics.rejections.labels(e.reason, req.key_name).inc()
                obs.fail(ErrorKind.HTTP_STATUS, str(e))
                obs.record.status = 503
                return error_response(503, str(e), "ServiceUnavailableError", {**headers, "Retry-After": retry_after(e.retry_after_s)})
            except _Unavailable as e:  # the shared budgets (Redis) could not be read
                obs.fail(ErrorKind.HTTP_STATUS, e.message)
                obs.record.status = e.status
                return error_response(e.status, e.message, e.error_type,
                                      {**headers, "Retry-After": retry_after(e.retry_after_s)})
            self.metrics.queue_wait.labels(req.model, req.key_name).observe(ticket.queued_ns / NS_PER_S)
            tried.append(ticket.upstream)
            try:
                out = await self._exchange(request, req, ticket, payload, obs, headers, keep)
                if answered is not None and obs.record.status is not None and obs.record.status < 400:
                    self.health.failed(answered[0])  # (another upstream took what it refused: its failure)
                return out
            except Failure as f:
                failure = f
                # (an answer that it cannot take the request is no failure of the upstream: kind "refused")
                self.metrics.upstream_errors.labels(self.config.upstreams[ticket.upstream].name,
                                                    f.kind if f.answer is None else "refused").inc()
                if f.answer is None:
                    self.health.failed(ticket.upstream)
                elif answered is not None:  # (a second upstream refused it too: the request's, not theirs)
                    answered = (ticket.upstream, f)
                    break
                else:
                    answered = (ticket.upstream, f)
                if not f.retry:
                    break
            finally:
                self.admission.release(ticket)
        if answered is not None:
            return self._relay_refusal(req, obs, headers, *answered)
        assert failure is not None
        kind = _FAILURE_KINDS[failure.kind]
        obs.fail(kind, str(failure))
        status = 503 if failure.status == 429 else 504 if kind == ErrorKind.TIMEOUT else 502
        obs.record.status = status
        up = self.config.upstreams[tried[-1]].name
        self.metrics.duration.labels(req.model, up, req.key_name, kind.value).observe(
            (self.clock.now_ns() - obs.received_ns) / NS_PER_S)
        return error_response(status, str(failure), "ServiceUnavailableError" if status == 503 else "InternalServerError",
                              {**headers, "Retry-After": "1"} if status == 503 else headers)

    def _relay_refusal(self, req: _Request, obs: Observed, headers: dict[str, str], i: int, f: Failure) -> web.Response:
        """Upstream ``i``'s answer to the request, an OpenAI error body with a 5xx
        (``Failure.answer``), relayed as it came: its status and its message are the
        engine's, not the gateway's."""
        assert f.answer is not None and f.status is not None
        obs.fail(ErrorKind.HTTP_STATUS, str(f))
        obs.record.status = f.status
        self.metrics.duration.labels(req.model, self.config.upstreams[i].name, req.key_name,
                                     ErrorKind.HTTP_STATUS.value).observe((self.clock.now_ns() - obs.received_ns) / NS_PER_S)
        return web.Response(body=f.answer, status=f.status, content_type="application/json", headers=headers)

    async def _exchange(
        self, request: web.Request, req: _Request, ticket: Ticket, payload: bytes, obs: Observed,
        headers: dict[str, str], keep: bool,
    ) -> web.StreamResponse:
        i = ticket.upstream
        series = self.metrics.series(req.model, self.config.upstreams[i].name, req.key_name)
        obs.sent = True  # (the in-flight gauges are admission's counts, set when /metrics is read)
        resp = await self.upstreams.send(i, req.api, payload)
        try:
            self.health.succeeded(i)
            obs.record.status = resp.status
            if req.stream and resp.status == 200 and resp.content_type == "text/event-stream":
                out = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers})
                client = ClientStream(await out.prepare(request))
                relay = StreamRelay(self.clock, obs, chat=req.api == "chat", drop_usage=not req.include_usage,
                                    keep=keep, itl=series.itl, reserved_output=req.output_tokens,
                                    grow=lambda n: self.admission.resize(ticket, req.input_tokens + n))
                try:
                    await relay.run(resp, client)
                except (ConnectionError, asyncio.CancelledError):
                    obs.fail(ErrorKind.CANCELLED, "the client went away")
                    raise
                self._observe(obs, series)
                await out.write_eof()
                return out
            raw = await read_body(self.clock, obs, resp, chat=req.api == "chat", keep=keep and resp.status == 200)
            if resp.status >= 400:
                obs.fail(ErrorKind.HTTP_STATUS, f"HTTP {resp.status}")
            self._observe(obs, series)
            return web.Response(body=raw, status=resp.status, content_type=resp.content_type or "application/json",
                                headers=headers)
        except BaseException:
            resp.abort()  # mid-answer: drop the upstream's connection, which aborts its request
            raise
        finally:
            resp.release()

    def _observe(self, obs: Observed, series: Series) -> None:
        """Metrics of a request an upstream (or the cache) answered."""
        r = obs.record
        seconds = (self.clock.now_ns() - obs.received_ns) / NS_PER_S
        if r.error_kind is None:
            series.duration.observe(seconds)
        else:
            self.metrics.duration.labels(*series.labels, r.error_kind.value).observe(seconds)
        content = obs.content_ns
        if content:
            series.ttft.observe((content[0] - obs.received_ns) / NS_PER_S)
            if r.output_tokens and r.output_tokens > 1:
                series.tpot.observe((content[-1] - content[0]) / (r.output_tokens - 1) / NS_PER_S)
        if r.input_tokens is not None:
            series.input_tokens.inc(r.input_tokens)
        if r.output_tokens is not None:
            series.output_tokens.inc(r.output_tokens)


def _used(req: _Request, obs: Observed) -> tuple[int, int] | None:
    """The (input, output) tokens a request's charge is corrected to, or None: it keeps
    the estimate. The answer's usage (an upstream's, or a cached answer's) where it
    came; else an answer that failed is charged what it streamed: nothing if no content
    reached the client (an error status, the upstream's or the gateway's after failed
    tries: nothing was generated for it), else the prompt and one token per content
    chunk relayed (the upstream's stream broke, so it generated no more). A client that
    went away keeps the estimate (the upstream may have generated more than was relayed),
    as does an answer without usage."""
    r = obs.record
    if r.input_tokens is not None and r.output_tokens is not None:
        return r.input_tokens, r.output_tokens
    if r.error_kind is ErrorKind.CANCELLED:
        return None
    if r.error_kind is not None:
        return (req.input_tokens, len(obs.content_ns)) if obs.content_ns else (0, 0)
    return (0, 0) if not obs.sent else None  # (a cached answer without usage: no upstream's tokens)


def _load(snap: Snapshot) -> tuple[float, float, float | None] | str:
    """(running, waiting, KV usage or None) from an engine's page, or why not."""
    running, waiting = snap.values.get("running"), snap.values.get("waiting")
    if running is None and waiting is None:
        return "it counts no running or waiting requests"
    vals = (running or 0.0, waiting or 0.0)
    if not all(math.isfinite(v) and v >= 0 for v in vals):
        return f"running {running}, waiting {waiting}: not counts"
    kv = snap.values.get("kv_usage")
    return (*vals, kv if kv is not None and math.isfinite(kv) else None)


async def start(gateway: Gateway, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve ``gateway`` on ``host:port`` (0: a free port); the runner and the bound port.
    A client that disconnects cancels its request, and so the upstream's. The body is
    read as sent (no decompression: a body with a ``Content-Encoding`` is refused, 415). If it
    cannot listen (``OSError``), what the start opened is closed again and no access log
    is written."""
    runner = web.AppRunner(gateway.app, access_log=None, handle_signals=False, handler_cancellation=True,
                           auto_decompress=False, logger=quiet_server_logger())
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    gateway.listening()  # (before the loop runs again: no request is answered without the log)
    addresses = runner.addresses
    return runner, int(addresses[0][1]) if addresses else port

