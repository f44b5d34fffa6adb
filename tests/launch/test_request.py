"""`bertdist submit|status|logs`: rendering and validation for every backend, and real submissions to a
local Ray head (token authentication on) and to a one-node SLURM cluster (scripts/setup_slurm.sh)."""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from bertdist.cli import main
from bertdist.config import load_config
from bertdist.launch.checks import SubmitError, parse_hostfile, render_template
from bertdist.launch.job import SubmitRequest
from bertdist.launch.request import plan
from bertdist.train.ports import free_tcp_port
from tests import training_runs
from tests.conftest import REPO, TEST_SEQ_LENGTH, TINY_SHARD_SAMPLES
from tests.hosts import kill_processes_mentioning

VENV_BIN = Path(sys.executable).parent
TINY_CONFIG = REPO / "configs" / "bert-tiny.yaml"


def bertdist(
    *args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    """The CLI in its own process: Ray's token settings must not leak into the test process."""
    return subprocess.run(
        [sys.executable, "-m", "bertdist", *args],
        env={**os.environ, **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ---------------------------------------------------------------------------------------------
# Rendering and validation (no cluster needed).


@pytest.mark.parametrize(
    "backend,elastic", [("local", False), ("deepspeed", True), ("slurm", False), ("slurm", True), ("ray", False)]
)
def test_dry_run_renders_the_job_and_writes_nothing(backend, elastic, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-a slots=2\nnode-b slots=2  # comment\n")
    flags = {
        "local": ["--gpus-per-node", "2"],
        "deepspeed": ["--nodes", "1-2", "--gpus-per-node", "1", "--hostfile", str(hostfile)],
        "slurm": [
            "--nodes",
            "1-2" if elastic else "2",
            "--gpus-per-node",
            "1",
            "--time",
            "01:30:00",
            "--partition",
            "gpu",
        ],
        "ray": ["--nodes", "2", "--gpus-per-node", "1", "--address", "http://10.0.0.5:8265"],
    }[backend]
    code = main(
        [
            "submit",
            "--backend",
            backend,
            "--config",
            str(TINY_CONFIG),
            "--dry-run",
            *flags,
            "tracking.run_name=it's $(touch pwned)",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert not (tmp_path / "runs").exists() and not (tmp_path / "pwned").exists()
    assert f"on backend {backend}" in out
    if backend == "local":
        assert "NPROC_PER_NODE=2" in out and "launch/single_node.sh --config" in out
    elif backend == "deepspeed":
        assert (
            "-m bertdist.launch.elastic --config" in out and f"--hostfile {hostfile}" in out and ".elastic.json" in out
        )
    elif backend == "slurm":
        for line in (
            "#SBATCH --nodes=1-2" if elastic else "#SBATCH --nodes=2",
            "#SBATCH --ntasks-per-node=1",
            "#SBATCH --time=01:30:00",
            "#SBATCH --requeue",
            "#SBATCH --signal=USR1@300",
            "#SBATCH --partition=gpu",
            "#SBATCH --gpus-per-node=1",
        ):
            assert line in out.splitlines(), line
        assert "{{" not in out and "sbatch --parsable" in out
    else:
        assert "entrypoint: python -m bertdist.launch.ray_job --gpus-per-node 1" in out
        assert "BERTDIST_CONFIG_YAML" in out and '"working_dir"' not in out  # the cluster's own bertdist runs
    # The override reaches the job only inside the resolved YAML, never a command line.
    resolved = yaml.safe_load(out.split("# --- ", 2)[1].split("\n", 1)[1].split("\n# --- ")[0])
    assert resolved["tracking"]["run_name"] == "it's $(touch pwned)" and resolved["launch"]["backend"] == backend
    assert "pwned" not in out.replace("run_name: it's $(touch pwned)", "")


def test_resolved_config_round_trips_through_the_trainers_loader(tmp_path):
    job = plan(
        SubmitRequest(
            backend="local",
            config=str(TINY_CONFIG),
            overrides=["optim.lr=0.0003", "data.phases.0.steps=700"],
            gpus_per_node=2,
            jobs_dir=str(tmp_path),
        )
    )
    ((path, text),) = job.files.items()
    Path(path).write_text(text)
    cfg = load_config(path)
    expected = load_config(TINY_CONFIG, ["optim.lr=0.0003", "data.phases.0.steps=700"])
    expected.launch.gpus_per_node = 2
    assert cfg.to_dict() == expected.to_dict()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--name", "x;rm -rf /"], "job name (--name / launch.job_name): 'x;rm -rf /' is not allowed"),
        (["--name=-oProxyCommand"], "is not allowed"),
        (["--time", "24:61:00"], "--time: '24:61:00' is not allowed (HH:MM:SS"),
        (["--time", "1-00:00:00"], "--time: '1-00:00:00' is not allowed"),
        (["--partition", "gpu\n#SBATCH --uid=0"], "--partition: "),
        (["--python", "python; id"], "--python: 'python; id' is not allowed"),
        (["--jobs-dir=-rf"], "--jobs-dir: '-rf' is not allowed"),
        (["--signal-before", "4000", "--time", "01:00:00"], "--signal-before: 4000 s must be positive and shorter"),
        (["--nodes", "0"], "--nodes: must be at least 1"),
        (
            ["--gpus-per-node", "3"],
            "train.global_batch_size: 32 is not divisible by data.phases.0.micro_batch_size x world size = 16 x 3",
        ),
        (["checkpoint.resume=none"], "checkpoint.resume: a requeueable SLURM job resumes from its latest checkpoint"),
        (["train.output_dir=a\nb"], "contains a control character or newline"),
        (["x y=1"], "override 'x y=1': key: 'x y' is not allowed"),
        (["model.hiden_size=3"], "model.hiden_size: unknown key"),
    ],
)
def test_bad_values_are_refused_naming_the_field(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["submit", "--backend", "slurm", "--config", str(TINY_CONFIG), "--dry-run", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "runs").exists()


def test_every_problem_is_reported_at_once(capsys):
    assert (
        main(
            [
                "submit",
                "--backend",
                "slurm",
                "--config",
                str(TINY_CONFIG),
                "--dry-run",
                "--nodes",
                "0",
                "--name",
                "a b",
                "--time",
                "soon",
                "--partition",
                "p;q",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    for field in ("--nodes", "job name", "--time", "--partition"):
        assert field in err


def test_backend_specific_refusals(tmp_path, capsys):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("good-host slots=8\n-oProxyCommand=evil slots=8\nbad_host slots=2\ngood-host slots=1\n")
    with pytest.raises(SubmitError) as e:
        parse_hostfile(str(hostfile))
    assert [p.split(": ", 1)[0] for p in e.value.problems] == [
        f"--hostfile {hostfile}:2",
        f"--hostfile {hostfile}:3",
        f"--hostfile {hostfile}:4",
    ]
    hostfile.write_text("node-a slots=1\n")
    cases = [
        (["--backend", "deepspeed", "--nodes", "2", "--gpus-per-node", "1", "--hostfile", str(hostfile)], "lists 1"),
        (["--backend", "deepspeed", "--gpus-per-node", "2", "--hostfile", str(hostfile)], "node-a in"),
        (["--backend", "deepspeed"], "--hostfile: the deepspeed backend needs a hostfile"),
        (["--backend", "local", "--nodes", "2", "--gpus-per-node", "1"], "the local backend runs on this machine only"),
        (["--backend", "ray", "--address", "ray://x:10001"], "--address: 'ray://x:10001' is not allowed"),
        (["--backend", "slurm", "--nodes", "3-2"], "--nodes: '3-2': the range's minimum is above its maximum"),
        (["--backend", "slurm", "--nodes", "two"], "--nodes: 'two' is not a number of nodes or a range MIN-MAX"),
        # SLURM may start a range on any count: 3 nodes of 8 cannot split a global batch of 32 (the others can).
        (
            ["--backend", "slurm", "--nodes", "2-4", "--gpus-per-node", "1", "data.phases.0.micro_batch_size=8"],
            "--nodes 2-4: on 3 node(s) train.global_batch_size",
        ),
        (["--backend", "deepspeed", "--nodes", "3-2", "--hostfile", str(hostfile)], "minimum is above its maximum"),
        (["--backend", "local", "--nodes", "1-2"], "launch.min_nodes: the local backend runs on one machine"),
    ]
    for argv, message in cases:
        assert main(["submit", "--config", str(TINY_CONFIG), "--dry-run", *argv]) == 2
        assert message in capsys.readouterr().err, argv
    assert main(["submit", "--backend", "slurm", "--job", "prepare", "--dry-run", "--", "--input", "x"]) == 2
    assert "runs as a Ray job" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["slurm", "deepspeed"])
def test_a_working_directory_that_would_reach_a_remote_shell_unquoted_is_refused(
    backend, tmp_path, capsys, monkeypatch
):
    """DeepSpeed's pdsh runner runs `cd {cwd}; ... --config {jobs_dir}/...` unquoted on every host, as a batch
    script's #SBATCH line holds the jobs dir: a `$(...)` there would run on the nodes."""
    hostile = tmp_path / "proj$(touch${IFS}PWNED)"
    hostile.mkdir()
    (tmp_path / "hosts").write_text("node-a slots=1\n")
    monkeypatch.chdir(hostile)
    argv = ["submit", "--config", str(TINY_CONFIG), "--dry-run", "--backend", backend, "--gpus-per-node", "1"]
    assert main([*argv, "--hostfile", str(tmp_path / "hosts")] if backend == "deepspeed" else argv) == 2
    err = capsys.readouterr().err
    assert "working directory" in err and "--jobs-dir (resolved)" in err
    assert not list(tmp_path.rglob("PWNED"))


def test_submitting_without_slurm_commands_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["submit", "--backend", "slurm", "--config", str(TINY_CONFIG), "--cpu-only"]) == 2
    assert (
        "sbatch: not found; SLURM jobs are submitted and followed from a machine with the SLURM client"
        in capsys.readouterr().err
    )


def test_prepare_arguments_reach_the_ray_entrypoint_as_one_word_each(capsys):
    hostile = ["--input", "/data/my corpus; rm -rf ~", "--output", "$(id)", "--vocab", "a'b\"c"]
    assert main(["submit", "--backend", "ray", "--job", "prepare", "--dry-run", "--", *hostile]) == 0
    entrypoint = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("entrypoint: "))
    assert shlex.split(entrypoint.removeprefix("entrypoint: ")) == ["python", "-m", "bertdist", "prepare", *hostile]


def test_render_template_needs_every_field_and_uses_every_value():
    assert render_template("a={{x}}\n{{opt}}\nb\n", {"x": "1", "opt": ""}) == "a=1\nb\n"
    with pytest.raises(SubmitError, match=r"fields without a value: \['y'\]"):
        render_template("{{x}} {{y}}", {"x": "1"})
    with pytest.raises(SubmitError, match=r"values without a field: \['z'\]"):
        render_template("{{x}}", {"x": "1", "z": "2"})


def test_status_and_logs_of_unknown_or_hostile_job_ids(tmp_path, capsys):
    assert main(["status", "12345", "--jobs-dir", str(tmp_path)]) == 2
    assert "no record" in capsys.readouterr().err
    assert main(["logs", "../../etc/passwd", "--jobs-dir", str(tmp_path)]) == 2
    assert "job id: '../../etc/passwd' is not allowed" in capsys.readouterr().err


def test_status_names_a_missing_jobs_dir_and_records_it_cannot_read(tmp_path, capsys, monkeypatch):
    """`--jobs-dir /nonexistent`, a file, and records that are not records: exit 0 and nothing printed, a record
    of the wrong shape a TypeError traceback. A job's own elastic.json is no record and is not counted."""
    assert main(["status", "--jobs-dir", str(tmp_path / "nowhere")]) == 2
    assert "--jobs-dir " + str(tmp_path / "nowhere") + " does not exist" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(["status", "--jobs-dir", str(tmp_path / "file")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "job1.json").write_text('{"x": 1}')
    (jobs / "job2.json").write_text("{not json")
    (jobs / "job3.elastic.json").write_text('{"restarts": 0}')
    assert main(["status", "--jobs-dir", str(jobs)]) == 0
    assert "2 unreadable job record(s) skipped: job1.json, job2.json" in capsys.readouterr().err
    assert main(["status", "job1", "--jobs-dir", str(jobs)]) == 2
    assert "is not a job record (it holds ['x'])" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)  # no job submitted from here yet: nothing to say
    assert main(["status"]) == 0 and capsys.readouterr().err == ""


def test_status_prints_the_runs_rollbacks_and_replays_after_its_state(tmp_path, capsys, monkeypatch):
    """A training job's record keeps its train.output_dir; `bertdist status JOB` reads the run's events there
    (bertdist.train.run_events) and prints a line for each after the state line."""
    from bertdist.launch import local
    from bertdist.launch.request import submit
    from bertdist.train import run_events

    def start(job, record):  # a job that has ended well, started by nothing
        record.exit_code_file = str(tmp_path / "exit_code")
        Path(record.exit_code_file).write_text("0")

    monkeypatch.setattr(local, "start", start)
    out, jobs = tmp_path / "out", tmp_path / "jobs"
    request = SubmitRequest(
        backend="local", config=str(TINY_CONFIG), overrides=[f"train.output_dir={out}"], jobs_dir=str(jobs)
    )
    record = submit(plan(request))
    assert main(["status", record.job_id, "--jobs-dir", str(jobs)]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == []  # no events yet: the state line alone
    out.mkdir()
    run_events.append(
        out,
        dict(
            event="replay",
            step=6,
            reason="the loss is nan",
            rolled_back_to=4,
            loss=float("nan"),
            loss_now=7.25,
            verdict="transient",
            rollback=1,
        ),
    )
    run_events.append(
        out,
        dict(
            event="rollback",
            step=9,
            reason="the loss is nan",
            rolled_back_to=8,
            verdict="data",
            batch=[[["shard_00002.bin", 5]], [["shard_00000.bin", 11]]],
            skipped_micro_batches=2,
            loader_before={"epoch": 0, "batches_done": 16},
            loader_after={"epoch": 0, "batches_done": 18},
            rollback=2,
            lr_scale=0.5,
        ),
    )
    assert main(["status", record.job_id, "--jobs-dir", str(jobs)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"succeeded\tprocess group {record.pid} exited with 0",
        "replay 1: at step 6 (the loss is nan) replayed from step 4: the loss is now 7.2500: a transient fault, "
        "nothing skipped",
        "rollback 2: at step 9 (the loss is nan) back to step 8, 2 micro batches skipped (rank 0's loader: epoch 0 "
        "batches 16-18); replayed and bad again, the data: 2 samples: shard_00002.bin 5; shard_00000.bin 11; "
        "learning rate scale 0.5",
    ]


# ---------------------------------------------------------------------------------------------
# The slow pieces overlap: the SLURM job (module fixture) trains, is preempted and waits to be requeued
# while the Ray head starts and runs `prepare`; each test then checks its own half.

SLURM_STEPS = 40
SLURM_CHECKPOINT_EVERY = 4
JOB_TIMEOUT_S = 600
"""Generous: on a machine shared with other test runs, a 2-rank start alone can take minutes."""


class SlurmPreemption:
    """A tiny training job submitted with `bertdist submit --backend slurm`, then preempted with SIGUSR1 at
    its first checkpoint: the signal that `#SBATCH --signal` sends before the time limit. A thread does the
    preempting, so the job runs on while other tests work."""

    def __init__(self, tmp: Path, shards: str, vocab: str):
        config = training_runs.write_config(tmp, shards, vocab, zero_stage=1, log_every_steps=4)
        cfg = yaml.safe_load(config.read_text())
        cfg["data"]["phases"][0].update(steps=SLURM_STEPS, eval_dir="")
        cfg["data"]["loader_workers"] = 0
        cfg["checkpoint"]["every_steps"] = SLURM_CHECKPOINT_EVERY
        config.write_text(yaml.safe_dump(cfg))
        self.out = Path(cfg["train"]["output_dir"])
        self.jobs = tmp / "jobs"
        # A node range: this one-node cluster starts (and requeues) it on the one node it has.
        submitted = bertdist(
            "submit",
            "--backend",
            "slurm",
            "--config",
            str(config),
            "--cpu-only",
            "--gpus-per-node",
            "2",
            "--nodes",
            "1-2",
            "--time",
            "00:15:00",
            "--signal-before",
            "120",
            "--master-port",
            str(free_tcp_port()),
            "--name",
            "bertdist-test",
            "--jobs-dir",
            str(self.jobs),
            env={"OMP_NUM_THREADS": "1"},
            cwd=tmp,
        )
        assert submitted.returncode == 0, submitted.stderr
        self.job_id = submitted.stdout.split("submitted slurm job ", 1)[1].split()[0]
        self.preempted = threading.Event()
        self._thread = threading.Thread(target=self._preempt_at_first_checkpoint, daemon=True)
        self._thread.start()

    def _preempt_at_first_checkpoint(self) -> None:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while training_runs.latest_tag(self.out) is None:
            if time.monotonic() > deadline:
                return  # never preempted: the test reports it with the job's log
            time.sleep(0.05)  # the job's 36 steps after its first checkpoint take a few seconds
        if subprocess.run(["scancel", "--signal=USR1", self.job_id]).returncode == 0:
            self.preempted.set()

    def cancel(self) -> None:
        subprocess.run(["scancel", self.job_id], capture_output=True)


@pytest.fixture(scope="module")
def slurm_job(tiny_shards, tiny_vocab, tmp_path_factory):
    """The preempted SLURM job, or the reason there is no SLURM here (scripts/setup_slurm.sh, which `make
    test` runs first and which returns at once when the cluster is up)."""
    skip_file = Path(tempfile.gettempdir()) / "bertdist-slurm-unavailable"
    setup = subprocess.run(
        ["bash", str(REPO / "scripts" / "setup_slurm.sh")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "SLURM_SKIP_FILE": str(skip_file)},
    )
    if skip_file.exists():
        yield f"no SLURM here: {skip_file.read_text().strip()}"
        return
    assert setup.returncode == 0, setup.stderr
    job = SlurmPreemption(tmp_path_factory.mktemp("slurm"), tiny_shards, tiny_vocab)
    try:
        yield job
    finally:
        job.cancel()


class RayHead:
    """`ray start --head` on 127.0.0.1 with token authentication, in a private temp dir, so no other Ray
    user on this machine finds it or is stopped with it.

    `ray stop` would stop every Ray on the machine (other tests run their own); `stop` ends only the
    processes of this head's session and their children, found through the session directory.
    """

    def __init__(self) -> None:
        # Short path: Ray's Unix socket names must stay under 107 characters.
        self.temp_dir = tempfile.mkdtemp(prefix="bdray-", dir="/tmp")
        self.token = secrets.token_hex(16)
        self.dashboard_port = free_tcp_port()
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        env = {
            **os.environ,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            # A job's entrypoint runs `python`: the one of this environment, as on a cluster image.
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        env.pop("RAY_ADDRESS", None)
        ports = {
            flag: str(free_tcp_port())
            for flag in (
                "--port",
                "--ray-client-server-port",
                "--dashboard-agent-listen-port",
                "--dashboard-agent-grpc-port",
                "--metrics-export-port",
                "--runtime-env-agent-port",
            )
        }
        argv = [
            str(VENV_BIN / "ray"),
            "start",
            "--head",
            "--node-ip-address",
            "127.0.0.1",
            "--dashboard-host",
            "127.0.0.1",
            "--dashboard-port",
            str(self.dashboard_port),
            "--num-cpus",
            "2",
            "--temp-dir",
            self.temp_dir,
            "--disable-usage-stats",
            *[x for kv in ports.items() for x in kv],
        ]
        self._starting = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def wait_ready(self) -> None:
        output, _ = self._starting.communicate(timeout=240)
        assert self._starting.returncode == 0, output[-3000:]

    def stop(self) -> None:
        if self._starting.poll() is None:
            self._starting.kill()
        kill_processes_mentioning(f"{self.temp_dir}/session_")
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@pytest.fixture
def ray_head():
    head = RayHead()  # starts in the background; the test's other fixtures are made meanwhile
    try:
        yield head
    finally:
        head.stop()


def _follow(job_id: str, jobs_dir: Path, env: dict | None = None) -> tuple[str, str]:
    """`bertdist logs --follow` until the job ends (one process, no polling loop here), then its status."""
    logs = bertdist("logs", job_id, "--jobs-dir", str(jobs_dir), "--follow", env=env, timeout=JOB_TIMEOUT_S)
    status = bertdist("status", job_id, "--jobs-dir", str(jobs_dir), env=env)
    return status.stdout + status.stderr, logs.stdout + logs.stderr


@pytest.mark.slow
def test_prepare_then_train_as_ray_jobs_on_a_token_protected_head(
    slurm_job, ray_head, tiny_corpus, tiny_vocab, tiny_shards, tmp_path
):
    # `slurm_job` is not used here: asking for it starts the SLURM job, which trains meanwhile.
    ray_head.wait_ready()
    output = tmp_path / "shards"
    jobs = tmp_path / "jobs"
    prepare_args = [
        "--input",
        tiny_corpus,
        "--output",
        str(output),
        "--vocab",
        tiny_vocab,
        "--max-seq-length",
        str(TEST_SEQ_LENGTH),
        "--dupe-factor",
        "2",
        "--samples-per-shard",
        str(TINY_SHARD_SAMPLES),
        "--group-mb",
        str((64 << 10) / (1 << 20)),
        "--workers",
        "2",
        "--no-progress",
    ]
    submit = [
        "submit",
        "--backend",
        "ray",
        "--address",
        ray_head.address,
        "--jobs-dir",
        str(jobs),
        "--job",
        "prepare",
        "--",
        *prepare_args,
    ]

    # Without the token the head refuses the job, and says what is missing.
    refused = bertdist(*submit, env={"RAY_AUTH_TOKEN": "", "RAY_AUTH_MODE": "", "HOME": str(tmp_path)})
    assert refused.returncode == 2 and "token" in refused.stderr.lower(), refused.stderr[-2000:]

    # With the token in the environment (as a user exports it), our client turns token mode on by itself.
    env = {"RAY_AUTH_TOKEN": ray_head.token, "RAY_AUTH_MODE": ""}
    submitted = bertdist(*submit, env=env)
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    job_id = submitted.stdout.split("submitted ray job ", 1)[1].split()[0]
    assert f"dashboard: {ray_head.address}/#/jobs/{job_id}" in submitted.stdout

    status, logs = _follow(job_id, jobs, env)
    assert status.startswith("succeeded"), status + logs[-3000:]
    assert "wrote" in logs
    record = json.loads((jobs / f"{job_id}.json").read_text())
    assert record["backend"] == "ray" and record["address"] == ray_head.address

    # The cluster's shards are byte-identical to the ones the in-process pipeline made from the same inputs.
    got = json.loads((output / "manifest.json").read_text())
    want = json.loads((Path(tiny_shards) / "manifest.json").read_text())
    assert [(s["name"], s["num_samples"], s["sha256"]) for s in got["shards"]] == [
        (s["name"], s["num_samples"], s["sha256"]) for s in want["shards"]
    ]
    assert all((output / s["name"]).is_file() for s in got["shards"])

    # Training on the cluster's shards, as a Ray job (bertdist.launch.ray_job: the elastic supervisor, a task per node).
    config = training_runs.write_config(tmp_path / "train", str(output), tiny_vocab, zero_stage=1)
    submitted = bertdist(
        "submit",
        "--backend",
        "ray",
        "--address",
        ray_head.address,
        "--jobs-dir",
        str(jobs),
        "--config",
        str(config),
        "--cpu-only",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--master-port",
        str(free_tcp_port()),
        "data.phases.0.steps=2",
        "data.phases.0.eval_dir=",
        "data.loader_workers=0",
        "optim.warmup_steps=1",
        "checkpoint.every_steps=2",
        env=env,
    )
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    job_id = submitted.stdout.split("submitted ray job ", 1)[1].split()[0]
    status, logs = _follow(job_id, jobs, env)
    assert status.startswith("succeeded"), status + logs[-3000:]
    assert "launching 1 rank(s) on 1 host(s)" in logs and "done: 2 steps" in logs
    assert "world size 1 on" in status and "0 restart(s)" in status, status  # the supervisor's state file
    assert training_runs.latest_tag(tmp_path / "train" / "out") == "step_00000002"
    listing = bertdist("status", "--jobs-dir", str(jobs)).stdout.splitlines()
    assert [line.split("\t")[1:3] for line in listing] == [["ray", "prepare"], ["ray", "train"]]


@pytest.mark.slow
def test_slurm_job_is_preempted_requeued_and_resumes_from_its_checkpoint(slurm_job):
    if isinstance(slurm_job, str):
        pytest.skip(slurm_job)
    status, log = _follow(slurm_job.job_id, slurm_job.jobs)
    assert slurm_job.preempted.is_set(), log[-3000:]
    assert status.startswith("succeeded") and "restarts 1" in status, status + log[-4000:]
    assert "the trainer checkpointed for preemption; requeueing" in log
    assert "#SBATCH --nodes=1-2" in next(slurm_job.jobs.glob("*.sbatch")).read_text()
    stopped_at = int(re.search(r"stopped \(SIGUSR1\): checkpoint at step (\d+);", log).group(1))
    assert SLURM_CHECKPOINT_EVERY <= stopped_at < SLURM_STEPS
    out = slurm_job.out
    assert "restart 1 on" in log and f"resumed from {out}/checkpoints/step_{stopped_at:08d} at step {stopped_at}" in log
    assert f"training steps {stopped_at}..{SLURM_STEPS - 1}" in log
    assert training_runs.latest_tag(out) == f"step_{SLURM_STEPS:08d}"
    assert max(training_runs.read_metrics(out)) == SLURM_STEPS


@pytest.mark.slow
def test_a_rank_that_crashed_beside_a_preempted_one_fails_the_slurm_job_unrequeued(slurm_job, tmp_path):
    """srun returns its tasks' highest exit code: rank 0's preemption checkpoint (75) beside rank 1's crash (1) was
    requeued as a preemption, and the crash was never shown. Each rank's own code now decides. The ranks are a
    stand-in for `python -m bertdist train` (`--python`): what is tested is the job script around them."""
    if isinstance(slurm_job, str):
        pytest.skip(slurm_job)
    fake = tmp_path / "python"
    fake.write_text('#!/bin/bash\ncodes=(75 1)\nexit "${codes[$SLURM_PROCID]}"\n')
    fake.chmod(0o755)
    jobs = tmp_path / "jobs"
    submitted = bertdist(
        *("submit", "--backend", "slurm", "--config", "bert-tiny", "--cpu-only", "--gpus-per-node", "2"),
        *("--nodes", "1", "--time", "00:10:00", "--python", str(fake), "--name", "bertdist-crash"),
        *("--jobs-dir", str(jobs)),
        cwd=tmp_path,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split("submitted slurm job ", 1)[1].split()[0]
    status, log = _follow(job_id, jobs)
    assert status.startswith("failed") and "restarts 0" in status, status + log[-3000:]
    assert "failed (rank 1: 1; srun's code 75); not requeued" in log and "requeueing" not in log, log[-3000:]
    assert not (tmp_path / ".bertdist-exits" / f"{job_id}-0").exists()


def test_ship_package_uploads_this_installations_bertdist_and_only_for_ray(tmp_path):
    import bertdist

    config = str(REPO / "configs" / "bert-tiny.yaml")
    job = plan(SubmitRequest(backend="ray", config=config, ship_package=True, jobs_dir=str(tmp_path)))
    assert job.runtime_env["py_modules"] == [str(Path(bertdist.__file__).parent)]
    assert "py_modules" not in plan(SubmitRequest(backend="ray", config=config, jobs_dir=str(tmp_path))).runtime_env
    with pytest.raises(SubmitError, match="--ship-package: only Ray jobs"):
        plan(SubmitRequest(backend="local", config=config, ship_package=True, jobs_dir=str(tmp_path)))


def test_status_lists_a_job_whose_name_holds_dots(tmp_path, capsys):
    """Names may hold dots (bert-v1.5): skipping every *.x.json as a job's elastic state hid such jobs."""
    import dataclasses

    from bertdist.launch.job import JobRecord

    fields = {f.name: "" for f in dataclasses.fields(JobRecord) if f.default is dataclasses.MISSING}
    for job_id in ("bert-20260101-120000-ab12", "bert-v1.5-20260101-120000-cd34"):
        JobRecord(**{**fields, "job_id": job_id, "backend": "local", "job": "train", "name": "x"}).save(tmp_path)
    (tmp_path / "bert-20260101-120000-ab12.elastic.json").write_text('{"restarts": 0}')
    assert main(["status", "--jobs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "bert-v1.5-20260101-120000-cd34" in out.out and "unreadable" not in out.err


def test_a_ray_job_api_that_accepts_and_never_answers_is_one_line_not_a_wait_for_good(tmp_path, capsys, monkeypatch):
    """Ray's client sends its requests without a timeout: `bertdist status` of a Ray job whose address accepted
    connections and never answered (a proxy, a stopped dashboard) waited until Ctrl-C."""
    import socket

    from bertdist.launch import ray as ray_backend
    from bertdist.launch.job import JobRecord

    monkeypatch.setattr(ray_backend, "API_TIMEOUT_S", 2.0)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    address = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        JobRecord("ray-job-1", "ray", "train", "x", "", address=address).save(tmp_path)
        started = time.monotonic()
        assert main(["status", "ray-job-1", "--jobs-dir", str(tmp_path)]) == 2
        assert time.monotonic() - started < 30
        assert f"Ray job API at {address}: no answer within 2 s" in capsys.readouterr().err
    finally:
        silent.close()
