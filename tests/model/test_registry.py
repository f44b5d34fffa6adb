"""The architecture registry: one name list (the schema's), each name with a model class and an HF adapter; the
plan's parameter count is the model's."""

from __future__ import annotations

import pytest

from bertdist.config import ModelConfig
from bertdist.config.model import ARCHITECTURES
from bertdist.config.schema import checkpoint_model_config, phase_model_config
from bertdist.model import flops, registry


def test_every_family_is_a_folder_with_a_model_an_adapter_and_task_models():
    """The registry's names are the schema's, each a folder whose spec names its own; the spec's names resolve."""
    assert registry.FAMILIES == ARCHITECTURES
    for arch in registry.FAMILIES:
        spec = registry.spec(arch)
        assert spec.arch == arch and registry.arch_of_model_type(spec.model_type) == arch
        assert callable(spec.model_class().forward_flops)
        assert callable(spec.adapter().load_pretrained) and callable(spec.adapter().write_directory)
        # `{prefix}For{head}`, or under another name of the same family (RoBERTa's XLMRobertaFor...)
        assert all(name.split("For")[0].endswith(spec.tasks().prefix) for name in spec.tasks().task_models)
    assert registry.arch_of_model_type("xlm-roberta") == "roberta"  # a family's other model_types
    with pytest.raises(ValueError, match="deberta"):
        registry.spec("deberta")


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_pretraining_class_keeps_the_written_protocol(arch):
    """What the trainer asks of a pretraining model (bertdist.model.protocol), with the forward's fields in its
    order, on a model each family builds from its smallest preset; and what features and pictures ask of its bare
    encoder."""
    import inspect

    from bertdist.config import MODEL_SIZES
    from bertdist.model.compiled import compile_model
    from bertdist.model.protocol import BareEncoder, PretrainingModel

    size = next(name for name, settings in MODEL_SIZES.items() if settings.get("arch", "bert") == arch)
    model = registry.build_model(ModelConfig.from_size(size))
    assert isinstance(model, PretrainingModel)
    fields = list(inspect.signature(PretrainingModel.forward).parameters)[1:]
    assert list(inspect.signature(model.forward).parameters)[: len(fields)] == fields
    for module, parameter in model.external_parameters():
        assert any(parameter is p for p in model.parameters()) and any(module is m for m in model.modules())
    assert isinstance(registry.spec(arch).tasks().encoder(model.config), BareEncoder)
    assert compile_model(model, arch, backend="eager") > 0  # the spec names its layers' class (model.compile)


def test_reading_the_registry_and_validating_a_config_import_no_torch():
    """Specs are torch-free and config-free: config validation asks them before anything heavy is imported."""
    import subprocess
    import sys

    code = (
        "import sys; from bertdist.config import load_config, validate; from bertdist.model import registry; "
        "validate(load_config(None, ['model.arch=electra', 'model.size=electra-mini']), check_files=False); "
        "[registry.spec(a) for a in registry.FAMILIES]; print('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


@pytest.mark.parametrize(
    "size, published_millions",
    [
        ("base", 110.1),  # transformers' BertForPreTraining at bert-base-uncased's config: 110,106,428
        ("large", 336.2),
        ("modernbert-base", 149.7),  # ModernBERT's paper: 149M
        ("modernbert-large", 395.9),  # 395M
        ("albert-base", 11.8),  # ALBERT's paper, Table 1: 12M
        ("electra-small", 14.2),  # ELECTRA's paper, Table 8: 14M (generator and discriminator)
        ("distilbert-base", 67.0),  # DistilBERT's paper: 66M
        ("roberta-base", 124.7),  # transformers' RobertaForMaskedLM at roberta-base's config (RoBERTa: 125M)
        ("xlm-roberta-base", 278.3),  # XLMRobertaForMaskedLM at xlm-roberta-base's config (XLM-R: 270M)
    ],
)
def test_the_counted_parameters_are_the_published_ones(size, published_millions):
    """Counted on the model built on the meta device: nothing is allocated, and the figure is the model's."""
    total, outside_tables = flops.parameter_counts(ModelConfig.from_size(size))
    assert round(total / 1e6, 1) == published_millions and 0 < outside_tables < total


@pytest.mark.parametrize(
    "size", ["tiny", "modernbert-tiny", "albert-mini", "distilbert-mini", "electra-mini", "roberta-mini", "span"]
)
def test_the_counted_parameters_are_the_built_models(size):
    cfg = ModelConfig.from_size("tiny", objective="span") if size == "span" else ModelConfig.from_size(size)
    model = registry.build_model(cfg)
    assert flops.total_parameters(cfg) == sum(p.numel() for p in model.parameters())
    assert flops.forward_flops_per_sequence(cfg, 128, 20) > 0


def test_a_phase_sets_the_rope_thetas_the_model_then_rotates_by_and_the_export_carries():
    """Context extension: a phase's thetas replace the model's from that phase on, in the running model (the same
    outputs as a model built with them) and in the model of a checkpoint taken in that phase."""
    import dataclasses

    import torch

    from bertdist.config import ModelConfig, PhaseConfig
    from bertdist.model import registry

    base = ModelConfig.from_size("modernbert-tiny", vocab_size=64, max_position_embeddings=256)
    extended = PhaseConfig(steps=5, global_rope_theta=320_000.0)
    cfg = phase_model_config(base, extended)
    assert (cfg.global_rope_theta, cfg.local_rope_theta) == (320_000.0, base.local_rope_theta)
    assert phase_model_config(base, PhaseConfig()) is base

    torch.manual_seed(0)
    model = registry.build_model(base).eval()
    ids = torch.randint(5, 64, (2, 200))
    before = model(ids).mlm_logits
    registry.enter_phase(model, cfg)
    again = registry.build_model(cfg).eval()
    again.load_state_dict(model.state_dict())
    with torch.no_grad():
        after, want = model(ids).mlm_logits, again(ids).mlm_logits
    assert torch.equal(after, want) and not torch.allclose(after, before)

    run = {
        "model": dataclasses.asdict(base),
        "data": {"phases": [dataclasses.asdict(PhaseConfig(steps=10)), dataclasses.asdict(extended)]},
    }
    assert checkpoint_model_config(run, 10).global_rope_theta == base.global_rope_theta  # closes phase 0
    assert checkpoint_model_config(run, 11).global_rope_theta == 320_000.0
    assert checkpoint_model_config(run, 15).global_rope_theta == 320_000.0


def test_a_phase_theta_is_refused_where_nothing_rotates():
    from bertdist.config import ConfigError, load_config, validate

    with pytest.raises(
        ConfigError, match=r"data.phases.0.global_rope_theta: 160000.0 applies only to model.arch modernbert"
    ):
        validate(load_config(None, ["data.phases.0.global_rope_theta=160000"]), check_files=False)
    with pytest.raises(ConfigError, match=r"data.phases.0.local_rope_theta: must be positive"):
        validate(load_config("modernbert-tiny", ["data.phases.0.local_rope_theta=-1"]), check_files=False)
