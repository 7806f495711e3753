"""The run directory: ``config.json``, ``requests.jsonl`` (appended as requests finish),
``summary.json`` (written atomically at the end, also after an interruption)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from inferlab._errors import UsageError
from inferlab.results.records import RequestRecord


class RunWriter:
    """Writes one run directory. Each record is flushed as soon as it is appended, so an
    interrupted run keeps every request it measured."""

    def __init__(self, out_dir: str | os.PathLike[str], config: dict[str, Any]) -> None:
        self.dir = Path(out_dir)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            _write_json(self.dir / "config.json", config)
            self._requests: IO[str] | None = open(self.dir / "requests.jsonl", "w")  # noqa: SIM115
        except OSError as e:
            raise UsageError(f"cannot write results to {self.dir}: {e.strerror or e}") from e

    def append(self, record: RequestRecord) -> None:
        if self._requests is not None:
            self._requests.write(json.dumps(record.to_json(), separators=(",", ":")) + "\n")
            self._requests.flush()

    def write_summary(self, summary: dict[str, Any]) -> Path:
        path = self.dir / "summary.json"
        _write_json(path, summary)
        return path

    def close(self) -> None:
        if self._requests is not None:
            self._requests.close()
            self._requests = None


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def read_records(path: str | os.PathLike[str]) -> Iterator[RequestRecord]:
    """Records from a ``requests.jsonl``; a torn last line (killed mid-write) is skipped."""
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                yield RequestRecord.from_json(json.loads(line))
            except (ValueError, TypeError):
                continue
