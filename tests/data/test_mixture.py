"""MixtureLoader: shares within a point of the plan, the same sequence from the same config, exact resume at the same
and at another world size, a source that runs out, and the shares switching at a phase boundary."""

from __future__ import annotations

import itertools

import pytest

from bertdist.config import Config, PhaseConfig
from bertdist.data import DataError
from bertdist.data.loader import PretrainingLoader
from bertdist.data.mixture import MixtureLoader, SourceSchedule, mixture_shares
from bertdist.train.loaders import train_loader
from tests.conftest import TEST_SEQ_LENGTH
from tests.data.test_loader import _fingerprints, tokens_by_sample

SHARES = [0.4, 0.25, 0.2, 0.1, 0.05]


def test_each_source_share_is_within_a_point_of_the_plan_over_10000_batches():
    picks = [SourceSchedule(SHARES, seed=3, phase=0).source(b) for b in range(10_000)]
    for k, share in enumerate(SHARES):
        assert abs(picks.count(k) / len(picks) - share) < 0.01, (k, picks.count(k))
    # and over every shorter stretch of it, within a batch or two of its plan per hundred
    for start in range(0, 10_000, 500):
        window = picks[start : start + 100]
        assert all(abs(window.count(k) - 100 * share) <= 2 for k, share in enumerate(SHARES))


def test_the_sequence_depends_on_seed_phase_and_batch_only():
    one, again = SourceSchedule(SHARES, 3, 1), SourceSchedule(SHARES, 3, 1)
    assert [one.source(b) for b in range(500)] == [again.source(b) for b in range(500)]
    assert [one.source(b) for b in range(500)] != [SourceSchedule(SHARES, 3, 2).source(b) for b in range(500)]
    assert [one.source(b) for b in range(400, 500)] == [again.source(b) for b in range(400, 500)]


def test_a_temperature_weighs_sources_by_their_tokens():
    shares = mixture_shares({"a": 1.0, "b": 1.0}, {"a": 100, "b": 400}, 0.5)
    assert shares == pytest.approx({"a": 1 / 3, "b": 2 / 3})
    assert mixture_shares({"a": 3.0, "b": 1.0}, None, None) == pytest.approx({"a": 0.75, "b": 0.25})
    assert mixture_shares({"a": 2.0, "b": 1.0}, {"a": 100, "b": 400}, 1.0) == pytest.approx({"a": 1 / 3, "b": 2 / 3})
    # a high temperature: tokens^50 overflowed a float (an OverflowError as the loaders were built)
    assert mixture_shares({"a": 1.0, "b": 1.0}, {"a": 10**9, "b": 2 * 10**9}, 50.0) == pytest.approx(
        {"a": 1 / (1 + 2**50), "b": 2**50 / (1 + 2**50)}
    )


def _mixture(shards, vocab, rank=0, world_size=1, exhausted="repeat", micro_batch_size=4):
    loaders = {
        name: PretrainingLoader(
            shards,
            vocab,
            max_seq_length=TEST_SEQ_LENGTH,
            micro_batch_size=micro_batch_size,
            rank=rank,
            world_size=world_size,
            seed=seed,
            shuffle_buffer_size=300,
        )
        for name, seed in (("a", 5), ("b", 6), ("c", 7))
    }
    return MixtureLoader(loaders, {"a": 0.5, "b": 0.3, "c": 0.2}, 11, 0, exhausted, "data.phases.0")


def _read(loader, n):
    """(source, sample fingerprints) of the next n batches."""
    it, out = iter(loader), []
    for batch in itertools.islice(it, n):
        (source,) = [name for name, tokens in loader.take_tokens().items() if tokens]
        out.append((source, _fingerprints(batch)))
    it.close()
    return out


def test_resume_in_the_middle_continues_exactly(tiny_shards, tiny_vocab):
    whole = _read(_mixture(tiny_shards, tiny_vocab), 30)
    first = _mixture(tiny_shards, tiny_vocab)
    assert _read(first, 17) == whole[:17]
    resumed = _mixture(tiny_shards, tiny_vocab)
    resumed.load_state_dict(first.state_dict())
    assert _read(resumed, 13) == whole[17:]
    assert abs([s for s, _ in whole].count("a") - 15) <= 1  # half of 30, as planned


def test_resume_at_another_world_size_neither_repeats_nor_loses(tiny_shards, tiny_vocab):
    """2 ranks read 12 micro batches each; 3 ranks go on: every rank steps the same source, and per source no sample
    of its epoch is read twice; what 2 ranks would have read of a source, 3 ranks read of it."""
    old = [_mixture(tiny_shards, tiny_vocab, r, 2) for r in range(2)]
    before = [_read(loader, 12) for loader in old]
    assert [s for s, _ in before[0]] == [s for s, _ in before[1]]
    new = [_mixture(tiny_shards, tiny_vocab, r, 3) for r in range(3)]
    for loader in new:
        loader.load_state_dict(old[0].state_dict())
    after = [_read(loader, 12) for loader in new]
    assert [s for s, _ in after[0]] == [s for s, _ in after[1]] == [s for s, _ in after[2]]
    uninterrupted = _read(_mixture(tiny_shards, tiny_vocab, 0, 2), 24)
    assert [s for s, _ in after[0]] == [s for s, _ in uninterrupted[12:]]
    for source in "abc":
        seen = [f for reads in before + after for s, batch in reads if s == source for f in batch]
        assert len(seen) == len(set(seen)), source


