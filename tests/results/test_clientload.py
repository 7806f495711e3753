"""Was the client the bottleneck: the verdict and warning from what each sending process
measured of itself, and its JSON form."""

from __future__ import annotations

import re

from inferlab.results.clientload import (
    CPU_SATURATED,
    LAG_P90_MS,
    LATE_SHARE,
    MIN_TIMERS,
    ClientLoad,
    ProcessLoad,
    bottleneck_warning,
    client_load,
    collapsed_gap_share,
)


def process(role: str, lags: list[float], cpu_share: float) -> ProcessLoad:
    wall = len(lags) * 0.05
    return ProcessLoad(role, lags, cpu_share * wall, wall, [(max(lags), cpu_share)])


def test_a_quiet_client_kept_up_and_says_nothing() -> None:
    load = client_load([process("client", [0.1] * 95 + [30.0] * 5, 0.3)])  # a few late timers: a GC, say
    assert load is not None and not load.bottleneck
    assert bottleneck_warning(load, workers=1, cores=8) is None


def test_a_loop_late_most_of_the_time_is_the_bottleneck_and_the_warning_says_by_how_much() -> None:
    lags = [LAG_P90_MS * 3] * 50 + [LAG_P90_MS * 10] * 50
    load = client_load([process("client", lags, 0.97)])
    assert load is not None and load.bottleneck
    p50, p99 = load.inflation_ms
    assert LAG_P90_MS * 3 <= p50 <= p99 <= LAG_P90_MS * 10
    w = bottleneck_warning(load, workers=1, cores=8)
    assert w is not None and "97% of a core" in w and "--workers 2" in w and "TTFT" in w
    # with every core already sending, more workers are no answer
    w_all = bottleneck_warning(load, workers=7, cores=8)
    assert w_all is not None and "--workers" not in w_all and "more cores" in w_all


def test_the_warning_says_itl_and_tpot_are_distorted_not_just_inflated() -> None:
    """runs/b6: a starved client read every request's 16 content chunks at one
    timestamp (TPOT and ITL 0.0) while the warning said ITL "may be inflated". TTFT and
    E2E may be inflated; ITL and TPOT are distorted both ways, and the share of requests
    with chunks read together is said."""
    load = client_load([process("client", [LAG_P90_MS * 4] * 100, 0.97)])
    assert load is not None
    b6 = [[5_000_000] * 16, [9_000_000] * 16, [1, 2, 3, 4]]  # two requests' chunks at one instant
    share = collapsed_gap_share(b6)
    assert share == 2 / 3 and collapsed_gap_share([]) == 0.0
    w = bottleneck_warning(load, workers=1, cores=8, collapsed_share=share)
    assert w is not None
    assert "TTFT and E2E measured then may be inflated" in w and "(TTFT, ITL, E2E) may be inflated" not in w
    assert "ITL and TPOT distorted" in w and "collapsed to 0" in w
    assert "67% of completed requests had chunks read at one instant" in w
    assert "at one instant)" not in (bottleneck_warning(load, workers=1, cores=8) or "")


def test_a_saturated_cpu_alone_is_enough() -> None:
    load = client_load([process("client", [0.2] * 100, CPU_SATURATED)])
    assert load is not None and load.bottleneck


def test_a_late_loop_that_used_little_cpu_waited_for_a_core() -> None:
    load = client_load([process("client", [LAG_P90_MS * 5] * 100, 0.1)])
    assert load is not None and load.bottleneck
    w = bottleneck_warning(load, workers=1, cores=2)
    assert w is not None and "only 10%" in w and "other processes" in w and "--workers" not in w


def test_with_workers_the_worst_process_is_named_and_a_busy_parent_delays_sends() -> None:
    ok = [0.1] * 100
    late = [LAG_P90_MS * 4] * 100
    load = client_load([process("parent", ok, 0.2), process("worker 1", ok, 0.4), process("worker 2", late, 0.95)])
    assert load is not None and load.bottleneck and load.busiest.role == "worker 2"
    w = bottleneck_warning(load, workers=2, cores=4)
    assert w is not None and "worker 2" in w and "--workers 3" in w
    parent = client_load([process("parent", late, 0.99), process("worker 1", ok, 0.3)])
    assert parent is not None
    wp = bottleneck_warning(parent, workers=1, cores=4)
    assert wp is not None and "parent" in wp and "queue_delay_ms" in wp and "TTFT" not in wp


