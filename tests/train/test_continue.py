"""Continued pretraining as docs/training.md describes it: a released ModernBERT directory (saved by transformers,
with a tokenizer.json whose special tokens are not BERT's ids) -> `bertdist prepare --tokenizer MODEL_DIR` ->
`bertdist train` from its weights with a decay-only wsd schedule (starting at transformers' loss) -> an export that
transformers loads."""

from __future__ import annotations

import json

import pytest
import torch

from bertdist.cli import main
from bertdist.config import ModelConfig
from bertdist.model.modernbert import hf as modernbert_hf
from bertdist.train.ports import free_tcp_port
from tests.training_runs import read_metrics

pytestmark = pytest.mark.slow
MODEL = dict(
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=2,
    vocab_size=1024,
    max_position_embeddings=128,
    local_attention=16,
)
"""The released model's shape: modernbert-tiny's, narrower."""


def test_a_released_modernbert_continues_on_new_text_with_its_own_tokenizer(
    tmp_path, tiny_corpus, high_id_tokenizer, ray_local, monkeypatch
):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    cfg = ModelConfig.from_size("modernbert-tiny", **MODEL)
    released = _released_by_transformers(transformers, cfg, high_id_tokenizer, tmp_path / "released")

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
                "--samples",
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
                *(f"model.{k}={v}" for k, v in MODEL.items()),
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
    _first_loss_is_transformers(transformers, released, shards)
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


def _released_by_transformers(transformers, cfg: ModelConfig, tokenizer_dir: str, directory):
    """A ModernBERT as transformers saves one (random weights of `cfg`'s shape), with the tokenizer.json beside it."""
    import shutil

    from bertdist.data.tokenizer import open_tokenizer

    tokenizer = open_tokenizer(f"{tokenizer_dir}/tokenizer.json")
    special = {f"{name}_token_id": getattr(tokenizer, f"{name}_id") for name in ("pad", "cls", "sep")}
    torch.manual_seed(0)
    hf_config = transformers.ModernBertConfig(**{**modernbert_hf.config_to_hf(cfg), **special})
    transformers.ModernBertForMaskedLM(hf_config).save_pretrained(directory)
    shutil.copy(f"{tokenizer_dir}/tokenizer.json", directory)
    return directory


def _first_loss_is_transformers(transformers, released, shards) -> None:
    """The model a run continues from (checkpoint.init_from_pretrained, through the registry as the trainer loads
    it) computes transformers' loss on the run's first batch, its own tokenizer's masks (1e-5)."""
    from bertdist.config import load_config
    from bertdist.data.loader import PretrainingLoader
    from bertdist.model.registry import load_pretrained

    model_cfg = load_config("modernbert-tiny", [f"model.{k}={v}" for k, v in MODEL.items()]).model
    ours = load_pretrained(released, model_cfg).eval()
    batch = next(iter(PretrainingLoader(str(shards), str(released), max_seq_length=64, micro_batch_size=8, seed=1)))
    labels = torch.full_like(batch["input_ids"], -100)
    real = batch["masked_lm_ids"] != -100
    rows = torch.arange(len(labels))[:, None].expand_as(real)
    labels[rows[real], batch["masked_lm_positions"][real]] = batch["masked_lm_ids"][real]
    theirs = transformers.ModernBertForMaskedLM.from_pretrained(released).eval()
    with torch.no_grad():
        want = theirs(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss
        got = ours(
            batch["input_ids"],
            attention_mask=batch["attention_mask"],
            masked_lm_positions=batch["masked_lm_positions"],
            masked_lm_ids=batch["masked_lm_ids"],
        ).loss
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
