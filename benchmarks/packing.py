"""Useful (non-padding) tokens/s of the padded, unpadded and packed encoder, on shards made from real text.

The data is what `bertdist demo` trains on: Python's own documentation, prepared by `bertdist prepare` at
length 512 (`--max-predictions-per-seq 80`) and at 128 (20), BERT's two phases. The same micro batches (the
loader's batches of the first samples) are timed as one training step each (forward + backward, fp32, dropout
on as in training) in turns:
- padded: one sample per row, every slot computed (`model.unpad=false`), the reference;
- unpadded: the same rows, the encoder on the real tokens only (`model.unpad=true`, the default);
- packed: several samples per row (`data.packing=true`), block-diagonal attention, padded encoder;
- packed + unpadded: both.
Useful tokens/s = real tokens of the batches / median step time; the ratio to padded is the figure that
counts (goals: >= 1.6x at 512, >= 1.05x at 128).

    python benchmarks/packing.py [--size mini] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from common import interleaved_medians, use_all_cores

from bertdist.config import ModelConfig
from bertdist.data.batching import batch_of
from bertdist.data.samples import Samples
from bertdist.data.shards import iter_directory_blocks
from bertdist.model.bert.model import BertForPreTraining

PHASES = {512: (80, 8), 128: (20, 32)}  # length: (max predictions per sequence, micro batch size)
VARIANTS = {
    "padded": (False, False),
    "unpadded": (True, False),
    "packed": (False, True),
    "packed+unpadded": (True, True),
}


def prepared(workdir: Path, seq_length: int, documents: int) -> tuple[str, str]:
    """Shards of the first `documents` documents of Python's documentation at `seq_length` (made once)."""
    from bertdist.data.instances import InstanceOptions
    from bertdist.data.pipeline.driver import prepare
    from bertdist.data.pipeline.options import PrepareOptions
    from bertdist.data.readers import expand_inputs, iter_texts
    from bertdist.data.vocab import train_vocab
    from bertdist.demo import write_corpus

    corpus, vocab = workdir / "corpus", workdir / "vocab" / "vocab.txt"
    data = workdir / f"data{seq_length}"
    if not (corpus / "train.jsonl").is_file():
        train_file, _, _ = write_corpus(corpus)
        lines = train_file.read_text(encoding="utf-8").splitlines(keepends=True)[:documents]
        train_file.write_text("".join(lines), encoding="utf-8")
    if not vocab.is_file():
        train_vocab(iter_texts(expand_inputs([str(corpus / "train.jsonl")])), str(vocab.parent), 8192)
    if not (data / "manifest.json").is_file():
        options = InstanceOptions(
            max_seq_length=seq_length, max_predictions_per_seq=PHASES[seq_length][0], dupe_factor=1
        )
        prepare(
            PrepareOptions(
                inputs=[str(corpus / "train.jsonl")],
                output_dir=str(data),
                vocab_file=str(vocab),
                instances=options,
                progress=False,
            )
        )
    return str(data), str(vocab)


def first_samples(data: str, count: int) -> Samples:
    parts, total = [], 0
    for _, block in iter_directory_blocks(data):
        parts.append(block)
        total += len(block)
        if total >= count:
            break
    return Samples.concat(parts).slice(0, count)


def measure(cfg: ModelConfig, samples: Samples, seq_length: int, micro_batch_size: int, repeats: int) -> dict:
    chunks = [
        samples.slice(i, i + micro_batch_size) for i in range(0, len(samples) - micro_batch_size + 1, micro_batch_size)
    ]
    steps, useful, padding = {}, sum(int(c.lengths.sum()) for c in chunks), {}
    for name, (unpad, packing) in VARIANTS.items():
        torch.manual_seed(0)
        model = BertForPreTraining(
            ModelConfig(**{**cfg.__dict__, "unpad": unpad, "vocab_size": cfg.vocab_size})
        ).train()
        batches = [batch_of(c, seq_length, packing) for c in chunks]
        padding[name] = 1 - useful / sum(b["input_ids"].numel() for b in batches)

        def step(model=model, batches=batches) -> None:
            for batch in batches:
                model(**batch).loss.backward()
            model.zero_grad(set_to_none=True)

        steps[name] = step
    seconds = interleaved_medians(steps, torch.device("cpu"), repeats=repeats, warmup=1)
    return {name: (useful / s, padding[name]) for name, s in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="mini")
    parser.add_argument("--workdir", default="runs/bench/packing")
    parser.add_argument("--documents", type=int, default=3000, help="documents of the corpus to prepare")
    parser.add_argument("--batches", type=int, default=4, help="micro batches per timed step")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    threads = use_all_cores()
    workdir = Path(args.workdir)
    print(f"machine load average {os.getloadavg()[0]:.1f}, {threads} threads; BERT-{args.size}, fp32, training step")
    for seq_length, (_, micro_batch_size) in PHASES.items():
        data, vocab = prepared(workdir, seq_length, args.documents)
        vocab_size = sum(1 for _ in open(vocab, encoding="utf-8"))
        cfg = ModelConfig.from_size(args.size, vocab_size=vocab_size)
        samples = first_samples(data, args.batches * micro_batch_size)
        results = measure(cfg, samples, seq_length, micro_batch_size, args.repeats)
        base = results["padded"][0]
        print(
            f"length {seq_length}, batches of {micro_batch_size} samples, "
            f"mean sample {samples.lengths.mean():.0f} tokens"
        )
        for name, (rate, padding) in results.items():
            print(f"  {name:<16} {rate:>9,.0f} useful tokens/s  padding {padding:5.1%}  {rate / base:5.2f}x padded")


if __name__ == "__main__":
    main()
