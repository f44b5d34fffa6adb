"""The DeepSpeed pretraining loop: `bertdist train --config FILE [key=value ...]`.

    # laptop / one CPU machine, 2 ranks (DeepSpeed on CPU needs DS_ACCELERATOR=cpu)
    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 --module bertdist train --config configs/bert-tiny.yaml
    # one node, 8 GPUs
    deepspeed --num_gpus 8 --module bertdist train --config configs/bert-base.yaml
    torchrun --nproc_per_node 8 -m bertdist train --config configs/bert-base.yaml
    # many nodes under SLURM, one task per GPU (see `bertdist submit` for the generated script)
    srun --ntasks-per-node 8 bertdist train --config configs/bert-large-paper.yaml --resume auto

Everything is checked before the first collective: the config against the real world size, and every
phase's shards (manifest, vocab hash, sequence length, enough shards for the ranks). The loop is
deliberately thin: the engine comes from bertdist.engine, the rate from bertdist.schedule, checkpoints
from bertdist.checkpoint, metrics go through bertdist.tracking.

Exit codes: 0 done; REQUEUE_EXIT_CODE after a SIGTERM/SIGUSR1 stop with a checkpoint (requeue the job,
it continues with `--resume auto`); 1 stopped on non-finite losses; 2 bad configuration or data.
"""

from __future__ import annotations

import json
import math
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from bertdist import checkpoint
from bertdist.config import Config, ConfigError, PhaseConfig, validate
from bertdist.data import DataError
from bertdist.distributed import DistributedEnv, LaunchEnvironmentError, read_env

REQUEUE_EXIT_CODE = 75
"""sysexits.h EX_TEMPFAIL: stopped on request with a checkpoint saved; run the same command again."""
NONFINITE_EXIT_CODE = 1
CONFIG_EXIT_CODE = 2
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
METRICS_FILENAME = "metrics.jsonl"

# Slots of the one tensor all-reduced per optimizer step (sums over micro batches and ranks).
STEP_SLOTS = (
    "loss", "mlm_loss", "nsp_loss", "micro_batches", "mlm_correct", "mlm_count", "nsp_correct", "nsp_count",
    "tokens", "sequences", "flops", "data_wait_seconds", "stop_requested",
)  # fmt: skip
SLOT = {name: i for i, name in enumerate(STEP_SLOTS)}


def train(cfg: Config) -> int:
    """Run (or continue) the training described by `cfg`; returns the process exit code."""
    try:
        env = read_env(default_port=cfg.launch.master_port)
        run = _prepare(cfg, env)
    except (ConfigError, DataError, LaunchEnvironmentError, checkpoint.CheckpointError) as e:
        print(f"bertdist train: {e}", file=sys.stderr)
        return CONFIG_EXIT_CODE
    return run.execute()


def _prepare(cfg: Config, env: DistributedEnv) -> "_Run":
    """Everything that can fail on bad input, done before any process group or model exists."""
    import torch

    from bertdist.engine import device_problems

    validate(cfg, world_size=env.world_size)
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    problems = device_problems(cfg, device_type)
    if problems:
        raise ConfigError(problems)
    resume_from = checkpoint.resolve_resume(cfg.train.output_dir, cfg.checkpoint.resume)
    state = checkpoint.read_train_state(resume_from) if resume_from else None
    if state is not None and state.config["model"] != cfg.to_dict()["model"]:
        raise ConfigError([f"model: differs from the model of checkpoint {resume_from}; resume needs the same model"])
    loaders = [_loader(cfg, phase, env, phase.train_dir, cfg.data.loader_workers) for phase in cfg.data.phases]
    for phase in cfg.data.phases:  # construct once so that a bad eval set fails now, not at the first eval
        if phase.eval_dir:
            _loader(cfg, phase, env, phase.eval_dir, workers=0)
    return _Run(cfg, env, device_type, loaders, resume_from, state)


