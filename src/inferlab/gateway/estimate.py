"""How many tokens a request will hold on its engine, before it is sent: its prompt (by
a tokenizer, or estimated from its length) plus the output it may produce. Admission
and per-key limits reserve this much; the reservation is trued up to the engine's own
count (``usage``) when the request ends."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from inferlab._clock import NS_PER_S, Clock
from inferlab._errors import UsageError
from inferlab.workload.tokenizers import chatml

log = logging.getLogger("inferlab.gateway")

#: Characters per token of English text with common BPE vocabularies (a rough, usually
#: high, estimate: it reserves a little more than a request will use).
CHARS_PER_TOKEN = 4

Counter = Callable[[str], int]


#: ``[admission] tokenizer = "upstream"``: each upstream's own ``/tokenize`` counts
#: (``UpstreamTokens``); 4 characters a token where it cannot.
UPSTREAM = "upstream"
#: The longest wait for an upstream's ``/tokenize`` before a request is counted by the
#: estimate instead.
TOKENIZE_TIMEOUT_S = 5.0


def prompt_counter(tokenizer: str) -> Counter:
    """A function from prompt text to its token count: ``estimate`` (one token per
    ``CHARS_PER_TOKEN`` characters), ``builtin`` (the simulator's tokenizer, exact for
    ``sim serve``) or the path of a tokenizer.json (needs the ``tokenizers`` extra);
    for ``upstream``, the estimate (what ``UpstreamTokens`` falls back on).
    ``UsageError`` if the tokenizer cannot be loaded."""
    if tokenizer in ("estimate", UPSTREAM):
        return lambda text: -(-len(text) // CHARS_PER_TOKEN)
    if tokenizer == "builtin":
        from inferlab.workload.builtin_tokenizer import BuiltinTokenizer

        builtin = BuiltinTokenizer()
        return lambda text: len(builtin.encode(text))
    from inferlab.workload.tokenizers import load_tokenizer

    try:
        hf = load_tokenizer(tokenizer)
    except (OSError, ValueError) as e:
        raise UsageError(f"[admission] tokenizer {tokenizer!r}: {e}") from None
    return lambda text: len(hf.encode(text))


def prompt_of(body: dict[str, Any], chat: bool) -> str | list[Any]:
    """A checked request's prompt as its engine will read it: a chat request's messages
    as ChatML text (so the template's tokens count too), a completions prompt's text, or
    its token ids."""
    if chat:
        return chatml(body["messages"])
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    return prompt if isinstance(prompt, list) else str(prompt)


def count_prompt(prompt: str | list[Any], count: Counter) -> int:
    """The tokens of a ``prompt_of``: text by ``count``, token ids as given."""
    return len(prompt) if isinstance(prompt, list) else count(prompt)


def prompt_tokens(body: dict[str, Any], chat: bool, count: Counter) -> int:
    """A checked request's prompt tokens (``prompt_of``, counted by ``count``)."""
    return count_prompt(prompt_of(body, chat), count)


#: Statuses that refuse one request's body (its messages, say), not the route: that
#: request is counted otherwise, and the route is asked again for the next.
_REFUSED = (400, 413, 422)


class UpstreamTokens:
    """Prompt tokens by one upstream's own ``/tokenize`` (``tokenizer = "upstream"``):
    a chat request's messages (and tools) as the engine's chat template renders them,
    where its route takes messages (vLLM, SGLang, ``sim serve``), else their ChatML text
    (llama.cpp's takes text only); a completions prompt's text; token ids as given.
    The count is given ``TOKENIZE_TIMEOUT_S`` in all; a request it does not count in
    time, or whose upstream has no such route, is counted by ``fallback``. After a count
    that got no answer (a timeout, a refused connection, a server error) the upstream
    is not asked again for ``BACKOFF_S``: a slow or failing route costs one request its
    wait, not every request; a route that refuses one request's body (400, 413, 422) is
    asked again for the next (a chat request then tries its ChatML text). The log says
    once that an upstream has no route, and once each time its route stops answering."""

    #: How long an upstream whose ``/tokenize`` did not answer is left unasked.
    BACKOFF_S = 30.0

    def __init__(self, session: Any, base_url: str, api_key: str | None, name: str, fallback: Counter,
                 clock: Clock) -> None:
        self.session = session
        self.base_url = base_url
        self.api_key = api_key
        self.name = name
        self.fallback = fallback
        self.clock = clock
        self._routes: dict[tuple[str, bool], Any] = {}  # (model, messages?) → TokenizeRoute
        self._said = False
        self._resting_until_ns = 0

    def _route(self, model: str, messages: bool) -> Any:
        from inferlab.client.exchange import Endpoint
        from inferlab.client.preflight import TokenizeRoute

        route = self._routes.get((model, messages))
        if route is None:
            endpoint = Endpoint(self.base_url + "/v1", model, api_key=self.api_key)
            # (special tokens counted: the engine runs the prompt with them)
            route = self._routes[(model, messages)] = TokenizeRoute(
                self.session, endpoint, TOKENIZE_TIMEOUT_S, special=True, patient=True, concurrency=256)
        return route

    async def count(self, body: dict[str, Any], prompt: str | list[Any], chat: bool, model: str) -> tuple[int, str]:
        """The prompt tokens of a checked request (``prompt``: its ``prompt_of``), and
        what counted them: ``upstream``, ``token_ids`` (a prompt of ids: their number) or
        ``estimate``."""
        if isinstance(prompt, list):
            return len(prompt), "token_ids"
        n = None
        if self.clock.now_ns() >= self._resting_until_ns:
            try:
                async with asyncio.timeout(TOKENIZE_TIMEOUT_S):
                    n = await self._ask(body, chat, model, prompt)
            except TimeoutError:
                self._rest(f"took over {TOKENIZE_TIMEOUT_S:.0f} s")
        if n is None:
            return count_prompt(prompt, self.fallback), "estimate"
        return n, UPSTREAM

    async def _ask(self, body: dict[str, Any], chat: bool, model: str, prompt: str) -> int | None:
        n = None
        if chat:
            route = self._route(model, True)
            n = await route.count_messages(body["messages"], body.get("tools"))
            if route.unanswered and route.last_status not in _REFUSED:
                self._rest("did not answer")
                return None
        if n is None:
            text = self._route(model, False)
            n = await text.count(prompt)
            if text.unanswered and text.last_status not in _REFUSED:
                self._rest("did not answer")
            elif n is None and not text.available and not self._said:
                self._said = True
                log.warning("upstream %s has no /tokenize that counts: prompt tokens estimated (%d characters a token)",
                            self.name, CHARS_PER_TOKEN)
        return n

    def _rest(self, why: str) -> None:
        if self.clock.now_ns() >= self._resting_until_ns:
            log.warning("upstream %s: /tokenize %s; prompt tokens estimated for the next %.0f s",
                        self.name, why, self.BACKOFF_S)
        self._resting_until_ns = self.clock.now_ns() + int(self.BACKOFF_S * NS_PER_S)
