"""Where a training step's time goes: the step `model_step.py` times, run under `torch.profiler`, its kernels
grouped by what they do (matmuls, attention, normalization, the loss, the optimizer, copies, elementwise work).

When a speed goal is missed, this says which kernel or which part of the step holds it back: on a GPU the
self time of every CUDA kernel, on a CPU (the smoke run) the self time of every operator. The shares are of the
profiled steps' kernel time; `--peers` profiles transformers' step beside bertdist's (benchmarks/hf_peer.py), so
that a difference in attention or in the head shows as one.

    python benchmarks/step_profile.py                       # CPU, BERT-mini (the operators, not kernels)
    python benchmarks/step_profile.py --device cuda --size large --precision bf16 --seq-length 512 --fill 0.5 \\
        --masked-positions 80 --batch-size 32 --no-attention-dropout --peers padding-free
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import hf_peer  # benchmarks/ is on sys.path
import torch
from common import each_variant, synchronize, use_all_cores
from model_step import make_batch, peer_step, training_step

from bertdist.config import MODEL_SIZES, ModelConfig
from bertdist.model.compiled import compile_model
from bertdist.model.registry import build_model

CATEGORIES = (  # (what, lower-cased substrings of a kernel's or an operator's name): the first match wins
    # the loss before attention: CUDA's log-softmax is `cunn_SoftMaxForward<..., LogSoftMaxForwardEpilogue>`
    ("loss", ("cross_entropy", "nll_loss", "log_softmax", "logsoftmax", "logsumexp")),
    ("attention", ("flash", "fmha", "attention", "flex", "varlen", "softmax")),
    ("matmul", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "matmul", "aten::mm", "aten::addmm", "aten::bmm")),
    ("optimizer", ("adam", "multi_tensor", "foreach", "optimizer")),
    ("normalization", ("layer_norm", "layernorm", "rms_norm")),
    ("copy and index", ("memcpy", "memset", "copy", "cat", "index", "gather", "scatter", "pad", "fill", "nonzero")),
    ("compiled (triton)", ("triton",)),
    ("elementwise", ("elementwise", "vectorized", "gelu", "dropout", "add", "mul", "div", "reduce", "where")),
)
TOP = 12


def category(name: str) -> str:
    lowered = name.lower()
    return next((what for what, parts in CATEGORIES if any(p in lowered for p in parts)), "other")


def profile(step: Callable[[], None], device: torch.device, steps: int = 3, warmup: int = 2) -> dict:
    """Kernel (CUDA) or operator (CPU) self time of `steps` calls of `step`, per step: the total, the share of each
    category, and the TOP names by time."""
    for _ in range(warmup):
        step()
    synchronize(device)
    cuda = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        synchronize(device)
    times: dict[str, float] = {}
    for event in prof.key_averages():
        if cuda:
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            microseconds = event.self_device_time_total
        else:
            if event.key.startswith("ProfilerStep"):
                continue
            microseconds = event.self_cpu_time_total
        if microseconds > 0:
            times[event.key] = times.get(event.key, 0.0) + microseconds / 1e3 / steps
    total = sum(times.values())
    shares: dict[str, float] = {}
    for name, ms in times.items():
        shares[category(name)] = shares.get(category(name), 0.0) + ms / total
    top = sorted(times.items(), key=lambda kv: -kv[1])[:TOP]
    return {
        "what": "CUDA kernels" if cuda else "CPU operators",
        "ms_per_step": total,
        "categories": dict(sorted(shares.items(), key=lambda kv: -kv[1])),
        "top": [{"name": n[:120], "category": category(n), "ms_per_step": ms, "share": ms / total} for n, ms in top],
    }


def summary(result: dict) -> str:
    """One line: the categories' shares, largest first."""
    parts = ", ".join(f"{what} {share:.0%}" for what, share in result["categories"].items() if share >= 0.01)
    return f"{result['ms_per_step']:.1f} ms of {result['what']} per step: {parts}"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="mini", choices=list(MODEL_SIZES))
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-length", type=int, default=128)
    p.add_argument("--masked-positions", type=int, default=20)
    p.add_argument("--fill", type=float, default=1.0, help="mean fraction of real tokens per row")
    p.add_argument("--attention", default="auto", help="model.attention of bertdist's model")
    p.add_argument("--compile", action="store_true", help="bertdist's layers compiled (model.compile)")
    p.add_argument("--no-attention-dropout", action="store_true")
    p.add_argument("--peers", default="", help="also profile transformers: padded, padding-free (comma-separated)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)
    if args.device == "cpu" and args.precision != "fp32":
        p.error("--precision: bf16/fp16 are GPU paths; CPU runs use fp32")
    use_all_cores()
    device = torch.device(args.device)
    cfg = dataclasses.replace(
        ModelConfig.from_size(args.size),
        attention=args.attention,
        **({"attention_dropout_prob": 0.0} if args.no_attention_dropout else {}),
    )
    batch = make_batch(cfg, args.batch_size, args.seq_length, args.masked_positions, device, args.fill)

    def bertdist() -> callable:
        torch.manual_seed(0)
        model = build_model(cfg).to(device).train()
        if args.compile:
            compile_model(model, cfg.arch)
        return training_step(model, lambda: model(**batch).loss, args.precision, device)

    makers = {"bertdist": bertdist}
    for kind in [k for k in args.peers.split(",") if k]:
        makers[hf_peer.ROWS[kind]] = lambda kind=kind: peer_step(cfg, batch, kind, args.precision, device)
    results = {
        "size": args.size,
        "seq_length": args.seq_length,
        "batch_size": args.batch_size,
        "precision": args.precision,
        "attention": args.attention,
        "compile": args.compile,
    }
    profiles, failed = each_variant(makers, device, lambda step: profile(step, device, args.steps))
    results.update(profiles)
    for name, error in failed.items():
        print(f"{args.size} x {args.seq_length}, {name}: failed: {error}")
    if failed:
        results["failed"] = failed
    steps = [name for name in makers if name in results]
    for name in steps:
        print(f"{args.size} x {args.seq_length}, {name}: {summary(results[name])}")
        for row in results[name]["top"][:6]:
            print(f"    {row['share']:6.1%} {row['ms_per_step']:8.2f} ms  [{row['category']}] {row['name'][:90]}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
