"""DeepSpeed imported without MLflow, and every import of it in bertdist going that way."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

from tests.conftest import REPO

PACKAGE = REPO / "bertdist"


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
        timeout=120,
    )


def test_deepspeed_comes_without_mlflow_which_still_imports_afterwards():
    """A fresh process, as every rank is: DeepSpeed's autotuner does not pull MLflow in (~half of the import)."""
    done = _run(
        "import sys\n"
        "from bertdist.train.deepspeed_package import import_deepspeed\n"
        "import_deepspeed()\n"
        "from deepspeed.ops.adam import FusedAdam\n"
        "assert 'deepspeed' in sys.modules and 'mlflow' not in sys.modules, 'mlflow imported'\n"
        "import mlflow\n"
        "print(mlflow.__name__)\n"
    )
    assert done.returncode == 0 and done.stdout.strip() == "mlflow", done.stderr[-2000:]


def test_an_mlflow_already_imported_is_left_in_place():
    done = _run(
        "import sys, mlflow\n"
        "from bertdist.train.deepspeed_package import import_deepspeed\n"
        "import_deepspeed()\n"
        "assert sys.modules['mlflow'] is mlflow\n"
    )
    assert done.returncode == 0, done.stderr[-2000:]


def _runtime_imports_of_deepspeed(tree: ast.Module) -> list[tuple[ast.AST, list[ast.AST]]]:
    """(import node, its enclosing function bodies' statements, innermost first) for each import of deepspeed
    that is not under `if TYPE_CHECKING:`."""
    found = []

    def visit(node: ast.AST, enclosing: list[ast.AST]) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if any(n == "deepspeed" or n.startswith("deepspeed.") for n in names):
                found.append((node, enclosing))
        inner = [*enclosing, node] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else enclosing
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, [])
    return found


def _calls_import_deepspeed_before(function: ast.AST, line: int) -> bool:
    return any(
        isinstance(n, ast.Call)
        and getattr(n.func, "id", getattr(n.func, "attr", None)) == "import_deepspeed"
        and n.lineno < line
        for n in ast.walk(function)
    )


def test_every_import_of_deepspeed_in_the_package_goes_through_import_deepspeed_first():
    """A new `from deepspeed... import` placed before any call of import_deepspeed brings MLflow back into every
    rank; this names it. The helper's own module is the one place allowed a plain import."""
    unguarded = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "deepspeed_package.py":
            continue
        for node, functions in _runtime_imports_of_deepspeed(ast.parse(path.read_text())):
            if not functions or not _calls_import_deepspeed_before(functions[-1], node.lineno):
                unguarded.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not unguarded, unguarded
    assert _runtime_imports_of_deepspeed(ast.parse((PACKAGE / "train" / "extensions.py").read_text()))  # it sees them


def test_the_guard_names_an_import_that_comes_first():
    tree = ast.parse("def f():\n    from deepspeed.ops.adam import FusedAdam\n    import_deepspeed()\n")
    [(node, functions)] = _runtime_imports_of_deepspeed(tree)
    assert not _calls_import_deepspeed_before(functions[-1], node.lineno)
