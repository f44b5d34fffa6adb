"""The FLOP count behind MFU, the dry-run plan and the forecast is the model's own: each layer and head counts
itself, the counts equal what the model's matmuls really do, and MFU is never printed above 100%."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from bertdist.config import ModelConfig
from bertdist.model import flops, registry
from bertdist.model.bert.heads import BertPreTrainingHeads
from bertdist.model.bert.model import BertForPreTraining, BertLayer, BertPooler
from bertdist.model.flops import PeakFlops, forward_flops_per_sequence
from bertdist.model.modernbert.model import ModernBertEncoderLayer, ModernBertForMaskedLM, ModernBertPredictionHead
from bertdist.train.console import Console
from bertdist.train.metrics import MFU, Interval
from tests.conftest import tiny_model_config

# Counted by bertdist.model.flops before each model class counted itself (one formula per architecture there);
# ModernBERT's since its last layer runs at the predictions only.
PINNED = [
    (tiny_model_config(), 32, 5, 5177600),
    (tiny_model_config(), 128, 20, 24076544),
    (tiny_model_config(), 7, 1, 1130496),
    (tiny_model_config(), 32, 0, 4030720),
    (tiny_model_config(objective="mlm"), 32, 5, 5079040),
    (tiny_model_config(objective="mlm"), 128, 20, 23953408),
    (ModelConfig.from_size("base"), 128, 20, 22005365760),
    (ModelConfig.from_size("base"), 512, 80, 94720674816),
    (ModelConfig.from_size("modernbert-tiny"), 8, 2, 23434240),
    (ModelConfig.from_size("modernbert-tiny"), 17, 3, 39967232),
    (ModelConfig.from_size("modernbert-tiny"), 128, 20, 288458752),
    (ModelConfig.from_size("modernbert-tiny"), 512, 77, 1245262336),
    (ModelConfig.from_size("modernbert-mini", bias=True), 64, 10, 636520448),
    (ModelConfig.from_size("modernbert-mini", bias=True), 1024, 154, 12253120512),
    (ModelConfig.from_size("modernbert-base"), 1024, 154, 260027645952),
    (ModelConfig.from_size("modernbert-base"), 8192, 1228, 3369624797184),
]


@pytest.mark.parametrize("cfg, length, predictions, expected", PINNED, ids=lambda v: getattr(v, "size", None))
def test_the_counts_are_those_of_the_formulas_they_replaced(cfg, length, predictions, expected):
    assert forward_flops_per_sequence(cfg, length, predictions) == expected
    assert flops.train_flops_per_sequence(cfg, length, predictions) == 3 * expected


def _batch(lengths: list[int], predictions: list[int], packing: bool) -> dict[str, torch.Tensor]:
    """A loader batch (bertdist.data.batching) of samples of these lengths and prediction counts."""
    import numpy as np

    from bertdist.data.batching import FIELDS, Picked, collate, views

    picked = [
        Picked(np.full(n, 7), n // 2, np.arange(1, p + 1), np.full(p, 9), 0) for n, p in zip(lengths, predictions)
    ]
    buffer, shape = collate(picked, max(lengths) if not packing else 512, packing)
    return dict(zip(FIELDS, views(buffer, shape)))


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize(
    "cfg", [tiny_model_config(), ModelConfig.from_size("modernbert-tiny", global_attn_every_n_layers=1)]
)
def test_a_batch_is_counted_sample_by_sample_at_its_own_length_as_a_device_tensor(cfg, packing):
    """Each sample at its own length and predictions, padding (of the rows and of the prediction slots) not
    counted, with no host sync. At the mean length, the batch was undercounted by 16-30% here (one 448-token sample
    beside short ones), by 27% for an 8,192-token document packed with seven of 512."""
    lengths, predictions = [448, 40, 16, 8], [60, 6, 2, 1]
    batch = _batch(lengths, predictions, packing)
    counted = flops.train_flops_of_batch(cfg, batch["attention_mask"], batch["masked_lm_ids"])
    exact = sum(flops.train_flops_per_sequence(cfg, n, p) for n, p in zip(lengths, predictions))
    assert isinstance(counted, torch.Tensor) and counted.dtype == torch.float64 and counted.item() == exact
    assert batch["attention_mask"].shape[0] == (1 if packing else 4)


def test_distilberts_masked_lm_without_a_teacher_counts_berts_last_layer_at_the_predictions():
    """objective mlm runs BERT's forward, the last layer at the predictions only: every layer at every token, the
    distillation's count, read 12-31% high."""
    cfg = ModelConfig.from_size("distilbert-mini", objective="mlm", attention_dropout_prob=0.1, unpad=False)
    model = registry.model_class(cfg.arch)(cfg).train()
    input_ids = torch.randint(5, cfg.vocab_size, (2, 64))
    positions = torch.tensor([[1, 4, 9, 16, 25]] * 2)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids, masked_lm_positions=positions)
    assert counter.get_total_flops() == 2 * forward_flops_per_sequence(cfg, 64, 5)


