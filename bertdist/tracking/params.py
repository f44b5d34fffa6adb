"""What a run records besides metrics: the resolved config, the facts of its data, and the machine.

All values are strings, as MLflow stores parameters. Probing the environment must never stop training, so
a missing manifest yields no parameters (the loader reports that itself) and an unknown git commit is
"unknown".
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path

from bertdist import storage
from bertdist.config import Config, flatten
from bertdist.errors import UserError


def environment_params(world_size: int, nodes: int) -> dict[str, str]:
    """Facts about where the run executes, as `env.*` parameters."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return {
        "env.world_size": str(world_size),
        "env.nodes": str(nodes),
        "env.gpu_type": gpu,
        "env.gpus_per_node": str(torch.cuda.device_count()),
        "env.torch_version": _package_version("torch"),
        "env.deepspeed_version": _package_version("deepspeed"),
        "env.mlflow_version": _package_version("mlflow"),
        "env.bertdist_version": _package_version("bertdist"),
        "env.python_version": platform.python_version(),
        "env.hostname": socket.gethostname(),
        "env.git_commit": git_commit(),
    }


def manifest_params(shard_dir: str | os.PathLike, prefix: str) -> dict[str, str]:
    """The facts of a prepared shard directory (from its manifest.json) as `{prefix}.*` parameters.

    A missing or unreadable manifest yields no parameters: the data loader reports that as an error
    itself, and tracking must not be the component that stops a run.
    """
    try:
        manifest = storage.read_json(storage.join(os.fspath(shard_dir), "manifest.json"))
        shards = manifest["shards"]
    except (OSError, ValueError, KeyError, TypeError, UserError):
        return {}
    options = manifest.get("options", {})
    facts = {
        "num_shards": len(shards),
        "num_samples": sum(int(s.get("num_samples", 0)) for s in shards),
        "max_seq_length": options.get("max_seq_length", manifest.get("max_seq_length")),
        "vocab_sha256": manifest.get("vocab_sha256", options.get("vocab_sha256")),
        "format_version": manifest.get("format_version", manifest.get("version")),
    }
    return {f"{prefix}.{k}": str(v) for k, v in facts.items() if v is not None}


def run_params(cfg: Config, world_size: int, nodes: int) -> dict[str, str]:
    """Every parameter of a run: the flattened resolved config, each phase's data facts, the environment."""
    params = {k: str(v) for k, v in flatten(cfg.to_dict()).items()}
    for i, phase in enumerate(cfg.data.phases):
        params.update(manifest_params(phase.train_dir, f"data.phases.{i}.train_manifest"))
        if phase.eval_dir:
            params.update(manifest_params(phase.eval_dir, f"data.phases.{i}.eval_manifest"))
    params.update(environment_params(world_size, nodes))
    return params


def git_commit() -> str:
    """The commit of the bertdist source tree, with `-dirty` when it has uncommitted changes."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}-dirty" if dirty else head


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def default_run_name(cfg: Config, now: datetime.datetime | None = None) -> str:
    """A name that says what ran: `bert-tiny-demo-20261122-2346` (model size, job name, start time)."""
    now = now or datetime.datetime.now()
    job = "" if cfg.launch.job_name == "bertdist" else f"-{cfg.launch.job_name}"
    return f"bert-{cfg.model.size}{job}-{now:%Y%m%d-%H%M}"
