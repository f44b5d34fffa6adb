"""Time to the same retrieval quality: `bertdist finetune finetune.task=embedding` vs sentence-transformers' trainer.

Both sides fine-tune one starting BERT (a Hugging Face directory) on the same query-passage pairs with the same
loss (InfoNCE over in-batch negatives, cosine / 0.05: sentence-transformers' MultipleNegativesRankingLoss at scale
20), mean pooling, batch, epochs, learning rate, warmup then linear decay, AdamW betas/eps, weight decay (none
on LayerNorm and biases), gradient clipping and dropout, fp32 on the same threads:
  bertdist  `finetune(cfg)` in this process (DeepSpeed engine, one rank), as `bertdist finetune` runs it;
  st        `SentenceTransformerTrainer` on `Transformer(DIR) + Pooling(mean)`, its default (random) batch sampler.
What differs is the training loop: data order, dropout streams, the encoder (bertdist unpads a step's queries
and passages into one pass; sentence-transformers pads each column to its longest text and runs two).

Pairs come from Python's documentation (real text every machine has; bertdist.finetune.corpus_tasks): a sentence
is the query, the rest of its document the passage. Training pairs come from every other document; the held-out
queries from documents of the other half, each searching all of that half's documents (BEIR's layout:
corpus_tasks.held_out_retrieval), so no dev query or passage was seen in training.

Every `--eval-every` steps and at each epoch's end (the same steps on both sides), the model is saved as a
sentence-transformers directory and scored by one scorer: `SentenceTransformer(DIR).encode` of the held-out
queries and passages, nDCG@10 by bertdist.finetune.contrastive.retrieval_metrics. The training clock runs from
the call that starts a side (model load, tokenization, engine or trainer set-up, and bertdist's checkpoint and
export at every epoch's end included; library imports done before) and stops while scoring. Per seed, two
targets both sides reach: the lower of their final nDCG@10, and 80% of the way from the start to it (on the
rising part of the curves, where a plateau's noise moves the crossing less). Each side's time to a target is
interpolated between evaluations; the ratio is st / bertdist (> 1: bertdist sooner). Quality parity is the
difference of nDCG@10 at the same steps. Sides run in turns (bertdist, st, bertdist, st, ...) so that a busy
machine slows both; on a shared machine `--threads 1 --cpu-time` times this thread's CPU seconds instead, which
other processes move far less (everything both sides compute runs on the calling thread then).

`--recipe full` trains both sides with hard negatives mined once by sentence-transformers' `mine_hard_negatives`,
the whole batch through a gradient cache and Matryoshka prefixes (benchmarks/embedding_recipe.py); nDCG@10 is then
reported at the narrowest prefix too. Mining needs a start that already embeds: a random-init BERT scores every
passage at cosine 0.95 +- 0.03, so a margin of 0.1 below the positive leaves nothing to mine. Without --model its
start is therefore the random-init BERT fine-tuned (off the clock, once) with the pairs recipe for one epoch on
pairs from Debian's English manual pages: another domain, unseen by the benchmark (warm_start).

sentence-transformers' trainer needs `datasets`, which bertdist's test extra does not install (pip install datasets).

    python benchmarks/embedding_finetune.py                                  # BERT-mini, random init, 2 seeds
    python benchmarks/embedding_finetune.py --threads 1 --cpu-time           # the same, far less moved by other work
    python benchmarks/embedding_finetune.py --model runs/demo/model --lr 1e-4 --seeds 3   # a pretrained start
    python benchmarks/embedding_finetune.py --recipe full --threads 1 --cpu-time --seeds 3   # mined negatives, ...
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Callable
from unittest import mock

import embedding_recipe as recipe  # benchmarks/ is on sys.path when this file runs as a script
import torch
from common import step_clock, use_all_cores

from bertdist.config import load_config
from bertdist.finetune import corpus_tasks, runner
from bertdist.finetune.contrastive import retrieval_metrics
from bertdist.finetune.runner import Finetuning, finetune
from bertdist.train.deepspeed_package import import_deepspeed
from bertdist.train.ports import free_tcp_port

SIDES = ("bertdist", "st")
WARM_PAGES, WARM_PAIRS = 800, 1280
"""warm_start's manual pages (the first in path order) and the pairs drawn from them."""