def test_the_model_classes_count_themselves_through_the_registry():
    cfg = tiny_model_config()
    assert forward_flops_per_sequence(cfg, 32, 5) == BertForPreTraining.forward_flops(cfg, 32, 5)
    cfg = ModelConfig.from_size("modernbert-tiny")
    assert forward_flops_per_sequence(cfg, 32, 5) == ModernBertForMaskedLM.forward_flops(cfg, 32, 5)


def test_berts_count_is_its_layers_and_heads_the_last_layer_at_cls_and_the_predictions():
    cfg, length, predictions = tiny_model_config(num_layers=3), 32, 5
    layers = [BertLayer.forward_flops(cfg, length, length)] * 2 + [
        BertLayer.forward_flops(cfg, length, predictions + 1)
    ]
    heads = BertPreTrainingHeads.forward_flops(cfg, predictions) + BertPooler.forward_flops(cfg)
    assert BertForPreTraining.forward_flops(cfg, length, predictions) == sum(layers) + heads


def test_a_modernbert_layer_counts_its_window_and_a_window_as_long_as_the_sample_is_global_attention():
    length, predictions = 64, 10
    windowed = ModelConfig.from_size("modernbert-tiny", global_attn_every_n_layers=2, local_attention=16)
    local = ModernBertEncoderLayer.forward_flops(windowed, 1, length)
    assert local < ModernBertEncoderLayer.forward_flops(windowed, 0, length)  # 17 keys a query, not 64
    assert ModernBertEncoderLayer.forward_flops(windowed, 1, 8) == ModernBertEncoderLayer.forward_flops(windowed, 0, 8)
    every_layer_global = ModelConfig.from_size("modernbert-tiny", global_attn_every_n_layers=1)
    window_covers_the_sample = ModelConfig.from_size(
        "modernbert-tiny", global_attn_every_n_layers=2, local_attention=2 * length
    )
    assert (
        ModernBertForMaskedLM.forward_flops(every_layer_global, length, predictions)
        == ModernBertForMaskedLM.forward_flops(window_covers_the_sample, length, predictions)
        == sum(ModernBertEncoderLayer.forward_flops(every_layer_global, i, length) for i in range(3))
        + ModernBertEncoderLayer.forward_flops(every_layer_global, 3, length, predictions)
        + ModernBertPredictionHead.forward_flops(every_layer_global, predictions)
    )


@pytest.mark.parametrize("num_layers", [4, 3], ids=["global-last-layer", "local-last-layer"])
def test_modernberts_forward_flops_equal_torchs_count_of_its_matmuls(num_layers):
    """The full layers, the last one at the predictions only, and the head, on a sample longer than the window
    (the local layers' blocks are counted by the model, not by torch, so their window is the whole sample). In
    training mode with attention dropout, as above, so that CPU attention is matmuls torch counts."""
    cfg = ModelConfig.from_size(
        "modernbert-tiny",
        num_layers=num_layers,
        global_attn_every_n_layers=3,
        local_attention=128,
        unpad=False,
        attention_dropout_prob=0.1,
    )
    model = ModernBertForMaskedLM(cfg).train()
    sequences, length, predictions = 2, 64, 5
    input_ids = torch.randint(5, cfg.vocab_size, (sequences, length))
    positions = torch.tensor([[1, 4, 9, 16, 25]] * sequences)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids, masked_lm_positions=positions)
    assert counter.get_total_flops() == sequences * forward_flops_per_sequence(cfg, length, predictions)


@pytest.mark.parametrize("objective", ["mlm+nsp", "span"])
def test_forward_flops_equal_torchs_count_of_the_models_matmuls(objective):
    """Training mode on CPU spells attention out as matmuls (torch's counter does not see CPU SDPA), so every
    matmul of the forward is counted: the full layers, the last layer at [CLS] and the predictions only (and, for
    SpanBERT, at their spans' bounds), the MLM and NSP heads (or the span-boundary head)."""
    cfg = tiny_model_config(objective=objective)
    model = BertForPreTraining(cfg).train()
    sequences, length, predictions = 3, 32, 5
    input_ids = torch.randint(5, cfg.vocab_size, (sequences, length))
    positions = torch.tensor([[1, 4, 9, 16, 25]] * sequences)
    bounds = torch.stack([positions - 1, positions + 1], -1) if objective == "span" else None
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids, masked_lm_positions=positions, masked_lm_span_bounds=bounds)
    assert counter.get_total_flops() == sequences * forward_flops_per_sequence(cfg, length, predictions)


