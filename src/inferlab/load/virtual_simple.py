"""Run a workload through the engine in virtual time: no HTTP, no sleeping, deterministic."""

from __future__ import annotations

from collections.abc import Sequence

from inferlab.sim.engine.engine import Engine, RequestTimeline


def run_virtual(
    engine: Engine, arrivals: Sequence[tuple[float, str, list[int], int]]
) -> dict[str, RequestTimeline]:
    """Serve ``(arrival_s, request_id, prompt_ids, output_len)`` arrivals to completion.

    Before each step every request that has arrived by the current time is added (with
    its own arrival time); idle time jumps to the next arrival. Returns each request's
    timeline by id and forgets them in the engine. A request the engine rejects raises
    its ``ValueError`` (validate the workload first).
    """
    pending = sorted(arrivals, key=lambda a: a[0])
    now_s = pending[0][0] if pending else 0.0
    i = 0
    while i < len(pending) or engine.has_work():
        while i < len(pending) and pending[i][0] <= now_s:
            arrival_s, request_id, prompt_ids, output_len = pending[i]
            engine.add_request(request_id, prompt_ids, output_len, arrival_s)
            i += 1
        if not engine.has_work():
            now_s = pending[i][0]
            continue
        result = engine.step(now_s, token_events=False)  # no per-token events needed: timelines suffice
        assert result is not None
        now_s += result.duration_s
    timelines = {}
    for _, request_id, _, _ in pending:
        timelines[request_id] = engine.timeline(request_id)
        engine.forget(request_id)
    return timelines
