"""Downstream quality during pretraining: fine-tune a copy of each new checkpoint on a small task, beside training.

`eval.downstream` names a task (a `bertdist finetune` YAML: its files, learning rate, epochs). After every
`every_checkpoints`-th checkpoint, rank 0 starts `bertdist finetune` on that checkpoint as a separate
process, so training does not wait for it: it loads the checkpoint's consolidated weights (as
`finetune.init_from` does for any run), fine-tunes, and writes its best dev metrics to `results.json`. Rank 0
notices a finished job at its next log interval and logs `downstream/<name>/<metric>` into the pretraining
run at the checkpoint's step, so the dashboard shows downstream quality beside the MLM loss.

At most one job runs at a time: a checkpoint that comes while a job runs waits for it, and only the newest
one waits (an older waiting one is skipped: said on the console, counted in `downstream/<name>/skipped`).
At the end of training the running and the waiting job are waited for, each up to `timeout_s`; a run that
stops early (preemption, failure) stops its job. A job's output is `{output_dir}/downstream/step_N/log.txt`.

Cost: the job competes with rank 0's node for CPU (and, on a GPU node, for GPU 0's time and memory: a
BERT-Base fine-tuning on a small task needs ~3 GB and minutes); choose a small task and a sparse interval.
A checkpoint rotated away (`checkpoint.keep_last`) while its job is still starting would fail that job,
which is reported and skipped; keep keep_last >= 2.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bertdist.config import DownstreamConfig
from bertdist.processes import sigterm_when_i_die


class DownstreamEvaluator:
    """Rank 0's; on other ranks (and when the section is off) every method does nothing."""

    def __init__(self, cfg: DownstreamConfig, output_dir: str, enabled: bool, say: Any):
        self.cfg, self.enabled, self.say = cfg, enabled and bool(cfg.config), say
        self.directory = Path(output_dir) / "downstream"
        self.checkpoints = 0
        self.skipped = 0
        self.job: tuple[int, subprocess.Popen, Path] | None = None
        self.pending: tuple[str, int] | None = None
        """The newest checkpoint that came while a job ran: evaluated next."""

    def after_checkpoint(self, checkpoint_dir: str | os.PathLike, step: int) -> None:
        if not self.enabled:
            return
        self.checkpoints += 1
        if self.checkpoints % self.cfg.every_checkpoints:
            return
        if self.job is None:
            self._start(str(checkpoint_dir), step)
            return
        if self.pending is not None:
            self.skipped += 1
            self.say(
                f"step {step}: downstream {self.cfg.name} of step {self.pending[1]} skipped for this newer checkpoint"
            )
        self.pending = (str(checkpoint_dir), step)

    def _start(self, checkpoint_dir: str, step: int) -> None:
        from bertdist.train.distributed import standalone_environment
        from bertdist.train.ports import free_tcp_port

        out = self.directory / f"step_{step:08d}"
        out.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "bertdist",
            "finetune",
            "--config",
            self.cfg.config,
            f"finetune.init_from={checkpoint_dir}",
            f"finetune.output_dir={out}",
            "tracking.enabled=false",
            f"launch.master_port={free_tcp_port()}",
        ]
        with open(out / "log.txt", "w") as log:
            process = subprocess.Popen(  # it ends with the trainer, however the trainer ends (a SIGKILL, an OOM)
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=standalone_environment(),
                preexec_fn=sigterm_when_i_die(),
            )
        self.job = (step, process, out)

    def finished(self, wait_s: float = 0.0) -> dict[int, dict[str, float]]:
        """Metrics of the job that has ended (waiting up to `wait_s`), by the step of its checkpoint; then
        the pending checkpoint's job starts."""
        if self.job is None:
            return {}
        step, process, out = self.job
        try:
            if wait_s:
                process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            self.say(
                f"downstream {self.cfg.name} of step {step}: still running after {wait_s:g} s "
                "(eval.downstream.timeout_s), stopped"
            )
        if process.poll() is None:
            return {}
        self.job = None
        if self.pending is not None:
            self._start(*self.pending)
            self.pending = None
        results = None
        if process.returncode == 0:  # results.json is written at each new best epoch: a run stopped or failed
            with contextlib.suppress(OSError, json.JSONDecodeError):  # later holds an early epoch's
                results = json.loads((out / "results.json").read_text())
        if results is None:
            self.say(
                f"downstream {self.cfg.name} of step {step}: failed (exit {process.returncode}), nothing logged; "
                f"see {out / 'log.txt'}"
            )
            return {}
        metrics = {f"downstream/{self.cfg.name}/{k.removeprefix('dev/')}": v for k, v in results.items()}
        self.say(
            f"step {step}: downstream {self.cfg.name} "
            + ", ".join(f"{k.rsplit('/', 1)[1]} {v:.4f}" for k, v in metrics.items())
        )
        return {step: {**metrics, f"downstream/{self.cfg.name}/skipped": float(self.skipped)}}

    def close(self) -> dict[int, dict[str, float]]:
        """Wait for the running and the pending evaluation (each up to timeout_s) and return their metrics."""
        started, results = time.monotonic(), {}
        while self.job is not None:
            results.update(self.finished(wait_s=self.cfg.timeout_s))
        if results:
            self.say(f"waited {time.monotonic() - started:.0f} s for the last downstream evaluation(s)")
        return results

    def stop(self) -> None:
        """Training ends early (preemption, failure): stop a job still running."""
        self.pending = None
        if self.job is not None and self.job[1].poll() is None:
            self.job[1].kill()
            self.job[1].wait()
