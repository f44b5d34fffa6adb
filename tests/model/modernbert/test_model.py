"""ModernBERT (bertdist.model.modernbert.model) against transformers' ModernBertForMaskedLM on the same random weights,
in fp32: hidden states and MLM logits at lengths 128 and 2,048 with padding, on every layout bertdist has; the export
loads in transformers with no missing or unexpected key, and HF -> bertdist -> HF gives the same tensors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bertdist.model.modernbert import hf as modernbert_hf
from bertdist.model.modernbert.model import ModernBertForMaskedLM
from tests.model.parity import nudge_norms_and_biases

transformers = pytest.importorskip("transformers")
TOLERANCE = 1e-5


def reference(
    bias: bool = False, model_class: str = "ModernBertForMaskedLM", layers: int = 4, **settings
) -> "transformers.PreTrainedModel":
    """A tiny transformers ModernBERT (`model_class`, with config `settings`) on random weights."""
    config = transformers.ModernBertConfig(
        vocab_size=120,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=2,
        local_attention=32,
        global_attn_every_n_layers=3,
        global_rope_theta=160000.0,
        local_rope_theta=10000.0,
        max_position_embeddings=4096,
        norm_bias=bias,
        attention_bias=bias,
        mlp_bias=bias,
        classifier_bias=bias,
        pad_token_id=0,
        cls_token_id=2,
        sep_token_id=3,
        bos_token_id=2,
        eos_token_id=3,
        **settings,
    )
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval()
    nudge_norms_and_biases(model)
    return model


def ours_from(hf_model, **settings) -> ModernBertForMaskedLM:
    cfg = dataclasses.replace(modernbert_hf.config_from_hf(hf_model.config.to_dict()), **settings)
    model = ModernBertForMaskedLM(cfg).eval()
    model.load_state_dict(modernbert_hf.from_hf_state_dict(hf_model.state_dict()), strict=True)
    return model


def batch(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(length)
    ids = torch.randint(4, 120, (2, length), generator=g)
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, length * 5 // 8 :] = 0  # the second row is padded
    ids[mask == 0] = 0
    return ids, mask


@pytest.mark.parametrize("length", [128, 2048])
@pytest.mark.parametrize("bias", [False, True])
def test_hidden_states_and_logits_match_transformers_on_every_layout(length, bias):
    hf = reference(bias)
    ids, mask = batch(length)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        real = mask.bool()
        for unpad in (True, False):
            model = ours_from(hf, unpad=unpad)
            hidden = model.model.hidden_states(ids, mask)
            assert len(hidden) == len(want.hidden_states)
            for got, expected in zip(hidden, want.hidden_states):
                torch.testing.assert_close(got[real], expected[real], atol=TOLERANCE, rtol=0)
            logits = model(ids, attention_mask=mask).mlm_logits
            torch.testing.assert_close(logits[real], want.logits[real], atol=TOLERANCE, rtol=0)
        # Packed: the second row's sample moved behind the first in one row: each sample computes as alone.
        first, second = int(mask[0].sum()), int(mask[1].sum())
        packed_ids = torch.zeros(1, first + second, dtype=torch.long)
        packed_ids[0, :first], packed_ids[0, first:] = ids[0, :first], ids[1, :second]
        packed_mask = torch.cat([torch.ones(first), torch.full((second,), 2)]).long()[None]
        for unpad in (True, False):
            logits = ours_from(hf, unpad=unpad)(packed_ids, attention_mask=packed_mask).mlm_logits[0]
            torch.testing.assert_close(logits[:first], want.logits[0, :first], atol=TOLERANCE, rtol=0)
            torch.testing.assert_close(logits[first:], want.logits[1, :second], atol=TOLERANCE, rtol=0)


def test_masked_positions_give_the_logits_there_and_the_references_loss():
    hf = reference()
    ids, mask = batch(128)
    positions = torch.tensor([[1, 5, 40, 0], [3, 7, 60, 0]])
    labels = torch.tensor([[9, 10, 11, -100], [12, 13, 14, -100]])
    hf_labels = torch.full_like(ids, -100)
    for row in range(2):
        hf_labels[row, positions[row, :3]] = labels[row, :3]
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, labels=hf_labels)
        got = ours_from(hf)(ids, attention_mask=mask, masked_lm_positions=positions, masked_lm_ids=labels)
    torch.testing.assert_close(
        got.mlm_logits[:, :3], want.logits[torch.arange(2)[:, None], positions[:, :3]], atol=TOLERANCE, rtol=0
    )
    torch.testing.assert_close(got.loss, want.loss, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("layers", [4, 3], ids=["global-last-layer", "local-last-layer"])
def test_the_last_layer_at_the_predictions_alone_gives_the_full_models_logits_on_every_layout(layers):
    """The last layer runs at the predictions only (its keys and values everywhere, a local layer's window
    centred on each prediction): the same logits as the full model's there, padded, unpadded and packed."""
    hf = reference(layers=layers)
    ids, mask = batch(128)
    positions = torch.tensor([[1, 5, 40, 0], [3, 7, 60, 79]])
    first, second = int(mask[0].sum()), int(mask[1].sum())
    packed_ids = torch.cat([ids[0, :first], ids[1, :second]])[None]
    packed_mask = torch.cat([torch.ones(first), torch.full((second,), 2)]).long()[None]
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).logits[torch.arange(2)[:, None], positions]
        for unpad in (True, False):
            model = ours_from(hf, unpad=unpad)
            got = model(ids, attention_mask=mask, masked_lm_positions=positions).mlm_logits
            torch.testing.assert_close(got, want, atol=TOLERANCE, rtol=0)
            got = model(packed_ids, attention_mask=packed_mask, masked_lm_positions=positions).mlm_logits
            torch.testing.assert_close(got, want, atol=TOLERANCE, rtol=0)


