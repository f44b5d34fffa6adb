"""The one tokenizer abstraction (`bertdist.data.tokenizer`) and byte-level BPE (`bertdist.data.bpe`): ids that
transformers agrees with, special tokens found by name wherever they sit, word starts for whole-word masking,
and prepare / load-time masking / size checks driven by a tokenizer.json whose special ids are not BERT's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bertdist.config import MaskingConfig
from bertdist.data import iter_samples
from bertdist.data.instances import Documents, InstanceOptions, full_sentences
from bertdist.data.masking import KeyedDraws, VocabInfo, apply_masks
from bertdist.data.tokenizer import open_tokenizer, tokenizer_file, vocab_mismatch
from bertdist.errors import DataError
from tests.conftest import TEST_SEQ_LENGTH, TEST_VOCAB_SIZE, tiny_prepare_options

SENTENCES = ["The cat sat on the mat.", "Hello, world!", "a b", "Ünïcödé Café naïve (in brackets) 42", ""]


def test_bpe_loads_in_transformers_offline_with_the_same_ids(tiny_bpe, hf_offline):
    from transformers import AutoTokenizer

    ours = open_tokenizer(Path(tiny_bpe).parent)  # a directory resolves to its tokenizer.json
    assert ours.path == tiny_bpe and not ours.is_wordpiece_vocab and ours.size == TEST_VOCAB_SIZE
    # [PAD] [UNK] [CLS] [SEP] [MASK] first, as `bertdist vocab`'s WordPiece
    assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == (0, 1, 2, 3, 4)
    theirs = AutoTokenizer.from_pretrained(Path(tiny_bpe).parent)
    assert (
        theirs.cls_token_id,
        theirs.sep_token_id,
        theirs.mask_token_id,
        theirs.pad_token_id,
        theirs.unk_token_id,
    ) == (2, 3, 4, 0, 1)
    encoded = [e.ids for e in ours.encode_batch(SENTENCES)]
    assert [theirs(s, add_special_tokens=False).input_ids for s in SENTENCES] == encoded
    assert theirs(SENTENCES[0]).input_ids == [2, *encoded[0], 3]
    assert theirs(SENTENCES[0], SENTENCES[1]).input_ids == [2, *encoded[0], 3, *encoded[1], 3]
    ids, lengths = ours.sentence_encoder().encode(SENTENCES)
    assert lengths.tolist() == [len(e) for e in encoded] and ids.tolist() == [i for e in encoded for i in e]


@pytest.mark.parametrize("which", ["tiny_bpe", "high_id_tokenizer"])
def test_special_tokens_written_in_the_text_stay_text(which, request, hf_offline):
    """A document that writes "[SEP]" or "[MASK]" (a page about BERT) gets no special id for them: the shards'
    special tokens are the ones bertdist places. transformers gives the same ids when asked to split them."""
    from transformers import AutoTokenizer

    path = request.getfixturevalue(which)
    tokenizer = open_tokenizer(path)
    text = "The [MASK] token and [SEP], [CLS] and [PAD] are written here."
    (encoding,) = tokenizer.encode_batch([text])
    special = {tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id}
    assert not special & set(encoding.ids), encoding.tokens
    ids, _ = tokenizer.sentence_encoder().encode([text])
    assert ids.tolist() == encoding.ids
    theirs = AutoTokenizer.from_pretrained(Path(tokenizer.path).parent)
    assert theirs(text, add_special_tokens=False, split_special_tokens=True).input_ids == encoding.ids


def test_bpe_word_starts_follow_the_space_marker(tiny_bpe):
    tokenizer = open_tokenizer(tiny_bpe)
    encoding = tokenizer.encode_batch(["the cat, sat"])[0]
    starts = tokenizer.starts_word[encoding.ids].tolist()
    assert encoding.tokens[0].startswith("Ġ")  # add_prefix_space: the first word of a text starts a word too
    assert starts == [t.startswith("Ġ") for t in encoding.tokens] and sum(starts) == 3  # the comma joins "cat"
    assert tokenizer.starts_word[[tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id]].all()


def _unigram(tmp_path: Path, prepend_scheme: str) -> str:
    """A SentencePiece-style tokenizer.json: Unigram behind a Metaspace pre-tokenizer (XLM-R's, DeBERTa-v3's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=prepend_scheme)
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.UnigramTrainer(vocab_size=200, special_tokens=special, unk_token="[UNK]", show_progress=False)
    tokenizer.train_from_iterator(SENTENCES * 20, trainer=trainer)
    path = tmp_path / prepend_scheme / "tokenizer.json"
    path.parent.mkdir()
    tokenizer.save(str(path))
    return str(path)


