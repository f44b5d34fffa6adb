"""ModernBERT (Warner et al., 2024, arXiv 2412.13663): RoPE, GeGLU, pre-norm, global and sliding-window
layers, unpadded throughout.

model.py     ModernBertModel, ModernBertForMaskedLM
hf.py        to and from transformers' ModernBertForMaskedLM
tasks.py     ModernBertFor{SequenceClassification,TokenClassification,QuestionAnswering,MultipleChoice}
"""

from bertdist.model.spec import FamilySpec

_FAMILY = dict(
    arch="modernbert",
    objective="mlm",  # no sentence head (ModernBERT's recipe)
    layer_norm_eps=1e-5,
    hidden_dropout_prob=0.0,
    attention_dropout_prob=0.0,
    vocab_size=50368,
    max_position_embeddings=8192,
)
"""ModernBERT's settings shared by every size (transformers' ModernBertConfig defaults)."""
PRESETS = {
    # ModernBERT (arXiv 2412.13663; ModernBertConfig): base 22 x 768, GLU 1,152; large 28 x 1,024, GLU 2,624. The
    # small sizes keep the last layer global (layers 0, 3, 6, ... are) and a window shorter than their sequences.
    "modernbert-tiny": dict(
        _FAMILY,
        num_layers=4,
        hidden_size=128,
        num_attention_heads=2,
        intermediate_size=192,
        local_attention=16,
        vocab_size=30522,
        max_position_embeddings=512,
    ),
    "modernbert-mini": dict(
        _FAMILY,
        num_layers=7,
        hidden_size=256,
        num_attention_heads=4,
        intermediate_size=384,
        local_attention=64,
        vocab_size=30522,
        max_position_embeddings=1024,
    ),
    "modernbert-base": dict(_FAMILY, num_layers=22, hidden_size=768, num_attention_heads=12, intermediate_size=1152),
    "modernbert-large": dict(_FAMILY, num_layers=28, hidden_size=1024, num_attention_heads=16, intermediate_size=2624),
}
"""`model.size` -> its settings (bertdist.config.presets gathers every family's)."""

SPEC = FamilySpec(
    arch="modernbert",
    model_type="modernbert",
    pretraining_class="ModernBertForMaskedLM",
    own_fields=(
        "global_attn_every_n_layers",
        "local_attention",
        "global_rope_theta",
        "local_rope_theta",
        "bias",
        "classifier_pooling",
    ),
    onnx_pretraining=("ModernBertForMaskedLM",),
    objectives=("mlm",),
    rules=True,
    layer_class="bertdist.model.modernbert.model.ModernBertEncoderLayer",
    presets=PRESETS,
    demo_config="modernbert-tiny.yaml",
)
