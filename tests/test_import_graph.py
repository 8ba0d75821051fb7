"""No import circles between the modules of jobs, knowledge_base and remediation: the
graph of their imports of each other (read with ``ast``, imports inside functions
included, ``if TYPE_CHECKING:`` blocks left out) has no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("jobs", "knowledge_base", "remediation")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that the module ``name`` (file ``path``) imports."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if _type_checking_only(child):
                stack.extend(child.orelse)  # the else branch runs
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join([*up, base] if base else up)
                for a in child.names:  # `from pkg import mod` imports the module pkg.mod
                    found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
            stack.append(child)
    return {m for m in found if m in known and m != name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return [*path[path.index(m):], m]
            if m not in state and (c := visit(m)):
                return c
        state[n] = 2
        path.pop()
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_the_cycle_finder_sees_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_graph_sees_function_level_imports(tmp_path: Path) -> None:
    p = tmp_path / "x.py"
    p.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import jobs.b\n"
                 "def f():\n    from jobs import a\n    from .c import g\n")
    assert _imports(p, "jobs.x", {"jobs.a", "jobs.b", "jobs.c", "jobs.x"}) == {"jobs.a", "jobs.c"}


def test_no_import_cycles_in_jobs_knowledge_base_remediation() -> None:
    mods = _modules()
    assert "jobs.cli" in mods and "knowledge_base.detector" in mods and "remediation.queue" in mods
    graph = {name: _imports(path, name, set(mods)) for name, path in mods.items()}
    assert sum(map(len, graph.values())) > 50  # the reader sees the imports
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
