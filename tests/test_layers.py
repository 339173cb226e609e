"""The house plan, enforced: every import in tpuctl/ (inside functions and TYPE_CHECKING blocks
too) points down `cli → jobs → (cloud, fanout, storage, render) → (spec, worker, topology, …)`,
the emulator stands beside it importing only the bottom layer, and nothing below cli/ imports
click or rich or calls sys.exit."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tpuctl"
BOTTOM = {"errors", "clock", "envelope", "files", "worker", "topology", "plan", "spec", "__init__"}
MIDDLE = {"cloud", "fanout", "storage", "render"}
RANK = {**dict.fromkeys(BOTTOM, 0), **dict.fromkeys(MIDDLE, 1), "jobs": 2, "cli": 3}
RANK["__main__"] = 4  # `python -m tpuctl`: the entry point above the CLI
# The emulator is a test double of Cloud TPU beside the product: it may use only these. The
# clock is among them for its one duration grammar, which the emulator's flags and admin
# calls read as tpuctl's own flags and specs do (the clock module is pure, standard library).
EMULATOR_MAY_IMPORT = {"emulator", "topology", "errors", "clock", "__init__"}
CLI_ONLY = ("click", "rich")


def _part(name: str) -> str:
    """The first component under tpuctl (a package or a top-level module)."""
    return name.split(".")[1] if name.count(".") else "__init__"


def _own_part(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0].removesuffix(".py") if len(relative.parts) else "__init__"


@functools.cache
def syntax_tree(path: Path) -> ast.Module:
    """The module at `path`, parsed once per test process (the tests here and in
    test_import_cycles read each of the ~200 modules several times)."""
    return ast.parse(path.read_text(encoding="utf-8"))


@functools.cache
def imports(path: Path) -> tuple[tuple[int, str], ...]:
    """Every module `path` imports (absolute names), wherever the import statement is."""
    tree = syntax_tree(path)
    package = ".".join(("tpuctl", *path.relative_to(PACKAGE).parent.parts))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            # `from tpuctl import jobs` names a package and `from tpuctl.emulator.vms import vm`
            # a module, not an attribute: listed as such (attributes name no module, and share
            # their module's part).
            if module == "tpuctl" or module.startswith("tpuctl."):
                found += [
                    (node.lineno, f"{module}.{alias.name}")
                    for alias in node.names
                    if not alias.name.startswith("__")
                ]
    return tuple(found)


def allowed(importer: str, imported: str) -> bool:
    if importer == imported:
        return True
    if importer == "emulator":
        return imported in EMULATOR_MAY_IMPORT
    if imported == "emulator":
        return importer == "cli"  # `tpuctl emulator …` and the drill's admin client
    if importer in BOTTOM and imported in BOTTOM:
        return True
    return RANK[imported] < RANK[importer]


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PACKAGE)) for p in MODULES])
def test_imports_point_down(path: Path) -> None:
    importer = _own_part(path)
    wrong = [
        f"line {line}: {name}"
        for line, name in imports(path)
        if name.startswith("tpuctl.") and not allowed(importer, _part(name))
    ]
    assert not wrong, (
        f"{path.relative_to(PACKAGE)} ({importer}) imports against the layers: {wrong}"
    )


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PACKAGE)) for p in MODULES])
def test_only_the_cli_imports_click_or_rich_or_exits(path: Path) -> None:
    if _own_part(path) == "cli":
        return
    names = [name for _, name in imports(path)]
    assert not [n for n in names if n.split(".")[0] in CLI_ONLY], path
    tree = syntax_tree(path)
    exits = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == "exit"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    ]
    assert not exits, f"{path.relative_to(PACKAGE)} calls sys.exit at lines {exits}"


def test_the_rule_catches_a_wrong_import() -> None:
    assert not allowed("cloud", "fanout")
    assert not allowed("render", "storage")
    assert not allowed("jobs", "cli")
    assert not allowed("spec", "cloud")
    assert not allowed("emulator", "cloud")
    assert not allowed("jobs", "emulator")
    assert allowed("jobs", "cloud") and allowed("cli", "jobs") and allowed("cli", "emulator")
    assert allowed("storage", "worker") and allowed("spec", "worker")
