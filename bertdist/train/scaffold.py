"""What every run does around its loop, written once for pretraining (bertdist.train.trainer) and fine-tuning
(bertdist.finetune.runner): the exit-code ladder, the guard that frees what a failed start built, the process
group with its device, and the one line a run stops with.

The ladder (bertdist.errors' codes): a problem with the input (config, data, checkpoint, launch environment, a
path that cannot be written) is one line and USAGE_EXIT_CODE, at start or mid-run (a damaged shard read at step
5,000), and the last checkpoint stays as it was; an object store that stays down is REQUEUE_EXIT_CODE (not the
input's fault: the job continues from the newest checkpoint when requeued); a checkpoint that cannot be written,
and a peer rank lost mid-step, are FAILED_EXIT_CODE. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import socket
import sys
from typing import TYPE_CHECKING, Callable, Iterator

from bertdist import object_store
from bertdist.errors import FAILED_EXIT_CODE, REQUEUE_EXIT_CODE, USAGE_EXIT_CODE, UserError, one_line
from bertdist.train import checkpoint, distributed
from bertdist.train.distributed import DistributedEnv, lost_peer, read_env

if TYPE_CHECKING:
    import torch

    from bertdist.config import TrainConfig
    from bertdist.tracking.base import Tracker

REQUEUED = (
    f"; the object store is unavailable, which is not a problem with the input: exiting {REQUEUE_EXIT_CODE} to be "
    "requeued, and the job continues from the newest checkpoint `latest` names in the store (--resume auto)"
)


class Run(contextlib.ExitStack):
    """A run's components, built in the subclass's `__init__` (under `building()`), freed when the `with` leaves;
    `run()` is its loop and returns the exit code."""

    command = "bertdist"
    """How its lines start (`bertdist train`, `bertdist finetune`)."""
    env: DistributedEnv
    tracker: Tracker
    step = 0
    """Optimizer steps done, for the line that names the step a lost peer interrupted."""

    def run(self) -> int:
        raise NotImplementedError

    @contextlib.contextmanager
    def building(self) -> Iterator[None]:
        """Whatever the body took or built (an owned directory, the process group) is released if it fails."""
        with contextlib.ExitStack() as built:
            built.push(self)
            yield
            built.pop_all()

    def start_process_group(self, train: TrainConfig) -> torch.device:
        """torch.distributed from whichever launcher started us (NCCL on GPUs, gloo on CPUs), ended when the run
        is; returns this rank's device."""
        import torch

        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(self.env.local_rank)
        distributed.init_process_group(
            self.env,
            backend="nccl" if cuda else "gloo",
            rendezvous_timeout_s=train.rendezvous_timeout_s,
            collective_timeout_s=train.collective_timeout_s,
        )
        self.callback(distributed.destroy_process_group)
        return torch.device("cuda", self.env.local_rank) if cuda else torch.device("cpu")

    def stop_with(self, reason: str, exit_code: int) -> int:
        """The run cannot go on: say why in one line naming this rank and host, end the MLflow run as FAILED (KILLED
        when it stops to be requeued)."""
        host = socket.gethostname()
        print(f"{self.command}: [rank {self.env.rank} on {host}] {reason}", file=sys.stderr, flush=True)
        self.tracker.set_tags({"bertdist.stop_reason": reason[:500]})
        self.tracker.close("KILLED" if exit_code == REQUEUE_EXIT_CODE else "FAILED")
        return exit_code


def run_command(command: str, master_port: int, start: Callable[[DistributedEnv], Run]) -> int:
    """Read the launcher's environment, start the run `start` builds, run it; every failure ends in one line and
    its exit code (the module docstring's ladder)."""
    try:
        env = read_env(default_port=master_port)
        run = start(env)
    except object_store.StoreUnavailableError as e:
        print(f"{command}: {e}{REQUEUED}", file=sys.stderr)
        return REQUEUE_EXIT_CODE
    except (UserError, OSError) as e:  # what the start had built is released (`Run.building`)
        print(f"{command}: {one_line(e)}", file=sys.stderr)
        return USAGE_EXIT_CODE
    with run:
        try:
            return run.run()
        except checkpoint.CheckpointSaveError as e:  # not the input's fault: no usage exit code
            return run.stop_with(str(e), FAILED_EXIT_CODE)
        except object_store.StoreUnavailableError as e:  # the store down (an upload, a preemption): try later
            return run.stop_with(f"{e}{REQUEUED}", REQUEUE_EXIT_CODE)
        except (UserError, OSError) as e:
            return run.stop_with(one_line(e), USAGE_EXIT_CODE)
        except RuntimeError as e:
            if not lost_peer(e):
                raise
            return run.stop_with(
                f"lost contact with the other ranks during step {run.step + 1}: another rank stopped first "
                f"(the one whose log ends without this line) ({one_line(e)[:200]})",
                FAILED_EXIT_CODE,
            )
