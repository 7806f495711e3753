"""The strict type check and the linter run with the tests: annotations are part of each
function's contract, so they are checked like the rest of it. Skipped only when the
tools are not installed (they are test extras)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> list[str]:
    if shutil.which(name) is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return [sys.executable, "-m", name]


def test_mypy_strict_passes() -> None:
    p = subprocess.run([*_tool("mypy"), "--no-incremental"], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stdout + p.stderr


def test_ruff_passes() -> None:
    p = subprocess.run([*_tool("ruff"), "check", "src", "tests", "bench"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
