"""Byte-level BPE: training a tokenizer.json as ModernBERT's (`bertdist vocab --model bpe`).

The pipeline is ModernBERT's (GPT-2's byte-level BPE: NFC normalisation, GPT-2's pre-tokenizer regex over
bytes mapped to printable characters, so no text is ever unknown) with BERT's special tokens and templates,
[CLS] A [SEP] (B [SEP]), as ModernBERT's released tokenizer keeps them: every BERT-style stage (instances,
masking, fine-tuning) works unchanged, and `bertdist.data.tokenizer` finds them by name.

Choices that differ from ModernBERT's, and why:
- The special tokens come first, [PAD] [UNK] [CLS] [SEP] [MASK] at ids 0-4, as in `bertdist vocab`'s WordPiece.
  ModernBERT's sit last (50280-50284) only because they were appended to OLMo's existing tokenizer, whose ids
  it kept; a tokenizer trained from scratch has no ids to keep. First, they do not move when --vocab-size
  changes, and [PAD] is 0, the value the pretraining loader pads with (under attention mask 0) and the
  `pad_token_id` every exported config.json has always had. (Nothing in bertdist assumes either: the ids are
  looked up, and tests use a tokenizer with ModernBERT's layout.)
- The pre-tokenizer adds a prefix space (`add_prefix_space=True`; ModernBERT's does not): `prepare`
  tokenizes sentence by sentence, so without it a sentence's first word would be another token ("The" rather
  than "ĠThe") and would not start a word for whole-word masking.
- Lower-cased unless `cased` (ModernBERT is cased): the same --cased as WordPiece, one meaning for the flag.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)

from bertdist.data.tokenizer import (
    TOKENIZER_JSON,
    open_tokenizer,
    write_fast_tokenizer_files,
)
from bertdist.data.vocab import SPECIAL_TOKENS, bert_template

MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)
"""Every byte, and the special tokens: the smallest byte-level vocabulary."""


def train_bpe(
    texts: Iterable[str], output_dir: str, vocab_size: int, cased: bool = False, progress: bool | None = None
) -> str:
    """Train on a stream of texts; writes tokenizer.json, tokenizer_config.json and special_tokens_map.json
    (which `transformers.AutoTokenizer` loads offline) and returns the tokenizer.json.

    `progress` (default: when stderr is a terminal) shows tokenizers' progress bars."""
    tokenizer = Tokenizer(models.BPE())  # no unk_token: byte-level BPE has a token for every byte
    nfc = normalizers.NFC()
    tokenizer.normalizer = nfc if cased else normalizers.Sequence([nfc, normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=sys.stderr.isatty() if progress is None else progress,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return save_trained(tokenizer, output_dir)


def save_trained(tokenizer: Tokenizer, output_dir: str) -> str:
    """A trained tokenizer with BERT's templates, written as tokenizer.json, tokenizer_config.json and
    special_tokens_map.json (what `transformers.AutoTokenizer` loads offline); returns the tokenizer.json."""
    tokenizer.post_processor = bert_template(tokenizer)
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, TOKENIZER_JSON)
    tokenizer.save(path)
    write_fast_tokenizer_files(open_tokenizer(path), output_dir)
    return path
