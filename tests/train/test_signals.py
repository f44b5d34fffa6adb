"""A signal to whatever process the user started stops the run where the docs say, and leaves no process behind:
SIGTERM to the `deepspeed` launcher alone (its ranks and their DataLoader workers are not signalled), SIGTERM or
SIGKILL to the supervisor of `bertdist submit --backend local`: a checkpoint at the step of the stop, exit 75,
nothing running; SIGTERM and SIGINT (Ctrl-C) to `bertdist finetune`: the finished epochs kept, its MLflow run
KILLED, one line. A shell that started a run and ended is no launcher: `nohup bertdist train ... &` trains on."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertdist.errors import REQUEUE_EXIT_CODE
from bertdist.train.ports import free_tcp_port
from tests import training_runs as runs
from tests.conftest import REPO

pytestmark = pytest.mark.slow

UNTIL_THE_END = ["checkpoint.every_steps=100000", "train.eval_every_steps=100000"]
"""No checkpoint or evaluation before the run ends or stops: the last checkpoint is the one of the end or the stop."""
LONG_RUN = ["data.phases.0.steps=100000", *UNTIL_THE_END]
CPU_ENV = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}


def run_environment(marker: str) -> dict[str, str]:
    """The environment a run is started with: on CPU, and with `marker` in a variable that every process of the
    run inherits, the loader's fork server and its workers included (their command lines name no run)."""
    return {**os.environ, **CPU_ENV, "BERTDIST_TEST_RUN": marker}


def processes_mentioning(marker: str) -> list[str]:
    """Command lines of the live processes (zombies aside) whose arguments or environment contain `marker`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environment = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
            state = runs.process_state(int(pid))
        except OSError:
            continue
        if (marker in cmdline or marker in environment) and state != "Z" and int(pid) != os.getpid():
            found.append(f"{pid}: {cmdline[:160]}")
    return found


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(0.2)


def assert_stopped_with_a_checkpoint(out: Path, log_file: Path, marker: str) -> None:
    """Every process of the run gone within 30 s, and a checkpoint at the step where it stopped."""
    try:
        wait_until(
            lambda: not processes_mentioning(marker),
            30,
            "every process of the run (ranks, loader server and workers) to exit",
        )
    finally:
        for line in processes_mentioning(marker):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
    log = log_file.read_text()
    stopped = [line for line in log.splitlines() if line.startswith("stopped (")]
    assert stopped and f"exiting with {REQUEUE_EXIT_CODE}" in stopped[0], log[-3000:]
    step = int(stopped[0].split("checkpoint at step ")[1].split(";")[0])
    assert runs.latest_tag(out) == f"step_{step:08d}" and step > 0


def mapped(paths: set[str]) -> list[str]:
    """Each mapping of one of `paths` by a live process, as /proc/PID/maps shows it (a removed file: "PATH
    (deleted)")."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
            found += [line.split(None, 5)[5] for line in lines if any(p in line for p in paths)]
    return found


def test_sigterm_to_the_deepspeed_launcher_alone_checkpoints_and_leaves_no_process(tmp_path, tiny_shards, tiny_vocab):
    """... nor memory: DeepSpeed's launcher puts both ranks on one host, where DeepSpeed maps a 69 MB shared-memory
    buffer per rank and leaves it in /dev/shm for good; bertdist removes their names (bertdist.train.shm_buffers)
    while they are mapped, so the run holds them and no file is left (tmpfs: RAM) when it ends."""
    from bertdist.train.shm_buffers import allreduce_buffer

    config = runs.write_config(tmp_path, tiny_shards, tiny_vocab, 1)
    log = tmp_path / "launcher.log"
    deepspeed = Path(sys.executable).with_name("deepspeed")
    port = free_tcp_port()
    with open(log, "w") as out:
        launcher = subprocess.Popen(
            [
                str(deepspeed),
                "--num_gpus",
                "2",
                "--master_port",
                str(port),
                "--module",
                "bertdist",
                "train",
                "--config",
                str(config),
                *LONG_RUN,
            ],
            env=run_environment(str(config)),
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: "step 3/" in log.read_text() or launcher.poll() is not None, 240, "training to start")
        assert launcher.poll() is None, log.read_text()[-3000:]
        buffers = {str(allreduce_buffer(rank, "127.0.0.1", port)) for rank in (0, 1)}
        maps = mapped(buffers)  # each rank maps both ranks'
        assert len(maps) >= 4 and set(maps) == {f"{b} (deleted)" for b in buffers}, maps
        launcher.send_signal(signal.SIGTERM)  # the launcher only, as `kill PID` does; not its process group
        launcher.wait(timeout=30)
        assert_stopped_with_a_checkpoint(tmp_path / "out", log, str(config))
        assert "its launcher (" in log.read_text()
        assert not any(Path(b).exists() for b in buffers), buffers
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_a_local_jobs_supervisor_signalled_or_killed_leaves_a_checkpoint_and_no_process(
    signum, tmp_path, tiny_shards, tiny_vocab
):
    from bertdist.launch.job import JobRecord
    from bertdist.launch.status import job_status

    config = runs.write_config(tmp_path, tiny_shards, tiny_vocab, 1)
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
            str(config),
            "--cpu-only",
            "--gpus-per-node",
            "2",
            "--master-port",
            str(free_tcp_port()),
            "--jobs-dir",
            str(jobs),
            *LONG_RUN,
        ],
        env=run_environment(str(jobs)),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    record = JobRecord.load(next(jobs.glob("*.json")).stem, jobs)
    log = Path(record.log_file)
    try:
        wait_until(lambda: "step 3/" in log.read_text(), 240, f"training to start ({submitted.stdout})")
        os.kill(record.pid, signum)  # the process `bertdist submit` started and printed, not its group
        assert_stopped_with_a_checkpoint(tmp_path / "out", log, str(jobs))  # the job runs the config copied there
        status = job_status(record)
        if signum == signal.SIGTERM:
            wait_until(Path(record.exit_code_file).is_file, 10, "the supervisor's exit code")
            assert status.state == "stopped" and "stopped by SIGTERM" in status.detail, (
                status
            )  # not torchrun's "exit 1"
        else:
            assert status.state == "stopped" and "supervisor" in status.detail and "was killed" in status.detail, status
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, signal.SIGKILL)


