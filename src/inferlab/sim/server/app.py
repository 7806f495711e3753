"""The simulated engine behind an OpenAI-compatible HTTP API (aiohttp), in real time.

Routes: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions`` (streaming and
not), ``/health``, ``/ping``, ``/version``, ``/metrics`` (Prometheus, vLLM's metric
names), ``/tokenize`` and ``/detokenize`` (vLLM's). A request is checked as vLLM checks
it (``inferlab.openai.request``), and every client error is answered with a 4xx in
OpenAI's error format, never a 5xx. Each response's final chunk (or body) carries
``inferlab_timeline``: the engine's own view of the request, in ms since the server
received it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import itertools
import json
import time
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from inferlab._clock import NS_PER_S, Clock, WallClock
from inferlab.openai.context import STREAM_ABORT, ContextError
from inferlab.openai.errors import APIError, SGLangAPIError, error_body, one_line
from inferlab.openai.request import (
    MAX_LOGPROBS,
    PATHS,
    Api,
    GenerationParams,
    limit_field,
    parse_body,
    read_bool,
    read_chat_template,
    read_messages,
    read_model,
    read_params,
    read_prompt,
)
from inferlab.openai.response import Completion
from inferlab.openai.sse import DONE_EVENT, encode_json
from inferlab.results.provenance import ENGINE_ROUTE
from inferlab.sim.engine.engine import Engine, EngineConfig, TokenEvent
from inferlab.sim.engine.families import EngineFamily
from inferlab.sim.engine.outputs import COMPLETIONS_DEFAULT_MAX_TOKENS, natural_output_len
from inferlab.sim.server.generation import Generation, OutputPlan
from inferlab.sim.server.output import LogprobTable, OutputText
from inferlab.sim.server.prometheus import (
    ITERATION_TOKEN_BUCKETS,
    Histogram,
    RequestHistograms,
    SGLangRequests,
    render_metrics,
    render_sglang_metrics,
)
from inferlab.workload.builtin_tokenizer import BuiltinTokenizer
from inferlab.workload.tokenizers import Tokenizer, load_tokenizer

#: How far the engine may run behind the wall clock before it skips ahead (an overloaded
#: host): beyond this, simulated time is pulled forward and the lag shows in /metrics.
_MAX_CATCH_UP_S = 0.05

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class ServerConfig:
    """How the simulated server behaves. ``engine`` holds the vLLM-style engine flags."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    served_model_name: str | None = None
    max_waiting_requests: int = 4096  # beyond this many queued requests: HTTP 429
    natural_output_median_tokens: int = 120  # output length when the client does not fix one
    tokenizer: str | None = None  # a local tokenizer.json (or its directory); None: built-in
    # vLLM's --enable-prompt-tokens-details: usage says the prompt tokens the prefix cache served
    enable_prompt_tokens_details: bool = False
    # vLLM's --enable-request-id-headers: every response carries an X-Request-Id header
    enable_request_id_headers: bool = False

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.engine.model


def random_id() -> str:
    """16 random hex digits: vLLM's ``random_uuid`` (vllm/utils/__init__.py), the random
    part of its answer ids and model permission ids."""
    return f"{uuid.uuid4().int & (1 << 64) - 1:016x}"


def error_response(status: int, message: str, error_type: str, param: str | None = None) -> web.Response:
    """An OpenAI error answer (``inferlab.openai.errors``)."""
    return web.json_response(error_body(status, message, error_type, param), status=status)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except APIError as e:
        return web.json_response(e.body(), status=e.status)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        answer = error_response(e.status, f"{e.reason}: {request.method} {request.path}", "NotFoundError" if e.status == 404 else "BadRequestError")
        if "Allow" in e.headers:  # (a 405 says which methods the route takes, as HTTP requires)
            answer.headers["Allow"] = e.headers["Allow"]
        return answer
    except (asyncio.CancelledError, ConnectionError):
        raise  # the client went away: nothing to answer
    except Exception as e:  # a bug: still answer in the API's error format
        return error_response(500, f"internal error: {type(e).__name__}: {e}", "InternalServerError")