def test_words_encode_as_their_text_does_with_every_kind_of_tokenizer(
    tiny_vocab, tiny_bpe, high_id_tokenizer, tmp_path
):
    """Tagging's words went in without the space between them: a byte-level BPE without a prefix space
    (ModernBERT's, `high_id_tokenizer`) encoded "John Smith lives" as John|Sm|ith|liv|es, sub-words pretraining
    never saw. Words now give the tokens of their text, each token marked with its word."""
    sentences = [s.split() for s in SENTENCES if s] + [["New", "York", "(", "NY", ")", "Café"]]
    for path in (tiny_vocab, tiny_bpe, high_id_tokenizer, _unigram(tmp_path, "always"), _unigram(tmp_path, "first")):
        tokenizer = open_tokenizer(path)
        as_text = tokenizer.encode_batch([" ".join(words) for words in sentences])
        for words, text, encoding in zip(sentences, as_text, tokenizer.encode_words(sentences)):
            assert encoding.ids == text.ids, (path, words, encoding.tokens, text.tokens)
            assert sorted(set(encoding.word_ids)) == list(range(len(words))), (path, encoding.word_ids)


def test_a_documents_sentences_encode_as_its_text_does_with_every_kind_of_tokenizer(
    tiny_vocab, tiny_bpe, high_id_tokenizer, tmp_path
):
    """prepare encodes a document sentence by sentence: a byte-level BPE without a prefix space (RoBERTa's,
    ModernBERT's) gave each sentence after the first its no-space first token (`The`, where the document's text,
    and the checkpoint's tokenizer at fine-tuning and inference, give `ĠThe`)."""
    import numpy as np

    from bertdist.data.pipeline.stages import _tokenize_into

    documents = [["The dog sat.", "The cat ran.", "This is it."], ["New York (NY) is big.", "Café au lait."]]
    for path in (tiny_vocab, tiny_bpe, high_id_tokenizer, _unigram(tmp_path, "always")):
        tokenizer = open_tokenizer(path)
        assert tokenizer.spaced_sentences == (path == high_id_tokenizer)

        class Writer:
            def add(self, ids, lengths, sentences, texts, languages):
                self.ids, self.lengths = ids, lengths

        writer, summary = Writer(), {"sentences": 0, "documents": 0, "empty_documents": 0}
        _tokenize_into(tokenizer.sentence_encoder(), [("en", d) for d in documents], writer, summary)
        as_text = [i for d in documents for i in tokenizer.encode_batch([" ".join(d)])[0].ids]
        assert writer.ids.tolist() == as_text, path
        assert np.array_equal(writer.lengths > 0, np.ones(5, dtype=bool))


def test_special_ids_are_looked_up_where_they_sit(high_id_tokenizer, tiny_vocab):
    tokenizer = open_tokenizer(high_id_tokenizer)
    assert (tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, tokenizer.mask_id) == (
        995,
        996,
        997,
        998,
        999,
    )
    wordpiece = open_tokenizer(Path(tiny_vocab).parent / "vocab.txt")
    assert wordpiece.is_wordpiece_vocab and wordpiece.tokens[wordpiece.mask_id] == "[MASK]"
    assert tokenizer_file(Path(tiny_vocab).parent) == str(Path(tiny_vocab).parent / "tokenizer.json")


def test_a_tokenizer_without_a_special_token_is_refused_naming_the_file(tmp_path, high_id_tokenizer):
    spec = json.loads((Path(high_id_tokenizer) / "tokenizer.json").read_text())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != "[MASK]"]
    spec["post_processor"] = None
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(DataError, match=r"tokenizer.json: the tokenizer has no \[MASK\] token"):
        open_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(DataError, match="tokenizer.json: cannot read tokenizer"):
        open_tokenizer(tmp_path / "tokenizer.json")


