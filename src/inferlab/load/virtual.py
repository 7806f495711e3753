"""``sim run``: a workload through the engine in virtual time, no HTTP, deterministic.

The same ``LoadConfig`` and workload objects as ``bench`` decide what is sent and when;
the result is the same ``RequestRecord`` list, so the same metrics and files follow.
Closed loop: each of N users sends its next request the moment its previous one
finishes. Open loop: the schedule's arrival times (``--rate inf`` = all at time 0).

As over HTTP, a request the engine cannot serve (longer than ``max_model_len``, larger
than the KV cache) is a failed record (HTTP 400), not the end of the run. A stop request
(``stop()`` true, or Ctrl-C) ends the run between steps: in-flight requests become
cancelled records and ``Interrupted`` carries everything recorded so far.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import IO

from inferlab._clock import NS_PER_S
from inferlab._errors import InferlabError
from inferlab.load.schedules import ClosedLoop, LoadConfig, OpenLoop, replay_times_s
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.sim.engine.engine import Engine, StepStats
from inferlab.sim.engine.outputs import natural_output_len
from inferlab.workload.builtin_tokenizer import BuiltinTokenizer
from inferlab.workload.spec import RequestSpec, TimedSpec
from inferlab.workload.tokenizers import Tokenizer

#: Time a rejected request takes at the least, so that a closed loop under ``duration_s``
#: still advances when every request is rejected.
_MIN_REJECT_S = 1e-6
#: Token times converted to ns kept for reuse (one per step; cleared beyond this)
_MAX_TOKEN_NS = 1 << 20

OnRecord = Callable[[RequestRecord], None]


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
    """``stop()`` answered true: unwind to ``simulate``, which raises ``Interrupted``."""


def _ns(t_s: float) -> int:
    return round(t_s * NS_PER_S)


class _TokenNs(dict[float, int]):
    """A token time (s) → integer ns, ``int(t * NS_PER_S + 0.5)``, each converted once:
    token times are step end times, so a run's millions of them take only as many
    distinct values as it had steps."""

    def __missing__(self, t_s: float) -> int:
        ns = self[t_s] = int(t_s * NS_PER_S + 0.5)
        return ns


class _Sim:
    def __init__(
        self,
        engine: Engine,
        chat: bool,
        warmup: int,
        step_log: IO[str] | None,
        natural_median_tokens: int,
        tokenizer: Tokenizer | None = None,
        on_record: OnRecord | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> None:
        engine.record_token_times = True  # ITL needs every token's time
        self.engine = engine
        self.tok: Tokenizer = tokenizer or BuiltinTokenizer()
        self.chat = chat
        self.warmup = warmup
        self.step_log = step_log
        self.natural_median_tokens = natural_median_tokens
        self.on_record = on_record
        self.stop = stop
        self.records: dict[str, RequestRecord] = {}  # in flight, by request id
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

    def add(
        self,
        index: int,
        spec: RequestSpec,
        send_s: float,
        intended_s: float | None = None,
        *,
        session: int | None = None,
        turn: int | None = None,
    ) -> RequestRecord | None:
        """Send a request at ``send_s`` (intended at ``intended_s``, default the same).

        Returns ``None`` if the engine queued it; else the failed record (HTTP 400 with
        the engine's reason, ended ``api_overhead_s`` later), already finished."""
        ids = self.prompt_ids(spec)
        t = _ns(send_s)
        record = RequestRecord(
            index=index,
            warmup=index < self.warmup,
            intended_send_ns=t if intended_s is None else _ns(intended_s),
            send_ns=t,
            status=200,
            input_tokens=len(ids),
            requested_input_tokens=spec.input_tokens,
            requested_output_tokens=spec.max_tokens,
            usage_source="engine",
            session=session,
            turn=turn,
        )
        try:
            out = self.output_len(ids, spec)
            self.engine.add_request(str(index), ids, out, send_s)
        except ValueError as e:  # what the HTTP server answers with 400
            end_ns = _ns(send_s + max(self.engine.api_overhead_s, _MIN_REJECT_S))
            record.status = 400
            record.error_kind = ErrorKind.HTTP_STATUS
            record.error = f"HTTP 400: {e}"
            record.ttfb_ns = record.end_ns = end_ns
            record.usage_source = "none"
            self.finish(record)
            return record
        self.records[str(index)] = record
        return None

    def output_len(self, ids: list[int], spec: RequestSpec) -> int:
        """``max_tokens`` if given, else the natural length within the context that is left;
        ``ValueError`` if the prompt leaves no room for one output token."""
        if spec.max_tokens is not None:
            return spec.max_tokens
        limit = self.engine.limits.max_model_len
        room = limit - len(ids)
        if room < 1:
            raise ValueError(
                f"the prompt ({len(ids)} tokens) does not fit in --max-model-len {limit} "
                "with room for one output token"
            )
        return min(room, natural_output_len(ids, self.natural_median_tokens))

    def finish(self, record: RequestRecord) -> None:
        self.done.append(record)
        if self.on_record is not None:
            self.on_record(record)

    def check_stop(self) -> None:
        if self.stop is not None and self.stop():
            raise _Stop

    def interrupted(self, cause: InferlabError | None = None) -> Interrupted:
        """Cancel what is in flight (records passed to ``on_record``) and wrap all records."""
        for rid, r in sorted(self.records.items(), key=lambda kv: kv[1].index):
            self.engine.forget(rid)
            r.error_kind = ErrorKind.CANCELLED
            r.error = "run interrupted" if cause is None else f"run stopped: {cause}"
            r.status = None
            self.finish(r)
        self.records.clear()
        return Interrupted(sorted(self.done, key=lambda r: r.index), cause)

    def step(self, now_s: float) -> tuple[float, list[RequestRecord]]:
        """One engine step; returns its end time and the records it finished."""
        result = self.engine.step(now_s, token_events=False)
        assert result is not None
        end_s = now_s + result.duration_s
        if self.step_log is not None:
            self.step_log.write(json.dumps(_stats_json(result.stats)) + "\n")
        finished = []
        token_ns = self.token_ns
        if len(token_ns) > _MAX_TOKEN_NS:  # (a memo: clearing it bounds memory, changes no value)
            token_ns.clear()
        for rid in result.finished:
            tl = self.engine.forget(rid)
            assert tl is not None
            r = self.records.pop(rid)
            r.content_ns = list(map(token_ns.__getitem__, tl.token_times_s))  # (in C)
            r.ttfb_ns = r.content_ns[0]
            r.end_ns = r.content_ns[-1]
            r.output_tokens = len(r.content_ns)
            r.cached_tokens = tl.cached_tokens
            r.finish_reason = "length"
            self.finish(r)
            finished.append(r)
        return end_s, finished


def _stats_json(s: StepStats) -> dict[str, float | int]:
    return {k: (round(v, 9) if isinstance(v, float) else v) for k, v in asdict(s).items()}


def simulate(
    engine: Engine,
    load: LoadConfig,
    workload: Iterator[RequestSpec] | Sequence[TimedSpec],
    *,
    chat: bool = False,
    step_log: IO[str] | None = None,
    natural_median_tokens: int = 120,
    on_record: OnRecord | None = None,
    tokenizer: Tokenizer | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[RequestRecord]:
    """Serve the workload in virtual time; records are sorted by index.

    A trace (a sequence of ``TimedSpec``) is replayed at its timestamps, within the
    load's request count and duration. A request the engine rejects (too long for
    ``max_model_len`` or the KV cache) is a failed record (``http_status``, 400).
    ``on_record`` sees each record as it ends. ``stop`` is asked between steps; when it
    answers true, on ``KeyboardInterrupt``, or when drawing the next request raises an
    ``InferlabError`` (its ``cause``), ``Interrupted`` is raised with the records so far. ``tokenizer`` counts text prompts (default: the built-in one)."""
    sim = _Sim(engine, chat, load.warmup, step_log, natural_median_tokens, tokenizer, on_record, stop)
    total = None if load.num_requests is None else load.num_requests + load.warmup
    deadline_s = load.duration_s

    arrivals: Iterator[tuple[float, RequestSpec]] | None = None
    if isinstance(workload, Sequence):
        trace = list(workload)
        times = replay_times_s(trace, load)
        arrivals = iter(sorted(zip(times, (s.spec for s in trace), strict=False), key=_first))
    elif isinstance(load.schedule, OpenLoop):
        times = load.schedule.arrival_times_s(load.seed, total, deadline_s)  # in order
        # drawn as they are sent, so no prompt outlives its request's admission (a dataset
        # may run out: zip stops there)
        arrivals = zip(times, workload, strict=False)

    try:
        if arrivals is not None:
            limit = None if isinstance(load.schedule, ClosedLoop) else load.schedule.max_concurrency
            _open(sim, arrivals, limit)
        else:
            assert isinstance(load.schedule, ClosedLoop) and not isinstance(workload, Sequence)
            _closed(sim, load.schedule.concurrency, total, deadline_s, workload)
    except (_Stop, KeyboardInterrupt):
        raise sim.interrupted() from None
    except InferlabError as e:  # a request the workload could not make (drawn as sent)
        raise sim.interrupted(e) from e
    return sorted(sim.done, key=lambda r: r.index)


def _first(arrival: tuple[float, RequestSpec]) -> float:
    return arrival[0]


def _open(sim: _Sim, arrivals: Iterator[tuple[float, RequestSpec]], max_concurrency: int | None) -> None:
    """Send each ``(arrival time, spec)`` of ``arrivals`` (in time order) when it is due."""
    head = next(arrivals, None)  # the next request to send
    now_s = head[0] if head is not None else 0.0
    i = 0
    # with a cap: when each free slot became free (a heap); a request is sent at its
    # arrival or, if every slot was busy then, when one frees (client queue delay)
    free_at: list[float] | None = [0.0] * max_concurrency if max_concurrency else None
    while head is not None or sim.engine.has_work():
        sim.check_stop()
        while head is not None and head[0] <= now_s and (free_at is None or free_at):
            arrival_s, spec = head
            send_s = arrival_s if free_at is None else max(arrival_s, heapq.heappop(free_at))
            rejected = sim.add(i, spec, send_s, arrival_s)
            if rejected is not None and free_at is not None:
                assert rejected.end_ns is not None
                heapq.heappush(free_at, rejected.end_ns / NS_PER_S)
            i += 1
            head = next(arrivals, None)
        if not sim.engine.has_work():
            if head is not None:
                now_s = max(now_s, head[0])
            continue
        now_s, finished = sim.step(now_s)
        if free_at is not None:
            for _ in finished:
                heapq.heappush(free_at, now_s)


def _closed(
    sim: _Sim,
    concurrency: int,
    total: int | None,
    deadline_s: float | None,
    workload: Iterator[RequestSpec],
) -> None:
    ready: list[float] = [0.0] * concurrency  # when each idle user sends next (a heap)
    sent = 0
    now_s = 0.0
    first_measured_s: float | None = None
    while True:
        sim.check_stop()
        while ready and ready[0] <= now_s and (total is None or sent < total):
            if deadline_s is not None and first_measured_s is not None and now_s >= first_measured_s + deadline_s:
                ready.clear()
                break
            spec = next(workload, None)
            if spec is None:  # a dataset sampled without replacement ran out
                ready.clear()
                break
            t = heapq.heappop(ready)
            if sent == sim.warmup:
                first_measured_s = t
            rejected = sim.add(sent, spec, t)
            if rejected is not None:  # the user sends its next request once answered
                assert rejected.end_ns is not None
                heapq.heappush(ready, rejected.end_ns / NS_PER_S)
            sent += 1
        if not sim.engine.has_work():
            if not ready or (total is not None and sent >= total):
                return
            now_s = ready[0]
            continue
        now_s, finished = sim.step(now_s)
        for _ in finished:
            heapq.heappush(ready, now_s)
