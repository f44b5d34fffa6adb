"""The DeepSpeed pretraining loop: `bertdist train --config FILE [key=value ...]`.

    # laptop / one CPU machine, 2 ranks (DeepSpeed on CPU needs DS_ACCELERATOR=cpu)
    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 --module bertdist train --config configs/bert-tiny.yaml
    # one node, 8 GPUs
    deepspeed --num_gpus 8 --module bertdist train --config configs/bert-base.yaml
    torchrun --nproc_per_node 8 -m bertdist train --config configs/bert-base.yaml
    # many nodes under SLURM, one task per GPU (see `bertdist submit` for the generated script)
    srun --ntasks-per-node 8 bertdist train --config configs/bert-large-paper.yaml --resume auto

`Trainer.__init__` checks everything before the first collective (the config against the real world size,
every phase's shards: manifest, vocab hash, sequence length) and then builds every component: the process
group, the model, the optimizer and DeepSpeed engine, the restored checkpoint, the tracker, the console.
`Trainer.run` only calls them, step after step (torchtitan's Trainer); bertdist.train.scaffold holds what
every run does around its loop (the exit-code ladder, the process group), which fine-tuning shares.

Exit codes (bertdist.errors): 0 done; REQUEUE_EXIT_CODE after a SIGTERM/SIGUSR1 stop with a checkpoint
(requeue the job, it continues with `--resume auto`); 1 stopped on non-finite losses; 2 bad configuration
or data.
"""

from __future__ import annotations

import contextlib
import functools
import math
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch
import torch.distributed as dist

from bertdist import object_store
from bertdist.config import Config, ConfigError, PhaseConfig, validate
from bertdist.config.batch_warmup import global_batch_at
from bertdist.config.schema import phase_model_config
from bertdist.errors import (
    FAILED_EXIT_CODE,
    OK_EXIT_CODE,
    REQUEUE_EXIT_CODE,
    UserError,
)
from bertdist.model import registry
from bertdist.model.flops import PeakFlops
from bertdist.tracking.base import Tracker
from bertdist.train import (
    checkpoint,
    data_wait,
    distributed,
    evaluation,
    metrics,
    remote,
    rng,
    rollback,
    run_identity,
    run_tracking,
    saving,
    scaffold,
    starting,
    stopping,
    stragglers,
    timeline,
)
from bertdist.train import deepspeed as ds
from bertdist.train.console import Console
from bertdist.train.deepspeed import device_problems
from bertdist.train.distributed import DistributedEnv
from bertdist.train.downstream import DownstreamEvaluator
from bertdist.train.loaders import continue_sources, phase_loader, source_positions, train_loader
from bertdist.train.optim import apply_schedule
from bertdist.train.restart_event import RestartEvent
from bertdist.train.watchdog import StallWatchdog

if TYPE_CHECKING:  # the types of the engine and the loaders, without importing DeepSpeed's engine module for them
    from bertdist.data.loader import PretrainingLoader


def train(cfg: Config, restart: RestartEvent | None = None) -> int:
    """Run (or continue) the training described by `cfg`; returns the process exit code (bertdist.train.scaffold's
    ladder). `restart`: the elastic supervisor's relaunch that started this run (recorded in the MLflow run)."""

    def start(env: DistributedEnv) -> Trainer:
        if note := distributed.unlaunched_note(env, cfg.launch.nodes * cfg.launch.gpus_per_node):
            print(note, file=sys.stderr, flush=True)
        return Trainer(cfg, env, restart)

    return scaffold.run_command("bertdist train", cfg.launch.master_port, start)


def due(step: int, every_steps: int, total_steps: int) -> bool:
    """Whether a periodic action (log, evaluation, checkpoint) runs after `step`: every `every_steps`, and after
    the last step whatever the interval."""
    return step % every_steps == 0 or step == total_steps


