"""Does `bertdist finetune` reach what `transformers.Trainer` reaches? Same start, data, hyperparameters; seeds.

Both fine-tune the same initial BERT (one set of weights, written as a Hugging Face directory) on the same encoded
rows (bertdist's encoding, handed to the Trainer as tensors), with the same learning rate, batch, epochs, warmup,
weight decay, Adam betas/eps, gradient clipping and dropout, and are scored by the same metric code on the same dev
rows after every epoch, each side reporting its best epoch (the rule of `bertdist finetune`). What differs is the
training loop: data order, dropout streams, the optimizer's implementation. So the dev metrics are compared against
their spread over seeds: per task, the mean and standard deviation of each side over `--seeds` runs, the difference
of the means, and Welch's t-test of that difference (scipy): a p-value above 0.05 means that the noise the seeds
themselves show does not tell the two loops apart.

Tasks come from Python's own documentation (real text every machine has; bertdist.finetune.corpus_tasks):
sentence adjacency (classification) and "What follows <phrase>?" span questions (extractive QA).

    python benchmarks/finetune_parity.py                          # BERT-Tiny from random init, 3 seeds
    python benchmarks/finetune_parity.py --model runs/demo/model --lr 2e-4 --seeds 5  # the demo's model
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
from common import use_all_cores  # benchmarks/ is on sys.path when this file runs as a script

from bertdist.config import load_config
from bertdist.finetune import corpus_tasks
from bertdist.finetune.runner import finetune
from bertdist.finetune.source import cased_vocabulary, resolve
from bertdist.finetune.task import build
from bertdist.train.ports import free_tcp_port

TASKS = {  # name: (maker, rows train/dev, finetune settings)
    "adjacency": (
        "sentence_adjacency",
        (2000, 400),
        ["finetune.text_column=sentence1", "finetune.text_pair_column=sentence2"],
        "tsv",
    ),
    "span_qa": (
        "span_questions",
        (1500, 300),
        ["finetune.task=question_answering", "finetune.max_seq_length=128", "finetune.doc_stride=64"],
        "json",
    ),
}


def corpus(directory: Path) -> tuple[Path, Path, str]:
    from bertdist.data.vocab import train_vocab
    from bertdist.demo import python_documentation

    documents = python_documentation()
    files = []
    for name, part in (("train", documents[1::2]), ("dev", documents[::2])):
        path = directory / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"text": " ".join(d.split())}) + "\n" for d in part))
        files.append(path)
    return files[0], files[1], train_vocab(documents, str(directory / "vocab"), vocab_size=8192)


def trainer_scores(cfg, seed: int, directory: Path) -> dict[str, float]:
    """transformers.Trainer on the rows bertdist encoded, scored by bertdist's metric code after every epoch; the
    best epoch's scores by the headline metric, the rule `bertdist finetune` reports by."""
    import transformers

    ft = cfg.finetune
    source = resolve(cfg)
    task = build(
        ft,
        ft.sequence_length(source.model_cfg.max_position_embeddings),
        source.vocab_file,
        cased_vocabulary(source.vocab_file),
    )
    auto = getattr(transformers, f"AutoModelFor{task.head}")  # the Auto class of the task's head, for any family
    model = auto.from_pretrained(ft.init_from, **({"num_labels": len(task.labels)} if task.labels else {}))

    def rows(sequences):
        return [{k: v[0] for k, v in sequences.batch(np.array([i]), 0).items()} for i in range(len(sequences))]

    def score() -> dict[str, float]:
        model.eval()
        outputs = []
        with torch.no_grad():
            for start in range(0, len(task.dev), 64):
                index = np.arange(start, min(start + 64, len(task.dev)))
                batch = {
                    k: v
                    for k, v in task.dev.batch(index, 0).items()
                    if k in ("input_ids", "token_type_ids", "attention_mask")
                }
                out = model(**batch)
                logits = torch.stack([out.start_logits, out.end_logits], -1) if task.per_token else out.logits
                outputs += task.dev.trim(logits.numpy(), index, task.per_token)
        model.train()
        return task.score(outputs)

    epochs: list[dict[str, float]] = []

    class EveryEpoch(transformers.TrainerCallback):
        def on_epoch_end(self, *_, **__):
            epochs.append(score())

    steps = int(ft.epochs * (len(task.train) // ft.batch_size))
    args = transformers.TrainingArguments(
        output_dir=str(directory / f"trainer-{seed}"),
        per_device_train_batch_size=ft.batch_size,
        num_train_epochs=ft.epochs,
        learning_rate=ft.lr,
        warmup_steps=int(ft.warmup_proportion * steps),
        weight_decay=cfg.optim.weight_decay,
        adam_beta1=cfg.optim.betas[0],
        adam_beta2=cfg.optim.betas[1],
        adam_epsilon=cfg.optim.eps,
        max_grad_norm=cfg.optim.grad_clip_norm,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=seed,
        dataloader_drop_last=True,
    )
    transformers.Trainer(
        model=model, args=args, train_dataset=rows(task.train), data_collator=_pad_collator, callbacks=[EveryEpoch()]
    ).train()
    return max(epochs, key=lambda scores: next(iter(scores.values())))


def _pad_collator(features: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    longest = max(f["input_ids"].shape[-1] for f in features)
    out = {}
    for key in features[0]:
        if features[0][key].dim() == 0:
            out[key] = torch.stack([f[key] for f in features])
        else:
            out[key] = torch.stack([torch.nn.functional.pad(f[key], (0, longest - f[key].shape[-1])) for f in features])
    return out


def compare(scores: dict[str, list[float]]) -> dict[str, object]:
    """Each side's runs, mean and standard deviation over seeds; the difference of the means; Welch's t-test."""
    from scipy.stats import ttest_ind

    ours, theirs = scores["bertdist"], scores["transformers Trainer"]
    test = ttest_ind(ours, theirs, equal_var=False)
    return {
        **{f"{k} runs": [round(x, 4) for x in v] for k, v in scores.items()},
        **{f"{k} mean": round(statistics.mean(v), 4) for k, v in scores.items()},
        **{f"{k} std": round(statistics.stdev(v), 4) for k, v in scores.items()},
        "difference": round(statistics.mean(ours) - statistics.mean(theirs), 4),
        "welch t": round(float(test.statistic), 2),
        "p": round(float(test.pvalue), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        help="a pretrained BERT directory to start from (e.g. runs/demo/model); default: --size from random init",
    )
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--tasks", default=",".join(TASKS))
    args = parser.parse_args()
    use_all_cores()
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        train_docs, dev_docs, vocab = corpus(directory)
        from bertdist.config import ModelConfig
        from bertdist.model.bert.hf import save_pretrained
        from bertdist.model.bert.model import BertForPreTraining

        start = Path(args.model) if args.model else directory / "start"
        if not args.model:
            torch.manual_seed(0)
            save_pretrained(BertForPreTraining(ModelConfig.from_size(args.size, vocab_size=8192)), start, vocab)
        for name in args.tasks.split(","):
            maker, (n_train, n_dev), settings, suffix = TASKS[name]
            files = [directory / f"{name}-{part}.{suffix}" for part in ("train", "dev")]
            getattr(corpus_tasks, maker)(train_docs, files[0], n_train, 0)
            getattr(corpus_tasks, maker)(dev_docs, files[1], n_dev, 1)
            scores: dict[str, list[float]] = {"bertdist": [], "transformers Trainer": []}
            for seed in range(args.seeds):
                overrides = [
                    f"finetune.init_from={start}",
                    f"finetune.train_file={files[0]}",
                    f"finetune.dev_file={files[1]}",
                    f"finetune.lr={args.lr}",
                    f"finetune.epochs={args.epochs}",
                    f"train.seed={seed}",
                    "tracking.enabled=false",
                    f"finetune.output_dir={directory / name / str(seed)}",
                    f"launch.master_port={free_tcp_port()}",
                    *settings,
                ]
                cfg = load_config(None, overrides)
                results: dict[str, float] = {}
                assert finetune(cfg, results) == 0
                scores["bertdist"].append(next(iter(results.values())))  # the headline: accuracy, or SQuAD F1
                scores["transformers Trainer"].append(next(iter(trainer_scores(cfg, seed, directory).values())))
            report[name] = compare(scores)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
