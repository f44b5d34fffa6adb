"""BERT's optimizer (AdamW groups without decay on LayerNorm and biases) and its learning-rate schedule."""

from __future__ import annotations

import pytest
import torch

from bertdist.config import Config, load_config
from bertdist.model.bert.model import BertForPreTraining
from bertdist.train.optim import build_optimizer, learning_rate, param_groups
from tests.conftest import tiny_model_config


def _cfg(*overrides: str) -> Config:
    return load_config(None, list(overrides))


def test_warmup_then_linear_decay_to_zero():
    peak, warmup, total = 1e-3, 10, 110
    rates = [learning_rate(s, peak, warmup, total) for s in range(total)]
    assert rates[0] == pytest.approx(peak / warmup)  # the first update already moves the weights
    assert rates[warmup - 1] == pytest.approx(peak) and rates[warmup] == pytest.approx(peak)
    assert max(rates) == pytest.approx(peak)
    warm = [rates[s + 1] - rates[s] for s in range(warmup - 1)]
    decay = [rates[s + 1] - rates[s] for s in range(warmup, total - 1)]
    assert all(d == pytest.approx(peak / warmup) for d in warm)
    assert all(d == pytest.approx(-peak / (total - warmup)) for d in decay)
    # one more decay step past the last step would land exactly on zero
    assert rates[-1] == pytest.approx(peak / (total - warmup))


def test_no_warmup_starts_at_the_peak():
    assert learning_rate(0, 1.0, 0, 4) == 1.0
    assert [learning_rate(s, 1.0, 0, 4) for s in range(4)] == [1.0, 0.75, 0.5, 0.25]


def test_step_outside_the_run_is_an_error():
    with pytest.raises(ValueError, match="outside"):
        learning_rate(10, 1.0, 2, 10)


def test_warmup_stable_decay_holds_the_peak_then_decays_the_last_fraction_to_zero():
    rates = [learning_rate(s, 1.0, 2, 10, "wsd", 0.3, "linear") for s in range(10)]
    assert rates == pytest.approx([0.5, 1, 1, 1, 1, 1, 1, 1, 2 / 3, 1 / 3])  # 3 decay steps; 0 would be step 10
    sqrt = [learning_rate(s, 1.0, 2, 10, "wsd", 0.3, "1-sqrt") for s in range(10)]
    assert sqrt[:8] == rates[:8] and sqrt[8:] == pytest.approx([1 - (1 / 3) ** 0.5, 1 - (2 / 3) ** 0.5])
    assert [learning_rate(s, 1.0, 0, 4, "wsd", 0.0) for s in range(4)] == [1.0] * 4  # a stable phase: no decay


def test_the_lamb_recipe_follows_nvidias_polynomial_decay():
    """NVIDIA's PolyWarmUpScheduler: after warmup, lr x (1 - step / total)^0.5 of the phase's whole progress (the
    rate steps down where warmup ends). bertdist decayed linearly from the end of warmup: 10x lower at step
    7,000 of phase 1. configs/bert-large-lamb.yaml is NVIDIA's recipe."""
    from pathlib import Path

    from bertdist.train.optim import scheduled_learning_rate

    cfg = load_config(str(Path(__file__).parents[2] / "configs" / "bert-large-lamb.yaml"), [])
    nvidia = {
        1999: 6e-3,  # the end of warmup (ours: (step + 1) / warmup steps)
        2000: 6e-3 * (1 - 2000 / 7038) ** 0.5,
        7000: 6e-3 * (1 - 7000 / 7038) ** 0.5,
    }
    nvidia |= {7038 + 1400: 4e-3 * (1 - 1400 / 1563) ** 0.5}
    assert {s: scheduled_learning_rate(cfg, s) for s in nvidia} == pytest.approx(nvidia, rel=1e-12)
    assert learning_rate(0, 1.0, 0, 4, "poly", decay_power=1.0) == 1.0  # power 1 without warmup: linear to 0
    assert learning_rate(3, 1.0, 0, 4, "poly", decay_power=1.0) == 0.25


def test_each_phase_decays_its_own_fraction_under_wsd(tmp_path):
    from bertdist.train.optim import scheduled_learning_rate

    (tmp_path / "c.yaml").write_text(
        "optim: {schedule: wsd, decay_fraction: 0.5, warmup_steps: 0}\n"
        "data: {phases: [{steps: 4, lr: 1.0, decay_fraction: 0}, {steps: 4, lr: 0.5, max_seq_length: 512}]}\n"
    )
    cfg = load_config(str(tmp_path / "c.yaml"), [])
    assert [scheduled_learning_rate(cfg, s) for s in range(8)] == pytest.approx([1, 1, 1, 1, 0.5, 0.5, 0.5, 0.25])


