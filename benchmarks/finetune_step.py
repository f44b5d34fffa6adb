"""Fine-tuning speed of `bertdist finetune` against `transformers.Trainer`: same model, batch and data, one run.

Sentence classification on full-length rows (every row exactly `--seq-length` tokens, so padding treats both alike),
or with `--varied-lengths` on rows of 1/8 to all of `--seq-length` tokens (mean ~56%; GLUE's sentences and pairs are
mostly shorter), where both pad each batch to its longest row (the Trainer through a padding collator, as
`DataCollatorWithPadding`) and bertdist's encoder also skips the padding (`model.unpad`). AdamW at the paper's
fine-tuning settings, dropout 0.1, fp32 on CPU (bf16/fp16 on GPU). bertdist is timed through its real step
(`Finetuning._step`: the DeepSpeed engine's forward, backward and update over the batch's micro batches); the
Trainer through `trainer.train()`, each step timed by a callback from `on_step_begin` to `on_step_end`. The two run
in alternating rounds and the median steps are compared.

It also prints bertdist's MFU and the ceiling of the ratio: the Trainer's step over the time bertdist's own matmul
FLOPs (`bertdist.model.flops`: a classifier's last layer runs at [CLS] only) take at the peak a large matmul reaches
in this process. No implementation of the same math beats that ratio; on full-length rows on this CPU it is
about 2 (docs/benchmarks.md).

    python benchmarks/finetune_step.py                      # CPU, BERT-mini, batch 32 x 128 (the acceptance run)
    python benchmarks/finetune_step.py --varied-lengths       # rows of mixed length, padded per batch
    python benchmarks/finetune_step.py --size base --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import device_name, use_all_cores  # benchmarks/ is on sys.path when this file runs as a script

from bertdist.config import load_config
from bertdist.config.validation import validate_finetune
from bertdist.finetune.runner import Finetuning
from bertdist.model.bert.hf import config_to_hf
from bertdist.model.flops import peak_flops_for, train_flops_per_sequence
from bertdist.train.distributed import destroy_process_group, read_env
from bertdist.train.ports import free_tcp_port

WORDS = 4000
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_task(directory: Path, rows: int, seq_length: int, seed: int, varied: bool) -> tuple[Path, Path]:
    """A vocabulary of whole words and a TSV of rows of `seq_length - 2` of them (every row full length), or of
    seq_length / 8 to seq_length - 2 of them."""
    vocab = directory / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL + [f"w{i}" for i in range(WORDS)]) + "\n")
    rng = np.random.default_rng(seed)
    words = rng.integers(seq_length // 8, seq_length - 1, rows) if varied else np.full(rows, seq_length - 2)
    lines = ["sentence\tlabel"] + [
        " ".join(f"w{i}" for i in rng.integers(0, WORDS, n)) + f"\t{rng.integers(0, 2)}" for n in words
    ]
    data = directory / "train.tsv"
    data.write_text("\n".join(lines) + "\n")
    return vocab, data


def bertdist_run(directory: Path, vocab: Path, data: Path, args: argparse.Namespace) -> Finetuning:
    cfg = load_config(
        None,
        [
            f"finetune.vocab_file={vocab}",
            f"finetune.train_file={data}",
            f"finetune.dev_file={data}",
            f"finetune.batch_size={args.batch_size}",
            f"finetune.micro_batch_size={args.batch_size}",
            f"finetune.max_seq_length={args.seq_length}",
            f"finetune.output_dir={directory / 'bertdist'}",
            f"model.size={args.size}",
            f"model.vocab_size={len(SPECIAL) + WORDS}",
            f"train.precision={args.precision}",
            "tracking.enabled=false",
            f"launch.master_port={free_tcp_port()}",
        ],
    )
    env = read_env(default_port=cfg.launch.master_port)
    validate_finetune(cfg, env.world_size)
    return Finetuning(cfg, env)


def trainer_rounds(run: Finetuning, args: argparse.Namespace, directory: Path, steps: int):
    """A Trainer on the same architecture and rows; returns a function running `steps` steps, giving their times."""
    import transformers

    hf_config = transformers.BertConfig(**config_to_hf(run.source.model_cfg), num_labels=2)
    model = transformers.BertForSequenceClassification(hf_config)
    rows = [
        {"input_ids": torch.from_numpy(run.train.ids[i]).long(), "labels": int(run.train.targets["labels"][i])}
        for i in range(len(run.train))
    ]

    def pad_batch(features: list[dict]) -> dict[str, torch.Tensor]:
        """Each batch padded to its longest row, as `DataCollatorWithPadding` does."""
        longest = max(len(f["input_ids"]) for f in features)
        input_ids = torch.zeros(len(features), longest, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for i, f in enumerate(features):
            input_ids[i, : len(f["input_ids"])] = f["input_ids"]
            attention_mask[i, : len(f["input_ids"])] = 1
        return {
            "input_ids": input_ids,
            "token_type_ids": torch.zeros_like(input_ids),
            "attention_mask": attention_mask,
            "labels": torch.tensor([f["labels"] for f in features]),
        }

    class Clock(transformers.TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_step_begin(self, *_, **__):
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            self.times.append(time.perf_counter() - self.start)

    def run_steps() -> list[float]:
        clock = Clock()
        training = transformers.TrainingArguments(
            output_dir=str(directory / "trainer"),
            per_device_train_batch_size=args.batch_size,
            max_steps=steps,
            learning_rate=2e-5,
            warmup_steps=1,
            weight_decay=0.01,
            max_grad_norm=1.0,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            use_cpu=args.device == "cpu",
            bf16=args.precision == "bf16",
            fp16=args.precision == "fp16",
            dataloader_num_workers=0,
            disable_tqdm=True,
            seed=0,
        )
        transformers.Trainer(
            model=model, args=training, train_dataset=rows, data_collator=pad_batch, callbacks=[clock]
        ).train()
        return clock.times

    return run_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="mini")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per round (after 2 warmup steps)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--varied-lengths", action="store_true", help="rows of 1/8 to all of --seq-length tokens")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    threads = use_all_cores()
    os.environ.setdefault("DS_ACCELERATOR", args.device)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        vocab, data = write_task(
            directory,
            rows=args.batch_size * (args.steps + 2) * args.rounds,
            seq_length=args.seq_length,
            seed=0,
            varied=args.varied_lengths,
        )
        run = bertdist_run(directory, vocab, data, args)
        trainer_steps = trainer_rounds(run, args, directory, args.steps + 2)
        times: dict[str, list[float]] = {"bertdist": [], "transformers Trainer": []}
        order = np.random.default_rng(0).permutation(len(run.train))
        for r in range(args.rounds):
            for s in range(args.steps + 2):
                first = (r * (args.steps + 2) + s) * args.batch_size
                start = time.perf_counter()
                run._step(order[first : first + args.batch_size])
                if s >= 2:
                    times["bertdist"].append(time.perf_counter() - start)
            times["transformers Trainer"] += trainer_steps()[2:]
        run.close()
    destroy_process_group()
    medians = {name: statistics.median(t) for name, t in times.items()}
    # The floor under any implementation of bertdist's math: its matmul FLOPs at what a large matmul reaches here.
    step_flops = statistics.mean(
        sum(
            train_flops_per_sequence(run.source.model_cfg, len(run.train.ids[i]), 0)
            for i in order[b : b + args.batch_size]
        )
        for b in range(0, len(order) - args.batch_size + 1, args.batch_size)
    )
    floor_s = step_flops / peak_flops_for(args.device, args.precision)
    result = {
        "device": device_name(torch.device(args.device), threads),
        "size": args.size,
        "batch": f"{args.batch_size}x{args.seq_length}",
        "lengths": "varied" if args.varied_lengths else "full",
        "precision": args.precision,
        **{f"{name} sequences/s": round(args.batch_size / m, 1) for name, m in medians.items()},
        "ratio": round(medians["transformers Trainer"] / medians["bertdist"], 2),
        "bertdist MFU": round(floor_s / medians["bertdist"], 3),
        "ceiling ratio (Trainer step / bertdist's FLOPs at peak)": round(medians["transformers Trainer"] / floor_s, 2),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
