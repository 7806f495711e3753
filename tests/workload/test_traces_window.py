"""A trace's time window read as a stream (traces/window.py): the same rows as sorting
the whole file, in time order or not, while holding only the window's rows."""

from __future__ import annotations

import gc
import math
import random
import weakref
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

import pytest

from inferlab._errors import UsageError
from inferlab.workload import traces
from inferlab.workload.traces import TraceConfig, TraceRow
from inferlab.workload.traces.window import window


def burstgpt(path: Path, rows: list[tuple[float, int]]) -> Path:
    """A BurstGPT CSV, a row a ``(time s, response tokens)``: 0 tokens is a failed
    request (dropped, its time still counts)."""
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" + "".join(
        f"{t!r},ChatGPT,{10 + i},{out},{10 + i + out},Conversation log\n" for i, (t, out) in enumerate(rows)))
    return path


def full_read(path: Path, lo: float, hi: float) -> list[tuple[float, int]]:
    """The window as it was taken before it streamed: every row read and sorted, then
    sliced from the earliest (``(time from the first kept row, input tokens)``)."""
    every = sorted(traces._every_row(str(path), None, 0), key=lambda r: r.arrival_s)
    t0 = every[0].arrival_s
    kept = [r for r in every if not r.dropped and lo <= r.arrival_s - t0 < hi]
    return [(r.arrival_s - kept[0].arrival_s, r.input_tokens) for r in kept]


def streamed(path: Path, lo: float | None, hi: float | None) -> list[tuple[float, int]]:
    return [(r.arrival_s, r.input_tokens) for r in TraceConfig(str(path), start_s=lo, end_s=hi).rows()]


TIMES = [round(100 + 0.37 * i + (0.1 if i % 7 == 3 else 0), 3) for i in range(60)]  # (ties: none; 0.37 s apart)
ORDERS = {
    "in order": list(range(60)),
    "reversed": list(range(60))[::-1],
    "shuffled": random.Random(1).sample(range(60), 60),
    "earliest last": [*range(1, 60), 0],
    "earliest in the middle": [*range(30, 60), 0, *range(1, 30)],
}
WINDOWS = [(None, None), (None, 5.0), (3.0, None), (3.0, 7.5), (0.0, 0.4), (20.0, 30.0)]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("failed_first", [False, True], ids=["", "failed first"])
@pytest.mark.parametrize(("lo", "hi"), WINDOWS)
def test_a_streamed_window_is_the_full_reads_in_any_order(
    tmp_path: Path, order: str, failed_first: bool, lo: float | None, hi: float | None,
) -> None:
    """In time order, reversed, shuffled, with the earliest row last or midway, and that
    row a failed request (the window counts from it all the same): the rows kept are
    those of sorting the whole file."""
    rows = [(TIMES[i], 0 if failed_first and i == 0 else 5) for i in ORDERS[order]]
    path = burstgpt(tmp_path / "t.csv", rows)
    with pytest.warns(UserWarning, match="1 row skipped") if failed_first else nullcontext():
        got = streamed(path, lo, hi)
    with pytest.warns(UserWarning) if failed_first else nullcontext():
        want = full_read(path, -math.inf if lo is None else lo, math.inf if hi is None else hi)
    assert got == want and got


def test_an_empty_window_says_the_whole_span_of_a_file_out_of_order(tmp_path: Path) -> None:
    """The span in the error is the full file's, its earliest row last."""
    path = burstgpt(tmp_path / "t.csv", [(12.0, 5), (15.5, 5), (10.0, 5)])
    with pytest.raises(UsageError, match=r"\(from 6 s after the trace's first request\): the trace spans 0–5.5 s"):
        TraceConfig(str(path), start_s=6).rows()


def rows_at(*times: float) -> list[TraceRow]:
    return [TraceRow(t, 10, 5) for t in times]


