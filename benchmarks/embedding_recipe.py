"""What each side of benchmarks/embedding_finetune.py trains with: the in-batch recipe, or the full one.

`--recipe pairs` (the default): (query, positive) pairs; InfoNCE over the step's passages. bertdist's plain
contrastive step, sentence-transformers' MultipleNegativesRankingLoss.

`--recipe full`, the recipe issue 46 names, the same for both sides:
- hard negatives mined ONCE, before either side trains, by sentence-transformers' own `mine_hard_negatives` with
  the starting model over the training pairs (sampling "top": for each query the `--negatives` passages of the
  training set that score highest while staying `--margin` (absolute, cosine) below its positive, among its
  `--range-max` nearest); pairs whose query has no such passages are dropped, and (query, positive) duplicates are
  kept once, by the miner. The mined rows go to one file both sides train on;
- the step's whole batch as one contrastive batch (every query against every positive and negative of the step)
  through a gradient cache: bertdist `finetune.cache_rows=M`, sentence-transformers
  CachedMultipleNegativesRankingLoss(mini_batch_size=M);
- the loss summed over Matryoshka prefixes (`--matryoshka-dims`, weights 1): bertdist `finetune.matryoshka_dims`,
  sentence-transformers MatryoshkaLoss around the cached loss.
What "M" encodes at once differs: a bertdist chunk is M rows, each its query, positive and negatives (M x (2 +
negatives) sequences in one unpadded pass); sentence-transformers' mini batch is M texts of one column (query,
positive, negative_1, ...), padded to the mini batch's longest. Same loss, same batch; the memory bound differs.

Batches: both sides take each epoch's seeded order as it is: bertdist with `finetune.no_duplicates=false` (its
default keeps a text from being in a step twice), sentence-transformers with its default random batch sampler,
though its documentation recommends BatchSamplers.NO_DUPLICATES for these losses (a mined negative may be another
row's positive in the same batch; both sides then score that text twice). The figures in docs/benchmarks.md were
measured so, before bertdist had the check.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RECIPES = ("pairs", "full")
DEFAULTS = {
    "pairs": {"batch_size": 32, "train_pairs": 640, "eval_every": 10},
    "full": {"batch_size": 64, "train_pairs": 1280, "eval_every": 5},
}
"""Where the recipes differ in scale: the full one's batch holds more rows than a cache chunk."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipe", choices=RECIPES, default="pairs", help="pairs: in-batch negatives; full: see above")
    group = parser.add_argument_group("--recipe full")
    group.add_argument("--mini-batch", type=int, default=16, help="cache_rows / mini_batch_size")
    group.add_argument("--matryoshka-dims", default="256,128,64,32", help="decreasing; the first is the model's width")
    group.add_argument("--negatives", type=int, default=3, help="mined per query")
    group.add_argument("--margin", type=float, default=0.1, help="absolute cosine margin below the positive")
    group.add_argument("--range-max", type=int, default=0, help="nearest passages considered; 0: all of them")


def fill_defaults(args: argparse.Namespace) -> None:
    """The recipe's batch size, training pairs and scoring interval where the command line left them out."""
    for name, value in DEFAULTS[args.recipe].items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def negative_columns(args: argparse.Namespace) -> list[str]:
    """The mined file's negative columns (the names `mine_hard_negatives` gives them)."""
    return [f"negative_{i}" for i in range(1, args.negatives + 1)] if args.recipe == "full" else []


def dims(args: argparse.Namespace) -> tuple[int, ...]:
    return tuple(int(d) for d in args.matryoshka_dims.split(",")) if args.recipe == "full" else ()


def bertdist_settings(args: argparse.Namespace) -> list[str]:
    """The bertdist overrides of the recipe (the pairs recipe's are the runner's defaults)."""
    if args.recipe == "pairs":
        return []
    return [
        f"finetune.negative_columns={','.join(negative_columns(args))}",
        f"finetune.cache_rows={args.mini_batch}",
        f"finetune.matryoshka_dims={args.matryoshka_dims}",
    ]


def st_loss(args: argparse.Namespace, model, scale: float):
    """sentence-transformers' loss of the recipe, at `scale` = 1 / bertdist's temperature."""
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
        MatryoshkaLoss,
        MultipleNegativesRankingLoss,
    )

    if args.recipe == "pairs":
        return MultipleNegativesRankingLoss(model, scale=scale)
    cached = CachedMultipleNegativesRankingLoss(model, scale=scale, mini_batch_size=args.mini_batch)
    return MatryoshkaLoss(model, cached, list(dims(args)))


def mine(args: argparse.Namespace, model, pairs: Path, output: Path) -> Path:
    """Hard negatives for `pairs` (JSON lines query, passage) by `mine_hard_negatives` with `model` (a
    SentenceTransformer), written to `output` as JSON lines query, passage, negative_1, ...; says what it kept."""
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives

    rows = [json.loads(line) for line in pairs.read_text().splitlines()]
    passages = {r["passage"] for r in rows}
    mined = mine_hard_negatives(
        Dataset.from_dict({"query": [r["query"] for r in rows], "passage": [r["passage"] for r in rows]}),
        model,
        range_max=args.range_max or len(passages),
        absolute_margin=args.margin,
        num_negatives=args.negatives,
        sampling_strategy="top",
        output_format="n-tuple",
        batch_size=64,
        verbose=False,
    )
    output.write_text("".join(json.dumps(row) + "\n" for row in mined))
    negatives = [row[c] for row in mined for c in negative_columns(args)]
    print(
        f"mined {args.negatives} negatives (margin {args.margin}, among the {args.range_max or len(passages)} "
        f"nearest of {len(passages)} passages) for {len(mined)} of {len(rows)} pairs (the miner keeps a (query, "
        f"positive) pair once: {len({(r['query'], r['passage']) for r in rows})} distinct); "
        f"{len(set(negatives))} distinct negatives",
        flush=True,
    )
    return output
