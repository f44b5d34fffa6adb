"""The data and the scoring of benchmarks/time_to_quality.py: one corpus (a user's files or Python's documentation)
with every 20th document held out, one WordPiece vocabulary that both architectures use, each run's own data
preparation (timed), the one held-out set every checkpoint is scored on, the plateau a model reaches by predicting
the most frequent token, and the downstream task made from the held-out text.

Not a data pipeline: it calls bertdist's (`bertdist prepare`, `train_vocab`, the readers, the masking) and
transformers' (`BertTokenizerFast`, `BertForMaskedLM`, `ModernBertForMaskedLM`) own code, and adds no rule.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
HELD_OUT_EVERY_NTH_DOCUMENT = 20
HELD_OUT_SEQUENCES = 500
"""Rows scored per checkpoint: up to this many held-out sequences, repeated with other masks to this many where
the corpus holds out fewer (at most MAX_MASK_DRAWS draws). Scoring costs ~0.6 s per 100 rows of BERT-mini
here, ~1.5 s of ModernBERT-mini."""
MAX_MASK_DRAWS = 10
SCORE_MASKED_LM_PROB = 0.15
"""Every checkpoint is scored at BERT's rate, whatever its run trained with (ModernBERT's recipe masks 30%)."""
DOWNSTREAM_TRAIN_ROWS, DOWNSTREAM_DEV_ROWS = 4000, 1000
SHARD_FLAGS = {"mlm": ["--samples", "mlm", "--masking", "dynamic"], "paper": []}
"""`bertdist prepare`'s flags for each kind of shards a run trains on (`RunKind.data`; "chunks" are the Trainer's)."""


# ---------------------------------------------------------------------------------------------
# Corpus, vocabulary, preparation


def corpus_identity(corpus_files: list[str]) -> dict:
    """What the data directory was made from: the files with their sizes and times, or Python's documentation."""
    if not corpus_files:
        return {"name": f"Python {sys.version.split()[0]} documentation (bertdist.demo)"}
    from bertdist.data.readers import expand_inputs

    files = expand_inputs(corpus_files)
    return {
        "name": ", ".join(Path(f.path).name for f in files),
        "files": [[f.path, f.size_bytes, os.stat(f.path).st_mtime] for f in files],
    }


def write_corpus(corpus_files: list[str], directory: Path) -> None:
    """train.jsonl and eval.jsonl, every 20th document held out (as the demo's corpus is)."""
    if not corpus_files:
        from bertdist.demo import write_corpus as write_python_documentation

        write_python_documentation(directory)
        return
    from bertdist.data.readers import expand_inputs, plan_units, read_documents

    directory.mkdir(parents=True, exist_ok=True)
    index = 0
    with (
        open(directory / "train.jsonl", "w", encoding="utf-8") as train,
        open(directory / "eval.jsonl", "w", encoding="utf-8") as held_out,
    ):
        for unit in plan_units(expand_inputs(corpus_files), unit_bytes=1 << 62):
            for sentences in read_documents(unit):
                line = json.dumps({"text": " ".join(" ".join(sentences).split())}) + "\n"
                (held_out if index % HELD_OUT_EVERY_NTH_DOCUMENT == 0 else train).write(line)
                index += 1
    if index < 2 * HELD_OUT_EVERY_NTH_DOCUMENT:
        raise SystemExit(f"--corpus: {index} documents; at least {2 * HELD_OUT_EVERY_NTH_DOCUMENT} are needed")