class Reads:
    """``read`` for ``window``: yields ``rows``, counting reads and the rows yielded."""

    def __init__(self, rows: list[TraceRow]) -> None:
        self.rows, self.reads, self.yielded = rows, 0, 0

    def __call__(self) -> Iterator[TraceRow]:
        self.reads += 1
        for r in self.rows:
            self.yielded += 1
            yield r


@pytest.mark.parametrize(("times", "lo", "hi", "reads"), [
    ((0, 1, 2, 3, 4), 1.0, 3.0, 1),  # in time order: once
    ((3, 4, 0, 1, 2), -math.inf, 2.0, 1),  # no start: nothing passed over to bring back
    ((1, 0, 3), 2.0, 10.0, 1),  # the row at 1 s was passed over, and is still before the window from 0
    ((1, 2, 3, 0), 1.5, 2.5, 2),  # the row at 2 s was passed over (1 s after 1): now 2 s after 0
    ((3, 4, 0, 1, 2), 2.5, 10.0, 2),  # those at 3 and 4 s: the window moved onto them
])
def test_the_rows_are_read_again_only_when_a_row_passed_over_may_be_in_the_window(
    times: tuple[float, ...], lo: float, hi: float, reads: int,
) -> None:
    read = Reads(rows_at(*times))
    got = window(read, lo, hi)
    assert read.reads == reads
    t0 = min(times)
    assert [r.arrival_s for r in got.rows] == sorted(t for t in times if lo <= t - t0 < hi)
    assert (got.first_s, got.last_s) == (t0, max(times))


def test_reading_holds_the_windows_rows_not_the_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """5,000 rows, a window of 10: when the last row is read, at most the window's rows
    (and the one being handled) are still alive; the whole file was (sorted, then
    sliced)."""
    n, alive_at_end = 5000, []

    def rows(path: str, f: object, fmt: str | None, seed: int, in_order: bool = False) -> Iterator[TraceRow]:
        refs = []
        for i in range(n):
            r = TraceRow(i * 0.1, 10, 5)
            refs.append(weakref.ref(r))
            yield r
            del r
        gc.collect()
        alive_at_end.append(sum(ref() is not None for ref in refs))

    monkeypatch.setattr(traces, "_read_rows", rows)
    path = Path(__file__)  # (opened, never parsed: the rows come from rows())
    kept = TraceConfig(str(path), start_s=100, end_s=101).rows()
    assert len(kept) == 10
    assert alive_at_end and alive_at_end[0] <= 12, alive_at_end


@pytest.mark.parametrize("order", ["in order", "reversed", "pairs swapped"])
@pytest.mark.parametrize(("lo", "hi"), WINDOWS)
def test_a_trace_said_in_order_gives_the_same_window(tmp_path: Path, order: str, lo: float | None, hi: float | None) -> None:
    """--trace-in-order stops reading at the window's end; where a row before that goes
    back in time it reads on, and the window is the full read's all the same. (A file
    that goes back in time only after its first row past the window is what the flag
    vouches against: shuffled, it would be read wrong.)"""
    swapped = [i ^ 1 for i in range(60)]
    path = burstgpt(tmp_path / "t.csv", [(TIMES[i], 5) for i in ORDERS.get(order, swapped)])
    got = [(r.arrival_s, r.input_tokens) for r in TraceConfig(str(path), start_s=lo, end_s=hi, in_order=True).rows()]
    assert got == full_read(path, -math.inf if lo is None else lo, math.inf if hi is None else hi)


def test_a_trace_in_order_is_read_up_to_its_first_row_past_the_window() -> None:
    """Rows 0..99 s, the window 10–20 s: 21 rows read (the last one at 20 s), once."""
    read = Reads(rows_at(*range(100)))
    got = window(read, 10.0, 20.0, in_order=True)
    assert (read.reads, read.yielded) == (1, 21)
    assert [r.arrival_s for r in got.rows] == list(range(10, 20)) and got.stopped_s == 20
    # rows out of order before the end: read to the end (a row after it may still be in it)
    read = Reads(rows_at(1, 0, *range(2, 100)))
    assert window(read, 10.0, 20.0, in_order=True).stopped_s is None and read.yielded == 100
    read = Reads(rows_at(*range(100)))
    assert window(read, 10.0, 20.0).stopped_s is None and read.yielded == 100  # (not said in order)


