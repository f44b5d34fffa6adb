"""`bertdist pairs`: (query, positive) pairs mined from a corpus without labels, for the weakly-supervised
contrastive pretraining stage of an embedding model (as GTE and E5 begin), and a held-out dev collection to score
that training on.

Every pair comes from one document of the corpus `bertdist prepare` reads (bertdist.data.readers), of a kind:
- `neighbour`: the passage that ends at a sentence boundary and the passage that starts there, each the longest
  run of whole sentences of at most `passage_words` words beside the boundary;
- `first-sentence`: the document's first sentence (a title or lead) and the passage that follows it;
- `spans`: two random, non-overlapping runs of words of the document (`MIN_SPAN_WORDS` to `passage_words` each,
  across sentence boundaries), in random order: contrastive span sampling (DeCLUTR, Contriever's crops).
A sentence longer than `passage_words` is cut to that many words (the ones next to the boundary). Texts are
whitespace-normalised; a pair whose two texts are the same is never written. A document that gives no pair of a
kind is counted under that kind with the reason, and the counts are reported.

Same corpus, options and seed, same bytes: each document's pairs of each kind come from a generator seeded by
the seed, the kind and the document's position in the corpus, so they do not depend on the other kinds asked
for or on which documents are held out. Pairs are written as documents are read (only held-out documents are
kept in memory), to a file that appears whole or not at all. With `dev_documents` the corpus is read twice: once
to count the documents that can be held out, so that the dev documents are drawn from all of them before any
pair is mined, and no training pair comes from one.

It mines without a model: `bertdist filter-pairs` (bertdist.finetune.consistency) then keeps the pairs a model
ranks consistently (E5's filter), and `bertdist finetune finetune.task=embedding finetune.text_column=query
finetune.text_pair_column=positive` trains on them.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from typing import Callable, Iterator

from bertdist import storage
from bertdist.data.readers import InputFile, expand_inputs, iter_documents
from bertdist.errors import DataError, UserError
from bertdist.finetune.corpus_tasks import write_held_out

KINDS = ("neighbour", "first-sentence", "spans")
MIN_SPAN_WORDS = 8
"""The shortest span (or `passage_words`, where that is fewer): a shorter run of words seldom says what its
document is about."""
DEV_SPLIT = "dev"
SAME_TEXT = "query = positive"


@dataclass(frozen=True)
class PairsOptions:
    inputs: list[str]
    """Corpus files, directories or globs (.txt, .jsonl, .xml, optionally .gz/.bz2), local or URLs."""
    output: str
    """The pairs, JSON lines: {"query", "positive", "kind"}."""
    kinds: tuple[str, ...] = KINDS
    """Which pairs to mine (any of KINDS); written in KINDS's order whatever the order given."""
    per_document: int = 1
    """At most this many pairs of each kind from one document."""
    passage_words: int = 128
    """The longest passage or span, in whitespace-separated words (about 1.3 WordPiece tokens each)."""
    seed: int = 0
    dev_dir: str = ""
    """Where to write the held-out documents as a BEIR collection (corpus.jsonl, queries.jsonl, qrels/dev.tsv)."""
    dev_documents: int = 0
    """How many documents to hold out into `dev_dir`."""


@dataclass
class PairsSummary:
    documents: int = 0
    """Read from the corpus, the held-out ones included."""
    held_out: int = 0
    pairs: dict[str, int] = field(default_factory=dict)
    """Pairs written, by kind."""
    skipped: dict[str, dict[str, int]] = field(default_factory=dict)
    """kind -> reason -> documents that gave no pair of that kind."""
    without_text: int = 0
    """Documents of the input without text (an empty JSON 'text'): left out, counted."""
    repeated: dict[str, int] = field(default_factory=dict)
    """kind -> pairs not written because a kind before it gave the same pair from the same document (a neighbour
    pair cut after the first sentence is the first-sentence pair): written twice, they would count double."""

    def describe(self, opts: PairsOptions) -> str:
        """One line: the pairs per kind, the documents, those held out and those skipped per kind and reason."""
        kinds = ", ".join(f"{kind} {n}" for kind, n in self.pairs.items())
        held_out = f", {self.held_out} held out in {opts.dev_dir}" if self.held_out else ""
        repeated = ", ".join(f"{kind} {n}" for kind, n in self.repeated.items() if n)
        repeated = f"; pairs another kind gave, not written again: {repeated}" if repeated else ""
        empty = f" ({self.without_text} more without text left out)" if self.without_text else ""
        return (
            f"{sum(self.pairs.values())} pairs ({kinds}) from {self.documents} documents{empty}{held_out}; "
            f"documents skipped: {self.describe_skipped()}{repeated}; wrote {opts.output}"
        )

    def describe_skipped(self) -> str:
        return (
            "; ".join(
                f"{kind}: " + ", ".join(f"{n} {reason}" for reason, n in reasons.items())
                for kind, reasons in self.skipped.items()
                if reasons
            )
            or "none"
        )


def parse_kinds(text: str) -> tuple[str, ...]:
    """`--kinds`' comma-separated names, as given (`check` says which are not kinds)."""
    return tuple(k.strip() for k in text.split(",") if k.strip())


