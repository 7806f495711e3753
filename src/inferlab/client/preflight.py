"""The preflight probe: small requests before a run, never counted in its results.

It answers, before N requests are sent: does the server accept this request at all
(401/403/404 end the run at once with the server's message); does it accept
``ignore_eos``/``min_tokens`` (if not, they are dropped and the summary says output
lengths are not forced); how many tokens the chat template (or BOS) adds to a prompt;
and how synthetic prompts can hit their token lengths without a local tokenizer —
exactly, with the server's ``/tokenize`` (vLLM, SGLang, llama.cpp, the simulator), or
approximately, calibrated from two probes' ``usage.prompt_tokens``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inferlab._clock import WallClock
from inferlab._errors import RunFailedError, UsageError
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.workload.lengths import MAX_LENGTH_TOKENS
from inferlab.workload.prompts import PromptBuilder, words
from inferlab.workload.spec import RequestSpec
from inferlab.workload.text import WORDS
from inferlab.workload.tokenizers import Tokenizer

if TYPE_CHECKING:  # (aiohttp loads with the first HTTP call: `sim run` makes none)
    import aiohttp

    from inferlab.client.http import Endpoint
    from inferlab.openai.context import SGLangLimits
    from inferlab.workload.config import WorkloadConfig
    from inferlab.workload.lengths import LengthDist

PROBE_WORDS = 64
_MIN_VOCAB = 32  # fewer one-token words than this: fall back to calibration
#: /tokenize requests in flight at once: llama-server answers HTTP on a pool of about as
#: many threads as it has slots, and counts should not fill it.
_TOKENIZE_CONCURRENCY = 4
#: Statuses that say a server has no tokenize route at that URL.
_NO_ROUTE = (404, 405, 501)
EXACT_LOCAL = "exact (local tokenizer)"
EXACT_SERVER = "exact (server /tokenize)"
APPROX_USAGE = "approximate (calibrated from usage)"
APPROX_WORDS = "approximate (one word per token assumed)"
#: No probe (``--no-preflight``, Locust's workers): prompts of one-token words as
#: ``APPROX_WORDS``, the template's tokens unknown.
APPROX_NO_PREFLIGHT = "approximate (no preflight: one word per token assumed)"
NO_FORCE_WARNING = "server rejects ignore_eos/min_tokens; output lengths are not forced"


@dataclass(frozen=True)
class Preflight:
    """What the probe learned. ``prompt_overhead_tokens``: prompt tokens the server adds
    around the text (chat template, BOS); ``None`` when unknown. ``vocab`` /
    ``tokens_per_word`` tell the prompt builder how to hit lengths."""

    accepts_exact_output: bool = True
    prompt_overhead_tokens: int | None = None
    input_length_source: str = APPROX_WORDS
    vocab: tuple[str, ...] = WORDS
    tokens_per_word: float = 1.0
    has_tokenize: bool = False
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["vocab_words"] = len(d.pop("vocab"))
        return d


async def run_preflight(
    endpoint: Endpoint, *, exact_output: bool, tokenizer: Tokenizer | None
) -> Preflight:
    """Probe ``endpoint``. ``UsageError`` when the server refuses the request outright
    (HTTP 401, 403 or 404); any other failure is left for the run to record."""
    import aiohttp

    from inferlab.client.http import session_trace

    text = " ".join(words("inferlab:probe", PROBE_WORDS))
    async with aiohttp.ClientSession(connector=_closing(), trace_configs=[session_trace()]) as session:
        first = await _probe(session, endpoint, text, exact_output)
        _refuse_if_rejected(endpoint, first)
        accepts = True
        notes: list[str] = []
        if exact_output and first.status in (400, 422):
            plain = await _probe(session, endpoint, text, False)
            if plain.ok:
                accepts, first = False, plain
                notes.append(NO_FORCE_WARNING)
        _fail_if_unusable(endpoint, first)
        if not first.ok:
            return Preflight(accepts_exact_output=accepts, warnings=notes)
        tok = TokenizeRoute(session, endpoint)
        if tokenizer is not None:
            raw: int | None = len(tokenizer.encode(text))
            _refuse_a_foreign_tokenizer(tokenizer, len(tokenizer.encode(text)), await tok.count(text), first.input_tokens, endpoint)
        else:
            raw = await tok.count(text)
        usage = first.input_tokens
        if usage is None and raw is not None and endpoint.api == "chat":
            usage = await tok.count_messages(RequestSpec(text).messages())
        overhead = usage - raw if usage is not None and raw is not None else None
        if tokenizer is not None:
            return Preflight(accepts, overhead, EXACT_LOCAL, has_tokenize=tok.available, warnings=notes)
        if tok.available:
            vocab = await tok.one_token_words(WORDS)
            if len(vocab) >= _MIN_VOCAB and await tok.verify(vocab):
                return Preflight(accepts, overhead, EXACT_SERVER, vocab, has_tokenize=True, warnings=notes)
        if usage is None:
            return Preflight(accepts, overhead, APPROX_WORDS, has_tokenize=tok.available, warnings=notes)
        longer = await _probe(session, endpoint, " ".join(words("inferlab:probe", 2 * PROBE_WORDS)), False)
        if not longer.ok or longer.input_tokens is None or longer.input_tokens <= usage:
            return Preflight(accepts, overhead, APPROX_WORDS, has_tokenize=tok.available, warnings=notes)
        per_word = (longer.input_tokens - usage) / PROBE_WORDS
        if overhead is None:
            overhead = round(usage - per_word * PROBE_WORDS)
        return Preflight(accepts, overhead, APPROX_USAGE, WORDS, per_word, tok.available, notes)


def _closing() -> aiohttp.TCPConnector:
    """A connector that closes each connection after its answer. A pooled keep-alive
    connection left idle holds one of llama-server's few HTTP threads until its 5 s idle
    timeout, and the run's first requests wait for them."""
    import aiohttp

    return aiohttp.TCPConnector(force_close=True)


