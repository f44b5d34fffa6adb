"""`bertdist train --dry-run` checks the shards as the run does (bertdist.train.loaders)."""

from __future__ import annotations

from bertdist.cli import main
from bertdist.errors import USAGE_EXIT_CODE
from tests import training_runs as runs


def test_the_dry_run_refuses_shards_of_another_vocabulary_and_says_which_are_not_prepared(
    tmp_path, tiny_shards, tiny_vocab, capsys
):
    config = runs.write_config(tmp_path, tiny_shards, tiny_vocab, 1)
    assert main(["train", "--config", str(config), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"phase 0 train: {tiny_shards}: sentence pairs (MLM + NSP), made with this vocabulary: checked" in out, out

    other = tmp_path / "other-vocab.txt"  # the same size, two words swapped: what another `bertdist vocab` gives
    tokens = open(tiny_vocab).read().splitlines()
    tokens[-1], tokens[-2] = tokens[-2], tokens[-1]
    other.write_text("\n".join(tokens) + "\n")
    assert main(["train", "--config", str(config), "--dry-run", f"data.vocab_file={other}"]) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert "another vocabulary" in err and tiny_shards in err and len(err.strip().splitlines()) == 1, err

    missing = tmp_path / "not-yet"
    assert main(["train", "--config", str(config), "--dry-run", f"data.phases.0.eval_dir={missing}"]) == 0
    assert f"phase 0 eval: {missing}: not prepared yet (no manifest.json)" in capsys.readouterr().out


def test_the_objective_trains_only_on_samples_it_can_use(tmp_path, tiny_shards, tiny_vocab, capsys):
    """Sentence-order prediction on NSP pairs would train the head on the wrong labels: refused before a step,
    naming the objective, the shards and what they were prepared with (MLM alone takes any samples)."""
    config = runs.write_config(tmp_path, tiny_shards, tiny_vocab, 1)
    code = main(["train", "--config", str(config), "--dry-run", "model.objective=mlm+sop"])
    err = capsys.readouterr().err
    assert (
        code == USAGE_EXIT_CODE
        and "model.objective: mlm+sop" in err
        and "--objective sop" in err
        and "--objective nsp" in err
    ), err
    assert main(["train", "--config", str(config), "--dry-run", "model.objective=mlm"]) == 0
    assert main(["train", "--config", str(config), "--dry-run", "model.next_sentence_prediction=false"]) == 2
    err = capsys.readouterr().err
    assert "model.next_sentence_prediction: renamed: use model.objective (true: mlm+nsp, false: mlm)" in err, err
