"""Bad steps (bertdist.train.rollback): what is judged bad, and when a rollback is refused and the run stops. The
end-to-end rollback of a real 2-rank job with a NaN step is in test_trainer.py."""

from __future__ import annotations

import pytest

from bertdist.train.rollback import LossWatch, Rollbacks


def test_a_non_finite_loss_is_bad_at_once_and_a_spike_only_once_the_window_is_full():
    watch = LossWatch(sigmas=4.0, window_steps=5)
    assert watch.judge(float("nan")) == "the loss is nan" and watch.judge(float("inf")) == "the loss is inf"
    assert watch.judge(9.0) is None  # no window yet: no spike is judged
    for loss in (3.0, 3.1, 2.9, 3.0):
        assert watch.judge(loss) is None
    assert list(watch.recent) == [9.0, 3.0, 3.1, 2.9, 3.0]
    for loss in (3.0, 3.1, 2.9, 3.0, 3.05):  # the early 9.0 leaves the window
        assert watch.judge(loss) is None
    reason = watch.judge(3.5)
    assert reason is not None and reason.startswith("the loss 3.5000 is ") and "train.loss_spike_sigmas=4" in reason
    assert list(watch.recent)[-1] == 3.05  # a spike does not join the window
    assert LossWatch(sigmas=0.0, window_steps=2).judge(1e9) is None


@pytest.mark.parametrize(
    "done, checkpoint_step, same_phase, refused",
    [
        (3, 4, True, "after 3 rollback(s) (train.max_rollbacks=3)"),
        (0, None, True, "there is no checkpoint to roll back to yet"),
        (0, 4, False, "the last checkpoint (step 4) is of an earlier phase"),
        (2, 4, True, None),
    ],
)
def test_a_rollback_is_refused_past_the_cap_with_no_checkpoint_or_across_a_phase(
    tmp_path, done, checkpoint_step, same_phase, refused
):
    rollbacks = Rollbacks(3, tmp_path, is_main=True)
    rollbacks.done = done
    got = rollbacks.refusal(9, "the loss is nan", checkpoint_step, same_phase)
    assert (
        got == refused if refused is None else got.startswith("stopping at step 9: the loss is nan") and refused in got
    )
