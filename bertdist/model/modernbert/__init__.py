"""ModernBERT (Warner et al., 2024, arXiv 2412.13663): RoPE, GeGLU, pre-norm, global and sliding-window
layers, unpadded throughout.

model.py     ModernBertModel, ModernBertForMaskedLM
hf.py        to and from transformers' ModernBertForMaskedLM
tasks.py     ModernBertFor{SequenceClassification,TokenClassification,QuestionAnswering,MultipleChoice}
"""

from bertdist.model.spec import FamilySpec

SPEC = FamilySpec(
    arch="modernbert",
    model_type="modernbert",
    pretraining_class="ModernBertForMaskedLM",
    own_fields=("global_attn_every_n_layers", "local_attention", "global_rope_theta", "local_rope_theta", "bias"),
    onnx_pretraining=("ModernBertForMaskedLM",),
    demo_config="modernbert-tiny.yaml",
)
