"""The backend contract: every registered backend implements all of it, and the registry is the only place
in the launch package that names a backend (no `if backend == "ray"` branch, no list of names to keep in step)."""

from __future__ import annotations

import ast

import pytest

from bertdist.launch.backends import REGISTRY, Backend
from bertdist.launch.job import JOB_KINDS
from tests.conftest import REPO


@pytest.mark.parametrize("name", REGISTRY)
def test_every_backend_implements_the_whole_contract(name):
    backend = REGISTRY[name]
    members = [
        *Backend.__annotations__,
        *(m for m, v in vars(Backend).items() if callable(v) and not m.startswith("_")),
    ]
    assert {"check", "render", "describe", "start", "status", "logs", "stop_hint"} <= set(members)
    assert [m for m in members if not hasattr(backend, m)] == [] and isinstance(backend, Backend)
    assert "train" in backend.JOBS and set(backend.JOBS) <= set(JOB_KINDS)


def test_only_the_registry_names_a_backend():
    named = []
    for path in sorted((REPO / "bertdist" / "launch").glob("*.py")):
        if path.name == "backends.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in REGISTRY and node.value != path.stem:  # its own TITLE
                named.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    assert not named, "look the backend up in bertdist.launch.backends.REGISTRY instead:\n" + "\n".join(named)
