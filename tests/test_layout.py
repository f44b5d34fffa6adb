"""The package's shape: no module imports another that imports it back (function-level imports count too),
every module says what it is for, and none grows into several concerns (the before-stop review flags
modules over ~450 lines)."""

from __future__ import annotations

import ast

from tests.conftest import REPO

PACKAGE = REPO / "bertdist"
MAX_LINES = 480
"""Lines of ruff-formatted code (the 450 of the hand-compacted style before `ruff format` became the rule, which
writes the same code 3-10% longer)."""


def modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        out[name] = ast.parse(path.read_text(), str(path))
    return out


def import_graph(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in trees}
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in trees and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [node, nxt] if nxt in path else [node, nxt]
            if nxt not in state and (cycle := visit(nxt, path + [node])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [])):
            return cycle
    return None


def test_no_import_cycle():
    assert find_cycle(import_graph(modules())) is None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_has_a_docstring_and_stays_small():
    for name, tree in modules().items():
        assert ast.get_docstring(tree), f"{name}: no module docstring saying what it is for"
    long = {
        str(p.relative_to(REPO)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_every_import_of_bertdist_names_something_that_exists():
    """Function-level imports (the package imports its heavy stages lazily) fail only when reached; a
    renamed or moved name must fail here instead, in the package, the benchmarks and the tests."""
    import importlib

    missing = []
    for path in sorted([*PACKAGE.rglob("*.py"), *(REPO / "benchmarks").glob("*.py"), *(REPO / "tests").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (
                isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("bertdist")
            ):
                continue
            if node.module.endswith("fill_mask_model"):
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        missing.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.module}.{alias.name}")
    assert not missing, "\n".join(missing)


def test_gpu_check_runs_every_file_of_gpu_marked_tests():
    """`make gpu-check` collects only the files it names (a GPU machine may lack Ray and MLflow): a new
    GPU-marked test file must be named there, or the check would pass without it."""
    import re
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_check import GPU_TESTS

    marked = {
        str(path.relative_to(REPO))
        for path in sorted((REPO / "tests").rglob("test_*.py"))
        if re.search(r"pytest\.mark\.gpu\b", path.read_text())
    }
    assert marked == set(GPU_TESTS)
