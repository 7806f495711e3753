"""The run directory: ``config.json``, ``requests.jsonl`` (appended as requests finish),
``summary.json`` (written atomically at the end, also after an interruption)."""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from inferlab._errors import UsageError
from inferlab.results.records import RequestRecord
from inferlab.results.summary import Summary
from inferlab.results.telemetry import SERVER_METRICS_FILE


class RunWriter:
    """Writes one run directory. Each record is flushed as soon as it is appended, so an
    interrupted run keeps every request it measured."""

    def __init__(self, out_dir: str | os.PathLike[str], config: dict[str, Any], *, overwrite: bool = False) -> None:
        """``UsageError`` if ``out_dir`` cannot be written, or already holds a run and
        ``overwrite`` is off (``check_out_dir``)."""
        self.dir = Path(out_dir)
        check_out_dir(self.dir, overwrite)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            if overwrite:  # the replaced run's server pages: this run writes its own, or none
                (self.dir / SERVER_METRICS_FILE).unlink(missing_ok=True)
            _write_json(self.dir / "config.json", config)
            self._requests: IO[str] | None = open(self.dir / "requests.jsonl", "w")  # noqa: SIM115
        except OSError as e:
            raise UsageError(f"cannot write results to {self.dir}: {e.strerror or e}") from e

    def append(self, record: RequestRecord) -> None:
        if self._requests is not None:
            self._requests.write(json.dumps(record.to_json(), separators=(",", ":")) + "\n")
            self._requests.flush()

    def write_summary(self, summary: Summary) -> Path:
        return write_summary(self.dir, summary)

    def write_jsonl(self, name: str, rows: Sequence[Any]) -> Path:
        """Another file of the run (``name`` in its folder), one JSON value a line."""
        path = self.dir / name
        try:
            path.write_text("".join(json.dumps(plain_json(r), separators=(",", ":")) + "\n" for r in rows))
        except OSError as e:
            raise UsageError(f"cannot write {path}: {e.strerror or e}") from e
        return path

    def close(self) -> None:
        if self._requests is not None:
            self._requests.close()
            self._requests = None


#: The files that make a folder a run directory.
RUN_FILES = ("config.json", "requests.jsonl", "summary.json")


def check_out_dir(out_dir: str | os.PathLike[str], overwrite: bool = False, *, setting: str = "--out",
                  remedy: str = "give another folder, or --overwrite") -> None:
    """``UsageError`` if ``out_dir`` is a file, or holds a run already (one of
    ``RUN_FILES``) and ``overwrite`` is off: a second run must not replace a first one
    silently. The message names the folder as ``setting`` and ends with ``remedy``
    (a command's own flags)."""
    d = Path(out_dir)
    if d.exists() and not d.is_dir():
        raise UsageError(f"{setting} {d}: not a directory")
    held = [f for f in RUN_FILES if (d / f).exists()]
    if held and not overwrite:
        raise UsageError(f"{setting} {d} already holds a run ({', '.join(held)}): {remedy}")


def plain_json(obj: Any) -> Any:
    """``obj`` as plain JSON values: other objects as their ``str()``, an infinite float
    as ``"inf"``/``"-inf"`` and NaN as ``null`` (JSON has neither: ``Infinity`` breaks
    ``JSON.parse`` and ``jq``)."""
    if isinstance(obj, float):
        if math.isnan(obj):
            return None
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, dict):
        return {str(k): plain_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain_json(v) for v in obj]
    return str(obj)


def dumps(obj: Any, indent: int | None = 2) -> str:
    """JSON text of ``obj`` (``plain_json`` first): never ``NaN`` or ``Infinity``."""
    return json.dumps(plain_json(obj), indent=indent, allow_nan=False)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(dumps(obj) + "\n")
    os.replace(tmp, path)


def write_summary(run_dir: str | os.PathLike[str], summary: Summary) -> Path:
    """Write (or replace) a run directory's ``summary.json``, atomically; its path."""
    path = Path(run_dir) / "summary.json"
    _write_json(path, summary.to_json())
    return path


#: The first bytes of compressed files people hand over instead of the text inside.
_COMPRESSED = ((b"\x1f\x8b", "gzip-compressed"), (b"PK\x03\x04", "a zip archive"), (b"\x28\xb5\x2f\xfd", "zstd-compressed"), (b"BZh", "bzip2-compressed"))


def not_text_error(path: str | os.PathLike[str], e: UnicodeDecodeError, expected: str) -> UsageError:
    """The one-line error for a file that should be text (``expected``, e.g. "JSONL or
    CSV") but is not UTF-8: a compressed file is named as such (decompress it first),
    anything else by the undecodable byte met."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        head = b""
    kind = next((name for magic, name in _COMPRESSED if head.startswith(magic)), None)
    if kind is not None:
        return UsageError(f"{path}: the file is {kind}: decompress it first (expected {expected})")
    # (``e.start`` counts from the start of the chunk read, not of the file: not shown)
    bad = e.object[e.start:e.start + 1].hex() if isinstance(e.object, bytes) else "?"
    return UsageError(f"{path}: not a text file (it holds byte 0x{bad}, which is not UTF-8): expected {expected}")


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
    except UnicodeDecodeError as e:
        raise not_text_error(path, e, "an inferlab requests.jsonl") from e
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror or e}") from e
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
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # (AttributeError: a list or a string where an object was)
        raise UsageError(f"{path}: not an inferlab summary ({e!r})") from e
