"""Where engines' builds and generated models are kept, and how they are made once.

The cache is per machine: ``$INFERLAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/inferlab``,
else ``~/.cache/inferlab``. An entry appears whole or not at all (made under a temporary
name, then renamed), and ``made_once`` holds a file lock while making it, so two
processes asking at once (two test sessions) make it once and both get it.
``venv_made_once`` does the same for a Python virtual environment, whose scripts name
their own folder and so are rewritten to name the final one before the rename.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
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


def venv_made_once(path: Path, make: Callable[[Path], None]) -> Path:
    """``made_once`` for a Python virtual environment that ``make(tmp)`` creates (``python
    -m venv tmp``, then installs into it). A venv is not relocatable: pip writes each
    console script's ``#!`` line, and ``venv`` its ``activate`` scripts, with the folder
    it was made in, so before the rename every file in ``bin/`` (and ``pyvenv.cfg``) that
    names ``tmp`` is rewritten to name ``path``: the scripts run from there, and the
    environment still appears whole or not at all. One made by a release that did not do
    this (its scripts naming a ``PATH.tmp-*`` folder long gone) is repaired in place,
    under the same lock."""
    path = Path(os.path.abspath(path))  # (what the scripts name must not depend on the working folder)

    def make_here(tmp: Path) -> None:
        make(tmp)
        _name_final_path(tmp, path)

    made_once(path, make_here)
    if _stale_files(path):
        with _locked(path.with_name(path.name + ".lock")):
            _name_final_path(path, path)
    return path


def _build_dir(path: Path) -> re.Pattern[str]:
    """Where ``made_once`` makes ``path`` (``PATH.tmp-XXXX/NAME``), as a pattern."""
    return re.compile(re.escape(str(path)) + r"\.tmp-[^/\s\"']+/" + re.escape(path.name) + r"(?![^/\s\"'])")


def _venv_texts(venv: Path) -> list[Path]:
    """The files of a venv that name its folder: its ``bin/`` scripts and ``pyvenv.cfg``
    (not links: ``bin/python`` points at the base interpreter)."""
    files = [f for f in (venv / "bin").iterdir() if f.is_file() and not f.is_symlink()] if (venv / "bin").is_dir() else []
    return [*files, venv / "pyvenv.cfg"]


def _stale_files(venv: Path) -> list[Path]:
    """The files of ``venv`` that name a folder it was made in rather than itself."""
    pattern = _build_dir(venv)
    return [f for f in _venv_texts(venv) if f.is_file() and pattern.search(f.read_bytes().decode("latin-1"))]


def _name_final_path(venv: Path, final: Path) -> None:
    """Rewrite the files of ``venv`` (made at ``venv`` or renamed from a ``final.tmp-*``
    folder) that name that folder to name ``final``; each file is replaced whole (a
    script being run meanwhile reads the old or the new one), its mode kept."""
    pattern = _build_dir(final)
    for f in _venv_texts(venv):
        if not f.is_file():
            continue
        text = f.read_bytes().decode("latin-1")  # (bytes as they are: a binary is left as it was)
        new = pattern.sub(lambda _: str(final), text)
        if new == text:
            continue
        tmp = f.with_name(f.name + ".inferlab-tmp")
        tmp.write_bytes(new.encode("latin-1"))
        shutil.copymode(f, tmp)
        os.replace(tmp, f)
