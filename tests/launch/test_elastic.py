"""Elastic jobs over two real hosts (network namespaces with sshd, tests/hosts.py): `bertdist submit --backend
deepspeed` runs the supervisor (`bertdist.launch.elastic`) on host A; DeepSpeed's launcher reaches both hosts
with pdsh over SSH, one rank each. The faults are real: host B's rank processes SIGKILLed, host B's network
link set down and up again. The run is checked from its own records: the loader position logged after every
step (metrics.jsonl `data_position`), the supervisor's log and state file, `bertdist status`, and the
MLflow run in the run directory's store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bertdist.data.epochs import Segment
from bertdist.data.shards import read_manifest
from bertdist.train.consolidate import consolidated_state_dict
from bertdist.train.ports import free_tcp_port
from tests import hosts as hosts_module
from tests import training_runs as runs
from tests.conftest import REPO

pytestmark = pytest.mark.slow
STEPS = 150
EVERY = 10
GLOBAL_BATCH = 32
"""Micro batch 8: gradient accumulation 2 on two ranks, 4 on one: the global batch is kept. 150 steps of it
stay within the first epoch of the test shards (5,299 samples) and take long enough to act mid-run."""
FAULT_AFTER_STEP = 20
TOKEN = "bertdist-test-token-never-logged"
"""In the submitting shell: DeepSpeed's launcher wrote it into the job log (bertdist.launch.secret_env)."""
JOB_TIMEOUT_S = 480
RECOVERY_BOUND_S = 120
"""From the fault to the first step on the hosts left: probes (2 x 2 s, SSH timeouts 2 s), backoff 1 s, and a
DeepSpeed start (about 20 s on 2 busy cores)."""


def _job(
    two_hosts, tmp_path: Path, shards: str, vocab: str, nodes: str, *overrides: str, tracking: bool = False
) -> tuple[str, Path, Path]:
    """Submit the elastic job from host A; returns (job id, jobs dir, run output dir)."""
    config = runs.write_config(tmp_path / "run", shards, vocab, zero_stage=1)
    cfg = yaml.safe_load(config.read_text())
    cfg["data"]["phases"][0].update(steps=STEPS, micro_batch_size=8, eval_dir="")
    cfg["train"].update(global_batch_size=GLOBAL_BATCH)
    cfg["checkpoint"] = {"every_steps": EVERY, "keep_last": 3}
    cfg["tracking"] = {"enabled": tracking, "experiment_name": "elastic", "log_system_metrics": False}
    config.write_text(yaml.safe_dump(cfg))
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{h.address} slots=1\n" for h in two_hosts.hosts))
    ds_env = tmp_path / "deepspeed_env"
    ds_env.write_text(f"DS_ACCELERATOR=cpu\nGLOO_SOCKET_IFNAME={hosts_module.IFNAME}\nOMP_NUM_THREADS=1\n")
    jobs = tmp_path / "jobs"
    submitted = subprocess.run(
        two_hosts.hosts[0].command(
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
                nodes,
                "--gpus-per-node",
                "1",
                "--cpu-only",
                "--config",
                str(config),
                "--master-port",
                str(free_tcp_port()),
                "--jobs-dir",
                str(jobs),
                "launch.host_probe_interval_s=2",
                "launch.restart_backoff_s=1",
                *overrides,
            ]
        ),
        env=two_hosts.env(DS_ENV_FILE=str(ds_env), MLFLOW_TRACKING_TOKEN=TOKEN),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    return submitted.stdout.split("submitted deepspeed job ", 1)[1].split()[0], jobs, tmp_path / "run" / "out"


def _wait(predicate, what: str, log: Path, timeout_s: float = JOB_TIMEOUT_S) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}; job log:\n{_tail(log)}")
        time.sleep(0.2)
    return time.monotonic() - start


def _tail(log: Path) -> str:
    return log.read_text()[-6000:] if log.exists() else "(no log)"


