"""Every file in cluster/ is parsed, by the tool that reads it where Ray or DeepSpeed ship a parser, and
checked for the fields that tool requires. A new file in cluster/ without a check here fails the suite."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

CLUSTER = REPO / "cluster"


def _kuberay_pod_template(template: dict, where: str) -> dict:
    spec = template["spec"]
    assert spec["containers"], f"{where}: a pod template needs containers"
    for container in spec["containers"]:
        assert container["name"] and container["image"], f"{where}: every container needs a name and an image"
        env = {e["name"]: e for e in container.get("env", [])}
        assert env["RAY_AUTH_MODE"]["value"] == "token", f"{where}: token authentication must be on"
        assert "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"], f"{where}: the token comes from a secret"
        mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
        assert mounts.get("data") == "/data", f"{where}: the shared data volume must be mounted at /data"
    volumes = {v["name"] for v in spec.get("volumes", [])}
    assert set(mounts) <= volumes, f"{where}: mounts {set(mounts) - volumes} have no volume"
    return spec


def _kuberay_cluster_spec(spec: dict, where: str) -> None:
    """The fields the RayCluster CRD (ray.io/v1) requires, and the types it enforces."""
    head = spec["headGroupSpec"]
    for group, params in [("headGroupSpec", head["rayStartParams"])] + [
        (f"workerGroupSpecs.{g['groupName']}", g["rayStartParams"]) for g in spec["workerGroupSpecs"]
    ]:
        bad = {k: v for k, v in params.items() if not isinstance(v, str)}
        assert not bad, f"{where}: {group}.rayStartParams values must be strings (KubeRay), got {bad}"
    _kuberay_pod_template(head["template"], f"{where}: headGroupSpec")
    ports = {p["name"]: p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
    assert ports["gcs-server"] == 6379 and ports["dashboard"] == 8265
    names = [g["groupName"] for g in spec["workerGroupSpecs"]]
    assert len(names) == len(set(names)), f"{where}: worker group names must be unique"
    for group in spec["workerGroupSpecs"]:
        label = f"{where}: workerGroupSpecs.{group['groupName']}"
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", group["groupName"]), f"{label}: not a DNS label"
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], f"{label}: replica bounds"
        _kuberay_pod_template(group["template"], label)


def check_ray_cluster_yaml(path: Path) -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load(path.read_text())
    # Ray's own checks, as `ray up` runs them: defaults filled in, then the JSON schema and consistency.
    validate_config(prepare_config(config))
    assert config["head_node_type"] in config["available_node_types"]
    head_start = " ".join(config["head_start_ray_commands"])
    assert "RAY_AUTH_MODE=token" in head_start and "--dashboard-host=127.0.0.1" in head_start
    assert "~/.ray/auth_token" in config["file_mounts"], "every node needs the cluster's token"
    assert any("scripts/install.sh" in c for c in config["setup_commands"])


def check_raycluster(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayCluster"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
    _kuberay_cluster_spec(doc["spec"], path.name)
    gpu = [
        g
        for g in doc["spec"]["workerGroupSpecs"]
        if "nvidia.com/gpu" in g["template"]["spec"]["containers"][0]["resources"]["limits"]
    ]
    assert gpu, "a GPU worker group for training"


def check_rayjob(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayJob"
    spec = doc["spec"]
    assert spec["entrypoint"].startswith("python -m bertdist prepare")
    for flag in ("--input", "--output", "--vocab"):
        assert flag in spec["entrypoint"], f"{path.name}: entrypoint lacks {flag}"
    assert isinstance(spec["shutdownAfterJobFinishes"], bool)
    _kuberay_cluster_spec(spec["rayClusterSpec"], path.name)
    submitter = spec["submitterPodTemplate"]["spec"]["containers"][0]
    assert {e["name"] for e in submitter["env"]} >= {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"}


def check_hostfile(path: Path) -> None:
    from deepspeed.launcher.runner import _parse_hostfile

    from bertdist.launch.checks import parse_hostfile

    ours = parse_hostfile(str(path))
    assert dict(_parse_hostfile(path.read_text().splitlines())) == ours  # DeepSpeed reads it the same way
    assert len(ours) >= 2 and all(slots >= 1 for slots in ours.values())


def _slurm_conf(path: Path) -> list[tuple[str, str]]:
    """slurm.conf syntax: `Key=Value` lines (a line may hold several, as NodeName lines do), # comments."""
    pairs = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            items = re.findall(r"(\w+)=(\S+)", line)
            assert items and " ".join(f"{k}={v}" for k, v in items) == " ".join(line.split()), f"{path.name}: {line!r}"
            pairs.append(items[0])
            pairs.extend(items[1:])
    return pairs


