"""Downstream tasks made from raw text, to judge a pretraining run where no labelled data exists (the demo,
the tests), one per kind of `bertdist finetune` task. Each reads documents from JSON lines ({"text": ...}).

- `sentence_adjacency` (classification, TSV): pairs of sentences, labelled `next` when the second follows
  the first in a document and `random` when it comes from another document, half and half. It is the task
  BERT's next-sentence objective rehearses, so an encoder pretrained with NSP should beat the same
  architecture from random initialisation by a clear margin after a short fine-tuning; on a model whose
  pretraining failed, it does not. An MLM-only encoder (ModernBERT, the fast recipe) gains little on it at the
  demo's size: ModernBERT-tiny at BERT-Tiny's pretraining budget gained +0.02 on average over two seeds, within
  the noise of 1,000 dev pairs (docs/model.md).
- `next_sentence_choice` (multiple choice, CSV): a sentence and four candidate continuations, one of them
  the sentence that really follows it (SWAG's shape).
- `code_entities` (token classification, CoNLL): the words of sentences, with BIO tags for spans of
  code-like words (identifiers with `_`, `.` or `()`) and capitalised names inside a sentence.
- `span_questions` (question answering, SQuAD JSON): a passage of a few sentences and the question
  `What follows "<a phrase of the passage>"?`, answered by the next words of the passage; with
  `unanswerable` > 0, that share of questions asks about a phrase from another document (v2.0).
- `query_passages` (embedding, JSON lines): a sentence of a document as the query, the rest of the document as
  its positive passage, and another document as a hard negative.
- `held_out_retrieval` (`bertdist evaluate --suite retrieval`, a BEIR collection): every document is a
  passage; a query is a sentence taken out of its document, whose passage (the rest of it) is the one relevant.
  Its writer, `write_held_out`, also writes `bertdist pairs`'s dev collection (bertdist.finetune.pairs).
"""

from __future__ import annotations

import csv
import glob
import json
import os
import random
import re
import shutil
from pathlib import Path

from bertdist import storage
from bertdist.data.sentences import split_sentences

MIN_CHARS, MAX_CHARS = 20, 300


def sentence_adjacency(jsonl_file: str | Path, output_file: str | Path, rows: int, seed: int) -> int:
    """Write `rows` labelled pairs from the documents of `jsonl_file` as a TSV."""
    rng, documents = random.Random(seed), _documents(jsonl_file)
    lines = ["sentence1\tsentence2\tlabel"]
    for _ in range(rows):
        doc, i = _sentence(rng, documents)
        if rng.random() < 0.5:
            second, label = documents[doc][i + 1], "next"
        else:
            second, label = rng.choice(documents[_other(rng, documents, doc)]), "random"
        lines.append(f"{documents[doc][i]}\t{second}\t{label}")
    Path(output_file).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return rows


def next_sentence_choice(
    jsonl_file: str | Path, output_file: str | Path, rows: int, seed: int, choices: int = 4
) -> int:
    """Write `rows` questions: a sentence, `choices` endings (one is the next sentence), the right index."""
    rng, documents = random.Random(seed), _documents(jsonl_file)
    with open(output_file, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["context", *(f"ending{c}" for c in range(choices)), "label"])
        for _ in range(rows):
            doc, i = _sentence(rng, documents)
            endings = [rng.choice(documents[_other(rng, documents, doc)]) for _ in range(choices - 1)]
            label = rng.randrange(choices)
            endings.insert(label, documents[doc][i + 1])
            writer.writerow([documents[doc][i], *endings, label])
    return rows


CODE_WORD = re.compile(r"^[A-Za-z_][\w.]*(\(\))?$")


def code_entities(jsonl_file: str | Path, output_file: str | Path, sentences: int, seed: int) -> int:
    """Write `sentences` tagged sentences in CoNLL form (word, tag); tags B-/I-CODE, B-/I-NAME and O."""
    rng, documents = random.Random(seed), _documents(jsonl_file)
    blocks = []
    for _ in range(sentences):
        doc, i = _sentence(rng, documents)
        words = documents[doc][i].split()
        tags, previous = [], "O"
        for position, word in enumerate(words):
            bare = word.rstrip(",;:")
            if CODE_WORD.match(bare) and ("_" in bare or "." in bare.strip(".") or bare.endswith("()")):
                kind = "CODE"
            elif position > 0 and bare[:1].isupper() and bare.isalpha():
                kind = "NAME"
            else:
                kind = ""
            tag = "O" if not kind else ("I-" if previous.endswith(kind) else "B-") + kind
            tags.append(tag)
            previous = tag
        blocks.append("\n".join(f"{w} {t}" for w, t in zip(words, tags)))
    Path(output_file).write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    return sentences


def span_questions(
    jsonl_file: str | Path,
    output_file: str | Path,
    questions: int,
    seed: int,
    unanswerable: float = 0.0,
    passage_sentences: int = 3,
    phrase_words: int = 3,
    answer_words: int = 2,
) -> int:
    """Write `questions` SQuAD questions whose answers are the words after a phrase of their passage."""
    rng, documents = random.Random(seed), _documents(jsonl_file)
    paragraphs = []
    for q in range(questions):
        words: list = []
        while len(words) < phrase_words + answer_words:  # a passage long enough to ask about
            doc = rng.randrange(len(documents))
            first = rng.randrange(max(1, len(documents[doc]) - passage_sentences + 1))
            context = " ".join(documents[doc][first : first + passage_sentences])
            words = [(m.start(), m.group()) for m in re.finditer(r"\S+", context)]
        qa: dict = {"id": f"q{q}"}
        if rng.random() < unanswerable:
            other = rng.choice(documents[_other(rng, documents, doc)]).split()
            phrase = " ".join(other[:phrase_words])
            qa.update(answers=[], is_impossible=True)
        else:
            at = rng.randrange(len(words) - phrase_words - answer_words + 1)
            phrase = " ".join(w for _, w in words[at : at + phrase_words])
            start = words[at + phrase_words][0]
            last_start, last = words[at + phrase_words + answer_words - 1]
            qa.update(
                answers=[{"text": context[start : last_start + len(last)], "answer_start": start}], is_impossible=False
            )
        qa["question"] = f'What follows "{phrase}"?'
        paragraphs.append({"context": context, "qas": [qa]})
    Path(output_file).write_text(
        json.dumps(
            {"version": "v2.0" if unanswerable else "1.1", "data": [{"title": "corpus", "paragraphs": paragraphs}]},
            indent=1,
        )
    )
    return questions


