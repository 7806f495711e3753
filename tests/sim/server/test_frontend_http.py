"""The simulated API front end over real HTTP: tokens the front end has not streamed yet
reach the client later, in order, while the engine steps on."""

from __future__ import annotations

from inferlab import BenchConfig, ClosedLoop, LoadConfig, WorkloadConfig, bench_async
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer


async def test_a_slow_host_delays_every_token_but_loses_none() -> None:
    """host_speed 0.02: 70 us a streamed token costs 3.5 ms on the front end, intake 100
    ms; the engine's steps are far shorter. Every token still arrives, in order, and the
    first one after the request's intake."""
    engine = EngineConfig(model="Qwen/Qwen2.5-0.5B-Instruct", max_model_len=2048, host_speed=0.02)
    with EmbeddedServer(ServerConfig(engine)) as sim:
        cfg = BenchConfig(LoadConfig(ClosedLoop(2), num_requests=4), WorkloadConfig(input_tokens=50, output_tokens=12))
        result = await bench_async(cfg, sim.url)
    assert result.summary.counts.completed == 4
    for r in result.records:
        assert r.output_tokens == 12
        assert r.content_ns == sorted(r.content_ns)
        assert r.ttfb_ns is not None and r.send_ns is not None
        assert r.ttfb_ns - r.send_ns > 0.1e9  # the intake at a fiftieth of the speed (2 ms / 0.02)
        # (lower bounds only: a simulated time is never reached early)
        assert (r.content_ns[-1] - r.content_ns[0]) / 11 > 3.0e6  # >= 3.5 ms of streaming a token
