"""The run scaffold (bertdist.train.scaffold) that pretraining and fine-tuning share: each failure a run can meet
ends in its exit code and one line naming the rank and host, the tracker's run closed as FAILED or KILLED, and what
a failed start had built is released. Pretraining's and fine-tuning's runs are both scaffold Runs, so the 2-rank
tests of each (tests/train/test_trainer.py, tests/finetune/test_runner.py) exercise this ladder end to end."""

from __future__ import annotations

import pytest

from bertdist import object_store
from bertdist.errors import FAILED_EXIT_CODE, REQUEUE_EXIT_CODE, USAGE_EXIT_CODE, UserError
from bertdist.finetune.runner import Finetuning
from bertdist.tracking.base import Tracker
from bertdist.train import checkpoint, scaffold
from bertdist.train.trainer import Trainer


class Recorder(Tracker):
    """Keeps the tags and the closing status the scaffold gives the run's tracker."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: dict = {}
        self.status = ""

    def set_tags(self, tags: dict) -> None:
        self.tags.update(tags)

    def close(self, status: str = "FINISHED") -> None:
        self.status = status


class Failing(scaffold.Run):
    command = "bertdist test"

    def __init__(self, env, error: BaseException | None, released: list) -> None:
        super().__init__()
        self.env, self.tracker, self.error, self.step = env, Recorder(), error, 41
        with self.building():
            self.callback(released.append, "released")
            if isinstance(self.error, ValueError):  # a failed start
                raise UserError("the config is wrong")

    def run(self) -> int:
        raise self.error


@pytest.mark.parametrize(
    "error, code, status, words",
    [
        (checkpoint.CheckpointSaveError("disk full"), FAILED_EXIT_CODE, "FAILED", "disk full"),
        (object_store.StoreUnavailableError("s3://b/k: down"), REQUEUE_EXIT_CODE, "KILLED", "to be requeued"),
        (UserError("a damaged shard at step 5,000"), USAGE_EXIT_CODE, "FAILED", "a damaged shard"),
        (RuntimeError("Connection reset by peer"), FAILED_EXIT_CODE, "FAILED", "during step 42: another rank"),
    ],
)
def test_every_failure_of_a_run_is_its_exit_code_and_one_line(error, code, status, words, capsys):
    runs: list[Failing] = []
    released: list[str] = []

    def start(env):
        runs.append(Failing(env, error, released))
        return runs[0]

    assert scaffold.run_command("bertdist test", 29512, start) == code
    err = capsys.readouterr().err
    assert err.startswith("bertdist test: [rank 0 on ") and err.count("\n") == 1 and words in err, err
    assert runs[0].tracker.status == status and words.split(":")[0] in runs[0].tracker.tags["bertdist.stop_reason"]
    assert released == ["released"]  # leaving the run frees what it built


def test_a_bug_keeps_its_traceback():
    with pytest.raises(RuntimeError, match="a bug"):
        scaffold.run_command("bertdist test", 29512, lambda env: Failing(env, RuntimeError("a bug"), []))


def test_a_failed_start_releases_what_it_built_and_is_one_usage_line(capsys):
    released: list[str] = []
    assert scaffold.run_command("bertdist test", 29512, lambda env: Failing(env, ValueError(), released)) == (
        USAGE_EXIT_CODE
    )
    assert capsys.readouterr().err == "bertdist test: the config is wrong\n" and released == ["released"]


def test_pretraining_and_fine_tuning_are_both_scaffold_runs():
    assert issubclass(Trainer, scaffold.Run) and issubclass(Finetuning, scaffold.Run)
    assert (Trainer.command, Finetuning.command) == ("bertdist train", "bertdist finetune")
