"""ALBERT (Lan et al., 2019, arXiv 1909.11942): factorised embeddings, layers that share parameters, sentence-order
prediction.

model.py     AlbertModel, AlbertForPreTraining (on BERT's layers)
hf.py        to and from transformers' AlbertForPreTraining / AlbertForMaskedLM
tasks.py     AlbertFor{SequenceClassification,TokenClassification,QuestionAnswering,MultipleChoice}
"""

from bertdist.model.spec import FamilySpec

SPEC = FamilySpec(
    arch="albert",
    model_type="albert",
    pretraining_class="AlbertForPreTraining",
    own_fields=("type_vocab_size", "embedding_size", "share_layers"),
    onnx_pretraining=("AlbertForPreTraining", "AlbertForMaskedLM"),
    demo_config=None,
)
