"""The signals that stop a command: SIGTERM and SIGHUP handled as Ctrl-C outside a run's own loop (their handlers put
back after the command, also where Ray replaced them, and in nested commands), and SIGHUP a stop of train and
finetune except under `nohup`."""

from __future__ import annotations

import os
import signal

import pytest

from bertdist import stop_signals
from bertdist.stop_signals import Terminated, take_back, terminated_as_interrupted


@pytest.fixture(autouse=True)
def default_handlers():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    for s in before:
        signal.signal(s, signal.SIG_DFL)
    yield
    for s, handler in before.items():
        signal.signal(s, handler)


def test_the_handlers_from_before_are_back_after_a_command_a_library_replaced_them_in():
    """`ray.init` put its own SIGTERM handler in; take_back put bertdist's back, and bertdist's stayed after the
    command: a host program's own handler never came back, and a nested command's end forgot the outer's."""
    with terminated_as_interrupted():
        signal.signal(signal.SIGTERM, lambda *_: None)  # what ray.init does
        take_back()
        with pytest.raises(Terminated) as stopped:
            os.kill(os.getpid(), signal.SIGTERM)
        assert stopped.value.signum == signal.SIGTERM
        with terminated_as_interrupted():  # a command run inside another (main() called again)
            pass
        signal.signal(signal.SIGTERM, lambda *_: None)
        take_back()  # the outer block's handlers, though the inner one ended
        assert signal.getsignal(signal.SIGTERM) is stop_signals._raise
        signal.signal(signal.SIGTERM, lambda *_: None)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL == signal.getsignal(signal.SIGHUP)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
    with terminated_as_interrupted():
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


def test_sighup_stops_a_run_at_its_step_except_under_nohup():
    """A closed terminal raised Terminated in the middle of a training step (no checkpoint); under nohup it must
    change nothing."""
    from bertdist.train.stopping import StopFlag

    flag = StopFlag("test")
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        assert flag.signum == signal.SIGHUP and stop_signals.stop_requested()
    finally:
        flag.close()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    flag = StopFlag("test")
    try:
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        flag.close()
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
