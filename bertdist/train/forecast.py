"""How long a run will take and what it will cost, before it starts: `bertdist train --dry-run [--calibrate]`.

Without calibration the time per step is an estimate: the training FLOPs of a step on one rank over the peak
FLOP/s of the device (this machine's GPU if it is in the datasheet table, else an assumed A100) at an assumed
MFU; the printout says which. On a machine without a GPU a local launch trains on this CPU, so its matmul peak
(measured in a fraction of a second) is the headline and the A100 a note; a cluster launch keeps the A100 and
says what this CPU would take. With `--calibrate` it is
measured: the real trainer runs a few steps of every phase on this machine's device, one rank, at the configured
micro batch and length and at the gradient accumulation of the requested world size, on the configured shards, and
runs an evaluation on its eval shards, each phase in a process of its own; the first also saves a checkpoint,
and its whole wall time gives the start-up and shutdown.
The projection adds, per phase, steps x seconds per step (which includes the loader's
data wait, reported too), the checkpoints at `checkpoint.every_steps`, the evaluations at
`train.eval_every_steps`, and the start-up (imports, process group, engine, loaders, the first steps'
warm-up). What one device cannot measure, the all-reduce between ranks, is left out and said so.

The forecast becomes `train.forecast_hours`; the trainer logs it as `plan/forecast_hours` and, at the end,
the hours the run took as `plan/actual_hours` (`bertdist.train.timeline`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bertdist.config import Config
from bertdist.config.batch_warmup import phase_sequences
from bertdist.config.objectives import objective
from bertdist.errors import UserError
from bertdist.model.flops import (
    GPU_PEAK_FLOPS,
    measure_matmul_flops_per_second,
    peak_flops_per_second,
    train_flops_per_sequence,
    trained_predictions,
)
from bertdist.processes import sigterm_when_i_die
from bertdist.train.console import duration

ASSUMED_MFU = 0.40
"""Model FLOPs utilization assumed without calibration: what tuned BERT pretraining reaches on A100s (NVIDIA's
and MosaicML's published runs report 40-50%)."""
WARMUP_STEPS = 2
"""Calibration steps not timed as steady state (JIT builds, allocator warm-up); counted into the start-up."""
CALIBRATION_TIMEOUT_S = 1800.0
"""The longest one phase's calibration may take (a first DeepSpeed build is ~90 s; a hung one would hang the dry
run for good)."""


def evaluation_counts(cfg: Config) -> list[int]:
    """Per phase, the evaluations a run makes in it (bertdist.train.trainer.Trainer.run): the untrained baseline
    (phase 0's, when it has eval shards); then, after each step of a phase that has them, every `eval_every_steps`
    and after the run's last step."""
    every, total = cfg.train.eval_every_steps, cfg.total_steps()
    counts = []
    for i, phase in enumerate(cfg.data.phases):
        count = 0
        if phase.eval_dir:
            start = cfg.first_step(i)
            end = start + phase.steps
            count = (i == 0) + end // every - start // every + (end == total and total % every != 0)
        counts.append(count)
    return counts


@dataclass
class Forecast:
    source: str
    step_seconds: list[float]
    """Per phase: one optimizer step on every rank, in parallel (so: one rank's step)."""
    data_wait: list[float]
    """Per phase: the fraction of a step spent waiting for the loader (measured; 0 when estimated)."""
    sequences_per_step: list[float]
    """Per phase: the sequences one rank's step processes (micro batch x accumulation); counted by the calibration,
    whose step time is the run's only if it ran the run's accumulation."""
    checkpoint_seconds: float = 0.0
    eval_seconds: list[float] = dataclasses.field(default_factory=list)
    """Per phase: one evaluation on its eval shards, at its length and batch (0 without eval shards); empty when
    estimated."""
    startup_seconds: float = 0.0
    """The rest of a run's process: imports, process group, engine, loaders, the first steps' warm-up, exit."""
    note: str = ""
    """A line printed under the projection (an estimate's other device)."""

    def parts(self, cfg: Config) -> dict[str, float]:
        total_steps = cfg.total_steps()
        checkpoints = total_steps // cfg.checkpoint.every_steps + (total_steps % cfg.checkpoint.every_steps > 0)
        evals = sum(n * s for n, s in zip(evaluation_counts(cfg), self.eval_seconds))
        return {
            **{f"phase {i}": n * s for i, (n, s) in enumerate(zip(full_batch_steps(cfg), self.step_seconds))},
            "checkpoints": checkpoints * self.checkpoint_seconds,
            "evaluations": evals,
            "start-up": self.startup_seconds,
        }

    def _evaluation_costs(self, cfg: Config) -> str:
        """Each phase's evaluations and their time each ("3 x 0.41 s in phase 0, 2 x 1.7 s in phase 1")."""
        costs = [
            f"{n} x {s:.3g} s in phase {i}"
            for i, (n, s) in enumerate(zip(evaluation_counts(cfg), self.eval_seconds))
            if n
        ]
        return ", ".join(costs) or "none (no phase has eval shards)"

    def hours(self, cfg: Config) -> float:
        return sum(self.parts(cfg).values()) / 3600

    def describe(self, cfg: Config, price_per_node_hour: float | None = None) -> str:
        lc, ck = cfg.launch, cfg.checkpoint
        lines = [f"# forecast ({self.source})"]
        per_phase = zip(
            cfg.data.phases, full_batch_steps(cfg), self.step_seconds, self.data_wait, self.sequences_per_step
        )
        for i, (p, f, s, w, n) in enumerate(per_phase):
            ramp = f" (a batch warmup: the sequences of {f:,.0f} steps at the full batch)" if f != p.steps else ""
            lines.append(
                f"phase {i}: {p.steps:,} steps{ramp} x {s:.4g} s ({n:g} sequences a rank, data wait "
                f"{w:.0%}) = {duration(f * s)}"
            )
        parts = self.parts(cfg)
        if self.startup_seconds:
            lines += [
                f"checkpoints: every {ck.every_steps:,} steps, {self.checkpoint_seconds:.3g} s each = "
                f"{duration(parts['checkpoints'])}",
                f"evaluations: {self._evaluation_costs(cfg)} = {duration(parts['evaluations'])}",
                f"start-up and shutdown: {duration(self.startup_seconds)}",
            ]
        else:
            lines.append("checkpoints, evaluations, start-up and shutdown: not estimated (--calibrate times them)")
        hours = self.hours(cfg)
        lines.append(
            f"projected wall time: {duration(hours * 3600)} ({hours:.4g} h) on {lc.nodes} node(s) x {lc.gpus_per_node} "
            "rank(s); the all-reduce between ranks is not in it"
        )
        if self.note:
            lines.append(self.note)
        if price_per_node_hour is not None:
            lines.append(
                f"cost: {hours:.4g} h x {lc.nodes} node(s) x {price_per_node_hour:g} per node-hour = "
                f"{hours * lc.nodes * price_per_node_hour:,.2f}"
            )
        redo_s = ck.every_steps * max(self.step_seconds)
        restart_s = 2 * lc.host_probe_interval_s + lc.restart_backoff_s + self.startup_seconds
        lines.append(
            f"a failure costs at most {ck.every_steps:,} steps redone ({duration(redo_s)}, checkpoint.every_steps) "
            "plus "
            f"a restart (detection <= {2 * lc.host_probe_interval_s:g} s, backoff {lc.restart_backoff_s:g} s, start-up "
            f"{duration(self.startup_seconds)}) = {duration(redo_s + restart_s)}"
        )
        lines.append(
            f"forecast_hours: {hours:.6g} (set train.forecast_hours={hours:.6g} to compare it with the run's "
            "actual time in MLflow: plan/forecast_hours, plan/actual_hours)"
        )
        return "\n".join(lines)


def full_batch_steps(cfg: Config) -> list[float]:
    """Per phase, its sequences in steps of its full global batch: its steps, fewer where a batch warmup trains
    smaller ones (a step's time is taken at the full batch)."""
    return [n / cfg.global_batch_size(p) for p, n in zip(cfg.data.phases, phase_sequences(cfg))]


def estimate(cfg: Config) -> Forecast:
    """Seconds per step from FLOPs: this machine's GPU if the table knows it, else an A100, at ASSUMED_MFU."""
    name, peak = "", None
    if _cuda():
        import torch

        name = torch.cuda.get_device_name()
        peak = peak_flops_per_second(name, cfg.train.precision)
    if peak is None:
        name = "A100 (assumed)"
        _, half, single = next(row for row in GPU_PEAK_FLOPS if row[0] == "A100")
        peak = single if cfg.train.precision == "fp32" else half
    world = cfg.launch.world_size()
    sequences = [cfg.global_batch_size(p) / world for p in cfg.data.phases]
    step_flops, unknown_side = [], False
    for p, n in zip(cfg.data.phases, sequences):
        mk = cfg.masking(p)
        predictions, _ = trained_predictions(p.max_seq_length, mk.masked_lm_prob, mk.max_predictions_per_seq)
        side = objective(cfg.model).side_forward_flops(cfg, p.max_seq_length, predictions)  # a teacher's forward
        unknown_side |= side is None
        per_sequence = train_flops_per_sequence(cfg.model, p.max_seq_length, predictions) + (side or 0)
        step_flops.append(n * per_sequence)
    source = (
        f"estimated, not measured: the training FLOPs of a step over the peak of one {name}, {peak / 1e12:g} TFLOP/s "
        f"in {cfg.train.precision}, at an assumed MFU of {ASSUMED_MFU:.0%}; --calibrate measures it"
    )
    missing = "; without the forward of the objective's teacher, whose config.json is not readable here"
    note = ""
    if not _cuda():  # planned here for a GPU cluster, or about to run on this CPU: both are said
        # The node's ranks share this CPU: each trains at its share of the matmul peak measured here.
        cpu_peak = measure_matmul_flops_per_second() / max(1, cfg.launch.gpus_per_node)
        gpu_hours = sum(n * f for n, f in zip(full_batch_steps(cfg), step_flops)) / (peak * ASSUMED_MFU) / 3600
        cpu_hours = gpu_hours * peak / cpu_peak
        if cfg.launch.backend == "local":  # a local launch trains on this CPU: that is the headline
            source = (
                f"estimated, not measured: the training FLOPs of a rank's step over its share of this machine's "
                f"CPU, a matmul peak of {cpu_peak / 1e9:.3g} GFLOP/s a rank measured here (fp32, "
                f"{cfg.launch.gpus_per_node} rank(s)), at an assumed MFU of {ASSUMED_MFU:.0%}; --calibrate measures it"
            )
            note = f"on one {name} the steps would take {duration(gpu_hours * 3600)} ({gpu_hours:.4g} h)"
            peak = cpu_peak
        else:
            note = (
                f"no GPU on this machine: its CPU ranks (a matmul peak of {cpu_peak / 1e9:.3g} GFLOP/s a rank "
                f"measured here, fp32) would take {duration(cpu_hours * 3600)} ({cpu_hours:.4g} h) for the steps at "
                "the same MFU"
            )
    return Forecast(
        source + (missing if unknown_side else ""),
        [f / (peak * ASSUMED_MFU) for f in step_flops],
        [0.0] * len(step_flops),
        sequences,
        note=note,
    )


def calibrate(cfg: Config, steps: int = 20) -> Forecast:
    """Time `steps` real steps of every phase on this machine's device (one rank), each phase in a process of
    its own, as a run is: the first phase's process also gives the start-up and shutdown (its whole wall
    time less the steps, checkpoint and evaluation it timed inside)."""
    from bertdist.config import dump_yaml

    world = cfg.launch.world_size()
    step_s, wait, sequences, eval_s = [], [], [], []
    first: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bertdist-calibrate-") as tmp:
        for index, phase in enumerate(cfg.data.phases):
            one = _one_rank_config(
                cfg, index, steps + WARMUP_STEPS, cfg.gradient_accumulation_steps(phase, world), f"{tmp}/phase{index}"
            )
            config_file = Path(tmp) / f"phase{index}.yaml"
            config_file.write_text(dump_yaml(one))
            started = time.monotonic()
            try:
                child = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        __name__,
                        str(config_file),
                        str(steps),
                        "first" if index == 0 else "steps",
                        str(cfg.launch.gpus_per_node),
                    ],
                    capture_output=True,
                    text=True,
                    check=False,
                    timeout=CALIBRATION_TIMEOUT_S,
                    preexec_fn=sigterm_when_i_die(),  # a dry run killed takes its calibration (and its GPU) along
                )
            except subprocess.TimeoutExpired:
                raise UserError(
                    f"--calibrate: the calibration of phase {index} did not finish within {CALIBRATION_TIMEOUT_S:.0f} s"
                ) from None
            wall_s = time.monotonic() - started
            found = [line for line in child.stdout.splitlines() if line.startswith(_RESULT)]
            if child.returncode or not found:
                raise UserError(
                    f"--calibrate: the calibration of phase {index} failed (exit {child.returncode}): "
                    f"{(child.stderr.strip().splitlines() or ['no output'])[-1]}"
                )
            result = json.loads(found[-1].removeprefix(_RESULT))
            step_s.append(result["step_s"])
            wait.append(result["data_wait"])
            sequences.append(result["sequences_per_step"])
            eval_s.append(result["eval_s"])
            if index == 0:
                first = {**result, "overhead_s": wall_s - result["timed_s"]}
    device = "cuda" if _cuda() else "cpu"
    return Forecast(
        f"calibrated: {steps} timed steps per phase on this machine's {device}, one rank at each phase's micro "
        f"batch and the gradient accumulation of {world} rank(s)",
        step_s,
        wait,
        sequences,
        first["checkpoint_s"],
        eval_s,
        first["overhead_s"],
    )


