"""The training step, not the model step: one optimizer step through bertdist's DeepSpeed engine against the same
model stepped by a plain PyTorch loop, and against transformers' BertForPreTraining (SDPA, torch's fused AdamW on
CUDA), timed in turns in the same process.

All three do forward + backward + gradient clipping at 1.0 + AdamW on the same batch, each in the precision its
users train in: the plain loops autocast from fp32 weights (as transformers' Trainer does with `bf16=True`), the
engine runs DeepSpeed's bf16/fp16 (the module's weights in half precision, fp32 master weights in the optimizer, so
its normalizations and softmax run in half precision too). In fp32 the engine / plain ratio is what DeepSpeed (ZeRO
bookkeeping, its gradient buffers, the all-reduce of a 1-rank world) costs on top of the math; in bf16 it is that
and the precision mode together, which favours the engine's speed: say so beside its figure. transformers / engine
is bertdist's training step against the peer's. MFU counts the model's own FLOPs of each sample at its length
(`bertdist.model.flops`) against the GPU's datasheet peak (on a CPU, a matmul peak measured in the same process). A
variant that fails is named with its error under `failed`; the others are still timed. `--fill` below 1 gives rows
of mixed lengths (0.5: BERT's length-512 data); `--peers padded,padding-free` then also times transformers
padding-free (its flattening collator and the FlashAttention-2 variable-length kernel, benchmarks/hf_peer.py; with
`--no-attention-dropout`, as it has none).

    DS_ACCELERATOR=cpu python benchmarks/train_step.py                 # CPU, BERT-mini, fp32, ZeRO-1
    DS_ACCELERATOR=cpu python benchmarks/train_step.py --zero-stage 2
    python benchmarks/train_step.py --device cuda --size base --precision bf16 --zero-stage 2 --batch-size 64
    python benchmarks/train_step.py --device cuda --size large --precision bf16 --seq-length 512 --fill 0.5 \
        --masked-positions 80 --batch-size 32 --no-attention-dropout --peers padded,padding-free
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path

import hf_peer  # benchmarks/ is on sys.path
import torch
from common import matmul_peak_flops, mfu_peak, time_variants, use_all_cores
from model_step import DTYPES, make_batch, peer_step

from bertdist.config import MODEL_SIZES, load_config
from bertdist.model.bert.model import BertForPreTraining
from bertdist.model.flops import train_flops_of_batch
from bertdist.train import deepspeed as engine
from bertdist.train import distributed, ports
from bertdist.train.optim import build_optimizer


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="mini", choices=list(MODEL_SIZES))
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--zero-stage", type=int, default=1, choices=[0, 1, 2, 3])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-length", type=int, default=128)
    p.add_argument("--masked-positions", type=int, default=20, help="MLM predictions per sequence")
    p.add_argument("--fill", type=float, default=1.0, help="mean fraction of real tokens per row (1: no padding)")
    p.add_argument("--attention", default="auto", help="model.attention of bertdist's model")
    p.add_argument("--no-reference", action="store_true", help="no transformers row")
    p.add_argument("--peers", default="padded", help="transformers' configurations: padded, padding-free (hf_peer.py)")
    p.add_argument("--no-attention-dropout", action="store_true", help="every model without attention dropout")
    p.add_argument("--steps", type=int, default=7, help="timed steps per variant (median reported)")
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)
    if args.device == "cpu" and args.precision != "fp32":
        p.error("--precision: bf16/fp16 are GPU paths; CPU runs use fp32")

    threads = use_all_cores()
    device = torch.device(args.device)
    env = distributed.read_env({"MASTER_PORT": str(ports.free_tcp_port())})
    distributed.init_process_group(env, backend="nccl" if device.type == "cuda" else "gloo")
    cfg = load_config(
        None,
        [
            f"model.size={args.size}",
            f"train.global_batch_size={args.batch_size}",
            f"data.phases.0.micro_batch_size={args.batch_size}",
            f"train.zero_stage={args.zero_stage}",
            f"train.precision={args.precision}",
            f"model.attention={args.attention}",
            *(["model.attention_dropout_prob=0"] if args.no_attention_dropout else []),
        ],
    )
    model_cfg = cfg.model
    batch = make_batch(model_cfg, args.batch_size, args.seq_length, args.masked_positions, device, args.fill)
    autocast = (
        torch.autocast(device.type, dtype=DTYPES[args.precision])
        if args.precision != "fp32"
        else contextlib.nullcontext()
    )

    def plain() -> callable:
        torch.manual_seed(0)
        plain_model = BertForPreTraining(model_cfg).to(device).train()
        plain_optimizer = build_optimizer(plain_model, cfg.optim, device.type)

        def plain_step() -> None:
            plain_optimizer.zero_grad(set_to_none=True)
            with autocast:
                loss = plain_model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(plain_model.parameters(), cfg.optim.grad_clip_norm)
            plain_optimizer.step()

        return plain_step

    def deepspeed() -> callable:
        torch.manual_seed(0)
        ds_model = BertForPreTraining(model_cfg)
        optimizer = build_optimizer(ds_model, cfg.optim, device.type)
        ds_engine = engine.initialize(ds_model, optimizer, engine.deepspeed_config(cfg, cfg.data.phases[0], 1))

        def engine_step() -> None:
            ds_engine.backward(ds_engine(**batch).loss)
            ds_engine.step()

        return engine_step

    makers = {"plain torch": plain, "deepspeed": deepspeed}
    for kind in [] if args.no_reference else args.peers.split(","):
        makers[hf_peer.ROWS[kind]] = lambda kind=kind: peer_step(model_cfg, batch, kind, args.precision, device, 1.0)
    measured = matmul_peak_flops(device, DTYPES[args.precision])
    peak, peak_source = mfu_peak(device, args.precision, measured)
    seconds, failed = time_variants(makers, device, repeats=args.steps, warmup=2)
    distributed.destroy_process_group()
    mean_length = float(batch["attention_mask"].sum()) / args.batch_size
    flops_per_sequence = float(train_flops_of_batch(model_cfg, batch["attention_mask"], batch["masked_lm_ids"]))
    flops_per_sequence /= args.batch_size
    results = {
        "size": args.size,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({threads} threads)",
        "precision": args.precision,
        "zero_stage": args.zero_stage,
        "batch_size": args.batch_size,
        "seq_length": args.seq_length,
        "padding_fraction": 1 - mean_length / args.seq_length,
        "attention_dropout": model_cfg.attention_dropout_prob,  # the padding-free peer's rows run without it
        "attention": args.attention,
        "matmul_peak_tflops": measured / 1e12,
        "mfu_peak_tflops": peak / 1e12,
        "mfu_peak": peak_source,
        **({"failed": failed} if failed else {}),
        **{
            name: {
                "step_seconds": s,
                "sequences_per_second": args.batch_size / s,
                "mfu": args.batch_size / s * flops_per_sequence / peak,
            }
            for name, s in seconds.items()
        },
    }
    if {"deepspeed", "plain torch"} <= set(seconds):
        results["deepspeed_over_plain"] = seconds["deepspeed"] / seconds["plain torch"]
    for key, row in (("speedup", "transformers"), ("speedup_padding_free", "transformers padding-free")):
        if row in seconds and "deepspeed" in seconds:
            results[key] = seconds[row] / seconds["deepspeed"]
    print(
        f"BERT-{args.size}, batch {args.batch_size} x {args.seq_length}, {args.precision}, ZeRO-{args.zero_stage}, "
        f"{results['device']}"
    )
    for name, s in seconds.items():
        mfu = results[name]["mfu"]
        print(f"  {name:25s} {s * 1e3:8.1f} ms/step  {args.batch_size / s:8.1f} sequences/s  MFU {mfu:6.1%}")
    for name, error in failed.items():
        print(f"  {name:25s} failed: {error}")
    if "deepspeed_over_plain" in results:
        print(f"  engine time / plain time: {results['deepspeed_over_plain']:.2f}")
    for key, row in (("speedup", "transformers"), ("speedup_padding_free", "transformers padding-free")):
        if key in results:
            print(f"  bertdist's engine over {row}: {results[key]:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu" if not torch.cuda.is_available() else "cuda")
    main()
