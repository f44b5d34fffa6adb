"""A free local port for a single-machine rendezvous or a test server, chosen where no connection can take it."""

from __future__ import annotations

import errno
import random
import socket

LOWEST_CHOSEN_PORT = 20000
"""Below it sit the well-known services and Ray's worker ports (10002-19999 by default)."""
_PORT_CHOICE = random.SystemRandom()
"""Not the `random` module's generator: a run seeds that one and saves its state in checkpoints, so drawing from
it would repeat the same ports in every process seeded alike and shift a resumed run's random numbers."""


def free_tcp_port() -> int:
    """A port of 127.0.0.1 that nothing listens on right now, for a single-machine rendezvous (demo, tests).

    Chosen at random outside the kernel's ephemeral range, not by binding port 0: a port from that range
    is free only until some other process opens a connection, and every S3 client, gloo pair and Ray
    worker on the machine opens them. Between that choice and rank 0's bind a connection took the port
    (a CI run: rank 0 refused with EADDRINUSE and rank 1 waited out its rendezvous timeout). Nothing
    takes a port outside the range unless it names it.
    """
    first, last = _ephemeral_ports()
    outside = [*range(LOWEST_CHOSEN_PORT, first), *range(last + 1, 65536)]
    for port in _PORT_CHOICE.sample(outside, min(len(outside), 100)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError as e:
                if e.errno in (errno.EADDRINUSE, errno.EACCES):
                    continue
                raise
            return port
    with socket.socket() as s:  # the range covers every port above the lowest, or each try was taken
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_ports() -> tuple[int, int]:
    """The range the kernel hands out to connections and to binds of port 0: Linux's setting, the IANA range
    elsewhere."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            first, last = f.read().split()
            return int(first), int(last)
    except (OSError, ValueError):
        return 49152, 65535
