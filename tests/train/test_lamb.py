"""LAMB against its formula, per-phase batches and schedules (NVIDIA's large-batch recipe), and their refusals."""

from __future__ import annotations

import math

import pytest
import torch

from bertdist.config import ConfigError, load_config, validate
from bertdist.train.lamb import Lamb
from bertdist.train.optim import param_groups, scheduled_learning_rate
from tests.conftest import REPO, tiny_model_config


def _reference_step(weights, grads, moments, step, lr, betas, eps, decays):
    """You et al. 2019, algorithm 2, one tensor at a time in float64, as NVIDIA's recipe applies it (no trust
    ratio where there is no weight decay)."""
    beta1, beta2 = betas
    out = []
    for w, g, (m, v), decay in zip(weights, grads, moments, decays):
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        update = (m / (1 - beta1**step)) / ((v / (1 - beta2**step)).sqrt() + eps) + decay * w
        ratio = 1.0
        if decay:
            w_norm, u_norm = w.norm().item(), update.norm().item()
            ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
        out.append(w - lr * ratio * update)
    return out


@pytest.mark.parametrize("exclusions", [True, False], ids=["no-decay-on-bias-and-layernorm", "decay-everywhere"])
def test_lamb_update_equals_the_formula(exclusions):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    decay = 0.01
    groups = param_groups(model, decay) if exclusions else [{"params": list(model.parameters()), "weight_decay": decay}]
    optimizer = Lamb(groups, lr=0.05, betas=(0.9, 0.999), eps=1e-6)
    params = [p for g in groups for p in g["params"]]
    decays = [g["weight_decay"] for g in groups for _ in g["params"]]
    assert (0.0 in decays) == exclusions
    weights = [p.detach().double().clone() for p in params]
    moments = [(torch.zeros_like(w), torch.zeros_like(w)) for w in weights]
    for step in range(1, 6):
        x = torch.randn(32, 8)
        model.zero_grad()
        model(x).pow(2).mean().backward()
        grads = [p.grad.double() for p in params]
        optimizer.step()
        weights = _reference_step(weights, grads, moments, step, 0.05, (0.9, 0.999), 1e-6, decays)
        for p, w in zip(params, weights):
            torch.testing.assert_close(p.detach().double(), w, atol=1e-6, rtol=0)
            p.data.copy_(w)  # the next step starts from the same weights on both sides


def test_lamb_state_survives_a_state_dict_round_trip():
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 4)
    optimizer = Lamb(param_groups(model, 0.01), lr=0.01)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    again = Lamb(param_groups(model, 0.01), lr=0.01)
    again.load_state_dict(optimizer.state_dict())
    for a, b in zip(optimizer.state.values(), again.state.values()):
        assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("gpus, accumulation", [(8, (128, 512)), (64, (16, 64)), (256, (4, 16))])
def test_the_large_batch_recipe_reaches_its_batches_by_accumulation(gpus, accumulation):
    cfg = load_config(
        REPO / "configs" / "bert-large-lamb.yaml", [f"launch.nodes={gpus // 8}", "launch.gpus_per_node=8"]
    )
    validate(cfg, check_files=False)
    first, second = cfg.data.phases
    assert (cfg.global_batch_size(first), cfg.global_batch_size(second)) == (65536, 32768)
    assert (cfg.gradient_accumulation_steps(first, gpus), cfg.gradient_accumulation_steps(second, gpus)) == accumulation
    assert cfg.optim.name == "lamb" and (first.steps, second.steps) == (7038, 1563)
    # each phase its own warmup (28.43% and 12.8%) then NVIDIA's decay, (1 - step / phase steps)^0.5
    assert scheduled_learning_rate(cfg, 1999) == pytest.approx(6e-3)
    assert scheduled_learning_rate(cfg, 7037) == pytest.approx(6e-3 * (1 - 7037 / 7038) ** 0.5)
    assert scheduled_learning_rate(cfg, 7038) == pytest.approx(4e-3 / 200)
    assert scheduled_learning_rate(cfg, 7038 + 199) == pytest.approx(4e-3)
    assert math.isclose(2000 / 7038, 0.2843, abs_tol=1e-3) and math.isclose(200 / 1563, 0.128, abs_tol=1e-3)


def test_impossible_lamb_and_phase_settings_name_their_field():
    cfg = load_config(REPO / "configs" / "bert-large-lamb.yaml", ["train.zero_stage=1"])
    cfg.model = tiny_model_config()
    cfg.data.phases[1].lr = 0.0
    cfg.data.phases[0].global_batch_size = 1000
    with pytest.raises(ConfigError) as e:
        validate(cfg, check_files=False)
    text = str(e.value)
    assert "optim.name: lamb" in text and "train.zero_stage=1" in text
    assert "data.phases.N.lr: set for phases [0] only" in text
    assert "data.phases.0.global_batch_size: 1000 is not divisible" in text
