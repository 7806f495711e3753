"""The cores a run may use: the process's CPU affinity and its cgroup's quota, not the
machine's count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from inferlab import _cores

needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")


@pytest.mark.parametrize(("cpu_max", "bound"), [("max 100000\n", None), ("100000 100000\n", 1),
                                                ("150000 100000\n", 2), ("garbage\n", None)])
def test_a_cgroup_quota_bounds_the_cores(tmp_path: Path, cpu_max: str, bound: int | None) -> None:
    path = tmp_path / "cpu.max"
    path.write_text(cpu_max)
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    assert _cores.usable_cores(str(path)) == (affinity if bound is None else min(affinity, bound))
    assert _cores.usable_cores(str(tmp_path / "absent")) == affinity


@needs_affinity
def test_workers_beyond_the_cores_this_process_may_use_are_refused() -> None:
    # `taskset -c 0 inferlab bench --workers 2` on a machine of more cores: refused
    # before any server is asked (port 9 on loopback: nothing listens)
    one = {min(os.sched_getaffinity(0))}
    done = subprocess.run(
        [sys.executable, "-m", "inferlab", "bench", "--url", "http://127.0.0.1:9", "--model", "m", "-n", "1",
         "--workers", "2", "--no-preflight"],
        preexec_fn=lambda: os.sched_setaffinity(0, one), capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(_cores.__file__).parents[1])},
    )
    assert done.returncode == 2, done.stderr
    assert "--workers 2 is more than the 1 core this process may run on" in done.stderr


def test_the_workers_help_names_the_cores_this_process_may_run_on() -> None:
    from click.testing import CliRunner

    from inferlab.cli.main import main

    text = " ".join(CliRunner().invoke(main, ["bench", "--help"], terminal_width=400).output.split())
    assert "at most the cores this process may run on: its CPU affinity and cgroup quota" in text
    assert "machine's cores" not in text
