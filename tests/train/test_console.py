"""The console's step line, durations, counts and accuracy fields."""

from __future__ import annotations

from bertdist.train.console import Console, _accuracies, count, duration
from bertdist.train.metrics import DATA_WAIT, MFU, PACKING, SEQUENCES_PER_SECOND, TOKENS_PER_SECOND_PER_RANK

POSITION = dict.fromkeys(("epoch", "world_size", "micro_batch_size", "intervals", "batches_done"), 0)


def test_durations_have_two_units_at_most_and_a_short_one_never_reads_zero():
    assert [duration(s) for s in (0, 0.01, 0.4, 9.94, 42, 190, 11_100)] == [
        "0s",
        "<0.1s",
        "0.4s",
        "9.9s",
        "42s",
        "3m10s",
        "3h05m",
    ]


def test_every_scored_head_is_shown_mlm_first():
    metrics = {
        "nsp_accuracy/eval": 0.5,
        "rtd_accuracy/eval": 0.75,
        "mlm_accuracy/eval": 0.25,
        "mlm_accuracy/train": 0.1,
    }
    assert _accuracies(metrics, "eval") == ["mlm acc 0.250", "nsp acc 0.500", "rtd acc 0.750"]


def test_the_step_line_shows_the_loaders_speed_compactly(tmp_path, capsys):
    metrics = {
        "loss/train": 6.214,
        "mlm_accuracy/train": 0.152,
        SEQUENCES_PER_SECOND: 164.2,
        TOKENS_PER_SECOND_PER_RANK: 5_230.0,
        PACKING: 0.614,
        MFU: 0.47,
        DATA_WAIT: 0.021,
    }
    Console(tmp_path, enabled=True).train(120, 1000, metrics, 190.0, POSITION)
    assert capsys.readouterr().out.strip() == (
        "step 120/1000 (12%) | loss 6.21 | mlm acc 0.152 | 164 seq/s | 5.2k tok/s/rank | packing 61% | MFU 47% | "
        "data wait 2% | eta 3m10s"
    )


def test_counts_keep_two_or_three_digits():
    assert [count(n) for n in (0.4, 840, 999.6, 5_230, 9_951, 52_000, 999_600, 1.3e6, 13e6)] == [
        "0",
        "840",
        "1.0k",
        "5.2k",
        "10k",
        "52k",
        "1.0M",
        "1.3M",
        "13M",
    ]
