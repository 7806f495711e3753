"""``render_summary``: the table and the key/value rows under it."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from rich.console import Console

from inferlab.report.console import render_summary
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.results.summary import summarize, with_percentiles

MS = 1_000_000


def rendered(records: list[RequestRecord]) -> list[str]:
    console = Console(record=True, width=160)
    render_summary(console, summarize(records), "t")
    return console.export_text().splitlines()


def row(lines: list[str], label: str) -> str:
    (line,) = [x for x in lines if x.startswith(label + " ")]
    return line


def test_values_are_left_aligned_next_to_their_labels() -> None:
    r = RequestRecord(0, send_ns=0, ttfb_ns=10 * MS, content_ns=[10 * MS, 20 * MS], end_ns=20 * MS,
                      input_tokens=5, output_tokens=2, usage_source="server")
    lines = rendered([r])
    starts = {row(lines, k).index(v) for k, v in (("duration", "0.02 s"), ("requests", "1 completed"), ("tokens", "5 in"))}
    assert len(starts) == 1 and starts.pop() <= len("request throughput") + 3


def test_duration_is_a_dash_when_nothing_completed() -> None:
    r = RequestRecord(0, send_ns=0, end_ns=5 * MS, status=400, error_kind=ErrorKind.HTTP_STATUS, error="HTTP 400: no")
    lines = rendered([r])
    assert row(lines, "duration").split() == ["duration", "—"]
    assert "0 completed, 1 failed (http_status 1)" in row(lines, "requests")


def test_the_table_shows_the_chosen_percentiles() -> None:
    records = [RequestRecord(i, send_ns=0, ttfb_ns=(10 + i) * MS, content_ns=[(10 + i) * MS, (20 + i) * MS],
                             end_ns=(20 + i) * MS, input_tokens=5, output_tokens=2, usage_source="server")
               for i in range(1000)]
    header = next(x for x in rendered(records) if "metric" in x).split()
    assert header == ["┃", "metric", "┃", "unit", "┃", "mean", "┃", "p50", "┃", "p90", "┃", "p99", "┃", "max", "┃"]
    s = with_percentiles(summarize(records), records, [50, 99.9])
    console = Console(record=True, width=160)
    render_summary(console, s, "t", (50, 99.9))
    lines = console.export_text().splitlines()
    assert [c for c in next(x for x in lines if "metric" in x).split() if c != "┃"] == ["metric", "unit", "mean", "p50", "p99.9", "max"]
    assert s.ttft_ms is not None
    assert row(lines, "│ TTFT").split("│")[5].strip() == f"{s.ttft_ms.percentile(99.9):,.1f}"


def test_the_sweep_table_never_cuts_a_number_on_a_narrow_console() -> None:
    """Headers wrap first; past that the table is printed wider than the console (a pipe
    is 80 columns): "17,974…" once stood for 17,974.3."""
    import io

    from rich.console import Console

    from inferlab.report.sweep import render_sweep

    head = {"output_tok_s": 17974.3, "req_s": 100.25, "ttft_p50_ms": 12345.6, "ttft_p99_ms": 118912.4,
            "tpot_p50_ms": 1022.32, "tpot_p99_ms": 2026.37, "e2e_p50_ms": 1234567.0}
    points = [{"dir": f"p{i}", "params": {"concurrency": c, "max_num_seqs": s, "max_num_batched_tokens": 16384},
               "repeat": 0, "status": "done", "headline": head} for i, (c, s) in enumerate([(64, 256), (1024, 512)])]
    for width in (80, 40):
        buf = io.StringIO()
        render_sweep(Console(file=buf, width=width), {"points": points, "groups": [], "complete": True}, "prediction: a title")
        text = buf.getvalue()
        assert "…" not in text
        for cell in ("17,974", "100.25", "118,912.4", "2,026.37", "1,234,567"):
            assert cell in text, (width, cell, text)


def test_the_summary_table_never_cuts_a_number_on_a_narrow_console() -> None:
    """With --metric-percentiles 50,90,99,99.9 an 80-column terminal showed E2E as
    "1,336…" and the unit as "tok…": the table is printed at its own width now."""
    import io

    records = [RequestRecord(i, send_ns=0, ttfb_ns=(1000 + i) * MS, content_ns=[(1000 + i) * MS, (2_000_000 + i) * MS],
                             end_ns=(2_000_000 + i) * MS, input_tokens=5, output_tokens=2, usage_source="server")
               for i in range(1000)]
    s = with_percentiles(summarize(records), records, [50, 90, 99, 99.9])
    buf = io.StringIO()
    render_summary(Console(file=buf, width=80), s, "t", (50, 90, 99, 99.9))
    text = buf.getvalue()
    assert "…" not in text and "tok/s" in text
    assert s.e2e_ms is not None and f"{s.e2e_ms.percentile(99.9):,.0f}" in text


def test_a_client_late_while_mostly_idle_is_said_to_wait_for_a_core() -> None:
    """"likely the bottleneck (1 process: CPU 2% of a core, ...)" read as a contradiction
    until the warning further down: the line says it waited for a core now."""
    from inferlab.report.console import _client_line
    from inferlab.results.clientload import ClientLoad, ClientProcess
    from inferlab.results.metrics import Distribution

    lag = Distribution(40.0, 5.0, 30.0, 40.0, 50.0, 55.0, 60.0, 70.0)
    idle = ClientLoad((ClientProcess("parent", 0.02, lag, ()),), True, (40.0, 60.0))
    busy = ClientLoad((ClientProcess("parent", 0.95, lag, ()),), True, (40.0, 60.0))
    fine = ClientLoad((ClientProcess("parent", 0.02, lag, ()),), False, (0.0, 0.0))
    assert "likely the bottleneck, waiting for a core" in _client_line(idle)
    assert "likely the bottleneck" in _client_line(busy) and "waiting for a core" not in _client_line(busy)
    assert _client_line(fine).startswith("kept up")


def test_a_client_too_brief_for_its_loop_timers_gets_no_verdict() -> None:
    """`bench -n 1 --workers 2` printed "kept up" with every loop lag null."""
    from inferlab.report.console import _client_line
    from inferlab.results.clientload import ProcessLoad, client_load

    load = client_load([ProcessLoad("parent", [], 0.001, 0.02), ProcessLoad("worker 1", [], 0.001, 0.02)])
    assert load is not None
    assert _client_line(load).startswith("no verdict") and "kept up" not in _client_line(load)


def test_a_conversations_template_overhead_is_not_given_as_every_prompts() -> None:
    """Multi-turn runs read "template/special tokens per prompt: 19", the probe's count for
    a prompt of one user message; a turn of a conversation holds several messages, each
    with the template's tokens (24, 45, 66, 87 tokens measured on four turns)."""
    import dataclasses

    r = RequestRecord(0, send_ns=0, ttfb_ns=10 * MS, content_ns=[10 * MS], end_ns=20 * MS, input_tokens=5, output_tokens=1,
                      usage_source="server")
    for sessions, says in ((None, "template/special tokens per prompt: 19"),
                           (2, "template/special tokens of a one-message prompt: 19 (a conversation's turn adds")):
        s = dataclasses.replace(summarize([r], config={"workload": {"sessions": sessions}}), prompt_overhead_tokens=19,
                                input_length_source="exact (server /tokenize)")
        console = Console(record=True, width=300)
        render_summary(console, s, "t")
        assert says in console.export_text(), console.export_text()


