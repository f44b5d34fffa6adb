"""The data stage's commands: `bertdist vocab`, `bertdist prepare` and `bertdist inspect` (their parsers and what they
run), as bertdist.finetune.commands and bertdist.launch.commands hold theirs; `bertdist.cli` puts them together."""

from __future__ import annotations

import argparse
import itertools
import os
import re
import sys
from pathlib import Path
from typing import Iterator

from bertdist import ownership, storage
from bertdist.config import ModelConfig
from bertdist.config.choices import choices
from bertdist.data.instances import InstanceOptions
from bertdist.data.pipeline.options import PrepareOptions
from bertdist.data.tokenizer import TOKENIZER_JSON, TOKENIZER_MODELS, count_tokens
from bertdist.errors import USAGE_EXIT_CODE, DataError
from bertdist.flags import Renamed, add_corpus_inputs, from_args


def add_vocab(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "vocab",
        help="train a tokenizer (WordPiece vocab.txt, or a byte-level BPE or Unigram tokenizer.json)",
        description=(
            "Train a tokenizer with Hugging Face tokenizers, streaming the input, with BERT's special tokens [PAD] "
            "[UNK] [CLS] [SEP] [MASK] first. --model wordpiece (BERT's normaliser and pre-tokenizer) writes "
            "DIR/vocab.txt, DIR/tokenizer.json and DIR/tokenizer_config.json; --model bpe (byte-level BPE as "
            "ModernBERT's) and --model unigram "
            "(Unigram with byte fallback as Gemma's, for many languages) write DIR/tokenizer.json, "
            "tokenizer_config.json and special_tokens_map.json. data.vocab_file (--vocab) "
            "names the file printed, or DIR."
        ),
    )
    p.add_argument(
        "--input",
        nargs="+",
        required=True,
        help="files, directories or globs (.txt, .jsonl, .xml, optionally .gz/.bz2)",
    )
    p.add_argument("--output", required=True, metavar="DIR")
    p.add_argument(
        "--model",
        choices=TOKENIZER_MODELS,
        default=TOKENIZER_MODELS[0],
        help="wordpiece: BERT's vocab.txt (default); bpe: a byte-level BPE tokenizer.json, as ModernBERT's; "
        "unigram: a Unigram tokenizer.json with byte fallback (no unknown text), as Gemma's",
    )
    p.add_argument("--vocab-size", type=int, default=ModelConfig.vocab_size)
    p.add_argument(
        "--cased",
        action="store_true",
        help="keep case and accents (default: lower-case; WordPiece also strips accents, BPE and Unigram keep them)",
    )
    _add_language_flags(
        p,
        "holds out every 20th document of each language and reports, per language, tokens per "
        "word and the unknown-token rate on them",
    )
    p.set_defaults(func=_run_vocab, interrupted="no vocabulary was written")


MAX_VOCAB_SIZE = 4_194_304
"""Far above any released encoder's (XLM-R's 250,002, Gemma's 262,144); tokenizers overflowed past 2^32 with a
traceback after the corpus was read."""
MARKED_SCRIPTS = re.compile("[\u0590-\u06ff\u0900-\u0eff\u0f00-\u109f\u1780-\u17ff]")
"""Scripts whose combining marks tell words apart (Hebrew, Arabic, the Indic scripts, Thai, Lao, Tibetan, Myanmar,
Khmer): an uncased WordPiece strips them."""


class _MarkedScripts:
    """The texts of `texts`, noting whether one holds MARKED_SCRIPTS: the warning was printed only with a language
    option, so a Hindi corpus trained uncased said nothing."""

    def __init__(self, texts: Iterator[str]):
        self.texts, self.seen = texts, False

    def __iter__(self) -> Iterator[str]:
        for text in self.texts:
            if not self.seen and MARKED_SCRIPTS.search(text):
                self.seen = True
            yield text