def test_a_released_wordpiece_vocab_with_another_normaliser_is_refused(tmp_path, tiny_vocab):
    """A vocab.txt whose tokenizer_config.json keeps accents while lower-casing (Spanish and Italian uncased BERTs):
    read with accents stripped, `año` became `ano` for a model trained on `año`. Without a tokenizer.json, whose
    normaliser bertdist reads as it is, it is refused naming the setting."""
    (tmp_path / "vocab.txt").write_text(Path(tiny_vocab).read_text())
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"do_lower_case": True}))
    assert not open_tokenizer(tmp_path).cased
    config.write_text(json.dumps({"do_lower_case": True, "strip_accents": False}))
    with pytest.raises(DataError, match="tokenizer_config.json: strip_accents: false \\(with do_lower_case: true\\)"):
        open_tokenizer(tmp_path)
    config.write_text(json.dumps({"do_lower_case": False, "tokenize_chinese_chars": False}))
    with pytest.raises(DataError, match="tokenize_chinese_chars: false"):
        open_tokenizer(tmp_path)
    config.write_text(json.dumps({"do_lower_case": True, "strip_accents": True}))  # the same as stripping: read
    assert not open_tokenizer(tmp_path).cased


def test_a_tokenizer_larger_than_the_embedding_is_refused_naming_both(tiny_bpe, tiny_vocab, high_id_tokenizer):
    assert vocab_mismatch(tiny_bpe, TEST_VOCAB_SIZE) == ""
    assert (
        vocab_mismatch(tiny_bpe, 512)
        == f"{tiny_bpe} has {TEST_VOCAB_SIZE} tokens, more than the model's 512 token embeddings"
    )
    assert "is not the vocabulary the weights were trained with" in vocab_mismatch(
        high_id_tokenizer, TEST_VOCAB_SIZE, tiny_bpe
    )
    # the WordPiece tokenizer.json `bertdist vocab` writes beside vocab.txt has the same tokens by id
    assert vocab_mismatch(tiny_vocab, TEST_VOCAB_SIZE, str(Path(tiny_vocab).parent / "tokenizer.json")) == ""


def test_config_validation_refuses_a_tokenizer_larger_than_the_model(tiny_bpe, tmp_path):
    from bertdist.config import ConfigError, load_config, validate

    cfg = load_config(
        None,
        [f"train.output_dir={tmp_path / 'run'}", f"data.vocab_file={Path(tiny_bpe).parent}", "model.vocab_size=512"],
    )
    with pytest.raises(
        ConfigError, match=rf"model.vocab_size: 512 is smaller than the {TEST_VOCAB_SIZE} tokens of data.vocab_file="
    ):
        validate(cfg)


def _bpe_samples(path: str) -> tuple:
    tokenizer = open_tokenizer(path)
    from bertdist.demo import python_documentation

    texts = [t for t in python_documentation()[:300] if t.strip()]
    ids = [i for i in (e.ids for e in tokenizer.encode_batch(texts)) if i]
    lengths = np.array([len(i) for i in ids])
    docs = Documents(
        np.concatenate(ids).astype(np.uint16), np.concatenate([[0], np.cumsum(lengths)]), np.arange(len(ids) + 1)
    )
    vocab = VocabInfo.from_tokenizer(tokenizer)
    return full_sentences(docs, InstanceOptions(max_seq_length=64), vocab), vocab


@pytest.mark.parametrize("which", ["tiny_bpe", "high_id_tokenizer"])
def test_whole_word_masking_with_bpe_masks_whole_words(which, request):
    samples, vocab = _bpe_samples(request.getfixturevalue(which))
    rules = MaskingConfig(max_predictions_per_seq=10, whole_word_mask=True)
    out = apply_masks(samples, rules, vocab, KeyedDraws(1, 0, np.arange(len(samples))))
    tokens = samples.input_ids.astype(np.int64)
    starts = samples.token_offsets()[:-1]
    chosen = np.zeros(len(tokens), dtype=bool)
    chosen[starts[np.repeat(np.arange(len(samples)), out.masked_counts)] + out.masked_lm_positions] = True
    special = np.isin(tokens, [vocab.cls_id, vocab.sep_id])
    word = np.cumsum(~vocab.is_continuation[tokens] | special | np.r_[True, special[:-1]])  # a word id per token
    assert vocab.is_continuation[tokens][chosen].sum() > 50  # words of several pieces were chosen
    for w in np.unique(word[chosen]):
        assert chosen[word == w].all()  # every chosen position's word is chosen whole
    assert (out.input_ids[chosen] == vocab.mask_id).mean() > 0.7 and not special[chosen].any()


