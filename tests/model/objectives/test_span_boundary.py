"""SpanBERT's span-boundary objective (bertdist.model.objectives.span_boundary), trained by BERT: it reads the
encoder's states at each prediction's span bounds, which the last layer computes there only; the loss is MLM + SBO;
the export is a `BertForMaskedLM` without it, and continuing from that export starts the head afresh."""

from __future__ import annotations

import pytest
import torch

from bertdist.model.bert.hf import load_pretrained, save_pretrained
from bertdist.model.bert.model import BertForPreTraining
from bertdist.model.ops import IGNORE_INDEX
from tests.conftest import tiny_model_config

transformers = pytest.importorskip("transformers")


def span_batch() -> dict:
    """Two padded samples; spans (3-5) and (10) in the first, (6-7) and (8) touching it in the second."""
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, 1000, (2, 24), generator=g)
    attention_mask = torch.ones(2, 24, dtype=torch.long)
    attention_mask[1, 18:] = 0
    positions = torch.tensor([[3, 4, 5, 10, 0], [6, 7, 8, 0, 0]])
    bounds = torch.tensor([[[2, 6]] * 3 + [[9, 11], [0, 0]], [[5, 8], [5, 8], [7, 9], [0, 0], [0, 0]]])
    labels = torch.randint(5, 1000, positions.shape, generator=g)
    labels[0, 4] = labels[1, 3:] = IGNORE_INDEX
    return dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        masked_lm_positions=positions,
        masked_lm_ids=labels,
        masked_lm_span_bounds=bounds,
    )


def test_the_span_boundary_head_reads_the_states_at_each_spans_bounds_and_adds_its_loss():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_model_config(objective="span")).eval()
    batch = span_batch()
    with torch.no_grad():
        out = model(**batch)
        states, layout = model.bert.encode(batch["input_ids"], None, batch["attention_mask"])
        grid, rows = layout.to_grid(states), torch.arange(2)[:, None]
        bounds, positions = batch["masked_lm_span_bounds"], batch["masked_lm_positions"]
        offset = (positions - bounds[..., 0] - 1).clamp(min=0)
        decoder = model.bert.embeddings.word_embeddings.weight
        want_sbo = model.span_boundary(grid[rows, bounds[..., 0]], grid[rows, bounds[..., 1]], offset, decoder)
        want_mlm = model.cls.predictions(grid[rows, positions], decoder)
    assert offset.tolist() == [[0, 1, 2, 0, 0], [0, 1, 0, 0, 0]]
    assert sorted(out.components) == ["mlm", "sbo"] and sorted(out.scored) == ["mlm", "sbo"]
    torch.testing.assert_close(out.scored["sbo"].logits, want_sbo, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.mlm_logits, want_mlm, atol=1e-5, rtol=0)
    assert torch.equal(out.loss, out.components["mlm"] + out.components["sbo"])
    assert not torch.allclose(out.components["sbo"], out.components["mlm"])  # its own head, not the MLM one again

    without = {k: v for k, v in batch.items() if k != "masked_lm_span_bounds"}
    with pytest.raises(ValueError, match="masked_lm_span_bounds"):
        model(**without)
    assert sorted(BertForPreTraining(tiny_model_config(objective="mlm"))(**without).components) == ["mlm"]


def test_the_export_is_a_masked_lm_without_the_boundary_head_and_continues_with_a_fresh_one(tmp_path, tiny_vocab):
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_model_config(objective="span")).eval()
    save_pretrained(model, tmp_path, tiny_vocab)
    theirs, info = transformers.BertForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}, info
    assert type(transformers.AutoModelForMaskedLM.from_pretrained(tmp_path)).__name__ == "BertForMaskedLM"
    ids = span_batch()["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(model(ids).mlm_logits, theirs.eval()(input_ids=ids).logits, atol=1e-5, rtol=0)

    with pytest.warns(UserWarning, match="no weights for span_boundary.bias.*start fresh"):
        again = load_pretrained(tmp_path, tiny_model_config(objective="span"))
    assert again.span_boundary is not None
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in again.state_dict().items() if "span_boundary" not in k)
    assert load_pretrained(tmp_path).config.objective == "mlm"  # read alone, it is the masked LM it was saved as
