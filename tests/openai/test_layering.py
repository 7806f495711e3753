"""``inferlab.openai`` sits at the bottom of the layers (docs/architecture.md): of inferlab it imports
only ``inferlab._errors``, and nothing outside the standard library (but orjson, the
``fast`` extra's decoder, where it is installed), so the client, the simulated server and
the gateway can all share it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import inferlab.openai

PACKAGE = Path(inferlab.openai.__file__).parent
#: Imported only inside ``try: ... except ImportError`` (an optional extra).
OPTIONAL = ("orjson",)


def imported_modules(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            assert node.module is not None
            names.append(node.module)
    return names


def test_openai_imports_only_errors_and_the_standard_library() -> None:
    files = sorted(PACKAGE.glob("*.py"))
    assert {f.name for f in files} >= {"__init__.py", "sse.py", "request.py", "response.py", "errors.py"}
    for path in files:
        for name in imported_modules(path):
            top = name.split(".")[0]
            if top == "inferlab":
                assert name == "inferlab._errors" or name.startswith("inferlab.openai."), f"{path.name} imports {name}"
            else:
                assert top in sys.stdlib_module_names or top in ("__future__", *OPTIONAL), f"{path.name} imports {name}"


def test_the_layering_check_sees_imports() -> None:
    names = imported_modules(PACKAGE / "response.py")
    assert "inferlab.openai.sse" in names and "json" in names