UNSPACED = ["我们今天去北京大学学习中文。", "東京の夜景はとても美しいです。", "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ"]


@pytest.mark.parametrize("model", ["bpe", "unigram"])
def test_a_sentence_of_a_script_without_spaces_is_many_words_not_one(model, tmp_path):
    """A Chinese, Japanese or Thai sentence has a space marker at its start only: the whole sentence was one word,
    over every sample's budget, and whole-word masking masked none of 200 such samples (a review, November 2026).
    A token that begins with an ideograph, kana or Thai now starts a word; English keeps its words."""
    from bertdist.data.bpe import train_bpe
    from bertdist.data.unigram import train_unigram

    train = train_bpe if model == "bpe" else train_unigram
    tokenizer = open_tokenizer(train((UNSPACED + SENTENCES) * 30, str(tmp_path), vocab_size=400))
    for text in UNSPACED:
        encoding = tokenizer.encode_batch([text])[0]
        starts = np.flatnonzero(tokenizer.starts_word[encoding.ids])
        longest = np.diff(np.append(starts, len(encoding.ids))).max()  # a byte-level token may begin mid-character
        assert len(starts) > 1 and longest <= 4, encoding.tokens
    english = tokenizer.encode_batch(["the cat sat on the mat"])[0]
    assert tokenizer.starts_word[english.ids].sum() == 6, english.tokens
    ids = [tokenizer.encode_batch([t])[0].ids for t in UNSPACED * 20]
    lengths = np.array([len(i) for i in ids])
    docs = Documents(
        np.concatenate(ids).astype(np.uint16), np.concatenate([[0], np.cumsum(lengths)]), np.arange(len(ids) + 1)
    )
    vocab = VocabInfo.from_tokenizer(tokenizer)
    samples = full_sentences(docs, InstanceOptions(max_seq_length=24), vocab)
    out = apply_masks(samples, MaskingConfig(whole_word_mask=True), vocab, KeyedDraws(1, 0, np.arange(len(samples))))
    assert (out.masked_counts > 0).all(), out.masked_counts


def test_a_wordpiece_continuation_in_a_script_without_spaces_starts_a_word(tmp_path):
    """BERT's tokenizer splits ideographs apart but not kana, Thai, Lao, Khmer or Myanmar: a Thai phrase is one
    piece and its `##` continuations, one "word" over a sample's budget (Thai under WordPiece: 10.6% of its tokens
    masked for 15%, some samples none). Such a continuation starts a word, from a vocab.txt as from a
    tokenizer.json; a Latin one does not."""
    from bertdist.data.tokenizer import wordpiece_tokens
    from bertdist.data.word_starts import of_tokenizer_json

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "ภาษา", "##ไทย", "##ไม่", "の", "##です", "cat", "##s"]
    want = [True] * 10 + [True, False]
    assert wordpiece_tokens(tokens).starts_word.tolist() == want
    spec = {
        "model": {"type": "WordPiece", "continuing_subword_prefix": "##"},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
    }
    assert of_tokenizer_json(spec, tokens).tolist() == want


def test_readable_tokens_are_text_not_the_byte_alphabet(tmp_path, tiny_vocab):
    """The attention pictures labelled a byte-level BPE's tokens with its byte alphabet: `Ġä½łå¥½` for " 你好"."""
    from bertdist.data.bpe import train_bpe
    from bertdist.data.unigram import train_unigram

    text = "the cat 你好世界 مرحبا"
    bpe = open_tokenizer(train_bpe([text] * 50, str(tmp_path / "bpe"), vocab_size=300))
    assert "".join(bpe.readable(bpe.encode_batch([text])[0].ids)) == " " + text
    unigram = open_tokenizer(train_unigram([text] * 50, str(tmp_path / "uni"), vocab_size=300))
    assert "".join(unigram.readable(unigram.encode_batch([text])[0].ids)).strip() == text
    wordpiece = open_tokenizer(tiny_vocab)
    ids = wordpiece.encode_batch(["the modules"])[0].ids
    assert wordpiece.readable(ids) == [wordpiece.tokens[i] for i in ids]  # ## marks a continuation, kept


