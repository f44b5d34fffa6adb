"""Peak memory of a pretraining step with a multilingual vocabulary: the whole MLM logits against the chunked loss.

XLM-R's vocabulary is 250,002 tokens; at 512 tokens and 15% masking a micro batch of 32 makes 2,464 predictions,
whose fp32 logits alone are 2.3 GiB, and the loss keeps their exponentials too. `model.mlm_logits_mib` (default
512) scores them in chunks instead (bertdist.model.chunked_loss). Each side runs in a fresh process: a BERT of
`--size` with `--vocab` rows, one forward and backward to allocate the gradients, then the RSS high-water mark is
reset (/proc/self/clear_refs) and a second step measured: its peak RSS (VmHWM), how far it rose above the RSS
before it, and its seconds. Linux only (/proc).

    python benchmarks/mlm_loss_memory.py                      # BERT-mini, 250,002 tokens, 32 x 512, 77 predictions
    python benchmarks/mlm_loss_memory.py --rows 8 --predictions 20
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def rss_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} is not in /proc/self/status")


def measure(args: argparse.Namespace) -> dict[str, float]:
    """One warm step, then the peak RSS of a second (this process: run with --measure)."""
    import torch

    from bertdist.config import ModelConfig
    from bertdist.model.registry import build_model

    torch.manual_seed(0)
    budget = 0 if args.measure == "whole" else args.budget_mib
    cfg = ModelConfig.from_size(args.size, vocab_size=args.vocab, objective="mlm", mlm_logits_mib=budget)
    model = build_model(cfg)
    rows, seq = args.rows, args.seq_length
    batch = {
        "input_ids": torch.randint(5, args.vocab, (rows, seq)),
        "attention_mask": torch.ones(rows, seq, dtype=torch.long),
        "masked_lm_positions": torch.stack([torch.randperm(seq - 1)[: args.predictions] + 1 for _ in range(rows)]),
        "masked_lm_ids": torch.randint(5, args.vocab, (rows, args.predictions)),
    }

    def step() -> float:
        start = time.perf_counter()
        model(**batch).loss.backward()
        return time.perf_counter() - start

    step()
    before = rss_mib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    seconds = step()
    peak = rss_mib("VmHWM")
    return {"peak_mib": peak, "rise_mib": peak - before, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="mini")
    parser.add_argument("--vocab", type=int, default=250_002)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--seq-length", type=int, default=512)
    parser.add_argument("--predictions", type=int, default=77, help="per sequence (15%% of 512)")
    parser.add_argument("--budget-mib", type=int, default=512, help="model.mlm_logits_mib of the chunked side")
    parser.add_argument("--measure", choices=["whole", "chunked"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args)))
        return
    results = {}
    for side in ("whole", "chunked"):
        out = subprocess.run(
            [sys.executable, __file__, *sys.argv[1:], "--measure", side], capture_output=True, text=True, timeout=1800
        )
        if out.returncode:
            sys.exit(f"{side}: exit {out.returncode}\n{out.stderr[-2000:]}")
        results[side] = json.loads(out.stdout.strip().splitlines()[-1])
    predictions = args.rows * args.predictions
    logits_gib = predictions * args.vocab * 4 / 2**30
    print(f"{args.size}, vocabulary {args.vocab:,}, {args.rows} x {args.seq_length}, {predictions:,} predictions")
    print(f"(their fp32 logits: {logits_gib:.2f} GiB); chunked at model.mlm_logits_mib={args.budget_mib}")
    print(f"{'':10}{'peak RSS':>12}{'rise':>12}{'step s':>10}")
    for side, r in results.items():
        print(f"{side:10}{r['peak_mib']:>10,.0f} M{r['rise_mib']:>10,.0f} M{r['seconds']:>10.2f}")
    whole, chunked = results["whole"], results["chunked"]
    print(
        f"chunked / whole: peak {chunked['peak_mib'] / whole['peak_mib']:.2f}x, rise "
        f"{chunked['rise_mib'] / whole['rise_mib']:.2f}x, time {chunked['seconds'] / whole['seconds']:.2f}x"
    )


if __name__ == "__main__":
    main()