def test_a_source_that_runs_out_repeats_counted_as_epochs_or_stops_naming_it(tiny_shards, tiny_vocab):
    loader = _mixture(tiny_shards, tiny_vocab, micro_batch_size=64)
    per_epoch = loader.loaders["a"].batches_per_epoch
    _read(loader, 4 * per_epoch)
    assert loader.epochs()["a"] >= 1
    stopping = _mixture(tiny_shards, tiny_vocab, exhausted="stop", micro_batch_size=64)
    with pytest.raises(DataError, match=r"data.sources.a \(.*\): read to its end before data.phases.0 ends"):
        _read(stopping, 4 * per_epoch)


def test_a_checkpoint_of_another_mixture_is_refused(tiny_shards, tiny_vocab):
    state = _mixture(tiny_shards, tiny_vocab).state_dict()
    state["shares"] = {"a": 0.9, "b": 0.1}
    with pytest.raises(DataError, match="a mixture changes at a phase boundary"):
        _mixture(tiny_shards, tiny_vocab).load_state_dict(state)


def test_the_shares_switch_at_the_phase_boundary(tiny_shards, tiny_vocab):
    """Phase 0 reads a:b 3:1, phase 1 1:3, as the trainer steps them: each phase's batches keep its own plan."""
    cfg = Config()
    cfg.data.vocab_file, cfg.data.sources, cfg.data.shuffle_buffer_size = tiny_vocab, {"a": tiny_shards}, 300
    cfg.data.sources["b"] = tiny_shards
    cfg.data.phases = [
        PhaseConfig(mixture={"a": 3.0, "b": 1.0}, max_seq_length=TEST_SEQ_LENGTH, micro_batch_size=4, steps=50),
        PhaseConfig(mixture={"a": 1.0, "b": 3.0}, max_seq_length=TEST_SEQ_LENGTH, micro_batch_size=4, steps=50),
    ]
    cfg.train.global_batch_size = 8  # 2 micro batches a step
    loaders = [train_loader(cfg, i, workers=0) for i in range(2)]
    sources, index, batches = [], -1, iter(())
    for step in range(100):
        if cfg.phase_at(step)[0] != index:
            index = cfg.phase_at(step)[0]
            batches = iter(loaders[index])
        for _ in range(2):
            next(batches)
            sources.append(next(n for n, t in loaders[index].take_tokens().items() if t))
    assert abs(sources[:100].count("a") - 75) <= 2 and abs(sources[100:].count("b") - 75) <= 2


def test_a_phase_continues_each_source_an_earlier_phase_read(tiny_shards, tiny_vocab):
    """Phases 0 and 2 mix a and b, phase 1 reads c alone, as the trainer steps them (bertdist.train.loaders
    continue_sources): phase 2 reads on where phase 0 left a and b, at another micro batch size. Each phase's
    loaders start at the epoch's beginning; they read phase 0's samples again, in the same order."""
    from bertdist.train.loaders import continue_sources, source_positions

    cfg = Config()
    cfg.data.vocab_file, cfg.data.shuffle_buffer_size = tiny_vocab, 300
    cfg.data.sources = {"a": tiny_shards, "b": tiny_shards, "c": tiny_shards}  # one directory, three positions
    mix = dict(max_seq_length=TEST_SEQ_LENGTH, steps=10)
    cfg.data.phases = [
        PhaseConfig(mixture={"a": 1.0, "b": 1.0}, micro_batch_size=4, **mix),
        PhaseConfig(mixture={"c": 1.0}, micro_batch_size=4, **mix),
        PhaseConfig(mixture={"a": 1.0, "b": 1.0}, micro_batch_size=2, **mix),
    ]
    loaders = [train_loader(cfg, i, workers=0) for i in range(3)]
    read: dict[str, dict] = {}
    seen: dict[int, list] = {}
    for index, loader in enumerate(loaders):
        if index:
            read.update(source_positions(loaders[index - 1]))
        continue_sources(loader, read)
        seen[index] = _read(loader, 10)
    for source in "ab":
        first, again = ([f for s, batch in seen[i] if s == source for f in batch] for i in (0, 2))
        assert first and again and not set(first) & set(again), source
    fresh = train_loader(cfg, 2, workers=0)  # without: the same samples as phase 0's, in the same order
    phase_0_a = [f for s, batch in seen[0] if s == "a" for f in batch]
    assert [f for s, batch in _read(fresh, 10) if s == "a" for f in batch][:4] == phase_0_a[:4]


def test_the_data_wait_warning_reads_the_costs_of_every_source(tiny_shards, tiny_vocab):
    mixture = _mixture(tiny_shards, tiny_vocab)
    batches = list(itertools.islice(iter(mixture), 10))
    costs = mixture.costs.take()
    assert costs["load_batches"] == len(batches) and costs["load_seconds"] > 0
    assert mixture.costs.take()["load_batches"] == 0  # taken: they start again from zero
    assert (mixture.num_workers, mixture.masking_mode, mixture.shard_dir) == (0, "static", tiny_shards)


def test_a_position_names_each_sample_of_the_mixtures_next_batches_with_its_source(tiny_shards, tiny_vocab):
    """What a bad step's batch held in a mixture phase (bertdist.train.rollback): from a saved position, each named
    (SOURCE/shard file, index) holds the tokens of a row the next batches have, every row named once."""
    tokens = tokens_by_sample(tiny_shards)
    mixture = _mixture(tiny_shards, tiny_vocab)
    batches = iter(mixture)
    for _ in range(7):
        next(batches)
    named = mixture.samples_at(mixture.state_dict(), 5)
    read = [next(batches) for _ in range(5)]
    held = [row[: int(mask.sum())].tolist() for b in read for row, mask in zip(b["input_ids"], b["attention_mask"])]
    assert {source.split("/")[0] for source, _ in named} <= {"a", "b", "c"} and len(named) == len(held) == 5 * 4
    assert sorted(tokens[(source.split("/", 1)[1], index)] for source, index in named) == sorted(held)
