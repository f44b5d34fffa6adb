"""Long context: tokens/s and peak memory of ModernBERT-mini at 512 to 8,192 tokens, bertdist against transformers.

The same tokens per batch at every length (`--tokens`, 8,192: 16 rows of 512 ... 1 row of 8,192), full rows, 15%
of the tokens predicted; one step = forward + backward + AdamW, fp32 on CPU, bf16 weights on a GPU (`--device
cuda`). Each (model, length) runs in a process of its own for its peak memory (CPU: resident, ru_maxrss; GPU: the
allocator's peak), and the two models are timed in turns in one process, so that the machine's load hits both
alike. bertdist's local layers attend within their window (`bertdist.model.ops.local_attention`);
`transformers.ModernBertForMaskedLM` (sdpa, its sparse prediction on) masks a full grid, and on a GPU also with
its FlexAttention (`transformers-flex`: block-sparse windows, its best there without the flash-attn package); the
speedup is against the faster transformers row, and a peer that cannot run is named, not fatal. Printed: per
length, each model's tokens/s and peak memory, bertdist's cost per token relative to its cost at the shortest
length (goal: <= 2x at 8,192), and the speedup (goal: >= 2x at 8,192). `--checkpointed` adds bertdist with
`model.activation_checkpointing` (each layer recomputed in the backward pass): the memory a long row needs against
the time it costs.

    python benchmarks/long_context.py                        # about five minutes on 2 CPU cores
    python benchmarks/long_context.py --lengths 512,2048 --steps 2
    python benchmarks/long_context.py --lengths 8192 --checkpointed
    python benchmarks/long_context.py --device cuda --tokens 65536   # a GPU: 8 rows of 8,192
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

LENGTHS = (512, 1024, 2048, 4096, 8192)
CHECKPOINTED = "bertdist-checkpointed"
FLEX_PEER = "transformers-flex"


def step_function(model_name: str, length: int, tokens: int, size: str, device: str):
    """A closure doing one forward + backward + AdamW step of `model_name` on a full batch of `length`."""
    import dataclasses

    import torch

    from bertdist.config import ModelConfig
    from bertdist.model.ops import IGNORE_INDEX
    from bertdist.model.registry import build_model, hf_adapter

    torch.manual_seed(0)
    cfg = dataclasses.replace(ModelConfig.from_size(size), max_position_embeddings=max(LENGTHS))
    rows, predictions = max(1, tokens // length), round(0.15 * length)
    g = torch.Generator().manual_seed(length)
    ids = torch.randint(5, cfg.vocab_size, (rows, length), generator=g)
    mask = torch.ones(rows, length, dtype=torch.long)
    positions = (
        torch.stack([torch.randperm(length - 1, generator=g)[:predictions] + 1 for _ in range(rows)]).sort(1).values
    )
    labels = torch.randint(5, cfg.vocab_size, (rows, predictions), generator=g)
    if model_name.startswith("bertdist"):
        model = build_model(dataclasses.replace(cfg, activation_checkpointing=model_name == CHECKPOINTED)).train()
        batch = dict(input_ids=ids, attention_mask=mask, masked_lm_positions=positions, masked_lm_ids=labels)
    else:
        import transformers

        special = dict(pad_token_id=0, cls_token_id=2, bos_token_id=2, sep_token_id=3, eos_token_id=3)
        kernel = "flex_attention" if model_name == FLEX_PEER else "sdpa"
        hf = transformers.ModernBertConfig(
            **hf_adapter("modernbert").config_to_hf(cfg, special), sparse_prediction=True, attn_implementation=kernel
        )
        model = transformers.ModernBertForMaskedLM(hf).train()
        dense = torch.full_like(ids, IGNORE_INDEX).scatter_(1, positions, labels)
        batch = dict(input_ids=ids, attention_mask=mask, labels=dense)
    model.to(device, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    batch = {k: v.to(device) for k, v in batch.items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        optimizer.step()

    return step, rows


def timed_pair(length: int, tokens: int, steps: int, size: str, models: tuple[str, ...], device: str) -> dict:
    """The models' median step times at `length`, timed in turns (load hits all alike)."""
    import torch
    from common import interleaved_medians

    functions = {}
    for name in models:
        step = step_function(name, length, tokens, size, device)[0]
        if name == FLEX_PEER:  # a peer this transformers or torch cannot run is named in the table, not fatal
            try:
                step()
            except Exception as e:  # noqa: BLE001
                print(f"{FLEX_PEER}: cannot run here ({type(e).__name__}: {str(e)[:200]})", file=sys.stderr)
                continue
        functions[name] = step
    return interleaved_medians(functions, torch.device(device), repeats=steps, warmup=1)


