"""DeepSpeed configuration generated from the typed config, the optimizer choice, and ZeRO-3 over 2 real ranks
whose batches differ in lengths."""

from __future__ import annotations

import dataclasses
import math

import pytest
import yaml

from bertdist.config import Config, ConfigError, PhaseConfig, load_config, validate
from bertdist.train.deepspeed import (
    FP16_LOSS_SCALING,
    deepspeed_config,
    device_problems,
)
from tests import training_runs as runs


def _cfg(*overrides: str) -> Config:
    return load_config(None, ["train.global_batch_size=64", "data.phases.0.micro_batch_size=8", *overrides])


def test_batch_sizes_and_accumulation_come_from_the_global_batch():
    cfg = _cfg("train.zero_stage=2", "optim.grad_clip_norm=0.5")
    ds = deepspeed_config(cfg, cfg.data.phases[0], world_size=2)
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (
        64,
        8,
        4,
    )
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * 2
    assert ds["zero_optimization"]["stage"] == 2 and ds["gradient_clipping"] == 0.5
    assert not ds["fp16"]["enabled"] and not ds["bf16"]["enabled"]
    second = deepspeed_config(cfg, PhaseConfig(micro_batch_size=4), world_size=2)
    assert second["gradient_accumulation_steps"] == 8


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_sections(precision):
    cfg = _cfg(f"train.precision={precision}")
    ds = deepspeed_config(cfg, cfg.data.phases[0], world_size=1)
    assert ds[precision]["enabled"]
    if precision == "fp16":
        assert ds["fp16"]["loss_scale"] == 0  # 0 = dynamic loss scaling
        assert ds["fp16"] == {"enabled": True, **FP16_LOSS_SCALING}


def test_expert_keys_are_merged_section_by_section():
    cfg = _cfg("train.deepspeed.zero_optimization.reduce_bucket_size=1000", "train.deepspeed.steps_per_print=5")
    ds = deepspeed_config(cfg, cfg.data.phases[0], world_size=1)
    assert ds["zero_optimization"] == {"stage": 1, "reduce_bucket_size": 1000}
    assert ds["steps_per_print"] == 5


def test_expert_keys_cannot_contradict_the_config():
    cfg = _cfg("train.deepspeed.train_batch_size=8", "train.deepspeed.optimizer.type=Lamb")
    with pytest.raises(ConfigError) as e:
        deepspeed_config(cfg, cfg.data.phases[0], world_size=1)
    assert "train.deepspeed.train_batch_size" in str(e.value) and "train.deepspeed.optimizer" in str(e.value)


def test_gpu_only_settings_are_refused_on_cpu():
    cfg = _cfg("train.precision=fp16")
    problems = device_problems(cfg, "cpu")
    assert any(p.startswith("train.precision: fp16 needs a CUDA GPU") for p in problems)
    assert device_problems(cfg, "cuda") == []
    assert device_problems(_cfg(), "cpu") == []


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (
            ["train.zero_stage=0", "train.deepspeed.zero_optimization.stage=2"],
            ("zero_optimization.stage", "train.zero_stage=0"),
        ),
        (["train.deepspeed.bf16.enabled=true"], ("train.deepspeed.bf16.enabled", "train.precision=fp32")),
        (["train.deepspeed.bfloat16.enabled=true"], ("train.deepspeed.bfloat16", "train.precision")),
        (["train.deepspeed.gradient_clipping=5.0"], ("train.deepspeed.gradient_clipping", "optim.grad_clip_norm=1.0")),
    ],
)
def test_lamb_cannot_reach_zero_or_bf16_through_the_passthrough(overrides, named):
    """LAMB under ZeRO 2 or bf16 updates flattened partitions (wrong per-tensor trust ratios): validation refuses
    it, and the passthrough merged over the validated fields must not bring it back; refused naming both."""
    cfg = _cfg("optim.name=lamb", "train.zero_stage=0", *overrides)
    with pytest.raises(ConfigError) as e:
        validate(cfg, world_size=1, check_files=False)
    assert all(text in str(e.value) for text in named), str(e.value)
    with pytest.raises(ConfigError):
        deepspeed_config(cfg, cfg.data.phases[0], world_size=1)  # fine-tuning reaches the engine without validate()


def test_a_passthrough_that_repeats_the_schema_is_accepted():
    cfg = _cfg("train.zero_stage=2", "train.deepspeed.zero_optimization.stage=2", "train.deepspeed.bf16.enabled=false")
    validate(cfg, world_size=1, check_files=False)
    assert deepspeed_config(cfg, cfg.data.phases[0], world_size=1)["zero_optimization"]["stage"] == 2


# ---- ZeRO-3 with samples of many lengths (issue 30) ------------------------------------------------------------------
# ZeRO-3 records the modules a step calls and refuses to go on when the ranks' records differ; the unpadded encoder
# groups a batch's samples by length, so at length 512 two ranks' batches take different routes through attention.