_RESULT = "bertdist-calibration: "


def _measure(config_file: str, steps: int, everything: bool, ranks_per_node: int) -> dict[str, float]:
    """In the calibration's own process: the trainer on `config_file`, `steps` steps timed after WARMUP_STEPS,
    an evaluation when the phase has eval shards (each phase's: its length and eval data set its cost), and
    (`everything`) a checkpoint. On a CPU the node's ranks share its cores, so the one
    rank measured gets its share of them, as each rank of the run will."""
    import os

    import torch

    if not _cuda() and ranks_per_node > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // ranks_per_node))
    from bertdist.config import load_config
    from bertdist.train import deepspeed as ds
    from bertdist.train.distributed import DistributedEnv
    from bertdist.train.ports import free_tcp_port
    from bertdist.train.trainer import Trainer

    one = load_config(config_file, [])
    phase = one.data.phases[0]
    out = {"checkpoint_s": 0.0, "eval_s": 0.0}
    with Trainer(one, DistributedEnv(0, 1, 0, "127.0.0.1", free_tcp_port(), "none")) as trainer:
        ds.set_batch(trainer.engine, phase, one.global_batch_size(phase))
        batches = iter(trainer.loaders[0])
        times, sums = [], []
        for step in range(steps + WARMUP_STEPS):
            trainer.step = step
            t = time.perf_counter()
            sums.append(trainer._train_step(batches, trainer.loaders[0]))
            times.append(time.perf_counter() - t)
        timed = sums[WARMUP_STEPS:]
        out["step_s"] = statistics.fmean(times[WARMUP_STEPS:])  # the mean: occasional stalls are part of a step's cost
        out["data_wait"] = sum(s["data_wait_seconds"] for s in timed) / sum(times[WARMUP_STEPS:])
        out["sequences_per_step"] = statistics.fmean(s["sequences"] for s in timed)
        if everything:
            t = time.perf_counter()
            trainer._save(steps + WARMUP_STEPS, 0, 0)
            out["checkpoint_s"] = time.perf_counter() - t  # with checkpoint.write: background, the loop's stall
            trainer.saver.finish()  # the thread's write, done before the process ends
        if phase.eval_dir:
            t = time.perf_counter()
            trainer._evaluate(steps + WARMUP_STEPS, phase)
            out["eval_s"] = time.perf_counter() - t
        trainer.tracker.close()
    # What the run spends in steps, checkpoints and evaluations; the rest of the process's time is overhead.
    out["timed_s"] = out["step_s"] * (steps + WARMUP_STEPS) + out["checkpoint_s"] + out["eval_s"]
    return out


