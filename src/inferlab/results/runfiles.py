"""The run directory: ``config.json``, ``requests.jsonl`` (appended as requests finish),
``summary.json`` (written atomically at the end, also after an interruption)."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from inferlab._errors import UsageError
from inferlab.results.records import RequestRecord
from inferlab.results.summary import Summary


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

    def write_summary(self, summary: Summary) -> Path:
        path = self.dir / "summary.json"
        _write_json(path, summary.to_json())
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
    """Records from a ``requests.jsonl``, in file order; see ``numbered_records``."""
    return (r for _, r in numbered_records(path))


def numbered_records(path: str | os.PathLike[str]) -> Iterator[tuple[int, RequestRecord]]:
    """``(line number, record)`` from a ``requests.jsonl``, in file order.

    A last line cut short (a run killed while writing it: no newline at its end, not
    JSON) is skipped with a warning (``warnings.warn``). Any other line that is not a
    request record raises ``UsageError`` naming the file and line; so does a file that
    cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: {getattr(e, 'strerror', None) or e}") from e
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield n, RequestRecord.from_json(json.loads(line))
        except (ValueError, TypeError, AttributeError) as e:
            if n == len(lines) and not line.endswith("\n"):
                warnings.warn(f"{path}:{n}: the last line is cut short (a run killed while writing it); skipped", stacklevel=2)
                return
            raise UsageError(f"{path}:{n}: not a request record ({e})") from e


def read_summary(path: str | os.PathLike[str]) -> Summary:
    """A ``summary.json`` read back; ``UsageError`` if it is not one."""
    try:
        return Summary.from_json(json.loads(Path(path).read_text()))
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror or e}") from e
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{path}: not an inferlab summary ({e!r})") from e
