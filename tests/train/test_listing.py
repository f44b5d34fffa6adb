"""`bertdist checkpoints`: the phase a checkpoint is in, or closes, from its run's own config."""

from __future__ import annotations

from bertdist.train.listing import _phase_note
from bertdist.train.train_state import TrainState


def _state(step: int) -> TrainState:
    phases = [{"steps": 100, "name": "pretrain"}, {"steps": 20, "name": "context-extension"}, {"steps": 10}]
    return TrainState(
        step=step,
        tokens_seen=0,
        sequences_seen=0,
        world_size=1,
        loader_states=[],
        rng_states=[],
        config={"data": {"phases": phases}},
    )


def test_a_checkpoint_says_which_phase_it_closes_or_is_in():
    assert _phase_note(_state(50)) == ", phase 0 (pretrain)"
    assert _phase_note(_state(100)) == ", closes phase 0 (pretrain)"
    assert _phase_note(_state(101)) == ", phase 1 (context-extension)"
    assert _phase_note(_state(120)) == ", closes phase 1 (context-extension)"
    assert _phase_note(_state(130)) == ", closes phase 2"  # unnamed
