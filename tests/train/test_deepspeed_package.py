"""DeepSpeed imported without MLflow, and every import of it in bertdist going that way."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

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


def _imports_deepspeed(statement: ast.stmt) -> bool:
    """An import statement naming deepspeed, or a simple statement calling importlib.import_module or
    __import__ with a name of it."""
    if isinstance(statement, ast.Import):
        return any(a.name.split(".")[0] == "deepspeed" for a in statement.names)
    if isinstance(statement, ast.ImportFrom):
        return (statement.module or "").split(".")[0] == "deepspeed"
    if isinstance(statement, (ast.Expr, ast.Assign, ast.AnnAssign, ast.Return)):
        return any(
            isinstance(n, ast.Call)
            and getattr(n.func, "id", getattr(n.func, "attr", None)) in ("import_module", "__import__")
            and n.args
            and isinstance(n.args[0], ast.Constant)
            and str(n.args[0].value).split(".")[0] == "deepspeed"
            for n in ast.walk(statement)
        )
    return False


def _calls_import_deepspeed(statement: ast.stmt) -> bool:
    value = statement.value if isinstance(statement, (ast.Expr, ast.Assign)) else None
    return isinstance(value, ast.Call) and getattr(value.func, "id", None) == "import_deepspeed"


def _unguarded_imports(tree: ast.Module) -> list[int]:
    """Lines of the imports of deepspeed not directly preceded, in their block, by `import_deepspeed()` (or by an
    import of deepspeed that is); the body of `if TYPE_CHECKING:` imports nothing at run time."""
    found = []

    def block(statements: list[ast.stmt]) -> None:
        guarded = False
        for statement in statements:
            if _imports_deepspeed(statement):
                if not guarded:
                    found.append(statement.lineno)
                guarded = True
                continue
            guarded = _calls_import_deepspeed(statement)
            type_checking = isinstance(statement, ast.If) and getattr(statement.test, "id", None) == "TYPE_CHECKING"
            for field in ("body", "orelse", "finalbody", "handlers"):
                if field == "body" and type_checking:
                    continue
                inner = getattr(statement, field, None) or []
                for item in inner:
                    if isinstance(item, ast.ExceptHandler):
                        block(item.body)
                if inner and isinstance(inner[0], ast.stmt):
                    block(inner)

    block(tree.body)
    return found


def test_every_import_of_deepspeed_comes_right_after_import_deepspeed():
    """A new `from deepspeed... import` not preceded by the helper brings MLflow back into every rank; this
    names it. The helper's own module is the one place allowed a plain import."""
    sources = [p for root in ("bertdist", "benchmarks") for p in sorted((REPO / root).rglob("*.py"))]
    unguarded = [
        f"{path.relative_to(REPO)}:{line}"
        for path in sources
        if path.name != "deepspeed_package.py"
        for line in _unguarded_imports(ast.parse(path.read_text()))
    ]
    assert not unguarded, unguarded


@pytest.mark.parametrize(
    "source, unguarded",
    [
        ("def f():\n    import_deepspeed()\n    from deepspeed.ops import adam\n    import deepspeed.comm\n", []),
        ("def f():\n    from deepspeed.ops.adam import FusedAdam\n    import_deepspeed()\n", [2]),
        ("def f():\n    if x:\n        import_deepspeed()\n    from deepspeed import comm\n", [4]),
        ("def f():\n    import_deepspeed()\n    y = 1\n    import deepspeed\n", [4]),
        ("def f():\n    m = importlib.import_module('deepspeed.ops')\n", [2]),
        ("if TYPE_CHECKING:\n    import deepspeed\nelse:\n    import deepspeed\n", [4]),
        (
            "class A:\n  def f(self):\n    try:\n      pass\n    except E:\n      import deepspeed",
            [6],
        ),
    ],
)
def test_the_guard_names_each_import_the_helper_does_not_directly_precede(source, unguarded):
    assert _unguarded_imports(ast.parse(source)) == unguarded