def test_param_groups_exclude_layernorm_and_biases_from_decay():
    model = BertForPreTraining(tiny_model_config())
    decay, no_decay = param_groups(model, weight_decay=0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    assert all(n.endswith("bias") or "LayerNorm" in n for n in no_decay_names)
    assert {names[id(p)] for p in decay["params"]} == {n for n, p in model.named_parameters() if p.ndim == 2}
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_cpu_optimizer_is_adamw_without_decay_on_layernorm_and_biases():
    cfg = _cfg("optim.weight_decay=0.01")
    model = BertForPreTraining(tiny_model_config())
    opt = build_optimizer(model, cfg.optim, "cpu")
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["fused"]  # torch's fused CPU kernel
    assert not build_optimizer(model, _cfg("optim.fused=off").optim, "cpu").defaults["fused"]
    assert _cfg("optim.fused=on").optim.fused == "on"  # YAML reads a bare on as a boolean; the schema maps it back
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim == 1 for p in no_decay["params"]) and all(p.ndim >= 2 for p in decay["params"])
    assert opt.defaults["eps"] == cfg.optim.eps


def test_independent_weight_decay_shrinks_by_its_value_times_lr_over_the_phase_peak(tmp_path):
    """ModernBERT's 1e-5 is StableAdamW's fully decoupled decay (optimi's decouple_lr): 1e-5 of a matrix per step at
    the peak, scaled by lr / peak through the schedule, each phase by its own peak. As AdamW's value it shrinks by
    lr x 1e-5 = 8e-9 a step: a thousandth of the recipe's on a GPU (FusedAdam), and nothing at all in torch's fp32
    AdamW."""
    from bertdist.train.optim import apply_schedule

    (tmp_path / "c.yaml").write_text(
        "optim: {lr: 8.0e-4, weight_decay: 1.0e-5, weight_decay_mode: independent, schedule: wsd, warmup_steps: 2,"
        " decay_fraction: 0.5}\ndata: {phases: [{steps: 6}, {steps: 4, lr: 3.0e-4, warmup_steps: 0}]}\n"
    )
    cfg = load_config(str(tmp_path / "c.yaml"), ["optim.fused=off"])
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    optimizer = build_optimizer(model, cfg.optim, "cpu")
    decays = []
    for step in range(cfg.total_steps()):
        lr, peak = apply_schedule(optimizer.param_groups, cfg, step), 8e-4 if step < 6 else 3e-4  # as the trainer
        decays.append(optimizer.param_groups[0]["weight_decay"])
        before = [p.detach().clone() for p in model.parameters()]
        for p in model.parameters():
            p.grad = torch.zeros_like(p)  # Adam's own update is 0: what moves the weights is the decay alone
        optimizer.step()
        weight, *vectors = model.parameters()
        assert (1 - weight.detach() / before[0]).mean().item() == pytest.approx(1e-5 * lr / peak, rel=0.02), step
        assert all(torch.equal(p.detach(), b) for p, b in zip(vectors, before[1:]))  # biases, LayerNorm: no decay
    assert decays[5] == pytest.approx(1e-5 / 8e-4) and decays[6] == pytest.approx(1e-5 / 3e-4)  # each phase's peak

    adamw = build_optimizer(model, load_config(None, ["optim.lr=8e-4", "optim.weight_decay=1e-5"]).optim, "cpu")
    before = model[0].weight.detach().clone()
    model[0].weight.grad = torch.zeros_like(before)
    adamw.step()
    assert torch.equal(model[0].weight.detach(), before)  # the fp32 shrink of 8e-9 is lost


@pytest.mark.parametrize(
    "overrides, problem",
    [
        (["optim.schedule=cosine"], "optim.schedule: 'cosine' is not one of linear, wsd, poly"),
        (["optim.schedule=poly", "optim.decay_power=0"], "optim.decay_power: must be a positive number, got 0"),
        (
            ["optim.name=lamb", "optim.weight_decay_mode=independent", "train.zero_stage=0"],
            "optim.weight_decay_mode: independent is Adam's decoupled decay; lamb puts its decay inside",
        ),
        (["optim.schedule=wsd", "optim.decay_shape=sqrt"], "optim.decay_shape: 'sqrt' is not one of linear, 1-sqrt"),
        (["optim.schedule=wsd", "optim.decay_fraction=1.5"], "optim.decay_fraction: must be in [0, 1], got 1.5"),
        (
            ["data.phases.0.decay_fraction=0.5"],
            "data.phases.0.decay_fraction: applies only to a phase's own wsd schedule",
        ),
        (
            ["optim.schedule=wsd", "optim.decay_fraction=0.95", "optim.warmup_steps=100", "data.phases.0.steps=1000"],
            "optim: 100 warmup steps and a decay of 950 (0.95 of 1000) do not fit in its 1000 steps",
        ),
    ],
)
def test_a_schedule_that_cannot_run_as_written_is_refused_naming_the_field(overrides, problem):
    from bertdist.config import ConfigError, validate

    with pytest.raises(ConfigError) as refused:
        validate(_cfg(*overrides), check_files=False)
    assert problem in str(refused.value), str(refused.value)
