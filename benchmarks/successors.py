"""BERT's successors on one corpus at mini size, one budget each, judged downstream (ELECTRA's discriminator has no
MLM accuracy to compare).

Runs, all bertdist on the same shards (`bertdist prepare --samples mlm --masking dynamic`), vocabulary and budget
(benchmarks/ttq_runs.py; the corpus and held-out set are benchmarks/time_to_quality.py's, `--corpus` or Python's
documentation):
  bert-fast        configs/bert-mini-fast.yaml: the fast MLM recipe, the baseline and the teacher
  electra-fast     configs/electra-mini.yaml: replaced-token detection with a quarter-width generator
  spanbert-fast    configs/spanbert-mini.yaml: span masking and the span-boundary objective
  distilbert-fast  configs/distilbert-mini.yaml: 2 layers distilled from bert-fast's final model (the same budget)
  albert-fast      configs/albert-mini.yaml with MLM only: its step time and parameters (a probe, not a run)
Reported:
- ELECTRA against the fast MLM recipe: every saved checkpoint of both fine-tuned on sentence adjacency from held-out
  text (fixed settings, benchmarks/ttq_data.py DOWNSTREAM_TASKS); downstream score against pretraining wall-clock
  time, and ELECTRA's time to the MLM run's final score over the MLM run's (the paper's claim: ELECTRA sooner);
- SpanBERT against token masking: both final models fine-tuned on span questions from held-out text, F1;
- DistilBERT: the student's share of its teacher's adjacency score (goal >= 95%) and of its sentences embedded per
  second by `bertdist embed` ([CLS] of the last layer) on `--sentences` held-out sentences, the two models in turns
  `--repeats` times, medians (goal: >= 1.8x), with the parameters of both;
- ALBERT with every layer shared against BERT of the same width: parameters and seconds per step.
Writes OUTPUT/results.json and OUTPUT/downstream_curves.png.

    python benchmarks/successors.py                                     # ~55 minutes on 2 idle cores
    python benchmarks/successors.py --budget-minutes 1 --checkpoints 2 --repeats 1          # a smoke test
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import statistics
import time
from pathlib import Path

from time_to_quality import _ratio_text, ratio, time_to
from ttq_data import downstream, held_out_set, hf_directory, prepare_data, score
from ttq_runs import base_config, kind_of, probe, timed_run

BASELINE, ELECTRA, SPANBERT, STUDENT, ALBERT = (
    "bert-fast",
    "electra-fast",
    "spanbert-fast",
    "distilbert-fast",
    "albert-fast",
)
KEEP_GOAL, SPEED_GOAL = 0.95, 1.8
RUN_NAMES = (BASELINE, ELECTRA, SPANBERT, STUDENT, ALBERT)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", nargs="+", default=[], metavar="FILE", help="text to train on (default: Python's docs)")
    p.add_argument("--budget-minutes", type=float, default=5.0, help="each run's pretraining budget")
    p.add_argument("--checkpoints", type=int, default=3, help="checkpoints of bert-fast and electra-fast fine-tuned")
    p.add_argument("--sentences", type=int, default=3000, help="held-out sentences each embedding pass reads")
    p.add_argument("--repeats", type=int, default=3, help="embedding passes per model, in turns")
    p.add_argument("--output", default="runs/successors")
    args = p.parse_args(argv)
    out = Path(args.output).resolve()
    out.mkdir(parents=True, exist_ok=True)
    shapes = {(base_config(n).data.phases[0].max_seq_length, base_config(n).model.vocab_size) for n in RUN_NAMES}
    if len(shapes) > 1:
        raise SystemExit(f"the runs' configs differ in sequence length or vocabulary size: {sorted(shapes)}")
    ((seq, vocab_size),) = shapes
    prep = prepare_data(out / "data", args.corpus, {"mlm"}, seq, vocab_size)
    held_out = held_out_set(prep, seq)
    print(f"corpus: {prep['identity']['name']}, {prep['identity']['train_documents']} documents", flush=True)

    paces, runs = {}, {}
    for name in RUN_NAMES:
        directory = out / name / "probe"
        shutil.rmtree(directory, ignore_errors=True)
        paces[name] = probe(name, directory, prep)
        print(f"probe {name}: {paces[name].seconds_per_step:.3f} s/step", flush=True)
        if name == ALBERT:
            continue
        checkpoints = args.checkpoints if name in (BASELINE, ELECTRA) else 1
        runs[name] = pretrain(name, args.budget_minutes, paces[name], prep, held_out, out, checkpoints)
        if name == BASELINE:
            prep["teacher"] = runs[name]["models"][-1]["model"]

    for name in (BASELINE, ELECTRA):  # downstream at every checkpoint: the curves
        for point in runs[name]["models"]:
            point["adjacency"] = _downstream(prep, point, "adjacency")
            print(f"{name} {point['time_s'] / 60:.2f} min: adjacency {point['adjacency']:.4f}", flush=True)
    student = runs[STUDENT]["models"][-1]
    student["adjacency"] = _downstream(prep, student, "adjacency")
    for name in (BASELINE, SPANBERT):
        final = runs[name]["models"][-1]
        final["span_questions"] = _downstream(prep, final, "span_questions")
        print(f"{name}: span questions F1 {final['span_questions']:.2f}", flush=True)
    speeds = embedding_speeds(
        [runs[BASELINE]["models"][-1]["model"], student["model"]], prep, args.sentences, args.repeats, out
    )
    return report(runs, paces, speeds, out)


def pretrain(name: str, budget: float, pace, prep: dict, held_out: dict, out: Path, checkpoints: int) -> dict:
    """One run within `budget` minutes: its checkpoints as Hugging Face directories, MLM accuracy of the final one
    (not ELECTRA's: its discriminator has no MLM head)."""
    run_dir = out / name / f"{budget:g}min"
    shutil.rmtree(run_dir, ignore_errors=True)
    steps = pace.steps_in(budget * 60)
    every = max(1, math.ceil(steps / checkpoints))
    print(f"== {name}, {budget:g} min: {steps} steps, a checkpoint every {every}", flush=True)
    saved, wall_s = timed_run(name, run_dir, prep, steps, every, budget * 60, seed=0)
    if not saved:
        raise SystemExit(f"{name}: no checkpoint within {budget:g} minutes; see {run_dir / 'train.log'}")
    models = [dict(time_s=t, step=step, model=hf_directory(c)) for t, step, c in saved]
    record = dict(run=name, run_dir=run_dir, wall_s=wall_s, models=models, parameters=parameters(models[-1]["model"]))
    if kind_of(name).arch != "electra":
        record["mlm_accuracy"] = score(kind_of(name).arch, models[-1]["model"], held_out)["accuracy"]
    return record


def _downstream(prep: dict, point: dict, task: str) -> float:
    return downstream(prep, point["model"], point["model"].parent / f"finetuned-{task}-{point['step']}", task)


def parameters(model_dir: Path) -> int:
    from bertdist.model.registry import load_pretrained

    return sum(p.numel() for p in load_pretrained(model_dir).parameters())


def embedding_speeds(models: list[Path], prep: dict, count: int, repeats: int, out: Path) -> list[float]:
    """Sentences per second of `bertdist embed` for each model (in this process: its loading counts, the
    interpreter's start-up does not), the models in turns, medians."""
    from bertdist.finetune.embed import EmbedOptions, embed

    found: list[str] = []
    for line in (prep["corpus"] / "eval.jsonl").read_text(encoding="utf-8").splitlines():
        text = json.loads(line)["text"]
        found += [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= 4]
    # a few held-out documents hold fewer sentences than a pass should read (its model's loading would weigh too
    # much): they are repeated, which costs what new sentences of those lengths would
    sentences = out / "sentences.txt"
    sentences.write_text("\n".join(found[i % len(found)] for i in range(count)) + "\n", encoding="utf-8")
    rows = count
    rates: list[list[float]] = [[] for _ in models]
    for _ in range(repeats):
        for i, model in enumerate(models):
            target = out / "embedded"
            shutil.rmtree(target, ignore_errors=True)
            start = time.perf_counter()
            embed(EmbedOptions(model=str(model), input=str(sentences), output_dir=str(target)))
            rates[i].append(rows / (time.perf_counter() - start))
    print(f"embedding: {rows} sentences per pass (of {len(found)} held out), {repeats} passes per model", flush=True)
    return [statistics.median(r) for r in rates]


def report(runs: dict, paces: dict, speeds: list[float], out: Path) -> dict:
    results: dict = {"runs": runs, "seconds_per_step": {n: p.seconds_per_step for n, p in paces.items()}}
    mlm = runs[BASELINE]
    target = mlm["models"][-1]["adjacency"]
    curves = {
        n: {"curve": [dict(time_s=m["time_s"], accuracy=m["adjacency"]) for m in runs[n]["models"]]}
        for n in (BASELINE, ELECTRA)
    }
    for n in curves:
        curves[n]["wall_s"] = runs[n]["wall_s"]
    times = {n: time_to(curves[n], target) for n in curves}
    sooner = ratio([times[BASELINE]], [times[ELECTRA]])
    print("\n== ELECTRA against the fast MLM recipe (sentence adjacency, dev accuracy, against pretraining time)")
    for n in curves:
        points = ", ".join(f"{p['time_s'] / 60:.1f} min {p['accuracy']:.4f}" for p in curves[n]["curve"])
        print(f"   {n:14} {points}")
    print(
        f"   to the MLM run's final {target:.4f}: MLM {times[BASELINE]['relation']} "
        f"{times[BASELINE]['seconds'] / 60:.2f} min, ELECTRA {times[ELECTRA]['relation']} "
        f"{times[ELECTRA]['seconds'] / 60:.2f} min: ELECTRA as soon as {_ratio_text(sooner)}"
    )
    results["electra"] = {"target": target, "times": times, "sooner": sooner, "curves": curves}
    plot(curves, target, out / "downstream_curves.png")

    span, token = runs[SPANBERT]["models"][-1]["span_questions"], mlm["models"][-1]["span_questions"]
    print(f"\n== SpanBERT against token masking: span questions F1 {span:.2f} vs {token:.2f} ({span - token:+.2f})")
    results["spanbert"] = {"span_f1": span, "token_f1": token}

    teacher, student = mlm["models"][-1], runs[STUDENT]["models"][-1]
    keep, speed = student["adjacency"] / teacher["adjacency"], speeds[1] / speeds[0]
    print(
        f"\n== DistilBERT: the 2-layer student keeps {keep:.1%} of its 4-layer teacher's adjacency score "
        f"({student['adjacency']:.4f} vs {teacher['adjacency']:.4f}; goal >= {KEEP_GOAL:.0%}: "
        f"{'met' if keep >= KEEP_GOAL else 'not met'}) and embeds {speed:.2f}x its sentences per second "
        f"({speeds[1]:.0f} vs {speeds[0]:.0f}; goal >= {SPEED_GOAL}x: {'met' if speed >= SPEED_GOAL else 'not met'}) "
        f"with {runs[STUDENT]['parameters'] / mlm['parameters']:.0%} of its parameters "
        f"({runs[STUDENT]['parameters'] / 1e6:.2f}M vs {mlm['parameters'] / 1e6:.2f}M); MLM accuracy "
        f"{runs[STUDENT]['mlm_accuracy']:.4f} vs {mlm['mlm_accuracy']:.4f}"
    )
    results["distilbert"] = {"keep": keep, "speedup": speed, "sentences_per_second": speeds}

    from bertdist.model.flops import total_parameters

    albert, bert = base_config(ALBERT).model, base_config(BASELINE).model
    step_ratio = paces[ALBERT].seconds_per_step / paces[BASELINE].seconds_per_step
    print(
        f"\n== ALBERT-mini (every layer shared, E 128) against BERT-mini (H 256): "
        f"{total_parameters(albert) / 1e6:.2f}M vs {total_parameters(bert) / 1e6:.2f}M parameters, "
        f"{paces[ALBERT].seconds_per_step:.3f} vs "
        f"{paces[BASELINE].seconds_per_step:.3f} s/step ({step_ratio:.2f}x)"
    )
    results["albert"] = {"parameters": total_parameters(albert), "bert_parameters": total_parameters(bert)}
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    return results


def plot(curves: dict, target: float, path: Path) -> None:
    """Downstream score against pretraining minutes, one line per run, the target dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, record in curves.items():
        points = record["curve"]
        ax.plot([p["time_s"] / 60 for p in points], [p["accuracy"] for p in points], marker="o", label=name)
    ax.axhline(target, linestyle="--", color="gray", label="the MLM run's final score")
    ax.set_xlabel("pretraining wall-clock minutes")
    ax.set_ylabel("sentence adjacency, dev accuracy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"curves: {path}", flush=True)


if __name__ == "__main__":
    main()
