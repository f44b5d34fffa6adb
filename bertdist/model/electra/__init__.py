"""ELECTRA (Clark et al., 2020, arXiv 2003.10555): a generator trained by masked LM and a discriminator trained
by replaced-token detection, sharing their embeddings.

model.py     ElectraModel, ElectraForPreTraining (generator and discriminator, on BERT's layers)
hf.py        to and from transformers' ElectraForPreTraining and ElectraForMaskedLM (two directories)
tasks.py     ElectraFor{SequenceClassification,TokenClassification,QuestionAnswering,MultipleChoice}
"""

from bertdist.model.spec import FamilySpec

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
    demo_config=None,
)
