"""Where engines' builds and generated models are kept, and how they are made once.

The cache is per machine: ``$INFERLAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/inferlab``,
else ``~/.cache/inferlab``. An entry appears whole or not at all (made under a temporary
name, then renamed), and ``made_once`` holds a file lock while making it, so two
processes asking at once (two test sessions) make it once and both get it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


def cache_dir() -> Path:
    """The machine's inferlab cache directory (created if missing)."""
    root = os.environ.get("INFERLAB_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(xdg, "inferlab")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # (released when the file closes, also on a crash)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def made_once(path: Path, make: Callable[[Path], None]) -> Path:
    """``path``, made by ``make(tmp)`` if it does not exist yet: ``make`` writes a file or
    directory at ``tmp`` (a fresh name beside ``path``), which is then renamed to
    ``path``. Returns at once when ``path`` exists; whatever ``make`` raises propagates,
    and its partial output is removed."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.with_name(path.name + ".lock")):
        if path.exists():  # made by another process while this one waited
            return path
        tmp = Path(tempfile.mkdtemp(prefix=path.name + ".tmp-", dir=path.parent))
        out = tmp / path.name
        try:
            make(out)
            os.replace(out, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return path