MIXED_SEQ_LENGTH = 512
MIXED_STEPS = 3


@pytest.fixture(scope="module")
def mixed_length_shards(tiny_corpus, tiny_vocab, ray_local, tmp_path_factory) -> str:
    """Shards at length 512 of the tiny corpus, whose documents of 1-40 sentences give samples of every length."""
    from bertdist.data.pipeline.driver import prepare
    from tests.conftest import tiny_prepare_options

    out = str(tmp_path_factory.mktemp("mixed_length_shards") / "train")
    prepare(tiny_prepare_options(tiny_corpus, tiny_vocab, out, max_seq_length=MIXED_SEQ_LENGTH))
    return out


@pytest.mark.slow
def test_zero3_trains_on_two_ranks_whose_batches_have_different_lengths(tmp_path, mixed_length_shards, tiny_vocab):
    # A rank left waiting in a collective that the other never joins ends the run within a minute.
    path = runs.write_config(tmp_path, mixed_length_shards, tiny_vocab, zero_stage=3, stall_timeout_s=60)
    cfg = yaml.safe_load(path.read_text())
    cfg["model"]["max_position_embeddings"] = MIXED_SEQ_LENGTH
    # 1 MiB of logits is 131 predictions of the 1k vocabulary: a micro batch's ~300 are scored in chunks, whose
    # gradients are made in the forward and must reach the tied matrix that ZeRO-3 partitions.
    cfg["model"]["mlm_logits_mib"] = 1
    cfg["data"]["phases"][0].update(max_seq_length=MIXED_SEQ_LENGTH, steps=MIXED_STEPS)
    path.write_text(yaml.safe_dump(cfg))
    ranks = runs.start_ranks(path, "run")
    assert ranks.wait() == [0, 0], ranks.output(0)[-3000:] + ranks.output(1)[-3000:]
    metrics = runs.read_metrics(tmp_path / "out")
    assert sorted(metrics) == list(range(1, MIXED_STEPS + 1))
    # The same run with the whole logits: a lost or mis-scaled gradient of the tied matrix would part the losses
    # from step 2 on, a miscounted accuracy at step 1.
    whole = runs.start_ranks(path, "whole", "model.mlm_logits_mib=0", f"train.output_dir={tmp_path / 'whole'}")
    assert whole.wait() == [0, 0], whole.output(0)[-3000:] + whole.output(1)[-3000:]
    want = runs.read_metrics(tmp_path / "whole")
    for step, m in metrics.items():
        for key in ("loss/train", "mlm_accuracy/train"):
            assert math.isclose(m[key], want[step][key], rel_tol=1e-4, abs_tol=1e-6), (step, key, m[key], want[step])


def test_a_compiled_model_trains_inside_the_engine_as_the_eager_one(monkeypatch):
    """`model.compile` reaches the engine: its layers are compiled before DeepSpeed wraps them (dynamo's counting
    backend stands in for inductor, whose parity tests/model/test_compiled.py checks), and one ZeRO-1 step on a
    real single-rank process group gives the eager engine's loss and weights."""
    import functools

    import torch
    from torch._dynamo.testing import CompileCounter

    from bertdist.data.batching import batch_of
    from bertdist.model import compiled
    from bertdist.model.registry import build_model
    from bertdist.train import deepspeed as ds
    from bertdist.train.distributed import DistributedEnv, destroy_process_group, init_process_group
    from bertdist.train.optim import build_optimizer
    from bertdist.train.ports import free_tcp_port
    from tests.conftest import TEST_VOCAB_SIZE
    from tests.model.test_layout import SEQ, random_samples

    torch._dynamo.reset()  # graphs an earlier test compiled in this process would hide these compilations
    counter = CompileCounter()
    monkeypatch.setattr(compiled, "compile_model", functools.partial(compiled.compile_model, backend=counter))
    cfg = _cfg("model.size=tiny", "model.hidden_dropout_prob=0", "model.attention_dropout_prob=0")
    batch = batch_of(random_samples(8, seed=1), SEQ)
    init_process_group(DistributedEnv(0, 1, 0, "127.0.0.1", free_tcp_port(), "none"), "gloo", rendezvous_timeout_s=10)
    try:
        results = []
        for compile_layers in (False, True):
            model_cfg = dataclasses.replace(cfg.model, vocab_size=TEST_VOCAB_SIZE, compile=compile_layers)
            torch.manual_seed(0)
            model = build_model(model_cfg)
            engine = ds.initialize(model, build_optimizer(model, cfg.optim, "cpu"), ds.engine_config(cfg, 8, 8, 1))
            loss = engine(**batch).loss
            engine.backward(loss)
            engine.step()
            results.append((loss.detach(), [p.detach().clone() for p in model.parameters()]))
    finally:
        destroy_process_group()
    assert counter.frame_count > 0
    torch.testing.assert_close(results[1][0], results[0][0])
    for got, want in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(got, want)
