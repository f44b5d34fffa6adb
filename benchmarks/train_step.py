"""The cost of the training engine: one optimizer step through bertdist's DeepSpeed engine against the same
model and AdamW stepped by a plain PyTorch loop, timed in turns in the same process.

Both do forward + backward + gradient clipping at 1.0 + AdamW on the same batch; the ratio is what DeepSpeed's
engine (ZeRO bookkeeping, its gradient buffers, the all-reduce of a 1-rank world) costs on top of the math.

    DS_ACCELERATOR=cpu python benchmarks/train_step.py                 # CPU, BERT-mini, fp32, ZeRO-1
    DS_ACCELERATOR=cpu python benchmarks/train_step.py --zero-stage 2
    python benchmarks/train_step.py --device cuda --size base --precision bf16 --zero-stage 2 --batch-size 64
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from common import interleaved_medians, use_all_cores  # benchmarks/ is on sys.path
from model_step import make_batch

from bertdist.config import MODEL_SIZES, ModelConfig, load_config
from bertdist.model.bert.model import BertForPreTraining
from bertdist.train import deepspeed as engine
from bertdist.train import distributed
from bertdist.train.optim import build_optimizer


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="mini", choices=list(MODEL_SIZES))
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--zero-stage", type=int, default=1, choices=[0, 1, 2, 3])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-length", type=int, default=128)
    p.add_argument("--steps", type=int, default=7, help="timed steps per variant (median reported)")
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)
    if args.device == "cpu" and args.precision != "fp32":
        p.error("--precision: bf16/fp16 are GPU paths; CPU runs use fp32")

    threads = use_all_cores()
    device = torch.device(args.device)
    env = distributed.read_env({"MASTER_PORT": str(distributed.free_tcp_port())})
    distributed.init_process_group(env, backend="nccl" if device.type == "cuda" else "gloo")
    cfg = load_config(
        None,
        [
            f"model.size={args.size}",
            f"train.global_batch_size={args.batch_size}",
            f"data.phases.0.micro_batch_size={args.batch_size}",
            f"train.zero_stage={args.zero_stage}",
            f"train.precision={args.precision}",
        ],
    )
    model_cfg = ModelConfig.from_size(args.size)
    batch = make_batch(model_cfg, args.batch_size, args.seq_length, 20, device)

    torch.manual_seed(0)
    plain_model = BertForPreTraining(model_cfg).to(device).train()
    plain_optimizer = build_optimizer(plain_model, cfg.optim, device.type)

    def plain_step() -> None:
        plain_optimizer.zero_grad(set_to_none=True)
        plain_model(**batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(plain_model.parameters(), cfg.optim.grad_clip_norm)
        plain_optimizer.step()

    torch.manual_seed(0)
    ds_model = BertForPreTraining(model_cfg)
    ds_engine = engine.initialize(
        ds_model, build_optimizer(ds_model, cfg.optim, device.type), engine.deepspeed_config(cfg, cfg.data.phases[0], 1)
    )

    def engine_step() -> None:
        ds_engine.backward(ds_engine(**batch).loss)
        ds_engine.step()

    seconds = interleaved_medians(
        {"plain torch": plain_step, "deepspeed": engine_step}, device, repeats=args.steps, warmup=2
    )
    distributed.destroy_process_group()
    results = {
        "size": args.size,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({threads} threads)",
        "precision": args.precision,
        "zero_stage": args.zero_stage,
        "batch_size": args.batch_size,
        "seq_length": args.seq_length,
        **{name: {"step_seconds": s, "sequences_per_second": args.batch_size / s} for name, s in seconds.items()},
        "deepspeed_over_plain": seconds["deepspeed"] / seconds["plain torch"],
    }
    print(
        f"BERT-{args.size}, batch {args.batch_size} x {args.seq_length}, {args.precision}, ZeRO-{args.zero_stage}, "
        f"{results['device']}"
    )
    for name, s in seconds.items():
        print(f"  {name:12s} {s * 1e3:8.1f} ms/step  {args.batch_size / s:8.1f} sequences/s")
    print(f"  engine time / plain time: {results['deepspeed_over_plain']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu" if not torch.cuda.is_available() else "cuda")
    main()
