"""Fine-tuned models in the Hugging Face format: what `transformers`' Auto classes load, both ways.

`save_task_model` writes model.safetensors (the heads already use `transformers`' names), a config.json
naming the architecture (`BertForSequenceClassification`, ...) with `id2label`/`label2id`, `num_labels` and
`problem_type`, and the tokenizer files; `AutoModelFor<Task>` loads it with no missing or unexpected key.
`load_task_model` reads such a directory, whoever wrote it. `task_model_from_pretrained` starts a task model
from a pretrained encoder (a bertdist export or any HF BERT directory, with or without the pretraining heads):
the encoder's weights are loaded, the head starts from BERT's initialisation.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bertdist.config import ModelConfig
from bertdist.model.heads import (
    REGRESSION,
    SINGLE_LABEL,
    TASK_MODELS,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertdist.model.hf import (
    CONFIG_FILE,
    CheckpointFormatError,
    agreeing_config,
    from_hf_state_dict,
    read_config,
    read_weights,
    write_directory,
)


def build_task_model(architecture: str, cfg: ModelConfig, labels: list[str], problem_type: str = SINGLE_LABEL) -> Any:
    """A freshly initialised task model; `labels` are the class names (one name for regression and QA/MC)."""
    if architecture == "BertForSequenceClassification":
        return BertForSequenceClassification(cfg, len(labels), problem_type)
    if architecture == "BertForTokenClassification":
        return BertForTokenClassification(cfg, len(labels))
    if architecture == "BertForQuestionAnswering":
        return BertForQuestionAnswering(cfg)
    if architecture == "BertForMultipleChoice":
        return BertForMultipleChoice(cfg)
    raise CheckpointFormatError(f"architecture {architecture!r} is not one of {', '.join(TASK_MODELS)}")


def save_task_model(model: Any, directory: str | os.PathLike, labels: list[str], vocab_file: str | os.PathLike | None,
                    extra_config: dict[str, Any] | None = None) -> None:  # fmt: skip
    """Write `directory` for `AutoModelFor<Task>.from_pretrained` and `AutoTokenizer` (offline)."""
    config: dict[str, Any] = {"architectures": [type(model).__name__]}
    if isinstance(model, (BertForSequenceClassification, BertForTokenClassification)):
        config["id2label"] = {str(i): name for i, name in enumerate(labels)}
        config["label2id"] = {name: i for i, name in enumerate(labels)}
    if isinstance(model, BertForSequenceClassification):
        config["problem_type"] = model.problem_type
    write_directory(model, directory, vocab_file, {**config, **(extra_config or {})})


def load_task_model(directory: str | os.PathLike) -> tuple[Any, list[str]]:
    """A fine-tuned model saved by us or by `transformers` (architecture from config.json) and its labels."""
    directory = Path(directory)
    cfg = read_config(directory)
    raw = json.loads((directory / CONFIG_FILE).read_text())
    architecture = (raw.get("architectures") or [""])[0]
    labels = _labels(raw, directory)
    problem_type = raw.get("problem_type") or (REGRESSION if len(labels) == 1 and architecture == "BertForSequenceClassification" else SINGLE_LABEL)
    model = build_task_model(architecture, cfg, labels, problem_type)
    tensors, source = read_weights(directory)
    state = from_hf_state_dict(tensors, source)
    missing, unexpected = _key_differences(model, state)
    if missing or unexpected:
        raise CheckpointFormatError(f"{source}: not a {architecture} checkpoint: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.load_state_dict(state, strict=True)
    return model, labels


def task_model_from_pretrained(directory: str | os.PathLike, architecture: str, labels: list[str],
                               problem_type: str = SINGLE_LABEL, model_cfg: ModelConfig | None = None) -> Any:  # fmt: skip
    """A task model whose encoder comes from the pretrained BERT in `directory`; the head is fresh.

    `model_cfg` (dropout and the like) must agree with the checkpoint's architecture. A checkpoint without
    the encoder's weights is refused, naming what is missing; the pretraining heads are left out.
    """
    directory = Path(directory)
    checkpoint_cfg = read_config(directory)
    cfg = checkpoint_cfg if model_cfg is None else agreeing_config(model_cfg, checkpoint_cfg, directory)
    model = build_task_model(architecture, cfg, labels, problem_type)
    tensors, source = read_weights(directory)
    load_encoder(model, from_hf_state_dict(tensors, source), source)
    return model


def load_encoder(model: Any, state: dict[str, Any], source: str) -> None:
    """Copy the encoder weights (`bert.*`) of a pretrained state dict into a task model; the head stays fresh.

    The pretraining heads (`cls.*`) are left out, and so is the pooler where the task has none.
    """
    encoder = {k for k in model.state_dict() if k.startswith("bert.")}
    missing = sorted(k for k in encoder if k not in state and not k.startswith("bert.pooler."))
    if missing:
        raise CheckpointFormatError(f"{source}: missing BERT encoder weights: {', '.join(missing[:5])}")
    wrong = [f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}" for k, v in model.state_dict().items()
             if k in encoder and k in state and state[k].shape != v.shape]  # fmt: skip
    if wrong:
        raise CheckpointFormatError(f"{source}: shapes disagree with the model: {'; '.join(wrong[:3])}")
    model.load_state_dict({k: v for k, v in state.items() if k in encoder}, strict=False)


def _labels(raw: dict[str, Any], directory: Path) -> list[str]:
    id2label = raw.get("id2label")
    if isinstance(id2label, dict) and id2label:
        try:
            return [str(id2label[str(i)]) for i in range(len(id2label))]
        except KeyError:
            raise CheckpointFormatError(f"{directory / CONFIG_FILE}: id2label keys are not 0..{len(id2label) - 1}") from None
    return [f"LABEL_{i}" for i in range(int(raw.get("num_labels", 2)))]


def _key_differences(model: Any, state: dict[str, Any]) -> tuple[list[str], list[str]]:
    expected = set(model.state_dict())
    return sorted(expected - set(state)), sorted(set(state) - expected)
