"""The load policy on its own: pure bookkeeping over time, driven here by hand the way
an executor drives it (``due``, ``ended``, ``next_s``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from inferlab._errors import InferlabError, UsageError
from inferlab.load.policy import (
    ClosedLoopPolicy,
    OpenLoopPolicy,
    SessionPolicy,
    make_policy,
)
from inferlab.load.schedules import ClosedLoop, LoadConfig, OpenLoop, Replay
from inferlab.workload.config import WorkloadConfig
from inferlab.workload.sessions import SessionWorkload
from inferlab.workload.spec import RequestSpec, TimedSpec, Trace


def specs(n: int | None = None) -> Iterator[RequestSpec]:
    i = 0
    while n is None or i < n:
        yield RequestSpec(f"p{i}", 1)
        i += 1


def test_closed_loop_users_send_again_when_their_request_ends() -> None:
    p = ClosedLoopPolicy(2, specs(), total=5, warmup=1, duration_s=None)
    first = list(p.due(0.0))
    assert [(s.index, s.intended_s, s.warmup) for s in first] == [(0, 0.0, True), (1, 0.0, False)]
    assert list(p.due(10.0)) == [] and p.next_s() is None  # both users busy
    p.ended(1, 0.4, None)
    assert p.next_s() == 0.4
    (s,) = p.due(0.5)
    assert (s.index, s.intended_s, s.at_s) == (2, 0.4, 0.4)  # intended when the user was free
    for i, t in ((0, 0.6), (2, 0.7)):
        p.ended(i, t, None)
    assert [s.index for s in p.due(1.0)] == [3, 4]
    p.ended(3, 1.1, None)
    assert p.next_s() is None and list(p.due(5.0)) == []  # total reached


def test_closed_loop_duration_counts_from_the_first_measured_send() -> None:
    p = ClosedLoopPolicy(1, specs(), total=None, warmup=1, duration_s=1.0)
    assert [s.index for s in p.due(0.0)] == [0]  # warm-up
    p.ended(0, 5.0, None)
    assert [s.index for s in p.due(5.0)] == [1]  # first measured at 5.0: the deadline is 6.0
    p.ended(1, 5.9, None)
    assert [s.index for s in p.due(5.9)] == [2]
    p.ended(2, 6.0, None)
    assert list(p.due(6.0)) == [] and p.next_s() is None


def test_closed_loop_ends_when_the_specs_run_out() -> None:
    p = ClosedLoopPolicy(3, specs(2), total=None, warmup=0, duration_s=None)
    assert len(list(p.due(0.0))) == 2
    assert p.next_s() is None


def test_open_loop_cap_holds_sends_until_a_slot_frees() -> None:
    arrivals = iter([(0.0, RequestSpec("a")), (0.1, RequestSpec("b")), (0.2, RequestSpec("c"))])
    p = OpenLoopPolicy(arrivals, max_concurrency=1, warmup=0)
    assert p.start_s() == 0.0
    assert [s.index for s in p.due(0.5)] == [0]
    assert p.next_s() is None  # the one slot is busy: only an end releases "b"
    p.ended(0, 0.3, None)
    (s,) = p.due(0.3)
    assert (s.index, s.intended_s, s.at_s) == (1, 0.1, 0.3)  # 0.2 s of queue delay
    p.ended(1, 0.35, None)
    (s,) = p.due(0.35)
    assert (s.intended_s, s.at_s) == (0.2, 0.35)
    assert p.next_s() is None


def test_open_loop_without_cap_sends_at_arrival_and_ignores_ends() -> None:
    p = OpenLoopPolicy(iter([(0.0, RequestSpec("a")), (2.0, RequestSpec("b"))]), max_concurrency=None, warmup=1)
    (s,) = p.due(1.0)
    assert s.warmup and p.next_s() == 2.0
    (s,) = p.due(2.0)
    assert not s.warmup and s.at_s == 2.0


def test_specs_are_drawn_as_sent_never_ahead() -> None:
    drawn: list[int] = []

    def failing() -> Iterator[tuple[float, RequestSpec]]:
        for i in range(3):
            drawn.append(i)
            if i == 2:
                raise InferlabError("cannot make prompt 2")
            yield float(i), RequestSpec(f"p{i}")

    p = OpenLoopPolicy(failing(), max_concurrency=None, warmup=0)
    sends = p.due(10.0)
    assert next(sends).index == 0 and drawn == [0]  # the second spec is not drawn yet
    assert next(sends).index == 1 and drawn == [0, 1]
    with pytest.raises(InferlabError, match="prompt 2"):
        next(sends)  # drawn once the one before it was sent


def sessions(n: int, turns: int, think_s: float = 0.5) -> SessionWorkload:
    wl = WorkloadConfig(sessions=n, turns=turns, input_tokens=5, output_tokens=2, think_time_s=think_s).build(0, "chat")
    assert isinstance(wl, SessionWorkload)
    return wl


def test_sessions_turns_follow_answers_and_a_failed_turn_ends_its_session() -> None:
    p = SessionPolicy(sessions(3, 2), users=2)
    a, b = p.due(0.0)
    assert (a.spec.session, a.spec.turn, b.spec.session) == (0, 0, 1)
    p.ended(a.index, 1.0, ("hello", 2))
    assert p.next_s() == 1.5  # after the think time
    (a2,) = p.due(1.5)
    assert (a2.spec.session, a2.spec.turn, a2.intended_s) == (0, 1, 1.5)
    assert a2.spec.context == (("user", a.spec.prompt), ("assistant", "hello"))  # the answer is context
    p.ended(b.index, 1.6, None)  # session 1 fails: the user goes on to session 2 at once
    (c,) = p.due(1.6)
    assert (c.spec.session, c.spec.turn, c.intended_s) == (2, 0, 1.6)


def test_sessions_open_loop_and_duration() -> None:
    p = SessionPolicy(sessions(3, 3), arrivals_s=[0.0, 1.0, 2.0], duration_s=1.5)
    assert [s.spec.session for s in p.due(0.0)] == [0]
    assert [s.spec.session for s in p.due(1.0)] == [1]
    assert list(p.due(2.0)) == [] and p.next_s() is None  # the third arrives after the end


def test_make_policy_picks_by_schedule_and_workload() -> None:
    trace = Trace((TimedSpec(0.0, RequestSpec("a", 1)), TimedSpec(0.5, RequestSpec("b", 1))))
    replay = make_policy(LoadConfig(Replay()), trace)
    assert isinstance(replay, OpenLoopPolicy) and [s.intended_s for s in replay.due(1.0)] == [0.0, 0.5]
    assert isinstance(make_policy(LoadConfig(ClosedLoop(2), 4), specs()), ClosedLoopPolicy)
    assert isinstance(make_policy(LoadConfig(OpenLoop(5.0), 4), specs()), OpenLoopPolicy)
    assert isinstance(make_policy(LoadConfig(ClosedLoop(2), 4), sessions(2, 2)), SessionPolicy)
    with pytest.raises(UsageError, match="replay schedule"):
        make_policy(LoadConfig(ClosedLoop(2), 4), trace)
    with pytest.raises(UsageError, match="replay schedule"):
        make_policy(LoadConfig(Replay()), specs())


@pytest.mark.parametrize("warmup", [0, 3])
def test_open_loop_duration_counts_from_the_first_measured_arrival(warmup: int) -> None:
    # as a closed loop's: the warm-ups are extra, before the measured window, whose
    # arrivals are as many as a run without them has
    load = LoadConfig(OpenLoop(rate_rps=10, arrival="constant"), duration_s=1.0, warmup=warmup)
    p = make_policy(load, specs())
    sends = list(p.due(100.0))
    measured = [s for s in sends if not s.warmup]
    assert sum(s.warmup for s in sends) == warmup
    assert len(measured) == 10
    first = measured[0].intended_s
    assert all(first <= s.intended_s < first + 1.0 for s in measured)
