"""The signals that stop a run, in one place for the two kinds of process that must agree on them.

A rank stops on them after its step and writes a checkpoint (bertdist.train.stopping). The loader's worker
processes, and the server they are forked from, ignore them (bertdist.data.worker_processes): a signal sent to a whole
process group reaches them too, and one that ended them would fail the rank before its checkpoint.
"""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
"""SIGTERM (kill, SLURM's preemption, the launchers), SIGINT (Ctrl-C), SIGUSR1 (SLURM's --signal)."""