# --- data and the starting model -------------------------------------------------------------------
def pairs_and_held_out(directory: Path, train_pairs: int, dev_queries: int) -> tuple[Path, Path, dict, str]:
    """The training pairs file, the held-out set as a BEIR directory (bertdist's config needs a dev set; its scores
    are ours: see bertdist_run) and as texts, and a vocab trained on all text."""
    from bertdist.data.vocab import train_vocab
    from bertdist.demo import python_documentation

    documents = python_documentation()
    halves = {}
    for name, part in (("train", documents[1::2]), ("dev", documents[::2])):
        halves[name] = directory / f"{name}-documents.jsonl"
        halves[name].write_text("".join(json.dumps({"text": " ".join(d.split())}) + "\n" for d in part))
    train = directory / "pairs-train.jsonl"
    corpus_tasks.query_passages(halves["train"], train, train_pairs, 0)
    beir = directory / "held-out"
    corpus_tasks.held_out_retrieval(halves["dev"], beir, dev_queries, 1)
    qrels_file = (beir / "qrels" / "test.tsv").rename(beir / "qrels" / "dev.tsv")  # the split bertdist reads
    passages = [json.loads(line) for line in (beir / "corpus.jsonl").read_text().splitlines()]
    queries = [json.loads(line) for line in (beir / "queries.jsonl").read_text().splitlines()]
    index = {p["_id"]: i for i, p in enumerate(passages)}
    qrels = dict(line.split("\t")[:2] for line in qrels_file.read_text().splitlines()[1:])
    held_out = {
        "queries": [q["text"] for q in queries],
        "passages": [p["text"] for p in passages],
        "relevant": [index[qrels[q["_id"]]] for q in queries],
    }
    return train, beir, held_out, train_vocab(documents, str(directory / "vocab"), vocab_size=8192)


def warm_start(args, random_start: Path, directory: Path, dev: Path) -> Path:
    """The random-init BERT after one epoch of the pairs recipe (bertdist) on pairs from the manual pages; its
    sentence-transformers directory."""
    from bertdist.data.manpages import MAN_ROOT, LanguageCounts, man_pages, render_man_page, write_language

    pages = man_pages(MAN_ROOT).get("en", [])[:WARM_PAGES]
    if not pages:
        raise SystemExit(f"--recipe full starts from a model warmed on {MAN_ROOT}'s pages; none here: pass --model")
    groff, counts = shutil.which("groff"), LanguageCounts()
    write_language("en", "manpages", pages, lambda p: render_man_page(p, groff), str(directory / "man"), 2, counts)
    pairs = directory / "man-pairs.jsonl"
    corpus_tasks.query_passages(directory / "man" / "en" / "manpages.jsonl", pairs, WARM_PAIRS, 0)
    one_epoch = argparse.Namespace(**{**vars(args), "recipe": "pairs", "batch_size": 32, "epochs": 1, "set": []})
    files = {"start": random_start, "train": pairs, "dev": dev}
    assert finetune(load_config(None, bertdist_settings(one_epoch, files, 0, directory / "warm")), {}) == 0
    print(f"start: warmed on {WARM_PAIRS} pairs from {counts.documents} manual pages", flush=True)
    return directory / "warm" / "model"


class Scorer:
    """nDCG@10 of a sentence-transformers directory on the held-out set (and at each narrower Matryoshka width of
    `dims`): one code path for both sides."""

    def __init__(self, held_out: dict, dims: tuple[int, ...] = ()) -> None:
        self.texts = held_out["queries"] + held_out["passages"]
        self.queries, self.relevant, self.dims = len(held_out["queries"]), held_out["relevant"], dims
        self.narrowest = f"ndcg_at_10_dim{min(dims)}" if dims else None

    def __call__(self, directory: str) -> dict[str, float]:
        from sentence_transformers import SentenceTransformer

        vectors = SentenceTransformer(directory, device="cpu").encode(self.texts, batch_size=64)
        return retrieval_metrics(vectors, self.queries, self.relevant, self.dims)


