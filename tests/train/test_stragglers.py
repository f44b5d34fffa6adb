"""Naming a slow rank (bertdist.train.stragglers): the per-rank times ride in the step's sums, and a rank whose time
outside collectives exceeds the factor times the other ranks' median in two windows running is named once, with its
host.
The end-to-end test (a real 2-rank job whose rank 1 is slowed by SIGSTOP/SIGCONT) is in test_trainer.py."""

from __future__ import annotations

from bertdist.train import stragglers
from bertdist.train.metrics import StepSums


def step_sums(busy: list[float], wait: list[float]) -> dict[str, float]:
    """What the all-reduce of every rank's `add_rank_times` gives."""
    total: dict[str, float] = {}
    for rank, (b, w) in enumerate(zip(busy, wait)):
        sums = StepSums("cpu")
        stragglers.add_rank_times(sums, rank, len(busy), b, w)
        for name, value in sums.values.items():
            total[name] = total.get(name, 0.0) + value
    return total


def watch(factor=1.5, window=4, hosts=("a", "b", "c")):
    """A watch past its run's first step (which it leaves out)."""
    lines, tags = [], {}
    w = stragglers.StragglerWatch(list(hosts), factor, window, lines.append, tags.update)
    w.add(step_sums([0.1] * len(hosts), [0.0] * len(hosts)), 0)
    return w, lines, tags


def test_a_rank_slower_than_the_others_median_by_the_factor_in_two_windows_running_is_named_once_with_its_host():
    lines, tags = [], {}
    w = stragglers.StragglerWatch(["a", "b", "c"], 1.5, 4, lines.append, tags.update)
    w.add(step_sums([5.0, 0.11, 0.10], [4.9, 0.0, 0.0]), 0)  # the start: rank 0 waits for its loader; left out
    for step in range(1, 8):
        w.add(step_sums([0.10, 0.11, 0.30], [0.0, 0.0, 0.2]), step)
    assert lines == []  # one window of two is complete
    w.add(step_sums([0.10, 0.11, 0.30], [0.0, 0.0, 0.2]), 8)
    (line,) = lines
    assert line.startswith("rank 2 on c is slow: over steps 5-8 it spent 0.300 s a step outside collectives")
    assert "(0.200 s waiting for data), 2.9x the other ranks' median 0.105 s (train.straggler_factor=1.5)" in line
    assert line.endswith(", as over steps 1-4; every rank waits for it")
    assert tags == {"bertdist.straggler.rank2": line}
    for step in range(9, 17):  # still slow: not named again
        w.add(step_sums([0.10, 0.11, 0.30], [0.0, 0.0, 0.2]), step)
    assert len(lines) == 1


def test_one_slow_window_names_no_one_and_the_count_starts_again():
    """A checkpoint write or a loader restart slows one window of any rank: only two windows running name it."""
    w, lines, _ = watch()
    pattern = [[0.10, 0.11, 0.30], [0.10, 0.11, 0.10]] * 3  # slow, fine, slow, fine, ...
    for window, busy in enumerate(pattern):
        for step in range(4 * window + 1, 4 * window + 5):
            w.add(step_sums(busy, [0.0, 0.0, 0.0]), step)
    assert lines == []


def test_ranks_within_the_factor_or_a_watch_turned_off_or_a_single_rank_name_no_one():
    w, lines, _ = watch()
    for step in range(1, 9):
        w.add(step_sums([0.10, 0.11, 0.14], [0.0, 0.0, 0.0]), step)
    off, off_lines, _ = watch(factor=0)
    alone, alone_lines, _ = watch(hosts=("a",))
    for step in range(1, 9):
        off.add(step_sums([0.1, 0.1, 0.9], [0.0, 0.0, 0.0]), step)
        alone.add(step_sums([0.9], [0.0]), step)
    assert lines == off_lines == alone_lines == []


def test_each_ranks_times_per_step_are_metrics():
    totals = step_sums([0.2, 0.4], [0.05, 0.1])
    got = stragglers.rank_metrics({k: 2 * v for k, v in totals.items()}, 2, 2)
    assert got == {
        "ranks/r00000_busy_seconds": 0.2,
        "ranks/r00000_data_wait_seconds": 0.05,
        "ranks/r00001_busy_seconds": 0.4,
        "ranks/r00001_data_wait_seconds": 0.1,
    }


def test_a_restart_ends_the_window_and_leaves_out_its_first_step():
    """A new phase or a rollback restarts the loaders: the slow window before it does not count toward two
    running, and the step after it (each rank waiting for its first batch) is left out."""
    w, lines, _ = watch()
    for step in range(1, 5):
        w.add(step_sums([0.10, 0.11, 0.30], [0.0, 0.0, 0.0]), step)
    w.restart()
    w.add(step_sums([0.10, 0.11, 9.0], [0.0, 0.0, 8.9]), 3)  # a rollback went back to step 2: left out
    for step in range(4, 8):
        w.add(step_sums([0.10, 0.11, 0.30], [0.0, 0.0, 0.0]), step)
    assert lines == []  # one window since the restart
    for step in range(8, 12):
        w.add(step_sums([0.10, 0.11, 0.30], [0.0, 0.0, 0.0]), step)
    (line,) = lines
    assert "over steps 8-11" in line and "as over steps 4-7;" in line and "0.300 s a step" in line
