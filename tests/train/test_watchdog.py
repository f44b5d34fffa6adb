"""The stall watchdog against a real TCPStore, two ranks in one process (their threads are the ranks'
watchdogs; a rank "stops" by ending its heartbeat thread, as SIGSTOP would). The end-to-end test with a
SIGSTOPped rank of a real job is in test_trainer.py."""

from __future__ import annotations

import datetime
import socket
import threading
import time

import pytest
import torch.distributed as dist

from bertdist.errors import REQUEUE_EXIT_CODE
from bertdist.train.ports import free_tcp_port
from bertdist.train.watchdog import StallWatchdog, beat_interval_s

STALL_S = 1.0


@pytest.fixture
def store_port():
    port = free_tcp_port()
    store = dist.TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=10)
    )
    yield port
    del store


class Exits:
    def __init__(self):
        self.codes: dict[int, int] = {}
        self.done = threading.Event()

    def for_rank(self, rank: int):
        def exit_process(code: int) -> None:
            self.codes[rank] = code
            self.done.set()

        return exit_process


def _pair(port: int, exits: Exits) -> list[StallWatchdog]:
    return [StallWatchdog(r, 2, "127.0.0.1", port, STALL_S, exit_process=exits.for_rank(r)) for r in range(2)]


def test_a_silent_rank_is_named_with_its_host(store_port, capsys):
    exits = Exits()
    dogs = _pair(store_port, exits)
    for dog in dogs:
        dog.start()
    dogs[1].close()  # rank 1 stops beating, like a SIGSTOPped process
    started = time.monotonic()
    assert exits.done.wait(timeout=15)
    dogs[0].close()
    assert exits.codes == {0: REQUEUE_EXIT_CODE}
    assert time.monotonic() - started < STALL_S + 4 * beat_interval_s(STALL_S) + 6  # not the collective's 30 min
    err = capsys.readouterr().err
    assert (
        f"[rank 0 on {socket.gethostname()}]" in err
        and f"rank 1 on {socket.gethostname()}" in err
        and "sent no heartbeat" in err
    )


@pytest.mark.parametrize("watching", [0, 1])
def test_a_live_rank_stuck_behind_is_named_by_the_ranks_waiting_for_it_and_by_itself(store_port, capsys, watching):
    """Rank 1 is stuck at step 3 and rank 0 at step 5; the rank that is not watching keeps reporting
    progress at its step, so only the watching rank fires, and it names rank 1 as the one behind."""
    exits = Exits()
    dogs = _pair(store_port, exits)
    steps = {0: 5, 1: 3}
    for rank, dog in enumerate(dogs):
        dog.start()
        dog.progress(steps[rank])
    other = dogs[1 - watching]
    deadline = time.monotonic() + 15
    while not exits.done.wait(timeout=0.05):
        assert time.monotonic() < deadline, "the watchdog did not fire"
        other.progress(steps[1 - watching])
    for dog in dogs:
        dog.close()
    err = capsys.readouterr().err
    assert exits.codes == {watching: REQUEUE_EXIT_CODE}
    if watching == 0:
        assert "rank 1 on" in err and "is alive but stuck at step 3 while this rank waits at step 5" in err
    else:
        assert "[rank 1 on" in err and "this rank is the one behind: stuck at step 3 while rank(s) 0 wait" in err


def test_progress_keeps_the_watchdog_quiet(store_port):
    exits = Exits()
    dog = StallWatchdog(0, 1, "127.0.0.1", store_port, STALL_S, exit_process=exits.for_rank(0))
    dog.start()
    deadline = time.monotonic() + 3 * STALL_S
    while time.monotonic() < deadline:
        dog.progress(1)
        time.sleep(0.05)
    dog.close()
    assert exits.codes == {}


def test_no_watchdog_when_the_timeout_is_zero(store_port):
    dog = StallWatchdog(0, 1, "127.0.0.1", store_port, 0.0, exit_process=lambda code: pytest.fail("fired"))
    dog.start()
    time.sleep(0.5)
    dog.close()
    assert dog._thread is None
