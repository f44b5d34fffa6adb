"""ALBERT (Lan et al., 2019, arXiv 1909.11942): factorised embeddings, layers that share parameters, sentence-order
prediction.

model.py     AlbertModel, AlbertForPreTraining (on BERT's layers)
hf.py        to and from transformers' AlbertForPreTraining / AlbertForMaskedLM
tasks.py     AlbertFor{SequenceClassification,TokenClassification,QuestionAnswering,MultipleChoice}
"""

from bertdist.model.spec import FamilySpec

_FAMILY = dict(
    arch="albert",
    embedding_size=128,  # E = 128 at every size (arXiv 1909.11942, Table 1)
    share_layers="all",  # all-shared, ALBERT's default (ibid., section 3.1)
    objective="mlm+sop",  # sentence-order prediction instead of NSP (ibid., section 3.1)
    hidden_dropout_prob=0.0,  # no dropout (ibid., section 4.8; the v2 checkpoints' configs)
    attention_dropout_prob=0.0,
    vocab_size=30000,  # a 30,000-token SentencePiece vocabulary (ibid., section 4.1)
)
"""ALBERT's settings shared by every size; heads are H / 64 and the feed-forward 4H (ibid., section 3.1)."""
PRESETS = {
    # ALBERT (arXiv 1909.11942, Table 1): base L12/H768, large L24/H1024 (12M and 18M parameters). The mini
    # size is BERT-mini's shape with ALBERT's E and sharing, for CPU runs.
    "albert-mini": dict(_FAMILY, num_layers=4, hidden_size=256, num_attention_heads=4),
    "albert-base": dict(_FAMILY, num_layers=12, hidden_size=768, num_attention_heads=12),
    "albert-large": dict(_FAMILY, num_layers=24, hidden_size=1024, num_attention_heads=16),
}
"""`model.size` -> its settings (bertdist.config.presets gathers every family's)."""

SPEC = FamilySpec(
    arch="albert",
    model_type="albert",
    pretraining_class="AlbertForPreTraining",
    own_fields=("type_vocab_size", "embedding_size", "share_layers"),
    onnx_pretraining=("AlbertForPreTraining", "AlbertForMaskedLM"),
    objectives=("mlm+nsp", "mlm", "mlm+sop"),
    rules=True,
    layer_class="bertdist.model.albert.model.AlbertLayer",
    presets=PRESETS,
    demo_config=None,
)
