"""`bertdist train --dry-run` checks the shards as the run does (bertdist.train.loaders)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bertdist.cli import main
from bertdist.data.shards import MANIFEST
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
        and "--samples sop" in err
        and "--samples nsp" in err
    ), err
    assert main(["train", "--config", str(config), "--dry-run", "model.objective=mlm"]) == 0
    assert main(["train", "--config", str(config), "--dry-run", "model.next_sentence_prediction=false"]) == 2
    err = capsys.readouterr().err
    assert "model.next_sentence_prediction: renamed: use model.objective (true: mlm+nsp, false: mlm)" in err, err


def test_shards_prepared_when_samples_was_called_objective_are_read_as_before(tmp_path, mlm_shards, tiny_vocab, capsys):
    """An earlier bertdist wrote the kind of samples as the manifest option `objective`
    (bertdist.data.shards.upgrade_options): its MLM-only text stays MLM-only text for the loader, the run's check
    and `bertdist inspect`, where read as the default it would pass for NSP pairs."""
    old = tmp_path / "prepared-before"
    shutil.copytree(mlm_shards, old)
    manifest = json.loads((old / MANIFEST).read_text())
    manifest["options"] = {"objective" if k == "samples" else k: v for k, v in manifest["options"].items()}
    (old / MANIFEST).write_text(json.dumps(manifest))

    config = runs.write_config(tmp_path, str(old), tiny_vocab, 0, recipe="fast")
    assert main(["train", "--config", str(config), "--dry-run"]) == 0
    assert f"phase 0 train: {old}: MLM-only text, made with this vocabulary: checked" in capsys.readouterr().out
    assert main(["train", "--config", str(config), "--dry-run", "model.objective=mlm+nsp"]) == USAGE_EXIT_CODE
    assert f"{old} was prepared with --samples mlm;" in capsys.readouterr().err
    assert main(["inspect", str(old), "--examples", "1"]) == 0
    out = capsys.readouterr().out
    assert "samples=mlm" in out and "sentence task: none (samples mlm" in out and "IsNext" not in out


def test_each_phase_masks_at_its_own_rate_and_static_shards_refuse_one(
    tmp_path, mlm_shards, tiny_shards, tiny_vocab, capsys
):
    """mmBERT lowers the masking rate by phase (30% -> 15% -> 5%): a phase's loader masks at its rate and split
    (within 2 points over a few thousand tokens), the plan says so, and shards whose masks were made at prepare
    time refuse a phase rate in one line naming the phase, and any data.masking rule other than theirs."""
    import numpy as np

    from bertdist.config import load_config
    from bertdist.train.loaders import phase_loader

    config = runs.write_config(tmp_path, mlm_shards, tiny_vocab, 0, recipe="fast")
    cfg = load_config(config, ["data.phases.0.masked_lm_prob=0.4", "data.phases.0.mask_token_fraction=1.0"])
    cfg.data.phases.append(load_config(config).data.phases[0])  # a second phase at data.masking's 15%
    cfg.data.phases[1].masked_lm_prob = 0.05
    for phase, rate in zip(cfg.data.phases, (0.4, 0.05)):
        loader = phase_loader(cfg, phase, mlm_shards, workers=0)
        batches = [b for _, b in zip(range(12), loader)]
        predicted = sum(int((b["masked_lm_ids"] != -100).sum()) for b in batches)
        tokens = sum(int(b["attention_mask"].sum()) for b in batches)
        assert abs(predicted / tokens - rate) < 0.02, (predicted / tokens, rate)
        if rate == 0.4:  # all [MASK]: the phase's split, not data.masking's 80/10/10
            shown = np.concatenate(
                [
                    b["input_ids"].gather(1, b["masked_lm_positions"])[b["masked_lm_ids"] != -100].numpy()
                    for b in batches
                ]
            )
            assert (shown == loader._layout.masker.vocab.mask_id).all()
    assert main(["train", "--config", str(config), "--dry-run", "data.phases.0.masked_lm_prob=0.3"]) == 0
    assert "masking 30% (80% [MASK], 10% random)" in capsys.readouterr().out

    static = runs.write_config(tmp_path / "static", tiny_shards, tiny_vocab, 0, recipe="fast")
    assert main(["train", "--config", str(static), "--dry-run", "data.phases.0.masked_lm_prob=0.3"]) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert "data.phases.0: its own masking rate or split needs shards masked at load time" in err
    assert "Traceback" not in err and tiny_shards in err
    # The run-wide rules too: the shards' masks (15%, 80/10/10, token by token) would be trained on regardless.
    asked = ["data.masking.masked_lm_prob=0.4", "data.masking.whole_word_mask=true"]
    assert main(["train", "--config", str(static), "--dry-run", *asked]) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert f"data.masking.masked_lm_prob: 0.4, and the masks in {tiny_shards} (prepared with --masking static) " in err
    assert "were made with 0.15;" in err and "data.masking.whole_word_mask: True, " in err and "made with False" in err
    assert main(["train", "--config", str(static), "--dry-run", "data.masking.masked_lm_prob=0.15"]) == 0
    # Eval shards' masks are the evaluation's own (ModernBERT trains at 30% and evaluates at 15%): not refused
    at_30 = ["data.masking.masked_lm_prob=0.3", f"data.phases.0.eval_dir={tiny_shards}"]
    assert main(["train", "--config", str(config), "--dry-run", *at_30]) == 0, capsys.readouterr().err
    assert main(["train", "--config", str(config), "--dry-run", "data.phases.0.masked_lm_prob=1.5"]) == USAGE_EXIT_CODE
    assert "data.phases.0.masked_lm_prob: must be in (0, 1)" in capsys.readouterr().err
    capped = ["data.phases.0.masked_lm_prob=0.4", "data.masking.max_predictions_per_seq=5"]  # 0.4 x 32 = 13 > 5
    assert main(["train", "--config", str(config), "--dry-run", *capped]) == USAGE_EXIT_CODE
    assert "above data.masking.max_predictions_per_seq=5, which would cut the rate" in capsys.readouterr().err


def _mixture_overrides(**sources: str) -> list[str]:
    return [f"data.sources.{name}={path}" for name, path in sources.items()] + [
        f"data.phases.0.mixture.{name}={weight}" for name, weight in zip(sources, (3, 1))
    ]


def test_the_dry_run_shows_each_source_share_tokens_and_epochs(tmp_path, tiny_shards, tiny_vocab, capsys):
    config = runs.write_config(tmp_path, tiny_shards, tiny_vocab, 1)
    args = ["train", "--config", str(config), "--dry-run", *_mixture_overrides(web=tiny_shards, wiki=tiny_shards)]
    assert main(args) == 0
    out = capsys.readouterr().out
    phase = next(line for line in out.splitlines() if line.startswith("phase 0: "))
    assert "mixture web 75.0% (" in phase and "wiki 25.0% (" in phase and "shards" not in phase, phase
    assert f"phase 0 train web: {tiny_shards}: sentence pairs (MLM + NSP), made with this vocabulary: checked" in out
    assert "phase 0 train wiki: 25.0% of the phase, " in out and " epochs)" in out, out

    assert main([*args, "data.phases.0.mixture_temperature=0.5"]) == 0
    assert "mixture web 75.0% (" in capsys.readouterr().out  # the same tokens in both: the weights decide


def test_temperature_shares_weigh_one_pass_over_each_source(tmp_path, tiny_shards, tiny_vocab):
    """The same text prepared with five passes (static masks, the default) and with one (masks at load time):
    its manifest counts five times the sample tokens, and a temperature weighed it 5^τ times as much."""
    from bertdist.config import load_config
    from bertdist.train.loaders import phase_shares

    passes = tmp_path / "five-passes"
    passes.mkdir()
    manifest = json.loads((Path(tiny_shards) / MANIFEST).read_text())
    once = manifest["options"]["dupe_factor"]
    manifest["options"]["dupe_factor"] = 5 * once
    manifest["totals"]["sample_tokens"] *= 5
    (passes / MANIFEST).write_text(json.dumps(manifest))
    config = runs.write_config(tmp_path, tiny_shards, tiny_vocab, 1)
    for temperature in (1.0, 0.3):
        mixture = [
            *_mixture_overrides(one=tiny_shards, five=str(passes)),
            f"data.phases.0.mixture_temperature={temperature}",
        ]
        mixture = [m.replace("=3", "=1") for m in mixture]  # equal weights: the temperature alone decides
        assert phase_shares(load_config(config, mixture), 0) == pytest.approx({"one": 0.5, "five": 0.5})


@pytest.mark.parametrize("reader", ["train --dry-run", "train"])
def test_sources_of_another_vocabulary_or_sample_kind_are_refused_naming_them(
    reader, tmp_path, tiny_shards, sop_shards, tiny_vocab, capsys
):
    config = runs.write_config(tmp_path, tiny_shards, tiny_vocab, 1)
    command = ["train", "--config", str(config), *(["--dry-run"] if "dry" in reader else [])]
    mixed = [*_mixture_overrides(pairs=tiny_shards, order=sop_shards), "model.objective=mlm"]
    assert main([*command, *mixed]) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert "data.phases.0.mixture: its sources were prepared as different samples" in err and sop_shards in err, err

    other = tmp_path / "other-vocab"
    shutil.copytree(tiny_shards, other)
    manifest = json.loads((other / MANIFEST).read_text())
    manifest["vocab_sha256"] = "0" * 64
    (other / MANIFEST).write_text(json.dumps(manifest))
    assert main([*command, *_mixture_overrides(web=tiny_shards, other=str(other))]) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    refusal = err.strip().splitlines()[-1]  # (the run says first that no launcher started it)
    assert "another vocabulary" in refusal and str(other) in refusal and "Traceback" not in err, err