def check(opts: PairsOptions) -> None:
    """Every problem with the options at once, in one line naming each flag; before anything is read."""
    problems = []
    unknown = [k for k in opts.kinds if k not in KINDS]
    if unknown or not opts.kinds:
        given = f"{', '.join(map(repr, unknown))} is not a kind" if unknown else "none given"
        problems.append(f"--kinds: {given} (the kinds: {', '.join(KINDS)})")
    if not 1 <= opts.per_document <= 10_000:
        problems.append(f"--per-document: {opts.per_document}, must be in [1, 10000]")
    if opts.passage_words < 2:
        problems.append(f"--passage-words: {opts.passage_words}, must be at least 2")
    inputs = [source for source in opts.inputs if storage.inside(opts.output, source)]
    if inputs:
        problems.append(f"--output: {opts.output} is inside the --input {inputs[0]}; its next read would take it")
    if not opts.output.lower().endswith((".jsonl", ".json")):
        problems.append(f"--output: {opts.output} must end in .jsonl (bertdist finetune reads a file by its extension)")
    if opts.dev_documents < 0:
        problems.append(f"--dev-documents: {opts.dev_documents}, must be at least 0")
    elif bool(opts.dev_documents) != bool(opts.dev_dir):
        problems.append("--dev-dir and --dev-documents: give both to hold documents out, or neither")
    if opts.dev_dir:
        problems += _dev_dir_problems(opts)
    if problems:
        raise UserError("; ".join(problems))


COLLECTION_FILES = {"corpus.jsonl", "queries.jsonl", "qrels"}
"""What a dev collection this command wrote holds: a rerun replaces such a directory whole, and nothing else."""


def _dev_dir_problems(opts: PairsOptions) -> list[str]:
    """--dev-dir is replaced whole (bertdist.storage.replace_directory): given an input, a directory holding one,
    a file, or a directory of other files, it was replaced and they were lost (an --input file became the
    collection's directory, exit 0); given a folder inside an input, the next read took the collection for text."""
    dev, problems = opts.dev_dir, []
    overlapping = [s for s in opts.inputs if storage.inside(dev, s) or storage.inside(s, dev)]
    if overlapping:
        problems.append(f"--dev-dir: {dev} overlaps the --input {overlapping[0]}; write the collection beside it")
    elif storage.inside(opts.output, dev):
        problems.append(f"--dev-dir: {dev} holds the --output {opts.output}, which replacing it would delete")
    elif not storage.is_url(dev) and os.path.isfile(dev):
        problems.append(f"--dev-dir: {dev} is a file; the collection is a directory")
    elif not storage.is_url(dev) and os.path.isdir(dev) and set(os.listdir(dev)) - COLLECTION_FILES:
        problems.append(
            f"--dev-dir: {dev} holds other files than a dev collection ({', '.join(sorted(COLLECTION_FILES))}), "
            "which writing it would replace; choose an empty or new directory"
        )
    return problems


def mine_pairs(opts: PairsOptions) -> PairsSummary:
    """Write the pairs of `opts.inputs` to `opts.output` (and the dev collection); DataError for bad input, a
    dev set larger than the documents that can be held out, or no pair at all."""
    check(opts)
    files = expand_inputs(opts.inputs)
    held_out = _draw_dev(files, opts) if opts.dev_documents else set()
    kinds = [k for k in KINDS if k in opts.kinds]
    summary = PairsSummary(pairs={k: 0 for k in kinds}, skipped={k: {} for k in kinds}, repeated={k: 0 for k in kinds})
    dev: list[list[str]] = []
    dev_queries: dict[int, int] = {}
    usable = 0  # documents that can be held out, counted as `_draw_dev` counts them
    storage.makedirs(os.path.dirname(opts.output) or ".")
    with storage.atomic_write(opts.output) as out:
        for ordinal, sentences in enumerate(_documents(files, summary)):
            summary.documents += 1
            query = _dev_query(sentences, opts.seed, ordinal) if held_out else None
            if query is not None:
                usable += 1
                if usable - 1 in held_out:
                    dev_queries[len(dev)] = query
                    dev.append(sentences)
                    continue
            written: set[tuple[str, str]] = set()
            for kind in kinds:
                pairs, reason = _mine(kind, sentences, random.Random(f"{opts.seed}/{kind}/{ordinal}"), opts)
                if reason:
                    summary.skipped[kind][reason] = summary.skipped[kind].get(reason, 0) + 1
                new = [pair for pair in pairs if pair not in written]
                summary.repeated[kind] += len(pairs) - len(new)
                written.update(new)
                pairs = new
                for query_text, positive in pairs:
                    out.write(
                        json.dumps({"query": query_text, "positive": positive, "kind": kind}, ensure_ascii=False) + "\n"
                    )
                summary.pairs[kind] += len(pairs)
        if held_out and len(dev) != len(held_out):
            raise DataError(f"{', '.join(opts.inputs)}: changed while it was read (its documents differ between reads)")
        if not sum(summary.pairs.values()):
            raise DataError(
                f"{', '.join(opts.inputs)}: no pair mined from {summary.documents} documents"
                + (f" ({len(dev)} held out)" if dev else "")
                + f"; documents skipped: {summary.describe_skipped()}"
            )
        if dev:
            write_held_out(opts.dev_dir, DEV_SPLIT, dev, dev_queries)
            summary.held_out = len(dev)
    return summary