def _loader(cfg: Config, phase: PhaseConfig, env: DistributedEnv, shard_dir: str, workers: int) -> Any:
    from bertdist.data.loader import PretrainingLoader

    return PretrainingLoader(
        shard_dir=shard_dir,
        vocab_file=cfg.data.vocab_file,
        max_seq_length=phase.max_seq_length,
        micro_batch_size=phase.micro_batch_size,
        rank=env.rank,
        world_size=env.world_size,
        seed=cfg.train.seed,
        num_workers=workers,
        shuffle_buffer_size=cfg.data.shuffle_buffer_size,
    )


class _StopFlag:
    """Records SIGTERM/SIGUSR1; the loop acts on it only at a step boundary agreed by all ranks.

    Forked DataLoader workers inherit this handler, so a signal sent to the whole process group (as
    SLURM does) leaves them running until the checkpoint is written.
    """

    def __init__(self) -> None:
        self.signum = 0
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum


@dataclass
class _Interval:
    """Sums since the last log line, for the throughput numbers."""

    start: float = field(default_factory=time.perf_counter)
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STEP_SLOTS, 0.0))

    def add(self, step_sums: dict[str, float]) -> None:
        for key, value in step_sums.items():
            self.totals[key] += value


class _Run:
    def __init__(self, cfg: Config, env: DistributedEnv, device_type: str, loaders: list[Any], resume_from: Path | None, state: Any):
        self.cfg, self.env, self.device_type, self.loaders = cfg, env, device_type, loaders
        self.resume_from, self.resumed_state = resume_from, state
        self.output_dir = Path(cfg.train.output_dir)
        self.stop = _StopFlag()
        self.grad_norm = float("nan")

    # -----------------------------------------------------------------------------------------
    def execute(self) -> int:
        import torch

        from bertdist import distributed, engine as ds
        from bertdist.model import BertForPreTraining
        from bertdist.tracking import build_tracker

        cfg, env = self.cfg, self.env
        if self.device_type == "cuda":
            torch.cuda.set_device(env.local_rank)
        distributed.init_process_group(env, backend="nccl" if self.device_type == "cuda" else "gloo")
        try:
            self.device = torch.device(self.device_type, env.local_rank if self.device_type == "cuda" else None)
            torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
            if cfg.checkpoint.init_from_pretrained and self.resume_from is None:
                model = BertForPreTraining.from_pretrained(cfg.checkpoint.init_from_pretrained, cfg.model)
            else:
                model = BertForPreTraining(cfg.model)
            self.start_step = self.resumed_state.step if self.resumed_state else 0
            _, phase = cfg.phase_at(self.start_step)
            optimizer = ds.build_optimizer(model, cfg.optim, self.device_type)
            self.engine = ds.initialize(model, optimizer, ds.deepspeed_config(cfg, phase, env.world_size))
            self.tokens_seen = self.sequences_seen = 0
            if self.resume_from is not None:
                self._restore()
            self.peak_flops = _peak_flops(self.device_type, cfg.train.precision)
            self.tracker = build_tracker(cfg.tracking, str(self.output_dir), env.rank, run_id=self.resumed_state.tracking_run_id if self.resumed_state else None)
            self.tracker.log_run_start(cfg, env.world_size, env.nodes)
            if self.resume_from is not None:  # a kill can land between a checkpoint's completion and its record
                self.tracker.log_checkpoint(self.resume_from, self.start_step)
            self.node_monitor = self._node_monitor()
            self.log = _RankZeroLog(self.output_dir, env.is_main)
            # Last before the loop, so that nothing done at start-up draws from the generators.
            if self.resumed_state is not None:
                checkpoint.restore_rng_state(self.resumed_state.rng_states[env.rank])
            else:
                _seed_everything(cfg.train.seed + env.rank)  # different dropout masks per rank
            try:
                return self._loop()
            finally:
                self.node_monitor.close()
        finally:
            distributed.destroy_process_group()

    def _node_monitor(self) -> Any:
        """System metrics of this node, for the first rank of every node but node 0 (whose rank 0 tracks them).

        They go into rank 0's run, whose id only rank 0 knows until it is broadcast here.
        """
        import torch.distributed as dist

        from bertdist.tracking import NoOpTracker, build_node_monitor

        run_id = [self.tracker.run_id]
        dist.broadcast_object_list(run_id, src=0)
        if self.env.local_rank != 0:
            return NoOpTracker(run_id[0])
        node_rank = self.env.rank // self.env.local_world_size
        return build_node_monitor(self.cfg.tracking, str(self.output_dir), run_id[0], node_rank)

    def _restore(self) -> None:
        state = checkpoint.load(self.engine, self.resume_from, self.env.world_size)
        self.tokens_seen, self.sequences_seen = state.tokens_seen, state.sequences_seen
        mine = state.loader_states[self.env.rank]
        phase_index, _ = self.cfg.phase_at(self.start_step)
        if mine["phase"] == phase_index:  # a checkpoint at a phase's last step continues with a fresh loader
            self.loaders[phase_index].load_state_dict(mine["loader"])
        print(f"[rank {self.env.rank}] resumed from {self.resume_from} at step {state.step}", flush=True)

    # -----------------------------------------------------------------------------------------
    def _loop(self) -> int:
        from bertdist import engine as ds
        from bertdist.schedule import learning_rate, set_learning_rate

        cfg, engine = self.cfg, self.engine
        total_steps = cfg.total_steps()
        phase_index = -1
        batches: Iterator[dict[str, Any]] = iter(())
        nonfinite_streak = 0
        interval = _Interval()
        step = self.start_step
        self.log.line(f"training steps {step}..{total_steps - 1} on {self.env.world_size} rank(s), output {self.output_dir}")
        first_phase = cfg.data.phases[0]
        if step == 0 and first_phase.eval_dir:
            self._evaluate(0, first_phase)  # the untrained baseline that later evaluations are read against
        while step < total_steps:
            index, phase = cfg.phase_at(step)
            if index != phase_index:
                phase_index = index
                ds.enter_phase(engine, cfg, phase, self.env.world_size)
                batches = iter(self.loaders[index])
            lr = learning_rate(step, cfg.optim.lr, cfg.optim.warmup_steps, total_steps)
            set_learning_rate(engine.optimizer.param_groups, lr)
            sums = self._train_step(batches, phase)
            step += 1
            interval.add(sums)
            loss = sums["loss"] / sums["micro_batches"]
            nonfinite_streak = 0 if math.isfinite(loss) else nonfinite_streak + 1
            if nonfinite_streak >= cfg.train.max_nonfinite_steps:
                return self._stop_nonfinite(step, nonfinite_streak)
            if step % cfg.train.log_every_steps == 0 or step == total_steps:
                self._log_interval(step, lr, interval)
                interval = _Interval()
            if phase.eval_dir and (step % cfg.train.eval_every_steps == 0 or step == total_steps):
                self._evaluate(step, phase)
            if sums["stop_requested"] > 0:
                return self._stop_preempted(step, nonfinite_streak, phase_index)
            if step % cfg.checkpoint.every_steps == 0 or step == total_steps:
                self._save(step, phase_index, nonfinite_streak)
        self.log.line(f"done: {step} steps, {self.tokens_seen:,} tokens")
        self.tracker.close("FINISHED")
        return 0

    def _train_step(self, batches: Iterator[dict[str, Any]], phase: PhaseConfig) -> dict[str, float]:
        """One optimizer step (all its micro batches); returns STEP_SLOTS summed over ranks."""
        import torch
        import torch.distributed as dist

        from bertdist.flops import train_flops_per_sequence

        engine = self.engine
        engine.train()
        acc = torch.zeros(len(STEP_SLOTS), dtype=torch.float64, device=self.device)
        for _ in range(engine.gradient_accumulation_steps()):
            wait_start = time.perf_counter()
            batch = {k: v.to(self.device, non_blocking=True) for k, v in next(batches).items()}
            acc[SLOT["data_wait_seconds"]] += time.perf_counter() - wait_start
            out = engine(**batch)
            engine.backward(out.loss)
            if engine.is_gradient_accumulation_boundary():
                self.grad_norm = self._grad_norm_before_step()
            engine.step()
            self._accumulate(acc, out, batch)
            sequences, seq_length = batch["input_ids"].shape
            predictions = batch["masked_lm_ids"].shape[1]
            acc[SLOT["flops"]] += sequences * train_flops_per_sequence(self.cfg.model, seq_length, predictions)
        acc[SLOT["stop_requested"]] = 1.0 if self.stop.signum else 0.0
        dist.all_reduce(acc)
        sums = dict(zip(STEP_SLOTS, acc.tolist()))
        self.tokens_seen += int(sums["tokens"])
        self.sequences_seen += int(sums["sequences"])
        return sums

    def _grad_norm_before_step(self) -> float:
        """DeepSpeed's global gradient norm; computed here where it keeps none (ZeRO-0 without fp16/bf16).

        Called after the last backward of a step: stage 0 has all-reduced the full gradients by then.
        """
        if self.cfg.train.zero_stage != 0 or self.cfg.train.precision != "fp32":
            return float("nan")  # DeepSpeed's own value is read after the step
        import torch

        return float(torch.nn.utils.get_total_norm([p.grad for p in self.engine.module.parameters() if p.grad is not None]))

    @staticmethod
    def _accumulate(acc: Any, out: Any, batch: dict[str, Any]) -> None:
        """Add one micro batch's losses and prediction counts to `acc` without a host sync."""
        import torch

        labels = batch["masked_lm_ids"]
        mask = labels != -100
        # Right when the label's logit is the largest (ties, measure zero, count as right): amax and gather read
        # the model's vocabulary-major logits at memory speed, where argmax over them takes a tenth of a step.
        logits = out.mlm_logits.detach()
        label_logits = logits.gather(-1, labels.clamp(min=0)[..., None]).squeeze(-1)
        mlm_hits = (label_logits == logits.amax(-1)) & mask
        nsp_hits = out.nsp_logits.argmax(-1) == batch["next_sentence_label"]
        values = {
            "loss": out.loss.detach(),
            "mlm_loss": out.mlm_loss.detach(),
            "nsp_loss": out.nsp_loss.detach(),
            "micro_batches": 1,
            "mlm_correct": mlm_hits.sum(),
            "mlm_count": mask.sum(),
            "nsp_correct": nsp_hits.sum(),
            "nsp_count": nsp_hits.numel(),
            "tokens": batch["attention_mask"].sum(),
            "sequences": batch["input_ids"].shape[0],
        }
        for name, value in values.items():
            acc[SLOT[name]] += value.double() if isinstance(value, torch.Tensor) else value

    # -----------------------------------------------------------------------------------------
    def _log_interval(self, step: int, lr: float, interval: _Interval) -> None:
        from bertdist import engine as ds

        t = interval.totals
        seconds = time.perf_counter() - interval.start
        world = self.env.world_size
        grad_norm = self.engine.get_global_grad_norm()
        grad_norm = self.grad_norm if grad_norm is None else grad_norm
        metrics = {
            **_quality(t),
            "learning_rate": lr,
            "grad_norm": float(grad_norm),
            "loss_scale": ds.loss_scale(self.engine),
            "skipped_steps": float(self.engine.skipped_steps),
            "sequences_per_second": t["sequences"] / seconds,
            "tokens_per_second": t["tokens"] / seconds,
            "mfu": t["flops"] / seconds / (world * self.peak_flops),
            "data_wait_fraction": t["data_wait_seconds"] / world / seconds,
            "tokens_seen": float(self.tokens_seen),
        }
        self.tracker.log_metrics(metrics, step=step)
        self.log.metrics(step, metrics)

    def _evaluate(self, step: int, phase: PhaseConfig) -> None:
        """Losses and accuracies on the first eval_batches batches of the phase's eval shards.

        Runs between steps with the RNG state put back afterwards, so evaluating never changes what
        training does next (and a resumed run stays identical to an uninterrupted one).
        """
        import torch
        import torch.distributed as dist

        rng = checkpoint.capture_rng_state()
        self.engine.eval()
        acc = torch.zeros(len(STEP_SLOTS), dtype=torch.float64, device=self.device)
        batches = iter(_loader(self.cfg, phase, self.env, phase.eval_dir, workers=0))
        with torch.no_grad():
            for _ in range(self.cfg.train.eval_batches):
                batch = {k: v.to(self.device) for k, v in next(batches).items()}
                self._accumulate(acc, self.engine(**batch), batch)
        dist.all_reduce(acc)
        checkpoint.restore_rng_state(rng)
        metrics = _quality(dict(zip(STEP_SLOTS, acc.tolist())), prefix="eval_")
        self.tracker.log_metrics(metrics, step=step)
        self.log.metrics(step, metrics)

    # -----------------------------------------------------------------------------------------
    def _save(self, step: int, phase_index: int, nonfinite_streak: int) -> None:
        if nonfinite_streak:
            self.log.line(f"step {step}: not checkpointing while the loss is non-finite ({nonfinite_streak} step(s))")
            return
        state = checkpoint.TrainState(
            step=step,
            tokens_seen=self.tokens_seen,
            sequences_seen=self.sequences_seen,
            world_size=self.env.world_size,
            loader_states=[],
            rng_states=[],
            config=self.cfg.to_dict(),
            tracking_run_id=self.tracker.run_id,
        )
        local = {"phase": phase_index, "loader": self.loaders[phase_index].state_dict()}
        path = checkpoint.save(self.engine, self.output_dir, state, local, self.cfg.checkpoint.keep_last)
        self.log.line(f"step {step}: checkpoint {path}")
        self.tracker.log_checkpoint(path, step)

    def _stop_preempted(self, step: int, nonfinite_streak: int, phase_index: int) -> int:
        self._save(step, phase_index, nonfinite_streak)
        self.log.line(f"stop requested by signal: checkpoint at step {step}; exiting with {REQUEUE_EXIT_CODE} to be requeued (resume with --resume auto)")
        self.tracker.close("KILLED")
        return REQUEUE_EXIT_CODE

    def _stop_nonfinite(self, step: int, streak: int) -> int:
        latest = checkpoint.resolve_resume(self.output_dir, "auto")
        message = (
            f"stopping at step {step}: the loss was non-finite for {streak} consecutive steps "
            f"(train.max_nonfinite_steps={self.cfg.train.max_nonfinite_steps}). Last good checkpoint: "
            f"{latest or 'none'}. Lower optim.lr, raise optim.warmup_steps, or check the data."
        )
        self.log.line(message)
        self.tracker.set_tags({"bertdist.stop_reason": "non-finite loss"})
        self.tracker.close("FAILED")
        return NONFINITE_EXIT_CODE


