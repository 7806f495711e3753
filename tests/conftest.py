"""What every test shares: the run history goes to a temporary file, never to the
user's data directory (subprocesses inherit the variable)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _history_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path_factory.mktemp("history") / "history.sqlite"
    monkeypatch.setenv("INFERLAB_HISTORY", str(path))
    return path
