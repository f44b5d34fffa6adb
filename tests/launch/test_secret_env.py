"""Secrets of a DeepSpeed (pdsh) job travel in a 0600 file, not on the launcher's command line
(bertdist.launch.secret_env): DeepSpeed's launcher logged `export MLFLOW_TRACKING_PASSWORD=...` into the job log and
ran it in every host's shell. The launcher here is a real process, a script recording what it was given; the
two-host run of the same path is tests/launch/test_elastic.py."""

from __future__ import annotations

import json
import os
import stat

import pytest

from bertdist.cli import main
from bertdist.launch.ssh_fleet import SshFleet
from tests.conftest import REPO

PASSWORD = "pa$(touch PWNED)ss"
DRY_RUN = ["--config", "bert-tiny", "--dry-run", f"data.vocab_file={REPO / 'README.md'}"]


def test_the_launcher_gets_no_secret_and_each_rank_reads_them_from_a_file_only_the_user_can_read(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "tok-123")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")  # not a secret: DeepSpeed exports it
    (tmp_path / "hostfile").write_text("node1 slots=1\n")
    launcher = tmp_path / "launch.sh"
    launcher.write_text(f'#!/usr/bin/env bash\nenv > {tmp_path}/env.txt\nprintf "%s\\n" "$@" > {tmp_path}/args.txt\n')
    fleet = SshFleet(str(tmp_path / "hostfile"), str(tmp_path / "job.yaml"), str(launcher), 29500, tmp_path / "job", 2)
    assert fleet.launch(["node1"], 1, ["checkpoint.resume=auto"]).proc.wait(timeout=30) == 0
    seen = (tmp_path / "env.txt").read_text()
    assert "tok-123" not in seen and PASSWORD not in seen and "MLFLOW_TRACKING_URI=http://127.0.0.1:5000" in seen
    args = (tmp_path / "args.txt").read_text().splitlines()
    secrets = args[args.index("--secrets-file") + 1]
    assert stat.S_IMODE(os.stat(secrets).st_mode) == 0o600
    assert json.loads(open(secrets).read()) == {
        "MLFLOW_TRACKING_PASSWORD": PASSWORD,
        "MLFLOW_TRACKING_TOKEN": "tok-123",
    }

    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    monkeypatch.delenv("MLFLOW_TRACKING_TOKEN")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--secrets-file", secrets, *DRY_RUN]) == 0
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == PASSWORD and not (tmp_path / "PWNED").exists()
    fleet.close()
    assert not os.path.exists(secrets)


@pytest.mark.parametrize("mode", [0o644, 0o660])
def test_a_secrets_file_others_can_read_or_change_is_refused(tmp_path, mode, capsys, monkeypatch):
    secrets = tmp_path / "job.secrets"
    secrets.write_text(json.dumps({"MLFLOW_TRACKING_TOKEN": "tok"}))
    secrets.chmod(mode)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--secrets-file", str(secrets), *DRY_RUN]) == 2
    assert f"--secrets-file {secrets}: must be the user's own, mode 0600" in capsys.readouterr().err