def prepare_data(
    directory: Path,
    corpus_files: list[str],
    kinds: set[str],
    seq: int,
    vocab_size: int,
    vocab_file: Path | None = None,
    prepared: bool = False,
) -> dict:
    """The corpus, its vocabulary (trained on it, or `vocab_file`: a model's own, to continue pretraining it) and
    each kind of training data the runs need, made once (and again when the corpus changes); the seconds each
    preparation took. `prepared`: `directory` was made on another machine (one with Ray, for `bertdist prepare`) and
    carried here; it is read as it is, and anything missing from it stops the benchmark before a run starts."""
    from bertdist.data.readers import expand_inputs, iter_texts
    from bertdist.data.vocab import train_vocab

    if prepared:
        return _carried(directory, kinds, seq, vocab_size)
    marker = directory / "source.json"
    identity = {**corpus_identity(corpus_files), "max_seq_length": seq, "vocab_size": vocab_size}
    if vocab_file is not None:
        identity["vocab_file"] = [str(vocab_file), os.stat(vocab_file).st_mtime]
    if marker.exists() and json.loads(marker.read_text()) != identity:
        shutil.rmtree(directory)  # another corpus's data must not be reused
    directory.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(identity, indent=2))
    corpus = directory / "corpus"
    if not (corpus / "eval.jsonl").exists():
        write_corpus(corpus_files, corpus)
    vocab = vocab_file or directory / "vocab" / "vocab.txt"
    if not vocab.exists():
        train_vocab(iter_texts(expand_inputs([str(corpus / "train.jsonl")])), str(vocab.parent), vocab_size)
    prep: dict = {"corpus": corpus, "vocab": vocab, "identity": identity}
    for kind in sorted(kinds & set(SHARD_FLAGS)):
        shards = directory / f"shards-{kind}"
        start, made = time.perf_counter(), not (shards / "manifest.json").exists()
        if made:
            bertdist(
                "prepare",
                *("--input", str(corpus / "train.jsonl"), "--output", str(shards), "--vocab", str(vocab)),
                *("--max-seq-length", str(seq), "--no-progress", *SHARD_FLAGS[kind]),
            )
        prep[kind] = {"path": shards, "seconds": time.perf_counter() - start, "made": made}
    chunks = directory / "chunks.npy"
    start, made = time.perf_counter(), not chunks.exists()
    if made:
        np.save(chunks, group_texts(corpus / "train.jsonl", vocab, seq))
    prep["chunks"] = {"path": chunks, "seconds": time.perf_counter() - start, "made": made}
    _count(prep)
    return prep


def _carried(directory: Path, kinds: set[str], seq: int, vocab_size: int) -> dict:
    """`prepare_data(prepared=True)`: the data directory as another machine made it, checked, nothing made."""
    marker = directory / "source.json"
    if not marker.exists():
        raise SystemExit(
            f"--prepared {directory}: no source.json there; make the directory with --prepare-only on a machine "
            "with Ray and carry it"
        )
    identity = json.loads(marker.read_text())
    if (identity.get("max_seq_length"), identity.get("vocab_size")) != (seq, vocab_size):
        raise SystemExit(
            f"--prepared {directory}: made for length {identity.get('max_seq_length')} and vocabulary "
            f"{identity.get('vocab_size')}, the runs train at {seq} and {vocab_size}"
        )
    vocab = Path(identity["vocab_file"][0]) if "vocab_file" in identity else directory / "vocab" / "vocab.txt"
    prep: dict = {"corpus": directory / "corpus", "vocab": vocab, "identity": identity}
    needed = [prep["corpus"] / "train.jsonl", prep["corpus"] / "eval.jsonl", vocab, directory / "chunks.npy"]
    for kind in sorted(kinds & set(SHARD_FLAGS)):
        prep[kind] = {"path": directory / f"shards-{kind}", "seconds": 0.0, "made": False}
        needed.append(prep[kind]["path"] / "manifest.json")
    prep["chunks"] = {"path": directory / "chunks.npy", "seconds": 0.0, "made": False}
    missing = [str(path) for path in needed if not path.exists()]
    if missing:
        raise SystemExit(f"--prepared {directory}: missing {', '.join(missing)} (prepare every run's data kind)")
    _count(prep)
    return prep


def _count(prep: dict) -> None:
    """The corpus's sizes, into its identity (what the report prints)."""
    corpus = prep["corpus"]
    prep["identity"].update(
        train_documents=(corpus / "train.jsonl").read_text(encoding="utf-8").count("\n"),
        held_out_documents=(corpus / "eval.jsonl").read_text(encoding="utf-8").count("\n"),
        train_mb=(corpus / "train.jsonl").stat().st_size / 1e6,
        train_tokens=int(np.load(prep["chunks"]["path"]).size),
    )


