"""End-to-end training with 2 real DeepSpeed ranks on CPU: exact resume after SIGKILL and SIGTERM for
ZeRO 2 and 3 in fp32 and ZeRO 2 in bf16 (ZeRO 1 in fp32 resumes bit-identically after a damaged checkpoint, a
stopped rank and a full disk below), falling loss, the learning-rate curve, and clear failures on
bad configs and shards."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from bertdist.config import load_config
from bertdist.errors import REQUEUE_EXIT_CODE, USAGE_EXIT_CODE
from bertdist.train.checkpoint import read_train_state
from bertdist.train.consolidate import consolidated_state_dict
from bertdist.train.listing import listing
from bertdist.train.optim import learning_rate
from bertdist.train.trainer import train
from tests import training_runs as runs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    return str(tmp_path_factory.getbasetemp() / "training")


RESUMED_ENGINES = [(stage, precision) for stage, precision in runs.ENGINES if stage != 1]
"""The engines killed and resumed here. ZeRO 1 is left to the damaged-checkpoint, stopped-rank and full-disk tests,
which resume it bit-identically too: its optimizer is ZeRO 2's class (DeepSpeedZeroOptimizer, in bf16 as well,
since bertdist accumulates gradients in the model's dtype and so never gets DeepSpeed's BF16_Optimizer) without the
gradient partitioning, and the two resumes cost 35 s of every CI run."""


@pytest.mark.parametrize("zero_stage, precision", RESUMED_ENGINES, ids=runs.engine_ids(RESUMED_ENGINES))
def test_resume_after_sigkill_and_sigterm_is_bit_identical(base, tiny_shards, tiny_vocab, zero_stage, precision):
    reference = runs.uninterrupted(base, tiny_shards, tiny_vocab, zero_stage, precision)
    crash = zero_stage == 2 and precision == "fp32"
    resumed = runs.interrupted(base, tiny_shards, tiny_vocab, zero_stage, crash_during_save=crash, precision=precision)
    assert reference.exit_codes["run"] == [0, 0], reference.notes["run"][-3000:]

    runs.assert_terminated_with_a_checkpoint(resumed)
    assert resumed.exit_codes["final"] == [0, 0], resumed.notes["final"][-3000:]

    final = f"step_{runs.STEPS:08d}"
    want = consolidated_state_dict(reference.out / "checkpoints" / final)
    got = consolidated_state_dict(resumed.out / "checkpoints" / final)
    assert want.keys() == got.keys()
    different = [k for k in want if not torch.equal(want[k], got[k])]
    assert not different, f"parameters differ after resume: {different}"

    expected, logged = runs.read_metrics(reference.out), runs.read_metrics(resumed.out)
    assert sorted(expected) == sorted(logged) == list(range(1, runs.STEPS + 1))
    for step in expected:
        for key in (
            "loss/train",
            "loss/train_mlm",
            "loss/train_nsp",
            "mlm_accuracy/train",
            "optimizer/grad_norm",
            "optimizer/learning_rate",
            "progress/tokens_seen",
        ):
            assert logged[step][key] == expected[step][key], (step, key)


def test_loss_falls_and_learning_rate_follows_warmup_then_linear_decay(base, tiny_shards, tiny_vocab):
    run = runs.uninterrupted(base, tiny_shards, tiny_vocab, 1)
    metrics = runs.read_metrics(run.out)
    losses = [metrics[s]["loss/train"] for s in sorted(metrics)]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2, losses
    rates = [metrics[s]["optimizer/learning_rate"] for s in sorted(metrics)]
    assert rates == pytest.approx(
        [learning_rate(s, runs.PEAK_LR, runs.WARMUP_STEPS, runs.STEPS) for s in range(runs.STEPS)]
    )
    last = metrics[runs.STEPS]
    for key in (
        "throughput/sequences_per_second",
        "throughput/tokens_per_second",
        "throughput/tokens_per_second_per_rank",
        "throughput/mfu",
        "throughput/data_wait_fraction",
        "optimizer/grad_norm",
    ):
        assert last[key] > 0, key
    assert last["throughput/tokens_per_second_per_rank"] == pytest.approx(last["throughput/tokens_per_second"] / 2)
    assert 0.1 < last["throughput/packing_efficiency"] <= 1
    assert 0.1 < last["memory/peak_gb"] < 64  # the largest rank's resident set, GiB
    assert last["optimizer/loss_scale"] == 1.0 and last["optimizer/skipped_steps"] == 0
    evals = [json.loads(line) for line in (run.out / "metrics.jsonl").read_text().splitlines() if "loss/eval" in line]
    assert [e["step"] for e in evals] == [0, 4, 8]
    assert evals[-1]["loss/eval_mlm"] < evals[0]["loss/eval_mlm"]


# ---------------------------------------------------------------------------------------------
# Failing at start: in-process, with the environment of rank 0 of 2 (nothing is started before the
# checks, so no second process is needed).


@pytest.fixture
def rank0_of_2(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_PORT", "29999")


def _config(tmp_path: Path, shards: str, vocab: str, *overrides: str):
    path = runs.write_config(tmp_path, shards, vocab, zero_stage=1)
    return load_config(path, list(overrides))


def _copy_shards(tiny_shards: str, target: Path, edit) -> str:
    shutil.copytree(tiny_shards, target)
    manifest = json.loads((target / "manifest.json").read_text())
    edit(manifest)
    (target / "manifest.json").write_text(json.dumps(manifest))
    return str(target)


@pytest.mark.parametrize(
    "case, message",
    [
        ("wrong_vocab", "another vocabulary"),
        ("wrong_length", "max_seq_length 32, not 64"),
        ("no_shards", "the manifest lists no shards"),
        ("too_few_samples_for_ranks", "cannot give each of 2 ranks"),
        ("missing_shard", "listed in the manifest but missing"),
        ("batch_not_divisible", "train.global_batch_size: 18 is not divisible"),
        ("missing_eval", "manifest"),
    ],
)
def test_bad_config_or_shards_fail_at_start(rank0_of_2, tmp_path, tiny_shards, tiny_vocab, capsys, case, message):
    shards, vocab, overrides = tiny_shards, tiny_vocab, []
    if case == "wrong_vocab":
        vocab = str(tmp_path / "vocab.txt")
        tokens = Path(tiny_vocab).read_text().splitlines()
        tokens[-2], tokens[-1] = tokens[-1], tokens[-2]  # same size, other ids: other shards
        Path(vocab).write_text("\n".join(tokens) + "\n")
    elif case == "wrong_length":
        overrides = ["data.phases.0.max_seq_length=64"]
    elif case == "no_shards":
        shards = _copy_shards(tiny_shards, tmp_path / "empty", lambda m: m.update(shards=[]))
    elif case == "too_few_samples_for_ranks":
        overrides = ["data.phases.0.micro_batch_size=100000", "train.global_batch_size=200000"]
    elif case == "missing_shard":

        def add_a_missing_shard(m):
            m["shards"].append({**m["shards"][0], "name": "gone.tar"})
            m["totals"]["samples"] += m["shards"][0]["num_samples"]

        shards = _copy_shards(tiny_shards, tmp_path / "missing", add_a_missing_shard)
    elif case == "batch_not_divisible":
        overrides = ["train.global_batch_size=18"]
    elif case == "missing_eval":
        overrides = [f"data.phases.0.eval_dir={tmp_path / 'nowhere'}"]
    cfg = _config(tmp_path / "run", shards, vocab, *overrides)
    assert train(cfg) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert message in err, err
    assert not (Path(cfg.train.output_dir) / "checkpoints").exists()


@pytest.mark.slow
def test_a_killed_rank_is_named_by_the_ranks_it_leaves(base, tiny_shards, tiny_vocab):
    """SIGKILL rank 0 mid-run (by itself, after the first checkpoint: a kill from outside, timed by polling its
    log, could land after the run's last collective): rank 1 does not hang or print a traceback; it says in one
    line that it lost its peers, naming itself and its host, so the rank that stopped first is the one without
    that line."""
    config = runs.write_config(Path(base) / "killed-rank", tiny_shards, tiny_vocab, zero_stage=1, log_every_steps=1)
    ranks = runs.start_ranks(config, "killed-rank", python_code=runs.signal_after_checkpoint("SIGKILL", rank=0))
    codes = ranks.wait()
    assert codes[0] == -9, ranks.output(0)[-3000:]
    survivor = ranks.output(1)
    assert codes[1] == 1, survivor[-3000:]
    assert "[rank 1 on " in survivor and "lost contact with the other ranks" in survivor and "Traceback" not in survivor


def test_a_damaged_newest_checkpoint_is_skipped_and_the_run_resumes_bit_identically(
    base, tiny_shards, tiny_vocab, tmp_path, capsys
):
    """The newest checkpoint's model file cut to 1,000 bytes after it was declared complete (a bad disk):
    `bertdist checkpoints` names it, and `--resume auto` never loads it but continues from the intact step
    before it, ending with the same weights as a run that was never damaged."""
    from bertdist.cli import main

    reference = runs.uninterrupted(base, tiny_shards, tiny_vocab, 1)
    config = runs.write_config(tmp_path / "run", tiny_shards, tiny_vocab, zero_stage=1)
    out = tmp_path / "run" / "out"
    shutil.copytree(reference.out, out)
    final = f"step_{runs.STEPS:08d}"
    model_file = out / "checkpoints" / final / "mp_rank_00_model_states.pt"
    model_file.write_bytes(model_file.read_bytes()[:1000])

    assert main(["checkpoints", str(out)]) == 1
    listed = capsys.readouterr().out
    assert f"{final}    DAMAGED" in listed and "mp_rank_00_model_states.pt" in listed
    assert f"step_{runs.CHECKPOINT_EVERY:08d}    intact" in listed

    ranks = runs.start_ranks(config, "resume-damaged", "--resume", "auto", "tracking.enabled=true")
    assert ranks.wait() == [0, 0], ranks.output(0)[-3000:]
    assert f"resuming from the older step_{runs.CHECKPOINT_EVERY:08d} instead" in ranks.output(0)
    import mlflow

    from bertdist.tracking.store import local_store_uri

    client = mlflow.MlflowClient(local_store_uri(out))
    (run,) = client.search_runs([client.get_experiment_by_name("bertdist").experiment_id])  # the MLflow run says so too
    assert (
        run.data.tags["bertdist.resume_fallback"]
        == f"{final} failed verification; resumed from the older step_{runs.CHECKPOINT_EVERY:08d}"
    )
    want = consolidated_state_dict(reference.out / "checkpoints" / final)
    got = consolidated_state_dict(out / "checkpoints" / final)
    assert [k for k in want if not torch.equal(want[k], got[k])] == []


@pytest.mark.slow
def test_a_stopped_rank_ends_the_job_within_the_stall_timeout_and_resume_continues(
    base, tiny_shards, tiny_vocab, tmp_path
):
    """SIGSTOP rank 1 after the first checkpoint (stopped, not dead: its sockets stay open, so nothing fails
    by itself): rank 0's watchdog names rank 1 and its host, exits with the requeue code, and kills the
    stopped rank on its host; every process is gone within the timeout plus a few seconds. `--resume auto`
    then ends with the weights of a run that was never stopped. Rank 1 stops itself, as the checkpoint
    completes: a stop from outside, timed by polling for the checkpoint, could land after its last collective."""
    import signal
    import time

    stall_timeout_s = 8
    reference = runs.uninterrupted(base, tiny_shards, tiny_vocab, 1)
    config = runs.write_config(tmp_path / "run", tiny_shards, tiny_vocab, zero_stage=1, stall_timeout_s=stall_timeout_s)
    out = tmp_path / "run" / "out"
    ranks = runs.start_ranks(config, "stopped", python_code=runs.signal_after_checkpoint("SIGSTOP", rank=1))
    try:
        ranks.wait_for(lambda: runs.process_state(ranks.procs[1].pid) == "T", "rank 1 to stop")
        stopped_at = time.monotonic()
        for p in ranks.procs:
            p.wait(timeout=stall_timeout_s + 30)
        gone_after_s = time.monotonic() - stopped_at
    finally:
        ranks.kill()  # a stopped rank left behind would hold its cores for the rest of the suite
    log = ranks.output(0)
    assert [p.returncode for p in ranks.procs] == [REQUEUE_EXIT_CODE, -signal.SIGKILL], log[-3000:]
    assert gone_after_s < stall_timeout_s + 15, gone_after_s
    assert "[rank 0 on " in log and f"train.stall_timeout_s={stall_timeout_s}" in log, log[-3000:]
    assert "rank 1 on " in log and "sent no heartbeat in" in log and "Traceback" not in log, log[-3000:]

    ranks = runs.start_ranks(config, "resumed", "--resume", "auto")
    assert ranks.wait() == [0, 0], ranks.output(0)[-3000:]
    final = f"step_{runs.STEPS:08d}"
    want = consolidated_state_dict(reference.out / "checkpoints" / final)
    got = consolidated_state_dict(out / "checkpoints" / final)
    assert [k for k in want if not torch.equal(want[k], got[k])] == []


@pytest.mark.slow
def test_a_rank_slowed_by_stops_is_named_with_its_host_within_twenty_steps(tiny_shards, tiny_vocab, tmp_path):
    """Rank 1 is stopped three quarters of the time (SIGSTOP for 30 ms, SIGCONT for 10 ms, as a throttled host):
    every rank's step is as slow, so the step time names no one; the time outside collectives does. Rank 0 names
    rank 1 and its host once, within 20 steps, and the run finishes; each rank's times are metrics.

    The stops are that long because a step here is ~10 ms of work: stopped half the time in 10 ms turns, rank 1's
    busy time came out 1.4-2x rank 0's, astride the factor of 1.5, and a loaded CI machine saw no two slow windows
    running. Stopped 3/4 of the time it measured 4.5-5.4x."""
    import re
    import signal
    import socket
    import threading
    import time

    config = runs.write_config(tmp_path / "run", tiny_shards, tiny_vocab, zero_stage=1, straggler_window_steps=5)
    cfg = yaml.safe_load(config.read_text())
    cfg["data"]["phases"][0]["steps"] = 30
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run" / "out"
    ranks = runs.start_ranks(config, "slowed")
    ranks.wait_for(lambda: (out / "metrics.jsonl").is_file() and runs.read_metrics(out), "the first step")
    done = threading.Event()

    def throttle(first: subprocess.Popen, rank: subprocess.Popen) -> None:
        """Until rank 0 has ended (the run with it): throttled, rank 1's interpreter took 145 s to exit
        (its final garbage collections walk the whole heap, in the 10 ms slices it is let run), 2 s unthrottled."""
        while not done.is_set() and first.poll() is None and rank.poll() is None:
            rank.send_signal(signal.SIGSTOP)
            time.sleep(0.03)
            rank.send_signal(signal.SIGCONT)
            time.sleep(0.01)

    slowing = threading.Thread(target=throttle, args=ranks.procs)
    slowing.start()
    try:
        codes = ranks.wait()
    finally:
        done.set()
        slowing.join()
    log = ranks.output(0)
    assert codes == [0, 0], log[-3000:]
    named = re.findall(r"rank (\d) on (\S+) is slow: over steps (\d+)-(\d+)", log)
    assert [(r, host) for r, host, _, _ in named] == [("1", socket.gethostname())], log[-3000:]
    assert int(named[0][3]) <= 20 and "train.straggler_factor=1.5" in log
    records = [r for step, r in runs.read_metrics(out).items() if step > 1]  # step 1 waits for the loaders to start
    busy = [sum(r[f"ranks/r{rank:05d}_busy_seconds"] for r in records) for rank in (0, 1)]
    assert busy[1] > busy[0] > 0, busy


@pytest.mark.slow
def test_a_nan_step_is_replayed_then_skipped_when_its_data_is_bad_and_leaves_no_trace(
    base, tiny_shards, tiny_vocab, tmp_path
):
    """Step 6's loss (and so its gradients and the weights it updates) is NaN on every rank.
    - transient: NaN once; the replay of steps 5-6 from the checkpoint of step 4 is good, nothing is skipped, and
      the run ends with the losses and the weights of a run that never saw the NaN.
    - data: NaN whenever its batch is read; the replay is NaN again, the batch is named (every rank's shard and
      sample), its 2 x 2 micro batches are skipped, and the learning rate is halved from then on.
    - judged: no replay (train.replay_bad_steps: false); step 6 judged bad without any NaN is skipped the same way;
      the data run ends with its weights: the NaN left nothing behind."""
    finals, out = {}, {}
    for kind, poison, always, replay in (
        ("transient", True, False, True),
        ("data", True, True, True),
        ("judged", False, False, False),
    ):
        config = runs.write_config(
            tmp_path / kind,
            tiny_shards,
            tiny_vocab,
            zero_stage=1,
            on_bad_step="rollback",
            replay_bad_steps=replay,
            rollback_lr_factor=0.5,
        )
        code = runs.BAD_STEP.format(batches_done=2 * 5, poison=poison, judged=not poison, always=always)
        ranks = runs.start_ranks(config, kind, python_code=code)
        codes = ranks.wait()
        log = ranks.output(0)
        assert codes == [0, 0] and "done: 8 steps" in log, log[-3000:]
        reason = "the loss is nan" if poison else "judged bad by the test"
        replaying = "step 6: the loss is nan: rolled back to the checkpoint of step 4 to replay steps 5-6"
        assert (replaying in log) == replay, log[-3000:]
        out[kind] = tmp_path / kind / "out"
        finals[kind] = consolidated_state_dict(out[kind] / "checkpoints" / f"step_{runs.STEPS:08d}")
        (event,) = [json.loads(line) for line in (out[kind] / "events.jsonl").read_text().splitlines()]
        listed, damaged = listing(out[kind])
        assert not damaged
        if kind == "transient":
            assert re.search(
                r"replayed steps 5-6 from the checkpoint of step 4: the loss at step 6 is now \d+\.\d{4} \(was nan\): "
                "a transient fault, not the data; nothing skipped",
                log,
            ), log[-3000:]
            assert (event["event"], event["verdict"], event["step"], event["rolled_back_to"]) == (
                "replay",
                "transient",
                6,
                4,
            )
            assert listed.endswith("a transient fault, nothing skipped"), listed
            continue
        again = " again in its replay: the data, not a transient fault (its batch: 16 samples: " if replay else ": "
        assert (
            f"step 6: {reason}{again}" in log
            and "rolled back to the checkpoint of step 4 and skipped the 4 micro batches that steps 5-6 read (this "
            "rank's loader: epoch 0 batches 8-12); rollback 1 of train.max_rollbacks=3; learning rate scale 0.5 "
            "(train.rollback_lr_factor=0.5)"
            in log
        ), log[-3000:]
        assert (event["event"], event["step"], event["rolled_back_to"], event["skipped_micro_batches"]) == (
            "rollback",
            6,
            4,
            4,
        )
        assert listed.endswith("learning rate scale 0.5") and (
            f"rollback 1: at step 6 ({reason}) back to step 4, 4 micro batches skipped (rank 0's loader: epoch 0 "
            "batches 8-12)" in listed
        ), listed
        logged = runs.read_metrics(out[kind])
        scales = [logged[s]["optimizer/lr_scale"] for s in sorted(logged)]
        assert scales == [1.0] * 4 + [0.5] * 4
        rates = [logged[s]["optimizer/learning_rate"] for s in sorted(logged)]
        assert rates == pytest.approx(
            [scale * learning_rate(s, runs.PEAK_LR, runs.WARMUP_STEPS, runs.STEPS) for s, scale in enumerate(scales)]
        )
        assert read_train_state(out[kind] / "checkpoints" / f"step_{runs.STEPS:08d}").lr_scale == 0.5
    batch = json.loads((out["data"] / "events.jsonl").read_text())["batch"]
    shards = {p.name for p in Path(tiny_shards).iterdir()}
    assert [len(rank) for rank in batch] == [8, 8] and all(s in shards and i >= 0 for rank in batch for s, i in rank)
    assert not set(map(tuple, batch[0])) & set(map(tuple, batch[1]))  # each rank's own samples
    assert all(torch.isfinite(v).all() for v in finals["data"].values() if v.is_floating_point())
    assert [k for k in finals["judged"] if not torch.equal(finals["data"][k], finals["judged"][k])] == []

    never = runs.uninterrupted(base, tiny_shards, tiny_vocab, 1)
    reference = consolidated_state_dict(never.out / "checkpoints" / f"step_{runs.STEPS:08d}")
    assert [k for k in reference if not torch.equal(reference[k], finals["transient"][k])] == []
    want, got = runs.read_metrics(never.out), runs.read_metrics(out["transient"])
    assert [got[s]["loss/train"] for s in sorted(got)] == [want[s]["loss/train"] for s in sorted(want)]


@pytest.fixture
def small_disk(tmp_path):
    """A 4.5 MB tmpfs: room for the first checkpoint of the test model (~3 MB) and not for the second."""
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4500k", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.slow
def test_a_full_disk_while_saving_stops_the_run_and_keeps_the_last_checkpoint(
    base, tiny_shards, tiny_vocab, tmp_path, small_disk
):
    """The second checkpoint does not fit: the run stops (exit 1) with a line naming the checkpoint, the free
    space and the intact one; `latest` still names step 4; once there is room, `--resume auto` ends with the
    weights of an uninterrupted run. The run writes in the background, so the failure happens on the writing
    threads and is said where the loop completes the save, on every rank."""
    import subprocess

    reference = runs.uninterrupted(base, tiny_shards, tiny_vocab, 1)
    config = runs.write_config(
        tmp_path / "run",
        tiny_shards,
        tiny_vocab,
        zero_stage=1,
        checkpoint_write="background",
        output_dir=str(small_disk),
    )
    ranks = runs.start_ranks(config, "full")
    codes = ranks.wait()
    logs = ranks.output(0) + ranks.output(1)
    assert codes == [1, 1], logs[-4000:]
    final = f"step_{runs.STEPS:08d}"
    assert f"checkpoint {small_disk / 'checkpoints' / final} could not be written" in logs, logs[-4000:]
    assert (
        "MB free there: the file system is full" in logs
        and f"newest complete checkpoint is step_{runs.CHECKPOINT_EVERY:08d}" in logs
    )
    assert "Traceback" not in logs, logs[-4000:]
    assert runs.latest_tag(small_disk) == f"step_{runs.CHECKPOINT_EVERY:08d}"

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    ranks = runs.start_ranks(config, "resumed", "--resume", "auto")
    assert ranks.wait() == [0, 0], ranks.output(0)[-3000:]
    want = consolidated_state_dict(reference.out / "checkpoints" / final)
    got = consolidated_state_dict(small_disk / "checkpoints" / final)
    assert [k for k in want if not torch.equal(want[k], got[k])] == []