def test_the_requests_row_says_how_many_failed_after_the_server_stopped_answering() -> None:
    from inferlab.results.summary import SummaryExtras

    ok = RequestRecord(0, send_ns=0, ttfb_ns=5 * MS, content_ns=[5 * MS], end_ns=6 * MS, status=200,
                       input_tokens=5, output_tokens=1, usage_source="server")
    refused = [RequestRecord(i, send_ns=(10 + i) * MS, error_kind=ErrorKind.CONNECT, error="connection refused")
               for i in range(1, 31)]
    console = Console(record=True, width=200)
    render_summary(console, summarize([ok, *refused], interrupted=True, extras=SummaryExtras(server_gone=True)), "t")
    assert "1 completed, 30 failed (connect 30), 30 of them after the server stopped answering" in row(
        console.export_text().splitlines(), "requests")


def test_one_name_for_the_clients_send_lag_in_the_table_and_the_breakdown() -> None:
    from inferlab.results.breakdown import LatencyBreakdown, Part

    r = RequestRecord(0, intended_send_ns=0, send_ns=3 * MS, ttfb_ns=10 * MS, content_ns=[10 * MS, 20 * MS],
                      end_ns=20 * MS, input_tokens=5, output_tokens=2, usage_source="server")
    s = summarize([r])
    s = dataclasses.replace(s, latency_breakdown=LatencyBreakdown("x", 1, Part(3.0), Part(1.0), Part(2.0), Part(3.0), Part(4.0)))
    console = Console(record=True, width=200)
    render_summary(console, s, "t")
    lines = console.export_text().splitlines()
    assert any("Client send lag" in x for x in lines) and "client send lag 3.0" in row(lines, "latency breakdown")


