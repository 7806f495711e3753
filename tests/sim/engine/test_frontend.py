"""The API front end as its own CPU resource: intake and streaming queue on it, apart
from the engine core (``sim.engine.frontend``)."""

import dataclasses
import itertools

import pytest

from inferlab.load.virtual import serve_timelines
from inferlab.sim import Engine, EngineConfig
from inferlab.sim.engine.frontend import FrontEnd, FrontEndCosts

COSTS = FrontEndCosts(latency_s=0.010, intake_s=0.002, intake_per_token_s=1e-5, stream_per_token_s=1e-4)


def test_a_burst_queues_at_the_door_one_intake_after_another() -> None:
    fe = FrontEnd(COSTS)
    ready = [fe.admit(0.0, 100) for _ in range(5)]
    intake = 0.002 + 100 * 1e-5
    gaps = [b - a for a, b in itertools.pairwise(ready)]
    assert ready[0] == pytest.approx(intake + 0.010)
    assert gaps == pytest.approx([intake] * 4)


def test_intake_grows_with_the_prompt() -> None:
    short, long = FrontEnd(COSTS).admit(0.0, 10), FrontEnd(COSTS).admit(0.0, 10_000)
    assert long - short == pytest.approx((10_000 - 10) * 1e-5)


def test_more_api_servers_and_a_faster_host_shorten_the_queue() -> None:
    def last_ready(fe: FrontEnd) -> float:
        return max(fe.admit(0.0, 100) for _ in range(8)) - COSTS.latency_s

    one = last_ready(FrontEnd(COSTS))
    assert last_ready(FrontEnd(COSTS, servers=2)) == pytest.approx(one / 2)
    assert last_ready(FrontEnd(COSTS, host_speed=4.0)) == pytest.approx(one / 4)


def test_streaming_delays_delivery_only_when_the_front_end_falls_behind() -> None:
    fe = FrontEnd(COSTS)
    # 10 tokens a step, 1 ms of CPU, every 10 ms: delivered as the step ends (+ the CPU)
    assert fe.deliver(0.010, 10) == pytest.approx(0.011)
    assert fe.deliver(0.020, 10) == pytest.approx(0.021)
    # 500 tokens a step (50 ms of CPU) every 10 ms: each step's tokens arrive later and later
    late = [fe.deliver(0.030 + 0.010 * k, 500) - (0.030 + 0.010 * k) for k in range(4)]
    assert all(b > a for a, b in itertools.pairwise(late))


def test_a_request_arriving_during_a_step_is_not_queued_behind_that_steps_streaming() -> None:
    """A step's streaming is booked when the step starts, for when it ends; a request that
    arrives while the step runs is taken in at once, around that streaming, which keeps
    its time (its delivery was already reported)."""
    fe = FrontEnd(COSTS)
    assert fe.deliver(0.010, 10) == pytest.approx(0.011)  # streaming from 10 ms to 11 ms
    intake = 0.002 + 100 * 1e-5  # 3 ms
    assert fe.admit(0.002, 100) == pytest.approx(0.002 + intake + 0.010)  # idle at 2 ms: 2-5 ms
    # 8-10 ms, then the streaming's 10-11 ms, then 11-12 ms: 3 ms of intake done at 12 ms
    assert fe.admit(0.008, 100) == pytest.approx(0.012 + 0.010)
    assert fe.deliver(0.020, 10) == pytest.approx(0.021)  # the server is idle again by 20 ms
    fe.forget_before(0.030)  # nothing later can be released before 30 ms
    assert fe.admit(0.025, 100) == pytest.approx(0.030 + intake + 0.010)


