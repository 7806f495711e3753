"""``render_summary``: the table and the key/value rows under it."""

from __future__ import annotations

from rich.console import Console

from inferlab.report.console import render_summary
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.results.summary import summarize

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
