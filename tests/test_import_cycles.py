"""No import cycles between the modules of tpuctl/: two modules that import each other (however
indirectly, inside functions or TYPE_CHECKING blocks too) cannot be read, tested or moved
alone. The strongly connected components of the import graph are all single modules, except
the cycles listed in KNOWN_CYCLES, which are on their way out: the list may only shrink."""

from __future__ import annotations

from pathlib import Path

from tests.test_layers import PACKAGE, imports

# Cycles that existed once, each removed since: the set stays empty (never add one).
KNOWN_CYCLES: set[frozenset[str]] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Every module of tpuctl/ → the modules of tpuctl/ it imports (not itself)."""
    paths = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
    return {
        name: {imported for _, imported in imports(path) if imported in paths} - {name}
        for name, path in paths.items()
    }


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one node (Tarjan, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.add(frozenset(component))
    return found


def _show(components: set[frozenset[str]]) -> str:
    return "; ".join(sorted(" <-> ".join(sorted(component)) for component in components))


def test_no_module_is_in_an_import_cycle() -> None:
    new = cycles(import_graph()) - KNOWN_CYCLES
    assert not new, f"import cycles between modules: {_show(new)}"


def test_every_known_cycle_still_exists() -> None:
    gone = KNOWN_CYCLES - cycles(import_graph())
    assert not gone, f"gone (or changed), drop them from KNOWN_CYCLES: {_show(gone)}"


def test_the_emulator_parts_import_one_way() -> None:
    """client, api, control, vms: no part imports one that imports it back."""

    def part(name: str) -> str:
        return ".".join(name.split(".")[:3])

    graph: dict[str, set[str]] = {}
    for name, imported in import_graph().items():
        if name.startswith("tpuctl.emulator."):
            graph.setdefault(part(name), set()).update(
                part(other) for other in imported if other.startswith("tpuctl.emulator.")
            )
    graph = {name: targets - {name} for name, targets in graph.items()}
    assert {"tpuctl.emulator.api", "tpuctl.emulator.control"} <= set(graph)
    assert not cycles(graph), f"emulator parts in a cycle: {_show(cycles(graph))}"


def test_the_search_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert cycles(graph) == {frozenset("abc"), frozenset("de")}
    assert cycles({"a": {"b"}, "b": set()}) == set()


def test_the_graph_sees_a_module_imported_by_name() -> None:
    # `from tpuctl.emulator.vms import vm` and lazy imports inside functions are edges too.
    graph = import_graph()
    assert "tpuctl.emulator.vms.vm" in graph["tpuctl.emulator.vms.workers"]
    assert "tpuctl.emulator.vms.sshd_asyncssh" in graph["tpuctl.emulator.vms.workers"]