def _run_vocab(args: argparse.Namespace) -> int:
    from bertdist.data import bpe, unigram
    from bertdist.data.language_report import HELD_OUT_EVERY, HeldOut, language_report
    from bertdist.data.readers import expand_inputs
    from bertdist.data.vocab import train_vocab

    train, smallest = {
        "wordpiece": (train_vocab, 16),
        "bpe": (bpe.train_bpe, bpe.MIN_VOCAB_SIZE),
        "unigram": (unigram.train_unigram, unigram.MIN_VOCAB_SIZE),
    }[args.model]
    if not smallest <= args.vocab_size <= MAX_VOCAB_SIZE:
        print(
            f"bertdist vocab: --vocab-size must be in [{smallest}, {MAX_VOCAB_SIZE:,}] for --model {args.model}",
            file=sys.stderr,
        )
        return USAGE_EXIT_CODE
    if args.language_field and args.languages_from_dirs:
        print("bertdist vocab: --language-field and --languages-from-dirs: give one", file=sys.stderr)
        return USAGE_EXIT_CODE
    inputs = [source for source in args.input if storage.inside(args.output, source)]
    if inputs:
        print(
            f"bertdist vocab: --output {args.output} is inside the --input {inputs[0]}: its next read would take the "
            "tokenizer's files for text; write them beside it",
            file=sys.stderr,
        )
        return USAGE_EXIT_CODE
    report = bool(args.language_field or args.languages_from_dirs)
    files = expand_inputs(args.input, args.languages_from_dirs)
    held_out = HeldOut(files, args.language_field, HELD_OUT_EVERY if report else 0)
    texts = held_out.training_texts()
    first = next((text for text in texts if text.strip()), None)
    if first is None:  # a vocabulary of the special tokens alone would pass for one; prepare refuses this input too
        raise DataError(f"{' '.join(args.input)}: contains no text (an empty file, or a dump of redirects only)")
    marked = _MarkedScripts(texts) if args.model == "wordpiece" and not args.cased else None
    with ownership.owned(args.output, remove_on_failure=True) as out:
        # Written aside, then each file renamed in: tokenizers' save writes in place, and an interrupt replacing a
        # tokenizer left an empty tokenizer.json where a good one was. Its tokenizer.json last: what a directory
        # is read by first.
        staging = out / f".vocab{storage.PARTIAL_MARKER}{os.getpid()}"
        staged = train(itertools.chain([first], marked or texts), str(staging), args.vocab_size, cased=args.cased)
        for made in sorted(staging.iterdir(), key=lambda p: p.name == TOKENIZER_JSON):
            os.replace(made, out / made.name)
        staging.rmdir()
    path = str(Path(args.output) / Path(staged).name)
    size = count_tokens(path)
    print(f"wrote {path}: {size:,} tokens")
    if size > args.vocab_size:  # WordPiece keeps every character of the corpus, however many
        print(
            f"bertdist vocab: {size:,} tokens, more than --vocab-size {args.vocab_size:,}: the corpus has that many "
            f"distinct characters; a model needs model.vocab_size >= {size:,}",
            file=sys.stderr,
        )
    if marked and (marked.seen or MARKED_SCRIPTS.search(first)):
        print(
            "bertdist vocab: an uncased WordPiece strips accents and every other combining mark, which in Devanagari, "
            "Thai, Arabic or Hebrew tells words apart (क्या 'what' reads कया), and this corpus has such text; "
            "Google's multilingual BERT is cased for this reason: --cased keeps them",
            file=sys.stderr,
        )
    if report:
        print("per language, on held-out documents:")
        print("\n".join(language_report(args.output, held_out.documents, args.cased)))
    return 0


def _add_language_flags(p: argparse.ArgumentParser, what: str) -> None:
    """--language-field and --languages-from-dirs, as `vocab` and `prepare` both read them."""
    p.add_argument(
        "--language-field",
        default=PrepareOptions.language_field,
        metavar="FIELD",
        help=f"the JSON-lines field naming each document's language (a line without it is bad input); {what}",
    )
    p.add_argument(
        "--languages-from-dirs",
        action="store_true",
        help="each --input is a directory of one subdirectory per language (INPUT/de/..., INPUT/fr/...)",
    )


