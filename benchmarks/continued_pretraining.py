"""Continued pretraining: a ModernBERT-mini pretrained on one corpus, continued on another, bertdist against
transformers' Trainer from the same checkpoint with the same recipe; held-out MLM accuracy on the new corpus
against wall-clock time.

1. The base: bertdist trains `configs/modernbert-mini-fast.yaml` for `--base-minutes` on `--base-corpus` (default
   Python's own documentation) and exports it (config.json, model.safetensors, vocab.txt): the released model a
   user starts from. Made once, reused while its corpus and budget are the same.
2. The new corpus (`--corpus FILE ...`; default the descriptions of the Python packages installed here, the READMEs
   PyPI shows: other prose, written by others, about other things), every 20th document held out, tokenized with
   the base's own vocabulary.
3. Per seed, interleaved:
   modernbert-continued          `bertdist train` with `checkpoint.init_from_pretrained=BASE` (a fresh optimizer)
   modernbert-continued-trainer  the Trainer + `ModernBertForMaskedLM.from_pretrained(BASE)` (sdpa, sparse
                                 prediction) on the text grouped as run_mlm.py does
   both with the recipe docs/training.md gives for a fully decayed model (benchmarks/ttq_runs.py CONTINUED_RECIPE:
   modernbert-mini-fast's AdamW, betas, eps, decay, clipping, 30% masking, length and batch; the rate 3e-4, a 6%
   warmup, a plateau, the last 20% decaying; bertdist's schedule function handed to the Trainer as a LambdaLR).
Every checkpoint, and the base itself at time 0, is scored by transformers' ModernBertForMaskedLM on one held-out
set (15% masks, fixed). The target is the lowest final accuracy of the Trainer's runs; the figure is the Trainer's
time to it over bertdist's (median over seeds, the range of all seed pairs). Goal: >= 2x. Writes OUTPUT/results.json
and OUTPUT/curves.png.

    python benchmarks/continued_pretraining.py            # ~25 min on 2 idle cores (5 min base, 2 seeds x 2 x 3 min)
    python benchmarks/continued_pretraining.py --corpus my_texts/ --budget-minutes 5 --seeds 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

from time_to_quality import _minutes, _ratio_text, one_run, ratio, time_to
from ttq_data import held_out_set, hf_directory, plateau, prepare_data, score
from ttq_runs import CONTINUED_RUNS, base_config, check_trainer_recipe, probe, recipe_line, timed_run

BASE_RUN = "modernbert-fast"
OURS, PEER = "modernbert-continued", "modernbert-continued-trainer"
RATIO_GOAL = 2.0


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-corpus", nargs="+", default=[], metavar="FILE", help="default: Python's documentation")
    p.add_argument("--corpus", nargs="+", default=[], metavar="FILE", help="default: installed packages' READMEs")
    p.add_argument("--base-minutes", type=float, default=5.0, help="the base model's pretraining budget")
    p.add_argument("--budget-minutes", type=float, default=3.0, help="each continued run's budget")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--checkpoints", type=int, default=6, help="checkpoints per continued run (all scored)")
    p.add_argument("--output", default="runs/continued_pretraining")
    args = p.parse_args(argv)
    out = Path(args.output).resolve()
    out.mkdir(parents=True, exist_ok=True)
    seq, vocab_size = base_config(BASE_RUN).data.phases[0].max_seq_length, base_config(BASE_RUN).model.vocab_size
    check_trainer_recipe(PEER)
    for name in (OURS, PEER):
        print(recipe_line(name), flush=True)

    base = base_model(out / "base", args.base_corpus, args.base_minutes, seq, vocab_size)
    corpus = args.corpus or [str(package_descriptions(out / "packages.jsonl"))]
    prep = prepare_data(out / "data", corpus, {"mlm"}, seq, vocab_size, vocab_file=base / "vocab.txt")
    prep["init_from"] = base
    identity = prep["identity"]
    print(
        f"new corpus: {identity['name']}: {identity['train_documents']} documents to train on "
        f"({identity['train_mb']:.1f} MB, {identity['train_tokens']:,} tokens), {identity['held_out_documents']} "
        f"held out; tokenized with the base's vocabulary",
        flush=True,
    )
    held_out = held_out_set(prep, seq)
    floor = plateau(prep, held_out)
    start = {"time_s": 0.0, "step": 0, **score("modernbert", base, held_out)}
    print(
        f"held-out set: {held_out['sequences']} sequences; plateau {floor['accuracy']:.4f} (always "
        f"{floor['token']!r}); the base model scores {start['accuracy']:.4f} on it before any continued step",
        flush=True,
    )

    paces = {}
    for name in (OURS, PEER):
        directory = out / name / "probe"
        shutil.rmtree(directory, ignore_errors=True)
        paces[name] = probe(name, directory, prep)
        print(f"probe {name}: {paces[name].seconds_per_step:.3f} s/step, {paces[name].overhead_s:.0f} s start-up")
    records = []
    for seed in range(args.seeds):
        for name in (OURS, PEER):
            record = one_run(name, args.budget_minutes, seed, paces[name], prep, held_out, out, args.checkpoints)
            record["curve"].insert(0, start)  # both start from the base: the same point at time 0
            records.append(record)
    return report(records, paces, floor, start, identity, out)


def base_model(directory: Path, corpus: list[str], minutes: float, seq: int, vocab_size: int) -> Path:
    """The base model's Hugging Face directory: bertdist's modernbert-mini-fast after `minutes` on `corpus`."""
    prep = prepare_data(directory / "data", corpus, {"mlm"}, seq, vocab_size)
    marker, model = directory / "base.json", directory / "model"
    identity = {"corpus": prep["identity"], "minutes": minutes}
    if marker.exists() and json.loads(marker.read_text()) == identity and (model / "config.json").exists():
        print(f"base model: {model} (reused: the same corpus and budget)", flush=True)
        return model
    shutil.rmtree(directory / "probe", ignore_errors=True)
    pace = probe(BASE_RUN, directory / "probe", prep)
    steps = pace.steps_in(minutes * 60)
    print(f"base model: {BASE_RUN} on {prep['identity']['name']}, {minutes:g} min ({steps} steps)", flush=True)
    shutil.rmtree(directory / "run", ignore_errors=True)
    saved, _ = timed_run(BASE_RUN, directory / "run", prep, steps, steps, minutes * 60, seed=0)
    if not saved:
        raise SystemExit(f"the base run saved no checkpoint; see {directory / 'run' / 'train.log'}")
    shutil.rmtree(model, ignore_errors=True)
    shutil.copytree(hf_directory(saved[-1][2]), model)
    marker.write_text(json.dumps(identity, indent=2))
    return model


def package_descriptions(path: Path) -> Path:
    """One document per installed distribution: the long description of its metadata (its PyPI page's text)."""
    from importlib import metadata

    written, seen = 0, set()
    with open(path, "w", encoding="utf-8") as f:
        for dist in metadata.distributions():
            fields = dist.metadata
            name = (fields["Name"] or "").lower()
            body = fields.get_payload() or fields.get("Description") or ""  # Metadata 2.1+: the body; older: a field
            if name in seen or not body or len(body.split()) < 50:
                continue
            seen.add(name)
            f.write(json.dumps({"text": body}) + "\n")
            written += 1
    if written < 40:
        raise SystemExit(f"only {written} installed packages describe themselves; pass --corpus FILE ...")
    return path


def report(records: list[dict], paces: dict, floor: dict, start: dict, identity: dict, out: Path) -> dict:
    target = min(r["curve"][-1]["accuracy"] for r in records if r["run"] == PEER)
    times = {name: [time_to(r, target) for r in records if r["run"] == name] for name in (OURS, PEER)}
    print(f"\ntarget: {target:.4f}, the lowest final accuracy of the {PEER} runs (the base: {start['accuracy']:.4f})")
    print(f"{'run':30} {'s/step':>7} {'steps':>6} {'final acc (min-max)':>22} {'to target, min (min-max)':>25}")
    for name in (OURS, PEER):
        group = [r for r in records if r["run"] == name]
        finals = sorted(r["curve"][-1]["accuracy"] for r in group)
        steps = statistics.median(r["curve"][-1]["step"] for r in group)
        print(
            f"{name:30} {paces[name].seconds_per_step:7.3f} {steps:6.0f} "
            f"{statistics.median(finals):9.4f} ({finals[0]:.4f}-{finals[-1]:.4f}) {_minutes(times[name]):>25}"
        )
    result = ratio(times[PEER], times[OURS])
    met = result["value"] >= RATIO_GOAL and result["relation"] in ("=", ">=")
    summary = (
        f"continued pretraining, {identity['name']}: bertdist reaches the Trainer's final accuracy {target:.4f} "
        f"{_ratio_text(result)} sooner (goal >= {RATIO_GOAL:g}x: {'met' if met else 'not met'}); "
        f"step {paces[PEER].seconds_per_step / paces[OURS].seconds_per_step:.2f}x the Trainer's"
    )
    print(f"\nsummary: {summary}")
    results = dict(corpus=identity, plateau=floor, base=start, target=target, ratio=result, runs=records)
    results["summary"] = summary
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    plot(records, target, floor, start, out / "curves.png")
    print(f"wrote {out / 'curves.png'} and {out / 'results.json'}")
    return results


def plot(records: list[dict], target: float, floor: dict, start: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {OURS: "tab:blue", PEER: "tab:orange"}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labelled = set()
    for r in records:
        curve = r["curve"]
        ax.plot(
            [p["time_s"] / 60 for p in curve],
            [p["accuracy"] for p in curve],
            color=colours[r["run"]],
            linewidth=1.0,
            marker=".",
            label=None if r["run"] in labelled else f"{r['run']} ({CONTINUED_RUNS[r['run']].description})",
        )
        labelled.add(r["run"])
    ax.axhline(target, color="grey", linestyle=":", linewidth=1, label="target (the Trainer's lowest final)")
    ax.axhline(start["accuracy"], color="green", linestyle=":", linewidth=0.8, label="the base model")
    ax.axhline(floor["accuracy"], color="black", linestyle=":", linewidth=0.8, label="plateau (most frequent)")
    ax.set_title("ModernBERT-mini continued on a new corpus: held-out MLM accuracy (seeds as lines)")
    ax.set_xlabel("wall-clock minutes of the continued run")
    ax.set_ylabel("held-out MLM accuracy (15% masked)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