class EngineLoop:
    """Runs the engine against the wall clock: step, wait out the step's simulated
    duration, then hand each token to its request's queue."""

    def __init__(self, engine: Engine, clock: Clock) -> None:
        self.engine = engine
        self.clock = clock
        self.t0_ns = clock.now_ns()
        self.queues: dict[str, asyncio.Queue[TokenEvent]] = {}
        self._wake = asyncio.Event()
        self.lag = Histogram((0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5))
        self.iteration_tokens = Histogram(ITERATION_TOKEN_BUCKETS)
        #: the share of the prompt tokens the last step that admitted prompts found in the
        #: prefix cache (SGLang's ``cache_hit_rate``: its last prefill batch's)
        self.last_prefill_hit_rate = 0.0
        # tokens waiting on the simulated API front end: (delivery time, events), in order
        self._late: deque[tuple[float, list[TokenEvent]]] = deque()
        self._courier: asyncio.Future[None] | None = None

    def now_s(self) -> float:
        return (self.clock.now_ns() - self.t0_ns) / NS_PER_S

    def submit(
        self, request_id: str, prompt_ids: list[int], output_len: int, arrival_s: float | None = None,
        max_tokens: int | None = None,
    ) -> asyncio.Queue[TokenEvent]:
        """Queue a request that arrived at ``arrival_s`` (None: now; never later than
        now), ``ValueError`` if the engine rejects it. ``max_tokens``: its own limit
        (``Engine.add_request``)."""
        now = self.now_s()
        self.engine.add_request(
            request_id, prompt_ids, output_len, now if arrival_s is None else min(arrival_s, now), max_tokens
        )
        q: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self.queues[request_id] = q
        self._wake.set()
        return q

    def release(self, request_id: str) -> None:
        self.queues.pop(request_id, None)
        self.engine.abort(request_id)
        self.engine.forget(request_id)

    async def run(self) -> None:
        busy_until_s: float | None = None
        while True:
            await self._wake.wait()
            # Back-to-back steps follow each other in simulated time, so the wall clock's
            # wake-up lateness is reported (``lag``) but never accumulates.
            now_s = self.now_s()
            start_s = now_s if busy_until_s is None else max(busy_until_s, now_s - _MAX_CATCH_UP_S)
            looked_up = self.engine.prefix_queries_tokens, self.engine.prefix_hits_tokens
            result = self.engine.step(start_s)
            if result is None:
                busy_until_s = None
                self._wake.clear()
                continue
            busy_until_s = start_s + result.duration_s
            # (vLLM's: the prompt tokens a step computed and the tokens it generated)
            self.iteration_tokens.observe(result.stats.prefill_tokens + len(result.events))
            queries = self.engine.prefix_queries_tokens - looked_up[0]
            if queries > 0:
                self.last_prefill_hit_rate = (self.engine.prefix_hits_tokens - looked_up[1]) / queries
            due_ns = self.t0_ns + int(busy_until_s * NS_PER_S)
            await self.clock.sleep_until_ns(due_ns)
            self.lag.observe(max(0.0, (self.clock.now_ns() - due_ns) / NS_PER_S))
            delivered_s = result.delivered_s
            if self._late or (delivered_s is not None and delivered_s > busy_until_s):
                # streaming queued at the simulated API front end: the tokens reach their
                # clients later, in order, while the engine steps on
                self._late.append((delivered_s or busy_until_s, result.events))
                if self._courier is None or self._courier.done():
                    self._courier = asyncio.ensure_future(self._deliver_late())
            else:
                self._put(result.events)

    def _put(self, events: list[TokenEvent]) -> None:
        for ev in events:
            q = self.queues.get(ev.request_id)
            if q is not None:
                q.put_nowait(ev)

    async def _deliver_late(self) -> None:
        """Hand out late tokens at their delivery times, oldest first."""
        while self._late:
            at_s, events = self._late[0]
            await self.clock.sleep_until_ns(self.t0_ns + int(at_s * NS_PER_S))
            self._late.popleft()
            self._put(events)


