"""What a short job pays besides its steps: bertdist against transformers' Trainer, stage by stage, same run.

One rank, BERT-mini, batch 32 x 128, `--steps` optimizer steps (30), a checkpoint every `--every` steps (10), no
evaluation, no tracking: bertdist with configs/bert-mini-fast.yaml's recipe on shards masked at load time, the
Trainer as its MLM example runs (the data of benchmarks/time_to_quality.py). Each process is timed from its start:
bertdist by the arrival of its console lines (one per step, one per checkpoint), the Trainer by callbacks. Printed
per run: start-up (process start to the end of the first step, less one steady step), the steps (median x steps),
each checkpoint, exit (the last line to the process's end), and the overhead: wall time less steps x the median
step; then the ratio of the two overheads.

    python benchmarks/startup_overhead.py                  # about two minutes
    python benchmarks/startup_overhead.py --steps 60 --every 20
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ttq_data import prepare_data  # noqa: E402  (benchmarks/ is not a package)
from ttq_runs import REPO, base_config, bertdist_config, start_run  # noqa: E402

BERTDIST, TRAINER = "bert-fast", "bert-trainer"
"""The runs of benchmarks/time_to_quality.py this times (benchmarks/ttq_runs.py)."""


def bertdist_run(directory: Path, prep: dict, steps: int, every: int) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    config = bertdist_config(BERTDIST, directory, prep, steps, every, seed=0)
    text = config.read_text().replace("log_every_steps: 10", "log_every_steps: 1")
    config.write_text(text)
    start = time.time()
    process = subprocess.Popen(
        [sys.executable, "-m", "bertdist", "train", "--config", str(config)],
        cwd=REPO,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    step_ends, saves, log = [], [], []
    for line in process.stdout:
        now = time.time() - start
        log.append(line)
        if re.match(r"step \d+/\d+ ", line):
            step_ends.append(now)
        elif re.match(r"step \d+: checkpoint ", line):
            saves.append(now)
    process.wait()
    wall = time.time() - start
    if process.returncode != 0:
        raise SystemExit("bertdist train failed:\n" + "".join(log[-40:]))
    (directory / "train.log").write_text("".join(log))
    # A step line is printed after the step and before its checkpoint; the checkpoint line after the save.
    save_seconds = [s - e for s, e in zip(saves, [step_ends[int(k) - 1] for k in _saved_steps(log)])]
    return _stages(step_ends, save_seconds, wall)


def _saved_steps(log: list[str]) -> list[str]:
    return [m.group(1) for line in log if (m := re.match(r"step (\d+): checkpoint ", line))]


def trainer_run(directory: Path, prep: dict, steps: int, every: int) -> dict:
    start = time.time()
    process = start_run(TRAINER, directory, prep, steps, every, seed=0)
    process.wait()
    wall = time.time() - start
    step_ends = json.loads((directory / "step_times.json").read_text())
    saves = json.loads((directory / "save_times.json").read_text())
    # on_save fires after the save: its time less the end of that step is the checkpoint's cost.
    save_seconds = [t - step_ends[s - 1] for s, t in saves if s % every == 0]
    return _stages(step_ends, save_seconds, wall)


def _stages(step_ends: list[float], save_seconds: list[float], wall: float) -> dict:
    gaps = np.diff(step_ends)
    steady = float(np.median(gaps[len(gaps) // 3 :]))  # the later steps: warm caches, no start-up effects
    return {
        "wall_s": wall,
        "start_up_s": step_ends[0] - steady,
        "first_steps_extra_s": float(sum(g - steady for g in gaps[:5])),
        "step_s": steady,
        "steps_s": steady * len(step_ends),
        "checkpoints_s": save_seconds,
        "exit_s": wall - step_ends[-1] - (save_seconds[-1] if save_seconds else 0.0),
        "overhead_s": wall - steady * len(step_ends),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--output", default="runs/startup_overhead")
    args = p.parse_args(argv)
    out = Path(args.output).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cfg = base_config(BERTDIST)
    seq, batch = cfg.data.phases[0].max_seq_length, cfg.train.global_batch_size
    prep = prepare_data(out / "data", [], {"mlm", "chunks"}, seq, cfg.model.vocab_size)
    results = {}
    for name, run in (("trainer", trainer_run), ("bertdist", bertdist_run)):
        directory = out / name / "run"
        shutil.rmtree(directory, ignore_errors=True)
        results[name] = run(directory, prep, args.steps, args.every)
    print(
        f"{args.steps} steps of BERT-mini, batch {batch} x {seq}, a checkpoint every {args.every}, one rank, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'':22s}{'trainer':>10s}{'bertdist':>10s}")
    for key, label in (
        ("wall_s", "wall time"),
        ("start_up_s", "start-up"),
        ("first_steps_extra_s", "first 5 steps, extra"),
        ("step_s", "steady step"),
        ("steps_s", "steps x steady"),
        ("exit_s", "exit"),
        ("overhead_s", "overhead"),
    ):
        print(f"{label:22s}" + "".join(f"{results[n][key]:9.2f}s" for n in ("trainer", "bertdist")))
    for n in ("trainer", "bertdist"):
        print(f"checkpoints ({n}): " + ", ".join(f"{s:.2f}s" for s in results[n]["checkpoints_s"]))
    ratio = results["bertdist"]["overhead_s"] / results["trainer"]["overhead_s"]
    print(f"overhead, bertdist / trainer: {ratio:.2f}x (goal <= 2x)")
    results["overhead_ratio"] = ratio
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
