"""How close `bertdist train --dry-run --calibrate` comes to the run it forecasts, measured in the same run.

    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/forecast_accuracy.py [--steps 300] [--ranks 1 2]

BERT-Tiny at length 128 on shards prepared as benchmarks/loader_throughput.py prepares them, a checkpoint and
an evaluation every 100 steps. For each rank count: the calibrated forecast (and the uncalibrated estimate, for
scale), then the run itself (`bertdist train` alone for one rank, torchrun for more), timed from process start to
exit; the figure is actual / forecast. Calibration times one rank on this machine: with two ranks on the same
two cores the ranks share the CPU and add an all-reduce, neither of which one rank can see, so the two-rank
ratio shows what the forecast leaves out on a machine whose ranks are not on devices of their own.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml
from loader_throughput import prepared_data  # benchmarks/ is on sys.path

REPO = Path(__file__).resolve().parent.parent


def write_config(workdir: Path, data: str, vocab: str, steps: int, ranks: int) -> Path:
    from bertdist.train.ports import free_tcp_port

    cfg = {
        "model": {"size": "tiny", "vocab_size": 30522},
        "data": {
            "vocab_file": vocab,
            "loader_workers": 1,
            "phases": [
                {"train_dir": data, "eval_dir": data, "max_seq_length": 128, "micro_batch_size": 16, "steps": steps}
            ],
        },
        "optim": {"warmup_steps": 10},
        "train": {
            "global_batch_size": 32,
            "output_dir": str(workdir / "out"),
            "log_every_steps": 10,
            "zero_stage": 1,
            "eval_every_steps": 100,
            "eval_batches": 5,
        },
        "checkpoint": {"every_steps": 100, "resume": "none"},
        "tracking": {"enabled": False},
        "launch": {"nodes": 1, "gpus_per_node": ranks, "master_port": free_tcp_port()},
    }
    shutil.rmtree(workdir / "out", ignore_errors=True)  # a fresh run each time
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    return workdir / "config.yaml"


def forecast_s(config: Path, calibrate: bool) -> float:
    argv = [sys.executable, "-m", "bertdist", "train", "--config", str(config), "--dry-run"] + (
        ["--calibrate"] if calibrate else []
    )
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True).stdout
    return float(re.findall(r"^forecast_hours: ([\d.e+-]+)", out, re.M)[-1]) * 3600


def run_s(config: Path, ranks: int) -> float:
    launcher = ["-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--module"] if ranks > 1 else ["-m"]
    started = time.monotonic()
    subprocess.run(
        [sys.executable, *launcher, "bertdist", "train", "--config", str(config)],
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="runs/bench/forecast", help="where its shards are prepared (once)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    data, vocab, _ = prepared_data(args.workdir)
    print(f"load average {os.getloadavg()[0]:.2f}; BERT-Tiny, length 128, global batch 32, {args.steps} steps")
    print("ranks | estimate (peak FLOPs) | calibrated forecast | actual | actual / forecast")
    for ranks in args.ranks:
        config = write_config(Path(args.workdir) / f"ranks{ranks}", data, vocab, args.steps, ranks)
        estimated, calibrated = forecast_s(config, False), forecast_s(config, True)
        actual = run_s(config, ranks)
        print(f"{ranks} | {estimated:.1f} s | {calibrated:.1f} s | {actual:.1f} s | {actual / calibrated:.2f}x")


if __name__ == "__main__":
    main()
