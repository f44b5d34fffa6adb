"""What a checkpoint costs the training loop: a synchronous save against a background one
(`checkpoint.write: background`, bertdist.train.background_save), on 2 ranks, in the same processes.

    DS_ACCELERATOR=cpu python benchmarks/checkpoint_stall.py --size mini
    DS_ACCELERATOR=cpu python benchmarks/checkpoint_stall.py --size base --json docs/checkpoint_stall.json

Each of 2 ranks (spawned here, gloo on CPU, ZeRO-1, AdamW) builds the same engine and then, in turns:
- `sync`: checkpoint.save, what `checkpoint.write: sync` does at the step that saves (the stall is all of it);
- `background`: checkpoint.begin_save with the host copy (the stall), then training steps while the thread
  writes, then checkpoint.complete_save once it is done (as the loop does at the first step after).
Reported (rank 0, median over the repeats): the stall of each, their ratio (the issue's bar: background at most
10% of sync), the time from the save to the checkpoint being complete, and the steps trained meanwhile with
their slowdown against steps with no write in flight (the thread shares the machine's cores and disk).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
from model_step import make_batch  # benchmarks/ is on sys.path

from bertdist.config import ModelConfig, load_config
from bertdist.model.bert.model import BertForPreTraining
from bertdist.train import checkpoint, distributed, ports
from bertdist.train import deepspeed as engine_setup
from bertdist.train.background_save import SnapshotEngine
from bertdist.train.optim import build_optimizer

WORLD_SIZE = 2


def _state(step: int) -> checkpoint.TrainState:
    return checkpoint.TrainState(
        step=step, tokens_seen=0, sequences_seen=0, world_size=WORLD_SIZE, loader_states=[], rng_states=[], config={}
    )


def _rank(rank: int, args: argparse.Namespace, port: int, results_path: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    env = distributed.read_env()
    distributed.init_process_group(env, backend="gloo")
    import torch.distributed as dist

    cfg = load_config(
        None,
        [
            f"model.size={args.size}",
            f"train.global_batch_size={args.batch_size * WORLD_SIZE}",
            f"data.phases.0.micro_batch_size={args.batch_size}",
            "train.zero_stage=1",
        ],
    )
    model_cfg = ModelConfig.from_size(args.size)
    torch.manual_seed(0)
    model = BertForPreTraining(model_cfg)
    engine = engine_setup.initialize(
        model, build_optimizer(model, cfg.optim, "cpu"), engine_setup.deepspeed_config(cfg, cfg.data.phases[0], 2)
    )
    batch = make_batch(model_cfg, args.batch_size, args.seq_length, 20, torch.device("cpu"))

    def train_step() -> float:
        started = time.perf_counter()
        engine.backward(engine(**batch).loss)
        engine.step()
        return time.perf_counter() - started

    def writing(pending: checkpoint.PendingSave) -> bool:
        """Whether any rank still writes: what the loop learns from the all-reduced step sums."""
        flag = torch.tensor([1.0 if pending.snapshots.writing() else 0.0])
        dist.all_reduce(flag)
        return bool(flag.item())

    out = Path(args.output_dir)
    snapshots = SnapshotEngine(engine.checkpoint_engine)
    copying = {"seconds": 0.0}
    copy_state = snapshots.save

    def timed_copy(state_dict: object, path: str) -> None:
        started = time.perf_counter()
        copy_state(state_dict, path)
        copying["seconds"] += time.perf_counter() - started

    snapshots.save = timed_copy  # the stall's share that is the host copy (the rest: collectives, DeepSpeed)
    rows: dict[str, list[float]] = {
        "sync": [],
        "background": [],
        "background_copy": [],
        "background_complete": [],
        "steps_while_writing": [],
    }
    step_seconds, writing_step_seconds = [], []
    train_step()  # the first step builds the optimizer state a checkpoint holds
    for repeat in range(args.repeats):
        step = 2 * repeat + 1
        dist.barrier()
        started = time.perf_counter()
        checkpoint.save(engine, out, _state(step), {}, keep_last=2)
        rows["sync"].append(time.perf_counter() - started)
        step_seconds += [train_step() for _ in range(args.steps_between)]

        dist.barrier()
        started, copying["seconds"] = time.perf_counter(), 0.0
        pending = checkpoint.begin_save(engine, out, _state(step + 1), {}, snapshots)
        rows["background"].append(time.perf_counter() - started)
        rows["background_copy"].append(copying["seconds"])
        steps = 0
        while writing(pending):
            writing_step_seconds.append(train_step())
            steps += 1
        checkpoint.complete_save(pending, keep_last=2)
        rows["background_complete"].append(time.perf_counter() - started)
        rows["steps_while_writing"].append(steps)
    if rank == 0:
        median = {name: statistics.median(values) for name, values in rows.items()}
        files = checkpoint.read_train_state(checkpoint.checkpoints_dir(out) / checkpoint.tag_for(2 * args.repeats))
        results = {
            "size": args.size,
            "device": f"cpu, {WORLD_SIZE} ranks x 1 thread, gloo, ZeRO-1 fp32",
            "checkpoint_bytes": sum(f["bytes"] for f in files.files.values()),
            "sync_stall_seconds": median["sync"],
            "background_stall_seconds": median["background"],
            "background_over_sync": median["background"] / median["sync"],
            "background_copy_seconds": median["background_copy"],
            "background_complete_seconds": median["background_complete"],
            "steps_while_writing": median["steps_while_writing"],
            "step_seconds": statistics.median(step_seconds),
            "step_seconds_while_writing": statistics.median(writing_step_seconds) if writing_step_seconds else None,
            "repeats": args.repeats,
        }
        Path(results_path).write_text(json.dumps(results, indent=2) + "\n")
    distributed.destroy_process_group()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="mini", choices=["tiny", "mini", "small", "medium", "base", "large"])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-length", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps-between", type=int, default=3, help="steps after each sync save (the no-write pace)")
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="checkpoint-stall-") as scratch:
        args.output_dir = scratch
        results_path = str(Path(scratch) / "results.json")
        mp.spawn(_rank, args=(args, ports.free_tcp_port(), results_path), nprocs=WORLD_SIZE, join=True)
        results = json.loads(Path(results_path).read_text())
    print(f"BERT-{args.size}, {results['device']}, checkpoint {results['checkpoint_bytes'] / 1e6:,.0f} MB")
    print(f"  sync save stall        {results['sync_stall_seconds']:8.3f} s")
    print(
        f"  background save stall  {results['background_stall_seconds']:8.3f} s "
        f"(the host copy {results['background_copy_seconds']:.3f} s of it)"
    )
    print(f"  background / sync      {results['background_over_sync']:8.3f}  (bar: <= 0.10)")
    print(
        f"  background complete after {results['background_complete_seconds']:.2f} s, "
        f"{results['steps_while_writing']:g} steps trained meanwhile "
        f"({results['step_seconds']:.3f} s/step without a write, "
        f"{results['step_seconds_while_writing'] or float('nan'):.3f} s/step while writing)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    main()
