"""`bertdist export`: a ZeRO checkpoint becomes a Hugging Face directory that `transformers` loads and
that predicts exactly what the checkpoint predicts."""

from __future__ import annotations

import json

import pytest
import torch

from bertdist.cli import main
from bertdist.config import ModelConfig
from bertdist.model.bert.model import BertForPreTraining
from bertdist.train.checkpoint import read_train_state
from bertdist.train.consolidate import consolidated_state_dict
from bertdist.train.export import find_checkpoint
from bertdist.train.train_state import CheckpointError
from tests import training_runs as runs

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("zero_stage, precision", runs.ENGINES, ids=runs.ENGINE_IDS)
def test_exported_model_predicts_like_the_checkpoint(
    tmp_path, tmp_path_factory, tiny_shards, tiny_vocab, zero_stage, precision
):
    transformers = pytest.importorskip("transformers")
    base = str(tmp_path_factory.getbasetemp() / "training")
    run = runs.uninterrupted(base, tiny_shards, tiny_vocab, zero_stage, precision)
    assert main(["export", str(run.out), "--output", str(tmp_path / "hf")]) == 0  # the run dir -> its latest

    source = find_checkpoint(run.out)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["bertdist_checkpoint"] == str(source.resolve())  # where the weights came from travels with them
    ours = BertForPreTraining(ModelConfig(**read_train_state(source).config["model"]))
    ours.load_state_dict(consolidated_state_dict(source))
    theirs = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    batch = tokenizer(
        ["the river ran past the old [MASK] and the church .", "a team of [MASK] played"],
        padding=True,
        return_tensors="pt",
    )
    ours.eval(), theirs.eval()
    with torch.no_grad():
        want = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        got = theirs(**batch)
    real = batch["attention_mask"].bool()  # padded slots carry no prediction (ours are not even computed)
    torch.testing.assert_close(got.prediction_logits[real], want.mlm_logits[real], rtol=1e-5, atol=1e-5)
    assert torch.equal(got.prediction_logits[real].argmax(-1), want.mlm_logits[real].argmax(-1))
    torch.testing.assert_close(got.seq_relationship_logits, want.nsp_logits, rtol=1e-5, atol=1e-5)


def test_export_of_something_that_is_not_a_checkpoint_is_an_error(tmp_path, capsys):
    assert main(["export", str(tmp_path), "--output", str(tmp_path / "hf")]) == 2
    assert "neither a complete checkpoint" in capsys.readouterr().err
    with pytest.raises(CheckpointError):
        find_checkpoint(tmp_path)
    # A Hugging Face directory of a model bertdist does not read was copied and said exported, exit 0
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text('{"model_type": "gpt2"}')
    assert main(["export", str(tmp_path / "gpt2"), "--output", str(tmp_path / "out")]) == 2
    assert "config.json: model_type 'gpt2' is not one bertdist reads" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
