"""Time to quality: held-out MLM accuracy against wall-clock time, bertdist against transformers' Trainer given
the same recipe, for BERT-mini and ModernBERT-mini.

Runs (`--runs`, benchmarks/ttq_runs.py):
  bert-fast           bertdist, configs/bert-mini-fast.yaml (MLM only on full-length text, masks at load time)
  bert-trainer        transformers' Trainer + BertForMaskedLM + DataCollatorForLanguageModeling on the text grouped
                      as run_mlm.py does, with bert-mini-fast's recipe, read from the same YAML: AdamW's lr, betas,
                      eps, weight decay, clipping, warmup share, schedule (bertdist's own function, as a LambdaLR),
                      masking rate and 80/10/10, sequence length, batch, and the model's shapes
  modernbert-fast     bertdist, configs/modernbert-mini-fast.yaml (ModernBERT-mini, 30% masking)
  modernbert-trainer  the Trainer + ModernBertForMaskedLM (sdpa, its sparse prediction on) with that YAML's recipe
  bert-paper          (optional) bertdist with the paper's recipe (NSP pairs, static masks, lr 1e-4)
All runs share one corpus (`--corpus FILE ...`: .txt/.jsonl/.xml as `bertdist prepare --input` reads them; default
Python's own documentation), every 20th document held out, one WordPiece vocabulary, one held-out set: up to 500
full-length sequences masked at 15% (80/10/10), in several draws of the masks where fewer are held out, at the
same positions for everyone, scored with transformers' class of each architecture. Data preparation is timed apart
from the budgets.

Each run's schedule is planned to end at ~90% of its budget from a short probe of its own step time and start-up
(a user with a time budget does the same); a run still going at the budget is stopped there. Each run saves
`--checkpoints` checkpoints; all are scored afterwards. The runs are interleaved (for each seed, for each budget,
every run) so that the machine's noise falls on all of them.

The target of an architecture is the lowest final accuracy of its `--target-from` runs at the longest budget
(default: its Trainer runs, every seed: a level the longer reference runs of the Trainer all reached, where a short
budget's would sit on the early plateau), or `--target`. The plateau (always predicting the most
frequent token) is printed beside it, with a warning when the target is within 0.02 of it. A time to the target is
interpolated between measured checkpoints only: "<=" where the first checkpoint is already above it, ">" where a
run never reaches it. Prints, per architecture and budget, the Trainer's time to the target over bertdist's (median
over seeds, with the range of all seed pairs), how that ratio moves with the budget, ModernBERT-mini against
BERT-mini, and the downstream scores (sentence adjacency from held-out text, the final models of the first
`--downstream-seeds` seeds at the longest budget). Writes OUTPUT/results.json and OUTPUT/curves.png (one panel per
architecture, seeds as thin lines); `--mlflow URI` also logs the curves there. `--keep-earlier` reports, beside
this invocation's runs, the other runs an earlier invocation left in OUTPUT/runs.json (same corpus), so that the
measurement can be split over sessions (each architecture's pair is still interleaved within its own session).

On 2 idle cores (estimates from the step times measured before; the probes print this machine's), the four runs at
2.5 and 5 minutes with 2 seeds take ~100 minutes: 60 in the budgets, ~3 of probes, ~7 of exports and scoring (3-6 s
a checkpoint), ~26 of downstream fine-tuning (~3 min a BERT-mini, ~10 a ModernBERT-mini: 4x BERT's in the smoke
tests). Split by architecture, each half fits in ~40 minutes:
    python benchmarks/time_to_quality.py                                                # all four, ~100 min
    python benchmarks/time_to_quality.py --runs bert-fast,bert-trainer                  # BERT's pair, ~41 min
    python benchmarks/time_to_quality.py --runs modernbert-fast,modernbert-trainer --keep-earlier --downstream-seeds 0
                                                   # then ModernBERT's pair, reporting all four, ~37 min
    python benchmarks/time_to_quality.py --budget-minutes 0.5 --seeds 1 --downstream-seeds 0      # a smoke test
    python benchmarks/time_to_quality.py --corpus my_texts/ --runs bert-fast,bert-trainer --budget-minutes 4 8

On a GPU (`--device cuda`) both engines train in bf16 with a fused AdamW, and `--set` sizes the model and batch for
it, for both (the Trainer reads the same config). A GPU machine without Ray takes data prepared elsewhere:
`--prepare-only` makes OUTPUT/data here and stops; there, `--prepared DIR` reads it as it is (`make gpu-check`'s
`--ttq DIR` runs this):
    python benchmarks/time_to_quality.py --prepare-only --runs bert-fast,bert-trainer --corpus BIG.jsonl \
        --output runs/ttq-gpu
    python benchmarks/time_to_quality.py --device cuda --prepared runs/ttq-gpu/data --runs bert-fast,bert-trainer \
        --set model.size=medium train.global_batch_size=256 data.phases.0.micro_batch_size=256 --budget-minutes 3
A GPU step is a thousand times a CPU one: Python's documentation (280k tokens at length 128) is one epoch every
9 steps of batch 256, and held-out accuracy then measures memorising. Give it a corpus of tens of millions of tokens
(English manual pages: `python -m bertdist.data.manpages --languages en --max-docs-per-language 0`).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import time
from pathlib import Path

from ttq_data import downstream, held_out_set, hf_directory, plateau, prepare_data, score
from ttq_runs import (
    DEFAULT_RUNS,
    RUNS,
    base_config,
    check_trainer_recipe,
    configure,
    kind_of,
    probe,
    recipe_line,
    timed_run,
)

RATIO_GOALS = {"cpu": 2.5, "cuda": 2.0}
"""bertdist's fast recipe against the same-recipe Trainer, time to the Trainer's accuracy: the CPU goal and the
GPU's (issue 43: 2x, where the encoder's GEMMs leave the model less to win)."""
PLATEAU_MARGIN = 0.02


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", nargs="+", default=[], metavar="FILE", help="text to train on (default: Python's docs)")
    p.add_argument("--budget-minutes", nargs="+", type=float, default=[2.5, 5.0], help="one run per budget")
    p.add_argument("--seeds", type=int, default=2, help="seeds 0..N-1 of every run")
    p.add_argument("--runs", default=",".join(DEFAULT_RUNS), help=f"comma-separated, of: {', '.join(RUNS)}")
    p.add_argument(
        "--target",
        nargs="+",
        default=[],
        metavar="ACC",
        help="a fixed target accuracy for every architecture, or ARCH=ACC each (bert=0.15 modernbert=0.14)",
    )
    p.add_argument(
        "--target-from",
        default="trainer",
        choices=("trainer", "fast", "paper"),
        help="without --target: the lowest final accuracy of the ARCH-<this> runs at the longest budget is ARCH's",
    )
    p.add_argument("--checkpoints", type=int, default=6, help="checkpoints per run (all scored)")
    p.add_argument(
        "--quick-probe",
        action="store_true",
        help="probe each run's step time in one short run without a warm-up first (a smoke run: the plan is rough)",
    )
    p.add_argument("--downstream-seeds", type=int, default=1, help="fine-tune the final models of this many seeds")
    p.add_argument(
        "--keep-earlier",
        action="store_true",
        help="report also the runs of OUTPUT/runs.json (same corpus) that this invocation does not run",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: both engines in bf16, fused AdamW")
    p.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides every run takes, the Trainer's too (a GPU's model and batch: model.size=medium ...)",
    )
    p.add_argument("--prepare-only", action="store_true", help="prepare OUTPUT/data and stop (to carry elsewhere)")
    p.add_argument(
        "--prepared", default="", metavar="DIR", help="the data directory --prepare-only made, read as it is (no Ray)"
    )
    p.add_argument("--output", default="runs/time_to_quality")
    p.add_argument("--mlflow", default="", help="also log the curves to this MLflow tracking URI")
    args = p.parse_args(argv)
    names = args.runs.split(",")
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        p.error(f"--runs: unknown {', '.join(unknown)}; choose from {', '.join(RUNS)}")
    if args.device == "cuda" and not _cuda_available():
        p.error("--device cuda: no CUDA device visible")
    configure(args.device, args.set)
    fixed_targets = _fixed_targets(args.target, p)
    budgets = sorted(set(args.budget_minutes))
    out = Path(args.output).resolve()
    out.mkdir(parents=True, exist_ok=True)

    # --- what each run trains
    shapes = {(base_config(n).data.phases[0].max_seq_length, base_config(n).model.vocab_size) for n in names}
    if len(shapes) > 1:
        raise SystemExit(f"the runs' configs differ in sequence length or vocabulary size: {sorted(shapes)}")
    ((seq, vocab_size),) = shapes
    for name in names:
        if RUNS[name].engine == "trainer":
            check_trainer_recipe(name)
        print(recipe_line(name), flush=True)
    print(
        "the Trainer runs use bertdist's schedule function itself (bertdist.train.optim.learning_rate: warmup "
        "(step + 1) / warmup_steps, then its decay), handed to the Trainer as a LambdaLR (create_scheduler), so "
        "the schedules are the same, not the nearest lr_scheduler_type",
        flush=True,
    )

    # --- data: prepared once, timed apart from the budgets
    data_dir = Path(args.prepared).resolve() if args.prepared else out / "data"
    prep = prepare_data(
        data_dir, args.corpus, {RUNS[n].data for n in names}, seq, vocab_size, prepared=bool(args.prepared)
    )
    corpus = prep["identity"]
    print(
        f"corpus: {corpus['name']}: {corpus['train_documents']} documents to train on ({corpus['train_mb']:.1f} MB, "
        f"{corpus['train_tokens']:,} tokens in {seq}-token chunks), {corpus['held_out_documents']} held out",
        flush=True,
    )
    for kind in ("mlm", "paper", "chunks"):
        if kind in prep:
            users = ", ".join(n for n in names if RUNS[n].data == kind)
            made = f"{prep[kind]['seconds']:.0f} s" if prep[kind]["made"] else "reused from an earlier invocation"
            print(f"data preparation, {kind} ({users}): {made}", flush=True)
    if args.prepare_only:
        print(f"prepared {data_dir}: carry it and pass --prepared", flush=True)
        return {"prepared": str(data_dir)}
    earlier = earlier_records(out / "runs.json", names, corpus) if args.keep_earlier else []
    held_out = held_out_set(prep, seq)
    floor = plateau(prep, held_out)
    positions = int((held_out["labels"] != -100).sum())
    print(
        f"held-out set: {held_out['sequences']} sequences of {seq} tokens, "
        f"{len(held_out['labels']) // held_out['sequences']} draws of 15% masks ({positions:,} scored positions); "
        f"plateau: {floor['accuracy']:.4f} by always predicting {floor['token']!r}, the best context-free guess",
        flush=True,
    )

    # --- a probe of each run's step time, then the runs, interleaved
    paces = {}
    for name in names:
        directory = out / name / "probe"
        shutil.rmtree(directory, ignore_errors=True)
        paces[name] = probe(name, directory, prep, args.quick_probe)
        print(
            f"probe {name}: {paces[name].seconds_per_step:.3f} s/step, {paces[name].overhead_s:.0f} s start-up and "
            f"shutdown",
            flush=True,
        )
    records: list[dict] = []
    for seed in range(args.seeds):
        for budget in budgets:
            for name in names:
                records.append(one_run(name, budget, seed, paces[name], prep, held_out, out, args.checkpoints))
                runs_file = {"corpus": prep["identity"], "runs": earlier + records}
                (out / "runs.json").write_text(json.dumps(runs_file, indent=2, default=str))
    for record in records:
        if record["budget_minutes"] == budgets[-1] and record["seed"] < args.downstream_seeds and record["curve"]:
            run_dir = Path(record["run_dir"]) / "finetuned"
            start = time.perf_counter()
            record["downstream"] = downstream(prep, Path(record["final_model"]), run_dir)
            print(
                f"downstream {record['run']} seed {record['seed']}: dev accuracy {record['downstream']:.4f} "
                f"(fine-tuned in {time.perf_counter() - start:.0f} s)",
                flush=True,
            )
    (out / "runs.json").write_text(json.dumps({"corpus": prep["identity"], "runs": earlier + records}, indent=2))
    context = dict(paces=paces, prep=prep, floor=floor, args=args, out=out)
    return report(earlier + records, context, fixed_targets)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def earlier_records(path: Path, names: list[str], corpus: dict) -> list[dict]:
    """--keep-earlier: the runs an earlier invocation measured on the same corpus that this one does not run."""
    if not path.exists():
        return []
    saved = json.loads(path.read_text())
    if saved.get("corpus") != corpus:
        raise SystemExit(f"--keep-earlier: {path} was measured on another corpus ({saved.get('corpus')})")
    kept = [r for r in saved["runs"] if r["run"] not in names]
    print(f"kept from an earlier invocation: {', '.join(sorted({r['run'] for r in kept})) or 'nothing'}")
    return kept


def _fixed_targets(values: list[str], p: argparse.ArgumentParser) -> dict[str, float]:
    targets: dict[str, float] = {}
    for value in values:
        arch, _, number = value.rpartition("=")
        try:
            accuracy = float(number)
        except ValueError:
            p.error(f"--target {value}: expected ACC or ARCH=ACC")
        for a in [arch] if arch else sorted({k.arch for k in RUNS.values()}):
            targets[a] = accuracy
    return targets


def one_run(name: str, budget: float, seed: int, pace, prep: dict, held_out: dict, out: Path, checkpoints: int) -> dict:
    run_dir = out / name / f"{budget:g}min-seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier invocation's checkpoints must not be scored as this one's
    budget_s = budget * 60
    steps = pace.steps_in(budget_s)
    every = max(1, math.ceil(steps / checkpoints))
    print(f"== {name}, {budget:g} min, seed {seed}: {steps} steps, a checkpoint every {every}", flush=True)
    saved, wall_s = timed_run(name, run_dir, prep, steps, every, budget_s, seed)
    # Only checkpoints completed within the budget, on both sides alike: bertdist checkpoints the step it is in at
    # the budget's SIGTERM and the Trainer saves nothing then, so counted, that one gave bertdist's curve a point
    # the Trainer's could not have.
    saved = [c for c in saved if c[0] <= budget_s]
    if not saved:  # reported as never reaching anything, rather than ending the whole measurement
        print(f"   no checkpoint within {budget:g} minutes; see {run_dir / 'train.log'}", flush=True)
    curve, model_dir, scoring_start = [], None, time.perf_counter()
    for time_s, step, checkpoint in saved:
        model_dir = hf_directory(checkpoint)
        curve.append(dict(time_s=time_s, step=step, **score(kind_of(name).arch, model_dir, held_out)))
        print(
            f"   {time_s / 60:6.2f} min  step {step:6d}  mlm acc {curve[-1]['accuracy']:.4f}  "
            f"loss {curve[-1]['loss']:.3f}",
            flush=True,
        )
    scoring_s = time.perf_counter() - scoring_start
    print(f"   (exported and scored {len(curve)} checkpoints in {scoring_s:.0f} s, outside the budget)", flush=True)
    return dict(
        run=name,
        arch=kind_of(name).arch,
        budget_minutes=budget,
        seed=seed,
        seconds_per_step=pace.seconds_per_step,
        overhead_s=pace.overhead_s,
        planned_steps=steps,
        wall_s=wall_s,
        scoring_s=scoring_s,
        curve=curve,
        run_dir=str(run_dir),
        final_model=model_dir and str(model_dir),
    )


# ---------------------------------------------------------------------------------------------
# Times to the target, ratios


def time_to(record: dict, target: float) -> dict:
    """When the run's curve first reaches `target`, interpolated between two measured checkpoints only:
    relation "=", "<=" (the first checkpoint is already there) or ">" (never reached: past the last one, or past
    the run's end when it saved no checkpoint)."""
    curve = record["curve"]
    if not curve:
        return {"seconds": record["wall_s"], "relation": ">"}
    if curve[0]["accuracy"] >= target:
        return {"seconds": curve[0]["time_s"], "relation": "<="}
    for before, point in zip(curve, curve[1:]):
        if point["accuracy"] >= target:
            share = (target - before["accuracy"]) / (point["accuracy"] - before["accuracy"])
            return {"seconds": before["time_s"] + share * (point["time_s"] - before["time_s"]), "relation": "="}
    return {"seconds": curve[-1]["time_s"], "relation": ">"}


def _combined(relations: list[str]) -> str:
    """The relation of a median of bounded values: exact, an upper or lower bound, or unknown (both kinds)."""
    kinds = set(relations) - {"="}
    return kinds.pop() if len(kinds) == 1 else ("=" if not kinds else "?")


def ratio(peer: list[dict], ours: list[dict]) -> dict:
    """The peer's time to the target over ours: of the medians over seeds, and the range over all seed pairs."""
    value = statistics.median(t["seconds"] for t in peer) / statistics.median(t["seconds"] for t in ours)
    pairs = [a["seconds"] / b["seconds"] for a in peer for b in ours]
    high = _combined([t["relation"] for t in peer]) == ">" or _combined([t["relation"] for t in ours]) == "<="
    low = _combined([t["relation"] for t in peer]) == "<=" or _combined([t["relation"] for t in ours]) == ">"
    relation = "?" if high and low else ">=" if high else "<=" if low else "="
    return {"value": value, "low": min(pairs), "high": max(pairs), "relation": relation}


def _ratio_text(r: dict) -> str:
    pairs = f"(seed pairs {r['low']:.2f}-{r['high']:.2f}x)"
    if r["relation"] == "?":
        return f"{r['value']:.2f}x, not determined: both sides' times are bounds {pairs}"
    return f"{'' if r['relation'] == '=' else r['relation']}{r['value']:.2f}x {pairs}"


def _minutes(times: list[dict]) -> str:
    relation = _combined([t["relation"] for t in times])
    minutes = sorted(t["seconds"] / 60 for t in times)
    spread = f" ({minutes[0]:.2f}-{minutes[-1]:.2f})" if len(minutes) > 1 else ""
    return f"{'' if relation == '=' else relation}{statistics.median(minutes):.2f}{spread}"


def targets_of(records: list[dict], fixed: dict[str, float], source: str, floor: dict) -> dict:
    longest = max(r["budget_minutes"] for r in records)
    targets = {}
    for arch in dict.fromkeys(r["arch"] for r in records):
        if arch in fixed:
            accuracy, rule = fixed[arch], "--target"
        else:
            runs = [r for r in records if r["arch"] == arch and r["budget_minutes"] == longest]
            rule = f"the lowest final accuracy of the {arch}-{source} runs at {longest:g} min"
            if not any(r["run"] == f"{arch}-{source}" for r in runs):
                rule = f"no {arch}-{source} run: the lowest final accuracy of the {arch} runs at {longest:g} min"
            else:
                runs = [r for r in runs if r["run"] == f"{arch}-{source}"]
            accuracy = min((r["curve"][-1]["accuracy"] for r in runs if r["curve"]), default=float("nan"))
        targets[arch] = {"accuracy": accuracy, "rule": rule, "above_plateau": accuracy - floor["accuracy"]}
    return targets


# ---------------------------------------------------------------------------------------------
# Report


def report(records: list[dict], ctx: dict, fixed_targets: dict[str, float]) -> dict:
    floor, out = ctx["floor"], ctx["out"]
    budgets = sorted({r["budget_minutes"] for r in records})
    targets = targets_of(records, fixed_targets, ctx["args"].target_from, floor)
    summary, ratios = [], {}
    for arch, target in targets.items():
        acc = target["accuracy"]
        print(
            f"\n== {arch}: target {acc:.4f} ({target['rule']}); plateau {floor['accuracy']:.4f} "
            f"(always {floor['token']!r}): the target is {abs(acc - floor['accuracy']):.4f} "
            f"{'above' if acc >= floor['accuracy'] else 'below'} it"
        )
        if acc - floor["accuracy"] < PLATEAU_MARGIN:
            print(
                f"WARNING: {arch}'s target is within {PLATEAU_MARGIN} of the plateau: the ratio would measure how "
                "fast each run leaves the plateau; use longer budgets or --target"
            )
        print(
            f"{'run':19} {'budget':>6} {'seeds':>5} {'s/step':>7} {'steps':>6} {'final acc (min-max)':>22} "
            f"{'to target, min (min-max)':>25} {'downstream':>10}"
        )
        for record in records:
            if record["arch"] == arch:
                record["time_to_target"] = time_to(record, acc)
        for name in dict.fromkeys(r["run"] for r in records if r["arch"] == arch):
            for budget in budgets:
                group = [r for r in records if r["run"] == name and r["budget_minutes"] == budget]
                if not group:
                    continue
                finals = sorted(r["curve"][-1]["accuracy"] for r in group if r["curve"])
                steps = [r["curve"][-1]["step"] for r in group if r["curve"]]
                scores = [r["downstream"] for r in group if "downstream" in r]
                final_text = f"{statistics.median(finals):9.4f} ({finals[0]:.4f}-{finals[-1]:.4f})" if finals else "-"
                print(
                    f"{name:19} {budget:6g} {len(group):5d} {group[0]['seconds_per_step']:7.3f} "
                    f"{statistics.median(steps) if steps else 0:6.0f} {final_text:>22} "
                    f"{_minutes([r['time_to_target'] for r in group]):>25} "
                    f"{(f'{statistics.median(scores):.4f}' if scores else '-'):>10}"
                )
        for peer in (f"{arch}-trainer", f"{arch}-paper"):
            by_budget = {}
            for budget in budgets:
                times = {
                    name: [r["time_to_target"] for r in records if r["run"] == name and r["budget_minutes"] == budget]
                    for name in (peer, f"{arch}-fast")
                }
                if times[peer] and times[f"{arch}-fast"]:
                    by_budget[budget] = ratio(times[peer], times[f"{arch}-fast"])
                    sooner = _ratio_text(by_budget[budget])
                    print(f"{budget:g} min: {arch}-fast reaches {acc:.4f} {sooner} sooner than {peer}")
            if by_budget:
                ratios[f"{arch}-fast vs {peer}"] = {f"{b:g}": r for b, r in by_budget.items()}
                goal = RATIO_GOALS[ctx["args"].device] if peer.endswith("trainer") else 0.0
                summary.append(_budget_line(f"{arch}-fast vs {peer}", by_budget, goal))
    summary += _architectures(records, targets, budgets)
    corpus = ctx["prep"]["identity"]
    summary.append(
        f"corpus: {corpus['name']} ({corpus['train_mb']:.1f} MB, {corpus['train_tokens']:,} tokens to train on): "
        "the ratios hold for this corpus and these budgets; another corpus: --corpus FILE ..."
    )
    print("\nsummary:")
    for line in summary:
        print(f"  {line}")
    results = dict(
        corpus=corpus,
        prepare_s={k: ctx["prep"][k]["seconds"] for k in ("mlm", "paper", "chunks") if k in ctx["prep"]},
        plateau=floor,
        targets=targets,
        paces={n: vars(p) for n, p in ctx["paces"].items()},
        runs=records,
        ratios=ratios,
        summary=summary,
    )
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    plot(records, targets, floor, out / "curves.png")
    print(f"wrote {out / 'curves.png'} and {out / 'results.json'}")
    if ctx["args"].mlflow:
        log_to_mlflow(records, ctx["args"].mlflow)
    return results


def _budget_line(label: str, by_budget: dict, goal: float) -> str:
    """The ratio at each budget, and (`goal` > 0) at which budgets it meets the goal."""
    text = ", ".join(f"{_ratio_text(r)} at {b:g} min" for b, r in by_budget.items())
    if goal:
        met = [f"{b:g}" for b, r in by_budget.items() if r["value"] >= goal and r["relation"] in ("=", ">=")]
        text += f" (goal >= {goal:g}x: met at {', '.join(met) + ' min' if met else 'no budget'})"
    if len(by_budget) < 2:
        return f"{label}: {text}; one budget: pass two --budget-minutes to see how the ratio moves with the budget"
    (b0, r0), (b1, r1) = list(by_budget.items())[0], list(by_budget.items())[-1]
    overlap = r0["low"] <= r1["high"] and r1["low"] <= r0["high"]
    change = r1["value"] / r0["value"] - 1
    bound = "" if r0["relation"] == r1["relation"] == "=" else ", between bounds"
    return (
        f"{label}: {text}; from {b0:g} to {b1:g} min the ratio {'grows' if change > 0 else 'falls'} by "
        f"{abs(change):.0%} ({'within' if overlap else 'beyond'} the seed-pair ranges{bound}): the target is fixed, so "
        "a longer budget stretches both schedules and moves where each run passes it"
    )


def _architectures(records: list[dict], targets: dict, budgets: list[float]) -> list[str]:
    """ModernBERT-mini against BERT-mini, both by bertdist: time to a common target, final accuracy, step time."""
    if not {"bert-fast", "modernbert-fast"} <= {r["run"] for r in records}:
        return []
    common = min(targets["bert"]["accuracy"], targets["modernbert"]["accuracy"])
    lines = []
    for budget in budgets:
        runs = {
            n: [r for r in records if r["run"] == n and r["budget_minutes"] == budget]
            for n in ("bert-fast", "modernbert-fast")
        }
        if not all(runs.values()):
            continue
        times = {n: [time_to(r, common) for r in group] for n, group in runs.items()}
        finals = {
            n: statistics.median([r["curve"][-1]["accuracy"] for r in group if r["curve"]] or [float("nan")])
            for n, group in runs.items()
        }
        lines.append(
            f"modernbert-fast vs bert-fast at {budget:g} min: to {common:.4f} in {_minutes(times['modernbert-fast'])} "
            f"vs {_minutes(times['bert-fast'])} min (bert's time over modernbert's: "
            f"{_ratio_text(ratio(times['bert-fast'], times['modernbert-fast']))}); final accuracy "
            f"{finals['modernbert-fast']:.4f} vs {finals['bert-fast']:.4f}; "
            f"{runs['modernbert-fast'][0]['seconds_per_step']:.3f} vs "
            f"{runs['bert-fast'][0]['seconds_per_step']:.3f} s/step"
        )
    return lines


def plot(records: list[dict], targets: dict, floor: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    archs = list(targets)
    budgets = sorted({r["budget_minutes"] for r in records})
    styles = ["-", "--", ":", "-."]
    colours = {"fast": "tab:blue", "trainer": "tab:orange", "paper": "tab:green"}
    fig, axes = plt.subplots(1, len(archs), figsize=(6.5 * len(archs), 4.5), squeeze=False, sharey=True)
    for ax, arch in zip(axes[0], archs):
        labelled = set()
        for r in records:
            if r["arch"] != arch:
                continue
            budget_index = budgets.index(r["budget_minutes"])
            label = f"{r['run']}, {r['budget_minutes']:g} min"
            ax.plot(
                [p["time_s"] / 60 for p in r["curve"]],
                [p["accuracy"] for p in r["curve"]],
                color=colours[r["run"].split("-", 1)[1]],
                linestyle=styles[(len(budgets) - 1 - budget_index) % len(styles)],
                linewidth=1.0,
                marker=".",
                label=None if label in labelled else label,
            )
            labelled.add(label)
        ax.axhline(targets[arch]["accuracy"], color="grey", linestyle=":", linewidth=1, label="target")
        ax.axhline(floor["accuracy"], color="black", linestyle=":", linewidth=0.8, label="plateau (most frequent)")
        ax.set_title(f"{arch}-mini: held-out MLM accuracy (seeds as thin lines)")
        ax.set_xlabel("wall-clock minutes")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("held-out MLM accuracy (15% masked)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def log_to_mlflow(records: list[dict], uri: str) -> None:
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("time-to-quality")
    for r in records:
        with mlflow.start_run(run_name=f"{r['run']}-{r['budget_minutes']:g}min-seed{r['seed']}"):
            for p in r["curve"]:
                mlflow.log_metrics(
                    {"heldout/mlm_accuracy": p["accuracy"], "heldout/mlm_loss": p["loss"], "wall_clock_s": p["time_s"]},
                    step=p["step"],
                )
            if "downstream" in r:
                mlflow.log_metrics({"downstream/accuracy": r["downstream"]})


if __name__ == "__main__":
    main()
