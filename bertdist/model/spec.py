"""What the rest of bertdist asks of an encoder family: one `FamilySpec`, kept in the family's folder.

A family is a folder `bertdist/model/<arch>/`: `model.py` (the pretraining model and the bare encoder, plain
PyTorch), `hf.py` (its Hugging Face adapter: `config_from_hf`, `from_hf_state_dict`, `write_directory`,
`load_pretrained`), `tasks.py` (its fine-tuning models and their `TaskFamily`), and `__init__.py`, which holds its
`SPEC`. The spec is torch-free and names the rest by module, so that reading it (the registry, config validation,
the forecast) imports no model; `module()` imports what is asked for.

Code outside the folder asks the spec (or the objects it names) instead of branching on `model.arch`.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Mapping


@dataclass(frozen=True)
class FamilySpec:
    arch: str
    """`model.arch`, and the folder's name."""
    model_type: str
    """config.json's `model_type` of the family's Hugging Face directories."""
    pretraining_class: str
    """The pretraining model's class in the folder's `model` module (built from a ModelConfig)."""
    own_fields: tuple[str, ...] = ()
    """ModelConfig fields only this family reads: set away from their defaults on another family, refused."""
    onnx_pretraining: tuple[str, ...] = ()
    """config.json architectures of its pretraining exports that ONNX export takes (the graph returns the MLM
    logits); ELECTRA's export is its discriminator, whose output is no MLM, so it names none."""
    objectives: tuple[str, ...] = ("mlm",)
    """The `model.objective`s its pretraining model trains (validation refuses the others, naming who trains them)."""
    rules: bool = False
    """Whether the folder has a `rules` module: the family's own config checks, `problems(model_cfg, phases)`,
    torch-free (ModernBERT's window, ALBERT's embedding width, ELECTRA's generator)."""
    presets: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    """`model.size` -> its settings (with `arch` for every family but BERT, the default)."""
    demo_config: str | None = None
    """The `configs/` file `bertdist demo --arch` runs for this family; None: no demo."""
    layer_class: str = "bertdist.model.bert.layers.BertLayer"
    """The encoder's repeated layer, module path and class: what `model.compile` compiles, one region per layer
    (bertdist.model.compiled)."""
    other_model_types: tuple[str, ...] = ()
    """Other config.json `model_type`s the family's adapter reads (RoBERTa's: XLM-R's `xlm-roberta`, the same
    architecture under another name); `model_type` stays the one its exports are by default."""

    def config_problems(self, model_cfg: Any, phases: list[Any]) -> list[str]:
        """What the family's own rules find wrong with a config (none without a `rules` module)."""
        return self.module("rules").problems(model_cfg, phases) if self.rules else []

    @property
    def model_types(self) -> tuple[str, ...]:
        """Every config.json `model_type` its adapter reads."""
        return (self.model_type, *self.other_model_types)

    def vocab_problems(self, model_cfg: Any, vocab_file: str) -> list[str]:
        """What the family's rules find wrong with the run's tokenizer, read before training. Only a family whose
        model reads `model.pad_token_id` (RoBERTa: positions start past it) asks: its `rules` module's
        `tokenizer_problem(model_cfg, tokenizer, where)`."""
        if "pad_token_id" not in self.own_fields:
            return []
        from bertdist.data.tokenizer import open_tokenizer

        tokenizer = open_tokenizer(vocab_file)
        problem = self.module("rules").tokenizer_problem(model_cfg, tokenizer, f"data.vocab_file={vocab_file}")
        return [problem] if problem else []

    def module(self, name: str) -> ModuleType:
        """The folder's module `name` (model, hf, tasks), imported now."""
        return importlib.import_module(f"bertdist.model.{self.arch}.{name}")

    def model_class(self) -> Any:
        return getattr(self.module("model"), self.pretraining_class)

    def adapter(self) -> ModuleType:
        """The Hugging Face adapter (`hf.py`)."""
        return self.module("hf")

    def tasks(self) -> Any:
        """The family's `TaskFamily` (bertdist.model.task_heads): its task models and what they need of the format."""
        return self.module("tasks").FAMILY
