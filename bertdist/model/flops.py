"""Training FLOPs and parameters of a model config, and the peak FLOP/s MFU is measured against: what the dry-run
plan, the forecast, the trainer's MFU and the benchmarks count.

The FLOPs are the model's own count: each pretraining model class (bertdist.model.registry, by `model.arch`)
has a static `forward_flops(cfg, seq_length, masked_positions)` that sums what each of its layers and heads
counts of itself from the config (a sliding-window layer its window, BERT's last layer its few positions), so
a new architecture needs no change here. Multiply-adds count as 2 FLOPs and a training step as 3x the forward
(forward + 2x backward), the usual convention for model FLOP utilisation (Chowdhery et al., 2022). Only the
model's own math is counted: activation recomputation, padding, norms and optimizer work are not, so MFU is
comparable across implementations. Parameters are counted on the model itself, built on the meta device.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from bertdist.config import ModelConfig
from bertdist.model import registry


def forward_flops_per_sequence(model: ModelConfig, seq_length: Any, masked_positions: int) -> Any:
    """Forward FLOPs for one sequence of `seq_length` tokens with `masked_positions` MLM predictions, as the
    architecture's model class counts them: a float, or a tensor when `seq_length` is one."""
    return registry.model_class(model.arch).forward_flops(model, seq_length, masked_positions)


def train_flops_per_sequence(model: ModelConfig, seq_length: int, masked_positions: int) -> float:
    return 3.0 * forward_flops_per_sequence(model, seq_length, masked_positions)


def train_flops_of_batch(model: ModelConfig, attention_mask: Any, masked_lm_ids: Any) -> Any:
    """Training FLOPs of a batch (bertdist.data.batching): each sample counted at its own length and its own
    real predictions, so neither padding (of the rows, of the prediction slots) nor a mean length (attention
    grows with the square of it: a mean undercounted an 8,192-token document packed with short ones by 27%)
    enters the count.

    `attention_mask` numbers each row's samples 1, 2, ... (0 is padding), and its samples are the batch's in
    order, row by row; `masked_lm_ids` is (samples, slots), -100 in an unused slot. Device tensors in, a device
    float64 tensor out (exact: float32 rounds above 2^24), with no host sync: each sample's length lands in its
    (row, number) slot of a rows x seq grid, and the grid's occupied slots, counted in order, are the samples."""
    import torch

    rows, seq = attention_mask.shape
    numbers = attention_mask.long()
    slot = torch.arange(rows, device=numbers.device)[:, None] * seq + (numbers - 1).clamp(min=0)
    lengths = torch.zeros(rows * seq, dtype=torch.float64, device=numbers.device)
    lengths.scatter_add_(0, slot.flatten(), (numbers > 0).flatten().double())
    occupied = lengths > 0
    predictions = (masked_lm_ids != -100).sum(-1).double()
    sample = (occupied.cumsum(0) - 1).clamp(min=0, max=predictions.numel() - 1)
    flops = train_flops_per_sequence(model, lengths, predictions[sample])
    return (flops * occupied).sum()


def parameter_counts(model: ModelConfig) -> tuple[int, int]:
    """(every parameter, those outside the embedding tables) of the pretraining model `model` describes, counted
    on the model itself built on the meta device: no memory and no initialisation, and no family's count written
    a second time beside its model (tied weights count once, as `parameters()` yields them once)."""
    import torch

    with torch.device("meta"):
        built = registry.model_class(model.arch)(model)
    tables = {id(p) for m in built.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    counts = [(p.numel(), id(p) in tables) for p in built.parameters()]
    return sum(n for n, _ in counts), sum(n for n, table in counts if not table)


def total_parameters(model: ModelConfig) -> int:
    return parameter_counts(model)[0]


def masked_positions_for(seq_length: int, masked_lm_prob: float = 0.15) -> int:
    """BERT's per-sequence prediction budget: 20 at length 128, 80 at 512; at another rate (a phase's own, as
    mmBERT's 30% -> 5%), that share of the sequence."""
    if seq_length < 128 or masked_lm_prob != 0.15:
        return max(1, round(seq_length * masked_lm_prob))
    return int(20 * seq_length / 128)


def trained_predictions(seq_length: int, masked_lm_prob: float, max_predictions_per_seq: int) -> tuple[int, bool]:
    """The predictions a sample trains at `seq_length`: the rate's share (masked_positions_for), cut to
    max_predictions_per_seq where that is set and smaller (ALBERT's 20 at 512, on purpose); and whether it was cut.
    One rule for the plan, the forecast and the FLOPs they count (the forecast counted the uncut share)."""
    predictions = masked_positions_for(seq_length, masked_lm_prob)
    cut = bool(max_predictions_per_seq) and predictions > max_predictions_per_seq
    return (max_predictions_per_seq if cut else predictions), cut


# Dense peak FLOP/s per GPU (no sparsity) by a whole word (or words) of torch.cuda.get_device_name(), most
# specific first: (fp16/bf16 tensor cores, plain fp32). Vendor datasheet numbers. Whole words: a substring gave an
# L40 the L4's peak, a T400 the T4's, an A10G the A10's.
GPU_PEAK_FLOPS: list[tuple[str, float, float]] = [
    ("H200", 989e12, 67e12),
    ("H100 PCIe", 756e12, 51e12),
    ("H100 NVL", 835e12, 60e12),
    ("H100", 989e12, 67e12),
    ("A100", 312e12, 19.5e12),
    ("L40S", 362e12, 91.6e12),
    ("L40", 181e12, 90.5e12),
    ("L4", 121e12, 30.3e12),
    ("A10", 125e12, 31.2e12),
    ("V100", 125e12, 15.7e12),
    ("T4", 65e12, 8.1e12),
]

PEAK_FLOPS_ENV = "BERTDIST_PEAK_FLOPS"


def peak_flops_per_second(device_name: str, precision: str) -> float | None:
    """Datasheet peak of one GPU for `precision`, or None for a device not in GPU_PEAK_FLOPS."""
    for key, half, single in GPU_PEAK_FLOPS:
        if re.search(rf"\b{re.escape(key)}\b", device_name):
            return single if precision == "fp32" else half
    return None


def measure_matmul_flops_per_second(size: int = 512, repeats: int = 4, trials: int = 5) -> float:
    """The best fp32 matmul FLOP/s of this process over `trials` short timings: the CPU's practical peak.

    CPUs have no datasheet number that means anything for one process among several sharing cores, so
    the trainer measures what a large matmul reaches on each rank at start (about 0.2 s). The best of
    several timings, because a busy machine only ever makes one slower: a single timing taken while another
    process ran read low, and MFU read over 100%.
    """
    import time

    import torch

    generator = torch.Generator().manual_seed(0)  # leaves the global RNG (dropout masks) untouched
    a, b = torch.randn(size, size, generator=generator), torch.randn(size, size, generator=generator)
    torch.mm(a, b)  # warm up the BLAS threads
    best = 0.0
    for _ in range(trials):
        start = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, b)
        best = max(best, 2.0 * size**3 * repeats / (time.perf_counter() - start))
    return best


