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


def heads_divide_problem(m: ModelConfig) -> str:
    """Why the attention heads cannot split `model.hidden_size` ('' when they can). The one copy of the rule:
    `validate` reports it as a field problem, and bertdist.model.bert.model.check_heads_divide raises it when a model is
    built from a ModelConfig that never went through validation (a test's, a checkpoint's)."""
    if m.num_attention_heads > 0 and m.hidden_size % m.num_attention_heads:
        return (
            f"model.hidden_size: {m.hidden_size} is not divisible by model.num_attention_heads={m.num_attention_heads}"
        )
    return ""


def architecture_problems(m: ModelConfig, phases: list[PhaseConfig]) -> list[str]:
    """What `model.arch` cannot build, or would silently ignore: an unknown name, another architecture's
    options, heads that do not split the hidden size, ALBERT's embedding width, and ModernBERT's window and
    rotary head size."""
    found = [problem] if (problem := heads_divide_problem(m)) else []
    if m.arch not in ARCHITECTURES:  # reported by choice_problems; nothing else about it can be judged
        return found
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    for name, archs in family_fields().items():
        if m.arch not in archs and getattr(m, name) != defaults[name]:
            found.append(
                f"model.{name}: {getattr(m, name)!r} applies only to model.arch {' or '.join(archs)}, and "
                f"model.arch: {m.arch} ignores it; remove it (default {defaults[name]!r})"
            )
    for i, ph in enumerate(phases):
        for name in ("global_rope_theta", "local_rope_theta"):
            theta = getattr(ph, name)
            if theta and m.arch != "modernbert":
                found.append(
                    f"data.phases.{i}.{name}: {theta!r} applies only to model.arch modernbert (rotary positions), "
                    f"and model.arch: {m.arch} ignores it"
                )
            elif theta < 0:
                found.append(f"data.phases.{i}.{name}: must be positive (or 0: model.{name}), got {theta}")
    if m.objective in OBJECTIVES and m.arch not in OBJECTIVES[m.objective].architectures:
        found.append(
            f"model.objective: {m.objective!r} ({OBJECTIVES[m.objective].summary}) is trained by model.arch "
            f"{' or '.join(OBJECTIVES[m.objective].architectures)}, not {m.arch}, which trains "
            f"{' or '.join(name for name, o in OBJECTIVES.items() if m.arch in o.architectures)}"
        )
    if m.arch == "electra":
        found += _generator_problems(m)
    if m.arch == "albert" and not 0 <= m.embedding_size <= m.hidden_size:
        found.append(
            f"model.embedding_size: {m.embedding_size} is not within 0..model.hidden_size={m.hidden_size}; ALBERT "
            "factorizes the embeddings to a width E <= H (0: hidden_size)"
        )
    if m.arch != "modernbert":
        return found
    if m.objective in OBJECTIVES and OBJECTIVES[m.objective].sentence_task:
        found.append(
            f"model.objective: {m.objective!r}: ModernBERT has no sentence head; use mlm (shards prepared with "
            "--objective mlm)"
        )
    if (
        m.num_attention_heads > 0
        and m.hidden_size % m.num_attention_heads == 0
        and (m.hidden_size // m.num_attention_heads) % 2
    ):
        found.append(
            f"model.num_attention_heads: a head size of {m.hidden_size // m.num_attention_heads} (model.hidden_size / "
            "heads) is odd; ModernBERT's rotary position embedding rotates pairs of dimensions, so it needs an even one"
        )
    if m.global_attn_every_n_layers < 1 or m.local_attention < 2:
        found.append(
            f"model.global_attn_every_n_layers and model.local_attention: must be >= 1 and >= 2, got "
            f"{m.global_attn_every_n_layers} and {m.local_attention}"
        )
    elif m.global_attn_every_n_layers > 1 and m.num_layers > 1 and phases:
        # Judged against the sequences the run trains on, not model.max_position_embeddings (8,192 for
        # ModernBERT, whose first stage trains at 1,024): a window that covers them trains no local attention.
        i, longest = max(enumerate(ph.max_seq_length for ph in phases), key=lambda item: item[1])
        if m.local_attention // 2 >= longest - 1:
            found.append(
                f"model.local_attention: {m.local_attention} covers every sequence of this run (a token sees keys "
                f"up to {m.local_attention // 2} positions away; the longest is data.phases.{i}.max_seq_length="
                f"{longest}), so the local layers would attend like the global ones; set it below "
                f"{2 * (longest - 1)} (or model.global_attn_every_n_layers: 1 for global attention only)"
            )
    if not (m.global_rope_theta > 0 and m.local_rope_theta > 0):
        found.append(
            f"model.global_rope_theta, model.local_rope_theta: must be positive, got {m.global_rope_theta}, "
            f"{m.local_rope_theta}"
        )
    return found


def pretrained_arch_problem(directory: str, arch: str) -> str:
    """Why the Hugging Face directory `directory` cannot start a run of `model.arch` `arch` ('' when it can); read
    from its config.json's model_type (each family's spec names its own), BERT when it names none (old
    checkpoints)."""
    path = Path(directory) / "config.json"
    try:
        model_type = json.loads(path.read_text()).get("model_type", "bert")
    except (OSError, ValueError, AttributeError) as e:
        return (
            f"checkpoint.init_from_pretrained: {path} is unreadable ({e}); "
            "a Hugging Face model directory has a config.json"
        )
    family = registry.arch_of_model_type(model_type)
    if family is None:
        return (
            f"checkpoint.init_from_pretrained: {directory} holds a {model_type!r} model (config.json model_type), "
            f"not one bertdist reads ({', '.join(registry.model_types())})"
        )
    if family != arch:
        return (
            f"checkpoint.init_from_pretrained: {directory} holds a {model_type} model (config.json model_type), and "
            f"model.arch is {arch!r}; set model.arch: {family}"
        )
    return ""


def _generator_problems(m: ModelConfig) -> list[str]:
    """ELECTRA's generator: no wider than the discriminator, heads that split its width, a positive weight."""
    found = []
    if m.generator_hidden_size < 0 or m.generator_hidden_size > m.hidden_size:
        found.append(
            f"model.generator_hidden_size: {m.generator_hidden_size} is not within 0..model.hidden_size="
            f"{m.hidden_size}; a generator wider than the discriminator makes its task too hard (the paper: 1/4 to "
            "1/2 of its width)"
        )
    elif problem := heads_divide_problem(m.generator_config()):
        found.append(
            problem.replace("model.hidden_size", "model.generator_hidden_size").replace(
                "model.num_attention_heads", "model.generator_num_attention_heads"
            )
        )
    if min(m.generator_num_layers, m.generator_intermediate_size, m.embedding_size) < 0 or m.rtd_weight <= 0:
        found.append(
            "model.generator_num_layers, generator_intermediate_size, embedding_size, rtd_weight: must be >= 0 "
            f"(rtd_weight > 0), got {m.generator_num_layers}, {m.generator_intermediate_size}, {m.embedding_size}, "
            f"{m.rtd_weight}"
        )
    return found