def test_the_front_end_never_idles_while_released_work_waits_and_nothing_overtakes() -> None:
    """A long intake released at 1 ms and a short one at 2 ms, with a step's streaming
    booked for 10-11 ms: the CPU works from 1 ms on without a gap, the long intake first
    (it was there first), and the short one after it, not in a gap it left idle."""
    costs = dataclasses.replace(COSTS, latency_s=0.0)
    fe = FrontEnd(costs)
    fe.deliver(0.010, 10)  # 10-11 ms
    long_cost, short_cost = fe.intake_cost_s(900), fe.intake_cost_s(10)  # 11 ms and 2.1 ms
    long_ready, short_ready = fe.admit(0.001, 900), fe.admit(0.002, 10)
    assert long_ready == pytest.approx(0.001 + long_cost + 0.001)  # around the streaming
    assert short_ready == pytest.approx(long_ready + short_cost)  # right after, no idle gap
    assert fe.busy_s == pytest.approx(0.001 + long_cost + short_cost)


def test_work_that_fills_a_gap_exactly_ends_where_the_gap_does() -> None:
    """0.1 s of work released at 0.5 s before work booked at 0.6 s: done at 0.6 s, not
    after the later work because 0.6 - 0.5 rounds a few ulps short of 0.1."""
    from inferlab.sim.engine.frontend import _BusyIntervals

    for later, cost_later, release, cost in ((0.6, 0.12, 0.5, 0.1), (6.0, 1.2, 5.7, 0.3)):
        cpu = _BusyIntervals()
        cpu.book(later, cost_later)
        assert cpu.finish_s(release, cost) == pytest.approx(later)
        assert cpu.book(release, cost) == pytest.approx(later)


def test_an_arrival_during_a_decode_step_starts_at_the_next_step() -> None:
    """On vLLM V1 with the front end's CPU queue, one request decoding: a second one that
    arrives just after a step began, with time for its intake, joins the very next step
    (it used to queue behind the streaming booked for that step's end, and miss it); one
    whose intake is a little longer than a step joins the step after, not the third.
    Without async scheduling: with it, any arrival during a step waits one step more
    (``test_engine``'s overlap test)."""
    config = EngineConfig(model="Llama-3.1-8B", gpu="H100", max_model_len=8192, api_overhead_s=0.0, overlap_schedule=False)
    first = (0.0, "a", [7, *range(1, 64)], 400)
    solo = Engine(config)
    solo.record_token_times = True
    times = serve_timelines(solo, [first])["a"].token_times_s
    # token times are when each token reached the client: the end of its step plus the
    # (short) streaming of one token; a step lasts as long as the gap between two
    step_s = times[101] - times[100]
    short, long = [9, *range(1, 64)], [9, *range(1, 4001)]
    fe = Engine(config).front_end
    assert fe.intake_cost_s(len(short)) < step_s / 2 < step_s < fe.intake_cost_s(len(long)) < 1.5 * step_s
    arrive = times[100] + 0.02 * step_s  # just after the step that emits token 101 began
    for prompt, most in ((short, step_s), (long, 2.5 * step_s)):
        tls = serve_timelines(Engine(config), [first, (arrive, "b", prompt, 4)])
        scheduled = tls["b"].scheduled_s
        assert scheduled is not None
        assert arrive <= scheduled < arrive + most  # the first step after its intake


def test_a_step_costs_the_api_server_once_whatever_its_tokens() -> None:
    """The same 64 tokens in one step or in 64 steps of one: the 63 more steps each cost
    the per-step CPU; with two API servers each pays it (its own streams' outputs)."""
    costs = dataclasses.replace(COSTS, stream_per_step_s=3e-4)
    one_step, many_steps = FrontEnd(costs), FrontEnd(costs)
    one_step.deliver(0.0, 64)
    for _ in range(64):
        many_steps.deliver(0.0, 1)
    assert many_steps.busy_s - one_step.busy_s == pytest.approx(63 * 3e-4)
    two = FrontEnd(costs, servers=2)
    two.deliver(0.0, 64)
    assert two.busy_s - one_step.busy_s == pytest.approx(3e-4)
    # a step of one token reaches one of four servers: one per-step cost, not four
    four, one = FrontEnd(costs, servers=4), FrontEnd(costs)
    four.deliver(0.0, 1)
    one.deliver(0.0, 1)
    assert four.busy_s == pytest.approx(one.busy_s)
    # a step with nothing streamed costs nothing
    idle = FrontEnd(costs)
    assert idle.deliver(0.5, 0) == 0.5 and idle.busy_s == 0.0


