"""The suite's tiny corpus, vocabulary and shards, and `python -m tests.prepared DIR`, which writes the vocabulary
and shards into DIR once (local Ray) so that a machine without Ray runs the tests that read them: the GPU tests of
`make gpu-check` on a machine that has torch and DeepSpeed only (set BERTDIST_TEST_PREPARED=DIR there)."""

from __future__ import annotations

import sys
from pathlib import Path


def write_tiny_corpus(directory: Path) -> str:
    """4 English-like .txt files (one sentence per line, blank line between documents)."""
    from bertdist.data.synthetic import write_corpus

    write_corpus(str(directory), num_files=4, documents_per_file=40, seed=7)
    return str(directory)


def write_tiny_vocab(corpus: str, directory: Path) -> str:
    """vocab.txt of TEST_VOCAB_SIZE WordPiece tokens trained on `corpus` (uncased)."""
    from bertdist.data.readers import expand_inputs, iter_texts
    from bertdist.data.vocab import train_vocab
    from tests.conftest import TEST_VOCAB_SIZE

    return train_vocab(iter_texts(expand_inputs([corpus])), str(directory), vocab_size=TEST_VOCAB_SIZE)


def main(directory: str) -> None:
    import ray

    from bertdist.data.pipeline.driver import prepare
    from bertdist.data.pipeline.ray_tasks import start_local_ray
    from tests.conftest import tiny_prepare_options

    out = Path(directory)
    corpus = write_tiny_corpus(out / "corpus")
    vocab = write_tiny_vocab(corpus, out)
    start_local_ray(num_cpus=2)
    try:
        prepare(tiny_prepare_options(corpus, vocab, str(out / "train")))
    finally:
        ray.shutdown()
    print(f"tiny vocab and shards in {out}: BERTDIST_TEST_PREPARED={out}")


if __name__ == "__main__":
    main(sys.argv[1])