def test_a_packed_sample_never_sees_another():
    """Changing one sample of a packed row leaves every other sample's outputs bit-identical (windows included)."""
    model = ours_from(reference())
    lengths = [40, 70, 30]
    mask = torch.cat([torch.full((n,), i + 1) for i, n in enumerate(lengths)]).long()[None]
    ids = torch.randint(4, 120, mask.shape, generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[0, 40:110] = torch.randint(4, 120, (70,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for unpad in (True, False):
            model.config = dataclasses.replace(model.config, unpad=unpad)
            a, b = model(ids, attention_mask=mask).mlm_logits, model(changed, attention_mask=mask).mlm_logits
            assert torch.equal(a[0, :40], b[0, :40]) and torch.equal(a[0, 110:], b[0, 110:])
            assert not torch.equal(a[0, 40:110], b[0, 40:110])


@pytest.mark.parametrize("length, half", [(300, 16), (1000, 64), (1301, 100)])
def test_local_attention_by_blocks_equals_the_masked_full_grid_with_gradients(length, half):
    """ops.local_attention (keys within `half` of each query, block by block) against the window as a mask on the
    full grid: outputs and gradients at every query with a key, with and without padding."""
    from bertdist.model.modernbert.model import window_mask
    from bertdist.model.ops import local_attention, local_attention_pays, multi_head_attention

    assert local_attention_pays(length, half)
    g = torch.Generator().manual_seed(length)
    q, kv = (
        torch.randn(3, length, 32, generator=g, dtype=torch.float64),
        torch.randn(3, length, 64, generator=g, dtype=torch.float64),
    )
    for key_mask in (None, torch.arange(length)[None] < torch.tensor([length, length // 3, 7])[:, None]):
        grad = torch.randn(3, length, 32, generator=g, dtype=torch.float64)
        real = torch.ones(3, length, 1, dtype=torch.bool) if key_mask is None else key_mask[..., None]
        results = []
        for blocked in (True, False):
            q_, kv_ = q.clone().requires_grad_(), kv.clone().requires_grad_()
            if blocked:
                out = local_attention(q_, kv_, key_mask, 4, half, 0.0, 0.25)
            else:
                key = None if key_mask is None else key_mask[:, None, None, :]
                mask = window_mask(length, length, half, key, q.device)
                out = multi_head_attention(q_, kv_, mask, 4, 0.0, 0.25)
            (out * grad * real).sum().backward()
            results.append((out * real, q_.grad * real, kv_.grad))
        for got, want in zip(*results):
            torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_export_loads_in_transformers_with_every_key_and_round_trips(tmp_path, tiny_vocab):
    hf = reference()
    model = ours_from(hf)
    modernbert_hf.write_directory(model, tmp_path / "export", tiny_vocab, {})
    loaded, info = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "export", output_loading_info=True)
    assert type(loaded).__name__ == "ModernBertForMaskedLM"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    want = hf.state_dict()
    got = loaded.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    again = modernbert_hf.load_pretrained(tmp_path / "export")
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values()))
    assert (
        transformers.AutoTokenizer.from_pretrained(tmp_path / "export")("a b").input_ids[0]
        == loaded.config.cls_token_id
    )


def test_an_export_without_a_tokenizer_names_no_token_ids_and_loads(tmp_path):
    """Without a vocab file the ids were left to transformers' defaults (pad 50283), which a smaller vocabulary
    cannot hold: from_pretrained failed on the padding index."""
    model = ours_from(reference())
    modernbert_hf.write_directory(model, tmp_path / "export", None, {})
    loaded = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "export")
    assert loaded.config.pad_token_id is None and loaded.config.vocab_size < 50283


def test_an_export_continues_pretraining_through_the_registry(tmp_path, tiny_vocab):
    """checkpoint.init_from_pretrained: the directory's model_type picks the adapter; the run's model must match."""
    from bertdist.errors import UserError
    from bertdist.model import registry

    model = ours_from(reference())
    modernbert_hf.write_directory(model, tmp_path, tiny_vocab, {})
    started = registry.load_pretrained(tmp_path, dataclasses.replace(model.config, attention_dropout_prob=0.1))
    assert started.config.attention_dropout_prob == 0.1  # the run's settings, the checkpoint's weights
    assert all(torch.equal(a, b) for a, b in zip(started.state_dict().values(), model.state_dict().values()))
    with pytest.raises(UserError, match="architecture differs from the run's: model.num_layers=2 but 4"):
        registry.load_pretrained(tmp_path, dataclasses.replace(model.config, num_layers=2))
    with pytest.raises(UserError, match="a modernbert checkpoint, and model.arch is 'bert'"):
        registry.load_pretrained(tmp_path, dataclasses.replace(model.config, arch="bert"))
    # The norms' eps changes the math (it was kept from the run, unsaid); the positions do not (rotary: a context
    # extension raises them)
    with pytest.raises(UserError, match="model.layer_norm_eps=0.01 but 1e-05 in the checkpoint"):
        registry.load_pretrained(tmp_path, dataclasses.replace(model.config, layer_norm_eps=1e-2))
    longer = registry.load_pretrained(tmp_path, dataclasses.replace(model.config, max_position_embeddings=8192))
    assert longer.config.max_position_embeddings == 8192


def test_a_decoder_other_than_the_word_embedding_is_refused(tmp_path, tiny_vocab):
    """transformers writes decoder.weight for a ModernBERT saved with tie_word_embeddings: false: it was dropped
    for the word embedding, and the MLM logits were another model's, unsaid."""
    from bertdist.errors import UserError

    hf = reference()
    hf.config.tie_word_embeddings = False
    hf.decoder.weight = torch.nn.Parameter(hf.model.embeddings.tok_embeddings.weight.detach() + 0.5)
    hf.save_pretrained(tmp_path)
    with pytest.raises(UserError, match="decoder.weight differs from model.embeddings.tok_embeddings.weight"):
        modernbert_hf.load_pretrained(tmp_path)


def test_4096_tokens_train_a_step_with_activation_checkpointing_as_without():
    """Each layer recomputed in the backward pass (model.activation_checkpointing): at 4,096 tokens, after one AdamW
    step the weights agree with those of the run that kept the activations (1e-6)."""
    from bertdist.config import ModelConfig

    cfg = ModelConfig.from_size(
        "modernbert-tiny",
        vocab_size=120,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=2,
        max_position_embeddings=4096,
        local_attention=128,
    )
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 120, (1, 4096), generator=g)
    positions = torch.randperm(4095, generator=g)[:600].sort().values[None] + 1
    labels = torch.randint(5, 120, (1, 600), generator=g)
    weights = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = ModernBertForMaskedLM(dataclasses.replace(cfg, activation_checkpointing=checkpointing)).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(
            ids, attention_mask=torch.ones_like(ids), masked_lm_positions=positions, masked_lm_ids=labels
        ).loss.backward()
        optimizer.step()
        weights.append(model.state_dict())
    for name, value in weights[0].items():
        torch.testing.assert_close(weights[1][name], value, atol=1e-6, rtol=0, msg=name)


def test_a_scaled_rotary_embedding_or_disagreeing_thetas_are_refused_not_read_as_another_model():
    """rope_parameters with rope_type linear (a context extension by scaling) was read as the unscaled model
    (logits 5e-2 off transformers'); with both generations' thetas disagreeing, bertdist took the legacy keys and
    transformers rope_parameters."""
    from bertdist.model.hf_io import CheckpointFormatError

    config = reference().config.to_dict()
    assert modernbert_hf.config_from_hf(config).global_rope_theta == 160000.0
    scaled = dict(
        config,
        rope_parameters={
            **config["rope_parameters"],
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 160000.0},
        },
    )
    with pytest.raises(CheckpointFormatError, match="rope_parameters.full_attention: rope_type 'linear'"):
        modernbert_hf.config_from_hf(scaled)
    both = dict(config, global_rope_theta=80000.0)
    with pytest.raises(CheckpointFormatError, match="global_rope_theta 80000.0 and rope_parameters.full_attention"):
        modernbert_hf.config_from_hf(both)
