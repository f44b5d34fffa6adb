"""Unigram with byte fallback: training a tokenizer.json as XLM-R's and Gemma's are built (`bertdist vocab
--model unigram`), for multilingual corpora.

The pipeline is SentencePiece's, as `tokenizers` implements it: NFKC normalisation, the Metaspace pre-tokenizer
(a word starts with `▁`, which is also how `bertdist.data.tokenizer` finds word starts for whole-word masking),
and a Unigram language model over pieces. With byte fallback (Gemma's and Llama's choice, not XLM-R's) a character
no piece covers is spelled as its UTF-8 bytes, `<0xE6><0x97><0xA5>`, instead of becoming [UNK]: a language the
training text barely had still reaches the model as bytes. The 256 byte pieces go after the trained pieces, so
`--vocab-size` counts them (the Unigram pieces are 256 fewer); they are plain pieces, not special tokens, so a
decode that skips special tokens keeps them. BERT's special tokens and templates come first as in
`bertdist vocab`'s other models ([PAD] at id 0).

Lower-cased unless `cased`, the same --cased as WordPiece and BPE.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from bertdist.data.bpe import save_trained
from bertdist.data.vocab import SPECIAL_TOKENS

BYTE_PIECES = [f"<0x{byte:02X}>" for byte in range(256)]
"""SentencePiece's names for the byte pieces, which the ByteFallback decoder turns back into bytes."""
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + len(BYTE_PIECES) + 100
"""The special tokens, every byte, and a hundred pieces to learn (Unigram's trainer needs some room)."""


def train_unigram(
    texts: Iterable[str], output_dir: str, vocab_size: int, cased: bool = False, progress: bool | None = None
) -> str:
    """Train on a stream of texts; writes tokenizer.json, tokenizer_config.json and special_tokens_map.json and
    returns the tokenizer.json. `progress` (default: when stderr is a terminal) shows tokenizers' progress bars."""
    tokenizer = Tokenizer(models.Unigram())
    nfkc = normalizers.NFKC()
    tokenizer.normalizer = nfkc if cased else normalizers.Sequence([nfkc, normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size - len(BYTE_PIECES),
        special_tokens=SPECIAL_TOKENS,
        unk_token="[UNK]",
        show_progress=sys.stderr.isatty() if progress is None else progress,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    spec = json.loads(tokenizer.to_str())
    pieces = {piece for piece, _ in spec["model"]["vocab"]}
    spec["model"]["vocab"] += [[piece, 0.0] for piece in BYTE_PIECES if piece not in pieces]
    spec["model"]["byte_fallback"] = True
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return save_trained(tokenizer, output_dir)