def peak_memory(model_name: str, length: int, tokens: int, size: str, device: str) -> float:
    """GB of peak memory of a process that builds one model and runs two steps: resident on CPU, the CUDA
    allocator's on a GPU."""
    import torch

    step, _ = step_function(model_name, length, tokens, size, device)
    step()
    step()
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    p.add_argument("--tokens", type=int, default=8192, help="tokens per batch at every length")
    p.add_argument("--steps", type=int, default=3, help="timed steps per run (median reported)")
    p.add_argument("--size", default="modernbert-mini")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--checkpointed", action="store_true", help="also bertdist with activation checkpointing")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--child", nargs=2, metavar=("WHAT", "LENGTH"), help=argparse.SUPPRESS)  # a child process
    args = p.parse_args(argv)
    models = (
        "bertdist",
        "transformers",
        *((FLEX_PEER,) if args.device == "cuda" else ()),
        *((CHECKPOINTED,) if args.checkpointed else ()),
    )
    if args.child:
        what, length = args.child[0], int(args.child[1])
        value = (
            timed_pair(length, args.tokens, args.steps, args.size, models, args.device)
            if what == "time"
            else peak_memory(what, length, args.tokens, args.size, args.device)
        )
        print(json.dumps(value))
        return {}
    results: dict = {"size": args.size, "device": args.device, "tokens_per_batch": args.tokens, "runs": []}
    where = f"bf16 on {_gpu_name()}" if args.device == "cuda" else f"fp32 on {os.cpu_count()} CPUs"
    print(f"{args.size}, {args.tokens} tokens per batch, fwd+bwd+AdamW {where}, load {os.getloadavg()[0]:.1f}")
    print(
        f"{'length':>7} {'bertdist tok/s':>15} {'GB':>6} {'transformers tok/s':>19} {'GB':>6} "
        f"{'speedup':>8} {'cost/token':>11}" + (f" {'checkpointed tok/s':>19} {'GB':>6}" if args.checkpointed else "")
    )
    base = None
    for length in map(int, args.lengths.split(",")):
        seconds = _child(args, "time", length)
        memory = {name: _child(args, name, length) for name in seconds}
        rows = max(1, args.tokens // length)
        measured = {
            n: {"step_s": seconds[n], "tokens_per_s": rows * length / seconds[n], "peak_memory_gb": memory[n]}
            for n in seconds
        }
        peers = [n for n in ("transformers", FLEX_PEER) if n in measured]
        fastest = max(peers, key=lambda n: measured[n]["tokens_per_s"])
        ours, theirs = measured["bertdist"], measured[fastest]
        base = base or ours["tokens_per_s"]
        row = {
            "length": length,
            "bertdist": ours,
            **{n: measured[n] for n in peers},
            "against": fastest,
            "speedup": ours["tokens_per_s"] / theirs["tokens_per_s"],
            "cost_per_token_vs_shortest": base / ours["tokens_per_s"],
        }
        checkpointed = ""
        if args.checkpointed:
            row[CHECKPOINTED] = c = measured[CHECKPOINTED]
            checkpointed = f" {c['tokens_per_s']:>19,.0f} {c['peak_memory_gb']:>6.2f}"
        results["runs"].append(row)
        print(
            f"{length:>7} {ours['tokens_per_s']:>15,.0f} {ours['peak_memory_gb']:>6.2f} "
            f"{theirs['tokens_per_s']:>19,.0f} {theirs['peak_memory_gb']:>6.2f} "
            f"{row['speedup']:>7.2f}x {row['cost_per_token_vs_shortest']:>10.2f}x{checkpointed}"
            + (f"  (transformers row: {fastest})" if len(peers) > 1 else ""),
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


def _child(args: argparse.Namespace, what: str, length: int):
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            what,
            str(length),
            "--tokens",
            str(args.tokens),
            "--steps",
            str(args.steps),
            "--size",
            args.size,
            "--device",
            args.device,
            *(["--checkpointed"] if args.checkpointed else []),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "DS_ACCELERATOR": args.device},
    )
    if done.returncode != 0:
        raise SystemExit(f"{what} at {length}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name()


if __name__ == "__main__":
    main()
