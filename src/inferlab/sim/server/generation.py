"""One request's answer from the simulated server: SSE chunks as tokens leave the
engine, or one JSON body; both end with usage and the ``inferlab_timeline`` extension."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from inferlab.sim.engine.engine import TokenEvent

if TYPE_CHECKING:
    from inferlab.sim.server.app import SimServer


class Generation:
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
