"""Checkpoints written in the background (`checkpoint.write: background`): the save costs the step a copy of
the state into host memory, not the write.

A synchronous save stops training for the whole of DeepSpeed's torch.save of every file plus their sha256
(BERT-Large with Adam: ~4 GB per checkpoint). torchtitan's answer, taken here: at the step, each rank copies
what DeepSpeed hands its checkpoint engine (module weights, optimizer partitions, scheduler) into tensors of
its own, in host memory; a thread then writes those copies, fsyncs them and hashes them while training goes
on. The copy is what makes it exact: the optimizer updates its tensors in place on the next step, so the
files hold the state of the step that saved, bit for bit as a synchronous save would.

`SnapshotEngine` is a DeepSpeed CheckpointEngine (the contract DeepSpeed's own torch, fast and decoupled
writers implement): it stands in for the engine's writer only during one `save_checkpoint` call and keeps
what it was handed; `start` sends the writes to the thread. The checkpoint becomes complete the way a
synchronous one does (bertdist.train.checkpoint.complete_save): only when every rank's thread has finished,
which the training loop learns from the all-reduced step sums, does rank 0 write train_state.json and move
`latest`. A process killed mid-write leaves a directory without train_state.json, which is never loaded:
the previous checkpoint stays the resume point. One save is in flight at a time; a save due while one is
still writing waits for it, as does the end of the run, a stop and a rollback.

Cost: host memory for one copy of this rank's checkpoint state, kept for the run (HostBuffers).
"""

from __future__ import annotations

import copy
import os
import threading
from pathlib import Path
from typing import Any

from bertdist.train import integrity


class HostBuffers:
    """The host tensors that hold the copies, kept from one save to the next.

    A fresh tensor costs its pages on first touch (the kernel zeroes them): copying BERT-base's 1.1 GB share
    into new memory took 0.7 s here, into kept buffers 0.12 s. The state's tensors come in the same order at
    every save, so the n-th tensor of a save is copied into the n-th buffer when shape and dtype still match.
    On a GPU the buffers are pinned and the copies asynchronous; `synchronize` waits for them. The cost: one
    copy of this rank's checkpoint state stays in host memory for the whole run."""

    def __init__(self) -> None:
        self.kept: list[Any] = []
        self.next = 0

    def restart(self) -> None:
        """A new save: its first tensor goes into the first buffer."""
        self.next = 0

    def copy(self, tensor: Any) -> Any:
        import torch

        source = tensor.detach()
        index, self.next = self.next, self.next + 1
        if index < len(self.kept):
            kept = self.kept[index]
            if kept.shape == source.shape and kept.dtype == source.dtype:
                return kept.copy_(source, non_blocking=source.is_cuda)
        buffer = torch.empty(source.shape, dtype=source.dtype, device="cpu", pin_memory=source.is_cuda)
        buffer.copy_(source, non_blocking=source.is_cuda)
        self.kept[index:] = [buffer]  # what came after it belonged to another layout of the state
        return buffer

    def synchronize(self) -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()


def host_copy(obj: Any, buffers: HostBuffers, memo: dict[int, Any] | None = None) -> Any:
    """`obj` with every tensor copied into `buffers` (a tensor met twice, e.g. tied embeddings, copied once and
    shared as it was) and every container rebuilt, so that nothing the optimizer changes later reaches it."""
    import torch

    memo = {} if memo is None else memo
    if isinstance(obj, torch.Tensor):
        if id(obj) not in memo:
            memo[id(obj)] = buffers.copy(obj)
        return memo[id(obj)]
    if isinstance(obj, dict):
        rebuilt = copy.copy(obj)  # its own type (an OrderedDict stays one), its values replaced below
        for key, value in obj.items():
            rebuilt[key] = host_copy(value, buffers, memo)
        return rebuilt
    if isinstance(obj, list):
        return [host_copy(value, buffers, memo) for value in obj]
    if isinstance(obj, tuple):
        items = [host_copy(value, buffers, memo) for value in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    return copy.deepcopy(obj)


def write_durably(state: Any, path: str) -> None:
    """torch.save, then fsync: a checkpoint is declared complete only once its bytes are on the disk."""
    import torch

    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


class SnapshotEngine:
    """Keeps host copies of what DeepSpeed saves; `start` writes them on a thread of their own.

    DeepSpeed calls its checkpoint engine by its methods only; what this one does not change (which rank
    writes, decoupling) is asked of DeepSpeed's own engine, `inner`, so that importing this module does not
    import DeepSpeed."""

    def __init__(self, inner: Any):
        self.name = "bertdist.SnapshotEngine"
        self.inner = inner
        """DeepSpeed's own writer, for everything but saving (makedirs, load)."""
        self.buffers = HostBuffers()
        self.copies: list[tuple[Any, str]] = []
        self.thread: threading.Thread | None = None
        self.files: dict[str, dict[str, int | str]] = {}
        self.error: BaseException | None = None

    # --- DeepSpeed's contract (deepspeed.runtime.checkpoint_engine.CheckpointEngine)
    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy being built): not DeepSpeed's to answer
            raise AttributeError(name)
        return getattr(self.inner, name)

    def create(self, info: Any) -> None:
        if self.writing():  # its buffers are what the thread is writing
            raise RuntimeError("a checkpoint save began while the previous one was still being written")
        self.copies = []
        self.buffers.restart()

    def save(self, state_dict: Any, path: str) -> None:
        self.copies.append((host_copy(state_dict, self.buffers), path))

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.inner.makedirs(path, exist_ok=exist_ok)

    def load(self, path: str, map_location: Any = None) -> Any:
        return self.inner.load(path, map_location=map_location)

    def commit(self, info: Any) -> bool:
        return True  # complete only when bertdist.train.checkpoint.complete_save says so

    def preserves_storage_sharing(self) -> bool:
        return False  # host_copy already makes every tensor its own compact storage

    # --- the write
    def start(self, target: Path, rank: int, exclude: set[str]) -> None:
        """Write the copies (then hash this rank's files of `target`) on a thread; training goes on."""
        copies, self.copies = self.copies, []
        self.files, self.error = {}, None
        self.buffers.synchronize()

        def write() -> None:
            try:
                for state, path in copies:
                    write_durably(state, path)
                copies.clear()
                self.files = integrity.describe_own_files(target, rank, exclude)
            except BaseException as e:  # noqa: BLE001 - the loop raises it at the completion, on its own thread
                self.error = e

        self.thread = threading.Thread(target=write, name=f"bertdist-checkpoint-{target.name}", daemon=True)
        self.thread.start()

    def writing(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def join(self) -> dict[str, dict[str, int | str]]:
        """This rank's file facts once its thread is done; its write's error, raised here."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return self.files