def test_a_process_too_short_for_one_loop_timer_is_no_bottleneck() -> None:
    # every request refused at once: the run lasted a few ms, all of it the client's own
    # start-up at ~100% CPU, and no loop-lag timer fired; that is no sign of a slow client
    short = ProcessLoad("client", [], 0.0019, 0.002)
    load = client_load([short])
    assert load is not None and load.bottleneck is None  # no verdict, not "kept up"
    assert bottleneck_warning(load, workers=1, cores=2) is None
    # with workers (`bench -n 1 --workers 2`): none measured long enough to say either
    workers = client_load([ProcessLoad("parent", [], 0.001, 0.02), ProcessLoad("worker 1", [], 0.001, 0.02),
                           ProcessLoad("worker 2", [], 0.0, 0.02)])
    assert workers is not None and workers.bottleneck is None
    assert ClientLoad.from_json(workers.to_json()).bottleneck is None and workers.to_json()["bottleneck"] is None
    # one that did measure gives its verdict
    some = client_load([ProcessLoad("parent", [], 0.001, 0.02), process("worker 1", [0.1] * 10, 0.2)])
    assert some is not None and some.bottleneck is False


def test_one_late_timer_is_no_verdict() -> None:
    # Ctrl-C 0.1 s into a run: one timer fired, late; its p50 and p99 are that one timer
    one = client_load([ProcessLoad("client", [40.0], 0.1, 0.1, [(40.0, 1.0)])])
    assert one is not None and one.bottleneck is None
    assert bottleneck_warning(one, workers=1, cores=2) is None
    # as many timers as a verdict needs, as late, are one
    enough = client_load([ProcessLoad("client", [40.0] * MIN_TIMERS, 0.5, 0.5, [(40.0, 1.0)])])
    assert enough is not None and enough.bottleneck


def timed(role: str, lags: list[float], cpu_share: float) -> ProcessLoad:
    """A process whose wall time is what its timers took: each 50 ms plus its lag."""
    wall = sum(0.05 + lag / 1e3 for lag in lags)
    return ProcessLoad(role, lags, cpu_share * wall, wall, [(max(lags), cpu_share)])


def test_a_loop_that_stood_still_for_seconds_is_the_bottleneck_though_few_timers_were_late() -> None:
    # vLLM's CPU build in its own session on 2 cores: the client's loop stood still for
    # ~2 s four times in a run; 4 late timers among 200, so its p90 lag looked quiet
    lags = [0.3] * 200 + [2000.0, 1500.0, 2400.0, 900.0]
    stood = client_load([timed("client", lags, 0.02)])
    assert stood is not None
    assert stood.processes[0].loop_lag_ms is not None and stood.processes[0].loop_lag_ms.p90 < LAG_P90_MS
    assert stood.processes[0].late_share is not None and stood.processes[0].late_share > 0.35 and stood.bottleneck
    w = bottleneck_warning(stood, workers=1, cores=2)
    assert w is not None and "late for 40% of the run" in w and "longest 2,400 ms" in w and "other processes" in w
    assert "autogroup" not in w
    wa = bottleneck_warning(stood, workers=1, cores=2, autogroup=True)
    assert wa is not None and "kernel.sched_autogroup_enabled" in wa and "another session" in wa
    # a loop a few ms late throughout (a busy local server) is no such stall: no autogroup advice
    slow = client_load([timed("client", [2.5] * 100, 0.06)])
    assert slow is not None and slow.bottleneck
    ws = bottleneck_warning(slow, workers=1, cores=2, autogroup=True)
    assert ws is not None and "other processes" in ws and "autogroup" not in ws
    # the same stalls in a run ten times as long are under a tenth of it: no verdict from them
    long_run = client_load([timed("client", [0.3] * 4000 + [2000.0, 1500.0, 2400.0, 900.0], 0.02)])
    assert long_run is not None and not long_run.bottleneck
    assert 0 < (long_run.processes[0].late_share or 0) < LATE_SHARE


