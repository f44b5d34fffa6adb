"""`bertdist embed`: features of a frozen model equal transformers' hidden states and pooler on the same
weights and text, in shards with an index; bad options fail before anything is written."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertdist.cli import main
from bertdist.errors import USAGE_EXIT_CODE
from tests.conftest import tiny_model_config

transformers = pytest.importorskip("transformers")

TEXTS = [
    "The module copies files.",
    "A dog ran far away from home, and then it came back.",
    "Birds sing at dawn.",
    "Return true if the object is a built-in function.",
    "x",
    "Another line of text here.",
    "The end.",
]


@pytest.fixture
def pretrained(tmp_path, tiny_vocab):
    from bertdist.model.bert.hf import save_pretrained
    from bertdist.model.bert.model import BertForPreTraining

    torch.manual_seed(0)
    # Four layers: "the last four" are then not the embeddings' output.
    save_pretrained(BertForPreTraining(tiny_model_config(num_layers=4)), tmp_path / "pretrained", tiny_vocab)
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    return tmp_path / "pretrained"


def _reference(model_dir):
    model = transformers.BertModel.from_pretrained(model_dir).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True)
    return out, batch["attention_mask"].sum(dim=1).tolist(), batch["input_ids"]


def _load(directory, name):
    index = json.loads((directory / "index.json").read_text())
    return index, np.concatenate([np.load(directory / s[name]) for s in index["shards"]])


@pytest.mark.parametrize("features", ["last", "layer:1", "last4-sum", "pooled"])
def test_sequence_features_equal_transformers(features, pretrained, tmp_path, capsys):
    out = tmp_path / f"features-{features.replace(':', '')}"
    assert (
        main(
            [
                "embed",
                "--model",
                str(pretrained),
                "--input",
                str(tmp_path / "texts.txt"),
                "--output",
                str(out),
                "--features",
                features,
                "--shard-rows",
                "3",
                "--batch-size",
                "2",
            ]
        )
        == 0
    )
    assert '"rows": 7' in capsys.readouterr().out
    index, got = _load(out, "features")
    reference, _, _ = _reference(pretrained)
    states = reference.hidden_states
    expected = {
        "last": states[-1][:, 0],
        "layer:1": states[1][:, 0],
        "pooled": reference.pooler_output,
        "last4-sum": torch.stack(states[-4:]).sum(0)[:, 0],
    }[features]
    assert [s["rows"] for s in index["shards"]] == [3, 3, 1] and index["dimension"] == 64
    torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-5, rtol=1e-5)


def test_token_features_are_the_last_four_layers_of_every_token(pretrained, tmp_path):
    out = tmp_path / "tokens"
    assert (
        main(
            [
                "embed",
                "--model",
                str(pretrained),
                "--input",
                str(tmp_path / "texts.txt"),
                "--output",
                str(out),
                "--features",
                "last4-concat",
                "--level",
                "token",
                "--shard-rows",
                "4",
            ]
        )
        == 0
    )
    index = json.loads((out / "index.json").read_text())
    reference, lengths, ids = _reference(pretrained)
    expected = torch.cat(reference.hidden_states[-4:], dim=-1)
    row = 0
    for shard in index["shards"]:
        features, tokens, offsets = (np.load(out / shard[k]) for k in ("features", "tokens", "offsets"))
        assert features.shape[1] == 4 * 64 and len(offsets) == shard["rows"] + 1
        for r in range(shard["rows"]):
            n = lengths[row]
            assert tokens[offsets[r] : offsets[r + 1]].tolist() == ids[row, :n].tolist()
            torch.testing.assert_close(
                torch.from_numpy(features[offsets[r] : offsets[r + 1]]), expected[row, :n], atol=1e-5, rtol=1e-5
            )
            row += 1
    assert row == len(TEXTS)


def test_bad_options_fail_before_writing(pretrained, tmp_path, capsys):
    args = ["embed", "--model", str(pretrained), "--input", str(tmp_path / "texts.txt")]
    assert (
        main([*args, "--output", str(tmp_path / "a"), "--features", "pooled", "--level", "token", "--batch-size", "0"])
        == USAGE_EXIT_CODE
    )
    err = capsys.readouterr().err
    assert "--features pooled is one vector per sequence" in err and "--batch-size: must be positive" in err
    assert main([*args, "--output", str(tmp_path / "b"), "--features", "layer:9"]) == USAGE_EXIT_CODE
    assert "the model has layers 0..4" in capsys.readouterr().err
    assert main([*args, "--output", str(pretrained)]) == USAGE_EXIT_CODE
    assert f"--output: {pretrained} is inside the --model" in capsys.readouterr().err  # before anything is read
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "kept.txt").write_text("x")
    assert main([*args, "--output", str(tmp_path / "full")]) == USAGE_EXIT_CODE
    assert "is not empty" in capsys.readouterr().err
    # a .txt input has no columns: a column asked for was ignored without a word
    assert main([*args, "--output", str(tmp_path / "c"), "--text-pair-column", "b"]) == USAGE_EXIT_CODE
    assert "is plain text, one text per line, without columns" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_blank_lines_are_rows_so_vectors_stay_aligned_with_their_lines(pretrained, tmp_path, capsys):
    with_blanks = tmp_path / "blanks.txt"
    with_blanks.write_text("\n".join([TEXTS[0], "", TEXTS[1], "   ", TEXTS[2]]) + "\n")
    out = tmp_path / "blank-features"
    assert main(["embed", "--model", str(pretrained), "--input", str(with_blanks), "--output", str(out)]) == 0
    assert "2 blank line(s) embedded as empty text" in capsys.readouterr().out
    index, got = _load(out, "features")
    assert index["rows"] == 5 and index["blank_lines"] == [2, 4]
    reference, _, _ = _reference(pretrained)
    for line, text_index in ((1, 0), (3, 1), (5, 2)):  # line N of the file is row N - 1
        torch.testing.assert_close(
            torch.from_numpy(got[line - 1]), reference.hidden_states[-1][text_index, 0], atol=1e-5, rtol=1e-5
        )
    torch.testing.assert_close(got[1], got[3])  # both blank lines: the features of [CLS] [SEP]


def test_modernbert_features_equal_transformers_hidden_states(tmp_path, tiny_vocab, capsys):
    from tests.finetune.test_runner import _modernbert_export

    export = _modernbert_export(tmp_path / "modernbert", tiny_vocab)
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    model = transformers.ModernBertModel.from_pretrained(export).eval()
    batch = transformers.AutoTokenizer.from_pretrained(export)(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        states = model(**batch, output_hidden_states=True).hidden_states
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    for features, level in (("layer:2", "sequence"), ("last", "token")):
        out = tmp_path / f"features-{level}"
        assert (
            main(
                [
                    "embed",
                    "--model",
                    str(export),
                    "--input",
                    str(tmp_path / "texts.txt"),
                    "--output",
                    str(out),
                    "--features",
                    features,
                    "--level",
                    level,
                    "--batch-size",
                    "3",
                ]
            )
            == 0
        )
        _, got = _load(out, "features")
        if level == "sequence":
            torch.testing.assert_close(torch.from_numpy(got), states[2][:, 0], atol=1e-5, rtol=1e-5)
        else:
            expected = torch.cat([states[-1][row, :n] for row, n in enumerate(lengths)])
            torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-5, rtol=1e-5)
    code = main(
        [
            "embed",
            "--model",
            str(export),
            "--input",
            str(tmp_path / "texts.txt"),
            "--output",
            str(tmp_path / "pooled"),
            "--features",
            "pooled",
        ]
    )
    assert code == USAGE_EXIT_CODE and "has no pooler weights (ModernBERT" in capsys.readouterr().err


def _released_sentence_encoder(directory, vocab, normalize: bool, cased: bool = False):
    """A sentence-transformers BERT as someone else makes one, not through bertdist: heads of 32 dimensions (not
    the tiny model's), layer-norm eps 1e-7, and a tokenizer.json that pads every text to 64 and cuts at 64 itself,
    as sentence-transformers' MiniLM's does (128 there); texts cut at 48 tokens (sentence_bert_config.json)."""
    from sentence_transformers import SentenceTransformer, models

    torch.manual_seed(3)
    config = transformers.BertConfig(
        vocab_size=len(open(vocab).read().splitlines()),
        hidden_size=96,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=160,
        layer_norm_eps=1e-7,
        max_position_embeddings=64,
    )
    bare = directory / "bare"
    transformers.BertModel(config).save_pretrained(bare)
    tokenizer = transformers.BertTokenizerFast(vocab, do_lower_case=not cased)
    tokenizer.save_pretrained(bare)
    spec = json.loads((bare / "tokenizer.json").read_text())
    spec["truncation"] = {"direction": "Right", "max_length": 64, "strategy": "LongestFirst", "stride": 0}
    spec["padding"] = {
        "strategy": {"Fixed": 64},
        "direction": "Right",
        "pad_to_multiple_of": None,
        "pad_id": 0,
        "pad_type_id": 0,
        "pad_token": "[PAD]",
    }
    (bare / "tokenizer.json").write_text(json.dumps(spec))
    modules = [models.Transformer(str(bare), max_seq_length=48), models.Pooling(96, pooling_mode="mean")]
    released = directory / (("cased-" if cased else "") + ("normalized" if normalize else "released"))
    SentenceTransformer(modules=modules + ([models.Normalize()] if normalize else []), device="cpu").save(str(released))
    return released


@pytest.mark.parametrize("normalize", [False, True])
def test_a_released_sentence_encoder_gives_its_own_vectors_and_tokens(normalize, tmp_path, tiny_vocab):
    """`bertdist embed` on a sentence-transformers BERT that bertdist did not write gives what
    `SentenceTransformer.encode` gives (1e-5), and token rows are the tokenizer's own ids, [SEP] last: the
    tokenizer.json's padding made its [PAD]s tokens of every text, and the pooled vectors differed by more than 1."""
    from sentence_transformers import SentenceTransformer

    released = _released_sentence_encoder(tmp_path, tiny_vocab, normalize)
    texts = TEXTS + [" ".join(["the module copies files and returns"] * 12)]  # over 48 tokens: cut there
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    expected = SentenceTransformer(str(released), device="cpu").encode(texts, convert_to_numpy=True)
    out = tmp_path / "vectors"
    assert main(["embed", "--model", str(released), "--input", str(tmp_path / "texts.txt"), "--output", str(out)]) == 0
    index, got = _load(out, "features")
    assert index["pooling"] == "mean" and index["max_seq_length"] == 48 and index["normalized"] is normalize
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)

    tokens_out = tmp_path / "tokens"
    arguments = ["embed", "--model", str(released), "--input", str(tmp_path / "texts.txt"), "--output"]
    assert main([*arguments, str(tokens_out), "--level", "token"]) == 0
    index, _ = _load(tokens_out, "features")
    shard = index["shards"][0]
    tokens, offsets = (np.load(tokens_out / shard[k]) for k in ("tokens", "offsets"))
    reference = transformers.AutoTokenizer.from_pretrained(released)(texts[:-1])["input_ids"]
    assert [tokens[offsets[r] : offsets[r + 1]].tolist() for r in range(len(texts) - 1)] == reference

    # Its ONNX graph (bertdist export --format onnx) computes the same vectors, Normalize included
    ort = pytest.importorskip("onnxruntime")
    import shutil

    from bertdist.model.onnx import ONNX_FILE, write_onnx

    shutil.copytree(released, tmp_path / "onnx")
    write_onnx(tmp_path / "onnx")
    session = ort.InferenceSession(str(tmp_path / "onnx" / ONNX_FILE))
    batch = transformers.AutoTokenizer.from_pretrained(released)(texts[:-1], padding=True, return_tensors="np")
    (got,) = session.run(None, {i.name: batch[i.name] for i in session.get_inputs()})
    np.testing.assert_allclose(got, expected[:-1], atol=1e-4, rtol=1e-4)
    # cut to its truncate_dim, as SentenceTransformer.encode cuts (after Normalize): the graph gave the whole vector
    shutil.copytree(released, tmp_path / "cut")
    settings = tmp_path / "cut" / "config_sentence_transformers.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "truncate_dim": 32}))
    cut = SentenceTransformer(str(tmp_path / "cut"), device="cpu").encode(texts[:-1], convert_to_numpy=True)
    write_onnx(tmp_path / "cut")
    session = ort.InferenceSession(str(tmp_path / "cut" / ONNX_FILE))
    (got,) = session.run(None, {i.name: batch[i.name] for i in session.get_inputs()})
    assert got.shape == cut.shape == (len(texts) - 1, 32)
    np.testing.assert_allclose(got, cut, atol=1e-4, rtol=1e-4)