def add_prepare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prepare",
        help="turn a corpus into WebDataset shards of masked sentence pairs (Ray)",
        description=(
            "Read, split, tokenize, build BERT's NSP pairs and masks, and write shuffled, checksummed WebDataset "
            "shards plus manifest.json, with Ray tasks (local Ray by default). The output depends only on the "
            "inputs and options, not on --workers. A killed run resumes when rerun with the same command."
        ),
    )
    add_corpus_inputs(p)
    p.add_argument("--output", required=True, dest="output_dir", metavar="DIR")
    p.add_argument(
        "--vocab",
        "--tokenizer",
        required=True,
        dest="vocab_file",
        metavar="VOCAB",
        help="the tokenizer: a vocab.txt or "
        "tokenizer.json from `bertdist vocab`, or a directory holding either (a Hugging Face model's)",
    )
    i, o = InstanceOptions(), PrepareOptions(inputs=[], output_dir="", vocab_file="")
    p.add_argument("--max-seq-length", type=int, default=i.max_seq_length)
    p.add_argument(
        "--samples",
        choices=choices(InstanceOptions, "samples"),
        default=i.samples,
        help="nsp: BERT's sentence pairs (the paper); mlm: full-length contiguous text for MLM-only training; "
        "sop: ALBERT's sentence-order pairs",
    )
    p.add_argument("--objective", action=Renamed, now="--samples")
    p.add_argument(
        "--masking",
        choices=choices(InstanceOptions, "masking"),
        default=i.masking,
        help="static: masks written into the shards (the paper); dynamic: the loader masks afresh every epoch",
    )
    p.add_argument(
        "--dupe-factor",
        type=int,
        default=None,
        help=f"passes over the data, each with new pairs and masks (default {i.dupe_factor}; 1 with --masking dynamic)",
    )
    p.add_argument("--masked-lm-prob", type=float, default=i.masked_lm_prob)
    p.add_argument(
        "--max-predictions-per-seq",
        type=int,
        default=i.max_predictions_per_seq,
        help="at most this many predictions per sample (0, the default: the rate's share of --max-seq-length, "
        "Google's 20 at 128 and 77 at 512)",
    )
    p.add_argument("--short-seq-prob", type=float, default=i.short_seq_prob)
    p.add_argument("--whole-word-mask", action="store_true")
    p.add_argument(
        "--span-masking",
        action="store_true",
        help="SpanBERT's masking: spans of whole words, geometric lengths, one 80/10/10 choice per span",
    )
    p.add_argument("--span-length-p", type=float, default=i.span_length_p, help="the span lengths' geometric p")
    p.add_argument("--max-span-words", type=int, default=i.max_span_words, help="the longest span, in words")
    p.add_argument(
        "--cased",
        action="store_true",
        help="the vocab.txt keeps case and accents (default: as its tokenizer_config.json's do_lower_case says, "
        "else as its tokens show; a tokenizer.json carries its own normaliser)",
    )
    p.add_argument("--seed", type=int, default=i.seed)
    p.add_argument("--workers", type=int, default=o.workers, help="concurrent Ray tasks (default: every CPU)")
    p.add_argument(
        "--ray-address", default=o.ray_address, help="'auto' or ray://HOST:PORT for a cluster (default: local Ray)"
    )
    p.add_argument("--samples-per-shard", type=int, default=o.samples_per_shard)
    p.add_argument(
        "--group-mb",
        type=float,
        default=o.group_bytes / (1 << 20),
        help="text per document group; NotNext segments come from the same group",
    )
    p.add_argument("--on-bad-input", choices=choices(PrepareOptions, "on_bad_input"), default=o.on_bad_input)
    _add_language_flags(p, "the manifest counts each language")
    p.add_argument(
        "--split-by-language",
        action="store_true",
        help="write OUTPUT/<language>/, one complete shard set per language, each a source for data.sources",
    )
    p.add_argument("--no-progress", action="store_false", dest="progress")
    p.set_defaults(
        func=_run_prepare,
        interrupted="the finished parts are kept in OUTPUT/.work: the same command continues from them",
    )


PREPARE_CONVERTED = {"group_mb": "group_bytes", "dupe_factor": "dupe_factor"}
"""`prepare` flags (by dest) whose value `prepare_options` converts for its field: MB to bytes, and a dupe factor
that defaults by --masking. Every other flag's dest is its PrepareOptions or InstanceOptions field."""
PREPARE_NOT_FLAGS = ("band_shards", "unit_bytes", "endpoint_url", "mask_token_fraction", "random_token_fraction")
"""Fields deliberately without a flag: the driver's tuning, the store's endpoint (AWS_ENDPOINT_URL_S3), and the
paper's 80/10/10 split of the masked tokens."""


def prepare_options(args: argparse.Namespace) -> PrepareOptions:
    """The options of `bertdist prepare`, each field from its flag (bertdist.flags), PREPARE_CONVERTED converted."""
    default_dupes = 1 if args.masking == "dynamic" else InstanceOptions.dupe_factor
    instances = from_args(
        InstanceOptions, args, dupe_factor=default_dupes if args.dupe_factor is None else args.dupe_factor
    )
    group_bytes = int(args.group_mb * (1 << 20)) if 0 < args.group_mb < 1 << 20 else 0  # validation names the flag
    return from_args(PrepareOptions, args, instances=instances, group_bytes=group_bytes)


def _run_prepare(args: argparse.Namespace) -> int:
    from bertdist.data.pipeline.driver import prepare
    from bertdist.data.pipeline.report import summary_text

    print(summary_text(prepare(prepare_options(args))))
    return 0


def add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help="statistics and decoded examples of prepared shards",
        description="Counts, length histogram, mask and NSP statistics, checksums, and a few decoded examples.",
    )
    p.add_argument("dir", help="a directory written by `bertdist prepare`")
    p.add_argument("--examples", type=int, default=3, help="decoded examples to print")
    p.add_argument(
        "--vocab", help="vocab.txt or tokenizer.json for decoding (default: the one recorded in the manifest)"
    )
    p.set_defaults(func=_run_inspect)


def _run_inspect(args: argparse.Namespace) -> int:
    from bertdist.data.inspect import inspect_directory

    print(inspect_directory(args.dir, examples=args.examples, vocab_file=args.vocab))
    return 0