def test_many_streams_cost_less_per_token_than_few() -> None:
    """At a step a token per stream, the per-step cost spreads over the streams: 4 streams
    pay more per token than 32 (what bench/vllm_front_end_cost.py measures on vLLM)."""
    costs = dataclasses.replace(COSTS, stream_per_step_s=3e-4)

    def per_token(streams: int) -> float:
        fe = FrontEnd(costs)
        for k in range(100):
            fe.deliver(k * 1.0, streams)
        return fe.busy_s / (100 * streams)

    assert per_token(4) > per_token(32) > costs.stream_per_token_s


def test_bad_front_end_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="api_server_count"):
        Engine(EngineConfig(api_server_count=0))
    with pytest.raises(ValueError, match="host_speed"):
        Engine(EngineConfig(host_speed=0.0))
    with pytest.raises(ValueError, match="engine's process"):
        Engine(EngineConfig(engine_family="vllm-v0.5", api_server_count=2))


@pytest.mark.parametrize("family", ["vllm-v0", "sglang", "trtllm", "lmdeploy"])
@pytest.mark.parametrize("setting", [{"api_server_count": 4}, {"host_speed": 2.0}])
def test_front_end_settings_are_refused_where_the_family_has_no_cpu_queue(family: str, setting: dict[str, float]) -> None:
    # (they scale the CPU queue's costs, which these families model as none: accepted, they
    # changed nothing); vllm and vllm-v0.5 (an in-process intake) take them
    with pytest.raises(ValueError, match="without a CPU queue"):
        Engine(EngineConfig(engine_family=family, **setting))  # type: ignore[arg-type]
    Engine(EngineConfig(engine_family="vllm", **setting))  # type: ignore[arg-type]
    Engine(EngineConfig(engine_family="vllm-v0.5", host_speed=2.0))


BASE = EngineConfig(model="Qwen/Qwen2.5-0.5B-Instruct", gpu="H100", max_model_len=2048)


def burst_ttfts(config: EngineConfig, n: int = 200) -> list[float]:
    arrivals = [(0.0, str(i), [10_000 + i, *range(1, 512)], 16) for i in range(n)]
    tls = serve_timelines(Engine(config), arrivals)
    return sorted((t.first_token_s or 0.0) - t.arrival_s for t in tls.values())


def test_vllm_v1_burst_waits_at_the_api_server_and_more_servers_help() -> None:
    """A burst of small requests on a fast GPU: the front end, not the GPU, sets when the
    last one starts; two API servers take about half as long, a host twice as fast too."""
    one = burst_ttfts(BASE)
    two = burst_ttfts(dataclasses.replace(BASE, api_server_count=2))
    fast = burst_ttfts(dataclasses.replace(BASE, host_speed=2.0))
    intake = Engine(BASE).front_end.intake_cost_s(512)
    assert one[-1] > 200 * intake  # the last waited at the door for every intake before it
    assert 0.4 < two[-1] / one[-1] < 0.75
    assert 0.4 < fast[-1] / one[-1] < 0.75


def test_offline_runs_have_no_front_end_and_sim_run_refuses_its_settings() -> None:
    import subprocess
    import sys

    offline = burst_ttfts(dataclasses.replace(BASE, offline=True))
    served = burst_ttfts(BASE)
    assert offline[0] < served[0] and offline[-1] < served[-1]
    # front-end settings on an offline engine would change nothing: refused, whoever builds it
    # (sweep, tune and calibrate as well as sim run)
    for setting in ({"host_speed": 0.5}, {"api_server_count": 2}, {"api_overhead_s": 0.003}):
        with pytest.raises(ValueError, match="offline run has none"):
            Engine(dataclasses.replace(BASE, offline=True, **setting))  # type: ignore[arg-type]
    Engine(dataclasses.replace(BASE, offline=True, api_overhead_s=0.0))  # (what an offline run records)
    p = subprocess.run([sys.executable, "-m", "inferlab", "sim", "run", "--rate", "inf", "-n", "2", "--host-speed", "2"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 2 and "offline run has none" in p.stderr
