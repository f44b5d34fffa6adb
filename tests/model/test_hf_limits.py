"""A config.json is input: every command that reads a Hugging Face directory (finetune, embed, evaluate, attention)
checks its values' types and ranges and compares the model it describes with the weights' names and shapes
before anything is built, and refuses a disagreement in one line naming the file and the field, exit 2.
`num_hidden_layers: 1` over a 4-layer checkpoint made every one of them silently drop three layers;
`hidden_size: 1048576` tried to allocate tens of gigabytes."""

from __future__ import annotations

import json

import pytest
import torch

from bertdist.cli import main
from bertdist.errors import USAGE_EXIT_CODE
from bertdist.model.hf_limits import config_problems
from tests.conftest import tiny_model_config


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_vocab):
    """A 4-layer export, a text file, a classification task and a BEIR-format collection to point commands at."""
    from bertdist.model.bert.hf import save_pretrained
    from bertdist.model.bert.model import BertForPreTraining

    root = tmp_path_factory.mktemp("limits")
    torch.manual_seed(0)
    save_pretrained(BertForPreTraining(tiny_model_config(num_layers=4)), root / "good", tiny_vocab)
    (root / "texts.txt").write_text("the module copies files .\nbirds sing at dawn .\n")
    for name in ("train", "dev"):
        (root / f"{name}.csv").write_text("sentence,label\n" + "".join(f"text {i},{i % 2}\n" for i in range(8)))
    collection = root / "beir"
    (collection / "qrels").mkdir(parents=True)
    (collection / "corpus.jsonl").write_text('{"_id": "d1", "text": "birds sing"}\n{"_id": "d2", "text": "files"}\n')
    (collection / "queries.jsonl").write_text('{"_id": "q1", "text": "birds"}\n')
    (collection / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    return root


def commands(model, root, out):
    return {
        "embed": ["embed", "--model", str(model), "--input", str(root / "texts.txt"), "--output", str(out / "e")],
        "attention": ["attention", "--model", str(model), "--text", "birds sing", "--output", str(out / "a")],
        "evaluate": [
            "evaluate",
            "--suite",
            "retrieval",
            "--data-dir",
            str(root / "beir"),
            "--model",
            str(model),
            "--output",
            str(out / "r"),
        ],
        "finetune": [
            "finetune",
            f"finetune.init_from={model}",
            f"finetune.train_file={root / 'train.csv'}",
            f"finetune.dev_file={root / 'dev.csv'}",
            f"finetune.output_dir={out / 'f'}",
        ],
    }


@pytest.mark.parametrize(
    "change, said",
    [
        ({"num_hidden_layers": 1}, "weights of modules config.json does not describe, e.g. bert.encoder.layer.1."),
        ({"num_hidden_layers": True}, "num_hidden_layers: must be an integer from 1 to 1024, got True"),
        ({"hidden_size": 1048576}, "hidden_size: must be an integer from 1 to 65536, got 1048576"),
        ({"intermediate_size": -3}, "intermediate_size: must be an integer from 1 to 262144, got -3"),
        ({"num_attention_heads": "2"}, "num_attention_heads: must be an integer from 1 to 1024, got '2'"),
        ({"hidden_size": 128, "num_attention_heads": 4}, "shapes disagree with config.json"),
        ({"layer_norm_eps": "tiny"}, "layer_norm_eps: must be a positive number, got 'tiny'"),
    ],
    ids=["fewer-layers", "layers-true", "huge", "negative", "string", "wider", "eps-string"],
)
def test_a_config_that_disagrees_with_its_weights_is_one_line_naming_the_file(
    checkpoint, tmp_path, capsys, change, said
):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(checkpoint / "good", model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, **change}))
    for name, arguments in commands(model, checkpoint, tmp_path / "out").items():
        assert main(arguments) == USAGE_EXIT_CODE, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0] and str(model) in err[0], (name, err)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.npy"))


def test_the_limits_refuse_what_no_encoder_has_and_pass_released_shapes():
    bert_large = {"vocab_size": 30522, "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16}
    assert config_problems({**bert_large, "intermediate_size": 4096, "layer_norm_eps": 1e-12}) == []
    assert config_problems({"vocab_size": 256000, "max_position_embeddings": 8192, "global_rope_theta": 160000.0}) == []
    assert config_problems({"hidden_dropout_prob": 1.5, "n_layers": 0, "norm_eps": float("nan")}) == [
        "n_layers: must be an integer from 1 to 1024, got 0",
        "hidden_dropout_prob: must be a number from 0 to below 1, got 1.5",
        "norm_eps: must be a positive number, got nan",
    ]
