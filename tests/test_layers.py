"""Imports point one way (docs/architecture.md): a module imports only from its own
package and from the layers below its own. Every ``import`` counts, also one inside a
function or under ``TYPE_CHECKING``: a lazy import that points up is still an
upward dependency."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: Bottom first. Packages in one layer are peers: they may not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("inferlab._clock", "inferlab._cores", "inferlab._errors", "inferlab._loop", "inferlab._serverlog"),
    ("inferlab.openai",),
    ("inferlab.results",),
    ("inferlab.workload",),
    ("inferlab.client", "inferlab.sim.engine"),
    ("inferlab.sim.server", "inferlab.gateway"),
    ("inferlab.load",),
    ("inferlab.sim.validation", "inferlab.analysis", "inferlab.report", "inferlab.engines", "inferlab.sweep"),
    ("inferlab.cli",),
]
#: The public faces: package ``__init__``s that gather names from below, and the entry point.
TOP = {"inferlab", "inferlab.__main__", "inferlab.sim"}


def unit_of(module: str) -> tuple[int, str] | None:
    """(layer index, package) of a module: the longest package prefix in ``LAYERS``."""
    best: tuple[int, str] | None = None
    for i, layer in enumerate(LAYERS):
        for pkg in layer:
            if (module == pkg or module.startswith(pkg + ".")) and (best is None or len(pkg) > len(best[1])):
                best = (i, pkg)
    return best


def imports(source: str) -> list[str]:
    """Every inferlab module ``source`` imports (``from inferlab.x import y`` counts as
    ``inferlab.x``); a relative import comes back as ``"."`` (the code uses absolute
    imports only, so that this check reads every one)."""
    out: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == "inferlab"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                out.append(".")
            elif (node.module or "").split(".")[0] == "inferlab":
                out.append(node.module or "")
    return out


def violations(modules: dict[str, str]) -> list[str]:
    """Imports that break the layering, for ``{module name: source}``."""
    bad = []
    for name, source in sorted(modules.items()):
        if name in TOP:
            continue
        here = unit_of(name)
        if here is None:
            bad.append(f"{name} is in no layer (add its package to LAYERS)")
            continue
        for target in imports(source):
            there = unit_of(target)
            if target == ".":
                bad.append(f"{name} has a relative import (write it absolute)")
            elif there is None or target in TOP:
                bad.append(f"{name} imports {target}, which is not below it")
            elif there[1] != here[1] and there[0] >= here[0]:
                how = "a peer" if there[0] == here[0] else "a higher layer"
                bad.append(f"{name} imports {target} ({how})")
    return bad


def source_modules() -> dict[str, str]:
    out = {}
    for path in sorted((SRC / "inferlab").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path.read_text()
    return out


def test_imports_point_down() -> None:
    modules = source_modules()
    assert len(modules) > 50
    assert violations(modules) == []


@pytest.mark.parametrize(
    ("name", "source", "why"),
    [
        ("inferlab.results.metrics", "from inferlab.load.policy import Send", "a higher layer"),
        ("inferlab.client.http", "def f():\n    from inferlab.sim.engine import engine", "a peer"),
        ("inferlab.workload.spec", "if TYPE_CHECKING:\n    import inferlab.cli.main", "a higher layer"),
        ("inferlab.sim.engine.kvcache", "from ..server import app", "relative import"),
        ("inferlab.load.run", "from inferlab import bench_async", "not below it"),
        ("inferlab.foo.proxy", "import json", "no layer"),
        ("inferlab.gateway.app", "from inferlab.sim.server.app import SimServer", "a peer"),
    ],
)
def test_the_check_catches_a_wrong_import(name: str, source: str, why: str) -> None:
    (problem,) = violations({name: source})
    assert why in problem


def test_the_check_allows_imports_within_a_package_and_downwards() -> None:
    ok = {
        "inferlab.sim.engine.engine": "from inferlab.sim.engine.kvcache import KVCacheManager\nfrom inferlab._errors import UsageError",
        "inferlab.load.virtual": "from inferlab.sim.engine.engine import Engine\nfrom inferlab.workload.spec import RequestSpec",
        "inferlab.cli.main": "from inferlab.load.run import run\nfrom inferlab.report.console import render_summary",
    }
    assert violations(ok) == []


def test_the_architecture_doc_names_files_that_exist_and_every_package() -> None:
    text = (SRC.parent / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`([\w/]+/[\w/]*(?:\.py|\.json)?)`", text))
    assert len(named) > 30
    package = SRC / "inferlab"
    missing = [p for p in named if not (package / p).exists() and not (SRC.parent / p).exists()]
    assert missing == []
    for layer in LAYERS:
        for pkg in layer:
            assert f"`{pkg.removeprefix('inferlab.')}`" in text, f"{pkg} is not in docs/architecture.md's layer table"