def _status(job_id: str, jobs: Path) -> str:
    return subprocess.run(
        [sys.executable, "-m", "bertdist", "status", job_id, "--jobs-dir", str(jobs)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout


def _finished(job_id: str, jobs: Path) -> bool:
    return (jobs / f"{job_id}.exit").exists()


def _records(out: Path) -> list[dict]:
    """Every training record of metrics.jsonl, in the order written (a redone step appears again); a line still
    being appended is left for the next read."""
    path = out / "metrics.jsonl"
    lines = path.read_text().split("\n")[:-1] if path.exists() else []
    return [r for r in map(json.loads, lines) if "data_position" in r]


def _checkpoint_step(out: Path) -> int:
    tag = runs.latest_tag(out)
    return int(tag.split("_")[1]) if tag else 0


def _kill_ranks(host: hosts_module.Host) -> int:
    """SIGKILL every `bertdist train` rank process inside `host`'s namespace (sshd stays up)."""
    pids = subprocess.run(["ip", "netns", "pids", host.namespace], capture_output=True, text=True).stdout.split()
    killed = 0
    for pid in pids:
        try:
            if b"-m\0bertdist\0train" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(int(pid), signal.SIGKILL)
                killed += 1
        except (OSError, ValueError):
            pass
    return killed


def _link(host: hosts_module.Host, state: str) -> None:
    subprocess.run(host.command(["ip", "link", "set", hosts_module.IFNAME, state]), check=True, timeout=30)


def _check_samples(records: list[dict], shards: str) -> dict[int, int]:
    """No sample of the epoch repeated or skipped over the run's final trajectory; returns how often each
    step was done (a redone step: more than once).

    The trajectory is each step's last record. The loader's position after a step (its segment of unconsumed
    positions, on however many ranks) gives the positions consumed so far; each step must add exactly one
    global batch of new ones, also across the restarts, where the position comes from a checkpoint written by
    another world size."""
    num_samples = sum(s["num_samples"] for s in read_manifest(shards)["shards"])
    assert STEPS * GLOBAL_BATCH <= num_samples, "the run must stay in its first epoch for this check"
    final = {r["step"]: r["data_position"] for r in records}
    assert sorted(final) == list(range(1, STEPS + 1)), sorted(final)
    consumed: set[int] = set()
    for step in range(1, STEPS + 1):
        p = final[step]
        assert p["epoch"] == 0
        segment = Segment(p["world_size"], p["micro_batch_size"], p["intervals"], p["batches_done"])
        left = {i for a, b in segment.remaining() for i in range(a, b)}
        now = set(range(num_samples)) - left
        assert consumed < now and len(now - consumed) == GLOBAL_BATCH, (step, len(now - consumed), p)
        consumed = now
    done: dict[int, int] = {}
    for r in records:
        done[r["step"]] = done.get(r["step"], 0) + 1
    return done


def test_a_host_whose_ranks_are_killed_is_dropped_and_the_job_finishes_on_the_other(
    two_hosts, tiny_shards, tiny_vocab, tmp_path
):
    """Host B's ranks SIGKILLed after the checkpoint of step 20: the job goes on on host A alone (one rank,
    gradient accumulation 2 -> 4) from the newest checkpoint and finishes; no sample is repeated or skipped
    beyond the redone steps (at most one checkpoint interval); the log, `bertdist status` and the MLflow run
    name the event."""
    job_id, jobs, out = _job(
        two_hosts, tmp_path, tiny_shards, tiny_vocab, "1-2", "launch.grow_back=false", tracking=True
    )
    log = jobs / f"{job_id}.log"
    _wait(lambda: _checkpoint_step(out) >= FAULT_AFTER_STEP, f"the checkpoint of step {FAULT_AFTER_STEP}", log)
    assert _kill_ranks(two_hosts.hosts[1]) >= 1
    recovered_s = _wait(
        lambda: any(r["data_position"]["world_size"] == 1 for r in _records(out)), "a step on host A alone", log
    )
    _wait(lambda: _finished(job_id, jobs), "the job to finish", log)
    text = log.read_text()
    status = _status(job_id, jobs)
    assert status.startswith("succeeded"), status + text[-6000:]
    assert TOKEN not in text and not list(jobs.glob("*.secrets")), "the secrets file outlived the job"
    assert_in = f"restart 1: lost {two_hosts.hosts[1].address}: its ranks were killed (exit code"
    assert assert_in in text and "world size 2 -> 1" in text, text[-6000:]
    assert "world size 1 on" in status and "1 restart(s)" in status, status
    assert recovered_s < RECOVERY_BOUND_S, f"{recovered_s:.0f} s from the kill to a step on host A"
    done = _check_samples(_records(out), tiny_shards)
    assert sum(n - 1 for n in done.values()) <= EVERY, done
    state = json.loads((jobs / f"{job_id}.elastic.json").read_text())
    assert state["restarts"] == 1 and state["hosts"] == [two_hosts.hosts[0].address], state

    from bertdist.tracking.store import client, local_store_uri

    mlflow = client(local_store_uri(out))
    (run,) = mlflow.search_runs([mlflow.get_experiment_by_name("elastic").experiment_id])
    assert "lost " + two_hosts.hosts[1].address in run.data.tags["bertdist.elastic.restart_1"], run.data.tags
    sizes = [
        m.value for m in sorted(mlflow.get_metric_history(run.info.run_id, "run/world_size"), key=lambda m: m.step)
    ]
    assert sizes == [2.0, 1.0], sizes
    (lost,) = mlflow.get_metric_history(run.info.run_id, "run/seconds_lost")
    assert 0 < lost.value < RECOVERY_BOUND_S + 60, lost
    assert run.info.status == "FINISHED", run.info


def test_a_host_that_loses_its_network_is_dropped_and_taken_back_when_it_answers(
    two_hosts, tiny_shards, tiny_vocab, tmp_path
):
    """Host B's link down after the checkpoint of step 20: the job continues on host A; the link up again: B is
    taken back at a checkpoint the supervisor asks for (no step redone) and the job finishes on two ranks. The
    final model loads, and the loss does not jump where the world size changed more than it moves from one
    step to the next elsewhere in the run."""
    job_id, jobs, out = _job(two_hosts, tmp_path, tiny_shards, tiny_vocab, "1-2", "launch.readmit_after_s=3")
    log = jobs / f"{job_id}.log"
    host_b = two_hosts.hosts[1]
    _wait(lambda: _checkpoint_step(out) >= FAULT_AFTER_STEP, f"the checkpoint of step {FAULT_AFTER_STEP}", log)
    down_at = time.monotonic()
    _link(host_b, "down")
    try:
        _wait(lambda: "restart 1: lost" in log.read_text(), "the supervisor to drop host B", log)
    finally:
        _link(host_b, "up")  # B answers again while the job restarts on A; it is taken back at A's first checkpoint
    _wait(lambda: any(r["data_position"]["world_size"] == 1 for r in _records(out)), "a step on host A alone", log)
    recovered_s = time.monotonic() - down_at
    _wait(lambda: _finished(job_id, jobs), "the job to finish", log)
    text = log.read_text()
    status = _status(job_id, jobs)
    assert status.startswith("succeeded"), status + text[-6000:]
    assert f"restart 1: lost {host_b.address}: does not answer" in text, text[-6000:]
    assert f"restart 2: {host_b.address} answer(s) again: growing back; world size 1 -> 2" in text, text[-6000:]
    assert "world size 2 on" in status and "2 restart(s)" in status, status
    assert recovered_s < RECOVERY_BOUND_S, f"{recovered_s:.0f} s from the link down to a step on host A"
    records = _records(out)
    done = _check_samples(records, tiny_shards)
    sizes = [r["data_position"]["world_size"] for r in records]
    assert sizes[0] == 2 and 1 in sizes and sizes[-1] == 2, sizes
    grew_at = max(r["step"] for r in records if r["data_position"]["world_size"] == 1)
    assert done.get(grew_at + 1) == 1, "growing back redoes no step"
    assert sum(n - 1 for n in done.values()) <= EVERY, done

    trajectory = {r["step"]: r for r in records}  # each step's last record
    loss = {s: r["loss/train"] for s, r in trajectory.items()}
    size = {s: r["data_position"]["world_size"] for s, r in trajectory.items()}
    jumps = {s: abs(loss[s] - loss[s - 1]) for s in range(2, STEPS + 1)}
    changes = [s for s in jumps if size[s] != size[s - 1]]
    assert changes and max(jumps[s] for s in changes) <= max(j for s, j in jumps.items() if s not in changes), (
        changes,
        jumps,
    )

    from bertdist.model.bert.model import BertForPreTraining
    from tests.conftest import tiny_model_config

    model = BertForPreTraining(tiny_model_config())
    model.load_state_dict(consolidated_state_dict(out / "checkpoints" / f"step_{STEPS:08d}"))


def test_fewer_hosts_than_min_nodes_stops_the_job_with_its_last_checkpoint_intact(
    two_hosts, tiny_shards, tiny_vocab, tmp_path
):
    """launch.min_nodes=2 and host B's ranks killed: one line says why the job stops and names the last
    checkpoint, which `bertdist checkpoints` finds intact."""
    job_id, jobs, out = _job(two_hosts, tmp_path, tiny_shards, tiny_vocab, "2")
    log = jobs / f"{job_id}.log"
    _wait(lambda: _checkpoint_step(out) >= FAULT_AFTER_STEP, f"the checkpoint of step {FAULT_AFTER_STEP}", log)
    assert _kill_ranks(two_hosts.hosts[1]) >= 1
    _wait(lambda: _finished(job_id, jobs), "the job to stop", log)
    status = _status(job_id, jobs)
    assert status.startswith("failed"), status
    (line,) = [ln for ln in log.read_text().splitlines() if "bertdist elastic:" in ln and "stopping:" in ln]
    tag = runs.latest_tag(out)
    assert f"fewer than launch.min_nodes=2; last checkpoint: {tag} (intact" in line, line
    listed = subprocess.run(
        [sys.executable, "-m", "bertdist", "checkpoints", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr


def test_a_ray_job_loses_a_node_s_ranks_and_finishes_on_the_other_node(two_hosts, tiny_shards, tiny_vocab, tmp_path):
    """The same supervisor over a two-node Ray cluster (head on host A, a worker node on host B, token
    authentication on): the Ray job's driver (`bertdist.launch.ray_job`, run here as a Ray job runs it) starts a
    task per node; host B's ranks killed, the job finishes on host A's node alone, with no sample repeated or
    skipped beyond the redone steps, and the state file says so."""
    import secrets

    from bertdist.config import dump_yaml, load_config

    config = runs.write_config(tmp_path / "run", tiny_shards, tiny_vocab, zero_stage=1)
    cfg = load_config(
        str(config),
        [
            f"data.phases.0.steps={STEPS}",
            "data.phases.0.micro_batch_size=8",
            "data.phases.0.eval_dir=",
            f"train.global_batch_size={GLOBAL_BATCH}",
            f"checkpoint.every_steps={EVERY}",
            "checkpoint.keep_last=3",
            "launch.nodes=2",
            "launch.min_nodes=1",
            "launch.gpus_per_node=1",
            f"launch.master_port={free_tcp_port()}",
            "launch.host_probe_interval_s=2",
            "launch.restart_backoff_s=1",
            "launch.grow_back=false",
        ],
    )
    out = Path(cfg.train.output_dir)
    env = two_hosts.env(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(16),
        DS_ACCELERATOR="cpu",
        GLOO_SOCKET_IFNAME=hosts_module.IFNAME,
        OMP_NUM_THREADS="1",
    )
    env.pop("RAY_ADDRESS", None)
    log = tmp_path / "driver.log"
    with hosts_module.ray_cluster(two_hosts, env, head_cpus=1, worker_cpus=1) as address, open(log, "w") as driver_log:
        driver = subprocess.Popen(
            two_hosts.hosts[0].command(
                [sys.executable, "-m", "bertdist.launch.ray_job", "--gpus-per-node", "1", "--cpu-only"]
            ),
            env={**env, "RAY_ADDRESS": address, "BERTDIST_CONFIG_YAML": dump_yaml(cfg)},
            cwd=REPO,
            stdout=driver_log,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait(
                lambda: _checkpoint_step(out) >= FAULT_AFTER_STEP or driver.poll() is not None,
                f"the checkpoint of step {FAULT_AFTER_STEP}",
                log,
            )
            assert _kill_ranks(two_hosts.hosts[1]) >= 1, _tail(log)
            code = driver.wait(timeout=JOB_TIMEOUT_S)
        finally:
            driver.kill()
    text = log.read_text()
    assert code == 0, text[-6000:]
    assert f"restart 1: lost {two_hosts.hosts[1].address}: its ranks were killed (exit code 137)" in text, text[-6000:]
    done = _check_samples(_records(out), tiny_shards)
    assert sum(n - 1 for n in done.values()) <= EVERY, done
    state = json.loads((out / "elastic.json").read_text())
    assert (
        state["state"] == "succeeded" and state["restarts"] == 1 and state["hosts"] == [two_hosts.hosts[0].address]
    ), state
