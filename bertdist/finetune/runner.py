"""`bertdist finetune --config FILE [key=value ...]`: one downstream task on a pretrained BERT or ModernBERT.

The same engine as pretraining: the process group from whichever launcher started us (torchrun, the
deepspeed launcher, srun, or none), DeepSpeed with the run's ZeRO stage and precision, AdamW with BERT's
decoupled weight decay, and BERT's fine-tuning schedule (linear warmup over `finetune.warmup_proportion`
of the steps, then linear decay to zero). The task (bertdist.finetune.task) decides the head, the rows and
the dev metrics: classification, regression, token tagging, extractive QA, multiple choice, or sentence
embeddings (whose contrastive loss the task computes across ranks: bertdist.finetune.contrastive, over the whole
step through a gradient cache with finetune.cache_rows: bertdist.finetune.grad_cache); the encoder
family (model.arch of the checkpoint) the task model's class (`BertFor...`, `ModernBertFor...`). Each epoch
visits the training rows in a seeded order that every rank computes alike; a step's `finetune.batch_size`
rows are split among the ranks and their micro batches. After every epoch (and every `finetune.eval_every_steps`)
all ranks score a share of the dev rows (bertdist.finetune.evaluation), the task's metrics are computed from all of
them, rank 0 logs them, and the best evaluation's model (by the task's headline metric) is exported as a Hugging
Face directory the matching `AutoModelFor...` class loads (`{output_dir}/model`: bertdist.finetune.best_model).

MLflow records the run's parameters, the dev metrics per epoch, and where it started: tags
`bertdist.init_from`, `bertdist.pretraining_run_id` and `bertdist.pretraining_checkpoint`
(bertdist.finetune.run_tracking).

At every evaluation a checkpoint (the pretraining format: weights, optimizer, RNG of every rank) lets the same
command continue an interrupted run exactly, from within an epoch too (the epoch's order is seeded, so the
step says where in it) (bertdist.finetune.starting restores it); the best epoch's model is
exported from that checkpoint as soon as it is found (the fp32 master weights, consolidated from any ZeRO stage).

This module is the run's order: what it builds, in which order, and the loop over epochs and steps.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from bertdist.config import Config, ConfigError, FinetuneConfig
from bertdist.config.validation import data_problems, source_problems, validate_finetune
from bertdist.errors import OK_EXIT_CODE, REQUEUE_EXIT_CODE, UserError
from bertdist.finetune import task as tasks
from bertdist.finetune.batches import step_rows
from bertdist.finetune.best_model import export_best
from bertdist.finetune.evaluation import dev_scores
from bertdist.finetune.run_tracking import open_tracker
from bertdist.finetune.source import Source, cased_vocabulary, pad_id, resolve
from bertdist.finetune.starting import build_engine, resume
from bertdist.model import attention
from bertdist.train import checkpoint, stopping
from bertdist.train import deepspeed as ds
from bertdist.train.console import duration
from bertdist.train.scaffold import Run, run_command

PROGRESS_EVERY_S = 30.0
"""A line of progress within an epoch at most this often: an epoch of a large task runs for minutes."""
SMALL_MODEL_HIDDEN = 256
"""Up to this hidden size (BERT-Tiny, -Mini, -Small) the default learning rate is said to be too low."""


def finetune(cfg: Config, results: dict[str, float] | None = None) -> int:
    """Run one fine-tuning; `results` receives the best epoch's dev metrics (`dev/accuracy`, ...) on every rank.
    The exit code is bertdist.train.scaffold's ladder, as pretraining's."""
    return run_command("bertdist finetune", cfg.launch.master_port, lambda env: Finetuning(cfg, env, results))


def planned_steps(epochs: float, steps_per_epoch: int, warmup_proportion: float) -> tuple[int, int]:
    """(the run's optimizer steps, its warmup steps), counted to a millionth of a step: 1.4 x 85 is
    118.99999999999999 in floats, which int() made 118 steps, not 119."""
    total = max(1, math.floor(round(epochs * steps_per_epoch, 6)))
    return total, math.floor(round(warmup_proportion * total, 6))


class Finetuning(Run):
    """Every component of a fine-tuning, built in `__init__` (validation first, then the output directory, the
    source, the task, the process group, the engine, a resumed checkpoint, the tracker); `run()` is its loop."""

    command = "bertdist finetune"

    def __init__(self, cfg: Config, env: Any, results: dict[str, float] | None = None) -> None:
        super().__init__()
        self.cfg, self.env, self.results, ft = cfg, env, results if results is not None else {}, cfg.finetune
        validate_finetune(cfg, env.world_size)
        with self.building():
            # Before reading the checkpoints another run on this directory could be writing.
            from bertdist.train.distributed import own_output

            own_output(self, ft.output_dir, env)
            self._build()

    def _build(self) -> None:
        cfg, env, ft = self.cfg, self.env, self.cfg.finetune
        if cfg.checkpoint.resume == "none":  # its pruning would delete the checkpoints of whatever run is there
            checkpoint.refuse_foreign_checkpoints(ft.output_dir, "finetune.output_dir")
        scores = [m for m in tasks.METRICS[ft.task] if m not in tasks.NOT_SCORES]  # the higher the better
        if ft.best_metric and ft.best_metric not in scores:
            raise ConfigError(
                [f"finetune.best_metric: {ft.best_metric!r} is not a score {ft.task} reports ({', '.join(scores)})"]
            )
        self.source: Source = resolve(cfg)
        device_type = "cuda" if torch.cuda.is_available() else "cpu"  # as start_process_group picks it
        if problems := attention.model_problems(self.source.model_cfg, device_type, cfg.train.precision):
            raise ConfigError(problems)
        positions = self.source.model_cfg.max_position_embeddings
        if problems := source_problems(
            ft, positions, self.source.model_cfg.hidden_size
        ):  # the rules that need the model's config, once it is read
            raise ConfigError(problems)
        self.task: tasks.Task = tasks.build(
            ft, ft.sequence_length(positions), self.source.vocab_file, cased_vocabulary(self.source.vocab_file)
        )
        self.train, self.dev, self.skipped = self.task.train, self.task.dev, self.task.skipped
        self.pad_id = pad_id(self.source.vocab_file)
        if problems := data_problems(ft, len(self.train)):
            raise ConfigError(problems)
        self.steps_per_epoch = len(self.train) // ft.batch_size
        self.total_steps, self.warmup_steps = planned_steps(ft.epochs, self.steps_per_epoch, ft.warmup_proportion)
        self.device = self.start_process_group(cfg.train)
        self.engine = build_engine(cfg, env, self.device.type, self.source, self.task)
        self.start_step, self.start_epoch, self.best, run_id = 0, 0, None, None
        self.resume_from = checkpoint.resolve_resume(ft.output_dir, cfg.checkpoint.resume, cfg.checkpoint.verify)
        if self.resume_from is not None:
            self.start_step, self.start_epoch, self.best, run_id = resume(
                cfg, self.engine, self.resume_from, env, self.steps_per_epoch
            )
        self.saved: tuple[int, int] | None = (self.start_step, self.start_epoch) if self.resume_from else None
        """(step, epochs done) of the last checkpoint: where the same command continues."""
        self.tracker = open_tracker(cfg, env, self.source, self.task, run_id, continues=self.resume_from is not None)
        self.stop = stopping.StopFlag(f"bertdist finetune: [rank {env.rank}]")
        self.callback(self.stop.close)

    # --- the loop ----------------------------------------------------------------------------------
    def run(self) -> int:
        from bertdist.train.optim import learning_rate, set_learning_rate

        ft, engine, say = self.cfg.finetune, self.engine, self._say
        for reason in self.skipped[:5]:
            say(f"skipped {reason}")
        if self.skipped:
            say(f"skipped {len(self.skipped)} bad row(s) (finetune.on_bad_input=skip)")
        for note in self.task.notes:
            say(note)
        labels = f", labels {', '.join(self.task.labels)}" if self.task.labels else ""
        say(
            f"{ft.task}: {len(self.train)} training rows, {len(self.dev)} dev rows{labels}; "
            f"{self.total_steps} steps of {ft.batch_size} on {self.env.world_size} rank(s), "
            f"from {self.source.description}"
        )
        hidden = self.source.model_cfg.hidden_size
        if ft.lr == FinetuneConfig.lr and hidden <= SMALL_MODEL_HIDDEN:
            say(
                f"note: finetune.lr {ft.lr:g} is the paper's rate for BERT-Base; a model of hidden size {hidden} "
                "barely moves at it: small BERTs fine-tune at 1e-4 to 3e-4 (Turc et al. 2019; the demo uses 2e-4)"
            )
        if ft.dims() and ft.dims()[0] < hidden:
            say(
                f"note: finetune.matryoshka_dims starts at {ft.dims()[0]}, below the model's {hidden}: the whole "
                f"vector (the export's default width, and the dev headline) is not in the loss; list {hidden} first "
                "to train it too (as sentence-transformers' MatryoshkaLoss needs)"
            )
        if self.resume_from is not None:
            say(f"resumed from {self.resume_from} (epoch {self.start_epoch}, step {self.start_step})")
            if self.best is not None and self.best[1] == self.start_step:  # its export may have been cut off
                self._export(self.resume_from, self.best[2])
        step = self.step = self.start_step
        self.started, self.losses = time.perf_counter(), []
        epochs = math.ceil(self.total_steps / self.steps_per_epoch)
        done_in_epoch = self.start_step - self.start_epoch * self.steps_per_epoch  # a checkpoint within an epoch
        for epoch in range(self.start_epoch, epochs):
            # (seed, epoch), not seed + epoch: seed 0's second epoch was seed 1's first, so a seed sweep's runs
            # shared their orders
            order = np.random.default_rng([self.cfg.train.seed, epoch]).permutation(len(self.train))
            rows, repeated = step_rows(order, ft.batch_size, self.steps_per_epoch, self.task.row_texts)
            if repeated:
                say(f"epoch {epoch + 1}: {repeated} step(s) hold a text twice (too few rows left without one)")
            first, epoch_started = done_in_epoch if epoch == self.start_epoch else 0, time.perf_counter()
            said = epoch_started
            for s in range(first, self.steps_per_epoch):
                if step == self.total_steps:
                    break
                if s > first and time.perf_counter() - said >= PROGRESS_EVERY_S:  # not minutes of silence
                    said = time.perf_counter()
                    rate = (s - first) / (said - epoch_started)
                    left = min(self.steps_per_epoch, self.total_steps - step + s) - s
                    say(
                        f"epoch {epoch + 1}/{epochs}: step {s}/{self.steps_per_epoch}, "
                        + (f"train loss {np.mean(self.losses[-50:]):.4f}, " if self.losses else "")
                        + f"{rate:.2f} steps/s, epoch done in {duration(left / rate)}"
                    )
                set_learning_rate(
                    engine.optimizer.param_groups, learning_rate(step, ft.lr, self.warmup_steps, self.total_steps)
                )
                loss, stop = self._step(rows[s])
                self.losses.append(loss)
                step = self.step = step + 1
                if stop:
                    return self._stopped(step, epoch)
                within = s + 1 < self.steps_per_epoch and step < self.total_steps  # else the epoch's end does
                if ft.eval_every_steps and step % ft.eval_every_steps == 0 and within:
                    self._evaluate(step, epoch, f"step {step} (epoch {epoch + 1}/{epochs})")
            self._evaluate(step, epoch + 1, f"epoch {epoch + 1}/{epochs}")
        assert self.best is not None
        _, best_step, scores = self.best
        self.tracker.log_metrics({f"best/{k.removeprefix('dev/')}": v for k, v in scores.items()}, best_step)
        best_epoch = math.ceil(best_step / self.steps_per_epoch)
        self.tracker.set_tags({"bertdist.best_epoch": best_epoch, "bertdist.best_step": best_step})
        at = f"epoch {best_epoch}" if best_step % self.steps_per_epoch == 0 else f"step {best_step}"
        say(f"best dev {at}: " + _listed(scores) + f"; model: {ft.output_dir}/model")
        self.results.update(scores)
        self.tracker.close("FINISHED")
        return OK_EXIT_CODE

    def _headline(self, scores: dict[str, float]) -> float:
        """The dev score that picks the best evaluation: finetune.best_metric's, else the task's headline."""
        chosen = self.cfg.finetune.best_metric
        if not chosen:
            return next(iter(scores.values()))
        if f"dev/{chosen}" not in scores:  # a metric of the task that this data does not give (f1 of 3 classes)
            offered = ", ".join(k.removeprefix("dev/") for k in scores if k.startswith("dev/"))
            raise UserError(f"finetune.best_metric: {chosen!r} is not among this task's dev scores ({offered})")
        return scores[f"dev/{chosen}"]

    def _evaluate(self, step: int, epochs_done: int, when: str) -> None:
        """Score the dev set after `step`, log it beside the training loss since the last evaluation, keep the
        checkpoint (the epoch's, or one within it: finetune.eval_every_steps) and export the model if it is the
        best so far by finetune.best_metric (the task's headline metric by default)."""
        ft = self.cfg.finetune
        scores = dev_scores(self.engine, self.task, self.pad_id, ft.micro_batch_size, self.env, self.device)
        train_loss = float(np.mean(self.losses))
        self.tracker.log_metrics({"loss/train": train_loss, **scores}, step)
        self._say(
            f"{when}: train loss {train_loss:.4f}, {_listed(scores)} ({time.perf_counter() - self.started:.0f} s)"
        )
        self.losses = []
        headline = self._headline(scores)
        if self.best is None or improves(headline, self.best[0]):
            self.best = (headline, step, scores)
        state = checkpoint.TrainState(
            step=step,
            tokens_seen=0,
            sequences_seen=step * ft.batch_size,
            world_size=self.env.world_size,
            loader_states=[],
            rng_states=[],
            config=self.cfg.to_dict(),
            tracking_run_id=self.tracker.run_id,
        )
        position = {"epoch": epochs_done, "best": list(self.best), "best_at": "step"}
        saved = checkpoint.save(self.engine, ft.output_dir, state, position, keep_last=1)
        self.saved = (step, epochs_done)
        if self.best[1] == step:
            self._export(saved, scores)

    def _step(self, rows: np.ndarray) -> tuple[float, bool]:
        import torch.distributed as dist

        from bertdist.finetune.grad_cache import cached_step

        engine, ft = self.engine, self.cfg.finetune
        engine.train()
        mine = np.array_split(rows, self.env.world_size)[self.env.rank]
        micros = np.array_split(mine, ft.gradient_accumulation_steps(self.env.world_size))
        batches = ({k: v.to(self.device) for k, v in self.train.batch(m, self.pad_id).items()} for m in micros)
        total = torch.zeros(2, dtype=torch.float64)  # this rank's mean loss, and how many ranks were asked to stop
        if ft.cache_rows:  # one loss over all the rank's rows (bertdist.finetune.grad_cache)
            assert self.task.cached_loss is not None  # validation allows the cache for embedding only
            total[0] = cached_step(engine, list(batches), self.task.cached_loss)
        else:
            for batch in batches:
                out = engine(**batch)
                loss = out.loss if self.task.loss is None else self.task.loss(out.logits)
                ds.backward(engine, loss)
                engine.step()
                total[0] += loss.detach().double().cpu() / len(micros)
        total[1] = 1.0 if self.stop.signum else 0.0
        dist.all_reduce(total)
        return float(total[0]) / self.env.world_size, bool(total[1])

    def _stopped(self, step: int, epoch: int) -> int:
        """A stop request after `step`, in `epoch`: the last checkpoint (an epoch's, or one within an epoch) and the
        best model stay; the same command continues from that checkpoint."""
        at, epochs_done = self.saved or (0, 0)
        if not at:
            kept, then = "no checkpoint had been written", "start over"
        elif at == epochs_done * self.steps_per_epoch:
            kept, then = (
                f"the checkpoint of epoch {epochs_done} and its best model are kept",
                f"continue from epoch {epochs_done + 1}",
            )
        else:
            kept, then = f"the checkpoint of step {at} and its best model are kept", f"continue from step {at}"
        self._say(
            f"stopped ({self.stop.reason or 'another rank was signalled'}) at step {step}, "
            f"in epoch {epoch + 1}: {kept}; run the same command to {then}"
        )
        self.tracker.set_tags({"bertdist.stop_reason": self.stop.reason or "signal"})
        self.tracker.close("KILLED")
        return REQUEUE_EXIT_CODE

    def _export(self, saved: Any, scores: dict[str, float]) -> None:
        """The model of a new best epoch, written by rank 0 at once (bertdist.finetune.best_model)."""
        if self.env.is_main:
            export_best(saved, scores, self.cfg.finetune, self.source, self.task, self.tracker)

    def _say(self, line: str) -> None:
        if self.env.is_main:
            print(f"bertdist finetune: {line}", flush=True)


def _listed(scores: dict[str, float]) -> str:
    """`dev accuracy 0.8100, matthews 0.6200, dev_mismatched accuracy 0.8000` for the console."""
    parts, last = [], None
    for key, value in scores.items():
        name, metric = key.split("/", 1)
        parts.append(f"{name + ' ' if name != last else ''}{metric} {value:.4f}")
        last = name
    return ", ".join(parts)


def improves(headline: float, best: float) -> bool:
    """Whether an evaluation's headline metric beats the best so far: higher, or any number where the best is NaN
    (a regression's correlation over non-finite predictions), which `>` alone would keep for the rest of the run.
    A tie keeps the earlier evaluation."""
    return headline > best or (math.isnan(best) and not math.isnan(headline))
