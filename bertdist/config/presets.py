"""The named model sizes (`model.size`), each with the architecture (`model.arch`) it belongs to.

Kept beside the schema (`bertdist.config.model`; the package exports them) as data: a new size is a line here, a
new architecture a name in the schema's `model.arch` plus its presets.
"""

from __future__ import annotations

from typing import Any

# L / H / A of BERT's published family (Turc et al. 2019 for the small ones; Devlin et al. 2018).
_MODERNBERT = dict(
    arch="modernbert",
    objective="mlm",  # no sentence head (ModernBERT's recipe)
    layer_norm_eps=1e-5,
    hidden_dropout_prob=0.0,
    attention_dropout_prob=0.0,
    vocab_size=50368,
    max_position_embeddings=8192,
)
"""ModernBERT's settings shared by every size (transformers' ModernBertConfig defaults)."""
_ALBERT = dict(
    arch="albert",
    embedding_size=128,  # E = 128 at every size (arXiv 1909.11942, Table 1)
    share_layers="all",  # all-shared, ALBERT's default (ibid., section 3.1)
    objective="mlm+sop",  # sentence-order prediction instead of NSP (ibid., section 3.1)
    hidden_dropout_prob=0.0,  # no dropout (ibid., section 4.8; the v2 checkpoints' configs)
    attention_dropout_prob=0.0,
    vocab_size=30000,  # a 30,000-token SentencePiece vocabulary (ibid., section 4.1)
)
"""ALBERT's settings shared by every size; heads are H / 64 and the feed-forward 4H (ibid., section 3.1)."""
_ELECTRA = dict(arch="electra", objective="rtd", rtd_weight=50.0)
"""ELECTRA's settings shared by every size (arXiv 2003.10555): lambda = 50 (section 2); BERT's WordPiece
vocabulary and dropout (Appendix A)."""
_DISTILBERT = dict(arch="distilbert", objective="distill")
"""DistilBERT (arXiv 1910.01108, section 3): BERT's layer at the teacher's width, half its depth, no segment
embeddings or pooler, trained by distillation."""
_ROBERTA = dict(
    arch="roberta",
    objective="mlm",  # no sentence head (arXiv 1907.11692, section 4.2)
    vocab_size=50265,  # GPT-2's byte-level BPE with RoBERTa's four special tokens (section 4.4)
    pad_token_id=1,  # <s> <pad> </s> <unk> at 0-3: positions start at 2
    max_position_embeddings=514,  # 512 tokens past the padding index
    type_vocab_size=1,
    layer_norm_eps=1e-5,
)
"""RoBERTa's settings shared by every size (the released roberta-base config.json); XLM-R changes the vocabulary."""
MODEL_SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(num_layers=2, hidden_size=128, num_attention_heads=2),
    "mini": dict(num_layers=4, hidden_size=256, num_attention_heads=4),
    "small": dict(num_layers=4, hidden_size=512, num_attention_heads=8),
    "medium": dict(num_layers=8, hidden_size=512, num_attention_heads=8),
    "base": dict(num_layers=12, hidden_size=768, num_attention_heads=12),
    "large": dict(num_layers=24, hidden_size=1024, num_attention_heads=16),
    # ModernBERT (arXiv 2412.13663; ModernBertConfig): base 22 x 768, GLU 1,152; large 28 x 1,024, GLU 2,624. The
    # small sizes keep the last layer global (layers 0, 3, 6, ... are) and a window shorter than their sequences.
    "modernbert-tiny": dict(
        _MODERNBERT,
        num_layers=4,
        hidden_size=128,
        num_attention_heads=2,
        intermediate_size=192,
        local_attention=16,
        vocab_size=30522,
        max_position_embeddings=512,
    ),
    "modernbert-mini": dict(
        _MODERNBERT,
        num_layers=7,
        hidden_size=256,
        num_attention_heads=4,
        intermediate_size=384,
        local_attention=64,
        vocab_size=30522,
        max_position_embeddings=1024,
    ),
    "modernbert-base": dict(
        _MODERNBERT, num_layers=22, hidden_size=768, num_attention_heads=12, intermediate_size=1152
    ),
    "modernbert-large": dict(
        _MODERNBERT, num_layers=28, hidden_size=1024, num_attention_heads=16, intermediate_size=2624
    ),
    # ALBERT (arXiv 1909.11942, Table 1): base L12/H768, large L24/H1024 (12M and 18M parameters). The mini
    # size is BERT-mini's shape with ALBERT's E and sharing, for CPU runs.
    "albert-mini": dict(_ALBERT, num_layers=4, hidden_size=256, num_attention_heads=4),
    "albert-base": dict(_ALBERT, num_layers=12, hidden_size=768, num_attention_heads=12),
    "albert-large": dict(_ALBERT, num_layers=24, hidden_size=1024, num_attention_heads=16),
    # ELECTRA (arXiv 2003.10555, Table 6): Small L12/H256/A4, FFN 1,024, embeddings 128; Base L12/H768/A12, E 768;
    # Large L24/H1024/A16, E 1,024. The generator's width, FFN and heads are a multiplier of the discriminator's:
    # 1/4 (Small, Large), 1/3 (Base). The mini size is BERT-mini's shape with Small's E and a 1/4 generator.
    "electra-mini": dict(
        _ELECTRA,
        num_layers=4,
        hidden_size=256,
        num_attention_heads=4,
        embedding_size=128,
        generator_hidden_size=64,
        generator_num_attention_heads=1,
        generator_intermediate_size=256,
    ),
    "electra-small": dict(
        _ELECTRA,
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
        _ELECTRA,
        num_layers=12,
        hidden_size=768,
        num_attention_heads=12,
        embedding_size=768,
        generator_hidden_size=256,
        generator_num_attention_heads=4,
        generator_intermediate_size=1024,
    ),
    # DistilBERT: half the teacher's layers at its width (6 of BERT-Base's 12, section 3); mini: 2 of BERT-mini's 4.
    "distilbert-mini": dict(_DISTILBERT, num_layers=2, hidden_size=256, num_attention_heads=4),
    "distilbert-base": dict(_DISTILBERT, num_layers=6, hidden_size=768, num_attention_heads=12),
    # RoBERTa (arXiv 1907.11692): BERT-Base's shape; mini is BERT-mini's, for CPU runs. XLM-R Base (arXiv
    # 1911.02116): the same, over a 250,002-token SentencePiece vocabulary; its exports are XLMRobertaForMaskedLM.
    "roberta-mini": dict(_ROBERTA, num_layers=4, hidden_size=256, num_attention_heads=4),
    "roberta-base": dict(_ROBERTA, num_layers=12, hidden_size=768, num_attention_heads=12),
    "xlm-roberta-base": dict(_ROBERTA, num_layers=12, hidden_size=768, num_attention_heads=12, vocab_size=250002),
    "electra-large": dict(
        _ELECTRA,
        num_layers=24,
        hidden_size=1024,
        num_attention_heads=16,
        embedding_size=1024,
        generator_hidden_size=256,
        generator_num_attention_heads=4,
        generator_intermediate_size=1024,
    ),
}
