"""The emulator stands beside the product: of tpuctl it imports only itself, topology and
errors (DESIGN.md), so it never depends on the code it is there to test."""

from __future__ import annotations

import ast
from pathlib import Path

import tpuctl.emulator

ALLOWED = ("tpuctl.emulator", "tpuctl.topology", "tpuctl.errors")


def _tpuctl_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {name for name in names if name == "tpuctl" or name.startswith("tpuctl.")}


def test_the_emulator_imports_only_itself_topology_and_errors() -> None:
    package = Path(tpuctl.emulator.__file__).parent
    modules = sorted(package.glob("*.py"))
    assert len(modules) > 10
    outside = {
        f"{path.name}: {name}"
        for path in modules
        for name in _tpuctl_imports(path)
        if not any(name == allowed or name.startswith(f"{allowed}.") for allowed in ALLOWED)
    }
    assert sorted(outside) == []
