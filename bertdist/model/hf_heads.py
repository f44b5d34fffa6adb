"""Fine-tuned models in the Hugging Face format: what `transformers`' Auto classes load, both ways, for each
encoder family (BERT: bertdist.model.bert.tasks; ModernBERT: bertdist.model.modernbert.tasks; ALBERT:
bertdist.model.albert.tasks; ELECTRA's discriminator: bertdist.model.electra.tasks; DistilBERT:
bertdist.model.distilbert.tasks).

A task model is named by its `transformers` class, `{family prefix}For{head}` (`BertForSequenceClassification`,
`ModernBertForMultipleChoice`, ...): `task_architecture(arch, head)` makes the name, and the name picks the class.
`save_task_model` writes model.safetensors (the task models already use `transformers`' names), a config.json
naming the architecture with `id2label`/`label2id`, `problem_type` (and ModernBERT's `classifier_pooling`),
and the tokenizer files; `AutoModelFor<Head>` loads it with no missing or unexpected key. `load_task_model`
reads such a directory, whoever wrote it: config.json's model_type picks the family. `read_pretrained` and
`load_encoder` start a task model from a pretrained encoder (a bertdist export or a Hugging Face directory of
the family, with or without the pretraining heads): the encoder's weights are loaded, the head starts fresh.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from bertdist.config import ModelConfig
from bertdist.model import registry
from bertdist.model.hf_io import CONFIG_FILE, CheckpointFormatError, read_config_json, read_weights
from bertdist.model.hf_limits import state_problems, weight_problems
from bertdist.model.task_heads import REGRESSION, SINGLE_LABEL, TaskFamily

SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION = "SequenceClassification", "TokenClassification"
QUESTION_ANSWERING, MULTIPLE_CHOICE = "QuestionAnswering", "MultipleChoice"
HEADS = (SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION, QUESTION_ANSWERING, MULTIPLE_CHOICE)
"""The heads: what follows `For` in a task model's name, and `AutoModelFor` in its Auto class's."""


def family_of(arch: str) -> TaskFamily:
    """The task models of the family `arch` and what they need of the Hugging Face format."""
    return registry.spec(arch).tasks()


def task_architecture(arch: str, head: str) -> str:
    """The class name of the `head` task model (SequenceClassification, ...) of the model.arch family."""
    return f"{family_of(arch).prefix}For{head}"


def build_task_model(
    architecture: str,
    cfg: ModelConfig,
    labels: list[str],
    problem_type: str = SINGLE_LABEL,
    classifier_pooling: str | None = None,
) -> Any:
    """A freshly initialised task model of `cfg`'s family; `labels` are the class names (one name for
    regression and QA/MC). `classifier_pooling` (ModernBERT) None: the model's default."""
    family = family_of(cfg.arch)
    if architecture not in family.task_models:
        raise CheckpointFormatError(
            f"architecture {architecture!r} is not a {cfg.arch} task model ({', '.join(family.task_models)})"
        )
    head = architecture.split("For", 1)[1]
    options = {} if classifier_pooling is None else {"classifier_pooling": classifier_pooling}
    model_class = family.task_models[architecture]
    if head == SEQUENCE_CLASSIFICATION:
        return model_class(cfg, len(labels), problem_type, **options)
    if head == TOKEN_CLASSIFICATION:
        return model_class(cfg, len(labels))
    if head == MULTIPLE_CHOICE:
        return model_class(cfg, **options)
    return model_class(cfg)


def save_task_model(
    model: Any,
    directory: str | os.PathLike,
    labels: list[str],
    vocab_file: str | os.PathLike | None,
    extra_config: dict[str, Any] | None = None,
) -> None:
    """Write `directory` for `AutoModelFor<Head>.from_pretrained` and `AutoTokenizer` (offline)."""
    architecture = type(model).__name__
    head = architecture.split("For", 1)[1]
    config: dict[str, Any] = {"architectures": [architecture], "classifier_dropout": model.config.hidden_dropout_prob}
    if head in (SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION):
        config["id2label"] = {str(i): name for i, name in enumerate(labels)}
        config["label2id"] = {name: i for i, name in enumerate(labels)}
    if head == SEQUENCE_CLASSIFICATION:
        config["problem_type"] = model.problem_type
    if hasattr(model, "classifier_pooling"):
        config["classifier_pooling"] = model.classifier_pooling
    family_of(model.config.arch).write_directory(model, directory, vocab_file, {**config, **(extra_config or {})})


