"""BERT (Devlin et al., 2018): the paper's encoder, its pretraining heads (masked LM, next-sentence or
sentence-order prediction, SpanBERT's span boundaries) and its task models.

model.py     BertModel, BertForPreTraining (plain PyTorch, transformers' parameter names)
layers.py    embeddings, attention, feed-forward, the layer stack (ALBERT, ELECTRA and DistilBERT reuse them)
heads.py     the pretraining heads: masked LM, the sentence classifier, SpanBERT's span boundaries
hf.py        to and from transformers' BertForPreTraining / BertForMaskedLM (the model never imports it)
tasks.py     BertFor{SequenceClassification,TokenClassification,QuestionAnswering,MultipleChoice}
"""

from bertdist.model.spec import FamilySpec

SPEC = FamilySpec(
    arch="bert",
    model_type="bert",
    pretraining_class="BertForPreTraining",
    own_fields=("type_vocab_size",),
    onnx_pretraining=("BertForPreTraining", "BertForMaskedLM"),
    demo_config="bert-tiny.yaml",
)
