"""One request's answer from the simulated server: SSE chunks as tokens leave the
engine, or one JSON body; both end with usage and the ``inferlab_timeline`` extension."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from inferlab.openai.response import Completion, chat_logprobs, completion_logprobs
from inferlab.openai.response import usage as usage_object
from inferlab.openai.sse import DONE_EVENT, encode_json
from inferlab.sim.engine.engine import TokenEvent

if TYPE_CHECKING:
    from inferlab.sim.server.app import SimServer


@dataclass(frozen=True)
class OutputPlan:
    """How one answer goes, decided before the request reaches the engine.

    ``tokens``: how many the engine generates; ``finish_reason``, and vLLM's
    ``stop_reason`` (the stop string or token id that ended it, if one did).
    ``text_chars``: where the text ends when a stop cuts it (None: after the last
    token). ``hold_chars``: characters a stream holds back until no stop string can
    start in them (vLLM: the longest stop string's length less one). ``logprobs``:
    alternatives per token's log-probability, None for none. ``max_tokens``: as asked
    (lowered to the context left where the release does; None: not asked for);
    ``limit``: the request's own limit, ``max_tokens`` or else the context left (what
    SGLang's admission estimates its output from; 0: ``tokens``)."""

    tokens: int
    finish_reason: str
    stop_reason: str | int | None = None
    text_chars: int | None = None
    hold_chars: int = 0
    logprobs: int | None = None
    max_tokens: int | None = None
    limit: int = 0

    @property
    def plain(self) -> bool:
        """Each token's text is sent as it comes (no stop string, no stop)."""
        return self.text_chars is None and self.hold_chars == 0


class Generation:
    """One request's output, as chunks or one body: ``rid`` is the engine's id for it,
    ``answer_id`` the id the client sees."""

    def __init__(
        self, server: SimServer, rid: str, chat: bool, received_s: float, prompt_tokens: int, plan: OutputPlan,
        answer_id: str,
    ) -> None:
        self.server = server
        self.rid = rid
        self.received_s = received_s
        self.prompt_tokens = prompt_tokens
        self.plan = plan
        self.answer = Completion(answer_id, chat, int(time.time()), server.config.model_name, vllm_stop_reason=True)
        self.n_out = 0
        self.finished = False  # (the engine ended it: it counts as its finish reason, else as aborted)
        self._sent_chars = 0  # of the text, when the plan is not plain

    def usage(self, streamed: bool) -> dict[str, Any]:
        """The answer's ``usage``. Its ``prompt_tokens_details`` (the cached tokens) only
        with ``--enable-prompt-tokens-details``, as vLLM 0.32 writes it
        (entrypoints/openai/completion/serving.py, chat_completion/serving.py): without
        the flag, null in a whole answer and no key in a stream's usage chunk (vLLM
        writes that chunk without its null fields)."""
        cached = None
        if self.server.config.enable_prompt_tokens_details:
            cached = self.server.engine.timeline(self.rid).cached_tokens
        usage = usage_object(self.prompt_tokens, self.n_out, cached)
        if streamed and cached is None:
            del usage["prompt_tokens_details"]
        return usage

    def timeline(self) -> dict[str, Any]:
        return self.server.engine.timeline(self.rid).to_json_ms(self.received_s)

    def _observe(self) -> None:
        server = self.server
        tl = server.engine.timeline(self.rid)
        server.requests.observe(tl, self.received_s, tl.arrival_s + server.engine.api_overhead_s, self.plan.max_tokens)
        server.finished[self.plan.finish_reason] += 1
        self.finished = True

    def _text(self, index: int, last: bool) -> str:
        """The text token ``index`` adds to what was sent, under a plan that is not plain:
        up to the stop's cut when it is the last, else all but ``hold_chars``."""
        output = self.server.output
        if last and self.plan.text_chars is not None:
            end = self.plan.text_chars
        else:
            end = output.chars(index + 1) - (0 if last else self.plan.hold_chars)
        if end <= self._sent_chars:
            return ""
        text = output.text(self._sent_chars, end)
        self._sent_chars = end
        return text

    def _logprobs(self, first: int, count: int) -> dict[str, Any]:
        """The ``logprobs`` of tokens ``first`` to ``first + count``, in the answer's API."""
        assert self.plan.logprobs is not None
        table = self.server.logprobs
        tokens = [table.token(i, self.plan.logprobs) for i in range(first, first + count)]
        if self.answer.chat:
            return chat_logprobs(tokens)
        return completion_logprobs(tokens, self.server.output.chars(first))

    async def stream(self, request: web.Request, queue: asyncio.Queue[TokenEvent], include_usage: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        tok = self.server.tokenizer
        answer = self.answer
        plan = self.plan
        plain, logprobs = plan.plain, plan.logprobs is not None
        finished = False
        while not finished:
            events = [await queue.get()]
            while not queue.empty():
                events.append(queue.get_nowait())
            out = bytearray()
            for ev in events:
                if self.n_out == 0 and answer.chat:
                    out += encode_json(answer.chunk([answer.choice("", None, role=True)]))
                self.n_out += 1
                finished = ev.finished
                i = ev.token_index
                text = tok.output_piece(i) if plain else self._text(i, finished)
                lp = self._logprobs(i, 1) if logprobs else None
                if finished:
                    break
                out += encode_json(answer.chunk([answer.choice(text, None, logprobs=lp)]))
            if finished:
                self._observe()
                # The last token's chunk carries the finish reason, as vLLM's does (no
                # empty chunk after it). The timeline is complete only now: it rides on
                # the stream's last chunk, the usage chunk when one was asked for, else this.
                last = answer.chunk(
                    [answer.choice(text, plan.finish_reason, logprobs=lp, stop_reason=plan.stop_reason)],
                    **({} if include_usage else {"inferlab_timeline": self.timeline()}),
                )
                out += encode_json(last)
                if include_usage:
                    out += encode_json(answer.chunk([], usage=self.usage(streamed=True), inferlab_timeline=self.timeline()))
                out += DONE_EVENT
            await resp.write(bytes(out))
        await resp.write_eof()
        return resp

    async def whole(self, queue: asyncio.Queue[TokenEvent]) -> web.Response:
        tok = self.server.tokenizer
        plan = self.plan
        pieces: list[str] = []
        while True:
            ev = await queue.get()
            self.n_out += 1
            if plan.plain:
                pieces.append(tok.output_piece(ev.token_index))
            if ev.finished:
                break
        self._observe()
        if plan.plain:
            text = "".join(pieces)
        else:
            end = plan.text_chars if plan.text_chars is not None else self.server.output.chars(self.n_out)
            text = self.server.output.text(0, end)
        body = self.answer.body(
            text,
            plan.finish_reason,
            self.usage(streamed=False),
            logprobs=self._logprobs(0, self.n_out) if plan.logprobs is not None else None,
            stop_reason=plan.stop_reason,
            inferlab_timeline=self.timeline(),
        )
        return web.json_response(body)
