"""`bertdist prepare` with the documents' languages: from a JSON field or from one directory per language, counted
per language in the manifest, and split into one shard set per language that a mixture reads as its sources."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bertdist.cli import main
from bertdist.data.inspect import shard_statistics
from bertdist.data.loader import PretrainingLoader
from bertdist.data.mixture import MixtureLoader
from bertdist.data.pipeline.driver import prepare
from bertdist.data.shards import read_manifest
from tests.conftest import TEST_SEQ_LENGTH, tiny_prepare_options

pytestmark = pytest.mark.slow
LANGUAGES = ("de", "en")


def _documents(tiny_documents: Path) -> list[str]:
    return [json.loads(line)["text"] for line in tiny_documents.read_text().splitlines()]


@pytest.fixture(scope="module")
def labelled(tiny_documents, tmp_path_factory) -> Path:
    """The tiny corpus as JSON lines, its documents labelled de and en in turn."""
    path = tmp_path_factory.mktemp("labelled") / "corpus.jsonl"
    lines = [json.dumps({"text": t, "lang": LANGUAGES[k % 2]}) for k, t in enumerate(_documents(tiny_documents))]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def split_run(labelled, tiny_vocab, ray_local, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("split") / "data")
    opts = tiny_prepare_options(str(labelled), tiny_vocab, out, language_field="lang", split_by_language=True)
    prepare(opts)
    return out


def test_the_manifest_counts_each_language(labelled, tiny_vocab, ray_local, tmp_path, capsys):
    out = tmp_path / "data"
    args = ["prepare", "--input", str(labelled), "--vocab", tiny_vocab, "--output", str(out), "--no-progress"]
    assert main([*args, "--max-seq-length", str(TEST_SEQ_LENGTH), "--language-field", "lang"]) == 0
    manifest = read_manifest(str(out))
    languages, totals = manifest["languages"], manifest["totals"]
    assert sorted(languages) == list(LANGUAGES) and manifest["options"]["language_field"] == "lang"
    for key in ("documents", "sentences", "tokens", "samples", "sample_tokens"):
        assert sum(c[key] for c in languages.values()) == totals[key]
        assert all(c[key] > 0 for c in languages.values())
    printed = capsys.readouterr().out
    assert all(f"  {language}: {languages[language]['documents']:,} documents" in printed for language in LANGUAGES)


def test_split_by_language_writes_one_complete_shard_set_per_language(split_run, labelled, tiny_vocab, tmp_path):
    assert sorted(os.listdir(split_run)) == list(LANGUAGES)  # no .work left, no manifest of the whole
    whole = tmp_path / "whole"
    prepare(tiny_prepare_options(str(labelled), tiny_vocab, str(whole), language_field="lang"))
    for language in LANGUAGES:
        directory = os.path.join(split_run, language)
        manifest = read_manifest(directory)
        assert manifest["language"] == language and list(manifest["languages"]) == [language]
        # the same groups as the run of every language: the same samples, now in their own set
        assert manifest["totals"]["samples"] == read_manifest(str(whole))["languages"][language]["samples"]
        assert manifest["languages"][language]["documents"] == manifest["totals"]["documents"]
        assert shard_statistics(directory)["per_shard"] == [s["num_samples"] for s in manifest["shards"]]


def test_language_shard_sets_are_mixture_sources(split_run, tiny_vocab):
    loaders = {
        language: PretrainingLoader(
            os.path.join(split_run, language),
            tiny_vocab,
            max_seq_length=TEST_SEQ_LENGTH,
            micro_batch_size=4,
            rank=0,
            world_size=1,
            seed=1,
            shuffle_buffer_size=50,
        )
        for language in LANGUAGES
    }
    mixture = MixtureLoader(loaders, {"de": 0.7, "en": 0.3}, 3, 0, "repeat", "data.phases.0")
    it, picked = iter(mixture), []
    for _ in range(200):
        next(it)
        picked += [name for name, tokens in mixture.take_tokens().items() if tokens]
    it.close()
    assert abs(picked.count("de") - 140) <= 3


def test_languages_from_directories(tiny_documents, tiny_vocab, ray_local, tmp_path):
    corpus = tmp_path / "corpus"
    for k, language in enumerate(LANGUAGES):
        (corpus / language).mkdir(parents=True)
        texts = _documents(tiny_documents)[k::2]
        (corpus / language / "part.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "data"
    prepare(tiny_prepare_options(str(corpus), tiny_vocab, str(out), languages_from_dirs=True, split_by_language=True))
    for language in LANGUAGES:
        manifest = read_manifest(str(out / language))
        assert [os.path.basename(os.path.dirname(i["path"])) for i in manifest["inputs"]] == [language]
        assert manifest["totals"]["samples"] > 0


def test_a_document_without_the_language_field_names_field_file_and_line(
    labelled, tiny_vocab, ray_local, tmp_path, capsys
):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(labelled.read_text().splitlines()[0] + "\n" + json.dumps({"text": "Kein Feld hier."}) + "\n")
    base = ["prepare", "--vocab", tiny_vocab, "--no-progress", "--language-field", "lang"]
    assert main([*base, "--input", str(bad), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    at = len(labelled.read_text().splitlines()[0]) + 1
    assert f"{bad}: line 2 (byte {at}) has no string field 'lang' (--language-field)" in err
    assert not (tmp_path / "out").exists()
    txt = tmp_path / "plain.txt"
    txt.write_text("A sentence.\n")
    assert main([*base, "--input", str(txt), "--output", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().endswith(f"--language-field lang: {txt} is not JSON lines (no fields)")
    assert main([*base[:-2], "--input", str(txt), "--output", str(tmp_path / "out"), "--split-by-language"]) == 2
    assert "--split-by-language: needs the documents' languages" in capsys.readouterr().err