def _one_rank_config(cfg: Config, index: int, steps: int, accumulation: int, output_dir: str) -> Config:
    """`cfg` for one rank and `steps` steps of phase `index`, at that phase's accumulation, writing only to
    `output_dir`: no tracking, no resume, no store, no downstream evaluation."""
    one = copy.deepcopy(cfg)
    phase = one.data.phases[index]
    one.data.phases = [dataclasses.replace(phase, steps=steps, global_batch_size=0)]
    one.train = dataclasses.replace(
        one.train,
        output_dir=output_dir,
        global_batch_size=phase.micro_batch_size * accumulation,
        batch_warmup_tokens=0,
        batch_warmup_start=0,
    )
    one.train.eval_every_steps = steps + 1
    one.checkpoint = dataclasses.replace(one.checkpoint, uri="", resume="none", every_steps=steps + 1, keep_last=1)
    one.tracking.enabled = False
    one.eval.downstream = dataclasses.replace(one.eval.downstream, config="")
    one.launch = dataclasses.replace(one.launch, nodes=1, gpus_per_node=1)
    return one


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if (
    __name__ == "__main__"
):  # one phase's calibration: python -m bertdist.train.forecast CONFIG STEPS first|steps RANKS_PER_NODE
    print(
        _RESULT + json.dumps(_measure(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "first", int(sys.argv[4]))),
        flush=True,
    )