def test_what_a_stalled_client_added_is_counted_in_time_and_no_stalled_process_goes_unnamed() -> None:
    # a minute with eight stalls of 2 s: the timers' p99 is 0.3 ms, the reads' is seconds
    stalls = timed("client", [0.3] * 1100 + [2000.0] * 8, 0.05)
    load = client_load([stalls])
    assert load is not None and load.bottleneck
    p50, p99 = load.inflation_ms
    lag = load.processes[0].loop_lag_ms
    assert lag is not None and lag.p99 < 1 and p50 < 1 and 1500 < p99 <= 2000
    w = bottleneck_warning(load, workers=1, cores=2)
    assert w is not None and re.search(r"ran late by 0\.3 ms at p50, 1,[5-9]\d\d\.\d ms at p99", w), w
    # with workers: a parent that stood still and a worker near a full core are both named,
    # the worker first (it measured; the parent's stalls delayed sends)
    parent = timed("parent", [0.3] * 200 + [2000.0, 1500.0, 2400.0, 900.0], 0.05)
    busy = timed("worker 1", [1.5] * 204, 0.95)
    two = client_load([parent, busy])
    assert two is not None and two.bottleneck and two.busiest.role == "worker 1"
    w2 = bottleneck_warning(two, workers=1, cores=4)
    assert w2 is not None and "the client's worker 1 process used 95% of a core" in w2
    assert "so was the parent process" in w2 and "delayed sends (queue_delay_ms), not the latencies" in w2


def test_what_latencies_may_be_inflated_by_comes_from_the_processes_that_measure() -> None:
    # the parent of workers sends nothing: however late it ran, the latencies carry only
    # what the workers added; its lateness is said as send delay
    parent = process("parent", [LAG_P90_MS * 30] * 100, 0.99)
    worker = process("worker 1", [LAG_P90_MS * 5] * 100, 0.95)
    quiet = process("worker 2", [0.1] * 100, 0.3)
    both = client_load([parent, worker, quiet])
    assert both is not None and both.bottleneck and both.busiest.role == "worker 1"
    assert both.inflation_ms == (LAG_P90_MS * 5, LAG_P90_MS * 5)
    w = bottleneck_warning(both, workers=2, cores=8)
    assert w is not None and w.index("worker 1") < w.index("parent") and "TTFT" in w and "queue_delay_ms" in w
    only_parent = client_load([parent, quiet])
    assert only_parent is not None and only_parent.bottleneck and only_parent.inflation_ms == (0.1, 0.1)
    wp = bottleneck_warning(only_parent, workers=1, cores=8)
    assert wp is not None and "parent" in wp and "latencies are not inflated" in wp and "TTFT" not in wp


def test_nothing_measured_is_no_verdict() -> None:
    assert client_load([]) is None


def test_the_json_form_reads_back() -> None:
    load = client_load([process("parent", [0.5, 1.5, 9.0], 0.5), process("worker 1", [3.0, 4.0], 0.92)])
    assert load is not None
    again = ClientLoad.from_json(load.to_json())
    assert again.bottleneck == load.bottleneck and [p.role for p in again.processes] == ["parent", "worker 1"]
    assert again.processes[1].timeline == load.processes[1].timeline
    assert again.processes[0].loop_lag_ms is not None and load.processes[0].loop_lag_ms is not None
    assert again.processes[0].loop_lag_ms.max == load.processes[0].loop_lag_ms.max
    assert again.processes[1].late_share == load.processes[1].late_share and load.processes[1].late_share
    # each process's inflation reads back, so a read-back summary names the same busiest
    assert [p.inflation_ms for p in again.processes] == [p.inflation_ms for p in load.processes]
    assert all(p.inflation_ms is not None for p in again.processes)
    assert again.busiest.role == load.busiest.role
    # a summary written before late_share and the processes' inflation were kept reads
    # back without them
    old = load.to_json()
    for p in old["processes"]:
        del p["late_share"], p["inflation_ms"]
    back = ClientLoad.from_json(old).processes
    assert all(p.late_share is None and p.inflation_ms is None for p in back)
