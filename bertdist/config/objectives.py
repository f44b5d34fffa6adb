"""The pretraining objectives, by `model.objective`: what each one trains, and on which prepared samples.

| objective | what trains | samples (`bertdist prepare --samples`) | export |
| --- | --- | --- | --- |
| `mlm+nsp` (the paper, default) | masked LM + next-sentence prediction on [CLS] | `nsp` pairs | `*ForPreTraining` |
| `mlm` (RoBERTa) | masked LM alone: no pooler, no sentence head | any (`mlm` text is made for it) | `*ForMaskedLM` |
| `mlm+sop` (ALBERT) | masked LM + sentence-order prediction on [CLS] | `sop` pairs | `*ForPreTraining` |
| `rtd` (ELECTRA) | generator MLM + 50 x replaced-token detection | any | `ElectraForPreTraining` (+ `...ForMaskedLM`) |
| `distill` (DistilBERT) | soft targets of a teacher + MLM + hidden-state cosine | any | `DistilBertForMaskedLM` |
| `span` (SpanBERT) | masked LM + span-boundary objective on span masks | any, masked at load | `BertForMaskedLM` |

The sentence head is the same module for next-sentence and sentence-order prediction (a 2-way classifier on the
pooled [CLS]: BERT's `cls.seq_relationship`, ALBERT's `sop_classifier`); the objective decides which labels the
samples carry and the name its loss and accuracy are logged under (`loss/train_nsp`, `sop_accuracy/eval`, ...:
bertdist.model.outputs, bertdist.train.metrics). An objective is its loss parts: `mlm`, `nsp`/`sop` and `sbo` are
modules of bertdist.model.objectives, which compose over any encoder (a family's pretraining model binds them to
its heads); `rtd` and distillation's `kd` and `cos` are computed by ELECTRA's and DistilBERT's own models. The loader
makes the batch fields the parts read (`BATCH_FIELDS`) and refuses shards whose samples the objective cannot use,
naming both; an objective that needs something beside the model (distillation's teacher) names a `setup` module,
which the run calls without knowing which objective it is.

A new objective is its name in the schema's `model.objective` Literal and a row here, and its name in the
`objectives` of each family's spec that trains it. One made of the existing parts needs nothing else; a new
composable part is a module in bertdist.model.objectives (its fields in `BATCH_FIELDS`) that the families training
it add to their `objectives()`; say so in docs/model.md. This module is data: it imports nothing heavy.

SpanBERT's head predicts each token of a masked span from the two tokens just outside the span and its place in it,
so its batches carry each prediction's span bounds (bertdist.data.batching), which only load-time span masking
knows: `span` needs `data.masking.span_masking` and shards prepared with `--masking dynamic`. Its export is the
encoder with the MLM head, as the released SpanBERT is: the boundary head only trains.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

SENTENCE_TASKS = ("nsp", "sop")
"""The parts that are the sentence classifier on the pooled [CLS] (bertdist.model.objectives.sentence)."""

BATCH_FIELDS = {
    "mlm": ("masked_lm_positions", "masked_lm_ids"),
    "nsp": ("next_sentence_label",),
    "sop": ("next_sentence_label",),
    "sbo": ("masked_lm_positions", "masked_lm_ids", "masked_lm_span_bounds"),
    "rtd": ("masked_lm_positions", "masked_lm_ids"),
    "kd": ("masked_lm_positions", "masked_lm_ids"),
    "cos": (),
}
"""A loss part -> the batch fields (bertdist.data.batching) it reads: what the loader must make for an objective,
and what each objective module of bertdist.model.objectives declares (`Objective.fields`)."""


@dataclass(frozen=True)
class Objective:
    parts: tuple[str, ...]
    """The loss parts it trains, in the order its model composes them (each logged as `loss/{split}_{part}`):
    `mlm`, `nsp`, `sop` and `sbo` are bertdist.model.objectives' modules, which compose over any encoder; `rtd` and
    `kd` + `cos` are ELECTRA's and DistilBERT's, computed in their families' models."""
    samples: tuple[str, ...]
    """The kinds of prepared samples (`bertdist prepare --samples`) it trains on."""
    summary: str
    setup: str | None = None
    """A module with `set_up(cfg, model, device, fresh)`, which the run calls after building the model and
    before its engine, `plan_lines(cfg)`, what `bertdist train --dry-run` says of it, and
    `side_forward_flops(cfg, seq_length, predictions)`, the forward FLOPs per sequence it runs beside the model's
    (MFU leaves them out; a forecast of the step's time cannot), or None when they cannot be read here
    (distillation's teacher: bertdist.model.distilbert.teacher). None: nothing to set up."""

    @property
    def sentence_task(self) -> str | None:
        """The [CLS] classifier's task, which names its loss and accuracy (`nsp`, `sop`); None: no pooler, no
        head."""
        return next((p for p in self.parts if p in SENTENCE_TASKS), None)

    @property
    def span_boundaries(self) -> bool:
        """SpanBERT's span-boundary head: batches carry each prediction's span bounds (span masking at load time)."""
        return "sbo" in self.parts

    @property
    def fields(self) -> tuple[str, ...]:
        """The batch fields its parts read, once each."""
        return tuple(dict.fromkeys(f for part in self.parts for f in BATCH_FIELDS[part]))

    def set_up(self, cfg: Any, model: Any, device: Any, fresh: bool) -> None:
        """What the objective needs beside the model before training (its `setup` module); nothing for most."""
        if self.setup:
            importlib.import_module(self.setup).set_up(cfg, model, device, fresh)

    def plan_lines(self, cfg: Any) -> list[str]:
        """What the plan says of the objective's own settings; [] for most."""
        return importlib.import_module(self.setup).plan_lines(cfg) if self.setup else []

    def side_forward_flops(self, cfg: Any, seq_length: int, predictions: int) -> float | None:
        """Forward FLOPs per sequence run beside the model's (a teacher's); 0 for most, None if unknown here."""
        return importlib.import_module(self.setup).side_forward_flops(cfg, seq_length, predictions) if self.setup else 0


