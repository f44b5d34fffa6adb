"""The train state: what DeepSpeed's files do not hold (where the run is and how to continue it bit for bit), as
JSON with a checksum, and its versions. bertdist.train.checkpoint writes it last into a checkpoint and reads it
back; `bertdist inspect` and the remote resume read it from a store's bytes.

JSON rather than DeepSpeed's pickled client state, so that it can be read without torch and holds nothing
executable; the checksum makes an edit or a flipped digit (a step that passes as another) an error, not a resume
from the wrong place.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from bertdist.config.objectives import upgrade_model_section
from bertdist.errors import UserError

TRAIN_STATE_VERSION = 5
"""5: `source_tokens` recorded. 4: `rollbacks` and `lr_scale` recorded. 3: `input_models` recorded (a release that
reads 2 says which version it met rather than failing on the key). 2: the checksum is required. 1 (bertdist < 0.3)
is still read, with or without one."""
READABLE_STATE_VERSIONS = (1, 2, 3, 4, 5)
STATE_CHECKSUM_KEY = "sha256"


class CheckpointError(UserError, RuntimeError):
    """A checkpoint is missing, incomplete, or does not fit the run that wants to load it."""


@dataclass
class TrainState:
    """What DeepSpeed's files do not hold: where the run is and how to continue it bit for bit."""

    step: int
    """Optimizer steps completed."""
    tokens_seen: int
    """Non-padding tokens consumed by training, over all ranks."""
    sequences_seen: int
    world_size: int
    loader_states: list[dict[str, Any]]
    """The phase's loader's state_dict() (a PretrainingLoader's, or a MixtureLoader's) of every rank, by rank."""
    rng_states: list[dict[str, Any]]
    """rng.capture_rng_state() of every rank, indexed by rank."""
    config: dict[str, Any]
    """The resolved Config.to_dict() of the run that wrote the checkpoint."""
    tracking_run_id: str | None = None
    elapsed_seconds: float = 0.0
    """Wall time the run's training processes have run up to this checkpoint, over every launch."""
    version: int = field(default=TRAIN_STATE_VERSION)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Size and sha256 of every DeepSpeed file of the checkpoint (bertdist.train.integrity); {} before 0.2."""
    input_models: dict[str, str] = field(default_factory=dict)
    """Config field -> digest of each model the run learns from and does not checkpoint (a distillation teacher):
    bertdist.train.run_identity. {} in checkpoints written before it was recorded."""
    rollbacks: int = 0
    """Bad steps rolled back so far in the run (bertdist.train.rollback; train.max_rollbacks caps them)."""
    lr_scale: float = 1.0
    """What the scheduled learning rate is multiplied by: train.rollback_lr_factor per rollback that skipped data."""
    source_tokens: dict[str, int] = field(default_factory=dict)
    """Non-padding tokens trained on per source of the phases' mixtures (data.sources), over all ranks; {} in a run
    of single directories."""


def _state_checksum(raw: dict[str, Any]) -> str:
    """sha256 of the state's canonical JSON: a flipped digit in `step` must not pass as another step."""
    return hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()


def state_json(state: TrainState) -> str:
    """The text of train_state.json for `state`, with its checksum."""
    raw = asdict(state)
    return json.dumps({**raw, STATE_CHECKSUM_KEY: _state_checksum(raw)})


def parse_train_state(data: bytes, where: str) -> TrainState:
    """The train state in `data` (the bytes of train_state.json, from disk or a store), checked."""
    try:
        raw = json.loads(data)
        if raw.get("version") not in READABLE_STATE_VERSIONS:
            raise CheckpointError(
                f"{where}: train state version {raw.get('version')}, this bertdist reads "
                f"{', '.join(map(str, READABLE_STATE_VERSIONS))}"
            )
        recorded = raw.pop(STATE_CHECKSUM_KEY, None)
        if recorded is None and raw["version"] >= 2:  # deleting the key must not switch the check off
            raise ValueError(f"its {STATE_CHECKSUM_KEY} is missing (edited or damaged)")
        if recorded is not None and recorded != _state_checksum(raw):
            raise ValueError("its checksum does not match its content (edited or damaged)")
        state = TrainState(**raw)
        if "model" in state.config:  # written before a rename of a model setting: read as this version names it
            state.config["model"] = upgrade_model_section(state.config["model"])
    except (ValueError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{where}: unreadable train state ({e})") from None
    return state
