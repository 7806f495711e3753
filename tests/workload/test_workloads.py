"""Length distributions and the shared-prefix workload (bench and sim run)."""

from __future__ import annotations

import random
import statistics

import pytest

from inferlab import (
    BenchConfig,
    ClosedLoop,
    LoadConfig,
    OpenLoop,
    UsageError,
    WorkloadConfig,
    bench_async,
)
from inferlab.load.virtual import simulate
from inferlab.sim.engine.engine import Engine, EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer
from inferlab.workload.builtin_tokenizer import BuiltinTokenizer
from inferlab.workload.config import parse_popularity
from inferlab.workload.lengths import parse_length
from inferlab.workload.spec import RequestSpec


def draws(spec: str, n: int = 4000, seed: int = 1) -> list[int]:
    d = parse_length(spec)
    rng = random.Random(seed)
    return [d.sample(rng) for _ in range(n)]


def test_length_distributions() -> None:
    assert set(draws("500", 10)) == {500}
    u = draws("uniform:100:900")
    assert min(u) >= 100 and max(u) <= 900 and max(u) - min(u) > 700
    n = draws("normal:500:100")
    assert 480 < statistics.mean(n) < 520 and 85 < statistics.stdev(n) < 115
    ln = draws("lognormal:500:0.6")
    assert 470 < statistics.median(ln) < 530 and statistics.mean(ln) > statistics.median(ln)
    assert min(draws("normal:30:12", 2000)) >= 1  # (a few draws below 1 token, held to 1)
    assert draws("lognormal:500:0.6", 50, seed=7) == draws("lognormal:500:0.6", 50, seed=7)
    assert draws("lognormal:500:0.6", 50, seed=7) != draws("lognormal:500:0.6", 50, seed=8)


@pytest.mark.parametrize(("spec", "mean"), [("normal:100:500", "254"), ("normal:3:50", "22")])
def test_a_normal_spec_whose_draws_held_to_one_token_change_its_mean_is_refused(spec: str, mean: str) -> None:
    """Draws below 1 token are held to 1: where that moves the mean (100 asked, about
    254 drawn), the spec is refused with the mean it would draw, not run as asked."""
    with pytest.raises(UsageError, match=f"would be held to 1, a mean of {mean}, not "):
        parse_length(spec)
    held = statistics.mean(draws("normal:100:40", 20000))  # (within the limit: drawn as asked)
    assert abs(held - 100) < 1.5


@pytest.mark.parametrize("spec", ["0", "-3", "abc", "uniform:900:100", "uniform:1.5:3", "normal:500", "poisson:3:4", "lognormal:0:1", "normal:x:1",
                                  "lognormal:inf:0.6", "normal:1e400:1", "normal:800:inf", "lognormal:nan:1"])
def test_bad_length_specs(spec: str) -> None:
    with pytest.raises(UsageError, match="--input-tokens"):
        parse_length(spec)


@pytest.mark.parametrize("spec", ["lognormal:800:1e9", "uniform:1:1e30", "normal:800:1e9", "20000000", "lognormal:800:6"])
def test_lengths_past_every_context_are_refused_not_drawn(spec: str) -> None:
    """A spread no model takes (its 99.9th percentile past 10M tokens) is a usage error;
    it was accepted, and the first draw crashed (overflow) or built a prompt of gigabytes."""
    with pytest.raises(UsageError, match="10,000,000 tokens"):
        parse_length(spec)


def test_a_wide_spread_within_the_limit_draws_and_no_draw_passes_it() -> None:
    d = draws("lognormal:800:2.5", 2000)  # (p99.9: 800 * e^7.7, 1.8M tokens: accepted)
    assert statistics.median(d) < 2000
    # a draw past the limit is cut to it (a distribution made directly, not parsed: the
    # parser refuses this one; a fifth of its draws pass 10M tokens)
    import random

    from inferlab.workload.lengths import MAX_LENGTH_TOKENS, LengthDist

    rng = random.Random(0)
    wide = [LengthDist("lognormal", 800.0, 8.0).sample(rng) for _ in range(500)]
    assert max(wide) == MAX_LENGTH_TOKENS and min(wide) >= 1


def test_popularity() -> None:
    assert parse_popularity("uniform") == 0.0
    assert parse_popularity("zipf") == 1.0
    assert parse_popularity("Zipf:1.5") == 1.5
    for bad in ("zipf:0", "zipf:x", "pareto", "uniform:2"):
        with pytest.raises(UsageError, match="--prefix-popularity"):
            parse_popularity(bad)


