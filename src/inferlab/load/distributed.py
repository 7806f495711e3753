"""Records measured on other machines, merged into one run: what Locust's workers send to
their master (``load.locust``), and what ``inferlab locust-merge`` reads back.

A worker sends its records in batches as they end, each batch tagged with the worker's
name and ``t0_epoch_ns``: the Unix time of the worker's own t0, the zero of its
records' monotonic times. The master appends every batch, as received, to the run
directory's ``locust-records.jsonl`` (so a master that dies keeps what it got), and
at the end turns them into the usual run directory. Merging moves each worker's records
by its t0's distance from the earliest worker's: every difference within a record
(TTFT, TPOT, ITL, E2E) stays exactly as measured; times across workers are as close as
the machines' clocks (one machine: the same clock). Records are numbered again in the
order they were sent; nothing else changes.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferlab._errors import UsageError
from inferlab.results.records import RequestRecord
from inferlab.results.runfiles import RunWriter, not_text_error, plain_json
from inferlab.results.summary import Summary

#: The raw batches, in the run directory, as the master received them.
RAW_FILE = "locust-records.jsonl"
#: What the master keeps of the run's configuration until the end (config.json's form).
CONFIG_FILE = "locust-config.json"
#: A record's times on the run's clock, each moved by its worker's offset.
_TIME_FIELDS = ("intended_send_ns", "send_ns", "ttfb_ns", "end_ns")


@dataclass
class Batch:
    """Records from one worker: ``records`` in ``RequestRecord.to_json`` form, their times
    relative to the worker's t0, which was ``t0_epoch_ns`` in Unix time. ``final``: the
    worker's last batch of the run. ``model``: the model it sent to. ``gone``: why the
    worker stopped its users, the server having stopped answering (``load.http``'s rule),
    in its last batch. ``stopped_early``: the worker itself was stopped (Ctrl-C, SIGTERM
    on it) while its test ran, before the master ended it; in its last batch."""

    worker: str
    t0_epoch_ns: int
    records: list[dict[str, Any]] = field(default_factory=list)
    final: bool = False
    model: str | None = None
    gone: str | None = None
    stopped_early: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "worker": self.worker, "t0_epoch_ns": self.t0_epoch_ns, "final": self.final,
            "model": self.model, "gone": self.gone, "stopped_early": self.stopped_early, "records": self.records,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Batch:
        """``ValueError`` if ``d`` is not a batch, or one of its records is not a request
        record (checked here: ``merge`` does arithmetic on their times)."""
        try:
            records = d["records"]
            if not isinstance(records, list):
                raise TypeError(f"records is {type(records).__name__}, not a list")
            for i, r in enumerate(records):
                _check_record(i, r)
            gone = d.get("gone")
            return cls(str(d["worker"]), int(d["t0_epoch_ns"]), records, bool(d.get("final")), d.get("model"),
                       None if gone is None else str(gone), bool(d.get("stopped_early")))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a batch of records: {e}") from None


def _check_record(i: int, d: object) -> None:
    """``TypeError`` naming record ``i``'s field that is not of its type (a record a
    worker sent is what ``RequestRecord.to_json`` wrote: anything else is damage)."""
    try:
        RequestRecord.from_json(d)  # type: ignore[arg-type]  # (what it checks is the point)
    except (TypeError, ValueError) as e:  # (ValueError: an unknown error_kind)
        raise TypeError(f"record {i}: {e}") from None


def append_batch(path: str | os.PathLike[str], batch: Batch) -> None:
    """Append ``batch`` to the raw file at ``path`` (one line, flushed)."""
    with open(path, "a") as f:
        f.write(json.dumps(batch.to_json(), separators=(",", ":")) + "\n")


def read_batches(path: str | os.PathLike[str]) -> list[Batch]:
    """Every batch in the raw file at ``path``; ``UsageError`` if it is missing or a line
    is not a batch (a last line cut short, by a master that died writing it: no newline
    at its end and not JSON, is skipped)."""
    try:
        lines = Path(path).read_text().splitlines(keepends=True)
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise not_text_error(path, e, "a locust-records.jsonl") from e
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except ValueError as e:
            if n == len(lines) and not line.endswith("\n"):
                break
            raise UsageError(f"{path}:{n}: not JSON ({e})") from None
        try:
            if not isinstance(d, dict):
                raise ValueError(f"not a batch of records: a JSON {type(d).__name__}")
            out.append(Batch.from_json(d))
        except ValueError as e:
            raise UsageError(f"{path}:{n}: {e}") from None
    return out


@dataclass
class Merged:
    """Every worker's records on one clock, numbered in the order they were sent;
    ``workers``: each worker's name and how many records it sent; ``unfinished``: the
    workers whose last batch never came (their last records may be missing); ``gone``:
    why the server stopped answering, as the workers that stopped for it saw it;
    ``stopped_early``: the workers stopped (Ctrl-C, SIGTERM) before the master ended the test."""

    records: list[RequestRecord]
    workers: dict[str, int]
    unfinished: list[str]
    model: str | None = None
    gone: list[str] = field(default_factory=list)
    stopped_early: list[str] = field(default_factory=list)


def merge(batches: Iterable[Batch], workers: Iterable[str] = ()) -> Merged:
    """The records of ``batches`` on one clock (see the module's docstring); ``workers``:
    those the master knew (one that sent no batch is unfinished too)."""
    batches = list(batches)
    t0: dict[str, int] = {}
    for b in batches:  # (a worker keeps one t0 for the run; the earliest is kept if not)
        t0[b.worker] = min(b.t0_epoch_ns, t0.get(b.worker, b.t0_epoch_ns))
    run_t0 = min(t0.values(), default=0)
    records: list[tuple[RequestRecord, str, int]] = []
    counts: dict[str, int] = {w: 0 for w in t0}
    finished = {b.worker for b in batches if b.final}
    for b in batches:
        shift = b.t0_epoch_ns - run_t0
        for d in b.records:
            r = RequestRecord.from_json(d)
            for name in _TIME_FIELDS:
                v = getattr(r, name)
                if v is not None:
                    setattr(r, name, v + shift)
            r.content_ns = [t + shift for t in r.content_ns]
            records.append((r, b.worker, counts[b.worker]))
            counts[b.worker] += 1

    def order(item: tuple[RequestRecord, str, int]) -> tuple[int, str, int]:
        r = item[0]
        sent = r.send_ns if r.send_ns is not None else r.intended_send_ns
        return (sent if sent is not None else 0, item[1], item[2])

    ordered = [r for r, _, _ in sorted(records, key=order)]
    for i, r in enumerate(ordered):
        r.index = i
    models = [b.model for b in batches if b.model]
    gone = sorted({b.gone for b in batches if b.gone})
    early = sorted({b.worker for b in batches if b.stopped_early})
    return Merged(ordered, counts, sorted((set(t0) | set(workers)) - finished), models[0] if models else None, gone,
                  early)


def write_run(out_dir: str | os.PathLike[str], config: dict[str, Any], merged: Merged, summary: Summary) -> None:
    """Write ``config.json``, ``requests.jsonl`` and ``summary.json`` into ``out_dir``
    (replacing what a previous merge of the same raw file wrote)."""
    writer = RunWriter(out_dir, plain_json(config), overwrite=True)
    try:
        for r in merged.records:
            writer.append(r)
        writer.write_summary(summary)
    finally:
        writer.close()


def merge_warnings(merged: Merged) -> list[str]:
    """What the summary should say about how the records came in."""
    out = []
    if merged.unfinished:
        out.append(
            f"no last batch came from worker(s) {', '.join(merged.unfinished)}: records of requests that "
            "ended after their previous batch are missing"
        )
    return out


def workers_stopped_early(merged: Merged) -> tuple[list[str], bool]:
    """What the summary says of the workers stopped (Ctrl-C, SIGTERM on a worker) before
    the master ended the test, and whether the test ended with them: Locust's master
    stops the test when its last worker quits, and while others run, gives a quitting
    worker's users to them."""
    if not merged.stopped_early:
        return [], False
    names = ", ".join(merged.stopped_early)
    ran_on = set(merged.workers) - set(merged.stopped_early) - set(merged.unfinished)
    if ran_on:
        return [f"worker(s) {names} stopped before the master ended the test (Ctrl-C or SIGTERM on the worker, "
                "say): Locust gave their users to the other workers, which started them anew"], False
    return [f"the test ended early: worker(s) {names} stopped before the master ended it (Ctrl-C or SIGTERM on the "
            "worker, say), and the master stops the test when its last worker quits"], True


def describe(merged: Merged) -> str:
    """One line: how many records from how many workers."""
    parts = ", ".join(f"{w}: {n}" for w, n in sorted(merged.workers.items()))
    return f"{len(merged.records)} records from {len(merged.workers)} worker(s) ({parts})"


def _stopped_early(config: dict[str, Any]) -> list[str]:
    """Why the master stopped before its -t ended (Ctrl-C), as it noted in its config."""
    locust = config.get("load", {}).get("locust")
    why = locust.get("stopped_early") if isinstance(locust, dict) else None
    return [str(why)] if why else []


def finish_run(out_dir: str | os.PathLike[str]) -> tuple[Summary, Merged]:
    """Turn the run directory ``out_dir`` of a Locust master (its ``locust-config.json``
    and ``locust-records.jsonl``) into the usual run: ``config.json``,
    ``requests.jsonl`` and ``summary.json``, the summary computed as ``bench``'s is.
    Again and again if need be: the raw files are never changed. ``UsageError`` if they
    are missing or unreadable, or hold no record."""
    from inferlab.load.http import ServerGoneError
    from inferlab.load.run import run_summary
    from inferlab.workload.config import WorkloadConfig

    d = Path(out_dir)
    try:
        config = json.loads((d / CONFIG_FILE).read_text())
    except OSError as e:
        raise UsageError(f"{d} holds no Locust run ({CONFIG_FILE}: {e.strerror or e})") from e
    except ValueError as e:
        raise UsageError(f"{d / CONFIG_FILE} is not JSON: {e}") from e
    locust = config.get("load", {}).get("locust") if isinstance(config, dict) else None
    merged = merge(read_batches(d / RAW_FILE), locust.get("workers") or () if isinstance(locust, dict) else ())
    if not merged.records:  # (a run of no requests would stand for a measurement)
        raise UsageError(f"{d / RAW_FILE} holds no records: nothing to merge")
    config.setdefault("resolved", {})["workers"] = dict(sorted(merged.workers.items()))
    if config.get("model") is None:
        config["resolved"]["model"] = merged.model
    try:
        wcfg = WorkloadConfig(**config["workload"])
    except (KeyError, TypeError) as e:
        raise UsageError(f"{d / CONFIG_FILE}: no workload it can read ({e})") from e
    gone = [] if not merged.gone else [str(ServerGoneError(
        " or ".join(merged.gone), sum(r.ok for r in merged.records), str(d)))]
    early = _stopped_early(config)
    workers_early, ended = workers_stopped_early(merged)
    summary = run_summary(
        merged.records, None, config=config, slo=None, interrupted=bool(gone or early or ended), preflight=None,
        wcfg=wcfg, executor_warnings=[*gone, *early, *workers_early], server_gone=bool(gone),
    )
    summary = dataclasses.replace(summary, warnings=(*summary.warnings, *merge_warnings(merged)))
    write_run(d, config, merged, summary)
    return summary, merged
