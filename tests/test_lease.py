"""bertdist.lease against the suite's S3 server: one run holds a checkpoint.uri; another is refused while the
holder renews it, takes it over once it is stale (on the store's clock), and the old holder then knows."""

from __future__ import annotations

import time

import pytest

from bertdist import storage
from bertdist.lease import LEASE_NAME, LeaseBusyError, LeaseLostError, StoreLease

pytestmark = pytest.mark.slow
TIMEOUT_S = 10.0
"""Short enough for a test, long enough that a heartbeat (every quarter of it) reaches the suite's S3 server on a
loaded 2-core machine: at 4 s a held lease once counted itself lost there (CI, November 2026)."""


def test_a_held_uri_is_refused_then_taken_over_once_its_holder_stops_renewing(s3, tmp_path, capsys):
    uri = storage.join(s3.bucket("leases"), "run")
    first = StoreLease(uri, str(tmp_path / "a"), TIMEOUT_S)
    first.acquire()
    assert storage.read_json(storage.join(uri, LEASE_NAME))["output_dir"] == str(tmp_path / "a")
    with pytest.raises(LeaseBusyError) as e:
        StoreLease(uri, str(tmp_path / "b"), TIMEOUT_S).acquire()
    assert f"checkpoint.uri {uri} is in use by another run (host " in str(e.value) and str(tmp_path / "a") in str(
        e.value
    )
    acquired_at = storage.modified_at(first.url)
    time.sleep(TIMEOUT_S / 2)  # a heartbeat or two (every quarter of the timeout): renewed, still held
    assert storage.modified_at(first.url) > acquired_at
    with pytest.raises(LeaseBusyError):
        StoreLease(uri, str(tmp_path / "b"), TIMEOUT_S).acquire()
    first.check()

    first._stop.set()  # killed: no more heartbeats, nothing released
    first._thread.join()
    time.sleep(TIMEOUT_S + 1.5)
    second = StoreLease(uri, str(tmp_path / "b"), TIMEOUT_S)
    second.acquire()
    assert "taking over the lease of a run that stopped renewing it" in capsys.readouterr().err
    with pytest.raises(LeaseLostError, match="lease was taken over"):
        first.check()  # its next publish stops instead of moving `latest`
    second.release()
    assert not storage.exists(storage.join(uri, LEASE_NAME))
    assert [n for n in storage.listdir(uri) if n.startswith(LEASE_NAME)] == []  # no clock probes left


def test_a_restart_in_place_takes_its_own_lease_at_once(s3, tmp_path):
    """Same host, same output directory: this process holds the directory's lock, so the holder is gone."""
    uri = storage.join(s3.bucket("leases"), "in-place")
    killed = StoreLease(uri, str(tmp_path / "run"), 60.0)
    killed.acquire()
    killed._stop.set()
    t0 = time.monotonic()
    again = StoreLease(uri, str(tmp_path / "run"), 60.0)
    again.acquire()
    assert time.monotonic() - t0 < 10
    again.release()


def test_the_lease_stays_this_runs_while_checkpoints_are_published_beside_its_heartbeat(s3, tmp_path):
    """A run's heartbeat and its checkpoint publisher write to one prefix in the same seconds. Every write stages
    privately, so the lease never receives a marker's bytes (a run once concluded that its lease was taken and
    stopped itself after 2.75 minutes) and `latest` never receives the lease record."""
    uri = storage.join(s3.bucket("leases-busy"), "run")
    held = StoreLease(uri, str(tmp_path / "run"), 4.0)  # the shortest timeout: a heartbeat every second
    held.acquire()
    deadline, step = time.monotonic() + 15, 0
    while time.monotonic() < deadline:
        step += 1
        storage.write_json(storage.join(uri, f"step_{step:08d}", "train_state.json"), {"step": step})
        storage.write_text(storage.join(uri, "latest"), f"step_{step:08d}\n")
        assert storage.read_text(storage.join(uri, "latest")) == f"step_{step:08d}\n"
        held.check()
    assert storage.read_json(storage.join(uri, LEASE_NAME))["token"] == held.record["token"]
    held.release()
