"""The run history: schema and migrations, what a run records, filters, and several
processes writing at once."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from inferlab._errors import UsageError
from inferlab.cli.main import main
from inferlab.results.history import (
    MIGRATIONS,
    SCHEMA_VERSION,
    History,
    headline,
    history_path,
    parse_since,
    record_run,
    record_sweep,
)


def sim(tmp: Path, name: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    out = ["-o", str(tmp / name)] if name else []
    return subprocess.run(
        [sys.executable, "-m", "inferlab", "sim", "run", "-n", "8", "-c", "4", "--input-tokens", "100", "--output-tokens", "8", *out, *args],
        capture_output=True, text=True, timeout=120,
    )


def rows(path: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT id, path, model, command FROM runs ORDER BY id").fetchall()


def test_a_new_file_gets_the_current_schema_and_reopening_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    with History(path) as h:
        assert h.version() == SCHEMA_VERSION == len(MIGRATIONS)
        h.add({"kind": "run", "model": "m"})
    with History(path) as h:
        assert [e.model for e in h.find()] == ["m"]
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_newer_schema_or_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    newer = tmp_path / "newer.sqlite"
    with sqlite3.connect(newer) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(UsageError, match="newer than this inferlab"):
        History(newer)
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database " * 100)
    with pytest.raises(UsageError, match=r"junk\.sqlite"):
        History(junk)


def test_where_the_history_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERLAB_HISTORY", str(tmp_path / "env.sqlite"))
    assert history_path() == tmp_path / "env.sqlite"
    assert history_path(str(tmp_path / "flag.sqlite")) == tmp_path / "flag.sqlite"  # the flag wins
    assert history_path(disabled=True) is None
    monkeypatch.setenv("INFERLAB_HISTORY", "off")
    assert history_path() is None
    monkeypatch.delenv("INFERLAB_HISTORY")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    if sys.platform.startswith("linux"):
        assert history_path() == tmp_path / "data" / "inferlab" / "history.sqlite"


def test_a_sim_run_is_recorded_with_its_headline_and_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hist = tmp_path / "h.sqlite"
    monkeypatch.setenv("INFERLAB_HISTORY", str(hist))
    p = sim(tmp_path, "a", "--max-num-batched-tokens", "512", "--max-num-seqs", "256")
    assert p.returncode == 0, p.stderr
    assert "history" not in p.stderr  # recorded quietly
    with History(hist) as h:
        (entry,) = h.find()
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert entry.path == str((tmp_path / "a").resolve())
    assert entry.headline["ttft_p99_ms"] == summary["ttft_ms"]["p99"]
    assert entry.headline["output_tok_s"] == summary["output_token_throughput_tps"]
    assert entry.engine is not None and entry.engine["max_num_batched_tokens"] == 512
    assert entry.workload is not None and entry.workload["load"]["schedule"]["concurrency"] == 4
    assert entry.simulated and entry.command == "sim run" and entry.completed == 8


def test_no_history_and_off_record_nothing_and_both_flags_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hist = tmp_path / "h.sqlite"
    monkeypatch.setenv("INFERLAB_HISTORY", str(hist))
    assert sim(tmp_path, None, "--no-history").returncode == 0
    assert not hist.exists()
    other = tmp_path / "other.sqlite"
    assert sim(tmp_path, None, "--history", str(other)).returncode == 0
    assert not hist.exists() and len(rows(other)) == 1
    p = sim(tmp_path, None, "--history", str(other), "--no-history")
    assert p.returncode == 2 and "--no-history" in p.stderr


def test_two_runs_started_at_once_both_land(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hist = tmp_path / "h.sqlite"
    monkeypatch.setenv("INFERLAB_HISTORY", str(hist))
    cmd = [sys.executable, "-m", "inferlab", "sim", "run", "-n", "8", "--input-tokens", "100", "--output-tokens", "8"]
    procs = [subprocess.Popen([*cmd, "-o", str(tmp_path / name)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for name in ("x", "y")]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "not recorded" not in err, err
    assert sorted(r[1] for r in rows(hist)) == sorted(str((tmp_path / n).resolve()) for n in ("x", "y"))  # type: ignore[type-var]


def test_many_writers_from_several_processes_lose_nothing(tmp_path: Path) -> None:
    """Four processes open a fresh file at once (all racing to create the schema) and
    insert 25 rows each."""
    hist = tmp_path / "h.sqlite"
    code = (
        "import sys\nfrom inferlab.results.history import History\n"
        "for i in range(25):\n"
        "    with History(sys.argv[1]) as h: h.add({'kind': 'run', 'model': sys.argv[2]})\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(hist), f"w{k}"], stderr=subprocess.PIPE, text=True) for k in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    got = rows(hist)
    assert len(got) == 100
    assert sorted({str(r[2]) for r in got}) == ["w0", "w1", "w2", "w3"]


def test_filters(tmp_path: Path) -> None:
    with History(tmp_path / "h.sqlite") as h:
        h.add({"kind": "run", "model": "meta-llama/Llama-3.1-8B", "target": "http://a:8000/v1", "time": "2026-01-01T00:00:00+00:00"})
        h.add({"kind": "run", "model": "Qwen/Qwen2.5-7B", "target": "http://b:9000/v1", "time": "2026-02-01T00:00:00+00:00"})
        h.add({"kind": "sweep", "model": "Qwen/Qwen2.5-7B", "target": "http://a:8000/v1", "time": "2026-03-01T00:00:00+00:00"})
        assert [e.id for e in h.find(model="qwen")] == [3, 2]
        assert [e.id for e in h.find(url="a:8000")] == [3, 1]
        assert [e.id for e in h.find(since=parse_since("2026-01-15"))] == [3, 2]
        assert [e.id for e in h.find(kind="sweep")] == [3]
        assert [e.id for e in h.find(limit=1)] == [3]
    assert parse_since("2026-01-15T12:00+02:00") == "2026-01-15T10:00:00+00:00"
    with pytest.raises(UsageError):
        parse_since("last week")


def test_filters_match_their_text_literally(tmp_path: Path) -> None:
    # (LIKE's wildcards were not escaped: --model _ and --model % listed every run)
    with History(tmp_path / "h.sqlite") as h:
        h.add({"kind": "run", "model": "Qwen/Qwen2.5-7B", "target": "http://a:8000/v1"})
        h.add({"kind": "run", "model": "my_model", "target": "http://b:8000/v1?x=100%"})
        h.add({"kind": "run", "model": "C:\\models\\m", "target": "http://c:8000/v1"})
        assert [e.id for e in h.find(model="_")] == [2]
        assert [e.id for e in h.find(model="%")] == []
        assert [e.id for e in h.find(url="%")] == [2]
        assert [e.id for e in h.find(model="\\")] == [3]
        assert [e.id for e in h.find(model="my_")] == [2] and [e.id for e in h.find(model="qwen")] == [1]
        # case-insensitive in any script (SQLite's LOWER folds ASCII only)
        h.add({"kind": "run", "model": "org/ÜBER-Straße-7B", "target": "http://d:8000/v1"})
        assert [e.id for e in h.find(model="über-strasse")] == [4] and [e.id for e in h.find(model="ÜBER")] == [4]


def test_record_sweep_keeps_the_best_point(tmp_path: Path) -> None:
    sweep = tmp_path / "s"
    for c in (1, 4):
        assert sim(sweep, f"c{c}", "-c", str(c), "--no-history").returncode == 0
    points = []
    for c in (1, 4):
        summary = json.loads((sweep / f"c{c}" / "summary.json").read_text())
        points.append({"dir": f"c{c}", "params": {"concurrency": c}, "repeat": 0, "status": "done", "headline": headline(summary)})
    points.append({"dir": "c8", "params": {"concurrency": 8}, "repeat": 0, "status": "skipped", "headline": None})
    (sweep / "sweep.json").write_text(json.dumps({"format": "inferlab.sweep/1", "command": "sweep -c 1,4,8", "axes": {"concurrency": [1, 4, 8]},
                                                   "points": points, "groups": [], "goodput_search": None, "complete": True}))
    hist = tmp_path / "h.sqlite"
    run_id = record_sweep(sweep, hist)
    with History(hist) as h:
        entry = h.get(run_id or -1)
    assert entry is not None and entry.kind == "sweep"
    best = max(points[:2], key=lambda p: p["headline"]["output_tok_s"])  # type: ignore[index]
    assert entry.headline == best["headline"]
    assert entry.model == "Qwen/Qwen2.5-7B-Instruct" and entry.simulated
    # its counts are the best point's (they were left null: "?/?" in inferlab runs)
    counts = json.loads((sweep / best["dir"] / "summary.json").read_text())["counts"]  # type: ignore[operator]
    assert (entry.completed, entry.failed) == (counts["completed"], counts["failed"]) and entry.completed > 0
    assert entry.workload == {"axes": {"concurrency": [1, 4, 8]}, "points": 3, "done": 2, "headline": "the highest output throughput"}
    assert record_sweep(sweep, hist, disabled=True) is None
    with History(hist) as h:
        assert len(h.find()) == 1


def test_runs_lists_and_filters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hist = tmp_path / "h.sqlite"
    monkeypatch.setenv("INFERLAB_HISTORY", str(hist))
    r = CliRunner().invoke(main, ["runs"])
    assert r.exit_code == 2 and "no run history" in r.output
    with History(hist) as h:
        h.add({"kind": "run", "model": "org/alpha-7b", "target": "http://a/v1", "output_tok_s": 1234.5, "path": "/x/a"})
        h.add({"kind": "run", "model": "org/beta-8b", "target": "http://b/v1", "output_tok_s": 99.0, "path": None})
    r = CliRunner().invoke(main, ["runs"])
    assert r.exit_code == 0, r.output
    assert "alpha-7b" in r.output and "beta-8b" in r.output and "1,234" in r.output and "(not written)" in r.output
    r = CliRunner().invoke(main, ["runs", "--model", "ALPHA", "--json"])
    (line,) = r.output.splitlines()
    assert json.loads(line)["model"] == "org/alpha-7b"
    r = CliRunner().invoke(main, ["runs", "--url", "http://b", "--json"])
    assert [json.loads(x)["id"] for x in r.output.splitlines()] == [2]


def test_runs_say_when_a_response_cache_answered_requests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hist = tmp_path / "h.sqlite"
    with sqlite3.connect(hist) as db:  # a history from before the count: migrated, its rows unknown
        db.executescript(MIGRATIONS[0])
        db.execute("PRAGMA user_version = 1")
        db.execute("INSERT INTO runs (time, kind, model, completed, failed) VALUES ('2026-01-01T00:00:00+00:00', 'run', 'org/old', 20, 0)")
    monkeypatch.setenv("INFERLAB_HISTORY", str(hist))
    assert sim(tmp_path, "a").returncode == 0
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    summary["counts"]["response_cache_hits"] = 8  # (as a bench through a caching gateway records it)
    record_run(summary, tmp_path / "a", hist)
    r = CliRunner().invoke(main, ["runs", "--json"])
    assert [json.loads(x)["response_cache_hits"] for x in r.output.splitlines()] == [8, 0, None]
    r = CliRunner().invoke(main, ["runs"])
    assert r.exit_code == 0, r.output
    assert "8/0, 8 cached" in r.output and "answered by a response cache" in r.output
    assert "8/0," not in r.output.replace("8/0, 8 cached", "") and "20/0," not in r.output  # (the others: no hits, or unknown)


def test_a_history_that_cannot_be_written_is_a_warning_not_a_failed_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database " * 100)
    monkeypatch.setenv("INFERLAB_HISTORY", str(junk))
    p = sim(tmp_path, "a")
    assert p.returncode == 0, p.stderr
    assert "warning: not recorded in the history" in p.stderr and (tmp_path / "a" / "summary.json").exists()


def test_a_tune_is_recorded_as_a_sweep_and_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hist = tmp_path / "h.sqlite"
    monkeypatch.setenv("INFERLAB_HISTORY", str(hist))
    out = tmp_path / "tune"
    p = subprocess.run([sys.executable, "-m", "inferlab", "tune", "--param", "max-num-seqs=8,64", "-n", "16", "-c", "8",
                        "--input-tokens", "200", "--output-tokens", "8", "--slo-ttft-ms", "500", "-o", str(out)], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    with History(hist) as h:
        (entry,) = h.find()
    assert entry.kind == "sweep" and entry.path == str(out.resolve())
    assert entry.command is not None and entry.command.startswith("inferlab tune --param max-num-seqs=8,64")
    r = subprocess.run([sys.executable, "-m", "inferlab", "report", str(entry.id), "-o", str(tmp_path / "r.html")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "the tune&#x27;s best" in (tmp_path / "r.html").read_text()
    p = subprocess.run([sys.executable, "-m", "inferlab", "tune", "--param", "max-num-seqs=8,64", "-n", "4", "--slo-ttft-ms", "500", "--history", str(hist)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--out" in p.stderr


def test_a_tunes_row_shows_the_trial_the_tune_chose_and_says_so(tmp_path: Path) -> None:
    """The README's tune: the trial with the highest output tok/s is not the one the tune
    chose (at 400 ms it missed the TTFT SLO; at the README's 500 ms it loses the tie rule
    on TTFT p99); its history row showed the fastest trial's numbers as the tune's. Now it
    shows the chosen trial's, and ``runs`` says which trial."""
    hist, out = tmp_path / "h.sqlite", tmp_path / "tune1"
    p = subprocess.run([sys.executable, "-m", "inferlab", "tune", "--param", "max-num-batched-tokens=256,512,1024,2048,4096,8192",
                        "--param", "max-num-seqs=8,16,32,64,128,256", "--rate", "12", "-n", "150", "--input-tokens", "2000",
                        "--output-tokens", "200", "--slo-ttft-ms", "500", "--slo-tpot-ms", "26", "-o", str(out), "--history", str(hist)],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    index = json.loads((out / "sweep.json").read_text())
    best = index["tune"]["best"]
    chosen = next(pt for pt in index["points"] if pt["params"] == best["params"])
    fastest = max((pt for pt in index["points"] if pt["status"] == "done"), key=lambda pt: pt["headline"]["output_tok_s"])
    assert fastest is not chosen  # (what the test is about: the tune's best is not the fastest trial)
    with History(hist) as h:
        (entry,) = h.find()
    assert entry.headline == {k: chosen["headline"][k] for k in entry.headline}
    assert entry.workload is not None and entry.workload["tune_best"] == best["trial"]
    assert entry.workload["headline"] == f"the tune's best, trial {best['trial']}"
    listed = CliRunner().invoke(main, ["runs", "--history", str(hist)], env={"COLUMNS": "250"})
    assert f"tune, best trial {best['trial']}: simulator (virtual time) (prediction)" in listed.output
    # a row recorded before (the fastest trial's headline, no word of which) still reads as its folder's
    with History(hist) as h:
        old = h.add({"kind": "sweep", "path": str(out.resolve()), "model": entry.model, "completed": fastest["headline"].get("completed"),
                     "workload": {"axes": index["axes"], "points": len(index["points"])},
                     **{k: fastest["headline"][k] for k in entry.headline}})
    r = subprocess.run([sys.executable, "-m", "inferlab", "report", str(old), "--history", str(hist), "-o", str(tmp_path / "r.html")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


_OPEN_AT_ONCE = """
import sys, time
from inferlab.results.history import History
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
with History(sys.argv[1]) as h:
    h.add({"kind": "run", "path": sys.argv[3]})
"""


def test_many_processes_opening_a_new_history_at_once_all_record(tmp_path: Path) -> None:
    # SQLite refuses the WAL pragma at once ("database is locked", no busy wait) while
    # another process is creating the same file; each opener must wait its turn.
    for round_ in range(6):
        hist = tmp_path / f"h{round_}.sqlite"
        start = time.time() + 1.0
        procs = [subprocess.Popen([sys.executable, "-c", _OPEN_AT_ONCE, str(hist), repr(start), f"p{i}"],
                                  stderr=subprocess.PIPE, text=True) for i in range(4)]
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
        assert sorted(r[1] for r in rows(hist)) == [f"p{i}" for i in range(4)]  # type: ignore[type-var]


def test_a_row_whose_json_column_is_not_json_is_listed_without_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One row whose engine column something else wrote badly broke `inferlab runs` for
    every row (JSONDecodeError); that row is now listed without its engine, the others
    whole. A --since span reaching before year 1 means every row, not an internal error."""
    hist = tmp_path / "h.sqlite"
    monkeypatch.setenv("INFERLAB_HISTORY", str(hist))
    for _ in range(2):
        assert sim(tmp_path, None).returncode == 0
    with sqlite3.connect(hist) as db:
        db.execute("UPDATE runs SET engine = '{bad' WHERE id = 1")
    with History(hist) as h:
        first, second = sorted(h.find(), key=lambda e: e.id)
    assert first.engine is None and second.engine is not None and second.engine["block_size"] == 16
    for args in (["runs"], ["runs", "--json"], ["runs", "--since", "99999999d"]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert parse_since("99999999d") < "0002"


@pytest.fixture(scope="module")
def _history_seen_by_a_module_fixture(tmp_path_factory: pytest.TempPathFactory) -> tuple[str | None, Path]:
    return os.environ.get("INFERLAB_HISTORY"), tmp_path_factory.getbasetemp()


def test_a_module_scoped_fixture_records_into_a_temporary_history(
    _history_seen_by_a_module_fixture: tuple[str | None, Path],
) -> None:
    """A fixture of a module's scope runs before any test's own fixtures: its runs (a
    profile or sweep built once for a module) went to the user's own history file. The
    session's history is set before any of them."""
    seen, base = _history_seen_by_a_module_fixture
    assert seen is not None and Path(seen).is_relative_to(base)
