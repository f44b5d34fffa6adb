"""Time to quality: held-out MLM accuracy against wall-clock time, bertdist against transformers' Trainer.

One model shape (BERT-mini, L4/H256/A4), one corpus (Python's own documentation, every 20th document held
out), one machine, one wall-clock budget per run, three runs one after another:
  trainer  transformers' `Trainer` + `DataCollatorForLanguageModeling` (MLM only, masks drawn at load time, 15%)
           on the text grouped into full-length chunks, as `run_mlm.py` does; the paper recipe's batch, AdamW
           and schedule (lr 1e-4, 1% warmup, linear decay);
  paper    bertdist, the paper's recipe (static masks, NSP pairs, dupe factor 5), the same batch and schedule;
  fast     bertdist, configs/bert-mini-fast.yaml (MLM only, masks at load time, a 10x learning rate).
Each run's schedule is planned to end at ~90% of the budget from a short probe of its own step time (a user
with a time budget does the same), and a run still going at the budget is stopped there. Checkpoints are
saved every `--checkpoint-minutes`; after the runs every checkpoint is scored by the same code (transformers'
`BertForMaskedLM` on one fixed held-out set: 15% masked once, the same positions for everyone): MLM accuracy
and loss. Each final model is then fine-tuned with `bertdist finetune` on a task made from held-out text
(sentence adjacency, the same settings for all). Data preparation is timed separately.

Prints the curves, each run's time to the lowest final accuracy of the three, the ratios, the downstream
scores; writes RESULTS/curves.png and results.json; `--mlflow URI` also logs the curves there.

    python benchmarks/time_to_quality.py                       # 20 minutes per run (about 75 minutes in all)
    python benchmarks/time_to_quality.py --budget-minutes 2    # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
RUNS = ("trainer", "paper", "fast")
SEQ, BATCH, VOCAB = 128, 32, 8192
PAPER_LR, WARMUP_FRACTION = 1e-4, 0.01
HELD_OUT_SEQUENCES = 1000


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget-minutes", type=float, default=20.0)
    p.add_argument("--checkpoint-minutes", type=float, default=2.5)
    p.add_argument("--output", default="runs/time_to_quality")
    p.add_argument("--runs", default=",".join(RUNS), help="which runs, comma-separated")
    p.add_argument("--mlflow", default="", help="also log the curves to this MLflow tracking URI")
    args = p.parse_args(argv)
    out = Path(args.output).resolve()
    out.mkdir(parents=True, exist_ok=True)
    budget_s = args.budget_minutes * 60
    prep = prepare_data(out)
    held_out = held_out_set(out)
    results = {}
    for name in args.runs.split(","):
        run_dir = out / name
        for stale in ("probe", "run"):  # an earlier invocation's checkpoints must not be scored as this one's
            shutil.rmtree(run_dir / stale, ignore_errors=True)
        seconds_per_step = probe(name, run_dir / "probe", prep)
        steps = max(20, int(0.9 * budget_s / seconds_per_step))
        every = max(5, int(steps * args.checkpoint_minutes * 60 / budget_s))
        print(
            f"== {name}: {seconds_per_step:.3f} s/step in the probe -> {steps} steps, a checkpoint every {every}",
            flush=True,
        )
        checkpoints, wall_s = timed_run(name, run_dir / "run", prep, steps, every, budget_s)
        curve = [dict(time_s=t, step=s, **score(model_dir, held_out)) for t, s, model_dir in checkpoints]
        for point in curve:
            print(
                f"   {point['time_s']:7.0f} s  step {point['step']:6d}  "
                f"mlm acc {point['accuracy']:.4f}  loss {point['loss']:.3f}",
                flush=True,
            )
        results[name] = dict(
            curve=curve,
            wall_s=wall_s,
            planned_steps=steps,
            prepare_s=prep[name]["seconds"],
            seconds_per_step=seconds_per_step,
            downstream=downstream(out, checkpoints[-1][2]),
        )
    report(results, out, args.mlflow)
    return results


# ---------------------------------------------------------------------------------------------
# Data: one corpus and vocabulary; each run's own preparation, timed


def prepare_data(out: Path) -> dict:
    from bertdist.data.readers import expand_inputs, iter_texts
    from bertdist.data.vocab import train_vocab
    from bertdist.demo import write_corpus

    corpus = out / "corpus"
    if not (corpus / "eval.jsonl").exists():
        write_corpus(corpus)
    vocab = out / "vocab" / "vocab.txt"
    if not vocab.exists():
        train_vocab(iter_texts(expand_inputs([str(corpus / "train.jsonl")])), str(out / "vocab"), VOCAB)
    prep = {"corpus": corpus, "vocab": vocab}
    for name, flags in (("paper", []), ("fast", ["--objective", "mlm", "--masking", "dynamic"])):
        shards = out / name / "shards"
        start = time.perf_counter()
        if not (shards / "manifest.json").exists():
            _bertdist(
                "prepare",
                "--input",
                str(corpus / "train.jsonl"),
                "--output",
                str(shards),
                "--vocab",
                str(vocab),
                "--max-seq-length",
                str(SEQ),
                "--no-progress",
                *flags,
            )
        prep[name] = {"shards": shards, "seconds": time.perf_counter() - start}
    start = time.perf_counter()
    chunks = out / "trainer" / "chunks.npy"
    if not chunks.exists():
        chunks.parent.mkdir(parents=True, exist_ok=True)
        np.save(chunks, group_texts(corpus / "train.jsonl", vocab))
    prep["trainer"] = {"chunks": chunks, "seconds": time.perf_counter() - start}
    return prep


def group_texts(jsonl: Path, vocab: Path) -> np.ndarray:
    """run_mlm.py's preparation: every document tokenized with [CLS] ... [SEP], concatenated, cut into SEQ-token
    chunks (the remainder dropped)."""
    from transformers import BertTokenizerFast

    tokenizer = BertTokenizerFast(str(vocab), do_lower_case=True)
    texts = [json.loads(line)["text"] for line in jsonl.open(encoding="utf-8")]
    ids = np.concatenate([np.array(e, dtype=np.int32) for e in tokenizer(texts)["input_ids"]])
    return ids[: len(ids) // SEQ * SEQ].reshape(-1, SEQ)


def held_out_set(out: Path) -> dict:
    """The held-out documents as full-length [CLS] text [SEP] sequences, masked once (15%, 80/10/10)."""
    from transformers import BertTokenizerFast

    from bertdist.config import MaskingConfig
    from bertdist.data.instances import Documents, InstanceOptions, full_sentences
    from bertdist.data.masking import KeyedDraws, VocabInfo, apply_masks
    from bertdist.data.vocab import read_vocab

    vocab_file = out / "vocab" / "vocab.txt"
    tokenizer = BertTokenizerFast(str(vocab_file), do_lower_case=True)
    texts = [json.loads(line)["text"] for line in (out / "corpus" / "eval.jsonl").open(encoding="utf-8")]
    ids = [e for e in tokenizer(texts, add_special_tokens=False)["input_ids"] if e]
    lengths = np.array([len(e) for e in ids])
    docs = Documents(
        np.concatenate(ids).astype(np.uint16), np.concatenate([[0], np.cumsum(lengths)]), np.arange(len(ids) + 1)
    )
    vocab = VocabInfo.from_tokens(read_vocab(str(vocab_file)))
    samples = full_sentences(docs, InstanceOptions(max_seq_length=SEQ), vocab)
    samples = samples.slice(0, min(HELD_OUT_SEQUENCES, len(samples)))
    masked = apply_masks(samples, MaskingConfig(), vocab, KeyedDraws(2026, 0, np.arange(len(samples))))
    n = len(masked)
    input_ids, labels = np.zeros((n, SEQ), np.int64), np.full((n, SEQ), -100, np.int64)
    tok, msk = masked.token_offsets(), masked.mask_offsets()
    for i in range(n):
        input_ids[i, : masked.lengths[i]] = masked.input_ids[tok[i] : tok[i + 1]]
        labels[i, masked.masked_lm_positions[msk[i] : msk[i + 1]]] = masked.masked_lm_ids[msk[i] : msk[i + 1]]
    return {"input_ids": input_ids, "attention_mask": (input_ids != 0).astype(np.int64), "labels": labels}


def score(model_dir: Path, held_out: dict) -> dict:
    """MLM accuracy and loss of a Hugging Face directory on the held-out set (the same code for every run)."""
    import torch
    from transformers import BertForMaskedLM

    model = BertForMaskedLM.from_pretrained(model_dir).eval()
    right = total = 0
    loss_sum = 0.0
    with torch.no_grad():
        for lo in range(0, len(held_out["input_ids"]), 100):
            batch = {k: torch.from_numpy(v[lo : lo + 100]) for k, v in held_out.items()}
            hidden = model.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
            where = batch["labels"] != -100
            chosen, labels = model.cls(hidden[where]), batch["labels"][where]  # the MLM head where it is scored
            right += int((chosen.argmax(-1) == labels).sum())
            total += int(where.sum())
            loss_sum += float(torch.nn.functional.cross_entropy(chosen, labels, reduction="sum"))
    return {"accuracy": right / total, "loss": loss_sum / total}


# ---------------------------------------------------------------------------------------------
# Runs


def probe(name: str, directory: Path, prep: dict) -> float:
    """Seconds per optimizer step, from a short run of the same job after its first steps."""
    steps = 30
    if name == "trainer":
        _trainer_process(directory, prep, steps, every=steps * 10).wait()
        times = json.loads((directory / "step_times.json").read_text())
        return float(np.median(np.diff(times[10:])))
    _bertdist("train", "--config", str(_bertdist_config(name, directory, prep, steps, every=steps * 10)))
    records = [json.loads(line) for line in (directory / "out" / "metrics.jsonl").read_text().splitlines()]
    rates = [r["throughput/sequences_per_second"] for r in records if "throughput/sequences_per_second" in r]
    return BATCH / float(np.median(rates[1:]))


def timed_run(name: str, directory: Path, prep: dict, steps: int, every: int, budget_s: float) -> tuple[list, float]:
    """Start the run, stop it at the budget; (time since start, step, model directory) of each checkpoint."""
    start = time.time()
    if name == "trainer":
        process = _trainer_process(directory, prep, steps, every)
    else:
        config = _bertdist_config(name, directory, prep, steps, every)
        process = subprocess.Popen(
            [sys.executable, "-m", "bertdist", "train", "--config", str(config)],
            cwd=REPO,
            env=_env(),
            stdout=open(directory / "train.log", "w"),
            stderr=subprocess.STDOUT,
        )
    try:
        process.wait(timeout=budget_s)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)  # bertdist checkpoints the step it is in; the Trainer just stops
        process.wait(timeout=300)
    wall_s = time.time() - start
    if name == "trainer":
        saved = json.loads((directory / "save_times.json").read_text())
        return [(t, s, directory / f"checkpoint-{s}") for s, t in saved], wall_s
    checkpoints = []
    for step_dir in sorted((directory / "out" / "checkpoints").glob("step_*")):
        done = max(f.stat().st_mtime for f in step_dir.rglob("*") if f.is_file()) - start
        model_dir = directory / "export" / step_dir.name
        if not model_dir.exists():
            _bertdist("export", str(step_dir), "--output", str(model_dir))
        checkpoints.append((done, int(step_dir.name.split("_")[1]), model_dir))
    return checkpoints, wall_s


def _bertdist_config(name: str, directory: Path, prep: dict, steps: int, every: int) -> Path:
    import yaml

    directory.mkdir(parents=True, exist_ok=True)
    base = REPO / "configs" / ("bert-mini-fast.yaml" if name == "fast" else "bert-tiny.yaml")
    cfg = yaml.safe_load(base.read_text())
    optim = cfg.setdefault("optim", {})
    warmup_fraction = optim["warmup_steps"] / cfg["data"]["phases"][0]["steps"] if name == "fast" else WARMUP_FRACTION
    cfg.setdefault("model", {}).update(size="mini", vocab_size=VOCAB)
    cfg.setdefault("data", {}).update(
        vocab_file=str(prep["vocab"]),
        loader_workers=1,
        phases=[
            {"train_dir": str(prep[name]["shards"]), "max_seq_length": SEQ, "micro_batch_size": BATCH, "steps": steps}
        ],
    )
    if name == "paper":
        optim.update(lr=PAPER_LR, betas=[0.9, 0.999], eps=1e-6, weight_decay=0.01)
    optim["warmup_steps"] = max(1, round(steps * warmup_fraction))
    cfg.setdefault("train", {}).update(
        global_batch_size=BATCH,
        zero_stage=1,
        precision="fp32",
        output_dir=str(directory / "out"),
        log_every_steps=10,
        eval_every_steps=10**9,
    )
    cfg["checkpoint"] = {"every_steps": every, "keep_last": 10**6, "resume": "none"}
    cfg["tracking"] = {"enabled": False}
    cfg["launch"] = {"backend": "local", "nodes": 1, "gpus_per_node": 1}
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _trainer_process(directory: Path, prep: dict, steps: int, every: int) -> subprocess.Popen:
    directory.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        __file__,
        "--trainer-run",
        str(directory),
        str(prep["trainer"]["chunks"]),
        str(prep["vocab"]),
        str(steps),
        str(every),
    ]
    env = {**_env(), "TTQ_START": str(time.time())}
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=open(directory / "train.log", "w"), stderr=subprocess.STDOUT
    )


def trainer_run(directory: str, chunks_file: str, vocab: str, steps: int, every: int) -> None:
    """The reference run: transformers' Trainer as its MLM example runs it, with the paper recipe's settings."""
    import torch
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        BertTokenizerFast,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    start = float(os.environ["TTQ_START"])
    out = Path(directory)
    chunks = np.load(chunks_file)
    dataset = [{"input_ids": torch.from_numpy(row.astype(np.int64))} for row in chunks]
    tokenizer = BertTokenizerFast(vocab, do_lower_case=True)
    from bertdist.config import MODEL_SIZES

    mini = MODEL_SIZES["mini"]
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=mini["hidden_size"],
        num_hidden_layers=mini["num_layers"],
        num_attention_heads=mini["num_attention_heads"],
        intermediate_size=4 * mini["hidden_size"],
    )
    torch.manual_seed(0)
    model = BertForMaskedLM(config)
    step_times, save_times = [], []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            step_times.append(time.time() - start)

        def on_save(self, args, state, control, **kwargs):
            save_times.append((state.global_step, time.time() - start))
            (out / "save_times.json").write_text(json.dumps(save_times))
            (out / "step_times.json").write_text(json.dumps(step_times))

    arguments = TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        learning_rate=PAPER_LR,
        weight_decay=0.01,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-6,
        max_grad_norm=1.0,
        warmup_steps=max(1, round(steps * WARMUP_FRACTION)),
        lr_scheduler_type="linear",
        save_strategy="steps",
        save_steps=every,
        save_total_limit=None,
        logging_steps=50,
        report_to=[],
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
    )
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=0.15)
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=dataset,
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.train()
    trainer.save_model(str(out / f"checkpoint-{trainer.state.global_step}"))
    if not save_times or save_times[-1][0] != trainer.state.global_step:
        save_times.append((trainer.state.global_step, time.time() - start))
    (out / "save_times.json").write_text(json.dumps(save_times))
    (out / "step_times.json").write_text(json.dumps(step_times))


def downstream(out: Path, model_dir: Path) -> float:
    """Dev accuracy of the final model fine-tuned on sentence adjacency from held-out text (the demo's task)."""
    from bertdist.finetune.corpus_tasks import sentence_adjacency
    from bertdist.train.distributed import free_tcp_port

    task = out / "downstream"
    if not (task / "dev.tsv").exists():
        task.mkdir(parents=True, exist_ok=True)
        sentence_adjacency(out / "corpus" / "eval.jsonl", task / "train.tsv", 4000, seed=0)
        sentence_adjacency(out / "corpus" / "eval.jsonl", task / "dev.tsv", 1000, seed=1)
    run_dir = model_dir.parent / "finetuned"
    result = _bertdist(
        "finetune",
        f"finetune.init_from={model_dir}",
        f"finetune.vocab_file={out / 'vocab' / 'vocab.txt'}",
        f"finetune.train_file={task / 'train.tsv'}",
        f"finetune.dev_file={task / 'dev.tsv'}",
        "finetune.text_column=sentence1",
        "finetune.text_pair_column=sentence2",
        "finetune.epochs=2",
        "finetune.lr=5e-5",
        f"finetune.output_dir={run_dir}",
        "tracking.enabled=false",
        f"launch.master_port={free_tcp_port()}",
    )
    best = result.split("best dev epoch", 1)[1]
    return float(best.split("accuracy ", 1)[1].split(",")[0])


def _bertdist(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "bertdist", *args], cwd=REPO, env=_env(), capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"bertdist {' '.join(args[:2])} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout


def _env() -> dict:
    return {**os.environ, "DS_ACCELERATOR": "cpu"}


# ---------------------------------------------------------------------------------------------
# Report


def time_to(curve: list[dict], target: float) -> float | None:
    """Wall-clock seconds at which the curve first reaches `target` (linear between checkpoints)."""
    previous = {"time_s": 0.0, "accuracy": 0.0}
    for point in curve:
        if point["accuracy"] >= target:
            span = point["accuracy"] - previous["accuracy"]
            share = (target - previous["accuracy"]) / span if span > 0 else 1.0
            return previous["time_s"] + share * (point["time_s"] - previous["time_s"])
        previous = point
    return None


def report(results: dict, out: Path, mlflow_uri: str) -> None:
    target = min(r["curve"][-1]["accuracy"] for r in results.values())
    print(f"\ntarget: {target:.4f} held-out MLM accuracy (the lowest final accuracy of the runs)")
    print(
        f"{'run':8} {'prepare s':>9} {'s/step':>7} {'steps':>6} "
        f"{'final acc':>9} {'final loss':>10} {'to target s':>11} {'downstream':>10}"
    )
    for name, r in results.items():
        r["time_to_target_s"] = time_to(r["curve"], target)
        last = r["curve"][-1]
        print(
            f"{name:8} {r['prepare_s']:9.0f} {r['seconds_per_step']:7.3f} {last['step']:6d} {last['accuracy']:9.4f} "
            f"{last['loss']:10.3f} {r['time_to_target_s']:11.0f} {r['downstream']:10.4f}"
        )
    if "fast" in results:
        for other in ("trainer", "paper"):
            if other in results:
                ratio = results[other]["time_to_target_s"] / results["fast"]["time_to_target_s"]
                print(f"fast reaches the target {ratio:.2f}x sooner than {other}")
    (out / "results.json").write_text(json.dumps({"target": target, **results}, indent=2, default=str))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, r in results.items():
        ax.plot([p["time_s"] / 60 for p in r["curve"]], [p["accuracy"] for p in r["curve"]], marker="o", label=name)
    ax.axhline(target, color="grey", linestyle=":", label="target")
    ax.set_xlabel("wall-clock minutes (2-core CPU)")
    ax.set_ylabel("held-out MLM accuracy")
    ax.set_title("BERT-mini: time to quality")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=120)
    print(f"wrote {out / 'curves.png'} and {out / 'results.json'}")
    if mlflow_uri:
        import mlflow

        mlflow.set_tracking_uri(mlflow_uri)
        mlflow.set_experiment("time-to-quality")
        for name, r in results.items():
            with mlflow.start_run(run_name=name):
                for p in r["curve"]:
                    mlflow.log_metrics(
                        {
                            "heldout/mlm_accuracy": p["accuracy"],
                            "heldout/mlm_loss": p["loss"],
                            "wall_clock_s": p["time_s"],
                        },
                        step=p["step"],
                    )
                mlflow.log_metrics({"downstream/accuracy": r["downstream"], "prepare_s": r["prepare_s"]})


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--trainer-run":
        trainer_run(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
    else:
        main()
