"""The training loader: each rank's disjoint share of a prepared directory, shuffled, batched and padded.

How an epoch is laid out, and why:
- Every epoch has one global order of all N samples that depends only on (seed, epoch): the sample blocks of
  all shards are permuted, then samples are permuted within consecutive windows of `shuffle_buffer_size`
  (a deterministic stand-in for a shuffle buffer, so the order is reproducible from a position alone).
- The ranks split that order into contiguous equal parts, so a rank decodes only the blocks of its part.
  Every rank yields the same number of batches per epoch (the few samples that do not fill a batch on every
  rank wait for the next epoch's order), so no rank runs out early.
- DataLoader workers take turns: worker w makes the rank's batches t+w, t+w+W, ..., and PyTorch returns them
  in order, so the batch sequence does not depend on the number of workers.
- Shards prepared with `--masking dynamic` hold no masks: each sample is masked as it is batched, with
  numbers keyed by (seed, epoch, the sample's index in the manifest) (`bertdist.data.masking`), so its mask
  is new every epoch and the same whichever worker or rank reads it.
- Shards in an object store are read block by block (`bertdist.data.streaming`): each loader process
  fetches the blocks of its next `prefetch_samples` samples ahead of need into a bounded local cache. The
  order, and so every batch, is the same as from local disk.
- The whole position is (epoch, the segment of the epoch being consumed, batches done), the same on every
  rank. `load_state_dict` with the same world size continues exactly; with another world size (or micro
  batch size) it removes what every old rank consumed and splits the rest of the epoch among the new
  ranks: nothing is repeated or lost.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import weakref
from collections import OrderedDict
from typing import Any, Iterator, NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from bertdist import storage
from bertdist.config.schema import MaskingConfig
from bertdist.data.batching import FIELDS, Picked, buffer_size, collate, picked_from, views
from bertdist.data.masking import KeyedDraws, VocabInfo, apply_masks
from bertdist.data.samples import Samples
from bertdist.data.shards import read_block, read_manifest, shard_blocks
from bertdist.data.streaming import BlockStream, StreamSettings
from bertdist.data.tokenizer import open_tokenizer, tokenizer_file
from bertdist.errors import DataError

STATE_VERSION = 1
BATCHES_TRANSFER_SAMPLES = 1024
"""About how many samples a DataLoader worker sends per transfer (whole batches)."""


class _Masker(NamedTuple):
    rules: MaskingConfig
    vocab: VocabInfo
    span_bounds: bool
    """The batches carry `masked_lm_span_bounds` (bertdist.data.batching)."""


class _Layout:
    """Which sample sits at a global position of an epoch, and reading it (cached per process)."""

    def __init__(
        self, shard_dir: str, manifest: dict, seed: int, window: int, masker: _Masker | None, streaming: StreamSettings
    ):
        self.shard_dir, self.seed, self.window, self.masker = shard_dir, seed, window, masker
        per_block = manifest["options"]["samples_per_block"]
        self.blocks: list[tuple[str, int, int]] = []  # (shard file, block index, samples)
        for shard in manifest["shards"]:
            n = shard["num_samples"]
            for b in range(math.ceil(n / per_block)):
                self.blocks.append((shard["name"], b, min(per_block, n - b * per_block)))
        self.first_sample = np.cumsum([0] + [b[2] for b in self.blocks])
        """Of each block, the index of its first sample in manifest order: a sample's identity for its masks."""
        self.num_samples = int(self.first_sample[-1])
        self._epoch = -1
        self._windows: OrderedDict[int, np.ndarray] = OrderedDict()
        self._decoded: OrderedDict[int, tuple[Samples, np.ndarray, np.ndarray]] = OrderedDict()
        self._locations = shard_blocks(shard_dir, manifest)  # checks every shard against the manifest
        self._cache_blocks = 2 * (window // max(per_block, 1) + 2)
        self.stream: BlockStream | None = None
        self.prefetch_samples = streaming.prefetch_samples
        if storage.is_url(shard_dir):
            if not all("blocks" in shard for shard in manifest["shards"]):
                raise DataError(
                    f"{shard_dir}: the manifest lists no blocks (prepared by bertdist < 0.2), which streaming "
                    "from a store needs; prepare the data again, or train from a local copy"
                )
            index = [(shard["name"], *block) for shard in manifest["shards"] for block in shard["blocks"]]
            self.stream = BlockStream(shard_dir, index, streaming)

    def prefetch(self, epoch: int, positions: np.ndarray) -> None:
        """Start fetching the blocks of the samples at these positions (streamed shards only)."""
        if self.stream is not None:
            self.stream.schedule(self.locate(epoch, positions)[0].tolist())

    def _set_epoch(self, epoch: int) -> None:
        if epoch == self._epoch:
            return
        self._epoch = epoch
        self._order = np.random.default_rng([self.seed, epoch]).permutation(len(self.blocks))
        counts = np.array([self.blocks[b][2] for b in self._order], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self._windows.clear()

    def locate(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(block id, row in block) of the samples at the given global positions of `epoch`."""
        self._set_epoch(epoch)
        window = positions // self.window
        source = np.empty_like(positions)
        for k in np.unique(window).tolist():
            here = window == k
            source[here] = k * self.window + self._window_permutation(k)[positions[here] - k * self.window]
        slot = np.searchsorted(self._starts, source, side="right") - 1
        return self._order[slot], source - self._starts[slot]

    def _window_permutation(self, k: int) -> np.ndarray:
        if k not in self._windows:
            size = min(self.window, self.num_samples - k * self.window)
            self._windows[k] = np.random.default_rng([self.seed, self._epoch, k, 1]).permutation(size)
            while len(self._windows) > 4:
                self._windows.popitem(last=False)
        return self._windows[k]

    def block(self, block_id: int) -> tuple[Samples, np.ndarray, np.ndarray]:
        """A decoded block with its token and mask offsets."""
        if block_id in self._decoded:
            self._decoded.move_to_end(block_id)
            return self._decoded[block_id]
        name, index, _ = self.blocks[block_id]
        offset, size, count = self._locations[name][index]
        path = storage.join(self.shard_dir, name)
        data = self.stream.read(block_id) if self.stream is not None else None
        samples = read_block(path, (offset, size), count, data)
        entry = (samples, samples.token_offsets(), samples.mask_offsets())
        self._decoded[block_id] = entry
        while len(self._decoded) > self._cache_blocks:
            self._decoded.popitem(last=False)
        return entry


def _leave_stop_signals_to_the_rank(worker_id: int) -> None:
    """A loader worker ignores SIGTERM and SIGINT: they reach it too when the whole process group is signalled
    (torchrun and SLURM stop ranks with killpg, Ctrl-C signals the terminal's group), and a worker that died
    of one would fail its rank before the rank can finish its step and checkpoint. Its rank decides when to
    stop; the worker ends with it (torch's workers watch their parent)."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


_STARTED: weakref.WeakSet = weakref.WeakSet()
"""The DataLoader iterators with worker processes this process started."""


@atexit.register
def _kill_workers_left_at_exit() -> None:
    """At exit, multiprocessing ends every daemonic child with SIGTERM and then waits for it without a timeout.
    Our workers ignore SIGTERM (above), so a worker still alive then (its iterator abandoned but not yet
    collected) would hang the exit forever: it is ended with SIGKILL first. Registered after multiprocessing's
    own exit handler, so it runs before it."""
    workers = [w for iterator in list(_STARTED) for w in getattr(iterator, "_workers", [])]
    for worker in workers:  # every one first: a failure on one must not leave the next to hang the exit
        with contextlib.suppress(Exception):
            if worker.is_alive():
                worker.kill()
    for worker in workers:
        with contextlib.suppress(Exception):
            worker.join(5.0)


def _worker_message(error: DataError) -> str:
    """The one line a DataError said in a DataLoader worker, without torch's "Caught ... Original Traceback"."""
    text = str(error)
    marker = f"{DataError.__name__}: "
    return text.rsplit(marker, 1)[1].strip() if "Original Traceback" in text and marker in text else text


def _collate(layout: _Layout, epoch: int, positions: np.ndarray, max_seq_length: int, packing: bool):
    """The batch of the samples at `positions` (`bertdist.data.batching`)."""
    blocks, rows = layout.locate(epoch, positions)
    if layout.masker is not None:
        return _collate_masking(layout, epoch, blocks, rows, max_seq_length, packing)
    picked = []
    for block_id, row in zip(blocks.tolist(), rows.tolist()):
        samples, tok, msk = layout.block(block_id)
        start, m0, m1 = tok[row], msk[row], msk[row + 1]
        picked.append(
            Picked(
                samples.input_ids[start : start + int(samples.lengths[row])],
                int(samples.segment_a_lengths[row]),
                samples.masked_lm_positions[m0:m1],
                samples.masked_lm_ids[m0:m1],
                int(samples.next_sentence_labels[row]),
            )
        )
    return collate(picked, max_seq_length, packing)


def _collate_masking(
    layout: _Layout, epoch: int, blocks: np.ndarray, rows: np.ndarray, max_seq_length: int, packing: bool
):
    """The batch of unmasked samples, masked now: the masks depend on (seed, epoch, sample) only."""
    parts = []
    for block_id, row in zip(blocks.tolist(), rows.tolist()):
        samples, tok, _ = layout.block(block_id)
        parts.append(
            (
                samples.input_ids[tok[row] : tok[row + 1]],
                int(samples.segment_a_lengths[row]),
                int(samples.next_sentence_labels[row]),
            )
        )
    lengths = np.array([len(p[0]) for p in parts], dtype=np.int64)
    unmasked = Samples(
        input_ids=np.concatenate([p[0] for p in parts]),
        lengths=lengths,
        segment_a_lengths=np.array([p[1] for p in parts], dtype=np.int64),
        masked_lm_positions=np.zeros(0, np.int64),
        masked_lm_ids=np.zeros(0, np.int64),
        masked_counts=np.zeros(len(parts), np.int64),
        next_sentence_labels=np.array([p[2] for p in parts], dtype=np.int64),
    )
    draws = KeyedDraws(layout.seed, epoch, layout.first_sample[blocks] + rows)
    masked = apply_masks(unmasked, layout.masker.rules, layout.masker.vocab, draws)
    if not layout.masker.span_bounds:
        masked.masked_span_bounds = None
    return collate(picked_from(masked), max_seq_length, packing)


class _Segment:
    """A stretch of an epoch consumed by a fixed set of ranks: the unconsumed positions at its start."""

    def __init__(self, world_size: int, micro_batch_size: int, intervals: list[list[int]], batches_done: int = 0):
        self.world_size, self.micro_batch_size = world_size, micro_batch_size
        self.intervals, self.batches_done = intervals, batches_done
        self.size = sum(b - a for a, b in intervals)

    def rank_start(self, rank: int) -> int:
        return rank * self.size // self.world_size

    def batches_per_rank(self) -> int:
        return (self.size // self.world_size) // self.micro_batch_size

    def global_positions(self, virtual: np.ndarray) -> np.ndarray:
        starts = np.array([a for a, _ in self.intervals], dtype=np.int64)
        lengths = np.array([b - a for a, b in self.intervals], dtype=np.int64)
        cum = np.concatenate([[0], np.cumsum(lengths)])
        which = np.searchsorted(cum, virtual, side="right") - 1
        return starts[which] + virtual - cum[which]

    def batch_positions(self, rank: int, batch: int) -> np.ndarray:
        first = self.rank_start(rank) + batch * self.micro_batch_size
        return self.global_positions(np.arange(first, first + self.micro_batch_size, dtype=np.int64))

    def remaining(self) -> list[list[int]]:
        """Unconsumed positions after `batches_done` batches on every rank, as sorted intervals."""
        consumed = []
        for r in range(self.world_size):
            lo = self.rank_start(r)
            consumed.append((lo, lo + self.batches_done * self.micro_batch_size))
        left, cursor = [], 0
        for lo, hi in consumed + [(self.size, self.size)]:
            if lo > cursor:
                left.extend(_virtual_to_intervals(self, cursor, lo))
            cursor = max(cursor, hi)
        return left


def _virtual_to_intervals(segment: _Segment, lo: int, hi: int) -> list[list[int]]:
    out, cum = [], 0
    for a, b in segment.intervals:
        s, e = max(lo, cum), min(hi, cum + b - a)
        if s < e:
            out.append([a + s - cum, a + e - cum])
        cum += b - a
    return out


class _BatchStream(IterableDataset):
    """A rank's batches from an epoch segment on, epoch after epoch, in chunks of `chunk` consecutive batches of
    one segment in one buffer; worker w of W makes chunks w, w+W, ... counted across the epochs, the order in
    which the DataLoader takes them. One stream serves the whole run: a DataLoader started again at each epoch
    forked a new worker each time, a pause of 2-4 s per epoch in training (November 2026)."""

    def __init__(self, loader: "PretrainingLoader", segment: _Segment, chunk: int):
        self.layout, self.epoch, self.segment, self.chunk = loader._layout, loader.epoch, segment, chunk
        self.rank, self.max_seq_length, self.packing = loader.rank, loader.max_seq_length, loader.packing

    def __iter__(self) -> Iterator[tuple[torch.Tensor, list[tuple[int, int, int, int]]]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        epoch, segment, counted = self.epoch, self.segment, 0
        while True:
            first, end = segment.batches_done, segment.batches_per_rank()
            starts = range(first, end, self.chunk)
            mine = starts[(worker - counted) % workers :: workers]
            counted += len(starts)
            yield from self._chunks(epoch, segment, mine, end)
            everything = [[0, self.layout.num_samples]]  # the next epoch, as `PretrainingLoader._fresh_segment`
            epoch, segment = epoch + 1, _Segment(segment.world_size, segment.micro_batch_size, everything)

    def _chunks(self, epoch: int, segment: _Segment, starts: range, end: int):
        ahead = max(1, -(-self.layout.prefetch_samples // (self.chunk * segment.micro_batch_size)))
        self._prefetch(epoch, segment, starts[:ahead], end)
        for k, start in enumerate(starts):
            self._prefetch(epoch, segment, starts[k + ahead : k + ahead + 1], end)
            parts = [
                _collate(
                    self.layout, epoch, segment.batch_positions(self.rank, batch), self.max_seq_length, self.packing
                )
                for batch in range(start, min(start + self.chunk, end))
            ]
            yield (parts[0][0] if len(parts) == 1 else torch.cat([p[0] for p in parts])), [p[1] for p in parts]

    def _prefetch(self, epoch: int, segment: _Segment, chunk_starts: range, end: int) -> None:
        """Ask for the blocks of these chunks ahead of need (streamed shards only)."""
        if self.layout.stream is None:
            return
        for start in chunk_starts:
            batches = range(start, min(start + self.chunk, end))
            positions = np.concatenate([segment.batch_positions(self.rank, b) for b in batches])
            self.layout.prefetch(epoch, positions)


class PretrainingLoader:
    """Infinite iterator of padded batches for one rank (see the module docstring for the layout)."""

    def __init__(
        self,
        shard_dir: str,
        vocab_file: str,
        max_seq_length: int,
        micro_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        num_workers: int = 0,
        shuffle_buffer_size: int = 2000,
        packing: bool = False,
        pin_memory: bool = False,
        masking: MaskingConfig = MaskingConfig(),
        streaming: StreamSettings = StreamSettings(),
        span_bounds: bool = False,
    ):
        """`masking`: the rules for shards prepared with `--masking dynamic` (default: the paper's 15%, 80/10/10);
        shards with static masks keep theirs. `span_bounds`: batches carry each prediction's span boundaries
        (SpanBERT's objective), which needs span masking here, at load time. `streaming`:
        the cache and read-ahead for a `shard_dir` that is an object-store URL (whose endpoint is the process's:
        `bertdist.storage.use_endpoint`)."""
        manifest = read_manifest(shard_dir)
        if not os.path.exists(vocab_file):
            raise DataError(f"{vocab_file}: vocabulary file not found")
        vocab_file = tokenizer_file(vocab_file)
        if storage.file_sha256(vocab_file) != manifest["vocab_sha256"]:
            raise DataError(
                f"{shard_dir}: shards were made with another vocabulary than {vocab_file} (sha256 differs); "
                "prepare the data again with this vocab, or point data.vocab_file at the one used"
            )
        made_for = manifest["options"]["max_seq_length"]
        if made_for != max_seq_length:
            raise DataError(f"{shard_dir}: shards were made for max_seq_length {made_for}, not {max_seq_length}")
        if not 0 <= rank < world_size:
            raise DataError(f"rank {rank} is outside world size {world_size}")
        if micro_batch_size < 1 or num_workers < 0 or shuffle_buffer_size < 1:
            raise DataError("micro_batch_size and shuffle_buffer_size must be >= 1, num_workers >= 0")
        self.shard_dir, self.max_seq_length, self.micro_batch_size = shard_dir, max_seq_length, micro_batch_size
        self.rank, self.world_size, self.seed, self.num_workers = rank, world_size, seed, num_workers
        self.packing, self.pin_memory = packing, pin_memory
        options = manifest["options"]
        self.objective = options.get("objective", "nsp")
        """nsp (sentence pairs, real next-sentence labels) or mlm (full sentences; no NSP labels to learn)."""
        masker = None
        if options.get("masking", "static") == "dynamic":
            masker = _Masker(masking, VocabInfo.from_tokenizer(open_tokenizer(vocab_file)), span_bounds)
        if span_bounds and (masker is None or not masking.span_masking):
            raise DataError(
                f"{shard_dir}: span boundaries come from span masking at load time: set data.masking.span_masking "
                "and use shards prepared with --masking dynamic"
                + ("" if masker else f" (these were prepared with --masking {options.get('masking', 'static')})")
            )
        self._layout = _Layout(shard_dir, manifest, seed, shuffle_buffer_size, masker, streaming)
        if self._layout.num_samples // world_size < micro_batch_size:
            raise DataError(
                f"{shard_dir}: {self._layout.num_samples} samples cannot give each of {world_size} ranks "
                f"a batch of {micro_batch_size}"
            )
        self._epoch = 0
        self._segment = self._fresh_segment()

    def _fresh_segment(self) -> _Segment:
        return _Segment(self.world_size, self.micro_batch_size, [[0, self._layout.num_samples]])

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def batches_per_epoch(self) -> int:
        return self._fresh_segment().batches_per_rank()

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        # A worker hands over whole chunks of batches: each transfer through shared memory costs about a
        # millisecond whatever its size, more than collating a small batch does.
        chunk = max(1, BATCHES_TRANSFER_SAMPLES // self.micro_batch_size) if self.num_workers else 1
        stream = _BatchStream(self, self._segment, chunk)
        batches = (
            # Its own generator: creating the iterator would otherwise draw a worker seed from the global torch
            # RNG (the training's dropout stream), and a resumed run creates it at another step than an
            # uninterrupted one. Batches depend on positions, not on that seed.
            DataLoader(
                stream,
                batch_size=None,
                num_workers=self.num_workers,
                pin_memory=self.pin_memory,  # page-locked chunks: the copies to the GPU run asynchronously
                generator=torch.Generator().manual_seed(self.seed),
                worker_init_fn=_leave_stop_signals_to_the_rank,
            )
            if self.num_workers
            else stream
        )
        iterator = iter(batches)
        if self.num_workers:
            _STARTED.add(iterator)
        try:
            for buffer, shapes in iterator:
                at = 0
                for shape in shapes:
                    while self._segment.batches_done >= self._segment.batches_per_rank():  # the stream's next epoch
                        self._epoch += 1
                        self._segment = self._fresh_segment()
                    shape = tuple(int(x) for x in shape)
                    fields = views(buffer[at : at + buffer_size(shape)], shape)
                    at += buffer_size(shape)
                    self._segment.batches_done += 1
                    yield dict(zip(FIELDS, fields))
        except DataError as e:
            raise DataError(_worker_message(e)) from None
        finally:  # the workers end now, not whenever the garbage collector reaches an abandoned iterator
            shutdown = getattr(iterator, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()

    def state_dict(self) -> dict[str, Any]:
        s = self._segment
        return dict(
            version=STATE_VERSION,
            epoch=self._epoch,
            seed=self.seed,
            num_samples=self._layout.num_samples,
            shuffle_buffer_size=self._layout.window,
            world_size=s.world_size,
            micro_batch_size=s.micro_batch_size,
            intervals=s.intervals,
            batches_done=s.batches_done,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        expected = dict(
            version=STATE_VERSION,
            seed=self.seed,
            num_samples=self._layout.num_samples,
            shuffle_buffer_size=self._layout.window,
        )
        wrong = [f"{k}={state.get(k)!r} (this loader: {v!r})" for k, v in expected.items() if state.get(k) != v]
        if wrong:
            raise DataError(f"{self.shard_dir}: loader state belongs to other data or settings: {', '.join(wrong)}")
        self._epoch = int(state["epoch"])
        saved = _Segment(state["world_size"], state["micro_batch_size"], state["intervals"], state["batches_done"])
        if saved.world_size == self.world_size and saved.micro_batch_size == self.micro_batch_size:
            self._segment = saved
        else:  # new ranks share what the old ranks left of this epoch
            self._segment = _Segment(self.world_size, self.micro_batch_size, saved.remaining())
