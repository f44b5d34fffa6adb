"""DistilBERT (Sanh et al., 2019, arXiv 1910.01108): BERT's layer at the teacher's width, half its depth, no segment
embeddings or pooler, trained by distillation (bertdist.train.distill holds the teacher).

model.py     DistilBertForMaskedLM (on BERT's layers)
hf.py        to and from transformers' DistilBertForMaskedLM (its own names and config keys)
tasks.py     DistilBertFor{SequenceClassification,TokenClassification,QuestionAnswering,MultipleChoice}
"""

from bertdist.model.spec import FamilySpec

SPEC = FamilySpec(
    arch="distilbert",
    model_type="distilbert",
    pretraining_class="DistilBertForMaskedLM",
    own_fields=(),
    onnx_pretraining=("DistilBertForMaskedLM",),
    demo_config=None,
)
