"""A deterministic generator of English-like documents, for tests, benchmarks and the demo.

Not language: sentences are drawn from a fixed list of common English words plus invented longer words
(so WordPiece produces `##` pieces), with a Zipf-like word frequency, sentence lengths of 4-40 words and
documents of 1-40 sentences, which is close to Wikipedia's shape. What matters for the pipeline is the
shape (tokens per sentence, sentences per document), not the meaning.
"""

from __future__ import annotations

import os

import numpy as np

_COMMON = (
    "the of and to in a is that for it as was with be by on not he i this are or his from at which but have an "
    "they you were her she there been one all we their has would when if so no will more can out other who what "
    "about up into time only some could them new see these two may first then do any like my now over such our "
    "man me even most made after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still own see men work long "
    "get here between both life being under never day same another know while last might us great old year off "
    "come since against go came right used take three city river music history school war team game film album "
    "species village station county church league season party family company government system water power"
).split()
_SYLLABLES = "ka ro mi tan ver sol bri den ul phor ga ne stra lo vi cen tor mar eth qui lun dra".split()


def _vocabulary(rng: np.random.Generator, invented: int = 1500) -> list[str]:
    words = list(dict.fromkeys(_COMMON))
    for _ in range(invented):
        words.append("".join(rng.choice(_SYLLABLES, size=int(rng.integers(2, 5)))))
    return words


def generate_documents(num_documents: int, seed: int = 0) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    words = _vocabulary(np.random.default_rng(1234))
    cdf = np.cumsum(1.0 / np.arange(1, len(words) + 1) ** 1.05)
    documents = []
    for _ in range(num_documents):
        lengths = rng.integers(4, 41, size=int(rng.integers(1, 41)))
        drawn = np.searchsorted(cdf, rng.random(int(lengths.sum())) * cdf[-1]).tolist()
        ends = rng.choice([".", ".", ".", "?", "!"], size=len(lengths)).tolist()
        sentences, k = [], 0
        for length, end in zip(lengths.tolist(), ends):
            sentence = " ".join(words[w] for w in drawn[k : k + length])
            sentences.append(sentence[0].upper() + sentence[1:] + end)
            k += length
        documents.append(sentences)
    return documents


def write_corpus(directory: str, num_files: int, documents_per_file: int, seed: int = 0) -> list[str]:
    """Files in the classic format (one sentence per line, blank line between documents); returns their paths."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i in range(num_files):
        path = os.path.join(directory, f"part-{i:03d}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n\n".join("\n".join(doc) for doc in generate_documents(documents_per_file, seed * 1000 + i)))
            f.write("\n")
        paths.append(path)
    return paths