def query_passages(jsonl_file: str | Path, output_file: str | Path, rows: int, seed: int) -> int:
    """Write `rows` {query, passage, negative} objects: a sentence, the rest of its document, another document."""
    rng, documents = random.Random(seed), _documents(jsonl_file)
    pairs: list[dict] = []
    while len(pairs) < rows:
        doc = rng.randrange(len(documents))
        held_out = rng.randrange(len(documents[doc]))
        sentences = documents[doc]
        pair = {
            "query": sentences[held_out],
            "passage": " ".join(s for i, s in enumerate(sentences) if i != held_out),
            "negative": " ".join(documents[_other(rng, documents, doc)]),
        }
        if pair["passage"] not in (pair["query"], pair["negative"]):  # a document of two equal sentences, ...
            pairs.append(pair)
    _write_jsonl(Path(output_file), pairs)
    return rows


def held_out_retrieval(jsonl_file: str | Path, output_dir: str | Path, queries: int, seed: int) -> int:
    """Write corpus.jsonl, queries.jsonl and qrels/test.tsv: `queries` sentences held out of as many documents."""
    rng, documents = random.Random(seed), _documents(jsonl_file)
    if queries > len(documents):
        raise ValueError(f"{jsonl_file}: {queries} queries asked of {len(documents)} documents")
    held_out = {doc: rng.randrange(len(documents[doc])) for doc in rng.sample(range(len(documents)), queries)}
    write_held_out(output_dir, "test", documents, held_out)
    return queries


def write_held_out(output_dir: str | Path, split: str, documents: list[list[str]], held_out: dict[int, int]) -> None:
    """A collection in BEIR's layout (bertdist.finetune.beir) from the sentences of `documents`: every document is
    the passage `d<doc>`; each `doc: sentence` of `held_out` (in its order) is the query `q<doc>`, that sentence,
    taken out of its passage, which is its one relevant passage (qrels/SPLIT.tsv). Each file is written whole or
    not at all (bertdist.storage: a URL too), and a local directory as a whole: written aside and renamed in, so that
    an interrupted rewrite never leaves one version's corpus beside another's queries."""
    if storage.is_url(str(output_dir)):
        _write_collection(str(output_dir), split, documents, held_out)
        return
    out = Path(output_dir)
    for prefix in (out.name, f"{out.name}.old"):  # what a writer killed mid-write or mid-rename left
        for stale in out.parent.glob(f"{glob.escape(prefix)}{storage.PARTIAL_MARKER}*"):
            shutil.rmtree(stale, ignore_errors=True)
    staging = out.with_name(f"{out.name}{storage.PARTIAL_MARKER}{os.getpid()}")
    _write_collection(str(staging), split, documents, held_out)
    storage.replace_directory(out, staging)


def _write_collection(output_dir: str, split: str, documents: list[list[str]], held_out: dict[int, int]) -> None:
    qrels = storage.join(str(output_dir), "qrels")
    storage.makedirs(qrels)
    passages = [
        " ".join(s for i, s in enumerate(sentences) if i != held_out.get(doc))
        for doc, sentences in enumerate(documents)
    ]
    _write_jsonl(
        storage.join(str(output_dir), "corpus.jsonl"),
        [{"_id": f"d{doc}", "title": "", "text": text} for doc, text in enumerate(passages)],
    )
    _write_jsonl(
        storage.join(str(output_dir), "queries.jsonl"),
        [{"_id": f"q{doc}", "text": documents[doc][i]} for doc, i in held_out.items()],
    )
    storage.write_text(
        storage.join(qrels, f"{split}.tsv"),
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{doc}\td{doc}\t1\n" for doc in held_out),
    )


def _write_jsonl(path: str | Path, rows: list[dict]) -> None:
    storage.write_text(path, "".join(json.dumps(row) + "\n" for row in rows))


def _documents(jsonl_file: str | Path) -> list[list[str]]:
    """The sentences of every document with two or more of a usable length."""
    documents = []
    with open(jsonl_file, encoding="utf-8") as f:
        for line in f:
            sentences = [" ".join(s.split()) for s in split_sentences(json.loads(line)["text"])]
            sentences = [s for s in sentences if MIN_CHARS <= len(s) <= MAX_CHARS]
            if len(sentences) >= 2:
                documents.append(sentences)
    if len(documents) < 2:
        raise ValueError(f"{jsonl_file}: fewer than two documents with two sentences")
    return documents


def _sentence(rng: random.Random, documents: list[list[str]]) -> tuple[int, int]:
    """A document and one of its sentences that has a next one."""
    doc = rng.randrange(len(documents))
    return doc, rng.randrange(len(documents[doc]) - 1)


def _other(rng: random.Random, documents: list[list[str]], doc: int) -> int:
    """Any document but `doc`."""
    other = rng.randrange(len(documents) - 1)
    return other + (other >= doc)
