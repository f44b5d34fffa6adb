"""DeepSpeed imported without the MLflow it does not need.

`import deepspeed`, or of any of its modules, runs its autotuner's module, which imports MLflow when it is
installed (it is: bertdist tracks with it) only to log autotuning experiments, a DeepSpeed feature bertdist never
starts. MLflow and what it pulls in (pandas, FastAPI, its GenAI judges) take ~3 of the ~7 s the import costs on
this project's CPUs, on every rank of every run and in every process that reads a checkpoint, whether the run
tracks or not (only rank 0 ever does). Every import of DeepSpeed in bertdist goes through `import_deepspeed`
first (tests/train/test_deepspeed_package.py checks that statically); later imports of MLflow work as usual.
"""

from __future__ import annotations

import sys
from types import ModuleType


def import_deepspeed() -> ModuleType:
    """The `deepspeed` package, imported (once per process) with `mlflow` hidden from its autotuner.

    A name mapped to None in sys.modules makes `import` raise ImportError, which the autotuner catches (it then
    logs nothing to MLflow). The mapping is removed again at once. An MLflow this process already imported is
    left alone: hiding it would change nothing, and a thread using it must not see it vanish.
    """
    if "deepspeed" in sys.modules:
        return sys.modules["deepspeed"]
    hidden = "mlflow" not in sys.modules
    if hidden:
        sys.modules["mlflow"] = None  # type: ignore[assignment]
    try:
        import deepspeed
    finally:
        if hidden and sys.modules.get("mlflow", ...) is None:
            del sys.modules["mlflow"]
    return deepspeed
