"""Merging records measured on several machines (``load.distributed``): one offset per
worker, every difference within a record unchanged, numbered by send time; the raw file
read back, a cut-short last line skipped, a worker without its last batch named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferlab._errors import UsageError
from inferlab.load.distributed import (
    CONFIG_FILE,
    RAW_FILE,
    Batch,
    append_batch,
    finish_run,
    merge,
    merge_warnings,
    read_batches,
)
from inferlab.results.records import ErrorKind, RequestRecord


def rec(index: int, send: int, ttft: int = 50, gaps: tuple[int, ...] = (10, 10)) -> dict[str, object]:
    r = RequestRecord(index=index, intended_send_ns=send - 1, send_ns=send, ttfb_ns=send + ttft)
    t = send + ttft
    r.content_ns = [t]
    for g in gaps:
        t += g
        r.content_ns.append(t)
    r.end_ns = t
    r.status, r.output_tokens, r.usage_source = 200, 1 + len(gaps), "server"
    return r.to_json()


def test_each_worker_moves_by_its_own_offset_and_nothing_within_a_record_changes() -> None:
    a = Batch("a", t0_epoch_ns=1_000, records=[rec(0, 100), rec(1, 400)], final=True, model="m")
    b = Batch("b", t0_epoch_ns=1_250, records=[rec(0, 100, ttft=70, gaps=(5,))], final=True)
    m = merge([a, b])
    assert m.workers == {"a": 2, "b": 1} and m.unfinished == [] and m.model == "m"
    # b's zero is 250 ns after a's: its record was sent at 350 on the run's clock
    assert [(r.index, r.send_ns) for r in m.records] == [(0, 100), (1, 350), (2, 400)]
    moved = m.records[1]
    assert (moved.intended_send_ns, moved.ttfb_ns, moved.content_ns, moved.end_ns) == (349, 420, [420, 425], 425)
    assert (moved.output_tokens, moved.status) == (2, 200)


def test_ties_keep_worker_then_arrival_order_and_unsent_records_come_first() -> None:
    unsent = RequestRecord(index=5, error_kind=ErrorKind.CONNECT, error="refused").to_json()
    m = merge([Batch("b", 0, [rec(0, 10)]), Batch("a", 0, [rec(0, 10), unsent])])
    assert [(r.send_ns, r.error_kind) for r in m.records] == [(None, ErrorKind.CONNECT), (10, None), (10, None)]
    assert m.unfinished == ["a", "b"]
    (warning,) = merge_warnings(m)
    assert "a, b" in warning and "missing" in warning


def test_the_raw_file_round_trips_and_a_cut_last_line_is_skipped(tmp_path: Path) -> None:
    raw = tmp_path / RAW_FILE
    batches = [Batch("a", 7, [rec(0, 1)]), Batch("b", 9, [], final=True, model="m")]
    for b in batches:
        append_batch(raw, b)
    assert read_batches(raw) == batches
    raw.write_text(raw.read_text() + '{"worker": "a", "t0_ep')
    assert read_batches(raw) == batches
    raw.write_text('{"no": 1}\n' + raw.read_text())
    with pytest.raises(UsageError, match=r"locust-records.jsonl:1: not a batch of records"):
        read_batches(raw)


def test_finish_run_writes_the_usual_run_directory(tmp_path: Path) -> None:
    config = {"load": {"executor": "locust", "schedule": {"kind": "ClosedLoop", "concurrency": 2}},
              "workload": {"input_tokens": "32", "output_tokens": "3"}, "model": None, "url": "http://x"}
    (tmp_path / CONFIG_FILE).write_text(json.dumps(config))
    append_batch(tmp_path / RAW_FILE, Batch("a", 0, [rec(0, 100), rec(1, 200)], final=True, model="m1"))
    append_batch(tmp_path / RAW_FILE, Batch("b", 50, [rec(0, 100)], final=False))
    summary, _ = finish_run(tmp_path)
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert [json.loads(line)["send_ns"] for line in lines] == [100, 150, 200]
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["resolved"] == {"workers": {"a": 2, "b": 1}, "model": "m1"}
    assert summary.counts.completed == 3
    assert any("worker(s) b" in w for w in summary.warnings)
    assert json.loads((tmp_path / "summary.json").read_text())["counts"]["total"] == 3


def test_finish_run_without_a_locust_run_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="holds no Locust run"):
        finish_run(tmp_path)


@pytest.mark.parametrize("records, why", [
    ("[1,2]", "record 0: a JSON int, not an object"),
    ('[{"index":0,"send_ns":"x"}]', "record 0: send_ns is 'x'"),
    ('"abc"', "records is str, not a list"),
    ('[{"index":0,"content_ns":[1,"y"]}]', "content_ns holds what is not a time"),
    ('[{"index":0,"error_kind":"vibes"}]', "record 0: 'vibes' is not a valid ErrorKind"),
])
def test_locust_merge_refuses_a_malformed_record_in_one_line(tmp_path: Path, records: str, why: str) -> None:
    # (each was an "internal error": the merge did arithmetic on what it read; a bad last
    # line was also skipped as if cut short, though it was whole JSON)
    from click.testing import CliRunner

    from inferlab.cli.main import main

    (tmp_path / CONFIG_FILE).write_text(json.dumps({"workload": {}, "model": "m", "url": "http://x"}))
    (tmp_path / RAW_FILE).write_text('{"worker":"a","t0_epoch_ns":0,"final":true,"records":' + records + "}\n")
    r = CliRunner().invoke(main, ["locust-merge", str(tmp_path)])
    assert r.exit_code == 2 and f"{RAW_FILE}:1: not a batch of records" in r.output and why in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "summary.json").exists()


def test_locust_merge_refuses_a_raw_file_of_no_records(tmp_path: Path) -> None:
    # (it wrote a run of 0 requests and exited 0)
    from click.testing import CliRunner

    from inferlab.cli.main import main

    (tmp_path / CONFIG_FILE).write_text(json.dumps({"workload": {}, "model": "m", "url": "http://x"}))
    for raw in ("", '{"worker":"a","t0_epoch_ns":0,"final":true,"records":[]}\n'):
        (tmp_path / RAW_FILE).write_text(raw)
        r = CliRunner().invoke(main, ["locust-merge", str(tmp_path)])
        assert r.exit_code == 2 and "holds no records: nothing to merge" in r.output, r.output
        assert not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize(("b_stopped", "interrupted"), [(False, False), (True, True)])
def test_a_worker_stopped_early_is_named_and_the_run_is_interrupted_when_no_worker_ran_on(
    tmp_path: Path, b_stopped: bool, interrupted: bool,
) -> None:
    """A worker's last batch says it was stopped (Ctrl-C, SIGTERM) before the master
    ended the test: the summary names it; the run ended early only where no worker ran
    on (Locust's master stops the test when its last worker quits), as locust-merge too
    reads it back from the raw file."""
    config = {"load": {"executor": "locust", "locust": {}}, "workload": {"input_tokens": "32"}, "url": "http://x"}
    (tmp_path / CONFIG_FILE).write_text(json.dumps(config))
    append_batch(tmp_path / RAW_FILE, Batch("a", 0, [rec(0, 100)], final=True, stopped_early=True))
    append_batch(tmp_path / RAW_FILE, Batch("b", 0, [rec(0, 200)], final=True, stopped_early=b_stopped))
    summary, merged = finish_run(tmp_path)
    assert merged.stopped_early == (["a", "b"] if b_stopped else ["a"])
    assert summary.interrupted is interrupted
    said = [w for w in summary.warnings if "stopped before the master ended" in w]
    assert len(said) == 1 and ("worker(s) a, b" if b_stopped else "worker(s) a stopped") in said[0]