def check_slurm_conf(path: Path) -> None:
    pairs = _slurm_conf(path)
    keys = {k for k, _ in pairs}
    conf = dict(pairs)
    assert {"ClusterName", "SlurmctldHost", "NodeName", "PartitionName"} <= keys, (
        "slurmctld refuses to start without these"
    )
    assert conf["GresTypes"] == "gpu" and "Gres=gpu:" in path.read_text()
    assert conf["JobRequeue"] == "1", "the batch script's requeue needs JobRequeue"
    assert int(conf["KillWait"]) >= 60, "KillWait must leave time to write a checkpoint"
    assert conf["SelectType"] == "select/cons_tres", "--gpus-per-node needs select/cons_tres"


def check_gres_conf(path: Path) -> None:
    conf = dict(_slurm_conf(path))
    assert conf["Name"] == "gpu" and conf["File"].startswith("/dev/nvidia")


CHECKS = {
    "ray-cluster.yaml": check_ray_cluster_yaml,
    "kuberay/raycluster.yaml": check_raycluster,
    "kuberay/rayjob-prepare.yaml": check_rayjob,
    "hostfile.example": check_hostfile,
    "slurm/slurm.conf.example": check_slurm_conf,
    "slurm/gres.conf.example": check_gres_conf,
}


def test_every_cluster_file_has_a_check():
    files = {str(p.relative_to(CLUSTER)) for p in CLUSTER.rglob("*") if p.is_file()}
    assert files == set(CHECKS)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_cluster_file(name: str):
    path = CLUSTER / name
    assert path.read_text().startswith("#"), f"{name}: starts with a comment saying how to use it"
    CHECKS[name](path)


def _submit_examples() -> list[tuple[str, list[str]]]:
    """Every `bertdist submit ... --config ...` example in docs/cluster.md and in cluster/'s comments, its
    continuation lines joined: (where, its arguments)."""
    found = []
    for path in [REPO / "docs" / "cluster.md", *sorted(p for p in CLUSTER.rglob("*") if p.is_file())]:
        lines = [re.sub(r"^#\s*", "", line).strip() for line in path.read_text().splitlines()]
        for number, line in enumerate(lines, 1):
            if not line.startswith("bertdist submit "):
                continue
            command, at = line, number
            while command.endswith("\\"):
                command, at = command[:-1] + " " + lines[at], at + 1
            if "--config" in command:
                found.append((f"{path.relative_to(REPO)}:{number}", command.split("#")[0].split()[2:]))
    return found


@pytest.mark.parametrize("where, args", _submit_examples(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_submit_example_of_a_training_job_passes_the_submissions_checks(where, args, tmp_path, monkeypatch):
    """The multi-node examples ran configs/bert-base.yaml (32 x 8 GPUs = its batch of 256) on 16 and 32 GPUs:
    each was refused at submission, exit 2. A `hosts` file is one of as many hosts as the example asks for."""
    from bertdist.cli import main

    monkeypatch.chdir(REPO)
    if "--hostfile" in args and args[args.index("--hostfile") + 1] == "hosts":
        nodes = int(args[args.index("--nodes") + 1].split("-")[-1])
        (tmp_path / "hosts").write_text("".join(f"host{i} slots=8\n" for i in range(nodes)))
        args[args.index("--hostfile") + 1] = str(tmp_path / "hosts")
    assert main(["submit", *[a for a in args if a != "--dry-run"], "--dry-run"]) == 0, where