def test_the_summary_says_what_load_and_workload_ran(tmp_path: Path) -> None:
    """A run's console summary names its load, what bounded it, its prompts and answers
    and its API, as the flags asked (read back from config.json, not the command line)."""
    from click.testing import CliRunner

    from inferlab.cli.main import main
    from inferlab.sim.engine.engine import EngineConfig
    from inferlab.sim.server.app import ServerConfig
    from inferlab.sim.server.launch import EmbeddedServer

    with EmbeddedServer(ServerConfig(EngineConfig())) as server:
        res = CliRunner().invoke(main, [
            "bench", "--url", server.url, "--rate", "40", "-n", "6", "--input-tokens", "uniform:20:40",
            "--output-tokens", "3", "--api", "completions", "--no-stream", "--no-history", "-o", str(tmp_path / "r"),
        ])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("load "))
    wrapped = [lines[at], *itertools.takewhile(lambda x: x.startswith(" "), lines[at + 1:])]  # (the value wraps)
    said = " ".join(" ".join(wrapped).split()[1:])
    assert said.startswith("open loop at 40 req/s (poisson), 6 requests;")
    assert "prompts uniform:20:40 tokens, answers 3 tokens" in said and said.endswith("completions API, not streamed")


def test_the_load_line_names_datasets_traces_prefixes_sessions_and_bounds() -> None:
    from inferlab.results.loaddiff import load_text

    base = {"load": {"schedule": {"kind": "ClosedLoop", "concurrency": 2}, "num_requests": None, "duration_s": 30.0,
                     "warmup": 2}, "api": "chat", "stream": True}
    text = load_text({**base, "workload": {"dataset": "/data/sharegpt.json", "output_tokens": None, "exact_output": False}})
    assert text is not None
    assert text.startswith("closed loop of 2 users, 30 s (+2 warm-up); prompts from sharegpt.json")
    assert "answers of the dataset's lengths at most where its rows state them" in text
    text = load_text({**base, "workload": {"trace": "t/mooncake.jsonl", "exact_output": True}})
    assert text is not None and "the requests of trace mooncake.jsonl, answers of the trace's lengths (exact)" in text
    text = load_text({**base, "workload": {"prefix_tokens": 1000, "prefix_groups": 4, "suffix_tokens": 50,
                                           "prefix_popularity": "zipf", "sessions": 8, "turns": 3}})
    assert text is not None
    assert "prompts of a shared 1,000-token prefix (4 groups, zipf) + 50 tokens, 8 sessions of 3 turns" in text
    assert "answers as long as the model makes them" in text
    assert load_text({"workload": {}}) is None  # (records no load: nothing said)


