"""Why the ranks waited for data (bertdist.train.data_wait): above the threshold, one line naming the cause the
loader's measured costs and the configuration point at, said once, and again only after the wait recovered."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from bertdist.data.load_cost import LoadCosts
from bertdist.train import data_wait
from bertdist.train.metrics import Interval, StepSums

# Two ranks on a 16-core host, 2 workers each, consuming 10 batches a second; a batch takes 150 ms to make: 1.5
# workers' worth, so the workers keep up.
FACTS = data_wait.Facts(
    wait_fraction=0.3,
    batches_per_second=10.0,
    load_batches=200.0,
    load_seconds=30.0,
    store_wait_seconds=0.0,
    blocks_fetched=0.0,
    workers=2,
    source="/data/shards",
    masking_at_load=False,
    ranks_per_host=2,
    cores=16,
)


def test_a_store_that_the_batches_wait_for_is_named_with_its_cache_misses():
    name, text = data_wait.cause(
        dataclasses.replace(FACTS, source="s3://corpus/shards", store_wait_seconds=20.0, blocks_fetched=42)
    )
    assert name == "storage"
    assert text.startswith("reading shards from s3://corpus/shards: 42 cache misses in the interval, and making a ")
    assert "batch waited 100 ms of its 150 ms for the store; raise storage.fetch_threads" in text


def test_a_store_that_is_waited_for_less_than_half_the_time_is_not_the_cause():
    name, _ = data_wait.cause(dataclasses.replace(FACTS, source="s3://corpus/shards", store_wait_seconds=10.0))
    assert name == "bursts"


def test_no_workers_or_too_few_with_cores_to_spare_asks_for_more_workers():
    name, text = data_wait.cause(dataclasses.replace(FACTS, workers=0))
    assert name == "workers"
    assert text == (
        "the ranks make their own batches: decoding a batch takes 150 ms and a rank consumes one every 100 ms; raise "
        "data.loader_workers (now 0)"
    )
    name, text = data_wait.cause(dataclasses.replace(FACTS, workers=1))
    assert name == "workers"
    assert (
        "cannot keep up: decoding a batch takes 150 ms and a rank consumes one every 100 ms, 1.5 workers' worth" in text
    )
    assert text.endswith("raise data.loader_workers (now 1)")


def test_too_few_workers_without_cores_for_more_is_the_decoding_and_masking_at_load_time_says_so():
    name, text = data_wait.cause(dataclasses.replace(FACTS, workers=1, cores=4, masking_at_load=True))
    assert name == "decoding"
    assert text == (
        "reading, decoding and masking (the shards are masked at load time) a batch takes 150 ms and a rank "
        "consumes one every 100 ms: 1.5 workers' worth per rank, more than 4 cores run beside 2 rank(s) with 1 "
        "workers each; shards prepared with --masking static skip the masking"
    )


def test_workers_that_keep_up_on_average_mean_bursts():
    name, text = data_wait.cause(FACTS)
    assert name == "bursts" and "keep up on average" in text and "1.5 workers' worth" in text


def interval(steps: int, wait_s: float, seconds: float = 10.0) -> Interval:
    """A logging interval of one rank that waited `wait_s` of `seconds`, with no workers."""
    at = Interval(start=0.0)
    for _ in range(steps):
        costs = LoadCosts()
        costs.add((wait_s / steps, 0.0, 0))
        sums = StepSums("cpu")
        data_wait.add_load_costs(sums, [SimpleNamespace(costs=costs)])
        at.add({**sums.values, "micro_batches": 1.0})
    at.seconds = lambda: seconds  # type: ignore[method-assign]
    return at


@pytest.fixture
def watch():
    lines, tags = [], {}
    w = data_wait.DataWaitWatch(0.1, 1, 1, lines.append, tags.update, cores=2)
    return w, lines, tags


LOADER = SimpleNamespace(num_workers=0, shard_dir="/data/shards", masking_mode="static")


def test_the_first_interval_is_not_judged_and_a_long_wait_is_said_once(watch):
    w, lines, tags = watch
    w.judge(10, 0.5, interval(10, 5.0), LOADER)  # the loader's start
    assert lines == []
    w.judge(20, 0.3, interval(10, 3.0), LOADER)
    (line,) = lines
    assert line == (
        "data wait 30% of steps 11-20 (train.data_wait_warn_fraction=0.1): the ranks make their own batches: "
        "decoding a batch takes 300 ms and a rank consumes one every 1000 ms; raise data.loader_workers (now 0)"
    )
    assert tags == {"bertdist.data_wait": line}
    w.judge(30, 0.3, interval(10, 3.0), LOADER)
    assert len(lines) == 1


def test_said_again_only_after_the_wait_recovered_and_never_when_off(watch):
    w, lines, _ = watch
    for step, fraction in ((10, 0.0), (20, 0.2), (30, 0.2), (40, 0.1), (50, 0.25)):
        w.judge(step, fraction, interval(10, fraction * 10), LOADER)
    assert [line.split(" (")[0] for line in lines] == ["data wait 20% of steps 11-20", "data wait 25% of steps 41-50"]
    off_lines: list[str] = []
    off = data_wait.DataWaitWatch(0.0, 1, 1, off_lines.append, {}.update, cores=2)
    for step in (10, 20, 30):
        off.judge(step, 0.9, interval(10, 9.0), LOADER)
    assert off_lines == []


def test_a_burst_is_said_only_when_it_lasts_two_intervals(watch):
    """Workers that keep up on average and still kept the ranks waiting: after a loader's start or a rollback that
    is one interval, not worth a line; two in a row are."""
    w, lines, _ = watch
    workers = SimpleNamespace(num_workers=2, shard_dir="/data/shards", masking_mode="static")
    w.judge(10, 0.0, interval(10, 0.0), workers)
    w.judge(20, 0.3, interval(10, 1.0), workers)  # 0.1 s a batch, one consumed a second: 0.1 workers' worth
    assert lines == []
    w.judge(30, 0.05, interval(10, 0.5), workers)  # recovered: the burst is forgotten
    w.judge(40, 0.3, interval(10, 1.0), workers)
    assert lines == []
    w.judge(50, 0.3, interval(10, 1.0), workers)
    (line,) = lines
    assert line.startswith("data wait 30% of steps 41-50") and "keep up on average" in line
