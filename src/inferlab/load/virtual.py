"""The virtual-time executor: a load policy over the simulated engine, no HTTP, no
sleeping, deterministic (``sim run``, validation, ``inferlab tokens``).

``drive`` is the loop: send what the policy says is due, step the engine, report the
requests that ended, and jump over idle time to the policy's next send. What a send
becomes is the target's business: ``SimulatedServer`` makes ``RequestRecord``s as the
HTTP server would answer them (``sim run``); ``EngineTarget`` only queues requests and
leaves their timelines in the engine (validation, ``serve_timelines``).

As over HTTP, a request the engine cannot serve (longer than ``max_model_len``, larger
than the KV cache) is a failed record in ``sim run``, not the end of the run: kind
``http_status``, status 400, as bench records the simulated server's answer, its error
saying the engine rejected it (``REJECTED_PREFIX``); one that SGLang refuses inside the
stream (``ContextError.stream_type``) is kind ``stream_error``, status 200, as bench
records that answer (``REJECTED_IN_STREAM_PREFIX``; ``REJECTED_ABORTED_PREFIX`` where the
stream ends with finish_reason "abort" instead, SGLang 0.5.6-0.5.9's).
A stop request (``stop()`` true, or Ctrl-C) ends the run between steps: in-flight
requests become cancelled records and ``Interrupted`` carries everything recorded so far.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, replace
from typing import IO, Protocol

from inferlab._clock import NS_PER_S
from inferlab._errors import InferlabError
from inferlab.load.policy import Answer, OpenLoopPolicy, Policy, Send, make_policy
from inferlab.load.schedules import LoadConfig
from inferlab.openai.context import STREAM_ABORT, ContextError
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.sim.engine.engine import Engine, RequestTimeline, StepStats
from inferlab.sim.engine.outputs import COMPLETIONS_DEFAULT_MAX_TOKENS, natural_output_len
from inferlab.workload.builtin_tokenizer import BuiltinTokenizer
from inferlab.workload.sessions import SessionWorkload
from inferlab.workload.spec import RequestSpec, Trace
from inferlab.workload.tokenizers import Tokenizer

#: How a rejected request's error begins: no HTTP in virtual time, but the kind and
#: status a server gives it (``http_status``, 400), for summaries comparable with bench's.
REJECTED_PREFIX = "rejected by the engine (a server answers HTTP 400): "
#: ... and of one a server refuses inside the stream (SGLang's scheduler: ``stream_error``, 200).
REJECTED_IN_STREAM_PREFIX = "rejected by the engine (a server answers HTTP 200, then an error event): "
#: ... and of one whose stream ends with finish_reason "abort" instead (SGLang 0.5.6-0.5.9)
REJECTED_ABORTED_PREFIX = 'rejected by the engine (a server answers HTTP 200, then finish_reason "abort"): '
#: Time a rejected request takes at the least, so that a closed loop under ``duration_s``
#: still advances when every request is rejected.
_MIN_REJECT_S = 1e-6
#: Token times converted to ns kept for reuse (one per step; cleared beyond this)
_MAX_TOKEN_NS = 1 << 20

OnRecord = Callable[[RequestRecord], None]


class Target(Protocol):
    """What ``drive`` runs a policy against."""

    def add(self, send: Send) -> float | None:
        """Queue ``send`` at ``send.at_s``; ``None``, or the time (s) it ended at once,
        rejected."""
        ...

    def has_work(self) -> bool: ...

    def step(self, now_s: float) -> tuple[float, float, list[int], list[Answer] | None]:
        """One engine step from ``now_s``: its end, when its clients saw its tokens (the
        end, or later when streaming queued at the API front end), the indexes of the
        sends that completed in it, and their answers (``None`` when the target gives
        none)."""
        ...


class Interrupted(KeyboardInterrupt):
    """The run was stopped early. ``records`` (sorted by index) are every request that
    finished, failed or was cancelled in flight, each already passed to ``on_record``;
    ``cause`` is the error that stopped it (the workload could not make its next
    request), ``None`` for a stop or an interrupt.

    A ``KeyboardInterrupt`` subclass, so code that does not look for it still stops."""

    def __init__(self, records: list[RequestRecord], cause: InferlabError | None = None) -> None:
        super().__init__("run interrupted" if cause is None else str(cause))
        self.records = records
        self.cause = cause


class _Stop(Exception):
    """``stop()`` answered true: unwind to the caller of ``drive``."""


def drive(policy: Policy, target: Target, stop: Callable[[], bool] | None = None) -> None:
    """Run ``policy`` against ``target`` until nothing is due and nothing is in flight.
    Raises ``_Stop`` when ``stop()`` answers true (asked before every step), and what
    ``policy.due`` raises (a workload that cannot make its next request)."""
    now_s = policy.start_s()
    while True:
        if stop is not None and stop():
            raise _Stop
        for send in policy.due(now_s):
            end_s = target.add(send)
            if end_s is not None:  # rejected: it ended at once
                policy.ended(send.index, end_s, None)
        if not target.has_work():
            t = policy.next_s()
            if t is None:
                return
            now_s = max(now_s, t)
            continue
        now_s, seen_s, finished, answers = target.step(now_s)
        # a user sees its request end when the front end has delivered its last token
        if answers is None:
            for index in finished:
                policy.ended(index, seen_s, None)
        else:
            for index, answer in zip(finished, answers, strict=True):
                policy.ended(index, seen_s, answer)


def _ns(t_s: float) -> int:
    return int(t_s * NS_PER_S + 0.5)  # (as token times are: a send at an end is not before it; t_s >= 0)


class _TokenNs(dict[float, int]):
    """A token time (s) → integer ns, ``int(t * NS_PER_S + 0.5)``, each converted once:
    token times are step end times, so a run's millions of them take only as many
    distinct values as it had steps."""

    def __missing__(self, t_s: float) -> int:
        ns = self[t_s] = int(t_s * NS_PER_S + 0.5)
        return ns


class SimulatedServer:
    """The engine as ``sim run`` serves it: each send becomes a ``RequestRecord`` as the
    HTTP server would answer it (prompt counted with the chat template on the chat API,
    exactly ``max_tokens`` when the request asks for an exact length, else the simulated
    model's natural length within ``max_tokens`` (``output_len``), a 400 for what the
    engine rejects), finished with every token's time. ``answers``: completed sends report
    their reply (the built-in passage's tokens, decoded) for multi-turn sessions."""

    def __init__(
        self,
        engine: Engine,
        *,
        chat: bool = False,
        step_log: IO[str] | None = None,
        natural_median_tokens: int = 120,
        tokenizer: Tokenizer | None = None,
        on_record: OnRecord | None = None,
        answers: bool = False,
    ) -> None:
        engine.record_token_times = True  # ITL needs every token's time
        self.engine = engine
        self.tok: Tokenizer = tokenizer or BuiltinTokenizer()
        self.chat = chat
        self.step_log = step_log
        self.natural_median_tokens = natural_median_tokens
        self.on_record = on_record
        self.answers = answers
        if answers:  # a later turn's prompt holds this answer: the engine caches it by content
            engine.output_token = self.tok.output_token
        self.in_flight: dict[str, RequestRecord] = {}  # by request id
        self._received_s: dict[str, float] = {}  # by request id: sent earlier than it arrived (a gateway)
        self._finish: dict[str, str] = {}  # by request id: its finish reason ("length" or "stop")
        self.done: list[RequestRecord] = []
        self.token_ns = _TokenNs()

    def prompt_ids(self, spec: RequestSpec) -> list[int]:
        if isinstance(spec.prompt, list):  # (the engine reads it and keeps none: no copy)
            return spec.prompt
        if not isinstance(spec.prompt, str):
            return list(spec.prompt)
        if self.chat:
            return self.tok.apply_chat_template(spec.messages())
        return self.tok.encode(str(spec.completion_prompt()))

    def record(self, send: Send, ids: list[int]) -> RequestRecord:
        """The record of ``send`` (prompt ``ids``) as sent, nothing answered yet."""
        spec = send.spec
        return RequestRecord(
            index=send.index,
            warmup=send.warmup,
            intended_send_ns=_ns(send.intended_s),
            send_ns=_ns(send.at_s),
            status=200,
            input_tokens=len(ids),
            requested_input_tokens=spec.input_tokens,
            requested_output_tokens=spec.max_tokens,
            usage_source="engine",
            session=spec.session,
            turn=spec.turn,
            user=send.user,
            prefix_group=spec.prefix_group,
            prefix_tokens=spec.prefix_tokens,
            hash_ids=list(spec.hash_ids) or None,
        )

    def add(self, send: Send, at_s: float | None = None) -> float | None:
        """Queue ``send``; ``at_s``: when it reaches the engine, if not when it was sent
        (a gateway in front held it: the record's ``server_timeline`` is then measured
        from the send, with the wait as ``gateway_queue_ms``)."""
        ids = self.prompt_ids(send.spec)
        record = self.record(send, ids)
        arrive_s = send.at_s if at_s is None else at_s
        try:
            out, finish, limit = self.output_len(ids, send.spec)
            self.engine.add_request(str(send.index), ids, out, arrive_s, limit)
        except ValueError as e:  # what the HTTP server answers with 400
            end_ns = _ns(arrive_s + max(self.engine.api_overhead_s, _MIN_REJECT_S))
            # recorded as bench records the simulated server's answer (kind http_status,
            # status 400), so that sim run and bench count failures alike; the text says
            # no HTTP was involved
            if not isinstance(e, ContextError) or e.stream_type is None:
                record.status, record.error_kind, record.error = 400, ErrorKind.HTTP_STATUS, f"{REJECTED_PREFIX}{e}"
            elif e.stream_type == STREAM_ABORT:  # (SGLang 0.5.6-0.5.9: no error event, the answer aborted)
                record.status, record.error_kind, record.finish_reason = 200, ErrorKind.STREAM_ERROR, STREAM_ABORT
                record.error = f"{REJECTED_ABORTED_PREFIX}{e}"
            else:
                record.status, record.error_kind = 200, ErrorKind.STREAM_ERROR
                record.error = f"{REJECTED_IN_STREAM_PREFIX}{e}"
            record.ttfb_ns = record.end_ns = end_ns
            record.usage_source = "none"
            if at_s is not None:
                record.server_timeline = {"gateway_queue_ms": _wait_ms(send.at_s, at_s)}
            self.finish(record)
            return end_ns / NS_PER_S
        self.in_flight[str(send.index)] = record
        self._finish[str(send.index)] = finish
        if at_s is not None:
            self._received_s[str(send.index)] = send.at_s
        return None

    def output_len(self, ids: list[int], spec: RequestSpec) -> tuple[int, str, int]:
        """How many tokens the answer has, its finish reason and the request's own limit
        (``max_tokens``, else the context left: what SGLang's and TensorRT-LLM's
        admissions reserve its output from), by the simulated HTTP server's rule: exactly ``max_tokens`` when the request asks for an exact length
        (``spec.exact_output``: ``ignore_eos``/``min_tokens``); else the simulated model's
        natural length (``natural_output_len``, its end-of-sequence), cut at
        ``max_tokens`` or, without one, at the context that is left on the chat API and at
        16 tokens on the completions API (vLLM's defaults; ``length`` when cut,
        ``stop`` when the model ended first). A ``max_tokens`` over the context the
        prompt leaves is lowered to it where the release does (``Engine.output_limit``,
        vLLM 0.32 on; SGLang cuts every answer two tokens short of the context, an exact
        length included). ``ValueError`` (the server's 400) for what the server refuses
        there, and, but for SGLang, for an exact length over the limit (its ``min_tokens``)."""
        if spec.max_tokens is None and not self.chat:  # (vLLM's completions default, as the HTTP server's)
            spec = replace(spec, max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS, exact_output=False)
        cap = self.engine.output_limit(len(ids), spec.max_tokens)
        if spec.exact_output and spec.max_tokens is not None:
            # (the request's min_tokens, over max_tokens as vLLM lowers it; SGLang cuts the answer there)
            if spec.max_tokens > cap and not self.engine.sglang_api:
                raise ValueError(f"min_tokens must be less than or equal to max_tokens={cap}, got {spec.max_tokens}.")
            return cap, "length", cap
        natural = natural_output_len(ids, self.natural_median_tokens)
        return (cap, "length", cap) if natural >= cap else (natural, "stop", cap)

    def finish(self, record: RequestRecord) -> None:
        self.done.append(record)
        if self.on_record is not None:
            self.on_record(record)

    def has_work(self) -> bool:
        return self.engine.has_work()

    def step(self, now_s: float) -> tuple[float, float, list[int], list[Answer] | None]:
        result = self.engine.step(now_s, token_events=False)
        assert result is not None
        end_s = now_s + result.duration_s
        seen_s = end_s if result.delivered_s is None else result.delivered_s
        if self.step_log is not None:
            self.step_log.write(json.dumps(_stats_json(result.stats)) + "\n")
        finished: list[int] = []
        answers: list[Answer] | None = [] if self.answers else None
        token_ns = self.token_ns
        if len(token_ns) > _MAX_TOKEN_NS:  # (a memo: clearing it bounds memory, changes no value)
            token_ns.clear()
        for rid in result.finished:
            tl = self.engine.forget(rid)
            assert tl is not None
            r = self.in_flight.pop(rid)
            finished.append(r.index)
            r.content_ns = list(map(token_ns.__getitem__, tl.token_times_s))  # (in C)
            r.ttfb_ns = r.content_ns[0]
            r.end_ns = r.content_ns[-1]
            r.output_tokens = len(r.content_ns)
            r.cached_tokens = tl.cached_tokens
            r.finish_reason = self._finish.pop(rid)
            # the engine's own view, as the simulated server reports it (received at
            # arrival; through a gateway, received when sent, the wait apart)
            received_s = self._received_s.pop(rid, None)
            if received_s is None:
                r.server_timeline = tl.to_json_ms(tl.arrival_s)
            else:
                r.server_timeline = {**tl.to_json_ms(received_s), "gateway_queue_ms": _wait_ms(received_s, tl.arrival_s)}
            self.finish(r)
            if answers is not None:
                answers.append(self._answer(r.output_tokens))
        return end_s, seen_s, finished, answers

    def _answer(self, n: int) -> Answer:
        """The reply the simulated model gave in ``n`` tokens: the built-in passage."""
        return self.tok.decode(self.tok.output_token(k) for k in range(n)), n

    def interrupted(self, cause: InferlabError | None = None) -> Interrupted:
        """Cancel what is in flight (records passed to ``on_record``) and wrap all records."""
        for rid, r in sorted(self.in_flight.items(), key=lambda kv: kv[1].index):
            self.engine.forget(rid)
            r.error_kind = ErrorKind.CANCELLED
            r.error = "run interrupted" if cause is None else f"run stopped: {cause}"
            r.status = None
            self.finish(r)
        self.in_flight.clear()
        self._received_s.clear()
        self._finish.clear()
        return Interrupted(sorted(self.done, key=lambda r: r.index), cause)


def _wait_ms(sent_s: float, arrived_s: float) -> float:
    """A gateway's wait in ms, as the server timeline writes times (4 decimals)."""
    return round((arrived_s - sent_s) * 1e3, 4)


def _stats_json(s: StepStats) -> dict[str, float | int]:
    return {k: (round(v, 9) if isinstance(v, float) else v) for k, v in asdict(s).items()}


def simulate(
    engine: Engine,
    load: LoadConfig,
    workload: Iterator[RequestSpec] | Trace | SessionWorkload,
    *,
    chat: bool = False,
    step_log: IO[str] | None = None,
    natural_median_tokens: int = 120,
    on_record: OnRecord | None = None,
    tokenizer: Tokenizer | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[RequestRecord]:
    """Serve the workload in virtual time under the load's policy (``make_policy``)
    through a ``SimulatedServer`` with these options; see ``serve``. ``tokenizer``
    counts text prompts (default: the built-in one)."""
    policy = make_policy(load, workload)
    server = SimulatedServer(
        engine, chat=chat, step_log=step_log, natural_median_tokens=natural_median_tokens,
        tokenizer=tokenizer, on_record=on_record, answers=policy.wants_answers,
    )
    return serve(server, policy, stop)


class Served(Target, Protocol):
    """A target that makes records: ``SimulatedServer``, or several behind a router
    (``inferlab.load.replicas.Replicas``)."""

    @property
    def done(self) -> list[RequestRecord]: ...

    def interrupted(self, cause: InferlabError | None = None) -> Interrupted: ...


def serve(server: Served, policy: Policy, stop: Callable[[], bool] | None = None) -> list[RequestRecord]:
    """Serve what ``policy`` sends through ``server`` in virtual time; the records,
    sorted by index.

    A request the engine rejects (too long for ``max_model_len`` or the KV cache) is a
    failed record (``http_status``, 400, ``REJECTED_PREFIX``). The server's ``on_record`` sees each record as
    it ends. ``stop`` is asked between steps; when it answers true, on
    ``KeyboardInterrupt``, or when drawing the next request raises an ``InferlabError``
    (its ``cause``), ``Interrupted`` is raised with the records so far."""
    try:
        drive(policy, server, stop)
    except (_Stop, KeyboardInterrupt):
        raise server.interrupted() from None
    except InferlabError as e:  # a request the workload could not make (drawn as sent)
        raise server.interrupted(e) from e
    return sorted(server.done, key=lambda r: r.index)


class EngineTarget:
    """The engine alone: each send is queued with a prompt of token ids and exactly
    ``max_tokens`` output tokens, as request ``request_ids[send.index]`` (default: the
    index as a string); timelines stay in the engine. A request the engine rejects
    raises its ``ValueError``."""

    def __init__(self, engine: Engine, request_ids: Sequence[str] | None = None) -> None:
        self.engine = engine
        self._ids = request_ids
        self._in_flight: dict[str, int] = {}  # request id -> send index

    def add(self, send: Send) -> float | None:
        prompt, out = send.spec.prompt, send.spec.max_tokens
        if not isinstance(prompt, list) or out is None:
            raise TypeError("the engine takes token-id prompts with max_tokens")
        rid = str(send.index) if self._ids is None else self._ids[send.index]
        self.engine.add_request(rid, prompt, out, send.at_s)
        self._in_flight[rid] = send.index
        return None

    def has_work(self) -> bool:
        return self.engine.has_work()

    def step(self, now_s: float) -> tuple[float, float, list[int], list[Answer] | None]:
        result = self.engine.step(now_s, token_events=False)
        assert result is not None  # has_work() was True
        end_s = now_s + result.duration_s
        seen_s = end_s if result.delivered_s is None else result.delivered_s
        return end_s, seen_s, [self._in_flight.pop(rid) for rid in result.finished], None


def serve_timelines(
    engine: Engine, arrivals: Sequence[tuple[float, str, list[int], int]]
) -> dict[str, RequestTimeline]:
    """Serve ``(arrival_s, request_id, prompt_ids, output_len)`` arrivals to completion
    (open loop, in time order) and return each request's timeline by id; the engine
    forgets them. A request the engine rejects raises its ``ValueError``."""
    ordered = sorted(arrivals, key=lambda a: a[0])
    specs = ((t, RequestSpec(ids, out)) for t, _, ids, out in ordered)
    request_ids = [rid for _, rid, _, _ in ordered]
    drive(OpenLoopPolicy(specs, max_concurrency=None, warmup=0), EngineTarget(engine, request_ids))
    timelines = {}
    for rid in request_ids:
        tl = engine.forget(rid)
        assert tl is not None
        timelines[rid] = tl
    return timelines