def group_texts(jsonl: Path, vocab: Path, seq: int) -> np.ndarray:
    """run_mlm.py's preparation: every document tokenized with [CLS] ... [SEP], concatenated, cut into `seq`-token
    chunks (the remainder dropped); 16-bit ids where the vocabulary allows, half the bytes to carry to a GPU machine."""
    from transformers import BertTokenizerFast

    tokenizer = BertTokenizerFast(str(vocab), do_lower_case=True)
    texts = [json.loads(line)["text"] for line in jsonl.open(encoding="utf-8")]
    dtype = np.uint16 if len(tokenizer) <= 1 << 16 else np.int32
    ids = np.concatenate([np.array(e, dtype=dtype) for e in tokenizer(texts)["input_ids"]])
    return ids[: len(ids) // seq * seq].reshape(-1, seq)


# ---------------------------------------------------------------------------------------------
# The held-out set, its plateau, and scoring


def held_out_set(prep: dict, seq: int) -> dict:
    """The held-out documents as full-length [CLS] text [SEP] sequences, masked (15%, 80/10/10) with fixed draws: as
    many independent draws of the masks as bring the rows to HELD_OUT_SEQUENCES (at most 10), because a small
    corpus holds out few sequences and the masked positions of one draw would be a noisy sample of them."""
    from transformers import BertTokenizerFast

    from bertdist.config import MaskingConfig
    from bertdist.data.instances import Documents, InstanceOptions, full_sentences
    from bertdist.data.masking import KeyedDraws, VocabInfo, apply_masks
    from bertdist.data.vocab import read_vocab

    tokenizer = BertTokenizerFast(str(prep["vocab"]), do_lower_case=True)
    texts = [json.loads(line)["text"] for line in (prep["corpus"] / "eval.jsonl").open(encoding="utf-8")]
    ids = [e for e in tokenizer(texts, add_special_tokens=False)["input_ids"] if e]
    lengths = np.array([len(e) for e in ids])
    docs = Documents(
        np.concatenate(ids).astype(np.uint16), np.concatenate([[0], np.cumsum(lengths)]), np.arange(len(ids) + 1)
    )
    vocab = VocabInfo.from_tokens(read_vocab(str(prep["vocab"])))
    samples = full_sentences(docs, InstanceOptions(max_seq_length=seq), vocab)
    samples = samples.slice(0, min(HELD_OUT_SEQUENCES, len(samples)))
    masking = MaskingConfig(masked_lm_prob=SCORE_MASKED_LM_PROB)
    rows: dict[str, list[np.ndarray]] = {"input_ids": [], "labels": []}
    for draw in range(min(MAX_MASK_DRAWS, -(-HELD_OUT_SEQUENCES // len(samples)))):
        masked = apply_masks(samples, masking, vocab, KeyedDraws(2026, draw, np.arange(len(samples))))
        n = len(masked)
        input_ids, labels = np.zeros((n, seq), np.int64), np.full((n, seq), -100, np.int64)
        tok, msk = masked.token_offsets(), masked.mask_offsets()
        for i in range(n):
            input_ids[i, : masked.lengths[i]] = masked.input_ids[tok[i] : tok[i + 1]]
            labels[i, masked.masked_lm_positions[msk[i] : msk[i + 1]]] = masked.masked_lm_ids[msk[i] : msk[i + 1]]
        rows["input_ids"].append(input_ids)
        rows["labels"].append(labels)
    input_ids, labels = np.concatenate(rows["input_ids"]), np.concatenate(rows["labels"])
    return {
        "input_ids": input_ids,
        "attention_mask": (input_ids != 0).astype(np.int64),
        "labels": labels,
        "sequences": len(samples),
    }


def plateau(prep: dict, held_out: dict) -> dict:
    """The held-out accuracy of the best context-free guess (always the most frequent token among the positions
    scored): the level where an early model sits before it uses the context."""
    from bertdist.data.vocab import read_vocab

    tokens = read_vocab(str(prep["vocab"]))
    labels = held_out["labels"][held_out["labels"] != -100]
    counts = np.bincount(labels, minlength=len(tokens))
    return {"accuracy": float(counts.max() / len(labels)), "token": tokens[int(counts.argmax())]}


def _bert_logits(model, input_ids, attention_mask, where):
    hidden = model.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return model.cls(hidden[where])  # the MLM head where it is scored


def _distilbert_logits(model, input_ids, attention_mask, where):
    import torch.nn.functional as F

    hidden = model.distilbert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return model.vocab_projector(model.vocab_layer_norm(F.gelu(model.vocab_transform(hidden[where]))))


def _modernbert_logits(model, input_ids, attention_mask, where):
    hidden = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return model.decoder(model.head(hidden[where]))


def score(arch: str, model_dir: Path, held_out: dict) -> dict:
    """MLM accuracy and loss of a Hugging Face directory on the held-out set: transformers' class of the
    architecture, the same positions for every run."""
    import torch
    from transformers import BertForMaskedLM, DistilBertForMaskedLM, ModernBertForMaskedLM
    from transformers.utils import logging

    logging.set_verbosity_error()  # a paper-recipe export's NSP head and pooler are left out on purpose
    logging.disable_progress_bar()
    model_class, logits_of = {
        "bert": (BertForMaskedLM, _bert_logits),
        "modernbert": (ModernBertForMaskedLM, _modernbert_logits),
        "distilbert": (DistilBertForMaskedLM, _distilbert_logits),
    }[arch]
    model = model_class.from_pretrained(model_dir).eval()
    right = total = 0
    loss_sum = 0.0
    with torch.no_grad():
        for lo in range(0, len(held_out["input_ids"]), 100):
            batch = {k: torch.from_numpy(held_out[k][lo : lo + 100]) for k in ("input_ids", "attention_mask", "labels")}
            where = batch["labels"] != -100
            chosen = logits_of(model, batch["input_ids"], batch["attention_mask"], where)
            labels = batch["labels"][where]
            right += int((chosen.argmax(-1) == labels).sum())
            total += int(where.sum())
            loss_sum += float(torch.nn.functional.cross_entropy(chosen, labels, reduction="sum"))
    return {"accuracy": right / total, "loss": loss_sum / total}


def hf_directory(checkpoint: Path) -> Path:
    """A Hugging Face directory of the checkpoint: the Trainer's is one; bertdist's is exported beside it."""
    if (checkpoint / "config.json").exists():
        return checkpoint
    from bertdist.train.export import export_directory

    model_dir = checkpoint.parent.parent.parent / "export" / checkpoint.name
    if not (model_dir / "config.json").exists():
        export_directory(checkpoint, model_dir, overwrite=True)
    return model_dir


# ---------------------------------------------------------------------------------------------
# Downstream


DOWNSTREAM_TASKS = {
    # task: (maker in bertdist.finetune.corpus_tasks, file suffix, (train, dev) rows, settings, the score)
    "adjacency": (
        "sentence_adjacency",
        "tsv",
        (DOWNSTREAM_TRAIN_ROWS, DOWNSTREAM_DEV_ROWS),
        ("finetune.text_column=sentence1", "finetune.text_pair_column=sentence2"),
        "accuracy",
    ),
    "span_questions": (
        "span_questions",
        "json",
        (DOWNSTREAM_TRAIN_ROWS // 2, DOWNSTREAM_DEV_ROWS // 2),
        ("finetune.task=question_answering", "finetune.max_seq_length=128", "finetune.doc_stride=64"),
        "f1",
    ),
}
"""The downstream tasks made from held-out text: sentence adjacency (the demo's: is B the sentence after A?) and
span questions (SQuAD-style: which words follow a phrase of the passage?), scored by dev accuracy and F1."""


def downstream(prep: dict, model_dir: Path, run_dir: Path, task: str = "adjacency") -> float:
    """The dev score of a model fine-tuned on `task` (DOWNSTREAM_TASKS) from held-out text, fixed settings (2
    epochs at 5e-5), the best epoch's."""
    from bertdist.finetune import corpus_tasks
    from bertdist.train.ports import free_tcp_port

    maker, suffix, rows, settings, metric = DOWNSTREAM_TASKS[task]
    files = prep["corpus"].parent / ("downstream" if task == "adjacency" else f"downstream-{task}")
    if not (files / f"dev.{suffix}").exists():
        files.mkdir(parents=True, exist_ok=True)
        for seed, (name, count) in enumerate(zip(("train", "dev"), rows)):
            getattr(corpus_tasks, maker)(prep["corpus"] / "eval.jsonl", files / f"{name}.{suffix}", count, seed)
    shutil.rmtree(run_dir, ignore_errors=True)
    result = bertdist(
        "finetune",
        f"finetune.init_from={model_dir}",
        f"finetune.vocab_file={prep['vocab']}",
        f"finetune.train_file={files / f'train.{suffix}'}",
        f"finetune.dev_file={files / f'dev.{suffix}'}",
        *settings,
        "finetune.epochs=2",
        "finetune.lr=5e-5",
        f"finetune.output_dir={run_dir}",
        "tracking.enabled=false",
        f"launch.master_port={free_tcp_port()}",
    )
    best = result.split("best dev epoch", 1)[1]
    return float(best.split(f"{metric} ", 1)[1].split(",")[0].split(";")[0])


def bertdist(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "bertdist", *args],
        cwd=REPO,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"bertdist {' '.join(args[:2])} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout
