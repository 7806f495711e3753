"""The simulated engine behind an OpenAI-compatible HTTP API (aiohttp), in real time.

Routes: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions`` (streaming and
not), ``/health``, ``/metrics`` (Prometheus, vLLM's metric names), ``/tokenize`` and
``/detokenize`` (vLLM's). Errors are OpenAI-style JSON. Each response's final chunk (or
body) carries ``inferlab_timeline``: the engine's own view of the request, in ms since
the server received it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import select
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import web

from inferlab._clock import NS_PER_S, Clock, WallClock
from inferlab._errors import InferlabError
from inferlab._tokenizers import Tokenizer, load_tokenizer
from inferlab.sim._engine import Engine, EngineConfig, TokenEvent
from inferlab.sim._prometheus import Histogram, render_metrics
from inferlab.sim._tokenizer import BuiltinTokenizer, natural_output_len

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

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.engine.model


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


def error_response(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except APIError as e:
        return error_response(e.status, e.message, e.kind)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return error_response(e.status, f"{e.reason}: {request.method} {request.path}", "NotFoundError" if e.status == 404 else "BadRequestError")
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

    def now_s(self) -> float:
        return (self.clock.now_ns() - self.t0_ns) / NS_PER_S

    def submit(self, request_id: str, prompt_ids: list[int], output_len: int) -> asyncio.Queue[TokenEvent]:
        """Queue a request (``ValueError`` if the engine rejects it)."""
        self.engine.add_request(request_id, prompt_ids, output_len, self.now_s())
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
            result = self.engine.step(start_s)
            if result is None:
                busy_until_s = None
                self._wake.clear()
                continue
            busy_until_s = start_s + result.duration_s
            due_ns = self.t0_ns + int(busy_until_s * NS_PER_S)
            await self.clock.sleep_until_ns(due_ns)
            self.lag.observe(max(0.0, (self.clock.now_ns() - due_ns) / NS_PER_S))
            for ev in result.events:
                q = self.queues.get(ev.request_id)
                if q is not None:
                    q.put_nowait(ev)


class SimServer:
    """The aiohttp application around one ``EngineLoop``."""

    def __init__(self, config: ServerConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or WallClock()
        self.tokenizer: Tokenizer = load_tokenizer(config.tokenizer) if config.tokenizer else BuiltinTokenizer()
        self.engine = Engine(config.engine)
        self.loop: EngineLoop | None = None
        self._ids = itertools.count()
        self.ttft = Histogram((0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0))
        self.e2e = Histogram((0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0))
        self.requests_ok = 0
        self.app = web.Application(middlewares=[_errors], client_max_size=64 * 1024 * 1024)
        self.app.add_routes([
            web.get("/v1/models", self.models),
            web.post("/v1/chat/completions", self.chat),
            web.post("/v1/completions", self.completions),
            web.get("/health", self.health),
            web.get("/metrics", self.metrics),
            web.post("/tokenize", self.tokenize),
            web.post("/detokenize", self.detokenize),
        ])
        self.app.on_startup.append(self._start_engine)
        self.app.on_cleanup.append(self._stop_engine)

    async def _start_engine(self, app: web.Application) -> None:
        self.loop = EngineLoop(self.engine, self.clock)
        self._task = asyncio.ensure_future(self.loop.run())

    async def _stop_engine(self, app: web.Application) -> None:
        self._task.cancel()

    # -- plain routes ---------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.config.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "inferlab-sim",
            "root": self.config.engine.model,
            "max_model_len": self.config.engine.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(self, request: web.Request) -> web.Response:
        assert self.loop is not None
        text = render_metrics(self.config.model_name, self.engine, self.ttft, self.e2e, self.loop.lag, self.requests_ok)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        self._check_model(body)
        if "messages" in body:
            try:
                ids = self.tokenizer.apply_chat_template(_messages(body))
            except ValueError as e:
                raise APIError(400, str(e)) from e
        elif isinstance(body.get("prompt"), str):
            ids = self.tokenizer.encode(body["prompt"])
        else:
            raise APIError(400, "give 'prompt' (a string) or 'messages'")
        return web.json_response(
            {"count": len(ids), "max_model_len": self.config.engine.max_model_len, "tokens": ids}
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
        body = await _json_body(request)
        self._check_model(body)
        try:
            prompt_ids = self.tokenizer.apply_chat_template(_messages(body))
        except ValueError as e:
            raise APIError(400, str(e)) from e
        return await self._generate(request, body, prompt_ids, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        self._check_model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            if not all(0 <= t < self.tokenizer.vocab_size for t in prompt):
                raise APIError(400, f"token ids must be in [0, {self.tokenizer.vocab_size})")
            prompt_ids = list(prompt)
        else:
            raise APIError(400, "'prompt' must be a string or a non-empty list of token ids")
        return await self._generate(request, body, prompt_ids, chat=False)

    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model not in (self.config.model_name, self.config.engine.model):
            raise APIError(404, f"The model `{model}` does not exist.", "NotFoundError")

    def _output_len(self, body: dict[str, Any], prompt_ids: list[int]) -> tuple[int, str]:
        """How many tokens to generate, and the finish reason that will be reported."""
        room = self.config.engine.max_model_len - len(prompt_ids)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
            raise APIError(400, "max_tokens must be a positive integer")
        if max_tokens is not None and len(prompt_ids) + max_tokens > self.config.engine.max_model_len:
            raise APIError(
                400,
                f"This model's maximum context length is {self.config.engine.max_model_len} tokens. "
                f"However, you requested {len(prompt_ids) + max_tokens} tokens "
                f"({len(prompt_ids)} in the messages, {max_tokens} in the completion). "
                "Please reduce the length of the messages or completion.",
            )
        if room < 1:
            raise APIError(
                400,
                f"This model's maximum context length is {self.config.engine.max_model_len} tokens. "
                f"However, your prompt has {len(prompt_ids)} tokens. Please reduce the length of the prompt.",
            )
        limit = max_tokens if max_tokens is not None else room
        min_tokens = body.get("min_tokens") or 0
        if body.get("ignore_eos") or (isinstance(min_tokens, int) and min_tokens >= limit):
            return limit, "length"
        natural = natural_output_len(prompt_ids, self.config.natural_output_median_tokens)
        if isinstance(min_tokens, int):
            natural = max(natural, min_tokens)
        return (limit, "length") if natural >= limit else (natural, "stop")

    async def _generate(
        self, request: web.Request, body: dict[str, Any], prompt_ids: list[int], *, chat: bool
    ) -> web.StreamResponse:
        assert self.loop is not None
        received_s = self.loop.now_s()
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise APIError(400, "'stream' must be a boolean")
        output_len, finish_reason = self._output_len(body, prompt_ids)
        opts = body.get("stream_options") or {}
        include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
        if self.engine.num_waiting >= self.config.max_waiting_requests:
            raise APIError(429, "The server is overloaded: too many requests are waiting.", "RateLimitError")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{next(self._ids)}"
        try:
            queue = self.loop.submit(rid, prompt_ids, output_len)
        except ValueError as e:
            raise APIError(400, str(e)) from e
        gen = _Generation(self, rid, chat, received_s, len(prompt_ids))
        gen.finish_reason = finish_reason
        try:
            if stream:
                return await gen.stream(request, queue, include_usage)
            return await gen.whole(queue)
        finally:
            self.loop.release(rid)


class _Generation:
    """One request's output, as chunks or one body."""

    def __init__(self, server: SimServer, rid: str, chat: bool, received_s: float, prompt_tokens: int) -> None:
        self.server = server
        self.rid = rid
        self.chat = chat
        self.received_s = received_s
        self.prompt_tokens = prompt_tokens
        self.created = int(time.time())
        self.model = server.config.model_name
        self.n_out = 0
        self.finish_reason = "length"

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        obj = {
            "id": self.rid,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

    def _choice(self, text: str, finish: str | None, role: bool = False) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if role else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    def usage(self) -> dict[str, Any]:
        tl = self.server.engine.timeline(self.rid)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.n_out,
            "total_tokens": self.prompt_tokens + self.n_out,
            "prompt_tokens_details": {"cached_tokens": tl.cached_tokens},
        }

    def timeline(self) -> dict[str, Any]:
        tl = self.server.engine.timeline(self.rid)

        def ms(t: float | None) -> float | None:
            return None if t is None else round((t - self.received_s) * 1e3, 4)

        return {
            "queued_ms": ms(tl.arrival_s),
            "scheduled_ms": ms(tl.scheduled_s),
            "first_token_ms": ms(tl.first_token_s),
            "finished_ms": ms(tl.finished_s),
            "cached_tokens": tl.cached_tokens,
            "preemptions": tl.preemptions,
        }

    def _observe(self) -> None:
        tl = self.server.engine.timeline(self.rid)
        if tl.first_token_s is not None:
            self.server.ttft.observe(tl.first_token_s - self.received_s)
        if tl.finished_s is not None:
            self.server.e2e.observe(tl.finished_s - self.received_s)
        self.server.requests_ok += 1

    async def stream(self, request: web.Request, queue: asyncio.Queue[TokenEvent], include_usage: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        tok = self.server.tokenizer
        finished = False
        while not finished:
            events = [await queue.get()]
            while not queue.empty():
                events.append(queue.get_nowait())
            out = bytearray()
            for ev in events:
                if self.n_out == 0 and self.chat:
                    out += self._chunk([self._choice("", None, role=True)])
                self.n_out += 1
                finished = ev.finished
                out += self._chunk([self._choice(tok.output_piece(ev.token_index), None)])
                if finished:
                    break
            if finished:
                self._observe()
                last = self._chunk([self._choice("", self.finish_reason)], **({} if include_usage else {"inferlab_timeline": self.timeline()}))
                out += last
                if include_usage:
                    out += self._chunk([], usage=self.usage(), inferlab_timeline=self.timeline())
                out += b"data: [DONE]\n\n"
            await resp.write(bytes(out))
        await resp.write_eof()
        return resp

    async def whole(self, queue: asyncio.Queue[TokenEvent]) -> web.Response:
        tok = self.server.tokenizer
        pieces: list[str] = []
        while True:
            ev = await queue.get()
            self.n_out += 1
            pieces.append(tok.output_piece(ev.token_index))
            if ev.finished:
                break
        self._observe()
        text = "".join(pieces)
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": self.finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.finish_reason}
        return web.json_response({
            "id": self.rid,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(),
            "inferlab_timeline": self.timeline(),
        })


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    return body


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
        raise APIError(400, "'messages' must be a non-empty list of message objects")
    for m in msgs:
        if m.get("role") not in ("system", "user", "assistant", "tool", "developer"):
            raise APIError(400, f"unknown message role {m.get('role')!r}")
    return msgs


# -- running it ---------------------------------------------------------------------


async def start_site(server: SimServer, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving; return the runner and the bound port (``port=0`` picks a free one)."""
    # handler_cancellation: a client that disconnects aborts its request (as vLLM does)
    # instead of leaving it queued in the engine.
    runner = web.AppRunner(server.app, access_log=None, handle_signals=False, handler_cancellation=True)
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
            reason = err[-1] if err else "no answer"
            raise InferlabError(f"the simulated server did not start: {reason}")
        self.url = line.strip()

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
