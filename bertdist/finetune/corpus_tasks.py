"""A downstream task made from raw text, to judge a pretraining run where no labelled data exists (the demo).

`sentence_adjacency`: pairs of sentences, labelled `next` when the second follows the first in a document
and `random` when it comes from another document, half and half. It is the task BERT's next-sentence
objective rehearses, so a pretrained encoder should beat the same architecture from random initialisation
by a clear margin after a short fine-tuning; on a model whose pretraining failed, it does not.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from bertdist.data.sentences import split_sentences

MIN_CHARS, MAX_CHARS = 20, 300


def sentence_adjacency(jsonl_file: str | Path, output_file: str | Path, rows: int, seed: int) -> int:
    """Write `rows` labelled pairs from the documents of `jsonl_file` ({"text": ...} per line) as a TSV."""
    rng = random.Random(seed)
    documents = []
    with open(jsonl_file, encoding="utf-8") as f:
        for line in f:
            sentences = [" ".join(s.split()) for s in split_sentences(json.loads(line)["text"])]
            sentences = [s for s in sentences if MIN_CHARS <= len(s) <= MAX_CHARS]
            if len(sentences) >= 2:
                documents.append(sentences)
    if len(documents) < 2:
        raise ValueError(f"{jsonl_file}: fewer than two documents with two sentences")
    lines = ["sentence1\tsentence2\tlabel"]
    for _ in range(rows):
        doc = rng.randrange(len(documents))
        i = rng.randrange(len(documents[doc]) - 1)
        if rng.random() < 0.5:
            second, label = documents[doc][i + 1], "next"
        else:
            other = rng.randrange(len(documents) - 1)
            other += other >= doc  # any document but this one
            second, label = rng.choice(documents[other]), "random"
        lines.append(f"{documents[doc][i]}\t{second}\t{label}")
    Path(output_file).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return rows
