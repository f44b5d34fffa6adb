"""Jobs across real separate network hosts: two network namespaces on this machine (tests/hosts.py), each
with its own address, joined by a veth pair, with sshd inside. Nothing here is faked: DeepSpeed's launcher
reaches the hosts with pdsh over SSH, the ranks meet at the other host's address, and Ray runs a node in
each namespace. These tests address only the two namespaces they create."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertdist.train.consolidate import consolidated_state_dict
from bertdist.train.ports import free_tcp_port
from tests import hosts as hosts_module
from tests import training_runs as runs
from tests.conftest import REPO

pytestmark = pytest.mark.slow
JOB_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    return str(tmp_path_factory.getbasetemp() / "training")


def _final_weights(out: Path) -> dict[str, torch.Tensor]:
    return consolidated_state_dict(out / "checkpoints" / f"step_{runs.STEPS:08d}")


def _same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> list[str]:
    return [k for k in want if not torch.equal(want[k], got[k])]


def test_the_deepspeed_hostfile_launcher_over_ssh_trains_what_one_host_trains(
    two_hosts, base, tiny_shards, tiny_vocab, tmp_path
):
    """`bertdist submit --backend deepspeed` from host 1 with a hostfile of both hosts, one rank each: pdsh
    starts a rank on each over SSH, they meet at host 1's address, and the run ends with the weights of the
    same run as 2 ranks on one host."""
    reference = runs.uninterrupted(base, tiny_shards, tiny_vocab, 1)
    config = runs.write_config(tmp_path / "run", tiny_shards, tiny_vocab, zero_stage=1)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{h.address} slots=1\n" for h in two_hosts.hosts))
    ds_env = tmp_path / "deepspeed_env"  # what DeepSpeed's launcher exports on every host
    ds_env.write_text(f"DS_ACCELERATOR=cpu\nGLOO_SOCKET_IFNAME={hosts_module.IFNAME}\nOMP_NUM_THREADS=1\n")
    jobs = tmp_path / "jobs"
    env = two_hosts.env(DS_ENV_FILE=str(ds_env))
    first = two_hosts.hosts[0]
    submitted = subprocess.run(
        first.command(
            [
                sys.executable,
                "-m",
                "bertdist",
                "submit",
                "--backend",
                "deepspeed",
                "--hostfile",
                str(hostfile),
                "--nodes",
                "2",
                "--gpus-per-node",
                "1",
                "--cpu-only",
                "--config",
                str(config),
                "--master-port",
                str(free_tcp_port()),
                "--jobs-dir",
                str(jobs),
            ]
        ),
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    job_id = submitted.stdout.split("submitted deepspeed job ", 1)[1].split()[0]
    logs = subprocess.run(
        first.command([sys.executable, "-m", "bertdist", "logs", job_id, "--jobs-dir", str(jobs), "--follow"]),
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    ).stdout
    status = subprocess.run(
        [sys.executable, "-m", "bertdist", "status", job_id, "--jobs-dir", str(jobs)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert status.startswith("succeeded"), status + logs[-4000:]
    for host in two_hosts.hosts:  # pdsh prefixes every remote line with its host
        assert f"{host.address}: " in logs, logs[-4000:]
    assert _same_weights(_final_weights(tmp_path / "run" / "out"), _final_weights(reference.out)) == [], logs[-2000:]


def test_ranks_meet_at_a_master_address_on_the_other_host(two_hosts, base, tiny_shards, tiny_vocab, tmp_path):
    """Rank 0 in host 1, rank 1 in host 2, MASTER_ADDR host 1's address (the srun layout): same weights."""
    reference = runs.uninterrupted(base, tiny_shards, tiny_vocab, 1)
    config = runs.write_config(tmp_path / "run", tiny_shards, tiny_vocab, zero_stage=1)
    port, procs, logs = free_tcp_port(), [], []
    for rank, host in enumerate(two_hosts.hosts):
        env = {
            **os.environ,
            "DS_ACCELERATOR": "cpu",
            "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": hosts_module.IFNAME,
            "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": "2",
            "SLURM_LOCALID": "0",
            "SLURM_NODELIST": "hosts",
            "SLURM_TASKS_PER_NODE": "1",
            "MASTER_ADDR": two_hosts.hosts[0].address,
            "MASTER_PORT": str(port),
        }
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(name, None)
        log = tmp_path / f"rank{rank}.log"
        logs.append(log)
        with open(log, "w") as out:
            procs.append(
                subprocess.Popen(
                    host.command([sys.executable, "-m", "bertdist", "train", "--config", str(config)]),
                    env=env,
                    cwd=REPO,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
    try:
        codes = [p.wait(timeout=JOB_TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert codes == [0, 0], logs[0].read_text()[-3000:] + logs[1].read_text()[-3000:]
    assert _same_weights(_final_weights(tmp_path / "run" / "out"), _final_weights(reference.out)) == []


def _shard_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*.tar"))}


def test_prepare_on_a_ray_cluster_of_two_hosts_uses_both_and_writes_the_same_shards(
    two_hosts, tiny_corpus, tiny_vocab, tiny_shards, tmp_path
):
    """A Ray head on host 1 and a worker node on host 2 (token authentication on): `bertdist prepare
    --ray-address` from host 1 runs tasks on both nodes and writes the shards a one-node run writes."""
    import secrets

    from tests.conftest import TEST_SEQ_LENGTH, TINY_SHARD_SAMPLES

    head = two_hosts.hosts[0]
    env = two_hosts.env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))
    env.pop("RAY_ADDRESS", None)
    # One CPU on the head and two on the worker, three tasks in flight: the head cannot take them all.
    with hosts_module.ray_cluster(two_hosts, env, head_cpus=1, worker_cpus=2) as address:
        out = tmp_path / "shards"
        prepared = subprocess.run(
            head.command(
                [
                    sys.executable,
                    "-m",
                    "bertdist",
                    "prepare",
                    "--input",
                    tiny_corpus,
                    "--output",
                    str(out),
                    "--vocab",
                    tiny_vocab,
                    "--max-seq-length",
                    str(TEST_SEQ_LENGTH),
                    "--dupe-factor",
                    "2",
                    "--samples-per-shard",
                    str(TINY_SHARD_SAMPLES),
                    "--group-mb",
                    str(64 / 1024),
                    "--workers",
                    "3",
                    "--no-progress",
                    "--ray-address",
                    address,
                ]
            ),
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=JOB_TIMEOUT_S,
        )
    assert prepared.returncode == 0, prepared.stdout[-2000:] + prepared.stderr[-3000:]
    nodes = prepared.stdout.split("ray nodes: ", 1)[1].splitlines()[0]
    assert nodes.startswith("2 (") and f"{head.address}: " in nodes and f"{two_hosts.hosts[1].address}: " in nodes, (
        nodes
    )
    assert _shard_bytes(out) == _shard_bytes(Path(tiny_shards))
