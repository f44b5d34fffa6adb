"""RoBERTa (Liu et al., 2019, arXiv 1907.11692) and XLM-R (Conneau et al., 2019, arXiv 1911.02116): BERT's
encoder with one segment, positions counted from past the padding index, and masked LM alone (no pooler, no
sentence head); XLM-R is the same architecture over a larger vocabulary.

model.py     RobertaModel, RobertaForMaskedLM (on BERT's layers, transformers' names)
hf.py        to and from transformers' RobertaForMaskedLM and XLMRobertaForMaskedLM
tasks.py     RobertaFor{SequenceClassification,TokenClassification,QuestionAnswering,MultipleChoice}
"""

from bertdist.model.spec import FamilySpec

_FAMILY = dict(
    arch="roberta",
    objective="mlm",  # no sentence head (arXiv 1907.11692, section 4.2)
    vocab_size=50265,  # GPT-2's byte-level BPE with RoBERTa's four special tokens (section 4.4)
    pad_token_id=1,  # <s> <pad> </s> <unk> at 0-3: positions start at 2
    max_position_embeddings=514,  # 512 tokens past the padding index
    type_vocab_size=1,
    layer_norm_eps=1e-5,
)
"""RoBERTa's settings shared by every size (the released roberta-base config.json); XLM-R changes the vocabulary."""
PRESETS = {
    # RoBERTa (arXiv 1907.11692): BERT-Base's shape; mini is BERT-mini's, for CPU runs. XLM-R Base (arXiv
    # 1911.02116): the same, over a 250,002-token SentencePiece vocabulary; its exports are XLMRobertaForMaskedLM.
    "roberta-mini": dict(_FAMILY, num_layers=4, hidden_size=256, num_attention_heads=4),
    "roberta-base": dict(_FAMILY, num_layers=12, hidden_size=768, num_attention_heads=12),
    "xlm-roberta-base": dict(_FAMILY, num_layers=12, hidden_size=768, num_attention_heads=12, vocab_size=250002),
}
"""`model.size` -> its settings (bertdist.config.presets gathers every family's)."""

SPEC = FamilySpec(
    arch="roberta",
    model_type="roberta",
    pretraining_class="RobertaForMaskedLM",
    own_fields=("type_vocab_size", "pad_token_id"),
    objectives=("mlm",),
    rules=True,
    onnx_pretraining=("RobertaForMaskedLM", "XLMRobertaForMaskedLM"),
    presets=PRESETS,
    demo_config=None,
    other_model_types=("xlm-roberta",),
)
