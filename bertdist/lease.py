"""One run owns its `checkpoint.uri` while it runs, as it owns its output directory (bertdist.ownership).

An object store has no locks, so ownership is a lease: the object `URI/.lease` names its holder (host, pid,
output directory, start time, a random token) and is rewritten every quarter of `checkpoint.lease_timeout_s`
(the heartbeat) by the run's rank 0. Two runs on one URI would otherwise both train while each pruned the
other's checkpoints and moved `latest` under it.

How a stale lease (its holder was killed, or lost its node) is recognised: by age on the store's clock. The
lease object's Last-Modified is the store's time of its last heartbeat; the store's present time is read from
a probe object written for the purpose; neither host's clock takes part. A lease not renewed for its holder's
own `timeout_s` is stale and is taken over, saying so. A fresh lease is:
- taken over at once when it was held by this host for this same output directory: the directory's kernel
  lock, which this process holds, proves that holder gone (a run restarted in place);
- waited for, up to its timeout, when it was held for this same output directory from another host (an
  elastic relaunch or a requeue on another node: its holder was stopped, so it goes stale);
- refused at once otherwise: another run is using the URI.

Taking the lease is a write followed, after a settle time, by reading it back: two runs starting within the
same instant both write, and the one whose token is not read back stops. The holder also reads the lease
back at every heartbeat and before it publishes a checkpoint (`check`): a run whose lease was taken over
(its heartbeats could not reach the store for longer than the timeout) stops instead of moving `latest`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
import uuid
from typing import Any, Iterator

from bertdist import storage
from bertdist.errors import UserError
from bertdist.ownership import holder_text

LEASE_NAME = ".lease"
SETTLE_SECONDS = 1.5
"""Between writing the lease and reading it back: longer than two starting runs' check-then-write gap."""


class LeaseBusyError(UserError):
    """Another live run holds the URI's lease."""


class LeaseLostError(UserError):
    """This run's lease was taken over: it must not publish to the URI any more."""


