"""The command lines of the second stage: `bertdist finetune`, `embed`, `attention` and `evaluate` (registered by
bertdist.cli; the commands that make and search pairs of texts are bertdist.finetune.pair_commands).

Like every subcommand, they only parse arguments and call into the package.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_finetune(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "finetune",
        help="fine-tune a pretrained BERT on a labelled task",
        description=(
            "Fine-tune a checkpoint, an export or a Hugging Face directory of a family bertdist reads (BERT, "
            "ModernBERT, ALBERT, ELECTRA, DistilBERT, RoBERTa, XLM-R; finetune.init_from) on "
            "classification or regression (CSV/TSV/JSONL), token_classification (CoNLL), "
            "question_answering (SQuAD JSON), multiple_choice, or embedding (query-passage pairs), "
            "e.g. finetune.train_file=train.tsv finetune.lr=3e-5 (docs/finetune.md)."
        ),
    )
    p.add_argument("--config", help="YAML file with a finetune section (default: all from overrides)")
    p.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # passed by the deepspeed launcher
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    p.set_defaults(func=_run_finetune, interrupted="the finished epochs are kept (the same command continues)")


def _run_finetune(args: argparse.Namespace) -> int:
    from bertdist import chatter
    from bertdist.config import load_config
    from bertdist.finetune.runner import finetune

    cfg = load_config(args.config, list(args.overrides))
    with chatter.logged(Path(cfg.finetune.output_dir) / chatter.LIBRARY_LOG):  # every rank's
        return finetune(cfg)


def add_embed(sub: argparse._SubParsersAction) -> None:
    from bertdist.config.choices import choices
    from bertdist.config.finetune import FinetuneConfig
    from bertdist.finetune.embed import EmbedOptions

    d = EmbedOptions(model="", input="", output_dir="")
    p = sub.add_parser(
        "embed",
        help="write features of a frozen BERT to .npy shards",
        description=(
            "Features for the feature-based approach (docs/finetune.md): one vector per row ([CLS] of a layer, or the "
            "pooler) or per token, from a bertdist run, checkpoint or export, or any Hugging Face BERT or ModernBERT."
        ),
    )
    p.add_argument(
        "--model",
        required=True,
        help="run or checkpoint directory, export, or Hugging Face directory of a family bertdist reads",
    )
    p.add_argument("--input", required=True, help=".txt (a text per line) or .csv/.tsv/.jsonl with --text-column")
    p.add_argument(
        "--output",
        required=True,
        dest="output_dir",
        metavar="OUTPUT",
        help="an empty or new directory for the shards and index.json",
    )
    p.add_argument("--text-column", default=d.text_column)
    p.add_argument(
        "--text-pair-column", default=d.text_pair_column, help="second text of a pair ([CLS] A [SEP] B [SEP])"
    )
    p.add_argument(
        "--features", default=d.features, help="last, layer:N (0: embeddings), last4-concat, last4-sum or pooled"
    )
    p.add_argument("--level", default=d.level, help="sequence (one vector per row) or token (one per WordPiece token)")
    p.add_argument(
        "--pooling",
        default=d.pooling,
        help="sequence level: cls or mean (of the layer's tokens); default: with --features last, a "
        "sentence-transformers model's own (its vectors), else cls",
    )
    p.add_argument("--max-seq-length", type=int, default=d.max_seq_length)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--shard-rows", type=int, default=d.shard_rows, help="rows per .npy shard")
    p.add_argument("--dtype", default=d.dtype, help="float32 or float16")
    p.add_argument(
        "--on-bad-input",
        choices=choices(FinetuneConfig, "on_bad_input"),
        default=FinetuneConfig.on_bad_input,
        help="skip unreadable rows (counted)",
    )
    p.set_defaults(func=_run_embed, interrupted="nothing was written (partial shards are removed)")


EMBED_CONVERTED = {"on_bad_input": "skip_bad"}
"""`embed` flags (by dest) whose value `_run_embed` converts for its EmbedOptions field; every other flag's dest
is its field (bertdist.flags), and every field has a flag."""


def _run_embed(args: argparse.Namespace) -> int:
    from bertdist import chatter
    from bertdist.finetune.embed import EmbedOptions, embed
    from bertdist.flags import from_args

    with chatter.logged():  # DeepSpeed's notes as it consolidates a checkpoint: not the user's to act on
        index = embed(from_args(EmbedOptions, args, skip_bad=args.on_bad_input == "skip"))
    summary = {k: index[k] for k in ("rows", "features", "level", "dimension")}
    blank = (
        f", {len(index['blank_lines'])} blank line(s) embedded as empty text (index.json: blank_lines)"
        if index["blank_lines"]
        else ""
    )
    print(
        f"bertdist embed: {json.dumps(summary)}; {len(index['skipped'])} row(s) skipped{blank}; "
        f"{len(index['shards'])} shard(s) in {args.output_dir}"
    )
    return 0


def add_attention(sub: argparse._SubParsersAction) -> None:
    from bertdist.finetune.attention import AttentionOptions

    d = AttentionOptions(model="", text="")
    p = sub.add_parser(
        "attention",
        help="draw where every attention head looks, for one text (PNG grid and an offline HTML page)",
        description=(
            "Run one text (or pair) through a BERT or ModernBERT and write OUTPUT/attention.png (a layers x heads "
            "grid of heatmaps) and OUTPUT/attention.html (pick a layer and head, hover over tokens; entropy and "
            "the share on [CLS], [SEP], the previous and the next token of every head) (docs/finetune.md)."
        ),
    )
    p.add_argument(
        "--model",
        required=True,
        help="run or checkpoint directory, export, or Hugging Face directory of a family bertdist reads",
    )
    p.add_argument("--text", required=True, help="the text (the first of a pair)")
    p.add_argument("--pair", help="a second text: [CLS] TEXT [SEP] PAIR [SEP]")
    p.add_argument(
        "--output",
        default=d.output_dir,
        dest="output_dir",
        metavar="OUTPUT",
        help=f"directory for attention.png and attention.html (default {d.output_dir}; they are replaced)",
    )
    p.add_argument(
        "--max-seq-length",
        type=int,
        default=d.max_seq_length,
        help="0: a sentence-transformers directory's own length, else 128; the model's positions where fewer",
    )
    p.set_defaults(func=_run_attention, interrupted="each file is written whole or not at all")


def _run_attention(args: argparse.Namespace) -> int:
    from bertdist.finetune.attention import HTML_NAME, PNG_NAME, AttentionOptions, attention
    from bertdist.flags import from_args

    maps = attention(from_args(AttentionOptions, args))
    layers, heads, tokens, _ = maps.probabilities.shape
    out = Path(args.output_dir)
    whole, where = tokens + maps.tokens_cut, "the ends of the longer text first" if args.pair else "the end"
    cut = (
        f" (the {'pair' if args.pair else 'text'} is {whole} tokens: {maps.tokens_cut} were cut from {where} at the "
        "length drawn; --max-seq-length sets it)"
        if maps.tokens_cut
        else ""
    )
    print(
        f"bertdist attention: {tokens} tokens{cut}, {layers} layers x {heads} heads; wrote {out / PNG_NAME} and "
        f"{out / HTML_NAME}"
    )
    return 0


def add_evaluate(sub: argparse._SubParsersAction) -> None:
    from bertdist.finetune.embed import POOLINGS
    from bertdist.finetune.retrieval import RetrievalOptions
    from bertdist.finetune.suites import PAPER_LRS

    d = RetrievalOptions(data_dir="", model="", output="")
    p = sub.add_parser(
        "evaluate",
        help="fine-tune and score a model on a suite of tasks (GLUE or your own)",
        description=(
            "Fine-tune MODEL on every task of the suite found in --data-dir, once per learning rate and seed, and "
            "print the best median dev result per task as the paper's GLUE table (GLUE: beside BERT's published "
            "numbers); results.json and results.md in --output; one MLflow parent run with a child per task, rate and "
            "seed (docs/finetune.md). "
            "--suite retrieval scores the frozen MODEL as a dense retriever on a BEIR collection instead. "
            "key=value overrides apply to every run (e.g. finetune.epochs=2 train.precision=bf16)."
        ),
    )
    p.add_argument(
        "--suite",
        default="glue",
        help="glue (the standard GLUE TSV layout), retrieval (a BEIR collection: "
        "nDCG@10, Recall@100, MRR@10 of the frozen model, nothing fine-tuned) or a suite YAML file",
    )
    p.add_argument(
        "--data-dir",
        required=True,
        help="directory with the suite's files (GLUE: CoLA/, SST-2/, MNLI/, ...; "
        "retrieval: corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv)",
    )
    p.add_argument(
        "--model",
        required=True,
        help="run or checkpoint directory, export, or Hugging Face directory of a family bertdist reads",
    )
    p.add_argument("--tasks", default="", help="comma-separated task names (default: every task found)")
    p.add_argument("--lrs", default=",".join(f"{lr:g}" for lr in PAPER_LRS), help="learning rates of the sweep")
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="fine-tunings per task and learning rate, with train.seed, train.seed+1, ...; each rate is scored by "
        "their median (papers report the median of 5 or more for the small GLUE tasks)",
    )
    p.add_argument(
        "--output",
        default="runs/evaluate",
        help="runs and exports (the MLflow store is the project's, beside it, unless tracking.tracking_uri)",
    )
    p.add_argument("--config", help="YAML file applied to every run (train.*, optim.*, tracking.*, finetune.*)")
    p.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # passed by the deepspeed launcher
    r = p.add_argument_group(
        "retrieval", "--suite retrieval only (finetune.on_bad_input=skip skips bad lines, counted)"
    )
    r.add_argument("--split", default=d.split, help="the judgments: qrels/SPLIT.tsv")
    r.add_argument(
        "--pooling",
        choices=POOLINGS,
        default=d.pooling,
        help="a text's vector: the mean of the last layer, or [CLS]; default: a sentence-transformers model's, "
        "else mean",
    )
    r.add_argument("--batch-size", type=int, default=d.batch_size)
    r.add_argument(
        "--dims",
        default=d.dims,
        help="Matryoshka widths scored besides the whole vector, e.g. 128,64 (default: the model's trained ones)",
    )
    r.add_argument(
        "--max-seq-length",
        type=int,
        default=d.max_seq_length,
        help="0: a sentence-transformers directory's own length, else 256; the model's positions where fewer",
    )
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for every run")
    p.set_defaults(
        func=_run_evaluate,
        interrupted=(
            "finished runs are kept under --output; the interrupted one continues from its last epoch when rerun"
        ),
    )


def _run_evaluate(args: argparse.Namespace) -> int:
    from bertdist import chatter

    with chatter.logged():  # MLflow's notes (its system metrics) are not the user's to act on; -v shows them
        return _evaluate(args)


def _evaluate(args: argparse.Namespace) -> int:
    from bertdist.errors import UserError
    from bertdist.finetune.suites import evaluate

    try:
        lrs = [float(x) for x in args.lrs.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--lrs: {args.lrs!r} is not a comma-separated list of numbers") from None
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if args.suite == "retrieval":
        from bertdist.finetune.retrieval import RetrievalOptions, evaluate_retrieval
        from bertdist.flags import from_args

        if tasks:
            raise UserError("--tasks: --suite retrieval is one task (the collection in --data-dir)")
        if args.seeds != 1:
            raise UserError("--seeds: --suite retrieval fine-tunes nothing, so it has no seeds to vary")
        return evaluate_retrieval(from_args(RetrievalOptions, args))
    return evaluate(
        args.suite, args.data_dir, args.model, args.output, tasks, lrs, args.seeds, args.config, list(args.overrides)
    )
