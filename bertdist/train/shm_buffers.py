"""DeepSpeed's shared-memory all-reduce buffers, removed from /dev/shm as soon as every rank has mapped them.

On CPU, when every rank of a job runs on one host (DeepSpeed's launcher sets LOCAL_SIZE to the ranks on the host),
DeepSpeed's communication backend creates one POSIX shared-memory file per rank for its low-latency all-reduce
(ops/csrc/cpu/comm/shm.cpp: `deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>`, 69 MB), maps
every rank's, and never removes them: not at a clean exit, not after a kill. /dev/shm is memory, so every such run
kept 69 MB per rank of the host's RAM taken until it rebooted; this project's test machine had gathered 148 of
them, 9.6 GB of its 24 GB.

Removing a name once every process that uses it has mapped it is the usual cure: the mappings stay valid, and the
kernel frees the memory when the last rank unmaps it, at its exit or its kill. DeepSpeed's initialisation returns
on a rank only after that rank has mapped every other rank's buffer, so once every rank has returned (a barrier),
each rank removes its own.
"""

from __future__ import annotations

import os
from pathlib import Path

SHM_DIR = Path("/dev/shm")


def allreduce_buffer(rank: int, master_addr: str, master_port: int | str) -> Path:
    """Where DeepSpeed's buffer of `rank` in the job of this rendezvous lies."""
    return SHM_DIR / f"deepspeed_allreduce_buffer_{os.getuid()}_{master_addr}_{master_port}_{rank}"


def release_allreduce_buffers() -> None:
    """Once every rank has initialised DeepSpeed, remove this rank's buffer name (a no-op where DeepSpeed made none:
    on a GPU, or with ranks on several hosts). Every rank must call it: it holds a barrier."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if dist.get_world_size() > 1:
        dist.barrier()
    # named from the variables DeepSpeed read when it initialised (set by init_process_group, and still set)
    address, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    allreduce_buffer(dist.get_rank(), address, port).unlink(missing_ok=True)
