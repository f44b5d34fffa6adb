"""bertdist.demo's downstream comparison: the two fine-tunings differ only in where their weights come from, and
the result says what it can show. (The whole demo runs from the wheel in tests/test_packaging.py.)"""

from __future__ import annotations

import json

import pytest

from bertdist.config import load_config
from bertdist.demo import DEMO_CONFIGS, downstream_line, downstream_starts


@pytest.mark.parametrize("arch", sorted(DEMO_CONFIGS))
def test_both_starts_fine_tune_alike_but_for_their_weights(arch, tmp_path):
    """A ModernBERT export fine-tuned at BERT's default dropout (0.1) and its random twin at the preset's (0.0)."""
    cfg = load_config(DEMO_CONFIGS[arch], [f"train.output_dir={tmp_path / 'train'}"])
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"bertdist_run_id": "abc"}))
    starts = downstream_starts(tmp_path / "task", tmp_path / "model", cfg, epochs=1)
    pretrained, random_init = (set(starts[name]) for name in ("pretrained", "random init"))
    assert "finetune.epochs=1" in pretrained & random_init  # `bertdist demo --downstream-epochs 1`
    assert pretrained - random_init == {f"finetune.init_from={tmp_path / 'model'}"}
    assert {o.split("=")[0] for o in random_init - pretrained} == {
        "finetune.vocab_file",
        "model.size",
        "model.vocab_size",
    }
    assert f"model.hidden_dropout_prob={cfg.model.hidden_dropout_prob}" in pretrained
    assert f"model.attention_dropout_prob={cfg.model.attention_dropout_prob}" in pretrained
    assert "tracking.parent_run_id=abc" in pretrained


@pytest.mark.parametrize("flags", [["--downstream-epochs", "0"], ["--multilingual", "--downstream-epochs", "3"]])
def test_downstream_epochs_below_one_or_with_the_multilingual_demo_are_refused(flags, capsys):
    from bertdist.cli import main

    assert main(["demo", *flags]) == 2
    assert "--downstream-epochs" in capsys.readouterr().err


def test_an_mlm_only_demo_says_why_sentence_adjacency_cannot_show_its_gain():
    """`bertdist demo --arch modernbert` printed 0.526 against 0.525 as if pretraining had bought nothing."""
    bert, modernbert = (load_config(DEMO_CONFIGS[arch]) for arch in ("bert", "modernbert"))
    assert "not expected to beat" not in downstream_line(bert, 0.643, 0.551)
    line = downstream_line(modernbert, 0.526, 0.525)
    assert "0.526 fine-tuned from the pretrained model vs 0.525" in line
    assert "sentence adjacency rehearses next-sentence prediction, which mlm pretraining does not train" in line


@pytest.mark.slow
def test_the_multilingual_demo_adds_languages_lowers_temperature_and_masking_and_scores_each_language(tmp_path, capsys):
    """`bertdist demo --multilingual` at 30 steps on 30 pages a language: the three phases' shares and masking
    printed, 2 real ranks trained over per-language sources, and a table of held-out accuracy per language at each
    phase's end, the languages a phase had not trained on yet marked."""
    from bertdist.demo_multilingual import LANGUAGES_BY_PHASE, run_multilingual_demo
    from bertdist.errors import UserError

    try:
        code = run_multilingual_demo(str(tmp_path / "demo"), ranks=2, steps=30, pages_per_language=30)
    except UserError as e:
        pytest.skip(f"this machine lacks the translated manual pages: {e}")
    out = capsys.readouterr().out
    assert code == 0, out[-4000:]
    schedule = [line for line in out.splitlines() if line.startswith("  phase ")]
    assert [line.split("(temperature ")[1] for line in schedule] == [
        "0.7), masking 30%",
        "0.5), masking 15%",
        "0.3), masking 5%",
    ], schedule
    assert "zh_CN" not in schedule[1] and "zh_CN" in schedule[2] and "ja" not in schedule[0]
    table = out[out.index("  language ") : out.index("  (* not trained on yet")].splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in table[1:]}
    assert {"en", "zh_CN"} <= set(rows) <= {lang for added in LANGUAGES_BY_PHASE for lang in added}, table
    assert rows["zh_CN"][0].endswith("*") and rows["zh_CN"][1].endswith("*") and not rows["zh_CN"][2].endswith("*")
    assert not any(cell.endswith("*") for cell in rows["en"])
    assert all(0.0 < float(cell.rstrip("*")) < 1.0 for cells in rows.values() for cell in cells)
