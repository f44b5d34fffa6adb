"""Background checkpoint writes (bertdist.train.background_save): the copy is the state of the step that saved
whatever the optimizer does next, the thread's files are durable and described, a failed write is raised where
the loop completes the save. The 2-rank runs (a crash inside the background write, an exact resume from what it
wrote) are in tests/train/test_trainer.py and tests/training_runs.py's interrupted scenario."""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from pathlib import Path

import pytest
import torch
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

from bertdist.train import integrity
from bertdist.train.background_save import HostBuffers, SnapshotEngine, host_copy

Group = namedtuple("Group", "lr params")


def test_the_copy_keeps_the_values_of_the_step_that_saved_and_shares_what_was_shared():
    weight = torch.arange(6.0).reshape(2, 3)
    state = {
        "module": OrderedDict(embeddings=weight, decoder=weight, bias=torch.zeros(3)),
        "optimizer": {"state": {0: {"exp_avg": torch.ones(4)}}, "param_groups": [{"lr": 1e-3, "params": [0]}]},
        "group": Group(lr=1e-3, params=[weight]),
        "step": 7,
    }
    copied = host_copy(state, HostBuffers())
    weight.add_(100.0)  # what the next optimizer step does in place
    state["optimizer"]["state"][0]["exp_avg"].mul_(0)
    state["optimizer"]["param_groups"][0]["lr"] = 5.0

    assert torch.equal(copied["module"]["embeddings"], torch.arange(6.0).reshape(2, 3))
    assert copied["module"]["embeddings"] is copied["module"]["decoder"]  # tied: one tensor, saved once
    assert copied["group"].params[0] is copied["module"]["embeddings"] and isinstance(copied["group"], Group)
    assert isinstance(copied["module"], OrderedDict)
    assert torch.equal(copied["optimizer"]["state"][0]["exp_avg"], torch.ones(4))
    assert copied["optimizer"]["param_groups"][0]["lr"] == 1e-3 and copied["step"] == 7


def test_a_view_is_copied_into_storage_of_its_own():
    big = torch.zeros(1000)
    copied = host_copy({"slice": big[:10]}, HostBuffers())
    assert copied["slice"].untyped_storage().nbytes() == 10 * 4


def test_the_next_save_copies_into_the_buffers_of_the_last_one():
    buffers = HostBuffers()
    state = {"a": torch.ones(3), "b": torch.zeros(2, 2)}
    first = host_copy(state, buffers)
    buffers.restart()
    state["a"].add_(1.0)
    second = host_copy(state, buffers)
    assert second["a"] is first["a"] and torch.equal(second["a"], torch.full((3,), 2.0))
    buffers.restart()
    third = host_copy({"a": torch.ones(4), "b": state["b"]}, buffers)  # another layout: new buffers from there on
    assert third["a"] is not first["a"] and third["b"] is not first["b"] and len(buffers.kept) == 2


def _written(engine: SnapshotEngine, target: Path) -> dict:
    target.mkdir()
    engine.create(None)
    engine.save({"weights": torch.full((3,), 2.0)}, str(target / "mp_rank_00_model_states.pt"))
    engine.save({"partition": torch.ones(2)}, str(target / "zero_pp_rank_1_mp_rank_00_optim_states.pt"))
    engine.start(target, rank=0, exclude={"train_state.json"})
    return engine.join()


def test_the_thread_writes_what_was_copied_and_describes_this_ranks_files(tmp_path):
    engine = SnapshotEngine(TorchCheckpointEngine())
    facts = _written(engine, tmp_path / "step_00000004")
    model = tmp_path / "step_00000004" / "mp_rank_00_model_states.pt"
    assert list(facts) == [model.name]  # rank 1's partition is described by rank 1
    assert facts[model.name] == integrity.describe_own_files(model.parent, 0, set())[model.name]
    assert torch.equal(torch.load(model, weights_only=True)["weights"], torch.full((3,), 2.0))
    assert not engine.writing() and engine.copies == []


def test_a_failed_background_write_is_raised_when_the_save_is_completed(tmp_path, monkeypatch):
    from bertdist.train import background_save

    def full_disk(state, path):
        raise OSError(28, "No space left on device", path)

    monkeypatch.setattr(background_save, "write_durably", full_disk)
    engine = SnapshotEngine(TorchCheckpointEngine())
    with pytest.raises(OSError, match="No space left"):
        _written(engine, tmp_path / "step_00000008")
    assert engine.join() == {}  # raised once; the next completion finds nothing pending


def test_what_it_does_not_change_is_asked_of_deepspeeds_engine(tmp_path):
    inner = TorchCheckpointEngine()
    engine = SnapshotEngine(inner)
    assert engine.is_data_parallel_writer(0) and not engine.is_decoupled()
    assert not engine.preserves_storage_sharing()
    torch.save({"x": torch.ones(1)}, tmp_path / "f.pt")
    assert torch.equal(engine.load(str(tmp_path / "f.pt"))["x"], torch.ones(1))


def test_a_background_save_records_the_source_tokens_of_the_step_that_saved(tmp_path):
    """The train state is written when the save completes, steps after `Trainer._save` captured it: the tokens read
    from each source in between were in the checkpoint of the step before (a resumed run logged them twice)."""
    import time
    from types import SimpleNamespace

    from bertdist.config import CheckpointConfig
    from bertdist.train import checkpoint, metrics, saving
    from bertdist.train.distributed import DistributedEnv, destroy_process_group, init_process_group
    from bertdist.train.ports import free_tcp_port
    from bertdist.train.trainer import Trainer

    class Engine:  # DeepSpeed's save_checkpoint, as far as its checkpoint engine sees it
        checkpoint_engine = TorchCheckpointEngine()

        def save_checkpoint(self, root, tag, save_latest):
            (Path(root) / tag).mkdir(parents=True)
            self.checkpoint_engine.create(tag)
            self.checkpoint_engine.save({"w": torch.ones(2)}, str(Path(root) / tag / "mp_rank_00_model_states.pt"))
            self.checkpoint_engine.commit(tag)

    nothing = SimpleNamespace(progress=lambda step: None, after_checkpoint=lambda path, step: None)
    tracker = SimpleNamespace(log_checkpoint=lambda path, step: None, run_id=None)
    saver = saving.Saver(
        Engine(), CheckpointConfig(write="background"), tmp_path, None, nothing, print, tracker, nothing, None
    )
    loader = SimpleNamespace(state_dict=lambda: {}, sources=lambda: {})
    trainer = SimpleNamespace(
        tokens_seen=400, sequences_seen=4, env=SimpleNamespace(world_size=1), cfg=SimpleNamespace(to_dict=dict),
        tracker=tracker, elapsed_before=0.0, started=time.monotonic(), input_models={}, saver=saver,
        rollbacks=SimpleNamespace(done=0, lr_scale=1.0), source_tokens={"wiki": 300, "books": 100},
        sources_read={}, loaders=[loader],
    )  # fmt: skip
    init_process_group(DistributedEnv(0, 1, 0, "127.0.0.1", free_tcp_port(), "none"), "gloo", rendezvous_timeout_s=10)
    try:
        Trainer._save(trainer, 4, 0, 0)
        metrics.count_source_tokens(trainer.source_tokens, {"tokens:wiki": 200.0, "tokens:books": 50.0})  # step 5
        saver.finish()
    finally:
        destroy_process_group()
    saved = checkpoint.read_train_state(tmp_path / "checkpoints" / "step_00000004")
    assert (saved.step, saved.source_tokens) == (4, {"wiki": 300, "books": 100})
    assert saver.restore_point == tmp_path / "checkpoints" / "step_00000004"