def test_a_released_encoder_s_prompt_lower_casing_and_truncate_dim_are_applied_as_its_encode_applies_them(
    tmp_path, tiny_vocab
):
    """A directory whose config names a default prompt, lower-cases its texts (sentence_bert_config.json's
    do_lower_case, over a cased tokenizer) and cuts its vectors (truncate_dim): `embed` ignored the first two, and
    `evaluate --suite retrieval` and `mine-negatives` all three, giving vectors the model does not give."""
    from sentence_transformers import SentenceTransformer

    from bertdist.finetune.embed import open_encoder, sentence_vectors

    released = _released_sentence_encoder(tmp_path, tiny_vocab, normalize=True, cased=True)
    settings = released / "config_sentence_transformers.json"
    prompts = {"prompts": {"query": "Find The ", "document": ""}, "default_prompt_name": "query", "truncate_dim": 32}
    settings.write_text(json.dumps({**json.loads(settings.read_text()), **prompts}))
    module = released / "sentence_bert_config.json"
    module.write_text(json.dumps({**json.loads(module.read_text()), "do_lower_case": True}))
    texts = [t.upper() for t in TEXTS]
    expected = SentenceTransformer(str(released), device="cpu").encode(texts, convert_to_numpy=True)
    assert expected.shape == (len(texts), 32)
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    out = tmp_path / "vectors"
    assert main(["embed", "--model", str(released), "--input", str(tmp_path / "texts.txt"), "--output", str(out)]) == 0
    np.testing.assert_allclose(_load(out, "features")[1], expected, atol=1e-5, rtol=1e-5)
    scored = sentence_vectors(open_encoder(str(released), 0), texts, "mean", batch_size=4)  # retrieval's, mining's
    unit = expected / np.linalg.norm(expected, axis=1, keepdims=True)  # what cosine similarity compares
    np.testing.assert_allclose(scored, unit, atol=1e-5, rtol=1e-5)
    (released / "1_Pooling" / "config.json").write_text(
        json.dumps({**json.loads((released / "1_Pooling" / "config.json").read_text()), "include_prompt": False})
    )
    assert (
        main(["embed", "--model", str(released), "--input", str(tmp_path / "texts.txt"), "--output", str(out) + "2"])
        == 2
    )