class Timeline:
    """A side's training clock (scoring excluded) and its nDCG@10 at the evaluated steps."""

    def __init__(self, score: Scorer, eval_steps: set[int], clock: Callable[[], float]) -> None:
        self.score, self.eval_steps, self.clock = score, eval_steps, clock
        self.start, self.paused = clock(), 0.0
        self.startup_s: float | None = None  # until the first training step begins
        self.points: list[tuple[int, float, float]] = []  # (step, training seconds, nDCG@10)
        self.narrowest: dict[int, float] = {}  # step -> nDCG@10 at the narrowest Matryoshka width

    def restart(self) -> None:
        self.start = self.clock()

    def seconds(self) -> float:
        return self.clock() - self.start - self.paused

    def step_begins(self) -> None:
        if self.startup_s is None:
            self.startup_s = self.seconds()

    def step_ended(self, step: int, save: Callable[[str], None]) -> None:
        if step not in self.eval_steps or (self.points and self.points[-1][0] == step):
            return
        trained, began = self.seconds(), self.clock()
        with tempfile.TemporaryDirectory() as directory:
            save(directory)
            scores = self.score(directory)
            self.points.append((step, trained, scores["ndcg_at_10"]))
            if self.score.narrowest:
                self.narrowest[step] = scores[self.score.narrowest]
        self.paused += self.clock() - began


def st_model(directory: str | Path, max_seq_length: int):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    encoder = Transformer(str(directory), max_seq_length=max_seq_length)
    return SentenceTransformer(modules=[encoder, Pooling(encoder.get_embedding_dimension(), "mean")], device="cpu")


# --- the two sides ---------------------------------------------------------------------------------
def bertdist_run(args, files: dict, seed: int, output: Path, timeline: Timeline) -> None:
    """`finetune(cfg)`, observed at its steps: after each, the model is scored where `timeline` asks; its own
    end-of-epoch evaluation returns that score (same steps) instead of encoding the dev set a second time."""
    from bertdist.model.sentence import save_sentence_transformer

    original_step = Finetuning._step
    steps = [0]

    def step(self, rows):
        timeline.step_begins()
        result = original_step(self, rows)
        steps[0] += 1
        length = self.cfg.finetune.sequence_length(self.source.model_cfg.max_position_embeddings)
        timeline.step_ended(
            steps[0], lambda d: save_sentence_transformer(self.engine.module, d, self.source.vocab_file, length)
        )
        return result

    def dev_scores(*_):
        return {"dev/ndcg_at_10": timeline.points[-1][2]}

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(Finetuning, "_step", step))
        stack.enter_context(mock.patch.object(runner, "dev_scores", dev_scores))
        timeline.restart()
        assert finetune(load_config(None, bertdist_settings(args, files, seed, output)), {}) == 0


def bertdist_settings(args, files: dict, seed: int, output: Path) -> list[str]:
    """The `bertdist finetune` command line of a side: the shared settings, the recipe's, then --set."""
    return [
        "finetune.task=embedding",
        f"finetune.init_from={files['start']}",
        f"finetune.train_file={files['train']}",
        f"finetune.dev_file={files['dev']}",
        "finetune.text_column=query",
        "finetune.text_pair_column=passage",
        "finetune.pooling=mean",
        "finetune.temperature=0.05",
        f"finetune.max_seq_length={args.max_seq_length}",
        f"finetune.batch_size={args.batch_size}",
        f"finetune.micro_batch_size={args.batch_size}",
        f"finetune.lr={args.lr}",
        f"finetune.epochs={args.epochs}",
        f"finetune.warmup_proportion={args.warmup_proportion}",
        f"finetune.output_dir={output}",
        "finetune.no_duplicates=false",  # the seeded order as it is: sentence-transformers keeps its default sampler
        f"train.seed={seed}",
        "tracking.enabled=false",
        f"launch.master_port={free_tcp_port()}",
        *recipe.bertdist_settings(args),
        *args.set,
    ]


