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
