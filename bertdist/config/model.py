"""The model section of the schema: the encoder's architecture and objective, and the names of the architectures.

Its own module because every stage reads it (the model, the data's masking, the HF adapters, the FLOP count)
while the rest of the schema concerns a training run; `bertdist.config.schema` holds it in `Config.model`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from bertdist.config.choices import choices
from bertdist.config.errors import ConfigError
from bertdist.config.presets import MODEL_SIZES


@dataclass
class ModelConfig:
    """The encoder's architecture. `size` picks a named preset; any other key given alongside it wins."""

    PRESET_FIELD: ClassVar[str] = "size"

    size: str = "base"
    """Named size: tiny, mini, small, medium, base or large (BERT: layers, hidden size, heads); modernbert-tiny,
    -mini, -base, -large (ModernBERT: also its window, norms, dropout and vocabulary); albert-mini, -base, -large
    (ALBERT: also its embedding width, sharing, dropout and vocabulary); electra-mini, -small, -base, -large (ELECTRA:
    also its embedding width and generator); distilbert-mini, -base (DistilBERT students: half the layers of
    BERT-mini and BERT-Base); roberta-mini, -base and xlm-roberta-base (RoBERTa and XLM-R: also their vocabulary,
    positions past the padding index, one segment, LayerNorm eps)."""
    arch: Literal["bert", "modernbert", "albert", "electra", "distilbert", "roberta"] = "bert"
    """bert (the 2018 architecture, the default), modernbert (RoPE, GeGLU, pre-norm, alternating global and
    local attention: bertdist.model.modernbert.model), albert (factorized embeddings, layers sharing parameters, a
    sentence-order head: bertdist.model.albert.model), electra (a small MLM generator and the discriminator that
    detects its replacements: bertdist.model.electra.model) or distilbert (BERT's layers without segment embeddings or
    pooler, the student of a distillation: bertdist.model.distilbert.model) or roberta (BERT's layers, positions
    counted from past the padding index, masked LM only: bertdist.model.roberta.model; XLM-R too). One registry:
    bertdist.model.registry."""
    num_layers: int = 12
    hidden_size: int = 768
    num_attention_heads: int = 12
    intermediate_size: int = 0
    """Feed-forward width; 0 means 4 x hidden_size as in BERT."""
    vocab_size: int = 30522
    """Rows of the word embedding; must be at least the number of tokens of the tokenizer data.vocab_file."""
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    attention_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    objective: Literal["mlm+nsp", "mlm", "mlm+sop", "rtd", "span", "distill"] = "mlm+nsp"
    """What pretraining trains (bertdist.config.objectives): mlm+nsp, masked LM and next-sentence prediction on
    `prepare --samples nsp` pairs (the paper); mlm, masked LM only (RoBERTa: no pooler, no sentence head; any
    shards, `--samples mlm` text is made for it; exported as *ForMaskedLM); mlm+sop, masked LM and ALBERT's
    sentence-order prediction on `--samples sop` pairs; rtd, ELECTRA's replaced-token detection (arch: electra, any
    shards); span, SpanBERT's masked LM + span-boundary objective (arch: bert, span masking at load time); distill,
    DistilBERT's distillation from a teacher (arch: distilbert, the `distill` section)."""
    activation_checkpointing: bool = False
    """Recompute each encoder layer in the backward pass: less memory, about a third more compute."""
    unpad: bool = True
    """Run the encoder on the real tokens only, not on padding (`bertdist.model.layout`); the same outputs, and
    faster wherever a batch has padding (measured in benchmarks/packing.py)."""
    compile: bool = False
    """Compile the encoder's layers with `torch.compile` (inductor, dynamic shapes), one region per layer class, the
    layout's attention and the rest of the model eager (bertdist.model.compiled): the first steps compile a
    handful of graphs, a graph the compiler fails on runs eager with one warning. Off by default: slower on CPU, and
    not yet measured faster on a GPU (`make gpu-check` times it). Not with ZeRO-3 yet."""
    attention: Literal["auto", "sdpa", "varlen", "flex"] = "auto"
    """The attention kernel (bertdist.model.attention): sdpa (grids of samples of similar length; every device,
    attention dropout), varlen (flash attention's variable-length kernel: CUDA, fp16/bf16, no attention dropout;
    windows from torch 2.10), flex (FlexAttention with a block mask per batch: windows and packed rows; no
    attention dropout; CPU for inference only), auto (varlen where it applies, else sdpa). A named kernel the device
    cannot run is refused at start, never replaced."""
    mlm_logits_mib: int = 512
    """The most memory a micro batch's MLM logits may take (fp32, with the exponentials the loss keeps): above it,
    the vocabulary projection and the loss run in chunks of predictions inside the forward and the whole logits never
    exist (bertdist.model.chunked_loss), so a 250k vocabulary or 8k-token samples fit: the masked-LM heads of BERT,
    ModernBERT, ALBERT and RoBERTa (ELECTRA's generator samples from its logits and distillation compares them
    whole, so both keep them). 0: always the whole logits.
    Below it nothing changes; the math is the same either way (to rounding)."""
    # ModernBERT only (arch: modernbert); the others refuse them set away from these defaults (the spec's own_fields).
    global_attn_every_n_layers: int = 3
    """Layer i attends to the whole sample when i % this == 0; the others within `local_attention`."""
    local_attention: int = 128
    """The local layers' sliding window, in tokens: a token sees keys at most half of this away (< 2 x the longest
    max_seq_length)."""
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    bias: bool = False
    """Biases in the linear layers and LayerNorms (ModernBERT has none; the decoder keeps its own either way)."""
    classifier_pooling: Literal["cls", "mean"] | None = None
    """How a sequence classifier or multiple-choice model fine-tuned from this model pools a row: its first token
    or the mean of its tokens; unset (None), a released model's when the run continues one (its config.json:
    ModernBERT-base's says mean), else cls (transformers' default). Written into the exports, so that a model
    continued from a release and exported fine-tunes as the release did; a value set here is kept (an explicit cls
    over ModernBERT-base's mean was replaced by it)."""
    # ALBERT and ELECTRA only; the others refuse it set away from its default.
    embedding_size: int = 0
    """Width E of the token, position and segment embeddings, projected to hidden_size by one E x H matrix
    (ALBERT's factorization: V x E + E x H parameters instead of V x H; the paper's E is 128; at most hidden_size.
    ELECTRA: the width its generator and discriminator share, 128 for ELECTRA-Small). 0: hidden_size (no
    factorization), so that the default suits every hidden size."""
    # ALBERT only (arch: albert); the others refuse it set away from its default.
    share_layers: Literal["all", "attention", "ffn", "none"] = "all"
    """What the layers share: all (ALBERT: one layer applied num_layers times), attention or ffn (that sublayer
    only, each layer keeping its own other one), none (num_layers distinct layers). transformers' ALBERT holds all
    and none only: the other two train, and `bertdist export` refuses them."""

    # ELECTRA only (arch: electra); the others refuse them set away from these defaults.
    generator_hidden_size: int = 0
    """The generator's width (0: hidden_size / 4); at most hidden_size. The paper finds 1/4 to 1/2 of the
    discriminator's best (arXiv 2003.10555, section 3.2)."""
    generator_num_attention_heads: int = 0
    """0: num_attention_heads / 4 (at least 1)."""
    generator_intermediate_size: int = 0
    """0: 4 x the generator's width."""
    generator_num_layers: int = 0
    """0: num_layers, as the paper's generators."""
    rtd_weight: float = 50.0
    """lambda: loss = generator MLM + lambda x replaced-token detection (the paper's 50)."""

    # RoBERTa only (arch: roberta); the others refuse it set away from its default.
    pad_token_id: int = 0
    """The padding token's id, which RoBERTa's positions are counted past: a sample's tokens sit at positions
    pad_token_id + 1, + 2, ... (transformers' and fairseq's rule), so a sample holds at most max_position_embeddings
    - pad_token_id - 1 tokens (512 of RoBERTa's 514). RoBERTa's and XLM-R's tokenizers have <pad> at 1, their
    presets' value; it must be the pad id of the tokenizer the model is exported with. The default is BERT's [PAD]
    id, which the other families write in config.json from their tokenizer and never read from here."""

    @classmethod
    def from_size(cls, size: str, **overrides: Any) -> "ModelConfig":
        return cls(size=size, **{**cls.preset(size), **overrides})

    @staticmethod
    def preset(size: Any) -> dict[str, int]:
        """The fields that `size` sets; the loader applies them before the keys given beside `size`."""
        if not isinstance(size, str) or size not in MODEL_SIZES:
            raise ConfigError([f"model.size: unknown size {size!r}; choose one of {', '.join(MODEL_SIZES)}"])
        return MODEL_SIZES[size]

    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size

    def embedding_width(self) -> int:
        """E: ALBERT's and ELECTRA's embedding width (model.embedding_size, 0 meaning hidden_size)."""
        return self.embedding_size or self.hidden_size

    def generator_config(self) -> "ModelConfig":
        """ELECTRA's generator encoder: `generator_*` (0: a quarter of the discriminator's width and heads, 4x its
        width of feed-forward, the discriminator's depth), the embeddings' width E shared."""
        hidden = self.generator_hidden_size or self.hidden_size // 4
        return dataclasses.replace(
            self,
            hidden_size=hidden,
            embedding_size=self.embedding_width(),
            num_attention_heads=self.generator_num_attention_heads or max(1, self.num_attention_heads // 4),
            intermediate_size=self.generator_intermediate_size or 4 * hidden,
            num_layers=self.generator_num_layers or self.num_layers,
        )


ARCHITECTURES: tuple[str, ...] = choices(ModelConfig, "arch")
"""model.arch: the names bertdist.model.registry maps to model classes."""
