"""The scripts in launch/: they refuse bad input, render to valid shell, and the multi-node route (node rank
+ master address, as SLURM or a hostfile starts nodes) trains exactly like one node with as many ranks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from bertdist.launch.job import SubmitRequest
from bertdist.launch.request import plan
from bertdist.train.consolidate import consolidated_state_dict
from bertdist.train.ports import free_tcp_port
from tests import training_runs
from tests.conftest import REPO

LAUNCH = REPO / "launch"
# Same thread count everywhere: torchrun sets 1 only when it starts several ranks, and a different
# thread count may change the order of float sums inside a matmul.
CPU_ENV = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}
JOB_TIMEOUT_S = 600
"""Generous: four ranks start at once here, and on a machine shared with other test runs that takes minutes."""


def _script(name: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(LAUNCH / name), *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "env, message",
    [
        ({"NPROC_PER_NODE": "two"}, "NPROC_PER_NODE=two is not a non-negative integer"),
        ({"NNODES": "2", "NODE_RANK": "2"}, "NODE_RANK=2 must be below NNODES=2"),
        ({"MASTER_ADDR": "$(id)"}, "MASTER_ADDR=$(id) is not a host name or address"),
    ],
)
def test_single_node_script_refuses_bad_environment(env, message):
    out = _script("single_node.sh", env, "--config", "x.yaml")
    assert out.returncode == 2 and message in out.stderr


def test_hostfile_script_needs_a_hostfile(tmp_path):
    out = _script("multinode_hostfile.sh", {"HOSTFILE": ""})
    assert out.returncode != 0 and "set HOSTFILE" in out.stderr
    out = _script("multinode_hostfile.sh", {"HOSTFILE": str(tmp_path / "missing")})
    assert out.returncode == 2 and "does not exist" in out.stderr


def test_rendered_slurm_script_is_valid_bash(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = plan(
        SubmitRequest(
            backend="slurm",
            config=str(REPO / "configs" / "bert-base.yaml"),
            nodes=2,
            gpus_per_node=4,
            time_limit="48:00:00",
            partition="gpu",
            jobs_dir=str(tmp_path / "jobs"),
        )
    )
    script = next(text for path, text in job.files.items() if path.endswith(".sbatch"))
    (tmp_path / "job.sbatch").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")]).returncode == 0
    assert "srun --kill-on-bad-exit=0 --wait=120" in script and "checkpoint" in script


def test_ray_job_entry_point_needs_the_resolved_config():
    out = subprocess.run(
        [sys.executable, "-m", "bertdist.launch.ray_job", "--gpus-per-node", "1"],
        env={k: v for k, v in os.environ.items() if k != "BERTDIST_CONFIG_YAML"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "BERTDIST_CONFIG_YAML is not set" in out.stderr


@pytest.mark.slow
def test_two_nodes_of_one_rank_train_exactly_like_one_node_of_two_ranks(tiny_shards, tiny_vocab, tmp_path):
    # One node, two ranks: submitted like a user would, `bertdist submit --backend local` (torchrun, 2 ranks).
    one_node = training_runs.write_config(tmp_path / "one-node", tiny_shards, tiny_vocab, zero_stage=1)
    jobs = tmp_path / "jobs"
    submitted = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertdist",
            "submit",
            "--backend",
            "local",
            "--config",
            str(one_node),
            "--cpu-only",
            "--gpus-per-node",
            "2",
            "--master-port",
            str(free_tcp_port()),
            "--jobs-dir",
            str(jobs),
        ],
        env={**os.environ, **CPU_ENV},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    job_id = submitted.stdout.split("submitted local job ", 1)[1].split()[0]

    # Two "nodes" of one rank each, meanwhile: launch/single_node.sh once per node with its node rank and
    # the master's address, as a hostfile launcher or SLURM starts one process per machine. The second
    # machine is faked by a second process on this one; the rendezvous is real TCP on 127.0.0.1.
    two_nodes = training_runs.write_config(tmp_path / "two-nodes", tiny_shards, tiny_vocab, zero_stage=1)
    port = str(free_tcp_port())
    nodes = []
    for node_rank in (0, 1):
        env = {
            **os.environ,
            **CPU_ENV,
            "NNODES": "2",
            "NODE_RANK": str(node_rank),
            "NPROC_PER_NODE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        log = open(tmp_path / f"node{node_rank}.log", "w")
        nodes.append(
            subprocess.Popen(
                ["bash", str(LAUNCH / "single_node.sh"), "--config", str(two_nodes)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    try:
        codes = [p.wait(timeout=JOB_TIMEOUT_S) for p in nodes]
    finally:
        for p in nodes:
            p.kill()
    assert codes == [0, 0], (tmp_path / "node0.log").read_text()[-3000:]

    # `logs --follow` returns when the local job's supervisor has recorded its exit code.
    logs = subprocess.run(
        [sys.executable, "-m", "bertdist", "logs", job_id, "--follow", "--jobs-dir", str(jobs)],
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    ).stdout
    status = subprocess.run(
        [sys.executable, "-m", "bertdist", "status", job_id, "--jobs-dir", str(jobs)], capture_output=True, text=True
    )
    assert status.returncode == 0 and status.stdout.startswith("succeeded"), status.stdout + logs[-3000:]
    assert f"done: {training_runs.STEPS} steps" in logs

    final = f"step_{training_runs.STEPS:08d}"
    want = consolidated_state_dict(one_node.parent / "out" / "checkpoints" / final)
    got = consolidated_state_dict(two_nodes.parent / "out" / "checkpoints" / final)
    assert want.keys() == got.keys()
    assert [k for k in want if not torch.equal(want[k], got[k])] == []
    losses = {s: r["loss/train"] for s, r in training_runs.read_metrics(one_node.parent / "out").items()}
    assert losses == {s: r["loss/train"] for s, r in training_runs.read_metrics(two_nodes.parent / "out").items()}
