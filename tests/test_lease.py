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
    time.sleep(TIMEOUT_S * 0.75)  # a few heartbeats: still held
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
