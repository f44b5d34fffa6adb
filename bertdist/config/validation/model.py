"""The model's rules: what `model.arch` cannot build or would silently ignore, the heads, and a pretrained
checkpoint's architecture; `validate` (train) reports them with the rest."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from bertdist.config.model import ARCHITECTURES, ModelConfig
from bertdist.config.objectives import OBJECTIVES
from bertdist.config.schema import PhaseConfig
from bertdist.model import registry


def family_fields() -> dict[str, tuple[str, ...]]:
    """model fields that only some families read (each family's spec, `own_fields`) -> those families: set away
    from its default under another `model.arch`, the field would be ignored without a word. (`objective` has its
    own check: ModernBERT has no sentence head.) The registry and the specs import no config, so validation may
    ask them."""
    owners: dict[str, tuple[str, ...]] = {}
    for arch in registry.FAMILIES:
        for name in registry.spec(arch).own_fields:
            owners[name] = (*owners.get(name, ()), arch)
    return owners


def compile_problems(m: ModelConfig, zero_stage: int) -> list[str]:
    """`model.compile` beside what it cannot run with yet (pretraining and fine-tuning both ask)."""
    if m.compile and zero_stage == 3:
        return [
            "model.compile: not supported yet with train.zero_stage: 3 (ZeRO-3 gathers each module's parameters in "
            "hooks that the compiled layers would trace); use train.zero_stage: 1 or 2, or model.compile: false"
        ]
    return []


def heads_divide_problem(m: ModelConfig) -> str:
    """Why the attention heads cannot split `model.hidden_size` ('' when they can). The one copy of the rule:
    `validate` reports it as a field problem, and bertdist.model.initialisation.check_heads_divide raises it when a
    model is built from a ModelConfig that never went through validation (a test's, a checkpoint's)."""
    if m.num_attention_heads > 0 and m.hidden_size % m.num_attention_heads:
        return (
            f"model.hidden_size: {m.hidden_size} is not divisible by model.num_attention_heads={m.num_attention_heads}"
        )
    return ""


def architecture_problems(m: ModelConfig, phases: list[PhaseConfig]) -> list[str]:
    """What `model.arch` cannot build, or would silently ignore: an unknown name, another family's options, an
    objective it does not train, heads that do not split the hidden size, and the family's own rules (its spec's
    `config_problems`: ALBERT's embedding width, ELECTRA's generator, ModernBERT's window and rotary head size)."""
    found = [problem] if (problem := heads_divide_problem(m)) else []
    if m.arch not in ARCHITECTURES:  # reported by choice_problems; nothing else about it can be judged
        return found
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    owners = family_fields()
    for name, archs in owners.items():
        if m.arch not in archs and getattr(m, name) != defaults[name]:
            found.append(
                f"model.{name}: {getattr(m, name)!r} applies only to model.arch {' or '.join(archs)}, and "
                f"model.arch: {m.arch} ignores it; remove it (default {defaults[name]!r})"
            )
    for i, ph in enumerate(phases):
        for name in ("global_rope_theta", "local_rope_theta"):
            theta = getattr(ph, name)
            if theta and m.arch not in owners[name]:
                found.append(
                    f"data.phases.{i}.{name}: {theta!r} applies only to model.arch {' or '.join(owners[name])} "
                    f"(rotary positions), and model.arch: {m.arch} ignores it"
                )
            elif theta < 0:
                found.append(f"data.phases.{i}.{name}: must be positive (or 0: model.{name}), got {theta}")
    trains = registry.spec(m.arch).objectives
    if m.objective in OBJECTIVES and m.objective not in trains:
        by = [arch for arch in registry.FAMILIES if m.objective in registry.spec(arch).objectives]
        found.append(
            f"model.objective: {m.objective!r} ({OBJECTIVES[m.objective].summary}) is trained by model.arch "
            f"{' or '.join(by)}, not {m.arch}, which trains {' or '.join(trains)}"
        )
    return found + registry.spec(m.arch).config_problems(m, phases)


def pretrained_arch_problem(directory: str, arch: str) -> str:
    """Why the Hugging Face directory `directory` cannot start a run of `model.arch` `arch` ('' when it can); read
    from its config.json's model_type (each family's spec names its own), BERT when it names none (old
    checkpoints)."""
    path = Path(directory) / "config.json"
    try:
        config_json = json.loads(path.read_text())
        family, model_type = registry.arch_of_config(config_json), config_json.get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        return (
            f"checkpoint.init_from_pretrained: {path} is unreadable ({e}); "
            "a Hugging Face model directory has a config.json"
        )
    if family is None:
        return (
            f"checkpoint.init_from_pretrained: {directory} holds a {model_type!r} model (config.json model_type), "
            f"not one bertdist reads ({', '.join(registry.model_types())})"
        )
    if family != arch:
        return (
            f"checkpoint.init_from_pretrained: {directory} holds a {model_type or family} model (config.json "
            "model_type), and "
            f"model.arch is {arch!r}; set model.arch: {family}"
        )
    return ""
