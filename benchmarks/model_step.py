"""Training-step speed of a bertdist model against its transformers class, same batch, same weights' shapes, same run.

BERT sizes are timed against `transformers.BertForPreTraining`, ModernBERT sizes (`--size modernbert-mini`) against
`transformers.ModernBertForMaskedLM` (sdpa attention, its sparse prediction on: the head at the masked positions
only, as bertdist's). On rows of mixed lengths (`--fill` below 1) `--peers padded,padding-free` also times
transformers padding-free: its flattening collator and the FlashAttention-2 variable-length kernel
(benchmarks/hf_peer.py), the configuration transformers documents for such batches.

One step = forward + backward + AdamW update, on a full-length batch with BERT's prediction budget (20 masked
positions per sequence at length 128). Both models get the same optimizer and precision; the two are timed in
turns and the medians compared. MFU counts the model's own FLOPs of each sample at its length
(`bertdist.model.flops`, which excludes the vocab projection at unmasked positions) against the GPU's datasheet
peak (as the trainer and the published figures do; on a CPU, a matmul peak measured in the same process, which the
results give on a GPU too). A variant that fails (a kernel this GPU cannot run) is named with its error under
`failed`; the others are still timed.

    python benchmarks/model_step.py                                   # CPU, BERT-mini, fp32 (the acceptance run)
    python benchmarks/model_step.py --device cuda --size large --precision bf16 --batch-size 128
    python benchmarks/model_step.py --device cuda --size large --precision fp16 --batch-size 128
    python benchmarks/model_step.py --size modernbert-mini                            # length 128, full rows
    python benchmarks/model_step.py --size modernbert-mini --seq-length 1024 --fill 0.65 --batch-size 4
    python benchmarks/model_step.py --device cuda --size large --precision bf16 --seq-length 512 --fill 0.5 \
        --masked-positions 80 --batch-size 32 --no-attention-dropout --peers padded,padding-free
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import warnings
from pathlib import Path

# benchmarks/ is on sys.path when this file runs as a script.
import hf_peer
import torch
from common import (
    DTYPES,
    device_name,
    matmul_peak_flops,
    mfu_peak,
    step_clock,
    time_variants,
    use_all_cores,
)

from bertdist.config import MODEL_SIZES, ModelConfig
from bertdist.model.compiled import compile_model
from bertdist.model.flops import train_flops_of_batch
from bertdist.model.registry import build_model


def make_batch(cfg: ModelConfig, batch_size: int, seq_length: int, predictions: int, device, fill: float = 1.0) -> dict:
    """Sentence pairs with sorted masked positions: full length (fill 1, most of BERT's length-128 data), or of
    lengths drawn uniformly so that on average `fill` of the slots are real tokens (0.5: BERT's length-512 data)."""
    g = torch.Generator().manual_seed(0)
    shortest = max(predictions + 2, round((2 * fill - 1) * seq_length) if fill >= 0.5 else predictions + 2)
    longest = seq_length if fill >= 0.5 else max(shortest, round(2 * fill * seq_length))
    lengths = torch.randint(shortest, longest + 1, (batch_size,), generator=g)
    slots = torch.arange(seq_length)[None, :]
    attention_mask = (slots < lengths[:, None]).long()
    input_ids = torch.randint(5, cfg.vocab_size, (batch_size, seq_length), generator=g) * attention_mask
    token_type_ids = ((slots >= lengths[:, None] // 2) & attention_mask.bool()).long()
    positions = torch.stack([torch.randperm(int(n) - 1, generator=g)[:predictions] + 1 for n in lengths])
    batch = dict(
        input_ids=input_ids,
        token_type_ids=token_type_ids,
        attention_mask=attention_mask,
        masked_lm_positions=positions.sort(dim=1).values,
        masked_lm_ids=torch.randint(5, cfg.vocab_size, (batch_size, predictions), generator=g),
        next_sentence_label=torch.randint(0, 2, (batch_size,), generator=g),
    )
    return {k: v.to(device) for k, v in batch.items()}


def training_step(model, forward, precision: str, device: torch.device, clip_norm: float = 0.0) -> callable:
    """A closure doing one fwd + bwd + AdamW step; fp16 uses loss scaling, bf16 / fp16 autocast, fp32 neither;
    `clip_norm` > 0 clips the gradients' norm first (as a training run does)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    autocast = torch.autocast(device.type, dtype=DTYPES[precision]) if precision != "fp32" else contextlib.nullcontext()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = forward()
        scaler.scale(loss).backward()
        if clip_norm:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        scaler.step(optimizer)
        scaler.update()

    return step


def peer_step(cfg: ModelConfig, batch: dict, kind: str, precision: str, device, clip_norm: float = 0.0) -> callable:
    """transformers' model of `cfg` in configuration `kind` (benchmarks/hf_peer.py), seeded as bertdist's variants
    are, as a `training_step` on `batch`."""
    torch.manual_seed(0)
    reference, loss = hf_peer.peer(cfg, batch, kind, device)
    return training_step(reference, loss, precision, device, clip_norm)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="mini", choices=list(MODEL_SIZES))
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default="fp32", choices=list(DTYPES))
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-length", type=int, default=128)
    p.add_argument("--masked-positions", type=int, default=20, help="MLM predictions per sequence")
    p.add_argument("--vocab-size", type=int, help="the size's vocabulary unless given (the fast recipes: 8192)")
    p.add_argument(
        "--fill",
        type=float,
        default=1.0,
        help="mean fraction of real tokens per row (1: no padding); below 1 the padded and the unpadded "
        "encoder are both timed",
    )
    p.add_argument("--compile", action="store_true", help="also time bertdist with its layers compiled (model.compile)")
    p.add_argument(
        "--attention",
        default="",
        help="also time bertdist on these attention kernels, comma-separated (model.attention: sdpa, varlen, flex; "
        "the plain `bertdist` row is auto). The fused kernels have no attention dropout: where the model has some, "
        "every kernel row runs without it (sdpa too, so that the rows compare)",
    )
    p.add_argument("--steps", type=int, default=7, help="timed steps per model (median reported)")
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: one per available core)")
    p.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with this thread's CPU time instead of wall time (needs --threads 1): robust on a busy machine",
    )
    p.add_argument("--no-reference", action="store_true", help="time bertdist only (no transformers model)")
    p.add_argument(
        "--peers",
        default="padded",
        help="transformers' configurations to time, comma-separated: padded (SDPA), padding-free (its flattening "
        "collator and the FlashAttention-2 variable-length kernel; needs --no-attention-dropout for BERT sizes); "
        "benchmarks/hf_peer.py",
    )
    p.add_argument(
        "--no-attention-dropout",
        action="store_true",
        help="every model without attention dropout (ModernBERT and the modern recipes train so; the fused kernels "
        "and the padding-free peer need it)",
    )
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device visible")
    if device.type == "cpu" and args.precision != "fp32":
        p.error("--precision: bf16/fp16 are GPU paths; CPU runs use fp32")
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = args.threads or use_all_cores()
    try:
        clock = step_clock(device, threads, args.cpu_time)
    except ValueError as e:
        p.error(str(e))
    torch.manual_seed(0)
    cfg = ModelConfig.from_size(args.size, **({"vocab_size": args.vocab_size} if args.vocab_size else {}))
    if args.no_attention_dropout:
        cfg = dataclasses.replace(cfg, attention_dropout_prob=0.0)
    batch = make_batch(cfg, args.batch_size, args.seq_length, args.masked_positions, device, args.fill)

    def bertdist_step(**changes) -> callable:
        torch.manual_seed(0)
        model = build_model(dataclasses.replace(cfg, **changes)).to(device).train()
        if changes.get("compile"):
            compile_model(model, cfg.arch)
        return training_step(model, lambda: model(**batch).loss, args.precision, device)

    makers = {"bertdist": bertdist_step}
    if args.fill < 1:
        makers["bertdist padded"] = lambda: bertdist_step(unpad=False)
    if args.compile:
        makers["bertdist+compile"] = lambda: bertdist_step(compile=True)
    kernels = [k for k in args.attention.split(",") if k]
    for kernel in kernels:
        makers[f"bertdist[{kernel}]"] = lambda kernel=kernel: bertdist_step(
            attention=kernel, attention_dropout_prob=0.0
        )
    for kind in [] if args.no_reference else args.peers.split(","):
        makers[hf_peer.ROWS[kind]] = lambda kind=kind: peer_step(cfg, batch, kind, args.precision, device)

    measured_flops = matmul_peak_flops(device, DTYPES[args.precision], clock=clock)
    peak_flops, peak_source = mfu_peak(device, args.precision, measured_flops)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seconds, failed = time_variants(makers, device, repeats=args.steps, warmup=args.warmup_steps, clock=clock)
    # A layer whose compilation failed runs eager (bertdist.model.compiled): its column would time eager under the
    # name of compiled, so the result says so.
    fell_back = sorted({str(w.message) for w in caught if str(w.message).startswith("model.compile:")})
    for w in caught:
        if not str(w.message).startswith("model.compile:"):
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    # Useful FLOPs: of the real tokens only, so that padded and unpadded runs are read against the same work.
    mean_length = float(batch["attention_mask"].sum()) / args.batch_size
    flops_per_sequence = (
        float(train_flops_of_batch(cfg, batch["attention_mask"], batch["masked_lm_ids"])) / args.batch_size
    )
    results = {
        "size": args.size,
        "device": device_name(device, threads),
        "precision": args.precision,
        "batch_size": args.batch_size,
        "seq_length": args.seq_length,
        "padding_fraction": 1 - mean_length / args.seq_length,
        "attention_dropout": cfg.attention_dropout_prob,  # the padding-free peer's rows run without it
        "matmul_peak_tflops": measured_flops / 1e12,
        "mfu_peak_tflops": peak_flops / 1e12,
        "mfu_peak": peak_source,
        "clock": "thread cpu time" if args.cpu_time else "wall",
        **({"compile_fell_back": fell_back} if fell_back else {}),
        **({"failed": failed} if failed else {}),
    }
    print(
        f"{args.size} ({cfg.arch}) fwd+bwd+AdamW, batch {args.batch_size} x {args.seq_length}, "
        f"{args.masked_positions} masked/seq, padding {results['padding_fraction']:.0%}, {args.precision}, "
        f"{results['device']}, {results['clock']} clock; "
        f"MFU against the {peak_source} peak {peak_flops / 1e9:.1f} GFLOP/s; load average {os.getloadavg()[0]:.1f} "
        "(other processes on the machine lower every number, the ratio less)"
    )
    for name, s in seconds.items():
        sequences_per_second = args.batch_size / s
        mfu = sequences_per_second * flops_per_sequence / peak_flops
        results[name] = {"step_seconds": s, "sequences_per_second": sequences_per_second, "mfu": mfu}
        print(f"  {name:25s} {s * 1e3:8.1f} ms/step  {sequences_per_second:8.1f} sequences/s  MFU {mfu:6.1%}")
    for name, error in failed.items():
        print(f"  {name:25s} failed: {error}")
    for key, row in (("speedup", "transformers"), ("speedup_padding_free", "transformers padding-free")):
        if row in seconds and "bertdist" in seconds:
            results[key] = seconds[row] / seconds["bertdist"]
            print(f"  speedup over {row}: {results[key]:.2f}x")
    for variant in ("bertdist padded", "bertdist+compile", *(f"bertdist[{k}]" for k in kernels)):
        if variant in seconds and "bertdist" in seconds:
            results[f"bertdist over {variant}"] = seconds[variant] / seconds["bertdist"]
            print(f"  bertdist over {variant}: {results[f'bertdist over {variant}']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
