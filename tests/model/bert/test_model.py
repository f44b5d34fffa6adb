"""bertdist.model.bert.model against `transformers.BertForPreTraining` on the same weights, and its own properties."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bertdist.model.bert.hf import config_to_hf
from bertdist.model.bert.model import BertForPreTraining
from bertdist.model.ops import IGNORE_INDEX
from tests.conftest import tiny_model_config

transformers = pytest.importorskip("transformers")

# Several shapes: the suite's tiny model, odd head counts / FFN widths, and a deeper one.
SIZES = {
    "tiny": tiny_model_config(),
    "three_heads": tiny_model_config(hidden_size=96, num_attention_heads=3, intermediate_size=200),
    "deeper": tiny_model_config(num_layers=4, hidden_size=32, num_attention_heads=4),
}
TOLERANCE = dict(atol=1e-5, rtol=1e-5)


def make_batch(cfg, batch_size: int = 4, seq_length: int = 24, predictions: int = 5, seed: int = 0) -> dict:
    """A padded batch in the loader's layout: two segments, ragged lengths, -100-padded MLM slots."""
    g = torch.Generator().manual_seed(seed)
    lengths = [seq_length] + [int(x) for x in torch.randint(8, seq_length, (batch_size - 1,), generator=g)]
    input_ids = torch.zeros(batch_size, seq_length, dtype=torch.long)
    token_type_ids = torch.zeros_like(input_ids)
    attention_mask = torch.zeros_like(input_ids)
    positions = torch.zeros(batch_size, predictions, dtype=torch.long)
    labels = torch.full((batch_size, predictions), IGNORE_INDEX)
    for i, n in enumerate(lengths):
        input_ids[i, :n] = torch.randint(5, cfg.vocab_size, (n,), generator=g)
        token_type_ids[i, n // 2 : n] = 1
        attention_mask[i, :n] = 1
        count = predictions if i % 2 == 0 else predictions - 2  # some rows have padded MLM slots
        chosen = (torch.randperm(n - 1, generator=g)[:count] + 1).sort().values
        positions[i, :count] = chosen
        labels[i, :count] = torch.randint(5, cfg.vocab_size, (count,), generator=g)
    return dict(
        input_ids=input_ids,
        token_type_ids=token_type_ids,
        attention_mask=attention_mask,
        masked_lm_positions=positions,
        masked_lm_ids=labels,
        next_sentence_label=torch.randint(0, 2, (batch_size,), generator=g),
    )


def hf_labels(batch: dict) -> torch.Tensor:
    """The same MLM targets in Hugging Face's (batch, seq) layout, -100 everywhere else."""
    labels = torch.full_like(batch["input_ids"], IGNORE_INDEX)
    for i, (positions, ids) in enumerate(zip(batch["masked_lm_positions"], batch["masked_lm_ids"])):
        keep = ids != IGNORE_INDEX
        labels[i, positions[keep]] = ids[keep]
    return labels


def hf_model_like(model: BertForPreTraining):
    """A `transformers.BertForPreTraining` (eager attention, the reference math) holding `model`'s weights."""
    config = transformers.BertConfig(**config_to_hf(model.config), attn_implementation="eager")
    reference = transformers.BertForPreTraining(config)
    result = reference.load_state_dict(model.state_dict(), strict=False)
    # The decoder matrix and its bias are tied to the embedding and to cls.predictions.bias in transformers.
    assert sorted(result.missing_keys) == ["cls.predictions.decoder.bias", "cls.predictions.decoder.weight"]
    assert result.unexpected_keys == []
    return reference.eval()


def assert_matches_reference(model: BertForPreTraining, reference, batch: dict) -> None:
    """Sequence and pooled outputs, MLM logits at the masked positions, NSP logits and all losses."""
    inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    with torch.no_grad():
        sequence_output, pooled_output = model.bert(**inputs)
        ours = model(**batch)
        ref_bert = reference.bert(**inputs)
        ref = reference(**inputs, labels=hf_labels(batch), next_sentence_label=batch["next_sentence_label"])
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(sequence_output[real], ref_bert.last_hidden_state[real], **TOLERANCE)
    torch.testing.assert_close(pooled_output, ref_bert.pooler_output, **TOLERANCE)
    rows = torch.arange(len(batch["input_ids"]))[:, None]
    ref_mlm = ref.prediction_logits[rows, batch["masked_lm_positions"]]
    torch.testing.assert_close(ours.mlm_logits, ref_mlm, **TOLERANCE)
    torch.testing.assert_close(ours.nsp_logits, ref.seq_relationship_logits, **TOLERANCE)
    torch.testing.assert_close(ours.loss, ref.loss, **TOLERANCE)
    ref_nsp_loss = torch.nn.functional.cross_entropy(ref.seq_relationship_logits, batch["next_sentence_label"])
    torch.testing.assert_close(ours.nsp_loss, ref_nsp_loss, **TOLERANCE)
    torch.testing.assert_close(ours.mlm_loss, ref.loss - ref_nsp_loss, **TOLERANCE)


@pytest.mark.parametrize("size", SIZES)
def test_matches_transformers_on_padded_pairs(size):
    torch.manual_seed(0)
    model = BertForPreTraining(SIZES[size]).eval()
    assert_matches_reference(model, hf_model_like(model), make_batch(model.config, seed=len(size)))


def test_unpadded_batch_and_full_sequence_head_match_transformers():
    """No padding takes the mask-free attention path; without positions the head covers every token."""
    torch.manual_seed(1)
    model = BertForPreTraining(tiny_model_config()).eval()
    reference = hf_model_like(model)
    batch = make_batch(model.config, batch_size=3, seq_length=16)
    batch["attention_mask"][:] = 1
    assert_matches_reference(model, reference, batch)

    labels = hf_labels(batch)
    with torch.no_grad():
        ours = model(batch["input_ids"], batch["token_type_ids"], masked_lm_ids=labels)
        ref = reference(
            input_ids=batch["input_ids"],
            token_type_ids=batch["token_type_ids"],
            labels=labels,
            next_sentence_label=batch["next_sentence_label"],
        )
    assert ours.mlm_logits.shape == (3, 16, model.config.vocab_size)
    torch.testing.assert_close(ours.mlm_logits, ref.prediction_logits, **TOLERANCE)
    assert ours.nsp_loss is None and ours.loss is None


def test_padding_content_does_not_change_real_outputs():
    torch.manual_seed(2)
    model = BertForPreTraining(tiny_model_config()).eval()
    batch = make_batch(model.config)
    changed = dict(batch, input_ids=torch.where(batch["attention_mask"].bool(), batch["input_ids"], 7))
    with torch.no_grad():
        a, b = model(**batch), model(**changed)
    torch.testing.assert_close(a.mlm_logits, b.mlm_logits)
    torch.testing.assert_close(a.nsp_logits, b.nsp_logits)


def test_ignored_slots_do_not_count():
    torch.manual_seed(3)
    model = BertForPreTraining(tiny_model_config()).eval()
    batch = make_batch(model.config)
    keep = batch["masked_lm_ids"] != IGNORE_INDEX
    with torch.no_grad():
        out = model(**batch)
    expected = torch.nn.functional.cross_entropy(out.mlm_logits[keep], batch["masked_lm_ids"][keep])
    torch.testing.assert_close(out.mlm_loss, expected)
    torch.testing.assert_close(out.loss, out.mlm_loss + out.nsp_loss)


def test_activation_checkpointing_gives_the_same_gradients():
    """In training mode, dropout included: recomputation replays the same random masks."""
    batch = make_batch(tiny_model_config())
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(4)
        model = BertForPreTraining(tiny_model_config(activation_checkpointing=checkpointing)).train()
        torch.manual_seed(5)
        model(**batch).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=1e-5, msg=name)


