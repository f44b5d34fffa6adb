"""Which saved fine-tunings a config may continue (bertdist.finetune.starting.changed_settings)."""

from __future__ import annotations

from bertdist.config import load_config
from bertdist.finetune.starting import changed_settings


def test_a_checkpoint_from_before_a_field_existed_continues_when_the_field_is_at_its_default():
    """A checkpoint's saved config lacks the fields added since it was written: compared at their defaults, it is
    the same fine-tuning unless this run sets one; another lr or seed is another fine-tuning; the output_dir may
    move."""
    mine = load_config(None, ["finetune.task=embedding", "finetune.lr=1e-4"]).to_dict()
    saved = load_config(None, ["finetune.task=embedding", "finetune.lr=1e-4", "finetune.output_dir=elsewhere"])
    older = saved.to_dict()
    del older["finetune"]["matryoshka_dims"], older["finetune"]["cache_rows"]  # written before they existed
    assert changed_settings(mine, older) == []
    set_now = load_config(None, ["finetune.task=embedding", "finetune.lr=1e-4", "finetune.matryoshka_dims=64,32"])
    assert changed_settings(set_now.to_dict(), older) == ["finetune.matryoshka_dims"]
    other = load_config(None, ["finetune.task=embedding", "finetune.lr=3e-4", "train.seed=7"]).to_dict()
    assert changed_settings(other, older) == ["finetune.lr", "train.seed"]
