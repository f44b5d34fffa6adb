"""ALBERT (bertdist.model.albert.model) against transformers' AlbertForPreTraining / AlbertForMaskedLM on the same
random weights, in fp32: MLM and SOP logits and the loss, every layer shared and none, embeddings narrower than the
hidden size, on every layout bertdist has; the export loads in transformers with no missing, unexpected or mismatched
key and comes back the same; what sharing saves in parameters and costs in FLOPs."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from bertdist.config import ModelConfig
from bertdist.model import flops, registry
from bertdist.model.albert import hf as albert_hf
from bertdist.model.albert.model import AlbertForPreTraining, AlbertLayer, AlbertMLMHead, AlbertSOPHead
from bertdist.model.hf_io import CheckpointFormatError
from tests.model.parity import nudge_norms_and_biases

transformers = pytest.importorskip("transformers")
TOLERANCE = 1e-5
VOCAB = 120


def reference(groups: int = 1, model_class: str = "AlbertForPreTraining", vocab_size: int = VOCAB, **settings):
    """A small transformers ALBERT (E 16 < H 64, 3 layers in `groups` groups) on random weights."""
    config = transformers.AlbertConfig(
        vocab_size=vocab_size,
        embedding_size=16,
        hidden_size=64,
        num_hidden_layers=3,
        num_hidden_groups=groups,
        num_attention_heads=4,
        intermediate_size=96,
        max_position_embeddings=64,
        **settings,
    )
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval()
    nudge_norms_and_biases(model)
    return model


def ours_from(hf_model, **settings) -> AlbertForPreTraining:
    cfg = dataclasses.replace(albert_hf.config_from_hf(hf_model.config.to_dict()), **settings)
    model = AlbertForPreTraining(cfg).eval()
    model.load_state_dict(albert_hf.from_hf_state_dict(hf_model.state_dict()), strict=True)
    return model


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two sentence pairs of 40 slots, the second padded after 25 tokens."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(4, VOCAB, (2, 40), generator=g)
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, 25:] = 0
    types = torch.zeros_like(ids)
    types[0, 18:], types[1, 11:25] = 1, 1
    ids[mask == 0] = 0
    return ids, types, mask


POSITIONS = torch.tensor([[1, 5, 17, 30, 0], [3, 7, 12, 20, 0]])
LABELS = torch.tensor([[9, 10, 11, 12, -100], [13, 14, 15, 16, -100]])
SOP_LABELS = torch.tensor([0, 1])


@pytest.mark.parametrize("share_layers, groups", [("all", 1), ("none", 3)])
@pytest.mark.parametrize("unpad", [True, False])
def test_mlm_and_sop_logits_and_the_loss_match_transformers(share_layers, groups, unpad):
    hf = reference(groups)
    ids, types, mask = batch()
    hf_labels = torch.full_like(ids, -100)
    for row in range(2):
        hf_labels[row, POSITIONS[row, :4]] = LABELS[row, :4]
    model = ours_from(hf, unpad=unpad)
    assert model.config.share_layers == share_layers and model.config.embedding_width() == 16
    with torch.no_grad():
        want = hf(
            input_ids=ids, token_type_ids=types, attention_mask=mask, labels=hf_labels, sentence_order_label=SOP_LABELS
        )
        everywhere = model(ids, types, mask)
        at_predictions = model(ids, types, mask, POSITIONS, LABELS, SOP_LABELS)
    real = mask.bool()
    torch.testing.assert_close(everywhere.mlm_logits[real], want.prediction_logits[real], atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(everywhere.nsp_logits, want.sop_logits, atol=TOLERANCE, rtol=0)
    rows = torch.arange(2)[:, None]
    torch.testing.assert_close(
        at_predictions.mlm_logits[:, :4], want.prediction_logits[rows, POSITIONS[:, :4]], atol=TOLERANCE, rtol=0
    )
    torch.testing.assert_close(at_predictions.nsp_logits, want.sop_logits, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(at_predictions.loss, want.loss, atol=TOLERANCE, rtol=0)
    assert set(at_predictions.components) == set(at_predictions.scored) == {"mlm", "sop"}


def test_without_the_sop_head_it_is_albert_for_masked_lm():
    hf = reference(model_class="AlbertForMaskedLM")
    model = ours_from(hf, objective="mlm")  # a config made in memory names no architecture
    assert model.config.objective == "mlm" and model.sop_classifier is None
    ids, types, mask = batch()
    hf_labels = torch.full_like(ids, -100)
    for row in range(2):
        hf_labels[row, POSITIONS[row, :4]] = LABELS[row, :4]
    with torch.no_grad():
        want = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=hf_labels)
        got = model(ids, types, mask, POSITIONS, LABELS)
    rows = torch.arange(2)[:, None]
    torch.testing.assert_close(got.mlm_logits[:, :4], want.logits[rows, POSITIONS[:, :4]], atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(got.loss, want.loss, atol=TOLERANCE, rtol=0)
    assert got.nsp_logits is None and set(got.components) == {"mlm"}


def test_hidden_states_are_transformers_and_a_packed_sample_computes_as_alone():
    hf = reference(groups=3)
    ids, types, mask = batch()
    with torch.no_grad():
        want = hf.albert(input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True)
        model = ours_from(hf)
        hidden = model.albert.hidden_states(ids, types, mask)
        assert len(hidden) == len(want.hidden_states) == 4
        for got, expected in zip(hidden, want.hidden_states):
            torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], atol=TOLERANCE, rtol=0)
        # Packed: the second row's pair moved behind the first in one row; positions restart, attention stays inside.
        alone = model(ids, types, mask)
        first, second = 40, 25
        packed = (
            torch.cat([ids[0], ids[1, :second]])[None],
            torch.cat([types[0], types[1, :second]])[None],
            torch.cat([torch.ones(first), torch.full((second,), 2)]).long()[None],
        )
        for unpad in (True, False):
            model.albert.unpad = unpad
            out = model(*packed)
            torch.testing.assert_close(out.mlm_logits[0, :first], alone.mlm_logits[0], atol=TOLERANCE, rtol=0)
            torch.testing.assert_close(out.mlm_logits[0, first:], alone.mlm_logits[1, :second], atol=TOLERANCE, rtol=0)
            torch.testing.assert_close(out.nsp_logits, alone.nsp_logits, atol=TOLERANCE, rtol=0)


def vocab_file(tmp_path) -> str:
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(VOCAB - 5))]))
    return str(path)


@pytest.mark.parametrize(
    "objective, hf_class", [("mlm+sop", "AlbertForPreTraining"), ("mlm", "AlbertForMaskedLM")], ids=["sop", "mlm-only"]
)
@pytest.mark.parametrize("share_layers", ["all", "none"])
def test_the_export_loads_in_transformers_with_every_key_and_comes_back_the_same(
    objective, hf_class, share_layers, tmp_path, hf_offline
):
    cfg = ModelConfig.from_size(
        "albert-mini",
        vocab_size=VOCAB,
        num_layers=3,
        hidden_size=64,
        embedding_size=16,
        max_position_embeddings=64,
        share_layers=share_layers,
        objective=objective,
    )
    torch.manual_seed(1)
    model = AlbertForPreTraining(cfg).eval()
    albert_hf.write_directory(model, tmp_path / "export", vocab_file(tmp_path), {})
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["architectures"] == [hf_class] and config["num_hidden_groups"] == (1 if share_layers == "all" else 3)
    hf, info = getattr(transformers, hf_class).from_pretrained(tmp_path / "export", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "export")
    encoded = tokenizer("w1 w2 w3", "w4 w5", return_tensors="pt")
    with torch.no_grad():
        want = hf.eval()(**encoded)
        got = model(encoded["input_ids"], encoded["token_type_ids"], encoded["attention_mask"])
        back = registry.load_pretrained(tmp_path / "export", cfg).eval()
        again = back(encoded["input_ids"], encoded["token_type_ids"], encoded["attention_mask"])
    logits = want.prediction_logits if objective == "mlm+sop" else want.logits
    torch.testing.assert_close(got.mlm_logits, logits, atol=TOLERANCE, rtol=0)
    assert config["bertdist_objective"] == back.config.objective == objective  # which labels trained the head
    if objective == "mlm+sop":
        torch.testing.assert_close(got.nsp_logits, want.sop_logits, atol=TOLERANCE, rtol=0)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))
    assert torch.equal(again.mlm_logits, got.mlm_logits)


def test_a_published_style_checkpoint_loads_and_what_transformers_cannot_hold_is_refused(tmp_path):
    """transformers' own save (and the tied decoder keys that older checkpoints carry) load; sharing only the
    attention or only the feed-forward has no Hugging Face form, nor has a grouping bertdist does not build."""
    hf = reference(groups=1)
    hf.save_pretrained(tmp_path / "hf")
    loaded = albert_hf.load_pretrained(tmp_path / "hf")
    ids, types, mask = batch()
    with torch.no_grad():
        torch.testing.assert_close(
            loaded.eval()(ids, types, mask).nsp_logits, hf(ids, mask, types).sop_logits, atol=TOLERANCE, rtol=0
        )
    state = dict(hf.state_dict())
    state["predictions.decoder.bias"] = state.pop("predictions.bias")
    mapped = albert_hf.from_hf_state_dict(state)
    assert "predictions.decoder.weight" not in mapped and torch.equal(
        mapped["predictions.bias"], state.pop("predictions.decoder.bias")
    )
    state["predictions.decoder.weight"] = torch.zeros_like(state["predictions.decoder.weight"])
    with pytest.raises(CheckpointFormatError, match="predictions.decoder.weight differs"):
        albert_hf.from_hf_state_dict(state)

    for share in ("attention", "ffn"):
        cfg = dataclasses.replace(loaded.config, share_layers=share)
        with pytest.raises(CheckpointFormatError, match=rf"^model.share_layers: '{share}' has no Hugging Face form"):
            albert_hf.write_directory(AlbertForPreTraining(cfg), tmp_path / share, None, {})
        assert not (tmp_path / share).exists()
    hf_config = hf.config.to_dict()
    for key, value, named in [
        ("num_hidden_groups", 2, "num_hidden_groups is 2"),
        ("inner_group_num", 2, "inner_group_num is 2"),
        ("hidden_act", "relu", "hidden_act is 'relu'"),
    ]:
        with pytest.raises(CheckpointFormatError, match=f"config.json: {named}"):
            albert_hf.config_from_hf({**hf_config, key: value})
    with pytest.raises(CheckpointFormatError, match=r"model.share_layers='none' but 'all' in the checkpoint"):
        albert_hf.load_pretrained(tmp_path / "hf", dataclasses.replace(loaded.config, share_layers="none"))


def sized(share_layers: str, **overrides) -> ModelConfig:
    return ModelConfig.from_size("albert-mini", vocab_size=1024, share_layers=share_layers, **overrides)


@pytest.mark.parametrize("share_layers", ["all", "attention", "ffn", "none"])
def test_the_counted_parameters_are_the_models_and_full_sharing_keeps_one_layer(share_layers):
    cfg = sized(share_layers)
    model = AlbertForPreTraining(cfg)
    assert flops.total_parameters(cfg) == sum(p.numel() for p in model.parameters())
    layers = model.albert.encoder.layers()
    assert len(layers) == cfg.num_layers
    assert (layers[1].attention is layers[0].attention) == (share_layers in ("all", "attention"))
    assert (layers[1].ffn is layers[0].ffn) == (share_layers in ("all", "ffn"))

    def encoder_layers(c: ModelConfig) -> int:
        groups = AlbertForPreTraining(c).albert.encoder.albert_layer_groups
        return sum(p.numel() for p in groups.parameters())

    if share_layers == "all":  # ALBERT: 1/num_layers of the encoder of a model sharing nothing
        assert cfg.num_layers * encoder_layers(cfg) == encoder_layers(sized("none"))


def test_a_shared_layer_learns_from_every_depth_and_checkpointing_changes_no_gradient():
    ids = torch.randint(5, 1024, (2, 24), generator=torch.Generator().manual_seed(0))
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = AlbertForPreTraining(sized("attention", activation_checkpointing=checkpointing))
        model(ids, masked_lm_positions=POSITIONS, masked_lm_ids=LABELS, next_sentence_label=SOP_LABELS).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-5)


def test_flops_count_every_application_of_a_shared_layer_as_torch_counts_the_matmuls():
    """Training mode with attention dropout spells attention out as matmuls on CPU, so torch's counter sees all."""
    counts = {}
    for share in ("all", "none"):
        cfg = sized(share, attention_dropout_prob=0.1)
        model = AlbertForPreTraining(cfg).train()
        ids = torch.randint(5, cfg.vocab_size, (3, 32))
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(ids, masked_lm_positions=torch.tensor([[1, 4, 9, 16, 25]] * 3))
        counts[share] = flops.forward_flops_per_sequence(cfg, 32, 5)
        assert counter.get_total_flops() == 3 * counts[share]
    assert counts["all"] == counts["none"]  # sharing saves parameters, not compute


def test_the_flops_are_pinned_for_a_small_config():
    cfg, length, predictions = sized("all"), 128, 20
    h, e, f, v = 256, 128, 1024, 1024
    by_hand = (
        2 * length * e * h  # E -> H projection
        + 3 * (2 * length * h * 4 * h + 2 * 2 * length * length * h + 2 * 2 * length * h * f)  # 3 full layers
        + 2 * length * h * 2 * h  # last layer: keys and values everywhere
        + 21 * (2 * h * 2 * h + 2 * 2 * length * h + 2 * 2 * h * f)  # the rest at [CLS] and the predictions
        + 2 * predictions * e * (h + v)  # MLM head: H -> E, E -> vocabulary
        + 2 * h * h
        + 2 * h * 2  # pooler and SOP classifier
    )
    assert flops.forward_flops_per_sequence(cfg, length, predictions) == by_hand == 733217792
    layers = 3 * AlbertLayer.forward_flops(cfg, length, length) + AlbertLayer.forward_flops(cfg, length, 21)
    heads = AlbertMLMHead.forward_flops(cfg, predictions) + AlbertSOPHead.forward_flops(cfg)
    assert AlbertForPreTraining.forward_flops(cfg, length, predictions) == 2 * length * e * h + layers + heads
