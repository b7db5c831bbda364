"""No two modules of dagrl or of a service import each other, directly or around a circle:
a circle means neither can be read (or imported) without the other. Every import counts, also
inside functions and under TYPE_CHECKING; `from package import submodule` counts as an import of
the submodule only.

Nor does an import climb back up: inside every package, its parts (its subpackages and its
modules, each subpackage standing for everything below it) import each other without a circle,
so each part can be read with only the parts below it. And the worker's three parts are
layered: the driver (`dagrl_worker.driver`) may import the rank side (`dagrl_worker.rank`, the
actors it starts) and `dagrl_worker.shared`; the rank side only `dagrl_worker.shared`; shared
neither."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _modules() -> dict[str, Path]:
    modules = {}
    for base in [ROOT / "libs", *ROOT.glob("services/*/src")]:
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if parts and parts[0] != "tests" and "gen" not in parts:
                modules[".".join(parts)] = path
    return modules


def _imported(node: ast.AST, package: str, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        source = ".".join([*base, *([node.module] if node.module else [])])
    else:
        source = node.module or ""
    submodules = [f"{source}.{alias.name}" for alias in node.names]
    return submodules if all(s in modules for s in submodules) else [source, *submodules]


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _imported(node, package, modules):
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def package_graphs(graph: dict[str, set[str]]) -> dict[str, dict[str, set[str]]]:
    """For each package, the graph of its direct parts: module `p.a.x` importing `p.b.y` is an
    edge `p.a -> p.b` of package `p`."""
    packages = {".".join(name.split(".")[:depth]) for name in graph
                for depth in range(1, name.count(".") + 1)}
    result: dict[str, dict[str, set[str]]] = {}
    for package in sorted(packages):
        prefix = package + "."

        def part(module: str, prefix: str = prefix) -> str | None:
            if not module.startswith(prefix):
                return None
            return prefix + module[len(prefix):].split(".")[0]

        parts: dict[str, set[str]] = {}
        for module, targets in graph.items():
            source = part(module)
            if source is None:
                continue
            parts.setdefault(source, set())
            for target in targets:
                into = part(target)
                if into is not None and into != source:
                    parts[source].add(into)
        result[package] = parts
    return result


def edges_between(graph: dict[str, set[str]], source: str, target: str) -> list[str]:
    """The module imports behind a part-level edge `source -> target`, for the message."""
    return [f"{module} -> {imported}" for module, imports in sorted(graph.items())
            if module == source or module.startswith(source + ".")
            for imported in sorted(imports)
            if imported == target or imported.startswith(target + ".")]


def test_the_finder_sees_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_itself_around_a_circle() -> None:
    graph = import_graph()
    assert {"dagrl.envs.base", "dagrl_worker.rank.dag_worker",
            "dagrl_scheduler.manager"} <= set(graph)
    assert circles(graph) == []


def test_no_import_climbs_back_up_inside_a_package() -> None:
    graph = import_graph()
    climbs = {}
    for package, parts in package_graphs(graph).items():
        for circle in circles(parts):
            climbs[package] = {f"{a} -> {b}": edges_between(graph, a, b)
                               for a in circle for b in sorted(parts[a]) if b in circle}
    assert climbs == {}


def test_the_finder_sees_a_climb_between_two_subpackages() -> None:
    graph = {"p.a.x": {"p.b.y"}, "p.b.y": set(), "p.b.z": {"p.a.w"}, "p.a.w": set()}
    assert circles(package_graphs(graph)["p"]) == [["p.a", "p.b"]]


def test_the_worker_is_layered_driver_over_rank_over_shared() -> None:
    graph = import_graph()
    allowed = {"dagrl_worker.driver": {"dagrl_worker.rank", "dagrl_worker.shared"},
               "dagrl_worker.rank": {"dagrl_worker.shared"},
               "dagrl_worker.shared": set()}
    parts = package_graphs(graph)["dagrl_worker"]
    assert set(allowed) <= set(parts)
    for part, may_import in allowed.items():
        assert parts[part] - {part} <= may_import, edges_between(
            graph, part, next(iter(parts[part] - may_import)))
