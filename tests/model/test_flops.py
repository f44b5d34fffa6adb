"""The FLOP count behind MFU and the dry-run plan equals what the model's matmuls really do."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from bertdist.model.bert import BertForPreTraining
from bertdist.model.flops import PeakFlops, forward_flops_per_sequence
from tests.conftest import tiny_model_config


def test_forward_flops_equal_torchs_count_of_the_models_matmuls():
    """Training mode on CPU spells attention out as matmuls (torch's counter does not see CPU SDPA), so every
    matmul of the forward is counted: the full layers, the last layer at [CLS] and the predictions only, the
    MLM and NSP heads."""
    cfg = tiny_model_config()
    model = BertForPreTraining(cfg).train()
    sequences, length, predictions = 3, 32, 5
    input_ids = torch.randint(5, cfg.vocab_size, (sequences, length))
    positions = torch.tensor([[1, 4, 9, 16, 25]] * sequences)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids, masked_lm_positions=positions)
    assert counter.get_total_flops() == sequences * forward_flops_per_sequence(cfg, length, predictions)


def test_mfu_on_cpu_never_exceeds_one_because_a_faster_rate_becomes_the_peak():
    peak = PeakFlops("cpu", "fp32")
    measured = peak.value
    assert measured > 1e8  # a real matmul measurement
    assert peak.mfu(measured / 2) == pytest.approx(0.5)
    assert peak.mfu(measured * 3) == 1.0 and peak.value == measured * 3  # under-measured at start: corrected
    assert peak.mfu(measured) == pytest.approx(1 / 3)
