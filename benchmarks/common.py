"""What every benchmark shares: timing that is fair on a busy machine, and the matmul peak MFU is measured against.

Benchmarks here report ratios against a reference measured in the same run, never absolute numbers alone: the
machines they run on are shared, and a ratio of interleaved measurements survives the noise that raw numbers
do not.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable, TypeVar

import torch

T = TypeVar("T")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def use_all_cores() -> int:
    """One intra-op thread per core this process may run on (torch's default can exceed it in containers)."""
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(threads)
    return threads


def step_clock(device: torch.device, threads: int, cpu_time: bool) -> Callable[[], float]:
    """The clock to time steps with: wall time, or this thread's CPU time.

    CPU time is immune to other processes taking the cores (a shared machine), but it only counts all the work
    when torch computes on this one thread, so it requires `threads == 1` on CPU.
    """
    if not cpu_time:
        return time.perf_counter
    if device.type != "cpu" or threads != 1:
        raise ValueError("CPU-time measurement needs --device cpu and --threads 1")
    return time.thread_time


def device_name(device: torch.device, threads: int) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({threads} threads)"


def interleaved_medians(
    steps: dict[str, Callable[[], None]],
    device: torch.device,
    repeats: int,
    warmup: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Median seconds per call of each function, calling them in turns so that background load hits all alike."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            synchronize(device)
            start = clock()
            step()
            synchronize(device)
            times[name].append(clock() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def time_variants(
    makers: dict[str, Callable[[], Callable[[], None]]],
    device: torch.device,
    repeats: int,
    warmup: int,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[dict[str, float], dict[str, str]]:
    """Median seconds per call of each variant that builds and runs (`interleaved_medians`), and the error of each
    that does not.

    Every variant is built (`makers[name]()`) and called once, its first warm-up call (so at least one, even with
    `warmup` 0), before any is timed: one that
    fails (a kernel never run on this GPU, out of memory at a long length) is named with its error and left out,
    so that it does not cost the row the other variants' figures."""

    def first_call(step: Callable[[], None]) -> Callable[[], None]:
        step()
        synchronize(device)
        return step

    steps, failed = each_variant(makers, device, first_call)
    return interleaved_medians(steps, device, repeats, max(0, warmup - 1), clock), failed


def each_variant(
    makers: dict[str, Callable[[], Callable[[], None]]], device: torch.device, use: Callable[[Callable[[], None]], T]
) -> tuple[dict[str, T], dict[str, str]]:
    """`use` of each variant's step (`makers[name]()`), and the error of each variant whose build or use failed:
    one variant failing (a kernel never run on this GPU, memory) must not cost a row the others' figures."""
    done: dict[str, T] = {}
    failed: dict[str, str] = {}
    for name, make in makers.items():
        try:
            done[name] = use(make())
        except Exception as e:  # any failure of one variant; the others still run
            failed[name] = f"{type(e).__name__}: {e}"[:300]
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return done, failed


def mfu_peak(device: torch.device, precision: str, measured_flops: float) -> tuple[float, str]:
    """The peak MFU is read against, and which: a GPU's datasheet peak where bertdist.model.flops knows it (what
    the trainer's MFU and the published figures use: NVIDIA's, MosaicBERT's), else the matmul peak measured here
    (a CPU has no datasheet figure that means anything for one process)."""
    from bertdist.model.flops import peak_flops_per_second

    if device.type == "cuda":
        datasheet = peak_flops_per_second(torch.cuda.get_device_name(device), precision)
        if datasheet:
            return datasheet, "datasheet"
    return measured_flops, "measured matmul"


def matmul_peak_flops(
    device: torch.device,
    dtype: torch.dtype,
    size: int | None = None,
    repeats: int = 10,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Best FLOP/s of a large square matmul: the practical peak of this device and dtype, measured now.

    The best of several runs, not the median: the peak is what the hardware can do when nothing interferes.
    """
    size = size or (8192 if device.type == "cuda" else 2048)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best = float("inf")
    for i in range(repeats + 2):
        synchronize(device)
        start = clock()
        torch.mm(a, b)
        synchronize(device)
        if i >= 2:  # the first calls pay for allocation and kernel selection
            best = min(best, clock() - start)
    return 2 * size**3 / best