def st_run(args, files: dict, seed: int, output: Path, timeline: Timeline) -> None:
    """SentenceTransformerTrainer with bertdist's fine-tuning defaults where the two have a setting in common."""
    import transformers
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.training_args import BatchSamplers

    from bertdist.config import OptimConfig

    optim = OptimConfig()  # bertdist's defaults: betas, eps, weight decay, clipping
    timeline.restart()
    model = st_model(files["start"], args.max_seq_length)
    rows = [json.loads(line) for line in Path(files["train"]).read_text().splitlines()]
    columns = ["query", "passage", *recipe.negative_columns(args)]  # by position: anchor, positive, negatives
    data = Dataset.from_dict({c: [r[c] for r in rows] for c in columns})
    total_steps = int(args.epochs * (len(rows) // args.batch_size))

    class Observe(transformers.TrainerCallback):
        def on_step_begin(self, *_, **__):
            timeline.step_begins()

        def on_step_end(self, _args, state, *_, **__):
            timeline.step_ended(state.global_step, model.save)

    training_args = SentenceTransformerTrainingArguments(
        output_dir=str(output),
        per_device_train_batch_size=args.batch_size,
        num_train_epochs=args.epochs,
        learning_rate=args.lr,
        lr_scheduler_type="linear",
        warmup_steps=int(args.warmup_proportion * total_steps),  # bertdist rounds the same way
        weight_decay=optim.weight_decay,
        adam_beta1=optim.betas[0],
        adam_beta2=optim.betas[1],
        adam_epsilon=optim.eps,
        max_grad_norm=optim.grad_clip_norm,
        batch_sampler=BatchSamplers.BATCH_SAMPLER,
        dataloader_drop_last=True,  # bertdist's steps are whole batches too
        seed=seed,
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    SentenceTransformerTrainer(
        model=model,
        args=training_args,
        train_dataset=data,
        loss=recipe.st_loss(args, model, scale=1 / 0.05),
        callbacks=[Observe()],
    ).train()


# --- comparing the curves -------------------------------------------------------------------------
def time_to(points: list[tuple[float, float]], target: float) -> float:
    """The first time the curve (seconds, nDCG), linear between its points, reaches `target`."""
    if points[0][1] >= target:
        return points[0][0]
    for (t0, q0), (t1, q1) in zip(points, points[1:]):
        if q1 >= target:  # and q0 < target: the curve crosses it here
            return t0 + (t1 - t0) * (target - q0) / (q1 - q0)
    return float("nan")


def compare(initial: float, timelines: dict[str, Timeline]) -> dict:
    """Times to two targets both sides reach: the lower final nDCG@10, and 80% of the way from the start to it (on
    the rising part of the curves, where a plateau's noise moves the crossing less); nDCG@10 at equal steps."""
    curves = {
        side: [(0.0, initial), (tl.startup_s, initial)] + [(t, q) for _, t, q in tl.points]
        for side, tl in timelines.items()
    }
    finals = {side: tl.points[-1][2] for side, tl in timelines.items()}
    lower = min(finals.values())
    report: dict = {"final": finals}
    for name, target in (("final", lower), ("80%", initial + 0.8 * (lower - initial))):
        reached = {side: time_to(curve, target) for side, curve in curves.items()}
        loop = {side: reached[side] - timelines[side].startup_s for side in timelines}
        report[f"target {name}"] = target
        report[f"seconds to {name}"] = reached
        report[f"ratio {name}"] = _ratio(reached["st"], reached["bertdist"])
        report[f"loop ratio {name}"] = _ratio(loop["st"], loop["bertdist"])
    by_step = {side: {s: q for s, _, q in tl.points} for side, tl in timelines.items()}
    gaps = [100 * (by_step["bertdist"][s] - by_step["st"][s]) for s in sorted(by_step["bertdist"])]
    if all(tl.narrowest for tl in timelines.values()):  # Matryoshka: the narrowest width at the last step
        narrowest = {side: tl.narrowest[tl.points[-1][0]] for side, tl in timelines.items()}
        report |= {
            "final narrowest": narrowest,
            "narrowest gap (points)": 100 * (narrowest["bertdist"] - narrowest["st"]),
        }
    report |= {
        "final gap (points)": gaps[-1],
        "mean gap at equal steps (points)": statistics.mean(gaps),
        "largest gap (points)": max(gaps, key=abs),
        "start-up s": {side: tl.startup_s for side, tl in timelines.items()},
        "s/step": {  # scoring excluded; bertdist's epoch checkpoints and exports included
            side: (tl.points[-1][1] - tl.startup_s) / tl.points[-1][0] for side, tl in timelines.items()
        },
    }
    return report


def _ratio(theirs: float, ours: float) -> float:
    return theirs / ours if ours > 0 else float("nan")  # a target at or below the start is reached at once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a pretrained BERT directory to start from; default: --size, random init")
    parser.add_argument("--size", default="mini")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--batch-size", type=int, help="default: 32 (pairs), 64 (full)")
    parser.add_argument("--warmup-proportion", type=float, default=0.1)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--train-pairs", type=int, help="drawn from the documents; default: 640 (pairs), 1280 (full)")
    parser.add_argument("--dev-queries", type=int, default=200)
    parser.add_argument("--eval-every", type=int, help="steps between scorings (and every epoch's end); 10, 5 (full)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for both sides; 0: one per core")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time this thread's CPU seconds instead of wall time (needs --threads 1): immune to other work",
    )
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="bertdist settings only (st keeps the defaults), e.g. train.zero_stage=0",
    )
    recipe.add_arguments(parser)
    args = parser.parse_args()
    recipe.fill_defaults(args)
    threads = args.threads or use_all_cores()
    torch.set_num_threads(threads)
    clock = step_clock(torch.device("cpu"), threads, args.cpu_time)
    import_deepspeed()  # imports are not either side's training time
    import sentence_transformers  # noqa: F401

    try:
        import datasets  # noqa: F401
    except ImportError:
        raise SystemExit("sentence-transformers' trainer needs `datasets`: pip install datasets") from None

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        train, dev, held_out, vocab = pairs_and_held_out(directory, args.train_pairs, args.dev_queries)
        start = Path(args.model) if args.model else directory / "start"
        described = args.model or f"{args.size}, random init"
        if not args.model:
            from bertdist.config import ModelConfig
            from bertdist.model.bert.hf import save_pretrained
            from bertdist.model.bert.model import BertForPreTraining

            torch.manual_seed(0)
            save_pretrained(BertForPreTraining(ModelConfig.from_size(args.size, vocab_size=8192)), start, vocab)
            if args.recipe == "full":
                start, described = warm_start(args, start, directory, dev), f"{described}, warmed on manual pages"
        if args.recipe == "full":
            train = recipe.mine(args, st_model(start, args.max_seq_length), train, directory / "mined.jsonl")
        files = {"start": start, "train": train, "dev": dev}
        score = Scorer(held_out, recipe.dims(args))
        rows = len(train.read_text().splitlines())
        steps_per_epoch = rows // args.batch_size
        total = args.epochs * steps_per_epoch
        eval_steps = {*range(args.eval_every, total + 1, args.eval_every)} | {
            e * steps_per_epoch for e in range(1, args.epochs + 1)
        }
        with tempfile.TemporaryDirectory() as d:
            st_model(start, args.max_seq_length).save(d)
            initial_scores = score(d)
        initial = initial_scores["ndcg_at_10"]
        narrowest = f" ({initial_scores[score.narrowest]:.4f} at {min(score.dims)} dims)" if score.narrowest else ""
        print(
            f"recipe {args.recipe}: {rows} training rows, {len(held_out['queries'])} held-out queries among "
            f"{len(held_out['passages'])} passages; {total} steps of {args.batch_size}, lr {args.lr}, "
            f"{args.epochs} epochs; {threads} thread(s), {'CPU' if args.cpu_time else 'wall'} time; "
            f"start: {described}; nDCG@10 before training {initial:.4f}{narrowest}",
            flush=True,
        )
        reports = []
        for seed in range(args.seeds):
            timelines = {}
            for side, run in zip(SIDES, (bertdist_run, st_run)):
                timelines[side] = Timeline(score, eval_steps, clock)
                load = os.getloadavg()[0]
                run(args, files, seed, directory / side / str(seed), timelines[side])
                print(
                    f"seed {seed} {side} (load average {load:.1f} at its start): start-up "
                    f"{timelines[side].startup_s:.1f} s; step: s, nDCG@10{' / narrowest' if narrowest else ''} "
                    + ", ".join(
                        f"{s}: {t:.1f} {q:.4f}" + (f"/{timelines[side].narrowest[s]:.4f}" if narrowest else "")
                        for s, t, q in timelines[side].points
                    ),
                    flush=True,
                )
            reports.append(compare(initial, timelines))
            print(f"seed {seed}: " + json.dumps(reports[-1], default=lambda x: round(x, 4)), flush=True)
    summarise(reports)


def summarise(reports: list[dict]) -> None:
    def spread(values: list[float], digits: int) -> str:
        shown = ", ".join(f"{v:.{digits}f}" for v in values)
        return f"{statistics.mean(values):.{digits}f} ({shown})"

    rows = [("bertdist final nDCG@10", [r["final"]["bertdist"] for r in reports], 4)]
    rows += [("st final nDCG@10", [r["final"]["st"] for r in reports], 4)]
    if "final narrowest" in reports[0]:
        rows += [
            ("bertdist final nDCG@10, narrowest width", [r["final narrowest"]["bertdist"] for r in reports], 4),
            ("st final nDCG@10, narrowest width", [r["final narrowest"]["st"] for r in reports], 4),
            ("narrowest width's final gap, points", [r["narrowest gap (points)"] for r in reports], 2),
        ]
    for name, label in (("final", "the lower final nDCG@10"), ("80%", "80% of the gain to it")):
        rows += [
            (f"target: {label}", [r[f"target {name}"] for r in reports], 4),
            ("  bertdist s to it", [r[f"seconds to {name}"]["bertdist"] for r in reports], 1),
            ("  st s to it", [r[f"seconds to {name}"]["st"] for r in reports], 1),
            ("  ratio st / bertdist", [r[f"ratio {name}"] for r in reports], 2),
            ("  ratio, start-up left out", [r[f"loop ratio {name}"] for r in reports], 2),
        ]
    rows += [
        ("final gap, points (bertdist - st)", [r["final gap (points)"] for r in reports], 2),
        ("mean gap at equal steps, points", [r["mean gap at equal steps (points)"] for r in reports], 2),
        ("largest gap at equal steps, points", [r["largest gap (points)"] for r in reports], 2),
        ("bertdist start-up s", [r["start-up s"]["bertdist"] for r in reports], 1),
        ("st start-up s", [r["start-up s"]["st"] for r in reports], 1),
        ("bertdist s/step", [r["s/step"]["bertdist"] for r in reports], 3),
        ("st s/step", [r["s/step"]["st"] for r in reports], 3),
        ("s/step ratio st / bertdist", [r["s/step"]["st"] / r["s/step"]["bertdist"] for r in reports], 2),
    ]
    print("\n| measure | mean (per seed) |\n| --- | --- |")
    for name, values, digits in rows:
        print(f"| {name} | {spread(values, digits)} |")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