def take(n: int, it: object) -> list[RequestSpec]:
    assert not isinstance(it, list)
    return [next(it) for _ in range(n)]  # type: ignore[call-overload]


def test_synthetic_lengths_follow_the_distribution_exactly_in_sim_tokens() -> None:
    specs = take(200, WorkloadConfig(input_tokens="uniform:10:60", output_tokens="normal:20:5").build(3))
    tok = BuiltinTokenizer()
    assert all(len(tok.encode(str(s.prompt))) == s.input_tokens for s in specs)
    assert len({s.input_tokens for s in specs}) > 30
    assert len({s.max_tokens for s in specs}) > 5


def test_shared_prefix_groups_and_zipf_popularity() -> None:
    cfg = WorkloadConfig(prefix_groups=5, prefix_tokens=100, suffix_tokens=20, output_tokens=4, prefix_popularity="zipf:1.2")
    specs = take(1000, cfg.build(0))
    tok = BuiltinTokenizer()
    ids = [tok.encode(str(s.prompt)) for s in specs]
    assert all(len(i) == 120 and s.input_tokens == 120 for i, s in zip(ids, specs, strict=True))
    counts: dict[tuple[int, ...], int] = {}
    for i in ids:
        counts[tuple(i[:100])] = counts.get(tuple(i[:100]), 0) + 1
    ranked = sorted(counts.values(), reverse=True)
    assert len(ranked) == 5
    assert ranked[0] > 2 * ranked[-1]  # zipf: the top group is much more popular
    uniform = take(1000, WorkloadConfig(prefix_groups=5, prefix_tokens=100, suffix_tokens=20).build(0))
    u_counts: dict[str, int] = {}
    for s in uniform:
        key = " ".join(str(s.prompt).split()[:100])
        u_counts[key] = u_counts.get(key, 0) + 1
    assert len(u_counts) == 5 and max(u_counts.values()) < 1.4 * min(u_counts.values())


def test_workload_conflicts_are_usage_errors() -> None:
    for cfg in (
        WorkloadConfig(input_tokens=10, prompt="hi"),
        WorkloadConfig(input_tokens=10, prefix_tokens=100),
        WorkloadConfig(suffix_tokens=10),
        WorkloadConfig(prefix_groups=0, prefix_tokens=10),
    ):
        with pytest.raises(UsageError):
            cfg.build(0)


def sim_run(caching: bool) -> tuple[float, int]:
    wl = WorkloadConfig(prefix_groups=4, prefix_tokens=2048, suffix_tokens=64, output_tokens=8)
    records = simulate(
        Engine(EngineConfig(enable_prefix_caching=caching, api_overhead_s=0.0)),  # prefill alone
        LoadConfig(OpenLoop(8.0, "constant"), num_requests=40),
        wl.build(0),  # type: ignore[arg-type]
    )
    ttft = statistics.mean((r.content_ns[0] - (r.send_ns or 0)) / 1e6 for r in records)
    return ttft, sum(r.cached_tokens or 0 for r in records)


def test_prefix_caching_lowers_ttft_in_sim_run() -> None:
    on_ttft, on_cached = sim_run(True)
    off_ttft, off_cached = sim_run(False)
    assert off_cached == 0
    # all but the first request of each group find the 2,048-token prefix (128 blocks)
    assert on_cached == 36 * 2048
    assert on_ttft < 0.5 * off_ttft


async def test_prefix_caching_against_the_sim_server() -> None:
    cfg = BenchConfig(
        load=LoadConfig(ClosedLoop(1), num_requests=12),
        workload=WorkloadConfig(prefix_groups=3, prefix_tokens=1024, suffix_tokens=32, output_tokens=4),
        api="completions",
    )

    async def run(caching: bool) -> tuple[int, float]:
        with EmbeddedServer(ServerConfig(EngineConfig(enable_prefix_caching=caching), enable_prompt_tokens_details=True)) as sim:
            s = (await bench_async(cfg, sim.url)).summary
        # the server's own first-token times: no loopback noise
        return s.cached_tokens, s.server_timeline.server_ttft_ms.mean

    on_cached, on_ttft = await run(True)
    off_cached, off_ttft = await run(False)
    assert on_cached == 9 * 1024 and off_cached == 0
    assert on_ttft < off_ttft
