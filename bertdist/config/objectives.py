"""The pretraining objectives, by `model.objective`: what each one trains, and on which prepared samples.

| objective | what trains | samples (`bertdist prepare --objective`) | export |
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
bertdist.model.outputs, bertdist.train.metrics). An architecture's pretraining model reads the table through
`objective(cfg)`; the trainer's loader refuses shards whose samples the objective cannot use, naming both.

A new objective is its name in the schema's `model.objective` Literal and a row here; one with its own heads or
loss adds them in the model of the architectures it names (ELECTRA's generator and discriminator are
bertdist.model.electra.model; SpanBERT's span-boundary head is bertdist.model.bert.heads, which BERT's pretraining model
adds when `span_boundaries` says so; distillation's teacher and loss are bertdist.model.distilbert.model, the teacher's
loading bertdist.train.distill) and says so in docs/model.md. This module is data: it imports nothing heavy.

SpanBERT's head predicts each token of a masked span from the two tokens just outside the span and its place in it,
so its batches carry each prediction's span bounds (bertdist.data.batching), which only load-time span masking
knows: `span` needs `data.masking.span_masking` and shards prepared with `--masking dynamic`. Its export is the
encoder with the MLM head, as the released SpanBERT is: the boundary head only trains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Objective:
    sentence_task: str | None
    """The [CLS] classifier's task, which names its loss and accuracy (`nsp`, `sop`), or None: no pooler, no head."""
    samples: tuple[str, ...]
    """The kinds of prepared samples (`bertdist prepare --objective`) it trains on."""
    summary: str
    architectures: tuple[str, ...] = ("bert", "modernbert", "albert")
    """The `model.arch`s whose models train it (ModernBERT: those without a sentence task)."""
    span_boundaries: bool = False
    """SpanBERT's span-boundary head: batches carry each prediction's span bounds (span masking at load time)."""


OBJECTIVES = {
    "mlm+nsp": Objective("nsp", ("nsp",), "masked LM + next-sentence prediction (BERT)"),
    "mlm": Objective(
        None,
        ("mlm", "nsp", "sop"),
        "masked LM only (RoBERTa)",
        ("bert", "modernbert", "albert", "distilbert", "roberta"),
    ),
    "mlm+sop": Objective("sop", ("sop",), "masked LM + sentence-order prediction (ALBERT)"),
    "rtd": Objective(None, ("mlm", "nsp", "sop"), "replaced-token detection (ELECTRA)", ("electra",)),
    "span": Objective(None, ("mlm", "nsp", "sop"), "masked LM + span boundaries (SpanBERT)", ("bert",), True),
    "distill": Objective(None, ("mlm", "nsp", "sop"), "distillation from a teacher (DistilBERT)", ("distilbert",)),
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
