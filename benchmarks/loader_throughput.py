"""PretrainingLoader throughput: samples/s one process produces (decode, shuffle, pad, tensors).

    .venv/bin/python benchmarks/loader_throughput.py [--data DIR --vocab VOCAB] [--batches 400]

Without --data it prepares a small length-128 corpus first (local Ray). Reported for num_workers=0 (the
work of one process, the issue's target is >= 20,000 samples/s) and for 2 DataLoader workers (goal >= 30,000/s,
>= 20,000/s packed), unpacked and packed, and with masking at load time (shards prepared with --masking
dynamic from the same corpus: the loader chooses the masks; goal >= 30,000/s with 2 workers), next to
`iter_samples` (decode only, no shuffling or padding) measured in the same run as the floor of the cost.

Then a five-source mixture (bertdist.data.mixture: the directory five times under other seeds, shares 40/25/20/10/5)
against the one directory, 0 workers, measured in alternation three times each over --mixture-batches after 100
and compared by the medians (goal >= 0.95x). Long, because each source decodes the blocks of its first shuffle
window before its first batch: a start-up cost per phase (about a window per source) that a short measurement
counts as throughput. --mixture-only skips the rest.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time

TARGET_SAMPLES_PER_S = 20_000
WORKERS_GOAL, WORKERS_GOAL_PACKED = 30_000, 20_000
MIXTURE_GOAL = 0.95
"""A five-source mixture's samples/s over one source's (issue 45)."""
MIXTURE_WARMUP_BATCHES = 100
MIXTURE_SHARES = {"s0": 0.4, "s1": 0.25, "s2": 0.2, "s3": 0.1, "s4": 0.05}
"""Samples/s per rank with 2 workers (issue 13): what keeps a GPU fed while the training process launches kernels."""


def prepared_data(workdir: str) -> tuple[str, str, str]:
    from bertdist.data.instances import InstanceOptions
    from bertdist.data.pipeline.driver import prepare
    from bertdist.data.pipeline.options import PrepareOptions
    from bertdist.data.readers import expand_inputs, iter_texts
    from bertdist.data.synthetic import write_corpus
    from bertdist.data.vocab import train_vocab

    data, corpus, dynamic = (
        os.path.join(workdir, "data"),
        os.path.join(workdir, "corpus"),
        os.path.join(workdir, "dynamic"),
    )
    vocab = os.path.join(workdir, "vocab", "vocab.txt")
    if not os.path.exists(os.path.join(data, "manifest.json")):
        write_corpus(corpus, 4, 300, seed=3)
        train_vocab(iter_texts(expand_inputs([corpus])), os.path.dirname(vocab), 30522)
        prepare(
            PrepareOptions(
                inputs=[corpus],
                output_dir=data,
                vocab_file=vocab,
                progress=False,
                instances=InstanceOptions(max_seq_length=128, dupe_factor=5),
            )
        )
    if not os.path.exists(os.path.join(dynamic, "manifest.json")):
        prepare(
            PrepareOptions(
                inputs=[corpus],
                output_dir=dynamic,
                vocab_file=vocab,
                progress=False,
                instances=InstanceOptions(max_seq_length=128, dupe_factor=1, masking="dynamic"),
            )
        )
    return data, vocab, dynamic


def _rate(loader, batches: int, warmup_batches: int = 1) -> float:
    it = iter(loader)
    for _ in itertools.islice(it, warmup_batches):  # start-up (worker processes, first blocks) is not throughput
        pass
    t0 = time.perf_counter()
    samples = sum(len(b["next_sentence_label"]) for b in itertools.islice(it, batches))
    return samples / (time.perf_counter() - t0)


def _five_sources(data: str, vocab: str, common: dict):
    from bertdist.data.loader import PretrainingLoader
    from bertdist.data.mixture import MixtureLoader

    loaders = {name: PretrainingLoader(data, vocab, **{**common, "seed": k}) for k, name in enumerate(MIXTURE_SHARES)}
    return MixtureLoader(loaders, MIXTURE_SHARES, seed=0, phase=0, exhausted="repeat", phase_field="benchmark")


def _mixture_ratio(data: str, vocab: str, common: dict, batches: int) -> tuple[float, float]:
    """Median samples/s of one source and of five, measured in alternation (the machine's load drifts)."""
    import statistics

    from bertdist.data.loader import PretrainingLoader

    one, five = [], []
    for _ in range(3):
        one.append(_rate(PretrainingLoader(data, vocab, **common), batches, MIXTURE_WARMUP_BATCHES))
        five.append(_rate(_five_sources(data, vocab, common), batches, MIXTURE_WARMUP_BATCHES))
    return statistics.median(one), statistics.median(five)


def _print_mixture(data: str, vocab: str, common: dict, batches: int) -> None:
    one, five = _mixture_ratio(data, vocab, common, batches)
    print(
        f"machine load average {os.getloadavg()[0]:.1f}; one source vs a five-source mixture, 0 workers, "
        f"{batches} batches: {one:,.0f} vs {five:,.0f} samples/s = {five / one:.3f}x (goal >= {MIXTURE_GOAL}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data")
    parser.add_argument("--dynamic-data", help="shards prepared with --masking dynamic (with --data)")
    parser.add_argument("--vocab")
    parser.add_argument("--workdir", default="runs/bench/loader")
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--micro-batch-size", type=int, default=32)
    parser.add_argument("--mixture-batches", type=int, default=3000)
    parser.add_argument("--mixture-only", action="store_true")
    args = parser.parse_args()
    data, vocab, dynamic = (args.data, args.vocab, args.dynamic_data) if args.data else prepared_data(args.workdir)

    import torch

    from bertdist.data import iter_samples
    from bertdist.data.loader import PretrainingLoader

    torch.set_num_threads(1)
    common = dict(max_seq_length=128, micro_batch_size=args.micro_batch_size, rank=0, world_size=1, seed=0)
    if args.mixture_only:
        _print_mixture(data, vocab, common, args.mixture_batches)
        return
    n = args.batches * args.micro_batch_size
    t0 = time.perf_counter()
    decoded = sum(1 for _ in itertools.islice(iter_samples(data), n))
    decode_rate = decoded / (time.perf_counter() - t0)
    rates = {
        (workers, packing): _rate(
            PretrainingLoader(data, vocab, num_workers=workers, packing=packing, **common), args.batches
        )
        for packing in (False, True)
        for workers in (0, 2)
    }
    if dynamic:
        for workers in (0, 2):
            rates[workers, "masking"] = _rate(
                PretrainingLoader(dynamic, vocab, num_workers=workers, **common), args.batches
            )
    single = rates[0, False]
    print(
        f"machine load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
        f"batches of {args.micro_batch_size}, length 128"
    )
    print(f"iter_samples (decode only):       {decode_rate:>10,.0f} samples/s")
    print(
        f"PretrainingLoader, 0 workers:     {single:>10,.0f} samples/s  = "
        f"{single / TARGET_SAMPLES_PER_S:.2f}x the 20,000/s target, "
        f"{single / decode_rate:.2f}x iter_samples"
    )
    for (workers, packing), rate in rates.items():
        if (workers, packing) != (0, False):
            goal = (WORKERS_GOAL_PACKED if packing is True else WORKERS_GOAL) if workers else None
            against = f"  = {rate / goal:.2f}x the {goal:,}/s goal" if goal else ""
            kind = {False: "", True: ", packed", "masking": ", masking at load"}[packing]
            label = f"PretrainingLoader, {workers} workers{kind}:"
            print(f"{label:<44}{rate:>10,.0f} samples/s{against}")
    _print_mixture(data, vocab, common, args.mixture_batches)


if __name__ == "__main__":
    main()
