"""What the elastic supervisor (bertdist.launch.elastic) asks of whatever starts a job's ranks: a `Fleet` of hosts
it can probe, clean and launch on, and the `Attempt` each launch returns. Two implement it: SSH hosts of a DeepSpeed
hostfile (bertdist.launch.ssh_fleet) and the nodes of a Ray cluster (bertdist.launch.ray_job); the supervisor's
rules are tested over a scripted one (tests/launch/test_supervisor_rules.py)."""

from __future__ import annotations

from typing import Protocol


class Attempt(Protocol):
    """The ranks of one launch, on a fixed set of hosts."""

    def wait(self, timeout_s: float) -> dict[str, int] | None:
        """Each host's exit code once every rank has ended; None while any runs."""

    def request_stop(self) -> None:
        """Ask every rank to checkpoint and exit (SIGTERM: the trainer's preemption path)."""

    def kill(self) -> None:
        """End every rank of this launch that can still be reached, now."""


class Fleet(Protocol):
    def hosts(self) -> list[str]:
        """Every host the job may use, in order of preference."""

    def probe(self, hosts: list[str]) -> dict[str, str]:
        """Why each host that does not answer now does not (hosts that answer are absent)."""

    def clean(self, host: str) -> None:
        """Kill whatever this job left running on `host` (before it is used again)."""

    def launch(self, hosts: list[str], ranks_per_host: int, trainer_args: list[str]) -> Attempt:
        """Start the job's ranks on `hosts`, the first as the rendezvous master."""