def test_the_load_line_says_a_trace_or_dataset_as_config_json_records_them() -> None:
    """config.json records a trace and a dataset as tables (file, speed-up, window, length
    limits): the line names the file and says what changes the load, not the table's repr."""
    from inferlab.results.loaddiff import load_text

    base = {"load": {"schedule": {"kind": "Replay"}, "num_requests": None, "duration_s": None}, "api": "chat"}
    trace = {"path": "/t/azure.csv", "format": None, "speedup": 10.0, "start_s": 0.0, "end_s": 600.0,
             "block_tokens": 512, "in_order": True}
    text = load_text({**base, "workload": {"trace": trace, "exact_output": True}})
    assert text is not None and "{" not in text
    assert "the requests of trace azure.csv (10x faster, 0-600 s of it), answers of the trace's lengths" in text
    plain = load_text({**base, "workload": {"trace": {**trace, "speedup": 1.0, "start_s": None, "end_s": None}}})
    assert plain is not None and "the requests of trace azure.csv, answers" in plain
    dataset = {"path": "d/sharegpt.json", "format": None, "sample": "without-replacement",
               "min_input_tokens": None, "max_input_tokens": 2000}
    text = load_text({**base, "workload": {"dataset": dataset, "exact_output": True}})
    assert text is not None and "{" not in text
    assert "prompts from sharegpt.json (prompts of at most 2,000 tokens), answers of the dataset's lengths" in text


def test_the_load_line_says_a_sessions_think_time_and_context_window() -> None:
    from inferlab.results.loaddiff import load_text

    config = {"load": {"schedule": {"kind": "ClosedLoop", "concurrency": 16}, "num_requests": 96}, "api": "chat",
              "workload": {"input_tokens": "200", "sessions": 16, "turns": 6, "think_time_s": 2.0,
                           "context_window_tokens": 4000}}
    text = load_text(config)
    assert text is not None
    assert "prompts 200 tokens, 16 sessions of 6 turns (2 s think time), context trimmed to 4,000 tokens" in text
    # (config.json records a length as its spec's text: a count is written as the other rows write counts)
    text = load_text({**config, "workload": {"input_tokens": "1000", "output_tokens": "256", "exact_output": True}})
    assert text is not None and "prompts 1,000 tokens, answers 256 tokens (exact)" in text
    text = load_text({**config, "workload": {"input_tokens": "lognormal:800:0.4"}})
    assert text is not None and "prompts lognormal:800:0.4 tokens" in text


def test_the_tokens_row_quotes_the_servers_cache_counters_only_where_the_answers_did_not_say() -> None:
    """The answers' cached tokens first; else the server's /metrics prefix-cache counters,
    said as the server's; else unknown (a server with no such counters: SGLang's rate is a
    gauge, and a gateway's /metrics are its own)."""
    from inferlab.results.summary import SummaryExtras
    from inferlab.results.telemetry import ServerMetrics

    def tokens(cached: int | None, counters: dict[str, float | None]) -> str:
        r = RequestRecord(0, send_ns=0, ttfb_ns=5 * MS, content_ns=[5 * MS], end_ns=6 * MS, status=200,
                          input_tokens=50, output_tokens=1, cached_tokens=cached, usage_source="server")
        m = ServerMetrics(True, server="vllm", counters=counters)
        console = Console(record=True, width=300)
        render_summary(console, summarize([r], extras=SummaryExtras(server_metrics=m)), "t")
        return row(console.export_text().splitlines(), "tokens")

    counted = {"prefix_cache_hits_tokens": 32.0, "prefix_cache_queries_tokens": 50.0}
    assert "/metrics counted 32 of 50 prompt tokens cached over the run" in tokens(None, counted)
    assert "warm-ups" not in tokens(None, counted)  # (none ran)
    said = tokens(16, counted)
    assert "16 cached in" in said and "/metrics" not in said
    for unsaid in ({}, {**counted, "prefix_cache_hits_tokens": None}):  # (none; one went back: a restart)
        assert "cached in unknown" in tokens(None, unsaid)
