"""BERT (Devlin et al., 2018): the paper's encoder, its pretraining heads (masked LM, next-sentence or
sentence-order prediction, SpanBERT's span boundaries) and its task models.

model.py     BertModel, BertForPreTraining (plain PyTorch, transformers' parameter names)
layers.py    embeddings, attention, feed-forward, the layer stack (ALBERT, ELECTRA and DistilBERT reuse them)
heads.py     the pretraining heads: masked LM, the sentence classifier, SpanBERT's span boundaries
hf.py        to and from transformers' BertForPreTraining / BertForMaskedLM (the model never imports it)
tasks.py     BertFor{SequenceClassification,TokenClassification,QuestionAnswering,MultipleChoice}
"""

from bertdist.model.spec import FamilySpec

# L / H / A of BERT's published family (Turc et al. 2019 for the small ones; Devlin et al. 2018).
PRESETS = {
    "tiny": dict(num_layers=2, hidden_size=128, num_attention_heads=2),
    "mini": dict(num_layers=4, hidden_size=256, num_attention_heads=4),
    "small": dict(num_layers=4, hidden_size=512, num_attention_heads=8),
    "medium": dict(num_layers=8, hidden_size=512, num_attention_heads=8),
    "base": dict(num_layers=12, hidden_size=768, num_attention_heads=12),
    "large": dict(num_layers=24, hidden_size=1024, num_attention_heads=16),
}
"""`model.size` -> its settings (bertdist.config.presets gathers every family's)."""

SPEC = FamilySpec(
    arch="bert",
    model_type="bert",
    pretraining_class="BertForPreTraining",
    own_fields=("type_vocab_size",),
    onnx_pretraining=("BertForPreTraining", "BertForMaskedLM"),
    objectives=("mlm+nsp", "mlm", "mlm+sop", "span"),
    presets=PRESETS,
    demo_config="bert-tiny.yaml",
)
