"""DeepSpeed configuration generated from the typed config, and the optimizer choice."""

from __future__ import annotations

import pytest

from bertdist.config import Config, ConfigError, PhaseConfig, load_config
from bertdist.train.deepspeed import (
    FP16_LOSS_SCALING,
    deepspeed_config,
    device_problems,
)


def _cfg(*overrides: str) -> Config:
    return load_config(None, ["train.global_batch_size=64", "data.phases.0.micro_batch_size=8", *overrides])


def test_batch_sizes_and_accumulation_come_from_the_global_batch():
    cfg = _cfg("train.zero_stage=2", "optim.grad_clip_norm=0.5")
    ds = deepspeed_config(cfg, cfg.data.phases[0], world_size=2)
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (64, 8, 4)
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
