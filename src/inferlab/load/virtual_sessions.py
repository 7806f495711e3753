"""Multi-turn sessions through the engine in virtual time (``sim run --sessions``).

Same semantics as ``bench`` (``inferlab._sessions``): each answer is the simulated
output tokens, decoded, and goes into the next turn's context, so the prefix cache
sees the conversation grow. Deterministic for a seed. A turn the engine rejects is a
failed record and ends its session (its context is unknown), as in ``bench``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import IO

from inferlab._clock import NS_PER_S
from inferlab.load.schedules import LoadConfig, OpenLoop
from inferlab.load.virtual import _Sim, _Stop
from inferlab.results.records import RequestRecord
from inferlab.sim.engine.engine import Engine
from inferlab.workload.sessions import Session, SessionWorkload
from inferlab.workload.tokenizers import Tokenizer


def simulate_sessions(
    engine: Engine,
    load: LoadConfig,
    workload: SessionWorkload,
    *,
    users: int,
    chat: bool = True,
    tokenizer: Tokenizer | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    stop: Callable[[], bool] | None = None,
    step_log: IO[str] | None = None,
) -> list[RequestRecord]:
    """Run every session to its last turn (or ``load.duration_s``); records by index.

    ``on_record`` and ``stop`` as in ``simulate``: a stop (or ``KeyboardInterrupt``)
    raises ``Interrupted`` with the records so far."""
    sim = _Sim(engine, chat, 0, step_log, 120, tokenizer, on_record, stop)
    try:
        _run(sim, load, workload, users)
    except (_Stop, KeyboardInterrupt):
        raise sim.interrupted() from None
    return sorted(sim.done, key=lambda r: r.index)


def _run(sim: _Sim, load: LoadConfig, workload: SessionWorkload, users: int) -> None:
    cfg = workload.config
    seq = itertools.count()
    ready: list[tuple[float, int, Session]] = []  # (send time, tie-break, session)
    waiting = iter(range(cfg.sessions))
    if isinstance(load.schedule, OpenLoop):
        for i, t in enumerate(load.schedule.arrival_times_s(load.seed, cfg.sessions, None)):
            heapq.heappush(ready, (t, next(seq), workload.session(i)))
    else:
        for i in itertools.islice(waiting, users):
            heapq.heappush(ready, (0.0, next(seq), workload.session(i)))
    of: dict[int, Session] = {}
    index = itertools.count()
    now_s = 0.0
    deadline_s = load.duration_s

    def next_session(t: float) -> None:
        if not isinstance(load.schedule, OpenLoop):
            nxt = next(waiting, None)
            if nxt is not None:
                heapq.heappush(ready, (t, next(seq), workload.session(nxt)))

    while ready or sim.engine.has_work():
        sim.check_stop()
        while ready and ready[0][0] <= now_s:
            t, _, s = heapq.heappop(ready)
            if deadline_s is not None and t >= deadline_s:
                continue
            spec = s.next_spec()
            i = next(index)
            rejected = sim.add(i, spec, t, session=spec.session, turn=spec.turn)
            if rejected is None:
                of[i] = s
            else:  # the session ends with its failed turn
                assert rejected.end_ns is not None
                next_session(rejected.end_ns / NS_PER_S)
        if not sim.engine.has_work():
            if not ready:
                break
            now_s = ready[0][0]
            continue
        now_s, finished = sim.step(now_s)
        for r in finished:
            s = of.pop(r.index)
            n = r.output_tokens or 0
            s.answer(sim.tok.decode(sim.tok.output_token(k) for k in range(n)), n)
            if not s.done:
                heapq.heappush(ready, (now_s + cfg.think_time_s, next(seq), s))
            else:
                next_session(now_s)