def test_rows_past_the_window_of_a_trace_in_order_are_not_read_nor_checked(tmp_path: Path) -> None:
    """The documented trade: with --trace-in-order a bad row after the window's end is not
    reached; without it, it is refused, naming its line. Rows skipped before the stop are
    still counted in the warning, and an empty window says how far the file was read."""
    path = burstgpt(tmp_path / "t.csv", [(0.0, 5), (1.0, 0), (2.0, 5), (3.0, 5)])
    path.write_text(path.read_text() + "yesterday,ChatGPT,1,1,2,Conversation log\n")
    with pytest.warns(UserWarning, match="1 row skipped: 0 response tokens"):
        rows = TraceConfig(str(path), end_s=2.5, in_order=True).rows()
    assert [r.input_tokens for r in rows] == [10, 12]
    with pytest.raises(UsageError, match=r"t\.csv:6: bad burstgpt row"):  # (the error alone, as before)
        TraceConfig(str(path), end_s=2.5).rows()
    with pytest.raises(UsageError) as e, pytest.warns(UserWarning):
        TraceConfig(str(path), start_s=0.5, end_s=0.9, in_order=True).rows()
    assert str(e.value) == (f"{path}: no requests in the time window (0.5–0.9 s after the trace's first request): the "
                            "trace was read up to its first row past it, at 1 s from its first request (--trace-in-order)")


def test_a_jsonl_trace_is_not_read_whole_to_tell_it_from_a_vllm_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Format detection read the whole file as one JSON document (a vLLM result?) before
    the rows: a Mooncake trace's size in memory. Its first line is a row: the file is not
    parsed as one document. Here its tail (200 KB on) is not text, and --trace-in-order
    never gets there."""
    path = tmp_path / "mc.jsonl"
    lines = "".join(f'{{"timestamp": {i * 100}, "input_length": 10, "output_length": 5, "hash_ids": [1]}}\n'
                    for i in range(3000))
    path.write_bytes(lines.encode() + b"\xff\xfe not text")

    def whole(path: str, f: object, required: bool = False) -> None:
        raise AssertionError("read whole as a vLLM result")

    monkeypatch.setattr(traces, "vllm_result", whole)
    for fmt in (None, "mooncake"):
        rows = TraceConfig(str(path), fmt, end_s=1.0, in_order=True).rows()  # type: ignore[arg-type]
        assert [r.arrival_s for r in rows] == pytest.approx([i / 10 for i in range(10)])
    with pytest.raises(UsageError, match=r"mc\.jsonl: not a text file"):
        TraceConfig(str(path), end_s=1.0).rows()  # (read to its end: the tail is found)


def test_in_order_is_refused_for_a_trace_read_whole(tmp_path: Path) -> None:
    """A vLLM result (and a run's requests.jsonl) is read whole: --trace-in-order saves
    nothing there, and where requests 9 and 10 were sent out of order (a capped run)
    it dropped one of the window's rows without a word."""
    import json

    path = tmp_path / "vllm.json"
    starts = [i * 0.5 for i in range(12)]
    starts[9], starts[10] = starts[10], starts[9]
    path.write_text(json.dumps({"input_lens": [100] * 12, "output_lens": [10] * 12, "start_times": starts,
                                "completed": 12, "duration": 10.0}))
    assert len(TraceConfig(str(path), end_s=4.75).rows()) == 10
    with pytest.raises(UsageError, match="read whole anyway"):
        TraceConfig(str(path), end_s=4.75, in_order=True).rows()
