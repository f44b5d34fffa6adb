"""Peak memory of a contrastive step through the gradient cache (`finetune.cache_rows`) against a plain small batch.

Two measurements, each in a fresh process, of one optimizer step of `bertdist finetune finetune.task=embedding`
through its real step (`Finetuning._step`: the DeepSpeed engine on one CPU rank, fp32, AdamW), on (query,
positive) pairs of `--seq-length` tokens and an encoder of `--size`:
  plain   finetune.batch_size = micro_batch_size = --chunk-rows (negatives: that batch's passages);
  cached  finetune.batch_size = --rows, cache_rows = --chunk-rows (negatives: all --rows passages).
One step runs first (AdamW's state is allocated then), then the process's RSS high-water mark is reset
(/proc/self/clear_refs) and a second step measured: the step's peak RSS (VmHWM) and how far it rose above the
RSS before it. What the cache keeps beyond one chunk's activations is the rows' vectors and one block of the loss's
similarity matrix (chunk queries x every passage) with its softmax and gradient.

Linux only (/proc). The bar (issue 46): the cached step's peak within 1.3x of the plain one's.

    python benchmarks/cached_contrastive_memory.py                          # BERT-mini, 4,096 rows in chunks of 64
    python benchmarks/cached_contrastive_memory.py --rows 1024 --size tiny
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

WORDS = 4000
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_pairs(directory: Path, rows: int, seq_length: int) -> tuple[Path, Path]:
    """A vocabulary of whole words and `rows` (query, passage) pairs of `seq_length - 2` words each."""
    import numpy as np

    vocab = directory / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL + [f"w{i}" for i in range(WORDS)]) + "\n")
    rng = np.random.default_rng(0)

    def text() -> str:
        return " ".join(f"w{i}" for i in rng.integers(0, WORDS, seq_length - 2))

    data = directory / "pairs.jsonl"
    data.write_text("".join(json.dumps({"query": text(), "passage": text()}) + "\n" for _ in range(rows)))
    return vocab, data


def measure(args: argparse.Namespace) -> dict[str, float]:
    """One warm step, then the peak RSS of a second one (this process: run with --measure)."""
    import numpy as np

    from bertdist.config import load_config
    from bertdist.config.validation import validate_finetune
    from bertdist.finetune.runner import Finetuning
    from bertdist.train.distributed import destroy_process_group, read_env
    from bertdist.train.ports import free_tcp_port

    cached = args.measure == "cached"
    rows = args.rows if cached else args.chunk_rows
    with tempfile.TemporaryDirectory() as tmp:
        vocab, data = write_pairs(Path(tmp), rows, args.seq_length)
        cfg = load_config(
            None,
            [
                "finetune.task=embedding",
                "finetune.text_column=query",
                "finetune.text_pair_column=passage",
                f"finetune.vocab_file={vocab}",
                f"finetune.train_file={data}",
                f"finetune.dev_file={data}",
                f"finetune.batch_size={rows}",
                f"finetune.micro_batch_size={args.chunk_rows}",
                f"finetune.cache_rows={args.chunk_rows if cached else 0}",
                f"finetune.max_seq_length={args.seq_length}",
                f"finetune.output_dir={Path(tmp) / 'run'}",
                f"model.size={args.size}",
                f"model.vocab_size={len(SPECIAL) + WORDS}",
                "tracking.enabled=false",
                f"launch.master_port={free_tcp_port()}",
            ],
        )
        env = read_env(default_port=cfg.launch.master_port)
        validate_finetune(cfg, env.world_size)
        run = Finetuning(cfg, env)
        run._step(np.arange(rows))
        Path("/proc/self/clear_refs").write_text("5")  # the high-water mark restarts from the current RSS
        before = _status_kib("VmRSS")
        run._step(np.arange(rows))
        peak = _status_kib("VmHWM")
        run.close()
    destroy_process_group()
    return {"rows": rows, "peak_mib": peak / 1024, "rise_mib": (peak - before) / 1024}


def _status_kib(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="mini")
    parser.add_argument("--rows", type=int, default=4096, help="the cached step's rows (its contrastive batch)")
    parser.add_argument("--chunk-rows", type=int, default=64, help="cache_rows, and the plain step's batch")
    parser.add_argument("--seq-length", type=int, default=32)
    parser.add_argument("--measure", choices=("plain", "cached"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args)))
        return
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    found = {}
    for kind in ("plain", "cached"):
        command = [sys.executable, __file__, *sys.argv[1:], "--measure", kind]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        found[kind] = json.loads(out.strip().splitlines()[-1])
    plain, cached = found["plain"], found["cached"]
    print(f"encoder {args.size}, {args.seq_length} tokens, (query, positive) pairs, one CPU rank, fp32")
    for kind, m in found.items():
        print(f"  {kind:<6} {m['rows']:>5} rows: step peak RSS {m['peak_mib']:7.0f} MiB (+{m['rise_mib']:.0f} MiB)")
    print(f"cached / plain peak RSS: {cached['peak_mib'] / plain['peak_mib']:.2f}x (bar: <= 1.3x)")


if __name__ == "__main__":
    main()