ANY = ("mlm", "nsp", "sop")
OBJECTIVES = {
    "mlm+nsp": Objective(("mlm", "nsp"), ("nsp",), "masked LM + next-sentence prediction (BERT)"),
    "mlm": Objective(("mlm",), ANY, "masked LM only (RoBERTa)"),
    "mlm+sop": Objective(("mlm", "sop"), ("sop",), "masked LM + sentence-order prediction (ALBERT)"),
    "rtd": Objective(("mlm", "rtd"), ANY, "replaced-token detection (ELECTRA)"),
    "span": Objective(("mlm", "sbo"), ANY, "masked LM + span boundaries (SpanBERT)"),
    "distill": Objective(
        ("kd", "mlm", "cos"), ANY, "distillation from a teacher (DistilBERT)", "bertdist.model.distilbert.teacher"
    ),
}
"""model.objective -> what it trains (the keys are the schema's Literal, in its order)."""


def objective(model: Any) -> Objective:
    """The objective of a ModelConfig."""
    return OBJECTIVES[model.objective]


HF_KEY = "bertdist_objective"
"""config.json's record of the objective: the Hugging Face classes name the heads, not which labels trained the
sentence head (a BERT trained with sentence order is a `BertForPreTraining` too)."""


def objective_from_hf(hf: dict[str, Any], with_sentence_head: str) -> str:
    """The objective of a pretraining config.json: `mlm` for a `*ForMaskedLM` (no sentence head), else its record
    when that names an objective with a sentence head, else the family's own (BERT: mlm+nsp; ALBERT: mlm+sop).
    The class decides what the weights hold; the record only which labels trained the head."""
    if any(name.endswith("ForMaskedLM") for name in hf.get("architectures") or []):
        return "mlm"
    recorded = OBJECTIVES.get(hf.get(HF_KEY, ""))
    return hf[HF_KEY] if recorded is not None and recorded.sentence_task else with_sentence_head


def upgrade_model_section(section: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's model settings as this bertdist names them: runs before `model.objective` recorded
    `next_sentence_prediction: true/false` (mlm+nsp / mlm). Saved configs are read through this, so an old
    run resumes, exports and fine-tunes; a user's YAML with the old key is refused with the new name instead
    (bertdist.config.loading.RENAMED)."""
    if "next_sentence_prediction" not in section:
        return section
    upgraded = {k: v for k, v in section.items() if k != "next_sentence_prediction"}
    upgraded["objective"] = "mlm+nsp" if section["next_sentence_prediction"] else "mlm"
    return upgraded
