"""The directories users read and edit that bertdist also needs at run time: launch/, configs/, cluster/.

In a source checkout they are the top-level directories beside the package. A wheel carries the same files
inside the package, as `bertdist/_shipped/{launch,configs,cluster}`: pyproject.toml maps those package
names onto the top-level directories (setuptools' package-dir), so the repository holds one copy of each
file. Code asks for a directory here and never builds such a path itself.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

SHIPPED = ("launch", "configs", "cluster")


def shipped(name: str) -> Path:
    """The directory `name` (one of SHIPPED) of this installation."""
    if name not in SHIPPED:
        raise ValueError(f"{name!r} is not one of the shipped directories {SHIPPED}")
    installed = Path(str(importlib.resources.files("bertdist").joinpath("_shipped", name)))
    if installed.is_dir():
        return installed
    checkout = Path(__file__).resolve().parents[1] / name
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(
        f"bertdist is installed without its {name}/ directory (looked in {installed} and {checkout})"
    )


def config_file(name: str) -> Path:
    """A config of configs/ by file name (`bert-tiny.yaml`)."""
    return shipped("configs") / name
