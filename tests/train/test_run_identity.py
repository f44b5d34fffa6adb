"""Whether a checkpoint is this run's (bertdist.train.run_identity): the settings compared on resume."""

from __future__ import annotations

from bertdist.config import load_config
from bertdist.train.run_identity import foreign_fields

MIXED = ["data.sources.web=/d/web", "data.sources.wiki=/d/wiki", "data.phases.0.mixture.web=1"]


def test_a_source_added_to_or_removed_from_a_mixture_is_another_run():
    """Keys only one side has were passed over as fields of another bertdist version: a 50/50 mixture silently
    became 100% one source, or a third each, under the same run."""
    saved = load_config(None, [*MIXED, "data.phases.0.mixture.wiki=1"]).to_dict()
    assert foreign_fields(saved, saved) == []
    removed = load_config(None, MIXED).to_dict()
    assert foreign_fields(saved, removed) == ["data.phases.0.mixture.wiki (1 there, absent here)"]
    added = load_config(None, [*MIXED, "data.phases.0.mixture.wiki=1", "data.phases.0.mixture.code=1"]).to_dict()
    assert foreign_fields(saved, {**added, "data": {**added["data"], "sources": saved["data"]["sources"]}}) == [
        "data.phases.0.mixture.code (absent there, 1 here)"
    ]
    newer = load_config(None, [*MIXED, "data.phases.0.mixture.wiki=1"]).to_dict()
    del saved["model"]["attention"]  # a field an older bertdist did not write: its default, not another run
    assert foreign_fields(saved, newer) == []


def test_a_setting_added_since_the_checkpoint_is_this_run_only_at_its_default():
    """An older checkpoint has no optim.weight_decay_mode: its run decayed as `adamw` does. Resumed under a config
    that says `independent`, the decay rose a thousandfold mid-run, unsaid; at the default it is the same run. A
    resumable setting added since (where things are, how the run is watched) may take any value."""
    older = load_config(None, ["model.size=tiny"]).to_dict()
    del older["optim"]["weight_decay_mode"], older["train"]["stall_timeout_s"]
    assert foreign_fields(older, load_config(None, ["model.size=tiny"]).to_dict()) == []
    independent = load_config(None, ["model.size=tiny", "optim.weight_decay_mode=independent"]).to_dict()
    assert foreign_fields(older, independent) == [
        'optim.weight_decay_mode (not a setting there: "adamw"; "independent" here)'
    ]
    watched = load_config(None, ["model.size=tiny", "train.stall_timeout_s=60"]).to_dict()
    assert foreign_fields(older, watched) == []
    phases = load_config(None, ["model.size=tiny", "data.phases.0.decay_fraction=0.5"]).to_dict()
    del older["data"]["phases"][0]["decay_fraction"]
    assert foreign_fields(older, phases) == ["data.phases.0.decay_fraction (not a setting there: -1.0; 0.5 here)"]