async def _probe(session: aiohttp.ClientSession, endpoint: Endpoint, text: str, exact: bool) -> RequestRecord:
    from inferlab.client.http import Client

    record = RequestRecord(index=-1)
    client = Client(endpoint, WallClock(), session, 0)
    await client.send(RequestSpec(text, 1, exact), record)
    return record


def _refuse_if_rejected(endpoint: Endpoint, r: RequestRecord) -> None:
    if r.status not in (401, 403, 404):
        return
    message = (r.error or f"HTTP {r.status}").strip()
    hint = {401: "check --api-key", 403: "check --api-key", 404: "check --model, --url and --api"}
    raise UsageError(
        f"{endpoint.url} rejected the probe request ({message}); {hint[r.status or 404]}"
    )


def _refuse_a_foreign_tokenizer(
    tokenizer: Tokenizer, local: int, server: int | None, usage: int | None, endpoint: Endpoint
) -> None:
    """``UsageError`` when the local tokenizer is not the server's: its count of the probe
    differs from the server's ``/tokenize``, or (without one) is more than the server
    counted for the whole prompt. Its prompts would have the wrong lengths, and token-id
    prompts ids the server does not know."""
    name = getattr(tokenizer, "path", "--tokenizer")
    if server is not None and server != local:
        why = f"the probe text is {local} tokens with it and {server} with the server's /tokenize"
    elif server is None and usage is not None and usage < local:
        why = f"the probe text is {local} tokens with it, but the server counted {usage} for the whole prompt"
    else:
        return
    raise UsageError(f"{name} is not {endpoint.model}'s tokenizer: {why}; give the model's own tokenizer.json, or none")


#: Failures that may pass (overload, a restart): the run records them instead.
_TRANSIENT = {408, 409, 425, 429, 500, 502, 503, 504}


def _fail_if_unusable(endpoint: Endpoint, r: RequestRecord) -> None:
    """``RunFailedError`` when the probe shows every request would fail the same way:
    a client error other than a rate limit, an unsupported method, or an answer that is
    not the OpenAI format (a web server that is no inference server, say)."""
    if r.ok:
        return
    kind = r.error_kind
    if kind is ErrorKind.HTTP_STATUS and r.status in (400, 422) and endpoint.extra_body:
        raise RunFailedError(
            f"{endpoint.url} refused the probe request ({(r.error or f'HTTP {r.status}').strip()}); "
            f"it carried {', '.join(sorted(endpoint.extra_body))} from --temperature/--extra-body: "
            "check they are fields this server takes"
        )
    if (kind is ErrorKind.HTTP_STATUS and r.status is not None and r.status not in _TRANSIENT) or kind is ErrorKind.MALFORMED:
        raise RunFailedError(
            f"{endpoint.url} does not answer like an OpenAI-compatible server: "
            f"{(r.error or f'HTTP {r.status}').strip()}"
        )


