"""The command lines that make and search (query, positive) pairs for embedding models: `bertdist pairs`,
`mine-negatives` and `filter-pairs` (registered by bertdist.cli).

Like every subcommand, they only parse arguments and call into the package.
"""

from __future__ import annotations

import argparse

from bertdist.flags import add_corpus_inputs


def add_pairs(sub: argparse._SubParsersAction) -> None:
    from bertdist.finetune.pairs import KINDS, MIN_SPAN_WORDS, PairsOptions

    d = PairsOptions(inputs=[], output="")
    p = sub.add_parser(
        "pairs",
        help="mine (query, positive) pairs from a corpus, without labels, to train an embedding model on",
        description=(
            "Contrastive pretraining pairs from raw text (the weakly-supervised stage of GTE and E5), each from one "
            "document: neighbour (a passage and the one after it), first-sentence (the first sentence and the passage "
            "after it) and spans (two random non-overlapping runs of words). Written as JSON lines {query, positive, "
            "kind} for `bertdist finetune finetune.task=embedding finetune.text_column=query "
            "finetune.text_pair_column=positive`; the same corpus and --seed give the same bytes (docs/finetune.md)."
        ),
    )
    add_corpus_inputs(p, ", as bertdist prepare reads them")
    p.add_argument("--output", required=True, metavar="PAIRS.jsonl", help="the pairs (written whole or not at all)")
    p.add_argument("--kinds", default=",".join(d.kinds), help=f"comma-separated, of {', '.join(KINDS)} (default: all)")
    p.add_argument(
        "--per-document",
        type=int,
        default=d.per_document,
        help=f"at most this many pairs of each kind per document (default {d.per_document})",
    )
    p.add_argument(
        "--passage-words",
        type=int,
        default=d.passage_words,
        help=f"the longest passage or span in words (default {d.passage_words}; a span has at least {MIN_SPAN_WORDS}, "
        "or this where fewer)",
    )
    p.add_argument("--seed", type=int, default=d.seed, help=f"default {d.seed}: the same seed, the same pairs")
    p.add_argument(
        "--dev-dir",
        default=d.dev_dir,
        metavar="DIR",
        help="write the held-out documents here as a BEIR collection (corpus.jsonl, queries.jsonl, qrels/dev.tsv): "
        "a sentence taken out of each is a query, the rest of it its one relevant passage",
    )
    p.add_argument(
        "--dev-documents",
        type=int,
        default=d.dev_documents,
        metavar="N",
        help="documents held out into --dev-dir (drawn with --seed before mining: no pair comes from them)",
    )
    p.set_defaults(func=_run_pairs, interrupted="nothing was written (the pairs file is written whole or not at all)")


def _run_pairs(args: argparse.Namespace) -> int:
    from bertdist.finetune.pairs import PairsOptions, mine_pairs, parse_kinds
    from bertdist.flags import from_args

    opts = from_args(PairsOptions, args, kinds=parse_kinds(args.kinds))
    print(f"bertdist pairs: {mine_pairs(opts).describe(opts)}")


def _pair_search_flags(p: argparse.ArgumentParser, d, output: str, corpus: str) -> None:
    """The flags of pair_search.PairSearchOptions, which `mine-negatives` and `filter-pairs` share (`d`: their
    defaults; `output`, `corpus`: what those two mean for the command)."""
    p.add_argument(
        "--model",
        required=True,
        help="run or checkpoint directory, export, or sentence-transformers or Hugging Face directory bertdist reads",
    )
    p.add_argument("--pairs", required=True, help="CSV/TSV/JSONL of (query, positive) rows")
    p.add_argument("--output", required=True, help=output)
    p.add_argument("--corpus", default=d.corpus, help=f"{corpus}: a BEIR corpus.jsonl, or a .txt of a passage per line")
    p.add_argument("--query-column", default=d.query_column)
    p.add_argument("--positive-column", default=d.positive_column)


def _encoder_flags(p: argparse.ArgumentParser, d) -> None:
    """How pair_search embeds (the rest of PairSearchOptions), and what to do with a bad row."""
    from bertdist.config.choices import choices
    from bertdist.config.finetune import FinetuneConfig
    from bertdist.finetune.embed import POOLINGS

    p.add_argument(
        "--pooling",
        choices=POOLINGS,
        default=d.pooling,
        help="mean or cls; default: a sentence-transformers model's own, else mean",
    )
    p.add_argument(
        "--max-seq-length", type=int, default=d.max_seq_length, help="0: a sentence-transformers model's, else 256"
    )
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument(
        "--on-bad-input",
        choices=choices(FinetuneConfig, "on_bad_input"),
        default=FinetuneConfig.on_bad_input,
        help="skip unreadable rows and rows whose query is their positive (counted)",
    )


