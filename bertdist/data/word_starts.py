"""Which tokens start a word, for whole-word and span masking (bertdist.data.masking), by the tokenizer's kind:
- WordPiece: every token but a `##` continuation (a continuation in a script without spaces, below, too).
- Byte-level BPE (GPT-2, RoBERTa, ModernBERT, `bertdist vocab --model bpe`): a token that starts with the
  byte-level space marker `Ġ`, i.e. one that begins after a space. Punctuation is pre-tokenized apart but
  carries no space, so "cat," is one word (`cat` + `,`) and "(cat" too (`Ġ(` + `cat`). The first word of a text
  has a `Ġ` only when the pre-tokenizer adds a prefix space (`add_prefix_space`, which `bertdist vocab --model
  bpe` sets); without it (ModernBERT's own tokenizer) a sentence's first word joins the word before it, except
  right after [CLS] or [SEP], where the masker starts a word anyway.
- SentencePiece-style Metaspace tokenizers: a token that starts with its `▁` replacement.
- Any other model: every token is a word of its own (whole-word masking becomes token masking).
Special tokens always start a word. So does a token that begins with a character of a script written without
spaces (UNSPACED_SCRIPTS: CJK ideographs, kana, Thai, Lao, Khmer, Myanmar): a byte-level BPE or a Metaspace model
puts its space marker at a sentence's start only, and BERT's tokenizer splits CJK ideographs but not the others
(a Thai phrase is one piece and its `##` continuations), so a whole Chinese or Thai sentence or phrase was one
"word", over a sample's budget, and whole-word masking masked nothing in it (Thai under WordPiece: 10.6% of tokens
masked for 15%). A CJK ideograph is then a word, as BERT's tokenizer makes it one; in the other scripts, which
mark no word boundary at all, a token is. (Google's script treats every `##` token as a continuation: this is
where bertdist departs from it, for such scripts only.)
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np

BYTE_LEVEL_SPACE = "Ġ"
"""How byte-level BPE spells a space: the byte 0x20 mapped to a printable character (GPT-2's byte-to-unicode)."""


def of_tokenizer_json(spec: dict, tokens: list[str]) -> np.ndarray:
    """Which tokens of a tokenizer.json (`spec`, its tokens by id) start a word, by its model and pre-tokenizer."""
    prefix = (spec.get("model") or {}).get("continuing_subword_prefix")
    pre = json.dumps(spec.get("pre_tokenizer"))
    if prefix:
        return of_wordpiece(tokens, prefix)
    if '"ByteLevel"' in pre:
        text = _byte_level_text
        return np.array([t.startswith(BYTE_LEVEL_SPACE) or _unspaced(text(t)) for t in tokens], dtype=bool)
    if '"Metaspace"' in pre:
        replacement = find_component(spec.get("pre_tokenizer"), "Metaspace").get("replacement", "▁")
        return np.array([t.startswith(replacement) or _unspaced(t) for t in tokens], dtype=bool)
    return np.ones(len(tokens), dtype=bool)


def of_wordpiece(tokens: list[str], prefix: str = "##") -> np.ndarray:
    """Which WordPiece tokens start a word: those without the continuation `prefix`, and continuations in a script
    without spaces."""
    return np.array([not t.startswith(prefix) or _unspaced(t[len(prefix) :]) for t in tokens], dtype=bool)


UNSPACED_SCRIPTS = (
    (0x0E00, 0x0EFF),  # Thai, Lao
    (0x1000, 0x109F),  # Myanmar
    (0x1780, 0x17FF),  # Khmer
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3400, 0x4DBF),  # CJK ideographs: BERT's _is_chinese_char ranges from here on
    (0x4E00, 0x9FFF),
    (0xF900, 0xFAFF),
    (0x20000, 0x2FA1F),
)
"""Code points of scripts written without spaces between words (see the module docstring)."""


def _unspaced(text: str) -> bool:
    """Whether `text` begins with a character of UNSPACED_SCRIPTS."""
    if not text:
        return False
    point = ord(text[0])
    return any(low <= point <= high for low, high in UNSPACED_SCRIPTS)


@functools.cache
def _byte_of_char() -> dict[str, int]:
    """The byte-level alphabet's inverse (GPT-2's table): printable Latin-1 bytes stand for themselves, the other
    bytes for the characters from U+0100 on, in byte order."""
    kept = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    moved = [b for b in range(256) if b not in kept]
    return {**{chr(b): b for b in kept}, **{chr(0x100 + i): b for i, b in enumerate(moved)}}


def _byte_level_text(token: str) -> str:
    """The text a byte-level token's first bytes spell ("" where they do not begin a whole character)."""
    table = _byte_of_char()
    data = bytes(table[c] for c in token[:4] if c in table)
    text = data.decode("utf-8", errors="replace")
    return "" if text.startswith("\ufffd") else text


def find_component(node: Any, kind: str) -> dict:
    """The first component of type `kind` in a (possibly nested Sequence) pre-tokenizer spec."""
    if isinstance(node, dict):
        if node.get("type") == kind:
            return node
        for child in node.get("pretokenizers", []):
            found = find_component(child, kind)
            if found:
                return found
    return {}