class Trainer(scaffold.Run):
    """Every component of a run, built in `__init__`; `run()` runs the loop; leaving the `with` frees them."""

    command = "bertdist train"

    def __init__(self, cfg: Config, env: DistributedEnv, restart: RestartEvent | None = None):
        super().__init__()

        # --- checks: everything that can fail on bad input, before any process group or model exists
        validate(cfg, world_size=env.world_size)
        cfg = starting.with_released_settings(cfg)
        self.device_type = "cuda" if torch.cuda.is_available() else "cpu"
        problems = device_problems(cfg, self.device_type)
        if problems:
            raise ConfigError(problems)
        self.cfg, self.env, self.restart = cfg, env, restart
        self.output_dir = Path(cfg.train.output_dir)
        object_store.use_endpoint(cfg.storage.endpoint_url)
        ck = cfg.checkpoint
        with self.building():
            # Before reading checkpoints that another run on this directory or URI could be writing.
            held = distributed.own_output(self, self.output_dir, env, ck.uri, ck.lease_timeout_s)
            self.uploader = (
                remote.Uploader(ck.uri, env.rank, env.world_size, ck.keep_last, ck.upload_timeout_s, held)
                if ck.uri
                else None
            )
            self._check_resume_and_data()
            self._build_components()

    def _check_resume_and_data(self) -> None:
        cfg, env = self.cfg, self.env
        self.resume_from = remote.resume_point(
            cfg.checkpoint, cfg.train.output_dir, cfg.to_dict(), mark_damaged=env.is_main
        )
        self.resumed = checkpoint.read_train_state(self.resume_from) if self.resume_from else None
        self.input_models = run_identity.input_models(cfg)
        if self.resumed is not None:
            problems = run_identity.changed_input_models(self.resumed.input_models, self.input_models, cfg)
            if problems:
                raise UserError(f"bertdist train: resuming from {self.resume_from}: " + "; ".join(problems))
        self.resharding = self.resumed is not None and self.resumed.world_size != env.world_size
        pin = self.device_type == "cuda"
        workers, rank, world = cfg.data.loader_workers, env.rank, env.world_size
        self.loaders = [train_loader(cfg, i, workers, rank, world, pin) for i in range(len(cfg.data.phases))]
        for phase in cfg.data.phases:  # construct once so that a bad eval set fails now, not at the first eval
            if phase.eval_dir:
                self._loader(phase, phase.eval_dir, workers=0)

    def _build_components(self) -> None:
        cfg, env = self.cfg, self.env
        self.stop = stopping.StopFlag(f"bertdist train: [rank {env.rank}]")
        self.callback(self.stop.close)
        self.start_step = self.resumed.step if self.resumed else 0
        self.elapsed_before = self.resumed.elapsed_seconds if self.resumed else 0.0
        self.started = timeline.process_started()
        self.tokens_seen = self.sequences_seen = 0
        self.source_tokens: dict[str, int] = {}
        self.sources_read: dict[str, dict] = {}  # a source -> where the phases before this one left it
        self.grad_norm = float("nan")
        self.device = self.start_process_group(cfg.train)
        starting.check_same_start(self.resume_from, env.world_size)
        self.engine = starting.build_engine(cfg, env, self.device, self.start_step, self.resume_from, self.resharding)
        if self.resume_from is not None:
            state = starting.restore(
                self.engine, self.loaders, cfg, env, self.resume_from, self.start_step, self.resharding
            )
            self.tokens_seen, self.sequences_seen = state.tokens_seen, state.sequences_seen
            self.source_tokens = dict(state.source_tokens)
            self.sources_read = state.loader_states[0 if self.resharding else env.rank].get("read", {})
        self.peak_flops = PeakFlops(self.device_type, cfg.train.precision)
        self.tracker = self._build_tracker()
        self.node_monitor = self.enter_context(self._build_node_monitor())
        self.console = Console(self.output_dir, env.is_main)
        self.downstream = DownstreamEvaluator(cfg.eval.downstream, self.output_dir, env.is_main, self.console.line)
        self.callback(self.downstream.stop)
        self.watchdog = StallWatchdog(
            env.rank, env.world_size, env.master_addr, env.master_port, cfg.train.stall_timeout_s
        )
        self.callback(self.watchdog.close)
        self.saver = saving.Saver(
            self.engine,
            cfg.checkpoint,
            self.output_dir,
            self.uploader,
            self.watchdog,
            self.console.line,
            self.tracker,
            self.downstream,
            self.resume_from,
        )
        self.loss_watch = rollback.LossWatch(cfg.train.loss_spike_sigmas, cfg.train.loss_spike_window_steps)
        self.rollbacks = rollback.Rollbacks(
            cfg.train, self.output_dir, env.is_main, self.resumed, self.console.line, self.tracker.set_tags
        )
        hosts: list[str] = [""] * env.world_size
        dist.all_gather_object(hosts, socket.gethostname())
        t = cfg.train
        self.stragglers = stragglers.StragglerWatch(
            hosts, t.straggler_factor, t.straggler_window_steps, self.console.line, self.tracker.set_tags
        )
        self.data_wait = data_wait.DataWaitWatch(
            t.data_wait_warn_fraction, env.world_size, env.local_world_size, self.console.line, self.tracker.set_tags
        )
        # Last, so that nothing done at start-up draws from the generators.
        if self.resumed is not None and not self.resharding:
            rng.restore_rng_state(self.resumed.rng_states[env.rank])
        elif self.resumed is not None:  # new streams, distinct from the first run's (seed + rank) ones
            rng.seed_everything(cfg.train.seed + env.rank + 1_000_003 * self.start_step)
        else:
            rng.seed_everything(cfg.train.seed + env.rank)  # different dropout masks per rank

    def _loader(self, phase: PhaseConfig, shard_dir: str, workers: int) -> PretrainingLoader:
        """A loader of eval shards."""
        env, pin = self.env, self.device_type == "cuda"
        return phase_loader(self.cfg, phase, shard_dir, workers, env.rank, env.world_size, pin, training=False)

    def _build_tracker(self) -> Tracker:
        return run_tracking.open_tracker(
            self.cfg, self.env, self.output_dir, self.resumed, self.resume_from, self.restart, self.start_step
        )

    def _build_node_monitor(self) -> contextlib.closing[Tracker]:
        return run_tracking.node_monitor(self.cfg, self.env, self.output_dir, self.tracker)

    # --- the loop ----------------------------------------------------------------------------------
    def run(self) -> int:
        cfg, engine = self.cfg, self.engine
        total_steps = cfg.total_steps()
        phase_index = -1
        batches: Iterator[dict[str, Any]] = iter(())
        nonfinite_streak = 0
        step = self.step = self.start_step
        if self.env.is_main and self.resume_from is not None:  # after checkpoint.resume=<an older checkpoint>
            checkpoint.step_back_latest(checkpoint.checkpoints_dir(self.output_dir), self.resume_from)
            if self.uploader:
                self.uploader.step_back(self.resume_from.name)
        self.console.line(
            f"training steps {step}..{total_steps - 1} on {self.env.world_size} rank(s), output {self.output_dir}"
        )
        first_phase = cfg.data.phases[0]
        if step == 0 and first_phase.eval_dir:  # the untrained baseline that later evaluations are read against,
            registry.enter_phase(engine.module, phase_model_config(cfg.model, first_phase))  # at its RoPE thetas
            self._evaluate(0, first_phase)
        interval = metrics.Interval()
        while step < total_steps:
            index, phase = cfg.phase_at(step)
            if index != phase_index:
                if phase_index >= 0:  # a phase ends: what it read, later phases continue
                    self.sources_read.update(source_positions(self.loaders[phase_index]))
                phase_index = index
                registry.enter_phase(engine.module, phase_model_config(cfg.model, phase))
                continue_sources(self.loaders[index], self.sources_read)
                batches = iter(self.loaders[index])
                self.rollbacks.skip(batches, self.loaders[index])  # what a rollback skips, recorded
                self.stragglers.restart()
            ds.set_batch(engine, phase, global_batch_at(cfg, step))  # a phase's, or a batch warmup's
            lr = apply_schedule(engine.optimizer.param_groups, cfg, step, self.rollbacks.lr_scale)
            self.rollbacks.position = self.loaders[index].state_dict()
            sums = self._train_step(batches, self.loaders[index])
            step = self.step = step + 1
            if step == self.start_step + 1:  # start-up (JIT builds, first collectives) is not a stall
                self.watchdog.start()
                timeline.log_recovered(self.tracker, self.console.line, self.restart, step)
            interval.add(sums)
            self.stragglers.add(sums, step)
            loss = sums["loss"] / sums["micro_batches"]
            bad = self.loss_watch.judge(loss, learn=self.rollbacks.learns(step))
            if bad and cfg.train.on_bad_step == "rollback":
                stopped = self._roll_back(step, bad, phase_index, loss)
                if stopped is not None:
                    return stopped
                step, phase_index, interval = self.step, -1, metrics.Interval()
                continue
            self.rollbacks.replayed(step, loss)
            if bad and math.isfinite(loss):  # a spike, when bad steps do not roll back: said
                self.console.line(f"step {step}: {bad}")
            nonfinite_streak = 0 if math.isfinite(loss) else nonfinite_streak + 1
            if nonfinite_streak >= cfg.train.max_nonfinite_steps:
                return self._stop_nonfinite(step, nonfinite_streak)
            if due(step, cfg.train.log_every_steps, total_steps):
                self._log_interval(step, total_steps, lr, interval)
                interval = metrics.Interval()
            if phase.eval_dir and due(step, cfg.train.eval_every_steps, total_steps):
                with interval.paused():
                    self._evaluate(step, phase)
            if sums["stop_requested"] > 0:
                if interval.steps:  # the steps since the last log line: lost to the run's record otherwise
                    self._log_interval(step, total_steps, lr, interval)
                return self._stop_preempted(step, nonfinite_streak, phase_index)
            if self.saver.pending and not sums["checkpoint_writing"]:  # every rank's background write is done
                with interval.paused():
                    self.saver.complete()
            if due(step, cfg.checkpoint.every_steps, total_steps):
                with interval.paused():
                    self._save(step, phase_index, nonfinite_streak)
        self.saver.finish()
        if self.uploader:
            self.uploader.wait(lambda: self.watchdog.progress(step))
        self.console.line(f"done: {step} steps, {self.tokens_seen:,} tokens")
        timeline.log_end(
            self.tracker,
            self.console.line,
            step,
            self.elapsed_before + time.monotonic() - self.started,
            cfg.train.forecast_hours,
        )
        self._log_downstream(self.downstream.close())
        self.tracker.close("FINISHED")
        return OK_EXIT_CODE

    def _train_step(self, batches: Iterator[dict[str, Any]], loader: Any) -> dict[str, float]:
        """One optimizer step (all its micro batches); returns its metrics.StepSums summed over ranks."""
        engine = self.engine
        engine.train()
        acc = metrics.StepSums(self.device)
        forward, waited_s = stragglers.ForwardClock(self.device_type), 0.0
        for _ in range(engine.gradient_accumulation_steps()):
            wait_start = time.perf_counter()
            batch = {k: v.to(self.device, non_blocking=True) for k, v in next(batches).items()}
            waited_s += time.perf_counter() - wait_start
            forward.start()
            out = engine(**batch)
            forward.stop()
            self.rollbacks.micro_batches_since_save += 1
            ds.backward(engine, out.loss)
            if engine.is_gradient_accumulation_boundary():
                self.grad_norm = ds.grad_norm_before_step(engine, self.cfg.train)
            engine.step()
            self.watchdog.progress(self.step)
            metrics.accumulate(acc, out, batch, self.cfg.model)
        acc.add("data_wait_seconds", waited_s)
        data_wait.add_load_costs(acc, self.loaders)
        env = self.env
        stragglers.add_rank_times(acc, env.rank, env.world_size, waited_s + forward.total_seconds(), waited_s)
        acc.add("stop_requested", 1.0 if self.stop.signum else 0.0)
        acc.add("checkpoint_writing", 1.0 if self.saver.writing() else 0.0)
        metrics.add_source_tokens(acc, loader.take_tokens())
        sums = acc.all_reduce()
        metrics.count_source_tokens(self.source_tokens, sums)
        self.tokens_seen += int(sums["tokens"])
        self.sequences_seen += int(sums["sequences"])
        return sums

    def _log_interval(self, step: int, total_steps: int, lr: float, interval: metrics.Interval) -> None:
        grad_norm = ds.global_grad_norm(self.engine)
        loader = self.loaders[self.cfg.phase_at(step - 1)[0]]
        values = {
            **metrics.quality(interval.totals, "train"),
            "optimizer/learning_rate": lr,
            "optimizer/lr_scale": self.rollbacks.lr_scale,
            "optimizer/grad_norm": float(self.grad_norm if grad_norm is None else grad_norm),
            "optimizer/loss_scale": ds.loss_scale(self.engine),
            "optimizer/skipped_steps": float(self.engine.skipped_steps),
            "progress/tokens_seen": float(self.tokens_seen),
            "progress/sequences_seen": float(self.sequences_seen),
            **interval.throughput(self.env.world_size, self.peak_flops),
            metrics.PEAK_MEMORY: metrics.peak_memory_gb(self.device_type, self.device),
            **stragglers.rank_metrics(interval.totals, interval.steps, self.env.world_size),
            **metrics.source_metrics(self.source_tokens, loader.epochs()),
        }
        self.tracker.log_metrics(values, step=step)
        if self.peak_flops.notice:  # on the console with the step lines, once, not as a raw Python warning
            self.console.line(self.peak_flops.notice)
            self.peak_flops.notice = ""
        self._log_downstream(self.downstream.finished())
        eta_s = interval.wall_seconds() / interval.steps * (total_steps - step)  # evaluations and saves recur
        self.console.train(step, total_steps, values, eta_s, loader.state_dict())
        self.data_wait.judge(step, values[metrics.DATA_WAIT], interval, loader)

    def _evaluate(self, step: int, phase: PhaseConfig) -> None:
        """Losses and accuracies on the first eval_batches batches of the phase's eval shards, RNG-neutral
        (bertdist.train.evaluation)."""
        loader = self._loader(phase, phase.eval_dir, workers=0)
        progress = functools.partial(self.watchdog.progress, self.step)
        values = evaluation.evaluate(self.engine, loader, self.cfg.train.eval_batches, self.device, progress)
        self.tracker.log_metrics(values, step=step)
        self.console.eval(step, values)

    # --- checkpoints and stops ---------------------------------------------------------------------
    def _save(self, step: int, phase_index: int, nonfinite_streak: int) -> None:
        if nonfinite_streak:
            self.console.line(
                f"step {step}: not checkpointing while the loss is non-finite ({nonfinite_streak} step(s))"
            )
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
            elapsed_seconds=self.elapsed_before + time.monotonic() - self.started,
            input_models=self.input_models,
            rollbacks=self.rollbacks.done,
            lr_scale=self.rollbacks.lr_scale,
            source_tokens=dict(self.source_tokens),  # a background save writes it steps later
        )
        read = {**self.sources_read, **source_positions(self.loaders[phase_index])}
        self.saver.begin(state, {"phase": phase_index, "loader": self.loaders[phase_index].state_dict(), "read": read})
        self.rollbacks.micro_batches_since_save = 0

    def _log_downstream(self, results: dict[int, dict[str, float]]) -> None:
        for step, values in results.items():  # at the step of the checkpoint that was evaluated
            self.tracker.log_metrics(values, step=step)

    def _stop_preempted(self, step: int, nonfinite_streak: int, phase_index: int) -> int:
        self._save(step, phase_index, nonfinite_streak)
        self.saver.finish()
        if self.uploader:  # the job may end now
            self.uploader.wait(lambda: self.watchdog.progress(step))
        why = self.stop.reason or "another rank was signalled"
        self.console.line(
            f"stopped ({why}): checkpoint at step {step}; exiting with {REQUEUE_EXIT_CODE} to be requeued "
            "(continue with --resume auto)"
        )
        self.tracker.close("KILLED")
        return REQUEUE_EXIT_CODE

    def _roll_back(self, step: int, reason: str, phase_index: int, loss: float) -> int | None:
        """Back to the last checkpoint (bertdist.train.rollback); the exit code when the run stops instead."""
        self.saver.finish()  # a save still being written is of a good step: the newest one to go back to
        accumulation, world_size = self.engine.gradient_accumulation_steps(), self.env.world_size
        batch = self.rollbacks.name_batch(self.loaders[phase_index], accumulation, world_size)
        point = self.saver.restore_point
        latest = checkpoint.newest_intact(point) if point else None
        saved = checkpoint.read_train_state(latest) if latest else None
        same_phase = saved is not None and saved.loader_states[self.env.rank]["phase"] == phase_index
        refusal = self.rollbacks.refusal(step, reason, saved and saved.step, same_phase)
        if refusal:
            self.console.line(refusal)
            self.tracker.set_tags({"bertdist.stop_reason": "bad steps"})
            self.tracker.close("FAILED")
            return FAILED_EXIT_CODE
        self.watchdog.progress(step)
        state = starting.restore(self.engine, self.loaders, self.cfg, self.env, latest, saved.step, False)
        rng.restore_rng_state(state.rng_states[self.env.rank])
        self.tokens_seen, self.sequences_seen = state.tokens_seen, state.sequences_seen
        self.source_tokens = dict(state.source_tokens)  # the discarded steps' tokens are counted again in the replay
        self.tracker.rewind(state.step)
        self.rollbacks.begin(step, reason, state.step, loss, batch)
        self.step = state.step
        self.watchdog.progress(step)
        return None

    def _stop_nonfinite(self, step: int, streak: int) -> int:
        self.saver.finish()
        latest = self.saver.restore_point
        message = (
            f"stopping at step {step}: the loss was non-finite for {streak} consecutive steps "
            f"(train.max_nonfinite_steps={self.cfg.train.max_nonfinite_steps}). Last good checkpoint: "
            f"{latest or 'none'}. Lower optim.lr, raise optim.warmup_steps, or check the data."
        )
        self.console.line(message)
        self.tracker.set_tags({"bertdist.stop_reason": "non-finite loss"})
        self.tracker.close("FAILED")
        return FAILED_EXIT_CODE