class TokenizeRoute:
    """The server's tokenize route, if it has one: ``POST /tokenize`` with ``prompt``
    (vLLM, SGLang, the simulator: ``count``/``tokens``) or ``content`` (llama.cpp:
    ``tokens``). ``add_special_tokens`` false (``special``: true, so the count is of the
    prompt the engine will run, a BOS token included): counts are of the text alone. A
    count of zero for non-empty input is no answer (llama.cpp answers a body without
    ``content`` with no tokens); once ``content`` has answered, it is sent directly.
    ``available`` turns False once every URL failed before any count came. ``patient``
    (a long-lived caller: the gateway): only an answer that says there is no such route
    (404, 405, 501, or a success without a count) counts as failing; a request that got
    no answer (a timeout, a refused connection) or another error status (a server still
    loading, one odd request) says nothing of the route, and ``unanswered`` is set.
    ``timeout_s`` bounds each request; at most ``concurrency`` are in flight."""

    def __init__(self, session: aiohttp.ClientSession, endpoint: Endpoint, timeout_s: float = 30.0,
                 special: bool = False, patient: bool = False, concurrency: int = _TOKENIZE_CONCURRENCY) -> None:
        self.session = session
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.special = special
        self.patient = patient
        root = endpoint.base_url.removesuffix("/v1")
        self.urls = [root + "/tokenize", endpoint.base_url + "/tokenize"]
        self.available = True
        self.unanswered = False  # (patient: the last count got no answer that says anything)
        self.last_status: int | None = None  # the last answer's HTTP status (None: no answer)
        self._url: str | None = None
        self._content_body = False  # llama.cpp's {"content": text}
        self._limit = asyncio.Semaphore(concurrency)

    async def _post(self, url: str, body: dict[str, Any]) -> Any:
        """The JSON answer, or None for an error status, a non-JSON answer or a failure
        (patient: ``unanswered`` set where it says nothing of the route). A connection
        that broke before the answer (the server closed it: a reset, a write that
        failed, a disconnect) is tried once more on a new connection of its own: the
        pooled one may be one the server closed (llama.cpp closes the connection after
        every streamed response, though it says keep-alive, and idle ones after 5 s;
        after counts ``concurrency`` at a time the pool can hold many it closed, and a
        second pooled one lost the count), and counting has no side effect. A refused
        connection or a timeout is not tried again."""
        import aiohttp

        async def post(session: aiohttp.ClientSession) -> Any:
            async with self._limit, session.post(
                url, data=json.dumps(body), headers=self.endpoint.request_headers(),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as resp:
                self.last_status = resp.status
                if resp.status < 400:
                    return await resp.json(content_type=None)
                self.unanswered = resp.status not in _NO_ROUTE
                return None

        try:
            try:
                return await post(self.session)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
                if isinstance(e, (aiohttp.ClientConnectorError, TimeoutError)):
                    raise
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
                return await post(fresh)
        except (aiohttp.ClientConnectionError, TimeoutError):
            self.unanswered = True
            return None
        except (aiohttp.ClientError, ValueError, RecursionError):  # (a body too deep to decode)
            return None

    async def _count(self, body: dict[str, Any], text: str | None) -> int | None:
        if not self.available:
            return None
        self.unanswered = False
        self.last_status = None
        for url in [self._url] if self._url else self.urls:
            if self._content_body and text is not None:
                n = _token_count(await self._post(url, {"content": text, "add_special": self.special}))
            else:
                got = await self._post(url, body)
                n = _token_count(got)
                if n == 0 and text and isinstance(got, dict) and "count" not in got:
                    n = _token_count(await self._post(url, {"content": text, "add_special": self.special}))  # llama.cpp
                    self._content_body = bool(n)
            if n is not None and (n > 0 or text == ""):
                self._url = url
                return n
            if self.patient and self.unanswered:
                return None  # (nothing learnt of the route)
        if self._url is None:
            self.available = False
        return None

    async def count(self, text: str) -> int | None:
        body = {"model": self.endpoint.model, "prompt": text, "add_special_tokens": self.special}
        return await self._count(body, text)

    async def count_messages(self, messages: list[dict[str, str]], tools: Any = None) -> int | None:
        body = {"model": self.endpoint.model, "messages": messages}
        if tools is not None:
            body["tools"] = tools
        return await self._count(body, None)

    async def one_token_words(self, vocab: tuple[str, ...]) -> tuple[str, ...]:
        """The words that are one token both bare and after a space ("w w" → 2). One
        request when every word passes (checked together), else one per word."""
        if await self.count(" ".join(vocab)) == len(vocab):
            return vocab
        counts = await asyncio.gather(*(self.count(f"{w} {w}") for w in vocab))
        return tuple(w for w, n in zip(vocab, counts, strict=True) if n == 2)

    async def verify(self, vocab: tuple[str, ...]) -> bool:
        b = PromptBuilder(vocab=vocab)
        for n in (1, 37, 300):
            text, _ = b.prompt(f"inferlab:verify:{n}", n)
            if await self.count(str(text)) != n:
                return False
        return True


def _token_count(obj: object) -> int | None:
    if not isinstance(obj, dict):
        return None
    if type(obj.get("count")) is int:  # (not a bool)
        return int(obj["count"])
    tokens = obj.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


@dataclass(frozen=True)
class ContextRule:
    """How a server treats a request at its context of ``context`` tokens: a prompt (as
    sent) of ``prompt_limit`` tokens or more is refused; prompt + output up to
    ``answer_room`` gets its whole answer, longer ones are cut there (``exact_refused``:
    one asking for an exact length is refused instead, vLLM's min_tokens check); prompt
    + max_tokens over ``total_limit`` is refused whatever the output setting (None:
    not); ``server``: whose rule, in words for the messages; ``note``: what was assumed,
    said at the end of each."""

    context: int
    prompt_limit: int
    answer_room: int
    total_limit: int | None = None
    exact_refused: bool = True
    server: str = "vLLM's"
    note: str = ""

    @classmethod
    def vllm(cls, context: int) -> ContextRule:
        """vLLM's (and a server not known to be SGLang): a prompt of the whole context
        refused; max_tokens lowered to what the context leaves (0.32 on), min_tokens over
        that refused."""
        return cls(context, context, context)

    @classmethod
    def sglang(cls, limits: SGLangLimits, release: str | None) -> ContextRule:
        """SGLang's, from the simulated SGLang's own limits (``SGLangLimits``); ``release``:
        as the server stated it (None: unknown, a current release's rule assumed)."""
        said, note = (f"SGLang {release}'s", "") if release else ("SGLang's", " (SGLang's release unknown: 0.5.11's rule assumed)")
        return cls(limits.context, limits.prompt_limit, limits.answer_room, limits.total_limit, False, said, note)


def context_fit(wcfg: WorkloadConfig, pre: Preflight, context: ContextRule | int | None) -> str | None:
    """Whether the prompts and their answers fit the server's context (``context``: its
    stated ``max_model_len`` and how the server treats a request at it, ``ContextRule``;
    a bare length: vLLM's rule), checked before any request is
    sent where both are known: each prompt as sent (its length counted exactly by the
    probe, plus what the server adds around it: the chat template, a BOS) and the output
    tokens asked for. Prompts of known length: synthetic ones (``--input-tokens``),
    shared-prefix ones (the prefix + a suffix), a session's first turn (its system
    prompt + its first message: later turns grow with answers not yet known); a trace's
    and a dataset's are checked once built (``requests_fit``). A request that does not
    fit fails where its prompt alone reaches the context (whatever the output setting),
    and with exact output (``min_tokens``: vLLM lowers max_tokens to what the context
    has left, then refuses min_tokens over it; others refuse the request); without exact
    output the server cuts its answer short. Where every request would fail:
    ``UsageError``; where some may not fit: a warning for the summary, with their share
    (``_share_over``: exact for fixed, uniform, normal, lognormal and empirical lengths,
    normal and lognormal draws past ``_TAIL_SD`` standard deviations taken as never
    drawn). None when all fit or it cannot be known (approximate prompt lengths, a fixed
    prompt)."""
    from inferlab.workload.lengths import parse_length

    exact_prompts = pre.input_length_source in (EXACT_LOCAL, EXACT_SERVER)
    if context is None or not exact_prompts:
        return None
    if wcfg.sessions is not None:
        # (the first turn: its system prompt and message, each with the template's
        # tokens, of which the probe counted one message's: at least this many)
        prompts, extra, noun = parse_length(wcfg.input_tokens or 128), wcfg.system_tokens, "first-turn prompt"
    elif wcfg.prefix_groups is not None or wcfg.prefix_tokens is not None:
        suffix = wcfg.suffix_tokens if wcfg.suffix_tokens is not None else 64
        prompts, extra, noun = parse_length(suffix, "--suffix-tokens"), wcfg.prefix_tokens or 512, "prompt"
    elif wcfg.input_tokens is not None and wcfg.trace is None and wcfg.dataset is None:
        prompts, extra, noun = parse_length(wcfg.input_tokens), 0, "prompt"
    else:
        return None
    outputs = None if wcfg.output_tokens is None else parse_length(wcfg.output_tokens, "--output-tokens")
    exact = pre.accepts_exact_output and wcfg.exact_output
    return _fit(prompts, outputs, (pre.prompt_overhead_tokens or 0) + extra, _rule(context), exact, noun,
                at_least=wcfg.sessions is not None and wcfg.system_tokens > 0)


def requests_fit(
    lengths: Sequence[tuple[int, int | None]], exact_output: bool, pre: Preflight, context: ContextRule | int | None,
    what: str, overhead: int | None = None, at_least: bool = False,
) -> str | None:
    """``context_fit`` for requests whose prompt lengths are known before sending: each
    ``(prompt tokens, output tokens asked for)`` (a trace's rows as built; a dataset's
    rows as counted), named ``what`` in the messages; ``overhead``: what the server adds
    to each (default the probe's template tokens; 0 for counts of the prompt as sent);
    ``at_least``: the counts are lower bounds. An output of None (the server decides):
    only a prompt alone over the context is known to fail."""
    from inferlab.workload.lengths import empirical

    exact_prompts = pre.input_length_source in (EXACT_LOCAL, EXACT_SERVER)
    if context is None or not exact_prompts or not lengths:
        return None
    extra = (pre.prompt_overhead_tokens or 0) if overhead is None else overhead
    ins = [i for i, _ in lengths]
    outs = [o for _, o in lengths]
    if any(o is None for o in outs):
        return _fit(empirical(ins, what, what), None, extra, _rule(context), True, "prompt", at_least)
    pairs = tuple((i, int(o or 0)) for i, o in lengths)
    return _fit(empirical(ins, what, what, pairs), empirical([o for _, o in pairs], what, what, pairs), extra,
                _rule(context), pre.accepts_exact_output and exact_output, "prompt", at_least)


def _rule(context: ContextRule | int) -> ContextRule:
    return context if isinstance(context, ContextRule) else ContextRule.vllm(context)


async def count_prompts(endpoint: Endpoint, specs: Sequence[RequestSpec]) -> list[int] | None:
    """The tokens of each of ``specs``' prompts as sent, counted by the server's
    ``/tokenize`` (chat: its messages, the template included; completions: the text,
    without the BOS the probe's overhead holds); None where the route does not count
    them all."""
    import aiohttp

    async with aiohttp.ClientSession(connector=_closing()) as session:
        tok = TokenizeRoute(session, endpoint)
        if endpoint.api == "chat":
            counts = await asyncio.gather(*(tok.count_messages(s.messages()) for s in specs))
        else:
            counts = await asyncio.gather(*(tok.count(str(s.completion_prompt())) for s in specs))
    return None if any(c is None for c in counts) else [int(c or 0) for c in counts]


def _fit(prompts: LengthDist, outputs: LengthDist | None, overhead: int, rule: ContextRule, exact: bool,
         noun: str = "prompt", at_least: bool = False) -> str | None:
    """``context_fit``'s verdict on prompts of ``prompts`` tokens (+ ``overhead`` as
    sent: the template, a shared prefix, a system prompt; ``at_least``: more than that)
    and answers of ``outputs`` (None: not asked for; only a prompt the server refuses
    for its length alone is known to fail), by the server's ``rule``, with its note."""
    try:
        said = _verdict(prompts, outputs, overhead, rule, exact, noun, at_least)
    except UsageError as e:
        raise UsageError(f"{e}{rule.note}") from None
    return None if said is None else said + rule.note


def _verdict(prompts: LengthDist, outputs: LengthDist | None, overhead: int, rule: ContextRule, exact: bool,
             noun: str, at_least: bool) -> str | None:
    """``_fit``'s verdict, without the rule's note."""
    from inferlab.workload.lengths import LengthDist

    alone = outputs is None
    if outputs is None:  # (a prompt alone fails where the server refuses its length)
        outputs, exact = LengthDist("fixed", 1), True
    context, whose = rule.context, rule.server
    # (for the prompt's own tokens and the output: what gets the whole answer)
    room = (rule.prompt_limit if alone else rule.answer_room) - overhead
    paired = _paired(prompts, outputs)
    in_lo = min(i for i, _ in prompts.pairs) if paired else _least(prompts)
    in_hi = max(i for i, _ in prompts.pairs) if paired else _most(prompts)
    least = min(prompts.pairs, key=sum) if paired else (in_lo, _least(outputs))  # (the request asking least)
    refused_prompts = in_hi + overhead >= rule.prompt_limit
    if (max(map(sum, prompts.pairs)) if paired else _most(prompts) + _most(outputs)) <= room and not refused_prompts:
        return None
    sent = "at least " if at_least else ""
    edge = (f"the server's {context:,}-token context" if rule.answer_room == context
            else f"the {rule.answer_room:,} tokens {whose} server leaves a prompt and its answer in its {context:,}-token context")
    if alone:
        reach = (f"the server's {context:,}-token context" if rule.prompt_limit == context  # (any server's)
                 else f"{whose} limit of {rule.prompt_limit:,} prompt tokens in the server's {context:,}-token context")
        said = f"{noun}s of {_named(prompts)} (+ {sent}{overhead:,} as sent) can reach {reach}"
    elif prompts.kind in ("fixed", "uniform") and outputs.kind in ("fixed", "uniform"):
        said = f"{noun} {sent}{_most(prompts) + overhead:,} + {_most(outputs):,} output tokens > {edge}"
    else:
        said = (f"{noun}s of {_named(prompts)} (+ {sent}{overhead:,} as sent) and {_named(outputs)} output tokens can "
                f"exceed {edge}")
    if in_lo + overhead >= rule.prompt_limit:  # (even the shortest prompt is refused)
        limit = (f"the server's {context:,}-token context" if rule.prompt_limit == context
                 else f"{rule.prompt_limit:,}, the shortest prompt {whose} server refuses in its {context:,}-token context")
        raise UsageError(f"{noun} {sent}{in_lo + overhead:,} tokens (as sent) ≥ {limit}: every request would fail; "
                         "ask for shorter prompts, or a server with a longer context")
    total_room = None if rule.total_limit is None or alone else rule.total_limit - overhead
    if total_room is not None and sum(least) > total_room:
        raise UsageError(f"{noun} {sent}{least[0] + overhead:,} + {least[1]:,} output tokens > {rule.total_limit:,}, "
                         f"the most prompt + max_tokens {whose} server takes in its {context:,}-token context: every "
                         "request would be refused; ask for shorter prompts or answers, or a server with a longer context")
    if exact and sum(least) > room:
        if rule.exact_refused:
            raise UsageError(f"{noun} {sent}{least[0] + overhead:,} + {least[1]:,} output tokens > the server's "
                             f"{context:,}-token context: every request would fail (exact output: min_tokens over "
                             "what the context leaves); ask for shorter prompts or answers, a server with a longer "
                             "context, or --no-exact-output")
        raise UsageError(f"{noun} {sent}{least[0] + overhead:,} + {least[1]:,} output tokens > {edge}: every answer "
                         "would be cut short of the exact length asked (the server ends it there, min_tokens or not); "
                         "ask for shorter prompts or answers, or a server with a longer context")
    some = _some(_share_over(prompts, outputs, room))
    if alone:
        why = ("its prompt alone leaves no room for an answer" if rule.prompt_limit == context
               else f"{whose} server refuses a prompt of {rule.prompt_limit:,} tokens or more")
        return f"{said}: {some} may not fit, and each that does not fails ({why})"
    if rule.total_limit is not None:  # (SGLang's: refused over its total, cut short of the context below it)
        refused = f"{_some(_share_over(prompts, outputs, total_room))} refused (prompt + max_tokens over {rule.total_limit:,})" \
            if total_room is not None else ""
        if refused_prompts:
            refused += f"{', ' if refused else ''}{_some(_share_prompts(prompts, rule.prompt_limit - overhead))} " \
                       f"refused for a prompt of {rule.prompt_limit:,} tokens or more"
        of_them = f"; of them, {refused}" if refused else ""  # (the refused are among those counted first)
        return (f"{said}: {some} may not get their whole answer: {whose} server ends each answer "
                f"{context - rule.answer_room} tokens short of the context, an exact length too{of_them}")
    if exact:
        return f"{said}: {some} may not fit, and each that does not fails (exact output: min_tokens over what the context leaves)"
    return f"{said}: {some} may not fit; the server cuts their answers short (vLLM lowers max_tokens to what the context leaves) or refuses them"


def _some(share: float) -> str:
    """A share of requests, in words."""
    return ("every request" if share >= 1 else f"about {share:.0%} of requests" if share >= 0.01
            else f"about {100 * share:.2g}% of requests" if share >= 1e-4
            else "fewer than 1 in 10,000 requests" if share > 0 else "no request")


def _share_prompts(prompts: LengthDist, limit: int) -> float:
    """The share of ``prompts`` of ``limit`` tokens or more."""
    if prompts.pairs:
        return sum(i >= limit for i, _ in prompts.pairs) / len(prompts.pairs)
    return 1.0 - prompts.cdf()(limit - 1)


#: Normal and lognormal lengths past this many standard deviations (of the length, or of
#: its log) are taken as never drawn: a share under 1e-23 of draws.
_TAIL_SD = 10.0
#: The most lengths ``_share_over`` sums over one by one; a wider range is summed in
#: bins of equal width (each at its middle length).
_MAX_POINTS = 100_000


def _paired(prompts: LengthDist, outputs: LengthDist) -> bool:
    """Whether a request's two lengths are one row's of an empirical source (``sample_pair``)."""
    return bool(prompts.pairs) and prompts.kind == outputs.kind == "empirical" and prompts.source == outputs.source


def _least(dist: LengthDist) -> int:
    """The fewest tokens ``dist`` draws (normal, lognormal: 1, where they spread)."""
    if dist.kind == "empirical":
        return min(dist.values)
    if dist.kind in ("fixed", "uniform"):
        return int(dist.a)
    return 1 if dist.b > 0 else min(MAX_LENGTH_TOKENS, max(1, round(dist.a)))


def _most(dist: LengthDist) -> int:
    """The most tokens ``dist`` draws (normal, lognormal: cut at ``_TAIL_SD``)."""
    if dist.kind == "empirical":
        return max(dist.values)
    if dist.kind == "fixed":
        return int(dist.a)
    if dist.kind == "uniform":
        return int(dist.b)
    reach = dist.a + _TAIL_SD * dist.b if dist.kind == "normal" else dist.a * math.exp(min(_TAIL_SD * dist.b, 700.0))
    return min(MAX_LENGTH_TOKENS, max(1, math.ceil(reach)))


def _named(dist: LengthDist) -> str:
    return f"empirical:{dist.source or '...'}" if dist.kind == "empirical" else str(dist)


def _share_over(prompts: LengthDist, outputs: LengthDist, room: int) -> float:
    """The share of requests whose prompt and output lengths, drawn as the run draws them
    (one row's pair for an empirical source of both, else each on its own), sum to over
    ``room``: the pairs counted, or ``P(x > hi) + sum of P(x) P(y > room - x)`` for x
    from ``lo`` to ``hi`` (below ``lo`` no y is long enough, above ``hi`` every one is),
    x being whichever of the two has fewer such lengths."""
    if _paired(prompts, outputs):
        return sum(i + o > room for i, o in prompts.pairs) / len(prompts.pairs)

    def span(x: LengthDist, y: LengthDist) -> tuple[int, int]:
        return max(_least(x), room - _most(y) + 1), min(_most(x), room - _least(y))

    x, y = min((prompts, outputs), (outputs, prompts), key=lambda xy: span(*xy)[1] - span(*xy)[0])
    lo, hi = span(x, y)
    cdf_x, cdf_y = x.cdf(), y.cdf()
    share = 1.0 - cdf_x(max(hi, lo - 1))
    if x.kind == "empirical":  # (its lengths, counted)
        counts = Counter(v for v in x.values if lo <= v <= hi)
        return share + sum(n * (1.0 - cdf_y(room - v)) for v, n in counts.items()) / len(x.values)
    step = max(1, -(-(hi - lo + 1) // _MAX_POINTS))
    for start in range(lo, hi + 1, step):
        end = min(start + step - 1, hi)
        share += (cdf_x(end) - cdf_x(start - 1)) * (1.0 - cdf_y(room - (start + end) // 2))
    return share