class PeakFlops:
    """The denominator of MFU for one rank. MFU is at most 1.0, and 1.0 means unknown: the console prints "MFU ?".

    A GPU in GPU_PEAK_FLOPS has its datasheet peak. Elsewhere (a CPU, an unknown GPU, $BERTDIST_PEAK_FLOPS) the
    peak is a measurement, a lower bound of the true one. Training faster than the peak proves the peak wrong
    (measured under load, a datasheet number below what runs, as fp32 matmuls on TF32 tensor cores): from then on
    MFU is unknown, reported as 1.0 ("MFU ?"), never as 130%, and `notice` says once why, naming
    $BERTDIST_PEAK_FLOPS. A measured peak is not replaced by training's rate: every later interval then read
    99-100%, which looked like a real figure, between the 21% before it and the "?" of the interval that exceeded it.
    """

    def __init__(self, device_type: str, precision: str) -> None:
        import torch

        self.value = peak_flops_for(device_type, precision)
        self.precision = precision
        self.from_datasheet = (
            not os.environ.get(PEAK_FLOPS_ENV)
            and device_type == "cuda"
            and peak_flops_per_second(torch.cuda.get_device_name(), precision) is not None
        )
        self.exceeded = False
        self.notice = ""
        """One line for the console, set when the peak is first exceeded; the caller prints it and clears it."""

    def mfu(self, achieved_flops_per_second: float) -> float:
        """The fraction of the peak reached, below 1.0; 1.0 (unknown) once a rate reached or exceeded the peak, or
        for a datasheet peak, in each interval that does; 1.0 for a GPU whose peak bertdist does not know."""
        if math.isnan(self.value):
            if not self.exceeded:
                self.exceeded = True
                self.notice = (
                    f"MFU unknown: no datasheet peak for this GPU in bertdist.model.flops.GPU_PEAK_FLOPS; set "
                    f"{PEAK_FLOPS_ENV} to its dense peak FLOP/s at {self.precision}"
                )
            return 1.0
        if achieved_flops_per_second < self.value and not (self.exceeded and not self.from_datasheet):
            return achieved_flops_per_second / self.value
        if not self.exceeded:
            self.exceeded = True
            source = "its datasheet peak" if self.from_datasheet else "the peak measured at start"
            self.notice = (
                f"MFU unknown: training ran at {achieved_flops_per_second:.3g} FLOP/s per rank, above {source} "
                f"({self.value:.3g}); set {PEAK_FLOPS_ENV} to this device's peak FLOP/s"
            )
        return 1.0


def peak_flops_for(device_type: str, precision: str) -> float:
    """Peak FLOP/s of one rank, the denominator of MFU: $BERTDIST_PEAK_FLOPS, else the GPU table, else measured."""
    import torch

    if os.environ.get(PEAK_FLOPS_ENV):
        return float(os.environ[PEAK_FLOPS_ENV])
    if device_type == "cuda":  # a GPU not in the table: unknown, not this machine's CPU (every MFU read 100%)
        return peak_flops_per_second(torch.cuda.get_device_name(), precision) or math.nan
    return measure_matmul_flops_per_second()
