"""Bad steps (bertdist.train.rollback): what is judged bad, when a rollback is refused and the run stops, the
replay that tells a transient fault from bad data, and the learning-rate scale. The end-to-end rollbacks of real
2-rank jobs with a NaN step are in test_trainer.py."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bertdist.config.schema import TrainConfig
from bertdist.tracking.base import Tracker
from bertdist.train import run_events, train_state
from bertdist.train.rollback import LossWatch, Rollbacks

NAN = float("nan")


class Reader:
    """A loader as Rollbacks.skip sees it: a position, and batches that move it."""

    def __init__(self):
        self.done = self.tokens = 0

    def state_dict(self):
        return {"epoch": 0, "batches_done": self.done}

    def batches(self):
        while True:
            self.done += 1
            self.tokens += 64  # what a mixture counts per source as it yields a batch
            yield {}

    def take_tokens(self) -> dict[str, int]:
        taken, self.tokens = self.tokens, 0
        return {"web": taken}


def rollbacks(tmp_path, resumed=None, **train) -> tuple[Rollbacks, list[str]]:
    said: list[str] = []
    return Rollbacks(TrainConfig(**train), tmp_path, True, resumed, said.append, lambda tags: None), said


def events(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]


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
    watch, _ = rollbacks(tmp_path, max_rollbacks=3)
    watch.done = done
    got = watch.refusal(9, "the loss is nan", checkpoint_step, same_phase)
    assert (
        got == refused if refused is None else got.startswith("stopping at step 9: the loss is nan") and refused in got
    )


def test_a_step_replayed_before_the_bad_one_does_not_join_the_window_again():
    watch = LossWatch(sigmas=4.0, window_steps=3)
    for loss in (3.0, 3.1, 2.9):
        watch.judge(loss)
    assert watch.judge(3.0, learn=False) is None and list(watch.recent) == [3.0, 3.1, 2.9]
    assert watch.judge(NAN, learn=False) == "the loss is nan"


def test_a_replay_that_comes_out_good_is_a_transient_fault_and_skips_nothing(tmp_path):
    watch, said = rollbacks(tmp_path, rollback_lr_factor=0.5)
    watch.micro_batches_since_save = 4  # steps 5 and 6, 2 micro batches each
    watch.begin(6, "the loss is nan", 4, NAN, batch=None)
    assert said[-1] == (
        "step 6: the loss is nan: rolled back to the checkpoint of step 4 to replay steps 5-6 (train.replay_bad_steps)"
    )
    assert (watch.done, watch.micro_batches_since_save, watch.learns(5), watch.learns(6)) == (1, 0, False, True)
    reader = Reader()
    watch.skip(reader.batches(), reader)
    assert reader.done == 0 and not (tmp_path / "events.jsonl").exists()
    watch.replayed(5, 3.0)
    assert len(said) == 1
    watch.replayed(6, 3.1)
    assert said[-1] == (
        "replayed steps 5-6 from the checkpoint of step 4: the loss at step 6 is now 3.1000 (was nan): a transient "
        "fault, not the data; nothing skipped"
    )
    (event,) = events(tmp_path)
    assert (event["event"], event["verdict"], event["step"], event["loss_now"]) == ("replay", "transient", 6, 3.1)
    assert event["loss"] == "nan" and watch.lr_scale == 1.0 and not watch.replaying and watch.learns(5)
    assert run_events.lines(tmp_path) == [
        "replay 1: at step 6 (the loss is nan) replayed from step 4: the loss is now 3.1000: a transient fault, "
        "nothing skipped"
    ]


def test_a_replay_that_goes_bad_again_names_the_batch_skips_it_and_counts_once(tmp_path):
    """Steps 5-6 (4 micro batches) are replayed from step 4 and step 6 is bad again: 4 skipped, the batch named, one
    rollback counted even at the cap, the learning rate halved. Step 5 after it (2 more micro batches) goes bad: its
    replay first skips the 4 again, quietly; bad again, all 6 are skipped and the learning rate is a quarter."""
    watch, said = rollbacks(tmp_path, max_rollbacks=1, rollback_lr_factor=0.5)
    watch.micro_batches_since_save = 4
    watch.begin(6, "the loss is nan", 4, NAN, batch=None)
    watch.micro_batches_since_save += 4  # the replay reads them again
    assert watch.refusal(6, "the loss is nan", 4, True) is None  # counted when it first went bad
    batch = [[["shard_00001.bin", 3], ["shard_00001.bin", 9]], [["shard_00004.bin", 7], ["shard_00001.bin", 1]]]
    watch.begin(6, "the loss is nan", 4, NAN, batch=batch)
    reader = Reader()
    watch.skip(reader.batches(), reader)
    assert (reader.done, watch.done, watch.lr_scale, watch.replaying) == (4, 1, 0.5, {})
    assert reader.take_tokens() == {"web": 0}  # skipped, never trained on: not counted as the source's tokens
    assert said[-1] == (
        "step 6: the loss is nan again in its replay: the data, not a transient fault (its batch: 4 samples: "
        "shard_00001.bin 3, 9, 1; shard_00004.bin 7): rolled back to the checkpoint of step 4 and skipped the 4 micro "
        "batches that steps 5-6 read (this rank's loader: epoch 0 batches 0-4); rollback 1 of train.max_rollbacks=1; "
        "learning rate scale 0.5 (train.rollback_lr_factor=0.5)"
    )
    (event,) = events(tmp_path)
    assert (event["verdict"], event["batch"], event["skipped_micro_batches"], event["lr_scale"]) == (
        "data",
        batch,
        4,
        0.5,
    )
    assert watch.refusal(5, "the loss is nan", 4, True).startswith("stopping at step 5")  # a new bad step: the cap

    watch.max_rollbacks = 2
    watch.micro_batches_since_save += 2  # step 5 on the data after the skipped window
    watch.begin(5, "the loss is nan", 4, NAN, batch=None)
    reader = Reader()
    watch.skip(reader.batches(), reader)
    assert (reader.done, watch.micro_batches_since_save, len(events(tmp_path))) == (4, 4, 1)
    watch.micro_batches_since_save += 2
    watch.begin(5, "the loss is nan", 4, NAN, batch=batch)
    reader = Reader()
    watch.skip(reader.batches(), reader)
    assert (reader.done, watch.done, watch.lr_scale) == (6, 2, 0.25)


def test_without_replays_every_rollback_skips_and_the_count_and_scale_continue_after_a_resume(tmp_path):
    watch, said = rollbacks(tmp_path, replay_bad_steps=False, rollback_lr_factor=0.5)
    for step in (6, 7):
        watch.micro_batches_since_save += 4
        watch.begin(step, "judged bad", 4, 9.0, batch=None)
        watch.skip(iter(Reader().batches()), Reader())
    assert (watch.done, watch.lr_scale) == (2, 0.25) and said[-1].endswith(
        "learning rate scale 0.25 (train.rollback_lr_factor=0.5)"
    )
    assert "verdict" not in events(tmp_path)[-1]
    state = train_state.TrainState(8, 0, 0, 2, [], [], {}, rollbacks=watch.done, lr_scale=watch.lr_scale)
    resumed = train_state.parse_train_state(train_state.state_json(state).encode(), "here")
    again, _ = rollbacks(tmp_path, resumed, replay_bad_steps=False, rollback_lr_factor=0.5)
    assert (again.done, again.lr_scale) == (2, 0.25)


def test_a_train_state_written_before_rollbacks_were_kept_reads_as_none_yet():
    raw = dataclasses.asdict(train_state.TrainState(8, 0, 0, 2, [], [], {}))
    del raw["rollbacks"], raw["lr_scale"]
    raw["version"] = 3
    state = train_state.parse_train_state(
        json.dumps({**raw, "sha256": train_state._state_checksum(raw)}).encode(), "here"
    )
    assert (state.rollbacks, state.lr_scale) == (0, 1.0)


def test_a_non_finite_loss_is_written_as_its_name_so_the_record_is_strict_json(tmp_path):
    run_events.append(tmp_path, {"event": "replay", "loss": float("nan"), "steps": [1.0, float("inf")]})
    line = (tmp_path / "events.jsonl").read_text()
    assert json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in {line}")) == {
        "event": "replay",
        "loss": "nan",
        "steps": [1.0, "inf"],
    }


def test_a_rollback_goes_to_the_checkpoint_the_run_resumed_from_not_to_an_abandoned_later_one(tmp_path, monkeypatch):
    """A run resumed with checkpoint.resume=<step 4> where an earlier attempt had reached step 8 (`latest` still
    names it) goes bad at step 6 before its first save: the rollback restores step 4. It had restored step 8, the
    continuation the user stepped back from."""
    from types import SimpleNamespace

    from bertdist.train import checkpoint, rng, starting
    from bertdist.train.trainer import Trainer

    root = checkpoint.checkpoints_dir(tmp_path)
    for step in (4, 8):
        saved = root / checkpoint.tag_for(step)
        saved.mkdir(parents=True)
        state = train_state.TrainState(step, 0, 0, 1, [{"phase": 0}], [rng.capture_rng_state()], {})
        (saved / checkpoint.TRAIN_STATE_FILENAME).write_text(checkpoint.state_json(state))
        (root / checkpoint.LATEST_FILENAME).write_text(saved.name)
    restored = []
    monkeypatch.setattr(
        starting, "restore", lambda *args: restored.append(args[4].name) or checkpoint.read_train_state(args[4])
    )
    watch, said = rollbacks(tmp_path)
    trainer = SimpleNamespace(
        saver=SimpleNamespace(finish=lambda: None, restore_point=root / "step_00000004"),
        engine=SimpleNamespace(gradient_accumulation_steps=lambda: 2),
        env=SimpleNamespace(world_size=1, rank=0),
        loaders=[Reader()],
        cfg=None,
        rollbacks=watch,
        watchdog=SimpleNamespace(progress=lambda step: None),
        tracker=Tracker(),
        step=6,
    )
    watch.micro_batches_since_save = 4
    assert Trainer._roll_back(trainer, 6, "the loss is nan", 0, NAN) is None
    assert restored == ["step_00000004"] and trainer.step == 4 and "rolled back to the checkpoint of step 4" in said[0]