def test_bert_initialisation():
    cfg = tiny_model_config(hidden_size=128, num_attention_heads=2)
    torch.manual_seed(7)
    model = BertForPreTraining(cfg)
    std = cfg.initializer_range
    for name, param in model.named_parameters():
        if param.ndim == 2:
            assert abs(param.std().item() - std) < 0.15 * std, name
            assert abs(param.mean().item()) < 0.1 * std, name
        elif "LayerNorm.weight" in name:
            assert torch.all(param == 1), name
        else:
            assert torch.all(param == 0), name


def test_decoder_is_tied_to_the_word_embedding():
    model = BertForPreTraining(tiny_model_config())
    names = dict(model.named_parameters())
    assert "cls.predictions.bias" in names and not any("decoder" in n for n in names)
    batch = make_batch(model.config)
    model(**batch).loss.backward()
    embedding_grad = model.bert.embeddings.word_embeddings.weight.grad
    # Rows never used as input still get gradient through the decoder: the matrix is shared.
    unused = torch.ones(model.config.vocab_size, dtype=torch.bool)
    unused[batch["input_ids"].unique()] = False
    assert embedding_grad[unused].abs().sum() > 0


def test_rejects_heads_that_do_not_divide_hidden_size():
    with pytest.raises(ValueError, match="num_attention_heads"):
        BertForPreTraining(dataclasses.replace(tiny_model_config(), num_attention_heads=3))
