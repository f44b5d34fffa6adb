"""ELECTRA (bertdist.model.electra.model, bertdist.model.electra.hf) against transformers' ElectraForPreTraining (the
discriminator) and ElectraForMaskedLM (the generator) on the same random weights, in fp32: the export loads in
transformers with every key and gives the same logits, comes back the same, and transformers' own pair loads;
what is refused; and the training step: which tokens count as replaced, the loss, and packing."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
import torch.nn.functional as F

from bertdist.config import ModelConfig
from bertdist.model import registry
from bertdist.model.electra import hf as electra_hf
from bertdist.model.electra import model as electra
from bertdist.model.electra.model import ElectraForPreTraining
from bertdist.model.hf_io import CheckpointFormatError
from tests.model.parity import no_key_problems, nudge_norms_and_biases

transformers = pytest.importorskip("transformers")
TOLERANCE = 1e-5
VOCAB = 100


def tiny(embedding_size: int = 32, **overrides) -> ModelConfig:
    """The tiny ELECTRA: discriminator 2 x 64 wide, generator 2 x 32, embeddings of width `embedding_size`."""
    return ModelConfig.from_size(
        "electra-mini",
        vocab_size=VOCAB,
        max_position_embeddings=64,
        num_layers=2,
        hidden_size=64,
        num_attention_heads=2,
        embedding_size=embedding_size,
        generator_hidden_size=32,
        generator_num_attention_heads=1,
        generator_intermediate_size=64,
        **overrides,
    )


WIDTHS = pytest.mark.parametrize(
    "embedding_size", [32, 64], ids=["E=generator (discriminator projects)", "E=H (generator projects)"]
)


def model_of(cfg: ModelConfig, seed: int = 0) -> ElectraForPreTraining:
    """A model on random weights, its biases and norms away from their initial values (so a mix-up shows)."""
    torch.manual_seed(seed)
    model = ElectraForPreTraining(cfg).eval()
    nudge_norms_and_biases(model)
    return model


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three sentence pairs of 40 slots, the second padded after 25 tokens, the third after 9."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, VOCAB, (3, 40), generator=g)
    mask = torch.ones(3, 40, dtype=torch.long)
    mask[1, 25:], mask[2, 9:] = 0, 0
    types = torch.zeros_like(ids)
    types[0, 18:], types[1, 11:25], types[2, 5:9] = 1, 1, 1
    ids[mask == 0] = 0
    return ids, types, mask


def vocab_file(tmp_path) -> str:
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(VOCAB - 5))]))
    return str(path)


# ---------------------------------------------------------------------------------------------
# The Hugging Face format


@WIDTHS
@pytest.mark.parametrize("unpad", [True, False])
def test_the_export_loads_in_transformers_with_every_key_and_gives_the_same_logits(
    embedding_size, unpad, tmp_path, hf_offline
):
    """Unpadded, padding slots hold no states (compared at real tokens); padded, the whole grid is transformers'."""
    cfg = tiny(embedding_size, unpad=unpad)
    model = model_of(cfg)
    assert (model.electra.embeddings_project is None) == (embedding_size == 64)
    assert (model.generator.electra.embeddings_project is None) == (embedding_size == 32)
    electra_hf.write_directory(model, tmp_path / "export", vocab_file(tmp_path), {"bertdist_run_id": "r1"})

    config = json.loads((tmp_path / "export" / "config.json").read_text())
    generator_config = json.loads((tmp_path / "export" / "generator" / "config.json").read_text())
    assert config["architectures"] == ["ElectraForPreTraining"] and config["bertdist_objective"] == "rtd"
    assert (config["hidden_size"], config["embedding_size"], config["hidden_act"]) == (64, embedding_size, "gelu")
    assert generator_config["architectures"] == ["ElectraForMaskedLM"] and generator_config["bertdist_run_id"] == "r1"
    assert (generator_config["hidden_size"], generator_config["num_attention_heads"]) == (32, 1)
    assert (generator_config["intermediate_size"], generator_config["embedding_size"]) == (64, embedding_size)

    discriminator, info = transformers.ElectraForPreTraining.from_pretrained(
        tmp_path / "export", output_loading_info=True
    )
    assert no_key_problems(info), info
    generator, info = transformers.ElectraForMaskedLM.from_pretrained(
        tmp_path / "export" / "generator", output_loading_info=True
    )
    assert no_key_problems(info), info
    ids, types, mask = batch()
    real = mask.bool() if unpad else torch.ones_like(mask, dtype=torch.bool)
    with torch.no_grad():
        want_rtd = discriminator.eval()(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        want_mlm = generator.eval()(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        got_rtd = model.discriminator_logits(ids, types, mask)
        got_mlm = model.generator_logits(ids, types, mask)
        positions = torch.tensor([[1, 5, 17], [3, 7, 24], [0, 2, 8]])
        got_at = model.generator_logits(ids, types, mask, positions)
    assert got_rtd.shape == (3, 40) and got_mlm.shape == (3, 40, VOCAB)
    torch.testing.assert_close(got_rtd[real], want_rtd[real], atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(got_mlm[real], want_mlm[real], atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(got_at, want_mlm[torch.arange(3)[:, None], positions], atol=TOLERANCE, rtol=0)
    for directory in (tmp_path / "export", tmp_path / "export" / "generator"):
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
        assert tokenizer("w1 w2", "w3")["input_ids"] == [2, 6, 7, 3, 8, 3]


@WIDTHS
def test_the_export_comes_back_the_same(embedding_size, tmp_path):
    cfg = tiny(embedding_size)
    model = model_of(cfg)
    electra_hf.write_directory(model, tmp_path, None, {})
    for back in (electra_hf.load_pretrained(tmp_path), registry.load_pretrained(tmp_path, cfg)):
        assert back.config.arch == "electra" and back.config.objective == "rtd"
        assert back.config.generator_config().hidden_size == 32
        assert back.state_dict().keys() == model.state_dict().keys()
        assert all(torch.equal(v, back.state_dict()[k]) for k, v in model.state_dict().items())
    kept = electra_hf.load_pretrained(tmp_path, dataclasses.replace(cfg, hidden_dropout_prob=0.0, rtd_weight=20.0))
    assert (kept.config.hidden_dropout_prob, kept.config.rtd_weight) == (0.0, 20.0)  # the run's own settings
    for field, value in [("generator_hidden_size", 16), ("embedding_size", 16), ("generator_num_layers", 1)]:
        with pytest.raises(CheckpointFormatError, match=rf"config.json: architecture differs .*model.{field}={value}"):
            electra_hf.load_pretrained(tmp_path, dataclasses.replace(cfg, **{field: value}))


def test_exporting_an_export_again_keeps_its_generator(tmp_path):
    from bertdist.train.export import export_directory

    model = model_of(tiny())
    electra_hf.write_directory(model, tmp_path / "first", None, {})
    export_directory(tmp_path / "first", tmp_path / "again")  # a Hugging Face directory is copied as it is
    back = electra_hf.load_pretrained(tmp_path / "again")
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in model.state_dict().items())
    _, info = transformers.ElectraForMaskedLM.from_pretrained(
        tmp_path / "again" / "generator", output_loading_info=True
    )
    assert {k: v for k, v in info.items() if v} == {}, info


def test_an_export_to_a_store_uploads_the_top_config_last_and_is_replaced_whole(tmp_path, s3, monkeypatch):
    from bertdist import storage
    from bertdist.cli import main

    electra_hf.write_directory(model_of(tiny()), tmp_path / "first", None, {})
    url = storage.join(s3.bucket("models"), "electra")
    uploaded = []
    upload_file = storage.upload_file
    monkeypatch.setattr(storage, "upload_file", lambda path, to: (uploaded.append(to), upload_file(path, to)))
    assert main(["export", str(tmp_path / "first"), "--output", url]) == 0
    assert uploaded[-1] == storage.join(url, "config.json")  # the file that makes the model, after the generator's
    assert storage.join(url, "generator", "config.json") in uploaded
    assert main(["export", str(tmp_path / "first"), "--output", url, "--overwrite"]) == 0  # generator/ is its own


def transformers_pair(directory, embedding_size: int = 32, **generator_settings):
    """A random ElectraForPreTraining and ElectraForMaskedLM made by transformers, one embedding shared as an ELECTRA
    run trains it, saved as an export is laid out: the discriminator in `directory`, the generator in generator/."""
    shared = dict(vocab_size=VOCAB, embedding_size=embedding_size, max_position_embeddings=64)
    torch.manual_seed(5)
    discriminator = transformers.ElectraForPreTraining(
        transformers.ElectraConfig(
            **shared, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=96
        )
    ).eval()
    generator_config = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48)
    generator = transformers.ElectraForMaskedLM(
        transformers.ElectraConfig(**shared, **{**generator_config, **generator_settings})
    ).eval()
    nudge_norms_and_biases(discriminator, generator)
    generator.electra.embeddings.load_state_dict(discriminator.electra.embeddings.state_dict())  # shared, as ELECTRA
    discriminator.save_pretrained(directory)
    generator.save_pretrained(directory / "generator")
    return discriminator, generator


@WIDTHS
def test_a_pair_transformers_saved_loads_with_its_logits(embedding_size, tmp_path):
    """Also transformers' own shapes that the presets never make: a generator of another depth and head count."""
    discriminator, generator = transformers_pair(tmp_path, embedding_size)
    model = electra_hf.load_pretrained(tmp_path).eval()
    gen = model.config.generator_config()
    assert (gen.num_layers, gen.num_attention_heads, gen.ffn_size(), model.config.ffn_size()) == (1, 2, 48, 96)
    ids, types, mask = batch()
    real = mask.bool()
    with torch.no_grad():
        want_rtd = discriminator(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        want_mlm = generator(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        torch.testing.assert_close(
            model.discriminator_logits(ids, types, mask)[real], want_rtd[real], atol=TOLERANCE, rtol=0
        )
        torch.testing.assert_close(
            model.generator_logits(ids, types, mask)[real], want_mlm[real], atol=TOLERANCE, rtol=0
        )


def test_older_checkpoints_with_the_tied_decoder_and_buffers_load_and_a_discriminator_alone_gets_a_generator(
    tmp_path,
):
    from safetensors.torch import load_file, save_file

    transformers_pair(tmp_path)
    original = electra_hf.load_pretrained(tmp_path)
    gen_file = tmp_path / "generator" / "model.safetensors"
    tensors = load_file(gen_file)
    words = tensors["electra.embeddings.word_embeddings.weight"]
    with_buffers = {
        **tensors,
        "generator_lm_head.weight": words.clone(),
        "electra.embeddings.position_ids": torch.arange(64)[None],
    }
    save_file(with_buffers, gen_file)
    again = electra_hf.load_pretrained(tmp_path)
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in original.state_dict().items())

    save_file({**with_buffers, "generator_lm_head.weight": words + 1}, gen_file)
    with pytest.raises(CheckpointFormatError, match=rf"^{re.escape(str(gen_file))}: generator_lm_head.weight differs"):
        electra_hf.load_pretrained(tmp_path)
    save_file(
        {**tensors, "electra.embeddings.LayerNorm.bias": tensors["electra.embeddings.LayerNorm.bias"] + 1}, gen_file
    )
    with pytest.raises(
        CheckpointFormatError, match=rf"^{re.escape(str(gen_file))}: the generator's embeddings differ .*LayerNorm.bias"
    ):
        electra_hf.load_pretrained(tmp_path)

    (tmp_path / "generator" / "config.json").unlink()  # a released discriminator: no generator/config.json
    with pytest.warns(UserWarning, match="no generator/ .* the generator starts fresh: 2 layers of width 16"):
        alone = electra_hf.load_pretrained(tmp_path)
    discriminator = {k: v for k, v in original.state_dict().items() if not k.startswith("generator.")}
    assert all(torch.equal(v, alone.state_dict()[k]) for k, v in discriminator.items())
    cfg = tiny(embedding_size=32, intermediate_size=96)  # the run's generator: 2 x 32, not the default H/4
    with pytest.warns(UserWarning, match="2 layers of width 32, 1 heads, feed-forward 64"):
        assert electra_hf.load_pretrained(tmp_path, cfg).generator.generator_predictions.dense.in_features == 32


def test_a_config_transformers_or_bertdist_cannot_build_is_refused_naming_the_file(tmp_path):
    electra_hf.write_directory(model_of(tiny()), tmp_path, None, {})
    top, gen = tmp_path / "config.json", tmp_path / "generator" / "config.json"
    good_top, good_gen = json.loads(top.read_text()), json.loads(gen.read_text())
    for path, good, change, named in [
        (top, good_top, {"hidden_act": "relu"}, "hidden_act is 'relu'"),
        (top, good_top, {"position_embedding_type": "relative_key"}, "position_embedding_type is 'relative_key'"),
        (top, good_top, {"model_type": "bert"}, "model_type is 'bert'"),
        (gen, good_gen, {"hidden_act": "gelu_new"}, "hidden_act is 'gelu_new'"),
        (gen, good_gen, {"hidden_size": 128, "num_attention_heads": 2}, "hidden_size 128 is wider than the discrimin"),
        (gen, good_gen, {"embedding_size": 16}, "embedding_size is 16, the discriminator's 32"),
        (gen, good_gen, {"vocab_size": 99}, "vocab_size is 99, the discriminator's 100"),
    ]:
        path.write_text(json.dumps({**good, **change}))
        with pytest.raises(CheckpointFormatError, match=rf"^{re.escape(str(path))}: .*{named}"):
            electra_hf.load_pretrained(tmp_path)
        path.write_text(json.dumps(good))
    electra_hf.load_pretrained(tmp_path)  # every bad file was put back
    with pytest.raises(
        CheckpointFormatError, match=rf"^{re.escape(str(gen))}: an ElectraForMaskedLM, a generator alone"
    ):
        electra_hf.load_pretrained(tmp_path / "generator")
    with pytest.raises(CheckpointFormatError, match=r"vocab_size is missing"):
        electra_hf.config_from_hf({"model_type": "electra", "hidden_size": 64})


# ---------------------------------------------------------------------------------------------
# Training: sampling, labels, loss


def masked_batch():
    """The pairs of `batch` with 3 prediction slots each (the last of the third row empty) holding [MASK]."""
    ids, types, mask = batch()
    positions = torch.tensor([[1, 5, 17], [3, 7, 24], [2, 6, 0]])
    labels = ids.gather(1, positions)
    labels[2, 2] = -100
    masked = ids.clone()
    for row, slot in (labels != -100).nonzero().tolist():
        masked[row, positions[row, slot]] = 4
    return masked, types, mask, positions, labels


def test_replaced_means_the_sample_differs_from_the_original(monkeypatch):
    """The generator's draws are chosen here: the original token at some masked slots (they count as original,
    the paper's rule), another at the rest; the discriminator reads the original text with the draws in place."""
    model = model_of(tiny())
    ids, types, mask, positions, labels = masked_batch()
    real = labels != -100
    draws = labels[real].clone()
    draws[::2] = (draws[::2] + 1) % VOCAB  # slots 0, 2, 4, 6 replaced; 1, 3, 5, 7 drawn as the original
    monkeypatch.setattr(electra, "_gumbel_argmax", lambda logits, generator=None: draws)
    seen = []
    discriminator_logits = model.discriminator_logits
    monkeypatch.setattr(model, "discriminator_logits", lambda *a: seen.append(a[0]) or discriminator_logits(*a))
    with torch.no_grad():
        out = model(ids, types, mask, positions, labels)

    original, corrupted = ids.clone(), ids.clone()
    want = torch.where(mask.bool(), 0, -100)
    for (row, slot), label, draw in zip(real.nonzero().tolist(), labels[real], draws):
        original[row, positions[row, slot]] = label
        corrupted[row, positions[row, slot]] = draw
        want[row, positions[row, slot]] = int(draw != label)
    assert torch.equal(seen[0], corrupted) and not torch.equal(corrupted, original)
    assert torch.equal(out.scored["rtd"].labels, want) and int((want == 1).sum()) == 4
    assert out.scored["rtd"].logits.shape == (3, 40, 2) and torch.equal(out.scored["mlm"].labels, labels)


def test_the_loss_is_the_generators_mlm_plus_lambda_times_replaced_token_detection():
    cfg = tiny(rtd_weight=7.0)
    model = model_of(cfg)
    ids, types, mask, positions, labels = masked_batch()
    torch.manual_seed(0)
    with torch.no_grad():
        out = model(ids, types, mask, positions, labels)
    after = torch.rand(1)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(1))  # evaluation draws from a generator of its own: torch's is untouched
    rtd_logits, rtd_labels = out.scored["rtd"].logits[..., 1], out.scored["rtd"].labels
    scored = rtd_labels != -100
    rtd = F.binary_cross_entropy_with_logits(rtd_logits[scored], rtd_labels[scored].float())
    mlm = F.cross_entropy(out.mlm_logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.components["rtd"], rtd, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.components["mlm"], mlm, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.mlm_loss, mlm, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.loss, mlm + 7.0 * rtd, atol=1e-5, rtol=0)
    assert out.nsp_loss is None and out.nsp_logits is None


def test_packed_padded_and_unpadded_batches_give_the_same_losses():
    """The same three samples, one per row or the first two packed into one row, in training (no dropout) drawn
    from the same torch seed: sampling follows the samples' order, so the draws, the labels and the losses agree."""
    model = model_of(tiny(hidden_dropout_prob=0.0, attention_dropout_prob=0.0)).train()
    ids, types, mask, positions, labels = masked_batch()
    lengths = mask.sum(1).tolist()  # 40, 25, 9
    packed_ids = torch.zeros(2, 65, dtype=torch.long)
    packed_types, packed_mask = torch.zeros_like(packed_ids), torch.zeros_like(packed_ids)
    packed_ids[0], packed_types[0] = torch.cat([ids[0], ids[1, :25]]), torch.cat([types[0], types[1, :25]])
    packed_mask[0] = torch.cat([torch.ones(40), torch.full((25,), 2)])
    packed_ids[1, :9], packed_types[1, :9], packed_mask[1, :9] = ids[2, :9], types[2, :9], 1
    assert lengths == [40, 25, 9]
    results = []
    for inputs in ((ids, types, mask), (packed_ids, packed_types, packed_mask)):
        for unpad in (True, False):
            model.electra.unpad = model.generator.electra.unpad = unpad
            torch.manual_seed(11)
            with torch.no_grad():
                out = model(*inputs, positions, labels)
            replaced = out.scored["rtd"].labels
            results.append((out, replaced[replaced != -100]))
    first, first_replaced = results[0]
    assert first_replaced.any()  # some draws differ from the originals, so the comparison means something
    for out, replaced in results[1:]:
        assert torch.equal(replaced, first_replaced)
        for name in ("mlm", "rtd"):
            torch.testing.assert_close(out.components[name], first.components[name], atol=TOLERANCE, rtol=0)
        torch.testing.assert_close(out.loss, first.loss, atol=1e-4, rtol=0)