def _documents(files: list[InputFile], summary: PairsSummary | None = None) -> Iterator[list[str]]:
    """Each document's sentences, whitespace-normalised; a document without text is counted in `summary` (they
    went unsaid: 3 of 5 documents read, "documents skipped: none")."""
    for sentences in iter_documents(files, keep_empty=True):
        if not sentences:
            if summary is not None:
                summary.without_text += 1
            continue
        yield [" ".join(s.split()) for s in sentences]


def _draw_dev(files: list[InputFile], opts: PairsOptions) -> set[int]:
    """The dev documents, by their rank among the documents that can be held out (a first read counts these)."""
    usable = sum(
        _dev_query(sentences, opts.seed, ordinal) is not None for ordinal, sentences in enumerate(_documents(files))
    )
    if opts.dev_documents > usable:
        raise UserError(
            f"--dev-documents: {opts.dev_documents} asked, but {', '.join(opts.inputs)} has {usable} documents "
            "that can be held out (two sentences or more, the rest of it not the same text as the sentence)"
        )
    return set(random.Random(f"{opts.seed}/{DEV_SPLIT}").sample(range(usable), opts.dev_documents))


def _dev_query(sentences: list[str], seed: int, ordinal: int) -> int | None:
    """The sentence of a document that would be its dev query, or None where it cannot be one (one sentence, or
    a rest that is the same text)."""
    if len(sentences) < 2:
        return None
    i = random.Random(f"{seed}/{DEV_SPLIT}/{ordinal}").randrange(len(sentences))
    return None if " ".join(s for j, s in enumerate(sentences) if j != i) == sentences[i] else i


def _mine(kind: str, sentences: list[str], rng: random.Random, opts: PairsOptions) -> tuple[list[tuple[str, str]], str]:
    """The distinct pairs of one kind from one document, and why there are none ('' when there are)."""
    candidates, too_short = MINERS[kind](sentences, rng, opts.per_document, opts.passage_words)
    pairs = list(dict.fromkeys((q, p) for q, p in candidates if q != p))
    if pairs:
        return pairs, ""
    return [], SAME_TEXT if candidates else too_short


def _neighbours(
    sentences: list[str], rng: random.Random, per_document: int, passage_words: int
) -> tuple[list[tuple[str, str]], str]:
    boundaries = sorted(rng.sample(range(1, len(sentences)), min(per_document, len(sentences) - 1)))
    return [
        (_passage(sentences[:b], passage_words, backwards=True), _passage(sentences[b:], passage_words))
        for b in boundaries
    ], "one sentence"


def _first_sentence(
    sentences: list[str], rng: random.Random, per_document: int, passage_words: int
) -> tuple[list[tuple[str, str]], str]:
    lead = [(_passage(sentences[:1], passage_words), _passage(sentences[1:], passage_words))]
    return lead if len(sentences) > 1 else [], "one sentence"


def _spans(
    sentences: list[str], rng: random.Random, per_document: int, passage_words: int
) -> tuple[list[tuple[str, str]], str]:
    words = " ".join(sentences).split()
    shortest = min(MIN_SPAN_WORDS, passage_words)
    pairs = []
    for _ in range(per_document if len(words) >= 2 * shortest else 0):
        first_length = rng.randint(shortest, min(passage_words, len(words) - shortest))
        second_length = rng.randint(shortest, min(passage_words, len(words) - first_length))
        # the words outside the spans, cut in three gaps (before, between, after) at two uniform points
        free = len(words) - first_length - second_length
        start, gap_end = sorted((rng.randint(0, free), rng.randint(0, free)))
        second_start = gap_end + first_length
        first = " ".join(words[start : start + first_length])
        second = " ".join(words[second_start : second_start + second_length])
        pairs.append((first, second) if rng.random() < 0.5 else (second, first))
    return pairs, f"under {2 * shortest} words"


Miner = Callable[[list[str], random.Random, int, int], tuple[list[tuple[str, str]], str]]
"""(sentences, generator, per_document, passage_words) -> (candidate pairs, why a document gives none)."""
MINERS: dict[str, Miner] = {"neighbour": _neighbours, "first-sentence": _first_sentence, "spans": _spans}


def _passage(sentences: list[str], max_words: int, backwards: bool = False) -> str:
    """The longest run of whole sentences from the start of `sentences` (the end, `backwards`) of at most
    `max_words` words; a first sentence longer than that is cut to its `max_words` words on that side."""
    taken: list[str] = []
    words = 0
    for sentence in reversed(sentences) if backwards else sentences:
        length = len(sentence.split())
        if taken and words + length > max_words:
            break
        taken.append(sentence)
        words += length
    text = " ".join(reversed(taken) if backwards else taken).split()
    return " ".join(text[-max_words:] if backwards else text[:max_words])