class SimServer:
    """The aiohttp application around one ``EngineLoop``."""

    def __init__(self, config: ServerConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or WallClock()
        self.tokenizer: Tokenizer = load_tokenizer(config.tokenizer) if config.tokenizer else BuiltinTokenizer()
        # (each token's time: /metrics has the inter-token latency)
        self.engine = Engine(config.engine, record_token_times=True)
        # a client may send an answer back in its next prompt (a conversation's next turn):
        # the engine caches each answer's blocks by their content, as vLLM does
        self.engine.output_token = self.tokenizer.output_token
        self.loop: EngineLoop | None = None
        self._ids = itertools.count()
        self.output = OutputText(self.tokenizer)
        self.logprobs = LogprobTable(self.output, MAX_LOGPROBS)
        #: the finished requests' observations for /metrics: SGLang's or vLLM's (``--engine-family``)
        self.requests: SGLangRequests | RequestHistograms = (
            SGLangRequests() if config.engine.engine_family is EngineFamily.SGLANG
            else RequestHistograms(self.engine.limits.max_model_len)
        )
        #: requests ended, by finish reason (``stop``, ``length``; ``abort``: the client went first)
        self.finished: Counter[str] = Counter()
        self.app = web.Application(middlewares=[_errors], client_max_size=64 * 1024 * 1024)
        self.app.add_routes([
            web.get("/v1/models", self.models),
            web.post("/v1" + PATHS["chat"], self.chat),
            web.post("/v1" + PATHS["completions"], self.completions),
            web.get("/health", self.health),
            web.get("/ping", self.health),
            web.post("/ping", self.health),
            web.get("/version", self.version),
            web.get(ENGINE_ROUTE, self.engine_config),
            web.get("/metrics", self.metrics),
            web.post("/tokenize", self.tokenize),
            web.post("/detokenize", self.detokenize),
        ])
        if config.enable_request_id_headers:
            self.app.on_response_prepare.append(_request_id_header)
        self.app.on_startup.append(self._start_engine)
        self.app.on_cleanup.append(self._stop_engine)

    @property
    def requests_ok(self) -> int:
        """Requests the engine ended (a stop or the length), aborted ones left out."""
        return sum(n for reason, n in self.finished.items() if reason != "abort")

    async def _start_engine(self, app: web.Application) -> None:
        self.loop = EngineLoop(self.engine, self.clock)
        self._task = asyncio.ensure_future(self.loop.run())

    async def _stop_engine(self, app: web.Application) -> None:
        self._task.cancel()
        if self.loop is not None and self.loop._courier is not None:
            self.loop._courier.cancel()

    # -- plain routes ---------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def engine_config(self, request: web.Request) -> web.Response:
        """The engine this server simulates, every size resolved (``EngineConfig``'s
        fields, as ``sim run`` records them, plus the GPU preset a free-text name ran
        as): a run against this server records it, so a replay can run the same engine."""
        engine = self.engine
        config = {**dataclasses.asdict(engine.config), "gpu_preset": engine.gpu.name}
        return web.json_response(json.loads(json.dumps(config, default=str)))

    async def version(self, request: web.Request) -> web.Response:
        """vLLM's ``/version``, with inferlab's version: the server is not vLLM."""
        try:
            version = importlib.metadata.version("inferlab")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        return web.json_response({"version": version})

    async def models(self, request: web.Request) -> web.Response:
        """vLLM 0.32's model card (entrypoints/serve/engine/protocol.py ``ModelCard``, one
        ``ModelPermission`` as entrypoints/openai/models/serving.py gives it), but for
        ``owned_by``: ``inferlab-sim`` tells a client (bench's ``client.serverid``) that
        this server is not vLLM."""
        created = int(time.time())
        permission = {
            "id": f"modelperm-{random_id()}",
            "object": "model_permission",
            "created": created,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
        card = {
            "id": self.config.model_name,
            "object": "model",
            "created": created,
            "owned_by": "inferlab-sim",
            "root": self.config.engine.model,
            "parent": None,
            "max_model_len": self.engine.limits.max_model_len,
            "permission": [permission],
        }
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(self, request: web.Request) -> web.Response:
        """The Prometheus page: SGLang's names with ``--engine-family sglang``, vLLM's otherwise."""
        assert self.loop is not None
        if isinstance(self.requests, SGLangRequests):
            text = render_sglang_metrics(self.config.model_name, self.engine, self.requests,
                                         self.loop.last_prefill_hit_rate, self.loop.lag, self.finished["abort"])
        else:
            text = render_metrics(self.config.model_name, self.engine, self.requests, self.loop.iteration_tokens,
                                  self.loop.lag, self.finished)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``/tokenize``: ``prompt`` (text) or chat ``messages``, with
        ``add_generation_prompt`` (default true) and ``add_special_tokens`` (default true
        for a prompt, false for messages: vLLM's). The simulated model, like Qwen, has no
        BOS or EOS to add, so ``add_special_tokens`` changes no count (as with vLLM
        serving Qwen); it is checked all the same. ``return_token_strs`` (vLLM: each
        token's string in the model's vocabulary) is refused: the simulated tokenizer's
        vocabulary is not the model's."""
        body = await _json_body(request)
        self._check_model(body)
        if read_bool(body, "return_token_strs", False):
            _refuse("return_token_strs", "the tokens' strings (the simulated tokenizer's vocabulary is not the model's)")
        if body.get("messages") is not None:
            read_bool(body, "add_special_tokens", False)
            _refuse_unsimulated_chat(body)
            ids = self._chat_prompt(body)
        elif isinstance(body.get("prompt"), str):
            read_bool(body, "add_special_tokens", True)
            ids = self.tokenizer.encode(body["prompt"])
        else:
            raise APIError(400, "give 'prompt' (a string) or 'messages'")
        return web.json_response(
            {"count": len(ids), "max_model_len": self.engine.limits.max_model_len, "tokens": ids}
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        self._check_model(body)
        tokens = body.get("tokens")
        vocab = self.tokenizer.vocab_size
        if not isinstance(tokens, list) or not all(type(t) is int and 0 <= t < vocab for t in tokens):
            raise APIError(400, f"'tokens' must be a list of token ids in [0, {vocab})")
        try:
            return web.json_response({"prompt": self.tokenizer.decode(tokens)})
        except ValueError as e:
            raise APIError(400, str(e)) from e

    # -- generation -----------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        received_s = self._now_s()
        body = await _json_body(request)
        self._check_model(body)
        read_bool(body, "add_special_tokens", False)
        return await self._generate(request, body, self._chat_prompt(body), chat=True, received_s=received_s)

    def _chat_prompt(self, body: dict[str, Any]) -> list[int]:
        """The token ids of a chat request's messages in the chat template, with the
        generation prompt unless ``add_generation_prompt`` is false."""
        messages = read_messages(body)
        add_generation_prompt, continue_final = read_chat_template(body)
        if continue_final:
            raise APIError(400, "continue_final_message is not supported by the simulated server.", param="continue_final_message")
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt)
        except ValueError as e:
            raise APIError(400, str(e)) from e

    async def completions(self, request: web.Request) -> web.StreamResponse:
        received_s = self._now_s()
        body = await _json_body(request)
        self._check_model(body)
        prompt = read_prompt(body)
        read_bool(body, "add_special_tokens", True)
        if isinstance(prompt, str):
            prompt_ids = self.tokenizer.encode(prompt)
        else:
            if not all(0 <= t < self.tokenizer.vocab_size for t in prompt):
                raise APIError(400, f"token ids must be in [0, {self.tokenizer.vocab_size})")
            prompt_ids = list(prompt)
        return await self._generate(request, body, prompt_ids, chat=False, received_s=received_s)

    def _now_s(self) -> float:
        assert self.loop is not None
        return self.loop.now_s()

    def _check_model(self, body: dict[str, Any]) -> None:
        """``APIError`` 404 for a model the server does not serve; none named (absent,
        null or empty) means the served one, as with vLLM."""
        model = read_model(body)
        if model and model not in (self.config.model_name, self.config.engine.model):
            raise APIError(404, f"The model `{model}` does not exist.", "NotFoundError", param="model")

    def _plan(self, params: GenerationParams, prompt_ids: list[int], param: str = "max_tokens") -> OutputPlan:
        """How many tokens to generate, how the answer ends and what it shows. A stop
        string or stop token (``OutputText.stop``) ends it where it would end the
        simulated model's text, within the length otherwise chosen; ``ignore_eos`` does not
        turn stops off (vLLM's rule). ``APIError`` 400 for what the server does not serve
        (``n`` > 1, prompt logprobs) or what does not fit the context
        (``Engine.output_limit``: from vLLM 0.32 on a ``max_tokens`` over the context
        the prompt leaves is lowered to it; ``param`` names the field it came in; SGLang's
        refusals are ``SGLangAPIError``s, in its words and body), and a ``min_tokens`` over
        the limit (vLLM's check, on max_tokens as lowered; SGLang cuts such an answer)."""
        if params.n != 1:
            raise APIError(400, f"n must be 1: the simulated server answers with one choice, got {params.n}.", param="n")
        if params.prompt_logprobs is not None:
            raise APIError(400, "prompt_logprobs is not supported by the simulated server.", param="prompt_logprobs")
        sglang = self.engine.sglang_api
        try:
            limit = self.engine.output_limit(len(prompt_ids), params.max_tokens, param)
        except ContextError as e:
            if sglang:
                raise SGLangAPIError(400, str(e), stream_type=e.stream_type) from e
            raise APIError(400, str(e), param=e.param) from e
        # (SGLang checks min_tokens against max_tokens as asked, as ``read_params`` did, in
        # other words, and cuts the answer at the limit all the same)
        if params.min_tokens > limit and not sglang:
            raise APIError(400, f"min_tokens must be less than or equal to max_tokens={limit}, got {params.min_tokens}.")
        # (vLLM's sampling max_tokens, as its request_params_max_tokens histogram sees it)
        max_tokens = None if params.max_tokens is None else limit
        if params.ignore_eos or params.min_tokens >= limit:
            tokens, reason = limit, "length"
        else:
            natural = max(natural_output_len(prompt_ids, self.config.natural_output_median_tokens), params.min_tokens)
            tokens, reason = (limit, "length") if natural >= limit else (natural, "stop")
        # include_stop_str_in_output: the stop string, or the stop token's text, stays in
        # the text, and a stream holds nothing back (vLLM's stop buffer is then empty)
        hold = 0 if params.include_stop_str else max(map(len, params.stop), default=1) - 1
        stop = None
        if params.stop or params.stop_token_ids:
            stop = self.output.stop(params.stop, params.stop_token_ids, params.min_tokens)
        if stop is not None and stop.tokens <= tokens:
            cut = stop.text_chars
            if params.include_stop_str:
                cut = cut + len(stop.reason) if isinstance(stop.reason, str) else self.output.chars(stop.tokens)
            return OutputPlan(stop.tokens, "stop", stop.reason, cut, hold, params.logprobs, max_tokens, limit)
        return OutputPlan(tokens, reason, None, None, hold, params.logprobs, max_tokens, limit)

    async def _generate(
        self, request: web.Request, body: dict[str, Any], prompt_ids: list[int], *, chat: bool, received_s: float
    ) -> web.StreamResponse:
        """``received_s``: when the handler began, before the body was parsed and its
        prompt tokenized: the modelled API cost (``api_overhead_s``) stands for that work,
        so this process's own time for it is not charged on top (a long prompt's
        tokenizing here would otherwise add to its TTFT, more on a busy machine)."""
        assert self.loop is not None
        api: Api = "chat" if chat else "completions"
        params = read_params(body, api)
        _refuse_unsimulated(body, chat)
        if not chat:
            if self.engine.sglang_api and "max_tokens" in body and body["max_tokens"] is None:
                # (SGLang's CompletionRequest types max_tokens as an integer, 16 by default; its
                # validation_exception_handler answers 400, type "Bad Request", no param)
                raise SGLangAPIError(400, "max_tokens: Input should be a valid integer", "Bad Request")
            params = completions_limit(body, params)
        try:
            plan = self._plan(params, prompt_ids, limit_field(body))
        except SGLangAPIError as e:
            if params.stream and e.stream_type is not None:
                return await _refuse_in_stream(request, e, e.stream_type, Completion(
                    f"{'chatcmpl' if chat else 'cmpl'}-{random_id()}", chat, int(time.time()), self.config.model_name))
            raise
        request_id = body.get("request_id")
        if request_id is not None and not isinstance(request_id, str):
            raise APIError(400, "request_id: Input should be a valid string", param="request_id")
        if self.engine.num_waiting >= self.config.max_waiting_requests:
            raise APIError(429, "The server is overloaded: too many requests are waiting.", "RateLimitError")
        prefix = "chatcmpl" if chat else "cmpl"
        rid = f"{prefix}-{next(self._ids)}"  # (the engine's own id: unique whatever the client sends)
        try:
            queue = self.loop.submit(rid, prompt_ids, plan.tokens, received_s, plan.limit or None)
        except ValueError as e:
            raise APIError(400, str(e)) from e
        # vLLM 0.32's answer id (entrypoints/serve/engine/serving.py ``_base_request_id``, as
        # entrypoints/openai/completion/serving.py and chat_completion/serving.py call it):
        # the X-Request-Id header, else the body's request_id, else 16 random hex digits
        # (a counter would repeat across restarts, and logs joined by id would conflate them)
        base = request.headers.get("X-Request-Id", request_id if request_id is not None else random_id())
        gen = Generation(self, rid, chat, received_s, len(prompt_ids), plan, f"{prefix}-{base}")
        try:
            if params.stream:
                return await gen.stream(request, queue, params.include_usage)
            return await gen.whole(queue)
        finally:
            if not gen.finished:
                self.finished["abort"] += 1
            self.loop.release(rid)


async def _request_id_header(request: web.Request, response: web.StreamResponse) -> None:
    """vLLM's ``--enable-request-id-headers`` (entrypoints/serve/middleware/x_request_id.py):
    every response carries ``X-Request-Id``, the request's own if it sent one, else a new
    random one (32 hex digits, not the answer id's)."""
    response.headers["X-Request-Id"] = request.headers.get("X-Request-Id", uuid.uuid4().hex)


async def _json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object (what aiohttp's ``request.json()`` does, with the API's
    errors). A body not labelled ``application/json`` (another type, or none: curl's
    ``-d`` labels it a form) is refused as vLLM refuses it, with a 400, not read as JSON
    all the same: a client that forgets the header would work here and fail on vLLM."""
    if request.content_type != "application/json":
        raise APIError(400, "Unsupported Media Type: Only 'application/json' is allowed")
    try:
        raw = await request.read()
    except (web.RequestPayloadError, HttpProcessingError) as e:  # broken framing or encoding
        # (aiohttp's C parser wraps the parser's error, its pure-Python one raises it as is)
        reason = e.__cause__ or e
        raise APIError(400, f"the request body could not be read: {one_line(str(reason))}") from None
    return parse_body(raw, request.charset)


def _refuse(param: str, what: str) -> NoReturn:
    raise APIError(400, f"{param}: {what} is not simulated by the simulated server.", param=param)


async def _refuse_in_stream(request: web.Request, error: APIError, error_type: str, answer: Completion,
                            ) -> web.StreamResponse:
    """A refusal sent inside a stream, as SGLang sends some (``SGLangAPIError``): HTTP
    200, one event ``{"error": ...}`` with ``error_type``, then ``[DONE]``; for
    ``STREAM_ABORT`` (SGLang 0.5.6-0.5.9) no error but ``answer``'s chunks ending with
    finish_reason "abort" and no text (chat: the role's chunk first). (SGLang may send
    a usage chunk before ``[DONE]``, with ``stream_options.include_usage``: not here.)"""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    if error_type != STREAM_ABORT:
        events = [{"error": {**error.body(), "type": error_type}}]
    elif answer.chat:
        events = [answer.chunk([answer.choice("", None, role=True)]),
                  answer.chunk([{"index": 0, "delta": {}, "finish_reason": STREAM_ABORT}])]
    else:
        events = [answer.chunk([answer.choice("", STREAM_ABORT)])]
    await resp.write(b"".join(encode_json(e) for e in events) + DONE_EVENT)
    await resp.write_eof()
    return resp


def completions_limit(body: Mapping[str, Any], params: GenerationParams) -> GenerationParams:
    """A completions request's ``max_tokens`` as vLLM reads it: 16 where the request
    gives none (an explicit null: the context left), and ``max_completion_tokens``,
    a chat field vLLM's completions API would ignore, refused rather than honoured
    (vLLM would answer in 16 tokens where we would answer in as many as it says)."""
    if body.get("max_completion_tokens") is not None:
        raise APIError(400, "max_completion_tokens is a chat completions field: vLLM's completions API ignores it "
                       f"(and answers in max_tokens, {COMPLETIONS_DEFAULT_MAX_TOKENS} by default): give max_tokens",
                       param="max_completion_tokens")
    if "max_tokens" in body:
        return params
    if params.min_tokens > COMPLETIONS_DEFAULT_MAX_TOKENS:  # (vLLM's check, against its default)
        raise APIError(400, f"min_tokens must be less than or equal to max_tokens={COMPLETIONS_DEFAULT_MAX_TOKENS}, "
                       f"got {params.min_tokens}.", param="min_tokens")
    return dataclasses.replace(params, max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS)


def _refuse_unsimulated_chat(body: Mapping[str, Any]) -> None:
    """The chat fields of ``_refuse_unsimulated``: tools, a required tool call, and
    content other than text. ``/tokenize`` checks them too: it would count the messages
    without the tools' definitions, or an image as no tokens."""
    if body.get("tools") or body.get("functions"):
        _refuse("tools" if body.get("tools") else "functions",
                "tool calling (the simulated model calls no tool, and the tool definitions would count no tokens; "
                "send them as a system message to count them)")
    if body.get("tool_choice") not in (None, "none", "auto"):
        _refuse("tool_choice", "a required tool call")
    # what changes the chat template's output, which the simulated tokenizer renders one way
    if body.get("chat_template") is not None:
        _refuse("chat_template", "a chat template of the request's own")
    for key in ("chat_template_kwargs", "documents", "reasoning_effort"):
        if body.get(key):
            _refuse(key, "arguments to the chat template (the simulated tokenizer's template takes none)")
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, Mapping) else None
                if kind != "text":
                    _refuse("messages", f"content of type {kind!r} (the simulated models read text only)")


def _refuse_unsimulated(body: Mapping[str, Any], chat: bool) -> None:
    """``APIError`` 400 for a request field the simulated server would otherwise take and
    not honour, so that its answer (and its timing) would not be what was asked: tools
    (the simulated model calls none, and its template would not count their tokens),
    structured output (``response_format`` JSON, vLLM's ``guided_*``, ``structural_tag``
    and ``structured_outputs``), ``echo`` (both APIs), ``best_of`` above 1, beam search,
    usage in every stream chunk, chat content other than text (the simulated models read
    text only; an image would count as no tokens), the chat template's own inputs
    (``chat_template``, ``chat_template_kwargs``, ``documents``, ``reasoning_effort``),
    ``truncate_prompt_tokens``, what constrains the tokens drawn (``logit_bias``,
    ``allowed_token_ids``, ``bad_words``), ``cache_salt``, token ids in the answer
    (``return_tokens_as_token_ids``, ``return_token_ids``); and, as vLLM refuses them,
    ``suffix``, ``logits_processors`` and a ``priority`` other than 0 (vLLM's default FCFS
    scheduling)."""
    if chat:
        _refuse_unsimulated_chat(body)
        if read_bool(body, "echo", False):
            _refuse("echo", "echoing the last message")
    else:
        if read_bool(body, "echo", False):
            _refuse("echo", "echoing the prompt")
        if body.get("suffix") is not None:  # (vLLM's own answer to it)
            raise APIError(400, "suffix is not currently supported", param="suffix")
    if body.get("truncate_prompt_tokens") is not None:
        _refuse("truncate_prompt_tokens", "truncating the prompt")
    for key, what in (
        ("logit_bias", "biasing tokens (a real model's answer, and its length through EOS, would change)"),
        ("allowed_token_ids", "restricting the tokens drawn"),
        ("bad_words", "banning words (the simulated model would write them all the same)"),
        ("cache_salt", "salting the prefix cache (the salted request would share cached blocks it must not)"),
    ):
        if body.get(key):
            _refuse(key, what)
    if body.get("logits_processors"):  # (vLLM's answer without --logits-processor-pattern)
        raise APIError(400, "The `logits_processors` argument is not supported by this server.", param="logits_processors")
    priority = body.get("priority")
    if priority is not None and priority != 0:  # (vLLM's answer with its default FCFS scheduling)
        if type(priority) is not int:
            raise APIError(400, "priority: Input should be a valid integer", param="priority")
        raise APIError(400, f"Got priority {priority} but Priority scheduling is not enabled.", param="priority")
    for key, what in (("return_tokens_as_token_ids", "tokens as token ids"), ("return_token_ids", "token ids in the answer")):
        if read_bool(body, key, False):
            _refuse(key, what)
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        _refuse("response_format", "structured output (the simulated model writes the same text whatever the format)")
    for key in ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structural_tag", "structured_outputs"):
        if body.get(key) is not None:
            _refuse(key, "structured output (the simulated model writes the same text whatever the format)")
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        _refuse("best_of", "more than one candidate per prompt")
    if body.get("use_beam_search"):
        _refuse("use_beam_search", "beam search")
    opts = body.get("stream_options")
    if isinstance(opts, Mapping) and opts.get("continuous_usage_stats"):
        _refuse("stream_options", "usage in every stream chunk (continuous_usage_stats)")
