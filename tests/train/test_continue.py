"""Continued pretraining as docs/training.md describes it: a released ModernBERT directory (weights, config.json, a
tokenizer.json whose special tokens are not BERT's ids) -> `bertdist prepare --tokenizer MODEL_DIR` -> `bertdist train`
from its weights with a decay-only wsd schedule -> an export that transformers loads."""

from __future__ import annotations

import json

import pytest
import torch

from bertdist.cli import main
from bertdist.config import ModelConfig
from bertdist.model import modernbert_hf
from bertdist.model.modernbert import ModernBertForMaskedLM
from bertdist.train.distributed import free_tcp_port
from tests.training_runs import read_metrics

pytestmark = pytest.mark.slow


def test_a_released_modernbert_continues_on_new_text_with_its_own_tokenizer(
    tmp_path, tiny_corpus, high_id_tokenizer, ray_local, monkeypatch
):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    cfg = ModelConfig.from_size(
        "modernbert-tiny",
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=2,
        vocab_size=1024,
        max_position_embeddings=128,
        local_attention=16,
    )
    torch.manual_seed(0)
    released = tmp_path / "released"
    modernbert_hf.write_directory(ModernBertForMaskedLM(cfg), released, f"{high_id_tokenizer}/tokenizer.json", {})

    shards = tmp_path / "shards"
    assert (
        main(
            [
                "prepare",
                "--input",
                tiny_corpus,
                "--output",
                str(shards),
                "--tokenizer",  # --vocab's other name, for a model's own tokenizer
                str(released),
                "--objective",
                "mlm",
                "--masking",
                "dynamic",
                "--max-seq-length",
                "64",
                "--no-progress",
            ]
        )
        == 0
    )
    manifest = json.loads((shards / "manifest.json").read_text())
    assert manifest["mask_id"] >= 995  # the tokenizer's own [MASK], after its merges

    out = tmp_path / "continued"
    steps, lr = 6, 1e-3
    assert (
        main(
            [
                "train",
                "--config",
                "modernbert-tiny",
                f"checkpoint.init_from_pretrained={released}",
                f"data.vocab_file={released}",
                f"data.phases.0.train_dir={shards}",
                "data.phases.0.max_seq_length=64",
                f"data.phases.0.steps={steps}",
                "data.phases.0.micro_batch_size=8",
                "train.global_batch_size=8",
                "data.loader_workers=0",
                "model.hidden_size=64",
                "model.intermediate_size=96",
                "model.num_attention_heads=2",
                "model.vocab_size=1024",
                "model.max_position_embeddings=128",
                "model.local_attention=16",
                "optim.schedule=wsd",
                "optim.decay_fraction=1.0",
                "optim.warmup_steps=0",
                f"optim.lr={lr}",
                f"checkpoint.every_steps={steps}",
                "train.log_every_steps=1",
                "tracking.enabled=false",
                f"train.output_dir={out}",
                f"launch.master_port={free_tcp_port()}",  # not 29500, which another job on the machine may hold
            ]
        )
        == 0
    )
    rates = [r["optimizer/learning_rate"] for _, r in sorted(read_metrics(out).items())]
    assert rates == pytest.approx([lr * (steps - s) / steps for s in range(steps)])  # decay only: no warmup, no plateau

    exported = tmp_path / "export"
    assert main(["export", str(out / "checkpoints"), "--output", str(exported)]) == 0
    model = transformers.AutoModelForMaskedLM.from_pretrained(exported)
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    assert type(model).__name__ == "ModernBertForMaskedLM" and tokenizer.mask_token_id == manifest["mask_id"]
    trained = model.state_dict()["model.embeddings.tok_embeddings.weight"]
    start = transformers.AutoModelForMaskedLM.from_pretrained(released).state_dict()[
        "model.embeddings.tok_embeddings.weight"
    ]
    assert not torch.equal(trained, start)  # it trained from the released weights...
    assert torch.nn.functional.cosine_similarity(trained.flatten(), start.flatten(), dim=0) > 0.9  # ...not from scratch
