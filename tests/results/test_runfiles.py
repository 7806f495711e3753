"""The run directory: records read back as written; a cut-short last line is skipped
with a warning, any other bad line is an error that names it; the summary reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferlab._errors import UsageError
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.results.runfiles import RunWriter, numbered_records, read_records, read_summary
from inferlab.results.summary import summarize


def _records() -> list[RequestRecord]:
    return [
        RequestRecord(index=0, send_ns=0, ttfb_ns=5, content_ns=[5, 9], end_ns=10, output_tokens=2, usage_source="server"),
        RequestRecord(index=1, send_ns=1, error_kind=ErrorKind.CONNECT, error="refused"),
    ]


def _write(tmp_path: Path) -> Path:
    writer = RunWriter(tmp_path, {"command": "test"})
    for r in _records():
        writer.append(r)
    writer.write_summary(summarize(_records(), config={"command": "test"}))
    writer.close()
    return tmp_path


def test_records_and_summary_read_back_as_written(tmp_path: Path) -> None:
    d = _write(tmp_path)
    assert list(read_records(d / "requests.jsonl")) == _records()
    assert read_summary(d / "summary.json") == summarize(_records(), config={"command": "test"})
    assert json.loads((d / "config.json").read_text()) == {"command": "test"}


def test_a_cut_short_last_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path = _write(tmp_path) / "requests.jsonl"
    with path.open("a") as f:
        f.write('{"index": 2, "send_ns": 3, "cont')  # killed mid-write: no newline
    with pytest.warns(UserWarning, match=r"requests\.jsonl:3: the last line is cut short"):
        assert [n for n, _ in numbered_records(path)] == [1, 2]


#: a whole record line, as every writer has written one (the keys ``_REQUIRED``)
_OK = '{"index": %d, "send_ns": 0, "content_ns": [], "end_ns": null, "error_kind": "connect"}'


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (f"{_OK % 0}\nnot json\n{_OK % 2}\n", 2),  # in the middle
        (f'{_OK % 0}\n{{"index": 1, "send_ns"\n', 2),  # a whole last line (it has its newline)
        (f"{_OK % 0}\n[1, 2]\n", 2),  # JSON, but not a record
        ('{"send_ns": 1, "content_ns": [], "end_ns": 2, "error_kind": null}\n', 1),  # a record without its index
        # an index alone (or any object without the keys every record has) read as a failed request
        (f'{_OK % 0}\n{{"index": 1}}\n', 2),
        ('{"index": 0, "send_ns": 1, "content_ns": [2], "error_kind": null}\n', 1),
        # fields of the wrong type, which report and export did arithmetic on (an internal error)
        ('{"index": 0, "send_ns": "x", "end_ns": 5}\n', 1),
        (f'{_OK % 0}\n{{"index": 1, "content_ns": [1, "2"]}}\n', 2),
        ('{"index": 0, "error_kind": 3}\n', 1),
        ('{"index": 0, "error_kind": "no_such_kind"}\n', 1),
        ('{"index": "0"}\n', 1),
    ],
)
def test_any_other_bad_line_is_an_error_naming_it(tmp_path: Path, text: str, line: int) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text(text)
    with pytest.raises(UsageError, match=rf"requests\.jsonl:{line}: not a request record"):
        list(read_records(path))


def test_a_missing_file_or_a_non_summary_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="No such file"):
        list(read_records(tmp_path / "nope.jsonl"))
    (tmp_path / "s.json").write_text('{"schema": "other"}')
    with pytest.raises(UsageError, match="not an inferlab summary"):
        read_summary(tmp_path / "s.json")


@pytest.mark.parametrize("edit", ["list", "metric"])
def test_a_summary_that_is_not_one_is_a_usage_error_for_every_reader(tmp_path: Path, edit: str) -> None:
    """A summary.json of ``[]``, or with a metric that is a string, crashed advise and
    export (AttributeError: an internal error); every reader now says it is not an
    inferlab summary (exit 2)."""
    from click.testing import CliRunner

    from inferlab.cli.main import main

    run = tmp_path / "r"
    res = CliRunner().invoke(main, ["sim", "run", "-n", "3", "-o", str(run), "--no-history"])
    assert res.exit_code == 0, res.output
    path = run / "summary.json"
    if edit == "list":
        path.write_text("[]")
    else:
        d = json.loads(path.read_text())
        d["ttft_ms"] = "x"
        path.write_text(json.dumps(d))
    with pytest.raises(UsageError, match="not an inferlab summary"):
        read_summary(path)
    for args in (["advise", str(run)], ["export", "--format", "csv-summary", str(run)]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2 and "not an inferlab summary" in res.output, res.output