def test_a_run_started_with_nohup_by_a_script_trains_on_after_the_script_ends(tmp_path, tiny_shards, tiny_vocab):
    """A cron job or `ssh node 'nohup bertdist train ... &'`: the run shares the shell's process group, and the
    shell ends once the run has started; the run is detached, not stopped."""
    config = runs.write_config(tmp_path, tiny_shards, tiny_vocab, 1)
    log = tmp_path / "train.log"
    steps = 100  # seconds of training after the shell has ended, while the launcher watch looks every second
    train = [
        sys.executable,
        "-m",
        "bertdist",
        "train",
        "--config",
        str(config),
        f"launch.master_port={free_tcp_port()}",
        f"data.phases.0.steps={steps}",
        *UNTIL_THE_END,
    ]
    script = (
        f"nohup {shlex.join(train)} > {shlex.quote(str(log))} 2>&1 & "
        f"until grep -q 'step 1/' {shlex.quote(str(log))}; do sleep 0.2; done"
    )
    shell = subprocess.Popen(["bash", "-c", script], env=run_environment(str(config)), cwd=REPO, start_new_session=True)
    try:
        assert shell.wait(timeout=240) == 0
        wait_until(lambda: not processes_mentioning(str(config)), 240, "the run to end")
        output = log.read_text()
        assert "its launcher (" not in output and "stopped (" not in output, output[-3000:]
        assert runs.latest_tag(tmp_path / "out") == f"step_{steps:08d}", output[-3000:]
    finally:
        for line in processes_mentioning(str(config)):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_finetune_keeps_its_epochs_marks_its_run_killed_and_says_so_in_one_line(
    signum, tmp_path, tiny_corpus, tiny_vocab
):
    from bertdist.model.bert.hf import save_pretrained
    from bertdist.model.bert.model import BertForPreTraining
    from bertdist.tracking.store import client, local_store_uri
    from tests.conftest import tiny_model_config
    from tests.finetune.test_runner import _task

    save_pretrained(BertForPreTraining(tiny_model_config()), tmp_path / "model", tiny_vocab)
    train, dev = _task(tmp_path, tiny_corpus)
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bertdist",
            "finetune",
            f"finetune.init_from={tmp_path / 'model'}",
            f"finetune.train_file={train}",
            f"finetune.dev_file={dev}",
            f"finetune.output_dir={out}",
            "finetune.epochs=1000",
            "finetune.batch_size=8",
            "finetune.micro_batch_size=8",
            f"launch.master_port={free_tcp_port()}",
        ],
        env=run_environment(str(out)),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("bertdist finetune: epoch 1/"):
            break
    assert proc.poll() is None, "".join(lines)[-3000:]
    proc.send_signal(signum)
    rest, _ = proc.communicate(timeout=60)
    output = "".join(lines) + rest
    assert proc.returncode == REQUEUE_EXIT_CODE, output[-3000:]
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest
    stopped = [line for line in rest.splitlines() if " stopped (" in line]
    assert len(stopped) == 1 and f"stopped ({signal.Signals(signum).name})" in stopped[0], rest
    assert (
        "the checkpoint of epoch 1 and its best model are kept" in stopped[0]
        and (out / "model" / "config.json").is_file()
    )
    store = client(local_store_uri(str(out)))
    runs_found = store.search_runs(experiment_ids=[e.experiment_id for e in store.search_experiments()])
    assert [r.info.status for r in runs_found] == ["KILLED"]
    assert not processes_mentioning(str(out))
