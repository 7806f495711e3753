"""``sim run``: a workload through the engine in virtual time, no HTTP, deterministic.

The same ``LoadConfig`` and workload objects as ``bench`` decide what is sent and when;
the result is the same ``RequestRecord`` list, so the same metrics and files follow.
Closed loop: each of N users sends its next request the moment its previous one
finishes. Open loop: the schedule's arrival times (``--rate inf`` = all at time 0).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import IO

from inferlab._clock import NS_PER_S
from inferlab._records import RequestRecord
from inferlab._runner import LoadConfig, replay_times_s
from inferlab._schedule import ClosedLoop, OpenLoop
from inferlab._tokenizers import Tokenizer
from inferlab._workload import RequestSpec, TimedSpec
from inferlab.sim._engine import Engine, StepStats
from inferlab.sim._tokenizer import BuiltinTokenizer, natural_output_len


def _ns(t_s: float) -> int:
    return round(t_s * NS_PER_S)


class _Sim:
    def __init__(
        self,
        engine: Engine,
        chat: bool,
        warmup: int,
        step_log: IO[str] | None,
        natural_median_tokens: int,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        engine.record_token_times = True  # ITL needs every token's time
        self.engine = engine
        self.tok: Tokenizer = tokenizer or BuiltinTokenizer()
        self.chat = chat
        self.warmup = warmup
        self.step_log = step_log
        self.natural_median_tokens = natural_median_tokens
        self.records: dict[str, RequestRecord] = {}
        self.done: list[RequestRecord] = []

    def prompt_ids(self, spec: RequestSpec) -> list[int]:
        if not isinstance(spec.prompt, str):
            return list(spec.prompt)
        if self.chat:
            return self.tok.apply_chat_template(spec.messages())
        return self.tok.encode(str(spec.completion_prompt()))

    def add(self, index: int, spec: RequestSpec, arrival_s: float) -> None:
        ids = self.prompt_ids(spec)
        if spec.max_tokens is not None:
            out = spec.max_tokens
        else:
            room = self.engine.config.max_model_len - len(ids)
            out = min(room, natural_output_len(ids, self.natural_median_tokens))
        rid = str(index)
        self.engine.add_request(rid, ids, out, arrival_s)
        t = _ns(arrival_s)
        self.records[rid] = RequestRecord(
            index=index,
            warmup=index < self.warmup,
            intended_send_ns=t,
            send_ns=t,
            status=200,
            input_tokens=len(ids),
            requested_input_tokens=spec.input_tokens,
            requested_output_tokens=spec.max_tokens,
            usage_source="server",
        )

    def step(self, now_s: float) -> tuple[float, list[RequestRecord]]:
        """One engine step; returns its end time and the records it finished."""
        result = self.engine.step(now_s, token_events=False)
        assert result is not None
        end_s = now_s + result.duration_s
        finished = []
        for rid in result.finished:
            tl = self.engine.timeline(rid)
            r = self.records.pop(rid)
            r.content_ns = [int(t * NS_PER_S + 0.5) for t in tl.token_times_s]
            r.ttfb_ns = r.content_ns[0]
            r.end_ns = r.content_ns[-1]
            r.output_tokens = len(r.content_ns)
            r.cached_tokens = tl.cached_tokens
            r.finish_reason = "length"
            self.engine.forget(rid)
            finished.append(r)
        if self.step_log is not None:
            self.step_log.write(json.dumps(_stats_json(result.stats)) + "\n")
        self.done.extend(finished)
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
    on_record: Callable[[RequestRecord], None] | None = None,
    tokenizer: Tokenizer | None = None,
) -> list[RequestRecord]:
    """Serve the workload in virtual time; records are sorted by index.

    A trace (a sequence of ``TimedSpec``) is replayed at its timestamps, within the
    load's request count and duration. A request the engine rejects (too long for
    ``max_model_len`` or the KV cache) raises ``ValueError`` before any time passes
    for it. ``tokenizer`` counts text prompts (default: the built-in one)."""
    sim = _Sim(engine, chat, load.warmup, step_log, natural_median_tokens, tokenizer)
    total = None if load.num_requests is None else load.num_requests + load.warmup
    deadline_s = load.duration_s

    if isinstance(workload, Sequence):
        trace = list(workload)
        times = replay_times_s(trace, load)
        arrivals = [(t, s.spec) for t, s in zip(times, trace, strict=False)]
    elif isinstance(load.schedule, OpenLoop):
        times = load.schedule.arrival_times_s(load.seed, total, deadline_s)
        arrivals = list(zip(times, workload, strict=False))  # a dataset may run out
    else:
        arrivals = []

    if arrivals or isinstance(workload, Sequence):
        limit = None if isinstance(load.schedule, ClosedLoop) else load.schedule.max_concurrency
        _open(sim, arrivals, limit, on_record)
    else:
        assert isinstance(load.schedule, ClosedLoop) and not isinstance(workload, Sequence)
        _closed(sim, load.schedule.concurrency, total, deadline_s, workload, on_record)
    return sorted(sim.done, key=lambda r: r.index)


def _open(
    sim: _Sim,
    arrivals: list[tuple[float, RequestSpec]],
    max_concurrency: int | None,
    on_record: Callable[[RequestRecord], None] | None,
) -> None:
    arrivals.sort(key=lambda a: a[0])
    now_s = arrivals[0][0] if arrivals else 0.0
    i = 0
    in_flight = 0
    free_since_s = 0.0  # since when a max_concurrency slot has been free
    while i < len(arrivals) or sim.engine.has_work():
        while i < len(arrivals) and arrivals[i][0] <= now_s and (max_concurrency is None or in_flight < max_concurrency):
            # Sent at its arrival time (the engine queues it from then on), unless it
            # waited for a free max_concurrency slot: that wait is client queue delay.
            arrival_s = arrivals[i][0]
            sim.add(i, arrivals[i][1], max(arrival_s, free_since_s))
            sim.records[str(i)].intended_send_ns = _ns(arrival_s)
            in_flight += 1
            i += 1
        if not sim.engine.has_work():
            now_s = arrivals[i][0]
            continue
        was_full = max_concurrency is not None and in_flight >= max_concurrency
        now_s, finished = sim.step(now_s)
        in_flight -= len(finished)
        if was_full and finished:
            free_since_s = now_s
        if on_record is not None:
            for r in finished:
                on_record(r)


def _closed(
    sim: _Sim,
    concurrency: int,
    total: int | None,
    deadline_s: float | None,
    workload: Iterator[RequestSpec],
    on_record: Callable[[RequestRecord], None] | None,
) -> None:
    ready: list[float] = [0.0] * concurrency  # when each idle user sends next (a heap)
    sent = 0
    now_s = 0.0
    first_measured_s: float | None = None
    while True:
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
            sim.add(sent, spec, t)
            sent += 1
        if not sim.engine.has_work():
            if not ready or (total is not None and sent >= total):
                return
            now_s = ready[0]
            continue
        now_s, finished = sim.step(now_s)
        for r in finished:
            heapq.heappush(ready, now_s)
            if on_record is not None:
                on_record(r)
