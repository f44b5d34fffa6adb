"""The architecture registry: one name list (the schema's), each name with a model class and an HF adapter; the
plan's parameter count is the model's."""

from __future__ import annotations

import pytest

from bertdist.config import ModelConfig
from bertdist.config.schema import ARCHITECTURES
from bertdist.model import flops, registry


def test_every_architecture_has_a_model_and_an_adapter():
    assert tuple(registry.MODEL_CLASSES) == ARCHITECTURES == tuple(registry.HF_ADAPTERS)
    assert set(registry.HF_MODEL_TYPES.values()) == set(ARCHITECTURES)


@pytest.mark.parametrize("size", ["tiny", "modernbert-tiny", "modernbert-mini"])
@pytest.mark.parametrize("bias", [False, True])
def test_the_counted_parameters_are_the_models(size, bias):
    cfg = ModelConfig.from_size(size, **({"bias": bias} if size.startswith("modernbert") else {}))
    model = registry.build_model(cfg)
    assert flops.total_parameters(cfg) == sum(p.numel() for p in model.parameters())
    assert flops.forward_flops_per_sequence(cfg, 128, 20) > 0
