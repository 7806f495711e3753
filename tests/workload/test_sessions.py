"""Multi-turn sessions: the context grows with each answer (prefix caching sees it), the
sliding-window trimmer bounds it, closed and open loop, bench and sim run."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

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
from inferlab.results.records import RequestRecord
from inferlab.sim.engine.engine import Engine, EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer
from inferlab.workload.sessions import SessionWorkload


def by_session(records: list[RequestRecord]) -> dict[int, list[RequestRecord]]:
    out: dict[int, list[RequestRecord]] = {}
    for r in records:
        assert r.session is not None and r.turn is not None
        out.setdefault(r.session, []).append(r)
    for turns in out.values():
        turns.sort(key=lambda r: r.turn or 0)
    return out


def sim_sessions(window: int | None = None, *, rate: float | None = None, api_chat: bool = True) -> list[RequestRecord]:
    wl = WorkloadConfig(sessions=3, turns=5, input_tokens=100, output_tokens=40, think_time_s=0.5,
                        system_tokens=64, context_window_tokens=window).build(0)
    assert isinstance(wl, SessionWorkload)
    schedule = OpenLoop(rate, "constant") if rate else ClosedLoop(3)
    return simulate(Engine(EngineConfig()), LoadConfig(schedule, num_requests=15), wl, chat=api_chat)


def test_sim_context_grows_and_the_prefix_cache_sees_it() -> None:
    records = sim_sessions()
    sessions = by_session(records)
    assert len(sessions) == 3 and all(len(t) == 5 for t in sessions.values())
    for turns in sessions.values():
        inputs = [r.input_tokens or 0 for r in turns]
        cached = [r.cached_tokens or 0 for r in turns]
        assert all(b > a + 140 for a, b in itertools.pairwise(inputs))  # + answer + new message
        assert all(c > 0 for c in cached[1:]) and cached == sorted(cached) and cached[-1] > cached[1]
        # each turn after the first finds the previous turn's prompt and answer cached (the
        # answer's blocks too, as vLLM caches them), but for the last partial block and the
        # answer's last token, whose KV is never computed
        outputs = [r.output_tokens or 0 for r in turns]
        assert all(c >= p + o - 1 - 15 for c, p, o in zip(cached[1:], inputs, outputs, strict=False))
        gaps = [(b.send_ns or 0) - (a.end_ns or 0) for a, b in itertools.pairwise(turns)]
        assert all(g == 500_000_000 for g in gaps)  # think time, exactly, in virtual time


def test_sim_sliding_window_bounds_the_context() -> None:
    window = 300
    trimmed = sim_sessions(window, api_chat=False)
    full = sim_sessions(None, api_chat=False)
    sep = 2  # "\n\n" between messages (completions API): two byte tokens each
    for r in trimmed:
        messages = 2 + 2 * (r.turn or 0)  # system + history + new message, at most
        assert (r.input_tokens or 0) <= window + 64 + 100 + sep * messages
    assert max(r.input_tokens or 0 for r in full) > max(r.input_tokens or 0 for r in trimmed) + 200


def test_sim_open_loop_sessions_arrive_at_the_rate() -> None:
    records = sim_sessions(rate=2.0)
    firsts = sorted(r.intended_send_ns or 0 for r in records if r.turn == 0)
    assert firsts == [0, 500_000_000, 1_000_000_000]
    assert len(records) == 15


async def test_bench_sessions_against_the_sim_server() -> None:
    cfg = BenchConfig(
        load=LoadConfig(ClosedLoop(2), num_requests=8),
        workload=WorkloadConfig(sessions=2, turns=4, input_tokens=64, output_tokens=16, think_time_s=0.01),
    )
    with EmbeddedServer(ServerConfig(EngineConfig(), enable_prompt_tokens_details=True)) as sim:
        result = await bench_async(cfg, sim.url)
    assert result.summary.counts.completed == 8
    for turns in by_session(result.records).values():
        assert [r.turn for r in turns] == [0, 1, 2, 3]
        inputs = [r.input_tokens or 0 for r in turns]
        cached = [r.cached_tokens or 0 for r in turns]
        # the server's real answer text went into the next prompt
        assert all(b >= a + 64 + 16 for a, b in itertools.pairwise(inputs))
        assert cached[0] == 0 and all(c > p for c, p in zip(cached[2:], cached[1:], strict=False)) and cached[1] > 0
        # the server caches its answers by content: the next turn finds prompt and answer
        outputs = [r.output_tokens or 0 for r in turns]
        assert all(c >= p + o - 1 - 15 for c, p, o in zip(cached[1:], inputs, outputs, strict=False))


def test_cli_sim_run_sessions() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "inferlab", "sim", "run", "--api", "chat", "--sessions", "4", "--turns", "3",
         "--input-tokens", "50", "--output-tokens", "20", "--think-time-s", "1", "--context-window-tokens", "100", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["counts"]["completed"] == 12 and s["cached_tokens"] > 0


def test_sim_run_sessions_write_the_step_log(tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    p = subprocess.run(
        [sys.executable, "-m", "inferlab", "sim", "run", "--sessions", "2", "--turns", "2",
         "--input-tokens", "50", "--step-log", str(log), "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert p.returncode == 0, p.stderr
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    assert steps and sum(s["prefill_tokens"] for s in steps) >= 4 * 50


def test_sessions_send_at_most_the_requests_asked_for_warmup_first() -> None:
    """-n caps the turns sent (it was ignored: every turn of every session went) and
    --warmup marks the first ones, closed and open loop."""
    for schedule in (ClosedLoop(3), OpenLoop(2.0, "constant")):
        wl = WorkloadConfig(sessions=3, turns=5, input_tokens=50, output_tokens=5).build(0)
        assert isinstance(wl, SessionWorkload)
        records = simulate(Engine(EngineConfig()), LoadConfig(schedule, num_requests=4, warmup=2), wl)
        assert len(records) == 6
        assert sorted(r.index for r in records if r.warmup) == [0, 1]


def test_sessions_at_a_rate_refuse_a_concurrency_cap_they_would_not_heed() -> None:
    wl = WorkloadConfig(sessions=6, turns=2, input_tokens=50, output_tokens=5).build(0)
    assert isinstance(wl, SessionWorkload)
    with pytest.raises(UsageError, match="--max-concurrency does not cap sessions"):
        simulate(Engine(EngineConfig()), LoadConfig(OpenLoop(100.0, max_concurrency=1), num_requests=12), wl)


@pytest.mark.parametrize("think", [math.inf, math.nan, -1.0])
def test_a_think_time_that_is_no_number_of_seconds_is_a_usage_error(think: float) -> None:
    """inf crashed the run as an internal error and nan hung it (no turn was ever due)."""
    with pytest.raises(UsageError, match="--think-time-s must be a finite number"):
        WorkloadConfig(sessions=2, turns=2, input_tokens=20, output_tokens=3, think_time_s=think).build(0)


@pytest.mark.parametrize("users", [("-c", "5"), ("--max-concurrency", "4")])
def test_more_users_than_sessions_is_refused(users: tuple[str, str]) -> None:
    """A user runs one session at a time: 5 users for 3 sessions would run 3 at once and
    be recorded as 5."""
    p = subprocess.run([sys.executable, "-m", "inferlab", "sim", "run", "--sessions", "3", "--turns", "2", *users],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and f"{users[0]} {users[1]} users for --sessions 3" in p.stderr, p.stderr
    ok = subprocess.run([sys.executable, "-m", "inferlab", "sim", "run", "--sessions", "3", "--turns", "2", "-c", "3"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr


def test_a_window_that_holds_no_earlier_exchange_is_refused() -> None:
    """A 50-token window for 100-token messages kept no history: every turn went out
    alone, as if the sessions were single requests, and nothing said so."""
    p = subprocess.run([sys.executable, "-m", "inferlab", "sim", "run", "--sessions", "1", "--turns", "2",
                        "--input-tokens", "100", "--output-tokens", "20", "--context-window-tokens", "50"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--context-window-tokens 50 holds no earlier exchange" in p.stderr, p.stderr
    assert "120 tokens on average" in p.stderr


@pytest.mark.parametrize("which", ["builtin", "bpe"])
def test_an_answer_sent_back_tokenizes_as_the_model_wrote_it(which: str, request: pytest.FixtureRequest) -> None:
    # The simulated model writes the output passage over and over; a conversation's next
    # prompt holds that text, tokenized again. Where it comes back as the same tokens
    # (across the passes' seams too) the engine's cached answer blocks are found.
    from inferlab.workload.builtin_tokenizer import BuiltinTokenizer
    from inferlab.workload.tokenizers import Tokenizer, load_tokenizer

    tok: Tokenizer = BuiltinTokenizer() if which == "builtin" else load_tokenizer(request.getfixturevalue("tokenizer_path"))
    first = [{"role": "user", "content": "How fast is the server today?"}]
    prompt = tok.apply_chat_template(first)
    for n in (1, 50, 700, 2_500):  # several passes of the passage
        answer = [tok.output_token(k) for k in range(n)]
        text = tok.decode(answer)
        assert tok.encode(text) == answer
        follow = tok.apply_chat_template([*first, {"role": "assistant", "content": text}, {"role": "user", "content": "And now?"}])
        assert follow[: len(prompt) + n] == prompt + answer


def test_sessions_through_the_completions_api_say_the_answers_are_not_cached() -> None:
    shares = {}
    for api in ("completions", "chat"):
        p = subprocess.run(
            [sys.executable, "-m", "inferlab", "sim", "run", "--api", api, "--sessions", "2", "--turns", "3",
             "--input-tokens", "50", "--output-tokens", "40", "--json", "--no-history"],
            capture_output=True, text=True, timeout=120,
        )
        assert p.returncode == 0, p.stderr
        s = json.loads(p.stdout)
        said = [w for w in s["warnings"] if "multi-turn sessions through the completions API" in w]
        assert len(said) == (api == "completions"), s["warnings"]
        shares[api] = s["cached_tokens"] / s["input_tokens"]
        # the error bands were measured on no conversation: the prediction says so
        assert any("no validated row is a conversation" in b for b in s["prediction"]["beyond_validated"])
    # ...as the cache shows: through chat each next turn finds the last answer too
    assert shares["chat"] > shares["completions"] + 0.05, shares


async def test_turns_a_failed_turn_left_unsent_are_said() -> None:
    """A session whose turn fails cannot go on (that turn's answer is its context): its
    later turns were dropped without a word ("3 completed, 1 failed" of 6 planned). The
    summary now says how many were not sent, whose, and how many were planned and sent."""
    cfg = BenchConfig(load=LoadConfig(ClosedLoop(1), num_requests=6),
                      workload=WorkloadConfig(sessions=1, turns=6, input_tokens=500, output_tokens=10))
    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=2048))) as sim:
        s = (await bench_async(cfg, sim.url)).summary
    c = s.counts
    assert c.failed == 1 and c.completed + c.failed < 6  # (the context grew past 2,048 tokens)
    cut = 6 - c.completed - c.failed
    said = [w for w in s.warnings if "not sent: their session ended at a failed turn" in w]
    assert said == [f"{cut} turn{'s' * (cut != 1)} not sent: their session ended at a failed turn (session 0); "
                    f"1 session × 6 turns planned, {c.completed + c.failed} turns sent"], s.warnings