def test_mfu_on_cpu_is_unknown_for_the_rest_of_the_run_once_the_measured_peak_is_exceeded():
    """A measured peak that training exceeds was measured low: later intervals are unknown ("MFU ?"), not 99-100%
    of a peak re-based on training's own rate, and the reason is one console line, not a raw Python warning."""
    peak = PeakFlops("cpu", "fp32")
    measured = peak.value
    assert measured > 1e8  # a real matmul measurement
    assert peak.mfu(measured / 2) == pytest.approx(0.5) and peak.notice == ""
    assert peak.mfu(measured * 3) == 1.0 and "BERTDIST_PEAK_FLOPS" in peak.notice
    assert peak.mfu(measured * 2.9) == 1.0 and peak.mfu(measured / 4) == 1.0  # unknown from then on


def test_an_mfu_above_a_datasheet_peak_is_printed_as_unknown_with_one_notice(monkeypatch, tmp_path, capsys, recwarn):
    """Above the datasheet (fp32 matmuls on TF32 tensor cores, a miscount) the peak is wrong, not the run fast:
    "MFU ?" on the console, never "MFU 130%", and one notice naming the variable that sets the peak."""
    monkeypatch.delenv(flops.PEAK_FLOPS_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA A100-SXM4-80GB")
    peak = PeakFlops("cuda", "fp32")
    assert peak.from_datasheet and peak.value == 19.5e12
    console = Console(tmp_path, enabled=True)
    for flops_per_second in (1.3 * 19.5e12, 1.5 * 19.5e12, 0.47 * 19.5e12):
        interval = Interval(start=0.0)
        interval.add(
            {"sequences": 1.0, "tokens": 1.0, "slots": 1.0, "data_wait_seconds": 0.0, "loss": 1.0, "micro_batches": 1.0}
        )
        monkeypatch.setattr(interval, "seconds", lambda: 1.0)
        interval.totals["flops"] = flops_per_second
        values = {"loss/train": 1.0, **interval.throughput(1, peak)}
        assert values[MFU] <= 1.0
        console.train(
            1, 10, values, 1.0, {k: 0 for k in ("epoch", "world_size", "micro_batch_size", "intervals", "batches_done")}
        )
    lines = capsys.readouterr().out.splitlines()
    assert ["MFU ?" in line for line in lines] == [True, True, False] and "MFU 47%" in lines[2], lines
    assert peak.value == 19.5e12  # a datasheet peak is not moved
    assert flops.PEAK_FLOPS_ENV in peak.notice and not [w for w in recwarn if "MFU" in str(w.message)]


def test_a_gpu_gets_its_own_datasheet_peak_not_one_whose_name_its_name_holds():
    """An L40 read the L4's 121 TFLOP/s (its MFU 1.5x too high), an H100 NVL the SXM's 989."""
    from bertdist.model.flops import peak_flops_per_second

    named = {"NVIDIA L40": 181e12, "NVIDIA L40S": 362e12, "NVIDIA L4": 121e12, "NVIDIA H100 NVL": 835e12}
    named |= {"NVIDIA H100 80GB HBM3": 989e12, "NVIDIA H100 PCIe": 756e12, "NVIDIA A100-SXM4-80GB": 312e12}
    named |= {"Tesla T4": 65e12, "NVIDIA T400": None, "NVIDIA A10G": None, "NVIDIA A10": 125e12}  # whole words
    assert {name: peak_flops_per_second(name, "bf16") for name in named} == named


def test_a_gpu_missing_from_the_table_has_no_mfu_and_says_how_to_give_it_one(monkeypatch):
    """Its peak was this machine's CPU measured in fp32: any GPU beat it, and every interval logged MFU 100%."""
    monkeypatch.delenv(flops.PEAK_FLOPS_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA B200")
    peak = PeakFlops("cuda", "bf16")
    assert peak.mfu(100e12) == 1.0 and "no datasheet peak for this GPU" in peak.notice
    assert flops.PEAK_FLOPS_ENV in peak.notice and "bf16" in peak.notice
    monkeypatch.setenv(flops.PEAK_FLOPS_ENV, "2.25e15")
    assert PeakFlops("cuda", "bf16").mfu(225e12) == pytest.approx(0.1)
