"""The run history: every run and sweep, one row each, in a local SQLite database.

Where it lives: ``--history PATH``, else ``$INFERLAB_HISTORY``, else the user's data
directory (``$XDG_DATA_HOME/inferlab/history.sqlite``, by default
``~/.local/share/inferlab/history.sqlite``; on macOS ``~/Library/Application
Support/inferlab``). ``INFERLAB_HISTORY=off`` (or ``--no-history``) records nothing.

The schema carries its version in SQLite's ``user_version``; ``MIGRATIONS`` brings an
older file up to date, each step in one transaction, and a file newer than this code
is refused rather than written. Several processes may record at once: the database is
in WAL mode, writers wait (``busy_timeout``) instead of failing, and each insert is one
``BEGIN IMMEDIATE`` transaction.

What a row holds: ``id``, ``time`` (UTC, ISO 8601), ``kind`` (``run`` or ``sweep``),
``command``, ``target`` (the URL; for a simulated run the simulator in words, as
``results.provenance`` names it: the embedded simulated server, inferlab sim serve at
URL, the simulator in virtual time), ``model``, ``engine`` (the engine and its flags as
JSON, when known), ``workload`` (the load and the workload as JSON), the headline
metrics (``HEADLINE``), ``completed``, ``failed``, ``simulated`` (1: its numbers are
predictions), ``path`` (the run or sweep directory; null for a run written nowhere) and
``response_cache_hits`` (completed requests a response cache in front of the engine
answered; null for rows recorded before inferlab counted them).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import sqlite3
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferlab._clock import WallClock, wall_time_s
from inferlab._errors import UsageError
from inferlab.results.provenance import VIRTUAL, server_info, simulated_engine
from inferlab.results.sources import read_sweep_index

ENV = "INFERLAB_HISTORY"
#: Values of ``$INFERLAB_HISTORY`` that turn the history off.
OFF = ("off", "none", "0", "no", "false")
#: How long a writer waits for another process's transaction, ms.
BUSY_TIMEOUT_MS = 10_000

#: The headline metrics a row keeps: column name -> (summary key, distribution key or None).
HEADLINE: dict[str, tuple[str, str | None]] = {
    "output_tok_s": ("output_token_throughput_tps", None),
    "req_s": ("request_throughput_rps", None),
    "ttft_p50_ms": ("ttft_ms", "p50"),
    "ttft_p99_ms": ("ttft_ms", "p99"),
    "tpot_p50_ms": ("tpot_ms", "p50"),
    "tpot_p99_ms": ("tpot_ms", "p99"),
    "e2e_p50_ms": ("e2e_ms", "p50"),
    "e2e_p99_ms": ("e2e_ms", "p99"),
}

#: Schema steps: ``MIGRATIONS[i]`` takes a database from version i to i + 1.
MIGRATIONS: tuple[str, ...] = (
    f"""
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        time TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('run', 'sweep')),
        command TEXT,
        target TEXT,
        model TEXT,
        engine TEXT,
        workload TEXT,
        {", ".join(f"{name} REAL" for name in HEADLINE)},
        completed INTEGER,
        failed INTEGER,
        simulated INTEGER NOT NULL DEFAULT 0,
        path TEXT
    );
    CREATE INDEX runs_time ON runs (time);
    CREATE INDEX runs_model ON runs (model);
    """,
    "ALTER TABLE runs ADD COLUMN response_cache_hits INTEGER",
)
SCHEMA_VERSION = len(MIGRATIONS)

COLUMNS = ("id", "time", "kind", "command", "target", "model", "engine", "workload", *HEADLINE, "completed", "failed", "simulated", "path",
           "response_cache_hits")


def default_path() -> Path:
    """The history file in the user's data directory (the platform's convention)."""
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    elif sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "inferlab" / "history.sqlite"


def history_path(option: str | None = None, *, disabled: bool = False) -> Path | None:
    """Where to record: ``option`` (``--history``), else ``$INFERLAB_HISTORY``, else
    ``default_path()``; ``None`` when ``disabled`` (``--no-history``) or the variable
    says off."""
    if disabled:
        return None
    chosen = option or os.environ.get(ENV) or None
    if chosen is not None and chosen.strip().lower() in OFF:
        return None
    return Path(chosen).expanduser() if chosen else default_path()


@dataclass(frozen=True)
class Entry:
    """One row of the history."""

    id: int
    time: str
    kind: str
    command: str | None
    target: str | None
    model: str | None
    engine: dict[str, Any] | None
    workload: dict[str, Any] | None
    headline: dict[str, float | None]
    completed: int | None
    failed: int | None
    simulated: bool
    path: str | None
    response_cache_hits: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "time": self.time, "kind": self.kind, "command": self.command,
            "target": self.target, "model": self.model, "engine": self.engine, "workload": self.workload,
            **self.headline, "completed": self.completed, "failed": self.failed,
            "simulated": self.simulated, "path": self.path, "response_cache_hits": self.response_cache_hits,
        }


class History:
    """The history database at ``path`` (created, and migrated, on first use).
    ``UsageError`` for a file that is not an inferlab history, or is newer than this
    code."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            # (SQLite's LOWER folds ASCII only: "ÜBER" would not match "über")
            self._db.create_function("FOLD", 1, _fold, deterministic=True)
            self._use_wal()
            self._migrate()
        except sqlite3.DatabaseError as e:
            raise UsageError(f"history {self.path}: {e} (move it away, or give --history another file)") from e
        except OSError as e:
            raise UsageError(f"history {self.path}: {e.strerror or e}") from e

    def close(self) -> None:
        self._db.close()

    def _use_wal(self) -> None:
        """Put the file in WAL mode. SQLite answers "database is locked" to that pragma
        at once, without waiting on ``busy_timeout``, while another process is creating
        or converting the same file (two runs started together on a new history), so
        it is retried here for as long as a writer would wait."""
        clock = WallClock()
        deadline_ns = clock.now_ns() + BUSY_TIMEOUT_MS * 1_000_000
        pause_s = 0.005
        while True:
            try:
                if str(self._db.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                    self._db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as e:
                if ("locked" not in str(e) and "busy" not in str(e)) or clock.now_ns() >= deadline_ns:
                    raise
            time.sleep(pause_s)
            pause_s = min(pause_s * 2, 0.2)

    def __enter__(self) -> History:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taking the write lock at its start (so two processes
        never both read a version and then both migrate)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        if self.version() == SCHEMA_VERSION:
            return
        with self._write() as db:
            version = self.version()  # again, under the lock: another process may have migrated
            if version > SCHEMA_VERSION:
                raise UsageError(
                    f"history {self.path} has schema version {version}, newer than this inferlab "
                    f"knows ({SCHEMA_VERSION}): upgrade inferlab, or give --history another file"
                )
            for step in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[step].split(";"):
                    if statement.strip():
                        db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def add(self, row: Mapping[str, Any]) -> int:
        """Insert one row (keys from ``COLUMNS`` but ``id``; ``time`` defaults to now);
        its id."""
        values = dict(row)
        values.setdefault("time", _iso_now())
        for key in ("engine", "workload"):
            if values.get(key) is not None:
                values[key] = json.dumps(values[key], sort_keys=True, default=str)
        unknown = set(values) - set(COLUMNS[1:])
        if unknown:
            raise ValueError(f"not history columns: {sorted(unknown)}")
        names = sorted(values)
        with self._write() as db:
            cur = db.execute(
                f"INSERT INTO runs ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})",
                [values[n] for n in names],
            )
            return int(cur.lastrowid or 0)

    def get(self, run_id: int) -> Entry | None:
        row = self._db.execute(f"SELECT {', '.join(COLUMNS)} FROM runs WHERE id = ?", (run_id,)).fetchone()
        return _entry(row) if row else None

    def find(self, *, model: str | None = None, since: str | None = None, url: str | None = None,
             kind: str | None = None, limit: int | None = None) -> list[Entry]:
        """Rows newest first: ``model`` and ``url`` match as substrings (case-insensitive),
        ``since`` is an ISO date or time (UTC) rows are at or after."""
        where, args = [], []
        if model:
            where.append("FOLD(model) LIKE ? ESCAPE '\\'")
            args.append(_contains(model))
        if url:
            where.append("FOLD(target) LIKE ? ESCAPE '\\'")
            args.append(_contains(url))
        if since:
            where.append("time >= ?")
            args.append(since)
        if kind:
            where.append("kind = ?")
            args.append(kind)
        sql = f"SELECT {', '.join(COLUMNS)} FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [_entry(r) for r in self._db.execute(sql, args)]


def _fold(value: str | None) -> str | None:
    """A text as the filters compare it: case folded, any script (None as it is)."""
    return value.casefold() if isinstance(value, str) else value


def _contains(text: str) -> str:
    """A LIKE pattern for ``text`` anywhere, taken literally: its ``%`` and ``_`` (LIKE's
    wildcards) and the escape character itself escaped, so ``--model _`` matches only
    names with an underscore."""
    literal = text.casefold().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{literal}%"


def _iso_now() -> str:
    return datetime.datetime.fromtimestamp(wall_time_s(), datetime.UTC).isoformat(timespec="seconds")


def _entry(row: tuple[Any, ...]) -> Entry:
    d = dict(zip(COLUMNS, row, strict=True))
    return Entry(
        id=d["id"], time=d["time"], kind=d["kind"], command=d["command"], target=d["target"],
        model=d["model"], engine=_json_or_none(d["engine"]), workload=_json_or_none(d["workload"]),
        headline={k: d[k] for k in HEADLINE}, completed=d["completed"], failed=d["failed"],
        simulated=bool(d["simulated"]), path=d["path"], response_cache_hits=d["response_cache_hits"],
    )


def _json_or_none(text: str | None) -> Any:
    """A JSON column's value; None for an empty one or one that is not JSON (a row
    written or edited by something else: that column is unknown, the rest is shown)."""
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def parse_since(text: str) -> str:
    """``--since``: an ISO date or date-time (UTC unless it says), or a span back from now
    (``7d``, ``12h``, ``30m``); the ISO UTC time rows are compared with. ``UsageError``
    for anything else."""
    t = text.strip()
    units = {"d": 86400, "h": 3600, "m": 60}
    if t[-1:].lower() in units and t[:-1].replace(".", "", 1).isdigit():
        seconds = float(t[:-1]) * units[t[-1].lower()]
        try:
            when = datetime.datetime.fromtimestamp(wall_time_s() - seconds, datetime.UTC)
        except (OverflowError, OSError, ValueError):  # (before year 1: every row is later)
            when = datetime.datetime.min.replace(tzinfo=datetime.UTC)
        return when.isoformat(timespec="seconds")
    try:
        when = datetime.datetime.fromisoformat(t)
    except ValueError:
        raise UsageError(f"--since {text!r}: expected a date (2026-01-31), a date-time, or a span such as 7d, 12h, 30m") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.astimezone(datetime.UTC).isoformat(timespec="seconds")


def headline(summary: Mapping[str, Any]) -> dict[str, float | None]:
    """The headline metrics of a ``summary.json`` (``HEADLINE``'s names; None when absent)."""
    out: dict[str, float | None] = {}
    for name, (key, sub) in HEADLINE.items():
        value = summary.get(key)
        if sub is not None:
            value = value.get(sub) if isinstance(value, Mapping) else None
        out[name] = float(value) if isinstance(value, (int, float)) else None
    return out


def run_row(summary: Mapping[str, Any], path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The history row of a run, from its ``summary.json`` (whose ``config`` says what ran)
    and its directory (None: written nowhere)."""
    config = summary.get("config") or {}
    resolved = config.get("resolved") or {}
    command = config.get("command") or "bench"
    server = server_info(config)
    engine = simulated_engine(config)
    target: str | None
    if server.kind == VIRTUAL:
        target = "simulator (virtual time)"
        model = (engine or {}).get("model")
    else:
        # a simulated server in words (the embedded one's URL was a throwaway port)
        target = server.where if server.simulated else resolved.get("api_root") or resolved.get("url") or config.get("url")
        model = resolved.get("model") or config.get("model")
    counts = summary.get("counts") or {}
    return {
        "kind": "run", "command": command, "target": target, "model": model, "engine": engine,
        "workload": {k: config.get(k) for k in ("load", "workload", "api", "trace") if k in config},
        **headline(summary), "completed": counts.get("completed"), "failed": counts.get("failed"),
        "simulated": int(server.simulated), "path": str(Path(path).resolve()) if path is not None else None,
        "response_cache_hits": counts.get("response_cache_hits"),
    }


def record_run(summary: Mapping[str, Any], path: str | os.PathLike[str] | None, history: str | os.PathLike[str] | None) -> int | None:
    """Record a finished run (its ``summary.json`` as a dict) in ``history`` (a path, or
    None for none); the new row's id."""
    if history is None:
        return None
    with History(history) as h:
        return h.add(run_row(summary, path))


def record_sweep(path: str | os.PathLike[str], history: str | os.PathLike[str] | None = None, *, disabled: bool = False) -> int | None:
    """Record a sweep directory (its ``sweep.json``) in the history: one row of kind
    ``sweep`` whose headline is the point with the highest output throughput (a tune's:
    the trial it chose, ``headline_point``), model,
    target and response-cache hits from that point's summary. Where, as for a run: ``history`` (``--history``),
    else ``$INFERLAB_HISTORY``, else the user's data directory; nothing when
    ``disabled`` (``--no-history``) or the variable says off. Returns the row id, or
    None when nothing was recorded; ``UsageError`` for a sweep.json that cannot be read
    or a history that cannot be written. For the sweep command to call once its index
    is final: ``record_sweep(out, kw["history"], disabled=kw["no_history"])``."""
    target_file = history_path(None if history is None else os.fspath(history), disabled=disabled)
    if target_file is None:
        return None
    row = sweep_row(Path(path))
    with History(target_file) as h:
        return h.add(row)


def sweep_row(sweep_dir: Path, *, tune_best: bool = True) -> dict[str, Any]:
    """The history row of a sweep directory (``record_sweep``'s); ``UsageError`` for a
    sweep.json that cannot be read. ``tune_best`` False: a tune's headline is its point
    of highest output throughput, as rows recorded before its best's were."""
    index = read_sweep_index(sweep_dir)  # (as report and compare read it)
    points = index.get("points") or []
    done = [p for p in points if p.get("status") == "done" and isinstance(p.get("headline"), Mapping)]
    best, why = headline_point(index if tune_best else {}, done)
    command = index.get("command")
    if isinstance(command, list):
        command = " ".join(str(c) for c in command)
    row: dict[str, Any] = {"kind": "sweep", "command": command if isinstance(command, str) else "sweep",
                           "path": str(sweep_dir.resolve()),
                           "workload": {"axes": index.get("axes"), "points": len(points), "done": len(done), "headline": why}}
    if isinstance(index.get("tune"), Mapping):  # (which trial, for ``inferlab runs`` to say)
        chosen = index["tune"].get("best")
        row["workload"]["tune_best"] = chosen.get("trial") if isinstance(chosen, Mapping) else None
    if best is not None:
        row.update({k: best["headline"].get(k) for k in HEADLINE})
        try:
            point = run_row(json.loads((sweep_dir / best["dir"] / "summary.json").read_text()), None)
        except (OSError, ValueError, TypeError, KeyError):
            point = {}
        row.update({k: point.get(k) for k in ("target", "model", "engine", "simulated", "response_cache_hits", "completed", "failed")
                    if point.get(k) is not None})
    return row


def headline_point(index: Mapping[str, Any], done: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, str]:
    """The finished point a sweep's row shows, and which it is in words: a tune's the
    trial it chose (``tune.best``: "the tune's best, trial 0"; none where it chose none:
    a trial it did not choose is not its result), any other sweep's the one with the
    highest output throughput."""
    tune = index.get("tune")
    if isinstance(tune, Mapping):
        best = tune.get("best")
        if not isinstance(best, Mapping):
            return None, "the tune's best: none (no trial ran to the end)"
        point = next((p for p in done if p.get("params") == best.get("params")), None)
        return point, f"the tune's best, trial {best.get('trial')}"
    return max(done, key=lambda p: p["headline"].get("output_tok_s") or 0.0, default=None), "the highest output throughput"


def overwritten(entry: Entry) -> str | None:
    """How the run in ``entry``'s folder differs from the one ``entry`` recorded, when
    another has been written there since (``--overwrite``, or the folder emptied and used
    again): its headline, counts or model; None when they agree, or when the folder holds
    nothing readable (whoever reads it says what is wrong)."""
    if entry.path is None:
        return None
    where = Path(entry.path)
    try:
        # (a row recorded before it named its headline's point took a tune's fastest trial)
        legacy = entry.kind == "sweep" and "headline" not in (entry.workload or {})
        row = sweep_row(where, tune_best=not legacy) if entry.kind == "sweep" else run_row(
            json.loads((where / "summary.json").read_text()), where)
    except (OSError, ValueError, TypeError, AttributeError, UsageError):
        return None
    recorded: dict[str, Any] = {**entry.headline, "completed": entry.completed, "failed": entry.failed, "model": entry.model}
    # (a value recorded as null says nothing: a row written before it was kept, a sweep's counts)
    differ = [k for k, v in recorded.items() if v is not None and not _same(v, row.get(k))]
    def shown(v: object) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    return ", ".join(f"{k} {shown(recorded[k])} recorded, {shown(row.get(k))} there" for k in differ) or None


def _same(a: object, b: object) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b