class _RankZeroLog:
    """Console lines and `metrics.jsonl` from rank 0; a no-op elsewhere (so the loop never asks)."""

    def __init__(self, output_dir: Path, enabled: bool):
        self.enabled = enabled
        self.path = output_dir / METRICS_FILENAME
        if enabled:
            output_dir.mkdir(parents=True, exist_ok=True)

    def line(self, text: str) -> None:
        if self.enabled:
            print(text, flush=True)

    def metrics(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        shown = " ".join(f"{k} {_short(v)}" for k, v in metrics.items())
        print(f"step {step} | {shown}", flush=True)
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")


def _quality(sums: dict[str, float], prefix: str = "") -> dict[str, float]:
    """Mean losses per micro batch and accuracies over all predictions, from STEP_SLOTS sums."""
    return {
        f"{prefix}loss": sums["loss"] / sums["micro_batches"],
        f"{prefix}mlm_loss": sums["mlm_loss"] / sums["micro_batches"],
        f"{prefix}nsp_loss": sums["nsp_loss"] / sums["micro_batches"],
        f"{prefix}mlm_accuracy": sums["mlm_correct"] / max(1.0, sums["mlm_count"]),
        f"{prefix}nsp_accuracy": sums["nsp_correct"] / max(1.0, sums["nsp_count"]),
    }


def _short(value: float) -> str:
    return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.3e}"


def _seed_everything(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _peak_flops(device_type: str, precision: str) -> float:
    """Peak FLOP/s of one rank for MFU: $BERTDIST_PEAK_FLOPS, else the GPU table, else measured."""
    import os

    import torch

    from bertdist.flops import PEAK_FLOPS_ENV, measure_matmul_flops_per_second, peak_flops_per_second

    if os.environ.get(PEAK_FLOPS_ENV):
        return float(os.environ[PEAK_FLOPS_ENV])
    if device_type == "cuda":
        peak = peak_flops_per_second(torch.cuda.get_device_name(), precision)
        if peak:
            return peak
    return measure_matmul_flops_per_second()
