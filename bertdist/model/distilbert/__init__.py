"""DistilBERT (Sanh et al., 2019, arXiv 1910.01108): BERT's layer at the teacher's width, half its depth, no segment
embeddings or pooler, trained by distillation (bertdist.model.distilbert.teacher holds the teacher).

model.py     DistilBertForMaskedLM (on BERT's layers)
hf.py        to and from transformers' DistilBertForMaskedLM (its own names and config keys)
tasks.py     DistilBertFor{SequenceClassification,TokenClassification,QuestionAnswering,MultipleChoice}
"""

from bertdist.model.spec import FamilySpec

_FAMILY = dict(arch="distilbert", objective="distill")
"""DistilBERT (arXiv 1910.01108, section 3): BERT's layer at the teacher's width, half its depth, no segment
embeddings or pooler, trained by distillation."""
PRESETS = {
    # DistilBERT: half the teacher's layers at its width (6 of BERT-Base's 12, section 3); mini: 2 of BERT-mini's 4.
    "distilbert-mini": dict(_FAMILY, num_layers=2, hidden_size=256, num_attention_heads=4),
    "distilbert-base": dict(_FAMILY, num_layers=6, hidden_size=768, num_attention_heads=12),
}
"""`model.size` -> its settings (bertdist.config.presets gathers every family's)."""

SPEC = FamilySpec(
    arch="distilbert",
    model_type="distilbert",
    pretraining_class="DistilBertForMaskedLM",
    own_fields=(),
    onnx_pretraining=("DistilBertForMaskedLM",),
    objectives=("mlm", "distill"),
    presets=PRESETS,
    demo_config=None,
)
