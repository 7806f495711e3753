"""The README's two commands are the ones that work: the first ends by running
``inferlab bench`` (exercised for real in test_bench_sim.py), the second is exactly
what CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_readme_has_exactly_the_two_commands() -> None:
    cmds = readme_commands()
    assert len(cmds) == 2
    run, test = cmds
    assert run.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install . &&")
    assert run.endswith("inferlab bench")
    assert "pip install -e '.[test]'" in test and test.endswith("python -m pytest")


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    steps = readme_commands()[1].split(" && ")
    lines = [ln.strip() for ln in ci.splitlines() if ln.strip() and not ln.startswith("#")]
    positions = []
    for step in steps:
        matches = [i for i, ln in enumerate(lines) if step in (ln, ln.replace(" -q", ""))]
        assert matches, f".ci/run does not run {step!r}"
        positions.append(matches[0])
    assert positions == sorted(positions), ".ci/run runs the README's steps out of order"


def test_the_library_example_runs() -> None:
    """The README's library snippet, against the simulated server on a free port and
    with fewer requests (the rest as printed)."""
    from inferlab.sim.engine.engine import EngineConfig
    from inferlab.sim.server.app import ServerConfig
    from inferlab.sim.server.launch import EmbeddedServer

    text = (ROOT / "README.md").read_text()
    section = text.split("## As a library", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    assert "http://127.0.0.1:8000" in code and "num_requests=200" in code
    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=4096))) as server:
        code = code.replace("http://127.0.0.1:8000", server.url).replace("num_requests=200", "num_requests=8")
        namespace: dict[str, object] = {}
        exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["predicted"].summary.counts.completed == 8  # type: ignore[attr-defined]
    assert namespace["measured"].summary.counts.completed == 8  # type: ignore[attr-defined]