def test_a_sentence_encoder_with_a_module_bertdist_does_not_compute_is_refused(tmp_path, tiny_vocab, capsys):
    released = _released_sentence_encoder(tmp_path, tiny_vocab, normalize=False)
    modules = json.loads((released / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (released / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    arguments = ["embed", "--model", str(released), "--input", str(tmp_path / "texts.txt")]
    assert main([*arguments, "--output", str(tmp_path / "out")]) == USAGE_EXIT_CODE
    assert "module Dense is not supported yet" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    # What the Dense module does not touch is still the model's: token features, another pooling
    assert main([*arguments, "--output", str(tmp_path / "tokens"), "--level", "token"]) == 0
    assert main([*arguments, "--output", str(tmp_path / "cls"), "--pooling", "cls"]) == 0


def test_embedding_many_rows_shows_its_progress(pretrained, tmp_path, capsys, monkeypatch):
    """100,000 lines ran 28 minutes printing nothing: the rows done, their rate and the time left are shown, once
    a run has taken PROGRESS_EVERY_S (here 0)."""
    from bertdist.finetune import embed

    monkeypatch.setattr(embed, "PROGRESS_EVERY_S", 0.0)
    out = tmp_path / "progress"
    arguments = ["embed", "--model", str(pretrained), "--input", str(tmp_path / "texts.txt"), "--output", str(out)]
    assert main([*arguments, "--batch-size", "2"]) == 0
    err = capsys.readouterr().err
    assert "embed: 100%" in err and f"{len(TEXTS)}/{len(TEXTS)}" in err and "rows/s" in err, err


def test_a_roberta_is_held_to_the_tokens_its_positions_hold_past_the_padding_index(tiny_vocab, tmp_path, capsys):
    """RoBERTa's positions start past its padding index: with padding index 0, 64 of them hold 63 tokens (514 hold
    512 in the released models). --max-seq-length 64 passed the check against 64 and failed in the model with a
    traceback, as did 0 (the default, 64 here); 0 now cuts to what the rows hold."""
    from bertdist.model.roberta import hf as roberta_hf
    from bertdist.model.roberta.model import RobertaForMaskedLM

    torch.manual_seed(0)
    cfg = tiny_model_config(arch="roberta", objective="mlm", type_vocab_size=1, pad_token_id=0)  # tiny_vocab's
    roberta_hf.write_directory(RobertaForMaskedLM(cfg), tmp_path / "roberta", tiny_vocab, {})
    (tmp_path / "long.txt").write_text(" ".join(["the cat sat on the mat"] * 30) + "\n")
    args = ["embed", "--model", str(tmp_path / "roberta"), "--input", str(tmp_path / "long.txt")]
    holds = cfg.max_position_embeddings - 1
    too_long = [*args, "--output", str(tmp_path / "a"), "--max-seq-length", str(holds + 1)]
    assert main(too_long) == USAGE_EXIT_CODE
    assert f"is longer than the {holds} tokens the model's rows hold" in capsys.readouterr().err
    assert main([*args, "--output", str(tmp_path / "b")]) == 0


def test_a_terminated_or_killed_embed_leaves_nothing_that_stops_the_same_command(pretrained, tmp_path):
    """SIGTERM (kill, timeout, SLURM) ended embed at the signal's default action: no message, and a locked directory
    of shards and a partial file, which the same command then refused as not empty. Now SIGTERM is Ctrl-C's clean-up
    and one line (exit 143); after a SIGKILL, the rerun removes the killed run's shards and temporary files."""
    import signal
    import subprocess
    import sys
    import time

    texts = tmp_path / "many.txt"
    texts.write_text("".join(f"{TEXTS[i % len(TEXTS)]} {i}\n" for i in range(40_000)))
    out = tmp_path / "features"
    command = [sys.executable, "-m", "bertdist", "embed", "--model", str(pretrained), "--input", str(texts)]
    command += ["--output", str(out), "--shard-rows", "200"]

    def started_then(signum: int) -> subprocess.CompletedProcess:
        process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not (out / "features-00001.npy").exists():  # a shard written, another on its way
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-2000:]
            time.sleep(0.05)
        process.send_signal(signum)
        return subprocess.CompletedProcess(command, process.wait(timeout=60), "", process.stderr.read())

    stopped = started_then(signal.SIGTERM)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-2000:]
    assert "bertdist embed: stopped by SIGTERM" in stopped.stderr and "Traceback" not in stopped.stderr
    assert not out.exists()
    killed = started_then(signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    subprocess.run([*command[:-2], "--shard-rows", "20000"], check=True, timeout=600, capture_output=True)
    assert sorted(p.name for p in out.iterdir()) == ["features-00000.npy", "features-00001.npy", "index.json"]
