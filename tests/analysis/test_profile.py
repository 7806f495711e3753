"""``inferlab profile`` against the simulated server over real loopback HTTP: what it
measures is what the simulator itself predicts in virtual time."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest

from inferlab.analysis.fits import linear_fit
from inferlab.analysis.profile import PROFILE_FILE, ProfileConfig, profile, read_profile
from inferlab.load.run import RunConfig, SimTarget, run
from inferlab.load.schedules import ClosedLoop, LoadConfig
from inferlab.results.runfiles import read_records
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.launch import ChildServer
from inferlab.workload.config import WorkloadConfig

LIMIT_S = 240.0
#: The server's settings, all given (none left to a default).
SERVE = ["--max-model-len", "4096", "--max-num-batched-tokens", "8192", "--enforce-eager", "--gpu", "H100"]


def sim_ttft_ms(engine: EngineConfig, prompt_tokens: int) -> tuple[float, float]:
    """(prompt tokens as the engine counted them, TTFT ms) of one request alone, in virtual time."""
    cfg = RunConfig(LoadConfig(ClosedLoop(1), num_requests=3), WorkloadConfig(input_tokens=prompt_tokens, output_tokens=1))
    s = asyncio.run(run(cfg, SimTarget(engine))).summary
    assert s.ttft_ms is not None and s.input_tokens is not None
    return s.input_tokens / 3, s.ttft_ms.p50


def test_profile_recovers_the_prefill_rate_and_decode_time_the_simulator_predicts(tmp_path: Path) -> None:
    out = tmp_path / "profile"
    config = ProfileConfig(str(out), budget_s=300, factors=("prefill", "decode"), max_concurrency=1)
    with ChildServer(SERVE) as server:
        async def go() -> None:
            async with asyncio.timeout(LIMIT_S):
                await profile(config, server.url)
        asyncio.run(go())
    p = read_profile(out)
    assert json.loads((out / PROFILE_FILE).read_text())["schema"] == "inferlab.profile/1"
    assert [f.name for f in p.factors] == ["prefill", "decode"]
    assert p.engine is not None and p.max_model_len == 4096
    engine = EngineConfig(**{k: v for k, v in p.engine.items() if k in {f.name for f in dataclasses.fields(EngineConfig)} - {"gpu", "offline"}})

    # the simulator's own prediction, at the lengths the profile sent, in virtual time
    prefill = p.factor("prefill")
    assert prefill is not None and prefill.measured
    lengths = sorted({r.requested_input_tokens for run_name in prefill.runs for r in read_records(out / run_name / "requests.jsonl")
                      if r.requested_input_tokens is not None})
    assert len(lengths) >= 5 and lengths[-1] > 3000  # the ladder reached near the context
    predicted = [sim_ttft_ms(engine, n) for n in lengths]
    _, slope = linear_fit([x for x, _ in predicted], [y for _, y in predicted])
    predicted_tps = 1000 / slope
    measured_tps = prefill.data["fit"]["prefill_tps"]
    assert measured_tps == pytest.approx(predicted_tps, rel=0.10)
    # the server's own clock leaves out what parsing and the network add: closer still
    assert prefill.data["server_fit"]["prefill_tps"] == pytest.approx(predicted_tps, rel=0.05)

    decode = p.factor("decode")
    assert decode is not None and decode.measured
    # (one concurrency ran: it said "throughput still rising at 1")
    assert "only concurrency 1 ran (no knee measured)" in decode.cost, decode.cost
    # its point's length is judged (requests per user, duration against E2E) and recorded
    [point] = decode.data["points"]
    assert point["duration_s"] > 0 and point["completed"] >= 3
    assert decode.data["quality"] == {"trusted": True, "caveats": [], "short": []}, decode.data["quality"]
    assert "steady state" not in decode.cost
    cfg = RunConfig(LoadConfig(ClosedLoop(1), num_requests=3), WorkloadConfig(input_tokens=128, output_tokens=decode.data["output_tokens"]))
    s = asyncio.run(run(cfg, SimTarget(engine))).summary
    assert s.tpot_ms is not None
    assert decode.data["tpot_ms_at_1"] == pytest.approx(s.tpot_ms.p50, rel=0.10)


def test_profile_refuses_a_folder_that_holds_one_and_unknown_factors(tmp_path: Path) -> None:
    from inferlab._errors import UsageError

    (tmp_path / PROFILE_FILE).write_text("{}")
    with pytest.raises(UsageError, match="already holds a profile"):
        asyncio.run(profile(ProfileConfig(str(tmp_path)), "http://127.0.0.1:9"))
    with pytest.raises(UsageError, match="unknown nonsense"):
        ProfileConfig(str(tmp_path), factors=("nonsense",))


def test_a_tiny_budget_stops_the_profile_and_says_what_was_left_out(tmp_path: Path) -> None:
    config = ProfileConfig(str(tmp_path / "p"), budget_s=1.0, factors=("prefill", "decode", "output_length"))
    with ChildServer(SERVE) as server:
        async def go() -> None:
            async with asyncio.timeout(LIMIT_S):
                await profile(config, server.url)
        asyncio.run(go())
    p = read_profile(tmp_path / "p")
    assert [f.name for f in p.factors] == ["prefill", "decode", "output_length"]
    skipped = [f for f in p.factors if not f.measured]
    assert any("budget" in f.cost for f in skipped), [f.cost for f in p.factors]


def test_a_model_the_server_does_not_have_stops_the_profile_before_any_factor(tmp_path: Path) -> None:
    # (it profiled on: prefill failed with the 404, and the template was saved as
    # measured, "0 tokens per request")
    from inferlab._errors import UsageError

    out = tmp_path / "p"
    config = ProfileConfig(str(out), budget_s=30, model="nosuch", factors=("template", "prefill"))
    with ChildServer(SERVE) as server, pytest.raises(UsageError, match=r"nosuch.*check --model"):
        asyncio.run(profile(config, server.url))
    assert not out.exists()  # (the folder it made for the profile is not left behind, empty)
    out.mkdir()  # a folder the user made stays
    with ChildServer(SERVE) as server, pytest.raises(UsageError, match=r"nosuch.*check --model"):
        asyncio.run(profile(config, server.url))
    assert out.is_dir() and not any(out.iterdir())


def test_the_template_is_not_reported_as_measured_when_no_request_counted_it(tmp_path: Path) -> None:
    # every request fails (a server that answers 503, which the probe lets pass): the
    # template's tokens were never counted, and 0 was reported as measured
    from aiohttp import web

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    async def busy(_: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "busy"}}, status=503)

    async def go() -> None:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", busy)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with asyncio.timeout(LIMIT_S):
                await profile(ProfileConfig(str(tmp_path / "p"), budget_s=30, factors=("template",)), f"http://127.0.0.1:{port}")
        finally:
            await runner.cleanup()

    asyncio.run(go())
    template = read_profile(tmp_path / "p").factor("template")
    assert template is not None and not template.measured and template.cost.startswith("not measured:"), template


def test_the_words_for_a_knee_and_small_differences_say_what_was_measured() -> None:
    """A ladder of one concurrency has no step to judge a knee by ("throughput still
    rising at 1" it said); a difference that rounds to zero is 0, never "-0.0 µs per
    prompt token" or "saved -0.0 ms"."""
    from inferlab.analysis.profile import front_end_words, knee_words, signed_ms

    assert knee_words([1], None) == "only concurrency 1 ran (no knee measured)"
    assert knee_words([1, 2, 4], None) == "throughput still rising at 4 (no knee measured)"
    assert knee_words([1, 2, 4], 2) == "knee at concurrency 2"
    assert "-0.0" not in front_end_words(-0.01) and "nothing measurable" in front_end_words(-0.01)
    assert "1.5 µs" in front_end_words(1.5)
    assert signed_ms(-0.01) == "0.0" and signed_ms(-2.0) == "-2.0" and signed_ms(3.0) == "+3.0"


def test_the_default_budgets_decode_ladder_is_steady_state_and_a_small_one_drops_its_top_points(tmp_path: Path) -> None:
    """The decode ladder ran 2 requests per user from concurrency 4 up whatever the budget,
    so its own "too short to be steady state" flag fired on every default profile of the
    simulated server. Now each point runs enough requests per user to meet the flag's
    criterion (``decode_quality``) where its share of the budget allows; where it does
    not, the highest concurrencies are dropped, and the cost says which and why, rather
    than run too short."""
    config = ProfileConfig(str(tmp_path / "default"), factors=("decode",), max_concurrency=16)
    short = ProfileConfig(str(tmp_path / "short"), budget_s=8.0, factors=("decode",), max_concurrency=16)
    with ChildServer(SERVE) as server:
        async def go(c: ProfileConfig) -> None:
            async with asyncio.timeout(LIMIT_S):
                await profile(c, server.url)
        asyncio.run(go(config))
        asyncio.run(go(short))
    decode = read_profile(tmp_path / "default").factor("decode")
    assert decode is not None and decode.measured
    assert decode.data["quality"]["trusted"], decode.data["quality"]
    assert [r["concurrency"] for r in decode.data["points"]] == [1, 2, 4, 8, 16] and not decode.data["dropped"]
    assert "steady state" not in decode.cost and "not run" not in decode.cost, decode.cost
    # a budget too small for the whole ladder: the top points dropped with why; those run are steady
    decode = read_profile(tmp_path / "short").factor("decode")
    assert decode is not None and decode.measured
    ran, dropped = [r["concurrency"] for r in decode.data["points"]], decode.data["dropped"]
    assert dropped and ran + dropped == [1, 2, 4, 8, 16], (ran, dropped)
    assert decode.data["quality"]["trusted"], decode.data["quality"]
    said = f"concurrency {', '.join(map(str, dropped))} not run: at 4 requests per user (steady state)"
    assert said in decode.cost and decode.data["dropped_why"] in decode.cost, decode.cost


def test_metrics_url_is_read_by_every_measurement_and_checked_before_the_first(tmp_path: Path) -> None:
    """``profile --metrics-url``: the pages bench would read instead of the one beside
    --url (the engines behind a gateway), read by each measurement, so the prefix cache's
    factor has the server's own counts where the answers say none (this server does not
    put cached tokens in them); a page that does not answer is refused before the first
    measurement (exit 1, no profile written); without --url, a usage error."""
    from click.testing import CliRunner

    from inferlab.cli.main import main

    def cli(*args: str) -> tuple[int, str]:
        r = CliRunner().invoke(main, ["profile", "--factors", "prefix_cache", "--budget", "60s", *args])
        return r.exit_code, r.output

    code, out = cli("--metrics-url", "http://127.0.0.1:9/metrics", "-o", str(tmp_path / "a"))
    assert code == 2 and "--metrics-url needs --url" in out
    with ChildServer(SERVE) as server:
        page = f"{server.url}/metrics"
        code, out = cli("--url", server.url, "--metrics-url", "http://127.0.0.1:9/metrics", "-o", str(tmp_path / "b"))
        assert code == 1 and "--metrics-url http://127.0.0.1:9/metrics" in out and len(out.strip().splitlines()) == 1
        assert not (tmp_path / "b").exists()
        code, out = cli("--url", server.url, "--metrics-url", page, "-o", str(tmp_path / "c"), "--json")
    assert code == 0, out
    runs = sorted((tmp_path / "c").glob("**/config.json"))
    assert runs and all(json.loads(p.read_text())["resolved"]["metrics_urls"] == [page] for p in runs)
    written = read_profile(tmp_path / "c")
    (factor,) = written.factors
    assert factor.measured and "the server's /metrics" in factor.cost
    assert written.metrics_urls == (page,) and json.loads((tmp_path / "c" / PROFILE_FILE).read_text())["metrics_urls"] == [page]
