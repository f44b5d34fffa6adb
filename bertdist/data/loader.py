"""The training loader: each rank's disjoint share of a prepared directory, shuffled, batched and padded.

How an epoch is laid out, and why:
- Every epoch has one global order of all N samples that depends only on (seed, epoch): the sample blocks of
  all shards are permuted, then samples are permuted within consecutive windows of `shuffle_buffer_size`
  (a deterministic stand-in for a shuffle buffer, so the order is reproducible from a position alone).
- The ranks split that order into contiguous equal parts, so a rank decodes only the blocks of its part.
  Every rank yields the same number of batches per epoch, so no rank runs out early: the few samples that do not
  fill a batch on every rank (fewer than ranks x (micro batch + 1)) are not read in that epoch, as a DataLoader's
  drop_last leaves them; the next epoch's order is a new permutation, so which samples those are changes. An
  evaluation reads at most one epoch (bertdist.train.evaluation).
- DataLoader workers take turns: worker w makes the rank's batches t+w, t+w+W, ..., and PyTorch returns them
  in order, so the batch sequence does not depend on the number of workers.
- Shards prepared with `--masking dynamic` hold no masks: each sample is masked as it is batched, with
  numbers keyed by (seed, epoch, the sample's index in the manifest) (`bertdist.data.masking`), so its mask
  is new every epoch and the same whichever worker or rank reads it.
- Shards in an object store are read block by block (`bertdist.data.streaming`): each loader process
  fetches the blocks of its next `prefetch_samples` samples ahead of need into a bounded local cache. The
  order, and so every batch, is the same as from local disk.
- Every batch comes with what making it cost (`bertdist.data.load_cost`): the trainer's evidence when ranks
  wait for data.
- The whole position is (epoch, the segment of the epoch being consumed, batches done), the same on every
  rank. `load_state_dict` with the same world size continues exactly; with another world size (or micro
  batch size) it removes what every old rank consumed and splits the rest of the epoch among the new
  ranks: nothing is repeated or lost.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from bertdist import object_store, storage
from bertdist.config.schema import MaskingConfig
from bertdist.data import load_cost, worker_processes
from bertdist.data.batching import FIELDS, Picked, buffer_size, collate, picked_from, views
from bertdist.data.epochs import EpochLayout, Masker, Segment
from bertdist.data.masking import KeyedDraws, VocabInfo, apply_masks
from bertdist.data.samples import Samples
from bertdist.data.shards import read_manifest
from bertdist.data.streaming import StreamSettings
from bertdist.data.tokenizer import open_tokenizer, tokenizer_file
from bertdist.errors import DataError

STATE_VERSION = 1
BATCHES_TRANSFER_SAMPLES = 1024
"""About how many samples a DataLoader worker sends per transfer (whole batches)."""


def _worker_message(error: Exception) -> str:
    """The one line a DataError (or a store's error) said in a DataLoader worker, without torch's "Caught ...
    Original Traceback"."""
    text = str(error)
    marker = f"{type(error).__name__}: "
    return text.rsplit(marker, 1)[1].strip() if "Original Traceback" in text and marker in text else text


def _collate(layout: EpochLayout, epoch: int, positions: np.ndarray, max_seq_length: int, packing: bool):
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
    layout: EpochLayout, epoch: int, blocks: np.ndarray, rows: np.ndarray, max_seq_length: int, packing: bool
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


class _BatchStream(IterableDataset):
    """A rank's batches from an epoch segment on, epoch after epoch, in chunks of `chunk` consecutive batches of
    one segment in one buffer; worker w of W makes chunks w, w+W, ... counted across the epochs, the order in
    which the DataLoader takes them. One stream serves the whole run: a DataLoader started again at each epoch
    forked a new worker each time, a pause of 2-4 s per epoch in training (November 2026)."""

    def __init__(self, loader: "PretrainingLoader", segment: Segment, chunk: int):
        self.layout, self.epoch, self.segment, self.chunk = loader._layout, loader.epoch, segment, chunk
        self.rank, self.max_seq_length, self.packing = loader.rank, loader.max_seq_length, loader.packing

    def __iter__(self) -> Iterator[tuple[torch.Tensor, list[tuple[Any, Any]]]]:
        """Chunks: a buffer of consecutive batches, with each one's (shape, cost)."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        epoch, segment, counted = self.epoch, self.segment, 0
        while True:
            first, end = segment.batches_done, segment.batches_per_rank()
            starts = range(first, end, self.chunk)
            mine = starts[(worker - counted) % workers :: workers]
            counted += len(starts)
            yield from self._chunks(epoch, segment, mine, end)
            epoch = epoch + 1
            segment = Segment.whole_epoch(segment.world_size, segment.micro_batch_size, self.layout.num_samples)

    def _chunks(self, epoch: int, segment: Segment, starts: range, end: int):
        ahead = max(1, -(-self.layout.prefetch_samples // (self.chunk * segment.micro_batch_size)))
        self._prefetch(epoch, segment, starts[:ahead], end)
        for k, start in enumerate(starts):
            self._prefetch(epoch, segment, starts[k + ahead : k + ahead + 1], end)
            parts = [self._made(epoch, segment, batch) for batch in range(start, min(start + self.chunk, end))]
            yield (parts[0][0] if len(parts) == 1 else torch.cat([p[0] for p in parts])), [p[1] for p in parts]

    def _made(self, epoch: int, segment: Segment, batch: int) -> tuple[torch.Tensor, tuple[Any, Any]]:
        """A batch's buffer, with its shape and what making it cost (bertdist.data.load_cost)."""
        positions = segment.batch_positions(self.rank, batch)
        (buffer, shape), cost = load_cost.measured(
            lambda: _collate(self.layout, epoch, positions, self.max_seq_length, self.packing), self.layout.stream
        )
        return buffer, (shape, cost)

    def _prefetch(self, epoch: int, segment: Segment, chunk_starts: range, end: int) -> None:
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
        `bertdist.object_store.use_endpoint`)."""
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
        self.samples = options["samples"]
        """What the shards were prepared as (`--samples`): nsp (sentence pairs, real next-sentence labels), sop
        (sentence-order pairs) or mlm (full sentences; no sentence labels to learn)."""
        self.masking_mode = options.get("masking", "static")
        """static (the masks are in the shards) or dynamic (masked here, by `masking`)."""
        defaults = MaskingConfig()
        self.shard_masking = (
            None
            if self.masking_mode == "dynamic"
            else dataclasses.replace(
                defaults,
                **{f.name: options.get(f.name, getattr(defaults, f.name)) for f in dataclasses.fields(defaults)},
            )
        )
        """The rules the masks in static shards were made by (`bertdist prepare`'s masking flags); None for dynamic
        shards, which `masking` masks."""
        masker = None
        if self.masking_mode == "dynamic":
            masker = Masker(masking, VocabInfo.from_tokenizer(open_tokenizer(vocab_file)), span_bounds)
        if span_bounds and (masker is None or not masking.span_masking):
            raise DataError(
                f"{shard_dir}: span boundaries come from span masking at load time: set data.masking.span_masking "
                "and use shards prepared with --masking dynamic"
                + ("" if masker else f" (these were prepared with --masking {options.get('masking', 'static')})")
            )
        self._layout = EpochLayout(shard_dir, manifest, seed, shuffle_buffer_size, masker, streaming)
        if self._layout.num_samples // world_size < micro_batch_size:
            raise DataError(
                f"{shard_dir}: {self._layout.num_samples} samples cannot give each of {world_size} ranks "
                f"a batch of {micro_batch_size}"
            )
        self._epoch = 0
        self._segment = self._fresh_segment()
        self.costs = load_cost.LoadCosts()
        """What making the batches this rank received cost, since the trainer last took it."""
        if num_workers:
            worker_processes.start_server()

    def _fresh_segment(self) -> Segment:
        return Segment.whole_epoch(self.world_size, self.micro_batch_size, self._layout.num_samples)

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def batches_per_epoch(self) -> int:
        return self._fresh_segment().batches_per_rank()

    def sources(self) -> dict[str, PretrainingLoader]:
        """The loader of each source read, by source: this one, by its directory (a mixture's: one per source, by
        name)."""
        return {self.shard_dir: self}

    def at_start(self) -> bool:
        """Nothing read and nothing restored: a phase's loader as built."""
        return (
            self._epoch == 0
            and self._segment.batches_done == 0
            and self._segment.intervals == [[0, self._layout.num_samples]]
        )

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
                worker_init_fn=worker_processes.WorkerStart(),
                multiprocessing_context=worker_processes.context(),
            )
            if self.num_workers
            else stream
        )
        iterator = iter(batches)
        worker_processes.started(getattr(iterator, "_workers", []))
        try:
            for buffer, made in iterator:
                at = 0
                for shape, cost in made:
                    self.costs.add(cost)
                    while self._segment.batches_done >= self._segment.batches_per_rank():  # the stream's next epoch
                        self._epoch += 1
                        self._segment = self._fresh_segment()
                    shape = tuple(int(x) for x in shape)
                    fields = views(buffer[at : at + buffer_size(shape)], shape)
                    at += buffer_size(shape)
                    self._segment.batches_done += 1
                    yield dict(zip(FIELDS, fields))
        except (DataError, object_store.StorageError) as e:  # the same class, so a store outage is still a requeue
            raise type(e)(_worker_message(e)) from None
        finally:  # the workers end now, not whenever the garbage collector reaches an abandoned iterator
            shutdown = getattr(iterator, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            for worker in getattr(iterator, "_workers", []):  # torch's last resort is SIGTERM, which they ignore
                if worker.is_alive():
                    worker.kill()

    def take_tokens(self) -> dict[str, int]:
        """Tokens per source since the last call: none here, a directory's tokens being the run's tokens_seen (a
        mixture's, `bertdist.data.mixture`, are counted per source)."""
        return {}

    def epochs(self) -> dict[str, int]:
        """Per source, the epochs read to their end: none here (a mixture's are)."""
        return {}

    def samples_at(self, position: dict[str, Any], batches: int) -> list[tuple[str, int]]:
        """(shard file, index in it) of every sample of the `batches` batches this rank reads from `position` (its
        state_dict() then) on, across an epoch's end as iterating does: what a bad step's batch held."""
        epoch = int(position["epoch"])
        segment = Segment(
            position["world_size"], position["micro_batch_size"], position["intervals"], position["batches_done"]
        )
        named = []
        for _ in range(batches):
            if segment.batches_done >= segment.batches_per_rank():
                epoch, segment = epoch + 1, self._fresh_segment()
            named += self._layout.sample_names(epoch, segment.batch_positions(self.rank, segment.batches_done))
            segment.batches_done += 1
        return named

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
        saved = Segment(state["world_size"], state["micro_batch_size"], state["intervals"], state["batches_done"])
        if saved.world_size == self.world_size and saved.micro_batch_size == self.micro_batch_size:
            self._segment = saved
        else:  # new ranks share what the old ranks left of this epoch
            self._segment = Segment(self.world_size, self.micro_batch_size, saved.remaining())