@pytest.fixture(scope="module", params=["static", "dynamic"])
def high_id_shards(request, tiny_corpus, high_id_tokenizer, ray_local, tmp_path_factory) -> tuple[str, str]:
    from bertdist.data.pipeline.driver import prepare

    out = str(tmp_path_factory.mktemp(f"high_id_{request.param}") / "train")
    prepare(
        tiny_prepare_options(tiny_corpus, high_id_tokenizer, out, samples="mlm", masking=request.param, dupe_factor=1)
    )
    return request.param, out


def test_prepare_and_the_loader_use_the_tokenizers_special_ids(high_id_shards, high_id_tokenizer):
    from bertdist.data.loader import PretrainingLoader

    masking, shards = high_id_shards
    tokenizer = open_tokenizer(high_id_tokenizer)
    manifest = json.loads((Path(shards) / "manifest.json").read_text())
    assert manifest["mask_id"] == tokenizer.mask_id == 999 and manifest["vocab_file"] == str(
        Path(high_id_tokenizer) / "tokenizer.json"
    )
    samples = [s for _, s in zip(range(50), iter_samples(shards))]
    for s in samples:
        ids = s["input_ids"]
        assert ids[0] == tokenizer.cls_id and ids[-1] == tokenizer.sep_id  # 996 and 997, never BERT's 101 and 102
    shown = np.concatenate([s["input_ids"][s["masked_lm_positions"]] for s in samples])
    if masking == "static":
        assert (shown == tokenizer.mask_id).mean() > 0.7
    else:
        assert all(len(s["masked_lm_positions"]) == 0 for s in samples)
    loader = PretrainingLoader(shards, high_id_tokenizer, max_seq_length=TEST_SEQ_LENGTH, micro_batch_size=8, seed=3)
    batch = next(iter(loader))
    real = batch["masked_lm_ids"] != -100
    at = batch["masked_lm_positions"][real]
    rows = np.nonzero(real.numpy())[0]
    masked_shown = batch["input_ids"][rows, at]
    assert real.any(1).all() and (masked_shown == tokenizer.mask_id).float().mean() > 0.6
    assert (batch["input_ids"][:, 0] == tokenizer.cls_id).all()
    assert not np.isin(batch["masked_lm_ids"][real].numpy(), [tokenizer.cls_id, tokenizer.sep_id]).any()


def test_shards_refuse_another_tokenizer(high_id_shards, tiny_bpe):
    from bertdist.data.loader import PretrainingLoader

    with pytest.raises(DataError, match="shards were made with another vocabulary"):
        PretrainingLoader(high_id_shards[1], tiny_bpe, max_seq_length=TEST_SEQ_LENGTH, micro_batch_size=8)


def test_bertdist_vocab_trains_bpe_on_request(tiny_corpus, tmp_path, capsys):
    from bertdist.cli import main

    assert (
        main(
            [
                "vocab",
                "--input",
                tiny_corpus,
                "--output",
                str(tmp_path / "bpe"),
                "--model",
                "bpe",
                "--vocab-size",
                "100",
            ]
        )
        != 0
    )
    assert "--vocab-size must be in [261, 4,194,304] for --model bpe" in capsys.readouterr().err
    assert (
        main(
            [
                "vocab",
                "--input",
                tiny_corpus,
                "--output",
                str(tmp_path / "bpe"),
                "--model",
                "bpe",
                "--vocab-size",
                "400",
            ]
        )
        == 0
    )
    assert sorted(p.name for p in (tmp_path / "bpe").iterdir()) == [
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert open_tokenizer(tmp_path / "bpe").size == 400


def test_an_export_keeps_a_released_tokenizers_bos_and_eos(tmp_path):
    """XLM-R's and RoBERTa's tokenizer_config.json name `<s>`/`</s>` as bos and eos; the export of a model continued
    from one wrote neither, and transformers read bos and eos as None."""
    transformers = pytest.importorskip("transformers")
    from bertdist.data.bpe import train_bpe
    from bertdist.data.tokenizer import write_fast_tokenizer_files

    release = tmp_path / "release"
    open_tokenizer(train_bpe(SENTENCES * 20, str(release), vocab_size=300))
    config = json.loads((release / "tokenizer_config.json").read_text())
    (release / "tokenizer_config.json").write_text(json.dumps({**config, "bos_token": "[CLS]", "eos_token": "[SEP]"}))
    write_fast_tokenizer_files(open_tokenizer(str(release)), tmp_path / "export")
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "export")
    assert (exported.bos_token, exported.eos_token) == ("[CLS]", "[SEP]")