def load_task_model(directory: str | os.PathLike, unpad: bool = True) -> tuple[Any, list[str]]:
    """A fine-tuned model saved by us or by `transformers` (architecture from config.json) and its labels.
    `unpad` False: its encoder runs padded (model.unpad), as a traced graph needs (bertdist.model.onnx)."""
    directory = Path(directory)
    raw, cfg = model_config(directory)
    cfg = dataclasses.replace(cfg, unpad=unpad)
    family = family_of(cfg.arch)
    architecture = (raw.get("architectures") or [""])[0]
    labels = _labels(raw, directory)
    sequence = architecture.endswith(SEQUENCE_CLASSIFICATION)
    problem_type = raw.get("problem_type") or (REGRESSION if len(labels) == 1 and sequence else SINGLE_LABEL)
    model = build_task_model(architecture, cfg, labels, problem_type, raw.get("classifier_pooling"))
    tensors, source = read_weights(directory)
    state = family.state_from_hf(tensors, source)
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise CheckpointFormatError(
            f"{source}: not a {architecture} checkpoint: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    model.load_state_dict(state, strict=True)
    return model, labels


def read_pretrained(directory: str | os.PathLike) -> tuple[ModelConfig, dict[str, torch.Tensor], str]:
    """The config, the weights in bertdist names and the file read of a Hugging Face directory of any family."""
    directory = Path(directory)
    _, cfg = model_config(directory)
    tensors, source = read_weights(directory)
    family = family_of(cfg.arch)
    state = family.state_from_hf(tensors, source)
    # Before any model is built from config.json: a config that disagrees with its weights (fewer layers, another
    # width) is refused here, not allocated and then silently left with some of its weights unused.
    prefix = (f"{family.encoder_name}.",)
    problems = weight_problems(lambda: _encoder_holder(cfg), state, prefix, family.optional)
    if problems:
        raise CheckpointFormatError(f"{source} (with {directory / CONFIG_FILE}): " + "; ".join(problems))
    return cfg, state, source


def task_model_from_pretrained(
    directory: str | os.PathLike, architecture: str, labels: list[str], problem_type: str = SINGLE_LABEL
) -> Any:
    """A task model whose encoder comes from the pretrained model in `directory`; the classifier is fresh."""
    cfg, state, source = read_pretrained(directory)
    raw, _ = model_config(directory)  # ModernBERT's classifier pooling, as transformers reads it from there
    model = build_task_model(architecture, cfg, labels, problem_type, raw.get("classifier_pooling"))
    load_encoder(model, state, source)
    return model


def load_encoder(model: Any, state: dict[str, Any], source: str) -> None:
    """Copy the pretrained weights a task model starts from (its family's `pretrained` prefixes) out of a
    pretrained state dict; the rest (the pretraining heads, a classifier) is left out. The optional weights the
    state lacks (a pooler, ModernBERT's head) start fresh, said in a warning where the model reads them (a model
    whose `reads_optional_weights` is False, a sentence encoder's pooling, does not).

    `model` is a task model, or a module holding a bare encoder under the same name (`pretrained_encoder`)."""
    family = family_of(model.config.arch)
    wanted = {k: v for k, v in model.state_dict().items() if k.startswith(family.pretrained)}
    problems = state_problems({k: v.shape for k, v in wanted.items()}, state, family.optional, family.pretrained)
    if problems:
        raise CheckpointFormatError(f"{source}: the {model.config.arch} encoder: " + "; ".join(problems))
    fresh = sorted(set(wanted) - set(state))  # optional weights: said as pretraining says them (check_weights)
    if fresh and getattr(model, "reads_optional_weights", True):  # an MLM-only export has no pooler to read
        warnings.warn(f"{source}: no weights for {', '.join(fresh)}; they start fresh", stacklevel=3)
    model.load_state_dict({k: v for k, v in state.items() if k in wanted}, strict=False)


def pretrained_encoder(cfg: ModelConfig, state: dict[str, Any], source: str) -> torch.nn.Module:
    """The bare encoder of `cfg`'s family with the pretrained weights of `state` (`encode`, `hidden_states`)."""
    holder = _encoder_holder(cfg)
    load_encoder(holder, state, source)
    return getattr(holder, family_of(cfg.arch).encoder_name)


def _encoder_holder(cfg: ModelConfig) -> torch.nn.Module:
    """The bare encoder of `cfg`'s family under the task models' name, which pretrained state dicts use."""
    family = family_of(cfg.arch)
    holder = torch.nn.Module()
    holder.config = cfg
    holder.reads_optional_weights = False  # features of the encoder (`bertdist embed --features pooled` refuses
    # a model without a pooler itself)
    setattr(holder, family.encoder_name, family.encoder(cfg))
    return holder


def model_config(directory: str | os.PathLike) -> tuple[dict[str, Any], ModelConfig]:
    """config.json of a Hugging Face directory of any family and the ModelConfig it describes."""
    directory = Path(directory)
    raw, arch = _read_config(directory)
    return raw, family_of(arch).config_from_hf(raw, str(directory / CONFIG_FILE))


def _read_config(directory: Path) -> tuple[dict[str, Any], str]:
    """config.json and the model.arch its model_type names (BERT when it names none, as old checkpoints)."""
    path = directory / CONFIG_FILE
    raw = read_config_json(path, "model")
    arch = registry.arch_of_config(raw)
    if arch is None:
        raise CheckpointFormatError(
            f"{path}: model_type {raw.get('model_type')!r} is not one bertdist reads "
            f"({', '.join(registry.model_types())})"
        )
    return raw, arch


def _labels(raw: dict[str, Any], directory: Path) -> list[str]:
    id2label = raw.get("id2label")
    if isinstance(id2label, dict) and id2label:
        try:
            return [str(id2label[str(i)]) for i in range(len(id2label))]
        except KeyError:
            raise CheckpointFormatError(
                f"{directory / CONFIG_FILE}: id2label keys are not 0..{len(id2label) - 1}"
            ) from None
    return [f"LABEL_{i}" for i in range(int(raw.get("num_labels", 2)))]
