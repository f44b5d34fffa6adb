"""RoBERTa (Liu et al., 2019, arXiv 1907.11692) and XLM-R (Conneau et al., 2019, arXiv 1911.02116): BERT's
encoder with one segment, positions counted from past the padding index, and masked LM alone (no pooler, no
sentence head); XLM-R is the same architecture over a larger vocabulary.

model.py     RobertaModel, RobertaForMaskedLM (on BERT's layers, transformers' names)
hf.py        to and from transformers' RobertaForMaskedLM and XLMRobertaForMaskedLM
tasks.py     RobertaFor{SequenceClassification,TokenClassification,QuestionAnswering,MultipleChoice}
"""

from bertdist.model.spec import FamilySpec

SPEC = FamilySpec(
    arch="roberta",
    model_type="roberta",
    pretraining_class="RobertaForMaskedLM",
    own_fields=("type_vocab_size", "pad_token_id"),
    onnx_pretraining=(),  # not yet traced and compared with onnxruntime for this family
    demo_config=None,
    other_model_types=("xlm-roberta",),
)