def add_mine_negatives(sub: argparse._SubParsersAction) -> None:
    from bertdist.finetune.hard_negatives import MineOptions

    d = MineOptions(model="", pairs="", output="")
    p = sub.add_parser(
        "mine-negatives",
        help="add hard negatives to (query, positive) pairs, mined with a model, for finetune.task=embedding",
        description=(
            "Search every distinct positive of --pairs (and --corpus) with MODEL's vectors for each query, and "
            "write each row with its --negatives best candidates as negative_1..N (finetune.negative_columns). "
            "The query's own positives are never candidates, and candidates scoring within --margin of the "
            "positive are dropped as likely false negatives; the rules are sentence-transformers' "
            "mine_hard_negatives with sampling_strategy=top (docs/finetune.md)."
        ),
    )
    _pair_search_flags(p, d, "the .jsonl to write: query, positive, negative_1 ... negative_N", "more candidates")
    p.add_argument("--negatives", type=int, default=d.negatives, help=f"negatives per row (default {d.negatives})")
    p.add_argument("--range-min", type=int, default=d.range_min, help="the best rank a negative may have (0: the top)")
    p.add_argument(
        "--range-max",
        type=int,
        default=d.range_max,
        help=f"ranks from this on are not searched (default {d.range_max})",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=d.margin,
        help=f"drop candidates scoring above the positive's score minus this (default {d.margin}, NV-Retriever's)",
    )
    p.add_argument(
        "--relative-margin",
        type=float,
        default=d.relative_margin,
        help="also drop those above positive - |positive| x R",
    )
    p.add_argument("--max-score", type=float, default=d.max_score, help="also drop those scoring above this")
    p.add_argument(
        "--skip-short",
        action="store_true",
        help="skip (and count) rows with too few candidates outside the margin, instead of stopping",
    )
    _encoder_flags(p, d)
    p.set_defaults(func=_run_mine_negatives, interrupted="nothing was written")


def add_filter_pairs(sub: argparse._SubParsersAction) -> None:
    from bertdist.finetune.consistency import FilterOptions

    d = FilterOptions(model="", pairs="", output="")
    p = sub.add_parser(
        "filter-pairs",
        help="keep the (query, positive) pairs whose positive a model ranks near the top for its query",
        description=(
            "Consistency filtering (E5's): rank every pair's positive among a pool of passages (the file's "
            "distinct positives and --corpus, --pool of them at most) by MODEL's cosine similarity to its query, "
            "and keep the pairs ranked in the --top-k. The query's own positives and copies of it never compete "
            "(docs/finetune.md)."
        ),
    )
    _pair_search_flags(p, d, "the .jsonl to write: the kept query, positive rows", "more passages in the pool")
    p.add_argument("--top-k", type=int, default=d.top_k, help=f"keep positives ranked in this many (default {d.top_k})")
    p.add_argument(
        "--pool", type=int, default=d.pool, help=f"passages to rank against, at most (default {d.pool}; 0: all)"
    )
    p.add_argument("--seed", type=int, default=d.seed, help="which passages a --pool smaller than the file draws")
    _encoder_flags(p, d)
    p.set_defaults(func=_run_filter_pairs, interrupted="nothing was written")


MINE_CONVERTED = {"on_bad_input": "skip_bad"}
"""`mine-negatives` and `filter-pairs` flags (by dest) that their `_run_` functions convert for an options field."""


def _run_mine_negatives(args: argparse.Namespace) -> int:
    from bertdist.finetune.hard_negatives import MineOptions, mine_negatives
    from bertdist.flags import from_args

    print(mine_negatives(from_args(MineOptions, args, skip_bad=args.on_bad_input == "skip")))
    return 0


def _run_filter_pairs(args: argparse.Namespace) -> int:
    from bertdist.finetune.consistency import FilterOptions, filter_pairs
    from bertdist.flags import from_args

    print(filter_pairs(from_args(FilterOptions, args, skip_bad=args.on_bad_input == "skip")))
    return 0
