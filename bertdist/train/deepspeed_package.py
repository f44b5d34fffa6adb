"""DeepSpeed imported without the MLflow it does not need.

`import deepspeed`, or of any of its modules, runs its autotuner's module, which imports MLflow when it is
installed (it is: bertdist tracks with it) only to log autotuning experiments, a DeepSpeed feature bertdist never
starts. MLflow and what it pulls in (pandas, FastAPI, its GenAI judges) are about 40% of that import on this
project's CPUs, and about 80% of what it adds to a process that has torch already: on every rank of every run and
in every process that reads a checkpoint, whether the run tracks or not (only rank 0 ever does). Every import of
DeepSpeed in bertdist and its benchmarks comes right after a call of `import_deepspeed`
(tests/train/test_deepspeed_package.py checks that statically); later imports of MLflow work as usual.
"""

from __future__ import annotations

import sys
from types import ModuleType


def import_deepspeed() -> ModuleType:
    """The `deepspeed` package, imported (once per process) with `mlflow` hidden from its autotuner.

    A name mapped to None in sys.modules makes `import` raise ImportError, which the autotuner catches (it then
    logs nothing to MLflow). The mapping is removed again at once. An MLflow this process already imported is
    left alone: hiding it would change nothing, and a thread using it must not see it vanish. Call it before
    starting a thread that may import MLflow for the first time: during these seconds that thread would find
    none (the tracker imports it on the main thread before its threads start).
    """
    if "deepspeed" in sys.modules:
        import deepspeed  # raises as Python would if an earlier import left it unimportable

        return deepspeed
    hidden = "mlflow" not in sys.modules
    if hidden:
        sys.modules["mlflow"] = None  # type: ignore[assignment]
    try:
        import deepspeed
    finally:
        if hidden and sys.modules.get("mlflow", ...) is None:
            del sys.modules["mlflow"]
    return deepspeed
