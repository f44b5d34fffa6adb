"""WordPiece: training a vocabulary, and the tokenizer that `prepare` uses with it.

Both sides build the same pipeline (BERT normaliser: clean text, CJK spacing, lower-case + strip accents
unless cased; BERT pre-tokenizer; WordPiece with `##` continuations), so a vocab trained here tokenizes the
same way at preparation time. The special tokens come first, in this order, so `[PAD]` is id 0.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from bertdist.data import DataError

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _pipeline(model: models.Model, cased: bool) -> Tokenizer:
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=not cased, lowercase=not cased
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


def train_vocab(texts: Iterable[str], output_dir: str, vocab_size: int, cased: bool = False) -> str:
    """Train on a stream of texts (memory bounded by the word counts, not the corpus); returns vocab.txt."""
    tokenizer = _pipeline(models.WordPiece(unk_token="[UNK]"), cased)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, continuing_subword_prefix="##", show_progress=True
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    vocab = tokenizer.get_vocab()
    cls_id, sep_id = vocab["[CLS]"], vocab["[SEP]"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
    )
    os.makedirs(output_dir, exist_ok=True)
    vocab_file = os.path.join(output_dir, "vocab.txt")
    _write_atomic(vocab_file, "".join(t + "\n" for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])))
    tokenizer.save(os.path.join(output_dir, "tokenizer.json"))
    _write_atomic(
        os.path.join(output_dir, "tokenizer_config.json"),
        json.dumps({"do_lower_case": not cased, "tokenizer_class": "BertTokenizer"}, indent=2) + "\n",
    )
    return vocab_file


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def read_vocab(vocab_file: str) -> list[str]:
    """Tokens by id; DataError if the file is missing or lacks BERT's special tokens."""
    try:
        with open(vocab_file, encoding="utf-8") as f:
            tokens = [line.rstrip("\n") for line in f]
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{vocab_file}: cannot read vocabulary ({e})") from None
    missing = [t for t in SPECIAL_TOKENS if t not in tokens]
    if missing:
        raise DataError(f"{vocab_file}: not a BERT vocabulary, missing {' '.join(missing)}")
    return tokens


def vocab_sha256(vocab_file: str) -> str:
    with open(vocab_file, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def load_tokenizer(vocab_file: str, cased: bool) -> Tokenizer:
    """The tokenizer `prepare` uses: no special tokens added, no truncation (instances do their own)."""
    tokens = read_vocab(vocab_file)
    model = models.WordPiece({t: i for i, t in enumerate(tokens)}, unk_token="[UNK]", max_input_chars_per_word=100)
    return _pipeline(model, cased)


class WordPieceEncoder:
    """Sentences -> ids, identical to `load_tokenizer(...).encode(s, add_special_tokens=False).ids`, faster.

    Most English sentences are pure ASCII, where BERT's normaliser and pre-tokenizer reduce to "drop control
    characters, lower-case, split into alphanumeric runs and single punctuation characters" (every printable
    non-alphanumeric ASCII character is punctuation for BERT). For those, a regex split plus a per-word cache
    of WordPiece results is several times faster than the full Rust pipeline, which builds offsets and
    normalisation alignments nobody here uses. Any sentence with a non-ASCII character goes through the
    tokenizer itself, so the result is always the tokenizer's (tests/data/test_vocab.py checks both paths).
    """

    _MAX_CACHED_WORDS = 500_000

    def __init__(self, vocab_file: str, cased: bool):
        import re

        self.tokenizer = load_tokenizer(vocab_file, cased)
        self.cased = cased
        self._words = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9\s]" if cased else r"[a-z0-9]+|[^a-z0-9\s]")
        # ASCII control characters are removed by BERT's clean_text; \t \n \r are whitespace
        self._controls = {c: None for c in [*range(0, 9), 11, 12, *range(14, 32), 127]}
        self._cache: dict[str, list[int]] = {}

    def _word_ids(self, word: str) -> list[int]:
        ids = self._cache.get(word)
        if ids is None:
            if len(self._cache) >= self._MAX_CACHED_WORDS:
                self._cache.clear()
            ids = self._cache[word] = [t.id for t in self.tokenizer.model.tokenize(word)]
        return ids

    def encode(self, sentences: list[str]) -> list[list[int]]:
        out: list[list[int] | None] = []
        slow: list[int] = []
        for k, sentence in enumerate(sentences):
            if not sentence.isascii():
                slow.append(k)
                out.append(None)
                continue
            text = sentence.translate(self._controls)
            if not self.cased:
                text = text.lower()
            ids: list[int] = []
            for word in self._words.findall(text):
                ids.extend(self._word_ids(word))
            out.append(ids)
        if slow:
            for k, encoding in zip(slow, self.tokenizer.encode_batch([sentences[k] for k in slow], add_special_tokens=False)):
                out[k] = encoding.ids
        return out  # type: ignore[return-value]
