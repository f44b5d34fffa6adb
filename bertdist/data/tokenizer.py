"""The one tokenizer every stage uses (prepare, load-time masking, fine-tuning, embed, evaluate, export).

`data.vocab_file` (`--vocab`) names it: a WordPiece `vocab.txt` (what `bertdist vocab` writes by default, read
exactly as before, with the fast ASCII `WordPieceEncoder`), a `tokenizer.json` of any Hugging Face `tokenizers`
model (`bertdist vocab --model bpe`, or an imported checkpoint's), or a directory holding either (its
tokenizer.json first: a Hugging Face directory's tokenizer.json carries its normaliser, which vocab.txt cannot).

What the stages need from it, and nothing else: tokens by id, the special-token ids (looked up by name, never
assumed: ModernBERT's [CLS] [SEP] [MASK] are 50281, 50282, 50284, not BERT's 101-103), an encode without special
tokens, and which tokens start a word (whole-word masking: bertdist.data.word_starts).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from bertdist.data.vocab import (
    SPECIAL_TOKENS,
    WordPieceEncoder,
    load_tokenizer,
    read_vocab,
)
from bertdist.data.word_starts import find_component, of_tokenizer_json, of_wordpiece
from bertdist.errors import DataError, first_line
from bertdist.storage import write_json

TOKENIZER_JSON, VOCAB_TXT, TOKENIZER_CONFIG = "tokenizer.json", "vocab.txt", "tokenizer_config.json"
BERT_SPECIAL_TOKENS = dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), SPECIAL_TOKENS))
"""The names bertdist looks the special tokens up by, keyed as `transformers` names them. A tokenizer.json with a
tokenizer_config.json beside it may rename them (RoBERTa's `<s>`); ModernBERT keeps these."""


TOKENIZER_MODELS = ("wordpiece", "bpe", "unigram")
"""What `bertdist vocab --model` trains: BERT's WordPiece vocab.txt (`bertdist.data.vocab`), a byte-level BPE
tokenizer.json as ModernBERT's (`bertdist.data.bpe`), or a Unigram tokenizer.json with byte fallback as Gemma's
(`bertdist.data.unigram`)."""


def tokenizer_file(path: str | os.PathLike) -> str:
    """The file `path` names: itself, or in a directory its tokenizer.json, else its vocab.txt."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        return path
    for name in (TOKENIZER_JSON, VOCAB_TXT):
        if os.path.isfile(os.path.join(path, name)):
            return os.path.join(path, name)
    raise DataError(f"{path}: a directory with neither {TOKENIZER_JSON} nor {VOCAB_TXT}")


def is_tokenizer_json(path: str | os.PathLike) -> bool:
    return os.fspath(path).endswith(".json")


def count_tokens(path: str | os.PathLike) -> int:
    """The embedding rows the tokenizer at `path` needs (vocab.txt: its non-empty lines), without checking its
    special tokens: config validation only compares this with `model.vocab_size`."""
    file = tokenizer_file(path)
    if is_tokenizer_json(file):
        return open_tokenizer(file).size
    with open(file, encoding="utf-8") as f:
        return sum(1 for line in f if line.rstrip("\n"))


class TextTokenizer:
    """A vocab.txt or tokenizer.json, as every stage sees it; build with `open_tokenizer`."""

    def __init__(
        self,
        path: str,
        tokens: list[str],
        names: dict[str, str],
        starts_word: np.ndarray,
        cased: bool,
        backend: Tokenizer | None,
        pair_separators: int = 1,
        spaced_sentences: bool = False,
    ):
        self.path, self.tokens, self.names, self.starts_word, self.cased = path, tokens, names, starts_word, cased
        """`path`: the file itself (a directory resolved); `names`: special-token role -> its token;
        `starts_word`: bool per id (see the module docstring); `cased`: for a vocab.txt, BERT's normaliser keeps
        case (a tokenizer.json's normaliser is its own: True, nothing lower-cases text before it)."""
        self.spaced_sentences = spaced_sentences
        """A byte-level BPE that adds no prefix space (RoBERTa's, ModernBERT's): a sentence after the first of a
        document is encoded with the space before it, as the model meets it in running text (`ĠThe`, not `The`)."""
        self.pair_separators = pair_separators
        """[SEP]s between the two texts of a pair by the tokenizer's own rule (its post-processor): BERT's 1,
        RoBERTa's and XLM-R's 2 (`<s> A </s></s> B </s>`); what fine-tuning builds and the export's tokenizer
        gives at inference (bertdist.finetune.features.Layout)."""
        self._backend = backend
        ids = {t: i for i, t in enumerate(tokens)}
        missing = [name for name in names.values() if name not in ids]
        if missing:
            raise DataError(
                f"{path}: the tokenizer has no {' '.join(missing)} token; bertdist needs "
                f"{' '.join(names.values())} (named in a {TOKENIZER_CONFIG} beside it, or BERT's)"
            )
        roles = ("pad", "unk", "cls", "sep", "mask")
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (ids[names[f"{r}_token"]] for r in roles)

    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def is_wordpiece_vocab(self) -> bool:
        """A vocab.txt (rather than a tokenizer.json)."""
        return self._backend is None

    @cached_property
    def backend(self) -> Tokenizer:
        """The `tokenizers` pipeline; for a vocab.txt, BERT's (`bertdist.data.vocab.load_tokenizer`)."""
        if self._backend is not None:
            return self._backend
        return load_tokenizer(self.path, self.cased)

    def encode_batch(self, texts: list[Any], is_pretokenized: bool = False) -> list[Encoding]:
        """Encodings (ids, offsets, word ids) without special tokens and without truncation.

        Text is text: "[SEP]" or "<mask>" written in a document (a tokenizer's manual, a page about BERT) must not
        become the special token, which a tokenizer.json's added-token matching would make it. Left on, a literal
        [MASK] entered the shards as a mask no loss asks for and a literal [SEP] as a segment boundary; bertdist
        places its special tokens by id. A vocab.txt's pipeline has no added tokens, so it never matched. Set here,
        at every call, not once: a pickled `Tokenizer` (a Ray task's copy) comes back without the setting."""
        backend = self.backend
        backend.encode_special_tokens = True
        return backend.encode_batch(texts, is_pretokenized=is_pretokenized, add_special_tokens=False)

    def normalized(self, text: str) -> str:
        """`text` as the model reads it before splitting: the normaliser's output (an uncased vocab.txt's lower-cased,
        accents stripped), the text itself where the tokenizer has none."""
        normalizer = self.backend.normalizer
        return normalizer.normalize_str(text) if normalizer is not None else text

    def readable(self, ids: Any) -> list[str]:
        """Each token as a person reads it: a byte-level token's bytes as text (`Ġthe` is " the", `ä½łå¥½` is 你好; a
        piece of a character U+FFFD), a Metaspace token's `▁` as a space; WordPiece's as they are (`##` marks a
        continuation). The attention pictures showed the byte alphabet, unreadable beyond ASCII."""
        backend = self._backend
        if backend is not None and type(backend.decoder).__name__ == "ByteLevel":
            return [backend.decode([int(i)], skip_special_tokens=False) or self.tokens[i] for i in ids]
        if backend is not None and "Metaspace" in repr(backend.pre_tokenizer):
            replacement = find_component(json.loads(backend.to_str()).get("pre_tokenizer"), "Metaspace").get(
                "replacement", "▁"
            )
            return [self.tokens[i].replace(replacement, " ") for i in ids]
        return [self.tokens[i] for i in ids]

    def encode_words(self, sentences: list[list[str]]) -> list[Encoding]:
        """`encode_batch` of sentences given as words (tagging's), each token's word in `word_ids`: the tokens the
        words' text, joined by spaces, gives. Each word after the first goes in with the space before it: without
        it, a byte-level BPE without a prefix space (ModernBERT's) or a Metaspace that does not prepend encodes
        each word as glued to the one before, into sub-words pretraining never saw."""
        spaced = [[word if i == 0 else " " + word for i, word in enumerate(words)] for words in sentences]
        return self.encode_batch(spaced, is_pretokenized=True)

    def sentence_encoder(self) -> Any:
        """An object whose `encode(sentences)` gives (all ids concatenated, int32; ids per sentence, int64):
        `WordPieceEncoder` for a vocab.txt (fast on ASCII), the tokenizer's own batch encode otherwise."""
        if self.is_wordpiece_vocab:
            return WordPieceEncoder(self.path, self.cased)
        return _BatchEncoder(self)


class _BatchEncoder:
    def __init__(self, tokenizer: TextTokenizer):
        self.tokenizer = tokenizer

    def encode(self, sentences: list[str], firsts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`firsts`: which sentences open a document; the others get the space before them when the tokenizer
        needs it (TextTokenizer.spaced_sentences). A byte-level BPE gives a non-empty sentence tokens either way."""
        if self.tokenizer.spaced_sentences and firsts is not None:
            sentences = [s if first or not s else " " + s for s, first in zip(sentences, firsts.tolist())]
        ids = [e.ids for e in self.tokenizer.encode_batch(sentences)]
        lengths = np.array([len(i) for i in ids], dtype=np.int64)
        return np.fromiter((t for i in ids for t in i), dtype=np.int32, count=int(lengths.sum())), lengths


def open_tokenizer(path: str | os.PathLike, cased: bool | None = None) -> TextTokenizer:
    """The tokenizer at `path` (a vocab.txt, a tokenizer.json, or a directory holding either).

    `cased` applies to a vocab.txt only (whether BERT's normaliser keeps case and accents); None takes it from
    a tokenizer_config.json beside it, else from the vocabulary. A tokenizer.json carries its own normaliser.
    DataError naming the file when it is unreadable or lacks one of the special tokens."""
    file = tokenizer_file(path)
    if is_tokenizer_json(file):
        return _from_json(file)
    tokens = read_vocab(file)
    return wordpiece_tokens(tokens, file, wordpiece_is_cased(Path(file), tokens) if cased is None else cased)


def wordpiece_tokens(tokens: list[str], path: str = "<tokens>", cased: bool = False) -> TextTokenizer:
    """The WordPiece vocabulary `tokens` (by id); which start a word: bertdist.data.word_starts."""
    return TextTokenizer(path, tokens, BERT_SPECIAL_TOKENS, of_wordpiece(tokens), cased, None)


def _from_json(file: str) -> TextTokenizer:
    try:
        text = Path(file).read_text(encoding="utf-8")
        spec = json.loads(text)
    except (OSError, ValueError) as e:
        raise DataError(f"{file}: cannot read tokenizer ({e})") from None
    try:
        backend = Tokenizer.from_str(text)
    except Exception as e:  # noqa: BLE001  tokenizers raises a bare Exception for a spec it rejects
        raise DataError(f"{file}: not a Hugging Face tokenizer.json ({first_line(e)})") from None
    # A released tokenizer.json may carry its own padding and truncation (sentence-transformers' MiniLM pads every
    # text to 128 [PAD]s): bertdist cuts and pads sequences itself, after adding [CLS] and [SEP], so a text's ids
    # must be the text's alone. Left on, the pads became tokens of the text and the [SEP] fell off the end.
    backend.no_padding()
    backend.no_truncation()
    vocab = backend.get_vocab(with_added_tokens=True)
    tokens = [""] * (max(vocab.values()) + 1)
    for token, i in vocab.items():
        tokens[i] = token
    names = dict(BERT_SPECIAL_TOKENS, **_configured_names(Path(file).parent / TOKENIZER_CONFIG))
    starts = of_tokenizer_json(spec, tokens)
    for added in spec.get("added_tokens", []):
        if added.get("special") and added["id"] < len(starts):
            starts[added["id"]] = True
    byte_level = find_component(spec.get("pre_tokenizer"), "ByteLevel")
    spaced = bool(byte_level) and not byte_level.get("add_prefix_space", True)
    return TextTokenizer(
        file, tokens, names, starts, True, backend, _pair_separators(spec.get("post_processor")), spaced
    )


def _pair_separators(post: Any) -> int:
    """Special tokens between A and B in a tokenizer.json's pair rule (see TextTokenizer.pair_separators); 1 for
    BERT's processor, a template without a pair rule or no processor at all."""
    if not isinstance(post, dict):
        return 1
    kind = post.get("type")
    if kind == "RobertaProcessing":
        return 2
    if kind == "Sequence":
        counts = [_pair_separators(p) for p in post.get("processors", []) if isinstance(p, dict)]
        return max(counts, default=1)
    if kind == "TemplateProcessing":
        pieces = [next(iter(piece.items())) for piece in post.get("pair") or [] if isinstance(piece, dict) and piece]
        sequences = [i for i, (piece, _) in enumerate(pieces) if piece == "Sequence"]
        if len(sequences) == 2:
            between = pieces[sequences[0] + 1 : sequences[1]]
            return max(1, sum(1 for piece, _ in between if piece == "SpecialToken"))
    return 1


def _configured_names(config_file: Path) -> dict[str, str]:
    """Special-token names from a tokenizer_config.json (a string, or {"content": ...} as `transformers` saves
    AddedTokens); none when it is absent or names none."""
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    names = {}
    for key in BERT_SPECIAL_TOKENS:
        value = config.get(key) if isinstance(config, dict) else None
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            names[key] = value
    return names


def wordpiece_is_cased(vocab_file: Path, tokens: list[str]) -> bool:
    """Whether a WordPiece vocabulary keeps case: the `do_lower_case` of a tokenizer_config.json beside it (which
    `bertdist vocab` writes), else inferred: an uncased vocabulary has no upper-case letters outside [BRACKETED]
    special tokens."""
    sibling = vocab_file.parent / TOKENIZER_CONFIG
    if sibling.exists():
        try:
            settings = json.loads(sibling.read_text())
            value = settings.get("do_lower_case")
        except (json.JSONDecodeError, AttributeError):
            settings, value = {}, None
        if isinstance(value, bool):
            _refuse_other_normalisation(sibling, settings, value)
            return not value
    return any(t != t.lower() for t in tokens if not (t.startswith("[") and t.endswith("]")))


def uncased_evidence(vocab_file: Path, tokens: list[str]) -> str:
    """Why a WordPiece vocabulary is certainly uncased, or "": its tokenizer_config.json says do_lower_case, or it
    holds lower-case letters and no upper-case one. A vocabulary of scripts without case has neither, and may be read
    cased to keep its marks (a Devanagari virama, a Thai tone mark), which BERT's uncased normaliser strips."""
    sibling = vocab_file.parent / TOKENIZER_CONFIG
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if json.loads(sibling.read_text()).get("do_lower_case") is True:
            return f"{sibling} says do_lower_case: true"
    words = [t for t in tokens if not (t.startswith("[") and t.endswith("]"))]
    if any(t != t.upper() for t in words) and all(t == t.lower() for t in words):
        return "its tokens hold lower-case letters and no upper-case one"
    return ""


def _refuse_other_normalisation(config: Path, settings: dict, lowercase: bool) -> None:
    """DataError for a released WordPiece tokenizer whose BERT normaliser is not one bertdist builds from a
    vocab.txt (accents stripped exactly when lower-casing, CJK characters split): read as if it were, `año` became
    `ano` for a model that was trained on `año`."""
    strip = settings.get("strip_accents")
    said = [f"strip_accents: {str(strip).lower()}"] if isinstance(strip, bool) and strip != lowercase else []
    said += ["tokenize_chinese_chars: false"] if settings.get("tokenize_chinese_chars") is False else []
    if said:
        raise DataError(
            f"{config}: {', '.join(said)} (with do_lower_case: {str(lowercase).lower()}): bertdist reads a "
            "vocab.txt with accents stripped exactly when lower-casing and CJK characters split; a tokenizer.json "
            "beside it carries any normaliser: write one (transformers: "
            "AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR))"
        )


def vocab_mismatch(vocab_file: str, embedding_rows: int, trained_with: str | None = None) -> str:
    """Why the tokenizer `vocab_file` cannot serve a model with `embedding_rows` token embeddings whose weights
    were trained with the tokenizer `trained_with` (when known and present; a file or a directory); '' when it can.

    A tokenizer larger than the embedding gives ids past its end (an IndexError mid-training, an export that
    `transformers` cannot run); one whose tokens differ from the weights' own, even at the same size, gives
    every token another token's embedding, which trains without an error and silently learns nonsense. A
    smaller one is fine: the extra rows are unused (as when the embedding is padded to a multiple of 64).
    Tokens are compared by id, so a vocab.txt and the tokenizer.json made from it agree.
    """
    ours = open_tokenizer(vocab_file)
    if ours.size > embedding_rows:
        return f"{ours.path} has {ours.size} tokens, more than the model's {embedding_rows} token embeddings"
    if not trained_with or not os.path.exists(trained_with):
        return ""
    try:
        theirs_file = tokenizer_file(trained_with)
    except DataError:  # weights without their tokenizer: nothing to compare with
        return ""
    if not os.path.isfile(theirs_file) or os.path.realpath(theirs_file) == os.path.realpath(ours.path):
        return ""
    tokens, theirs = ours.tokens, open_tokenizer(theirs_file).tokens
    if theirs != tokens:
        at = next((i for i, (a, b) in enumerate(zip(tokens, theirs)) if a != b), min(len(tokens), len(theirs)))
        return (
            f"{vocab_file} is not the vocabulary the weights were trained with, {trained_with} (they differ from "
            f"line {at + 1}: {tokens[at] if at < len(tokens) else 'end'!r} vs "
            f"{theirs[at] if at < len(theirs) else 'end'!r}); "
            "every token would get another token's embedding"
        )
    return ""


CARRIED_TOKENIZER_SETTINGS = ("bos_token", "eos_token")
"""What a released model's tokenizer_config.json says that bertdist's tokenizer does not hold, carried into its
exports: XLM-R's and RoBERTa's `<s>`/`</s>` as bos/eos (transformers read None without them). Not its class: a
`BertTokenizer` class without its do_lower_case makes transformers rebuild a cased tokenizer.json lower-casing."""


def _released_settings(config_file: Path) -> dict[str, Any]:
    """CARRIED_TOKENIZER_SETTINGS of the tokenizer_config.json beside a tokenizer.json (a released model's), if any."""
    try:
        released = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(released, dict):
        return {}
    return {k: released[k] for k in CARRIED_TOKENIZER_SETTINGS if released.get(k) is not None}


def write_fast_tokenizer_files(
    tokenizer: TextTokenizer,
    directory: str | os.PathLike,
    model_max_length: int | None = None,
    model_input_names: list[str] | None = None,
) -> None:
    """tokenizer.json (copied), tokenizer_config.json and special_tokens_map.json in `directory`, so that
    `transformers.AutoTokenizer.from_pretrained(directory)` loads it offline as `PreTrainedTokenizerFast` with the
    special tokens named, and gives the ids bertdist gives. `model_input_names`: what the model's forward takes
    (BERT's token_type_ids, which ModernBERT's refuses); None leaves transformers' default."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / TOKENIZER_JSON
    if not target.exists() or target.resolve() != Path(tokenizer.path).resolve():
        shutil.copyfile(tokenizer.path, target)
    special = dict(tokenizer.names)
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        **special,
        **_released_settings(Path(tokenizer.path).parent / TOKENIZER_CONFIG),
    }
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    if model_input_names is not None:
        config["model_input_names"] = model_input_names
    write_json(str(directory / TOKENIZER_CONFIG), config, indent=2)
    write_json(str(directory / "special_tokens_map.json"), special, indent=2)
