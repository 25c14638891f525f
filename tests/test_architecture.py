"""The arrows between the rooms of gossip_accel (docs/ARCHITECTURE.md).

Every ``import`` statement of every module of the package is parsed with :mod:`ast` (module
level, inside functions, under ``TYPE_CHECKING``, relative and absolute) and resolved to the
module it loads. The test fails on an import cycle anywhere in the package and on an import of
the toolkit (data, models, asr, optim, bin, trainer, checkpoint, train) from the synchronizer
subpackage ``gossip_accel.sync``, which must stay a library that knows nothing of speech or text.

``python tests/test_architecture.py`` prints the graph and its cycles.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gossip_accel"
ROOT = "gossip_accel"
SYNC = f"{ROOT}.sync"
TOOLKIT = tuple(f"{ROOT}.{name}" for name in ("data", "models", "asr", "optim", "bin", "trainer", "checkpoint",
                                             "train"))


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package (``__init__`` = the package)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The deepest module of the package that ``name`` (a dotted path, maybe ending in an attribute) names."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``module`` imports anywhere in its file."""
    is_package = path.name == "__init__.py"
    base = module.split(".") if is_package else module.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                prefix = ".".join(anchor + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # ``from x import y``: y may be a submodule of x, or a name defined in x
            targets = [f"{prefix}.{alias.name}" for alias in node.names] or [prefix]
        else:
            continue
        for target in targets:
            resolved = _resolve(target, modules)
            if resolved is not None and resolved != module:
                out.add(resolved)
    return out


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    modules = module_files(package)
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                cycles.append(sorted(scc))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def _in(module: str, roots: tuple[str, ...]) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


def toolkit_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(synchronizer module, toolkit module) for every arrow from the synchronizer into the toolkit."""
    return sorted((m, t) for m, targets in graph.items() if _in(m, (SYNC,)) for t in targets if _in(t, TOOLKIT))


def test_the_graph_sees_relative_function_level_and_type_checking_imports(tmp_path):
    pkg = tmp_path / "gossip_accel"
    (pkg / "sync").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "trainer.py").write_text("from .sync import engine\n")
    (pkg / "sync" / "__init__.py").write_text("")
    (pkg / "sync" / "engine.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .core import Sync\n")
    (pkg / "sync" / "core.py").write_text("def f():\n    from ..trainer import x\n    import gossip_accel.sync.engine\n")
    graph = import_graph(pkg)
    assert graph["gossip_accel.sync.engine"] == {"gossip_accel.sync.core"}
    assert graph["gossip_accel.sync.core"] == {"gossip_accel.trainer", "gossip_accel.sync.engine"}
    assert find_cycles(graph) == [["gossip_accel.sync.core", "gossip_accel.sync.engine", "gossip_accel.trainer"]]
    assert toolkit_imports(graph) == [("gossip_accel.sync.core", "gossip_accel.trainer")]


def test_no_import_cycle_in_the_package():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles (each: the modules that import each other):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_the_synchronizer_imports_nothing_of_the_toolkit():
    graph = import_graph()
    assert SYNC in graph, f"the synchronizer subpackage {SYNC} is missing"
    bad = toolkit_imports(graph)
    assert not bad, "the synchronizer imports the toolkit:\n" + "\n".join(f"{m} -> {t}" for m, t in bad)


if __name__ == "__main__":
    g = import_graph()
    for m in sorted(g):
        print(f"{m} -> {', '.join(sorted(g[m])) or '-'}")
    print("cycles:", find_cycles(g) or "none")
    print("synchronizer -> toolkit:", toolkit_imports(g) or "none")
