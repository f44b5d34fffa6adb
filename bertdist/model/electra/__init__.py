"""ELECTRA (Clark et al., 2020, arXiv 2003.10555): a generator trained by masked LM and a discriminator trained
by replaced-token detection, sharing their embeddings.

model.py     ElectraModel, ElectraForPreTraining (generator and discriminator, on BERT's layers)
hf.py        to and from transformers' ElectraForPreTraining and ElectraForMaskedLM (two directories)
tasks.py     ElectraFor{SequenceClassification,TokenClassification,QuestionAnswering,MultipleChoice}
"""

from bertdist.model.spec import FamilySpec

_FAMILY = dict(arch="electra", objective="rtd", rtd_weight=50.0)
"""ELECTRA's settings shared by every size (arXiv 2003.10555): lambda = 50 (section 2); BERT's WordPiece
vocabulary and dropout (Appendix A)."""
PRESETS = {
    # ELECTRA (arXiv 2003.10555, Table 6): Small L12/H256/A4, FFN 1,024, embeddings 128; Base L12/H768/A12, E 768;
    # Large L24/H1024/A16, E 1,024. The generator's width, FFN and heads are a multiplier of the discriminator's:
    # 1/4 (Small, Large), 1/3 (Base). The mini size is BERT-mini's shape with Small's E and a 1/4 generator.
    "electra-mini": dict(
        _FAMILY,
        num_layers=4,
        hidden_size=256,
        num_attention_heads=4,
        embedding_size=128,
        generator_hidden_size=64,
        generator_num_attention_heads=1,
        generator_intermediate_size=256,
    ),
    "electra-small": dict(
        _FAMILY,
        num_layers=12,
        hidden_size=256,
        num_attention_heads=4,
        intermediate_size=1024,
        embedding_size=128,
        generator_hidden_size=64,
        generator_num_attention_heads=1,
        generator_intermediate_size=256,
    ),
    "electra-base": dict(
        _FAMILY,
        num_layers=12,
        hidden_size=768,
        num_attention_heads=12,
        embedding_size=768,
        generator_hidden_size=256,
        generator_num_attention_heads=4,
        generator_intermediate_size=1024,
    ),
    "electra-large": dict(
        _FAMILY,
        num_layers=24,
        hidden_size=1024,
        num_attention_heads=16,
        embedding_size=1024,
        generator_hidden_size=256,
        generator_num_attention_heads=4,
        generator_intermediate_size=1024,
    ),
}
"""`model.size` -> its settings (bertdist.config.presets gathers every family's)."""

SPEC = FamilySpec(
    arch="electra",
    model_type="electra",
    pretraining_class="ElectraForPreTraining",
    own_fields=(
        "type_vocab_size",
        "embedding_size",
        "generator_hidden_size",
        "generator_num_attention_heads",
        "generator_intermediate_size",
        "generator_num_layers",
        "rtd_weight",
    ),
    objectives=("rtd",),
    rules=True,
    presets=PRESETS,
    demo_config=None,
)