class StoreLease:
    """The lease on `uri` for a run whose output directory is `output_dir`; `acquire()`, then `release()`."""

    def __init__(self, uri: str, output_dir: str, timeout_s: float):
        self.url = storage.join(uri, LEASE_NAME)
        self.uri, self.timeout_s = uri, timeout_s
        self.record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": time.time(),
            "command": "bertdist train",
            "output_dir": os.path.abspath(output_dir),
            "token": uuid.uuid4().hex,
            "timeout_s": timeout_s,
        }
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lost: str = ""

    # ---- taking and giving back ---------------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the lease (waiting for one of this output directory's to go stale), or LeaseBusyError."""
        deadline, said = None, False
        while True:
            held, age_s = self._read_with_age()
            verdict = self._verdict(held, age_s)
            if verdict == "stale":
                print(
                    f"bertdist: {self.uri}: taking over the lease of a run that stopped renewing it {age_s:.0f} s ago "
                    f"({holder_text(held)})",
                    file=sys.stderr,
                    flush=True,
                )
            if verdict != "wait":
                break
            stale_after = float(held.get("timeout_s", self.timeout_s))
            deadline = deadline or time.monotonic() + stale_after + SETTLE_SECONDS
            if time.monotonic() > deadline:
                raise LeaseBusyError(
                    f"checkpoint.uri {self.uri}: the lease of {holder_text(held)} for this output "
                    f"directory is still being renewed after {stale_after:.0f} s: that run is alive"
                )
            if not said:
                print(
                    f"bertdist: {self.uri}: waiting up to {stale_after - age_s:.0f} s for the lease of an earlier "
                    f"launch of this run ({holder_text(held)}) to go stale",
                    file=sys.stderr,
                    flush=True,
                )
                said = True
            time.sleep(min(5.0, stale_after / 4))
        self._write()
        time.sleep(SETTLE_SECONDS)
        held = self._read()
        if held is None or held.get("token") != self.record["token"]:
            raise LeaseBusyError(
                f"checkpoint.uri {self.uri}: another run took the lease at the same moment "
                f"({holder_text(held or {})}); choose another URI"
            )
        self._thread = threading.Thread(target=self._heartbeat, name="bertdist-lease", daemon=True)
        self._thread.start()

    def preview(self) -> str:
        """What `acquire` would find, in one line, taking nothing; LeaseBusyError where it would refuse."""
        held, age_s = self._read_with_age()
        return {
            "free": "no run holds it",
            "stale": f"a lease not renewed for {age_s:.0f} s: taken over at start",
            "mine": "held by this run's earlier launch on this host: taken over at start",
            "wait": f"held by an earlier launch of this run from another host ({holder_text(held or {})}): waited for "
            "until it is stale",
        }[self._verdict(held, age_s)]

    def _verdict(self, held: dict[str, Any] | None, age_s: float) -> str:
        """free, stale, mine (take it now), wait (an earlier launch of this run elsewhere), or LeaseBusyError."""
        if not held:  # none, or not a lease (written by hand): nobody's
            return "free"
        stale_after = float(held.get("timeout_s", self.timeout_s))
        if age_s > stale_after:
            return "stale"
        if held.get("output_dir") != self.record["output_dir"]:
            raise LeaseBusyError(
                f"checkpoint.uri {self.uri} is in use by another run ({holder_text(held)}, output "
                f"{held.get('output_dir', '?')}, renewed {age_s:.0f} s ago); wait for it to end or "
                f"choose another URI (a lease not renewed for {stale_after:.0f} s is taken over)"
            )
        return "mine" if held.get("host") == self.record["host"] else "wait"  # mine: this process holds the directory

    def release(self) -> None:
        """Stop renewing, and remove the lease if it is still this run's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s)
        with contextlib.suppress(UserError):
            held = self._read()
            if held is not None and held.get("token") == self.record["token"]:
                storage.remove(self.url)

    def check(self) -> None:
        """LeaseLostError when the lease is no longer this run's (said by the heartbeat or read now)."""
        if not self._lost:
            held = self._read()
            if held is None or held.get("token") != self.record["token"]:
                self._lost = f"now held by {holder_text(held)}" if held else "its lease object is gone"
        if self._lost:
            raise LeaseLostError(
                f"checkpoint.uri {self.uri}: this run's lease was taken over ({self._lost}), after its "
                "heartbeats could not reach the store in time; it stops without publishing more checkpoints"
            )

    # ---- the heartbeat and the store ---------------------------------------------------------------------
    def _heartbeat(self) -> None:
        while not self._stop.wait(self.timeout_s / 4):
            try:
                self.check()
                self._write()
            except UserError as e:  # the store down for longer than its retries: tried again next beat
                if isinstance(e, LeaseLostError):
                    return
                print(f"bertdist: WARNING the lease heartbeat failed: {e}", file=sys.stderr, flush=True)

    def _write(self) -> None:
        storage.write_json(self.url, self.record)

    def _read(self) -> dict[str, Any] | None:
        try:
            record = storage.read_json(self.url)
        except storage.StorageError as e:
            if "no such object" in str(e):
                return None
            raise
        except ValueError:
            return {}  # half-written by hand: nobody's token
        return record if isinstance(record, dict) else {}

    def _read_with_age(self) -> tuple[dict[str, Any] | None, float]:
        """The lease and the seconds since it was written, both times on the store's clock."""
        held = self._read()
        if held is None:
            return None, 0.0
        probe = storage.join(self.uri, f"{LEASE_NAME}-clock-{self.record['token']}")
        storage.write_text(probe, "")
        try:
            return held, storage.modified_at(probe) - storage.modified_at(self.url)
        finally:
            storage.remove(probe)


@contextlib.contextmanager
def leased(uri: str, output_dir: str, timeout_s: float) -> Iterator[StoreLease]:
    lease = StoreLease(uri, output_dir, timeout_s)
    lease.acquire()
    try:
        yield lease
    finally:
        lease.release()
