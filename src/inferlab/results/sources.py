"""What ``report`` and ``compare`` read: a run directory, or a sweep directory of them.

A *run* is any folder with a ``requests.jsonl`` (a bench run, a ``sim run``, or anything
that writes the same records); its ``summary.json`` and ``config.json`` are read when
present, and the summary is computed from the records when it is missing, or when its
request counts are not those of the records (a summary of another run, or ``{}``). A *sweep* is
a folder with a ``sweep.json`` (``format`` ``inferlab.sweep/1``): its points, each a run
directory relative to it, with the parameters that point ran with.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferlab._errors import UsageError
from inferlab.results.provenance import ServerInfo, server_info
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.results.runfiles import read_records
from inferlab.results.summary import summarize
from inferlab.results.telemetry import SERVER_METRICS_FILE

SWEEP_FORMAT = "inferlab.sweep/1"
#: A profile folder's index (``inferlab profile``).
PROFILE_FILE = "profile.json"


@dataclass
class Run:
    """One run directory, read: ``summary`` as the JSON object, ``records`` measured
    (warm-up ones left out), ``config`` (config.json, else the summary's)."""

    path: Path
    summary: dict[str, Any]
    records: list[RequestRecord]
    config: dict[str, Any]
    summary_computed: bool = False  # computed here from the records (no summary.json, or not theirs)
    label: str = ""
    # the server's /metrics sampled during the run (server_metrics.jsonl), oldest first
    server_series: list[dict[str, Any]] = field(default_factory=list)
    # what a reader should know of how it was read (a summary.json recomputed), in words
    notes: list[str] = field(default_factory=list)

    @property
    def server(self) -> ServerInfo:
        """Where its numbers come from (``results.provenance``)."""
        return server_info(self.config)

    @property
    def simulated(self) -> bool:
        """Its numbers are predictions of the simulator."""
        return self.server.simulated


@dataclass
class SweepPoint:
    params: dict[str, Any]
    repeat: int
    status: str
    run: Run | None  # None: the point has no readable run directory (failed, skipped)
    dir: str


@dataclass
class Sweep:
    path: Path
    index: dict[str, Any]
    points: list[SweepPoint] = field(default_factory=list)

    @property
    def runs(self) -> list[Run]:
        return [p.run for p in self.points if p.run is not None]

    @property
    def axes(self) -> dict[str, Any]:
        axes = self.index.get("axes")
        return dict(axes) if isinstance(axes, Mapping) else {}


def load_run(path: str | os.PathLike[str], label: str | None = None) -> Run:
    """Read a run directory; ``UsageError`` naming what is missing or broken."""
    d = Path(path)
    if not d.is_dir():
        raise UsageError(f"{d}: not a directory")
    requests = d / "requests.jsonl"
    if not requests.exists():
        raise UsageError(f"{d}: no requests.jsonl (not a run directory; a sweep has a sweep.json)")
    everything = list(read_records(requests))
    records = [r for r in everything if not r.warmup]
    config = _read_json(d / "config.json") if (d / "config.json").exists() else None
    summary = _read_json(d / "summary.json") if (d / "summary.json").exists() else None
    # a summary.json whose counts are not the records' is not theirs (an earlier run's,
    # a file emptied or cut short): its numbers would be shown as this run's
    why = "" if summary is None else counts_disagree(summary, records)
    notes = [f"{d / 'summary.json'} {why}: the summary is recomputed from requests.jsonl"] if why else []
    computed = summary is None or bool(why)
    if summary is None or why:  # (from every record: the summary counts the warm-ups it leaves out)
        old = summary or {}
        config = config if config is not None else old.get("config") if isinstance(old.get("config"), dict) else {}
        summary = summarize(everything, config=config, interrupted=old.get("interrupted") is True).to_json()
    if config is None:
        config = summary.get("config") or {}
    series = _read_jsonl(d / SERVER_METRICS_FILE) if (d / SERVER_METRICS_FILE).exists() else []
    return Run(d, summary, records, config, computed, label if label is not None else d.name, series, notes)


def counts_disagree(summary: Mapping[str, Any], records: list[RequestRecord]) -> str:
    """How a summary's request counts differ from those of the run's measured ``records``
    (warm-ups left out), in words; empty when they agree."""
    completed = sum(1 for r in records if r.ok)
    failed = sum(1 for r in records if not r.ok and r.error_kind is not ErrorKind.CANCELLED)
    counts = summary.get("counts")
    said = [counts.get(k) if isinstance(counts, Mapping) else None for k in ("total", "completed", "failed")]
    if not all(isinstance(n, int) for n in said):
        return f"has no request counts (requests.jsonl holds {len(records):,}: {completed:,} completed, {failed:,} failed)"
    if said == [len(records), completed, failed]:
        return ""
    return (f"counts {said[0]:,} requests, {said[1]:,} completed, {said[2]:,} failed; requests.jsonl holds "
            f"{len(records):,}, {completed:,} completed, {failed:,} failed")


def load_profile(path: str | os.PathLike[str]) -> Sweep:
    """A profile folder (``inferlab profile``: ``profile.json`` and a run directory per
    measurement) read as a sweep whose points are its measurements (``factor``, ``run``
    as parameters); ``index["profile"]`` holds ``profile.json``."""
    d = Path(path)
    data = _read_json(d / PROFILE_FILE)
    sweep = Sweep(d, {"command": "profile", "points": [], "profile": data})
    for factor in data.get("factors") or []:
        if not isinstance(factor, dict):
            continue
        for rel in factor.get("runs") or []:
            run_dir = d / str(rel)
            run = load_run(run_dir, str(rel)) if (run_dir / "requests.jsonl").exists() else None
            params = {"factor": factor.get("name"), "run": str(rel)}
            sweep.points.append(SweepPoint(params, 0, "done" if run is not None else "missing", run, str(rel)))
    return sweep


def read_sweep_index(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A sweep directory's ``sweep.json``, checked as far as its readers rely on it: an
    object of format ``SWEEP_FORMAT`` whose ``points`` is a list of objects, each with
    ``params`` an object, ``repeat`` a whole number and ``dir`` a string where given;
    ``UsageError`` naming what is wrong."""
    where = Path(path) / "sweep.json"
    index = _read_json(where)
    if index.get("format") != SWEEP_FORMAT:
        raise UsageError(f"{where}: format {index.get('format')!r}, expected {SWEEP_FORMAT!r}")
    points = index.get("points")
    if points is not None and not isinstance(points, list):
        raise UsageError(f"{where}: points is {json.dumps(points)[:40]}, not a list")
    for p in points or []:
        if not isinstance(p, Mapping):
            raise UsageError(f"{where}: a point that is not an object: {p!r}")
        if p.get("params") is not None and not isinstance(p["params"], Mapping):
            raise UsageError(f"{where}: a point's params are not an object: {p['params']!r}")
        if p.get("repeat") is not None and (not isinstance(p["repeat"], int) or isinstance(p["repeat"], bool)):
            raise UsageError(f"{where}: a point's repeat is not a whole number: {p['repeat']!r}")
        if p.get("dir") is not None and not isinstance(p["dir"], str):
            raise UsageError(f"{where}: a point's dir is not a path: {p['dir']!r}")
    return index


def load_sweep(path: str | os.PathLike[str]) -> Sweep:
    """Read a sweep directory (``read_sweep_index``) and every point's run that is there."""
    d = Path(path)
    index = read_sweep_index(d)
    sweep = Sweep(d, index)
    for p in index.get("points") or []:
        params = dict(p.get("params") or {})
        where: str = p["dir"] if isinstance(p.get("dir"), str) else ""  # none: it failed before it ran
        run = None
        if where and (d / where / "requests.jsonl").exists():
            run = load_run(d / where, label=point_label(params, int(p.get("repeat") or 0)))
        sweep.points.append(SweepPoint(params, int(p.get("repeat") or 0), str(p.get("status") or "?"), run, where))
    return sweep


def load(path: str | os.PathLike[str]) -> Run | Sweep:
    """A run or a sweep directory, whichever ``path`` is."""
    d = Path(path)
    if (d / "sweep.json").exists():
        return load_sweep(d)
    if (d / PROFILE_FILE).exists():
        return load_profile(d)
    return load_run(d)


def files_read(src: Run | Sweep) -> list[Path]:
    """The files reading ``src`` takes from its folders (those there or not yet there: a
    file written to one of them would be read next time as part of the run)."""
    if isinstance(src, Sweep):
        return [src.path / "sweep.json", src.path / PROFILE_FILE, *(f for run in src.runs for f in files_read(run))]
    return [src.path / name for name in ("requests.jsonl", "summary.json", "config.json", SERVER_METRICS_FILE)]


def point_label(params: Mapping[str, Any], repeat: int = 0) -> str:
    text = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()) or "point"
    return f"{text} #{repeat}" if repeat else text


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A JSON-lines file's objects; ``UsageError`` naming the line that is not one."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror or e}") from e
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise UsageError(f"{path}:{n}: not JSON ({e})") from e
        if isinstance(obj, dict):
            out.append(obj)
    return out


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror or e}") from e
    except ValueError as e:
        raise UsageError(f"{path}: not JSON ({e})") from e
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a JSON object")
    return data
