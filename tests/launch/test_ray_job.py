"""The Ray job's per-node config file (bertdist.launch.ray_job.write_private): its path is in every rank's command
line and reused on each node, so a directory another user made first is refused and a link is never followed.
The Ray job itself (a lost node, the job finishing on the other) is tests/launch/test_elastic.py's."""

from __future__ import annotations

import os
import stat

import pytest

from bertdist.errors import UserError
from bertdist.launch.ray_job import write_private


def test_the_config_is_written_for_the_user_alone_and_a_planted_directory_or_link_is_refused(tmp_path):
    path = tmp_path / "bertdist-ray-0123456789ab" / "config.yaml"
    write_private(path, "train: {}\n")
    write_private(path, "train: {seed: 1}\n")  # a relaunch on the same node
    assert path.read_text() == "train: {seed: 1}\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700

    planted = tmp_path / "bertdist-ray-planted" / "config.yaml"
    planted.parent.mkdir(mode=0o777)
    planted.parent.chmod(0o777)  # made first by another user, who can swap what is in it
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    planted.symlink_to(victim)
    with pytest.raises(UserError, match="not a directory of this user's alone"):
        write_private(planted, "train: {}\n")
    planted.parent.chmod(0o700)
    with pytest.raises(OSError):  # a link left in a directory of ours is not followed either
        write_private(planted, "train: {}\n")
    assert victim.read_text() == "mine" and os.path.islink(planted)
