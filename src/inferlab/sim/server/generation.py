"""One request's answer from the simulated server: SSE chunks as tokens leave the
engine, or one JSON body; both end with usage and the ``inferlab_timeline`` extension."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from inferlab.openai.response import Completion
from inferlab.openai.response import usage as usage_object
from inferlab.openai.sse import DONE_EVENT, encode_json
from inferlab.sim.engine.engine import TokenEvent

if TYPE_CHECKING:
    from inferlab.sim.server.app import SimServer


class Generation:
    """One request's output, as chunks or one body."""

    def __init__(self, server: SimServer, rid: str, chat: bool, received_s: float, prompt_tokens: int) -> None:
        self.server = server
        self.rid = rid
        self.received_s = received_s
        self.prompt_tokens = prompt_tokens
        self.answer = Completion(rid, chat, int(time.time()), server.config.model_name)
        self.n_out = 0
        self.finish_reason = "length"

    def usage(self) -> dict[str, Any]:
        tl = self.server.engine.timeline(self.rid)
        return usage_object(self.prompt_tokens, self.n_out, tl.cached_tokens)

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
        answer = self.answer
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
                out += encode_json(answer.chunk([answer.choice(tok.output_piece(ev.token_index), None)]))
                if finished:
                    break
            if finished:
                self._observe()
                # The timeline is complete only now: it rides on the stream's last chunk,
                # the usage chunk when one was asked for, else the finish chunk.
                last = answer.chunk([answer.choice("", self.finish_reason)], **({} if include_usage else {"inferlab_timeline": self.timeline()}))
                out += encode_json(last)
                if include_usage:
                    out += encode_json(answer.chunk([], usage=self.usage(), inferlab_timeline=self.timeline()))
                out += DONE_EVENT
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
        body = self.answer.body("".join(pieces), self.finish_reason, self.usage(), inferlab_timeline=self.timeline())
        return web.json_response(body)
