"""Where a run starts (bertdist.train.starting): every rank from the same checkpoint, or none."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from bertdist.train.ports import free_tcp_port


def _start(rank: int, port: int, start: str | None, out: Path) -> None:
    from bertdist.train import starting
    from bertdist.train.distributed import DistributedEnv, destroy_process_group, init_process_group
    from bertdist.train.train_state import CheckpointError

    init_process_group(DistributedEnv(rank, 2, rank, "127.0.0.1", port, "none"), "gloo", rendezvous_timeout_s=30)
    try:
        starting.check_same_start(Path(start) if start else None, 2)
        (out / f"rank{rank}").write_text("agreed")
    except CheckpointError as e:
        (out / f"rank{rank}").write_text(str(e))
    finally:
        destroy_process_group()


def test_ranks_that_found_different_checkpoints_are_refused_on_every_rank(tmp_path):
    """A node whose newest copy was damaged fell back to an older checkpoint while the others resumed the newer:
    two models trained as one. Every rank says so and none starts."""
    context = multiprocessing.get_context("spawn")
    for starts, agreed in ((["/c/step_00000020", "/c/step_00000020"], True), (["/c/step_00000020", None], False)):
        port, out = free_tcp_port(), tmp_path / str(agreed)
        out.mkdir()
        processes = [context.Process(target=_start, args=(r, port, starts[r], out)) for r in range(2)]
        for p in processes:
            p.start()
        for p in processes:
            p.join(timeout=120)
            assert p.exitcode == 0
        said = [(out / f"rank{r}").read_text() for r in range(2)]
        if agreed:
            assert said == ["agreed", "agreed"]
        else:
            assert said[0] == said[1] and said[0].startswith("the ranks would not resume from one checkpoint: ")
            assert "step_00000020: rank(s) 0; a fresh start: rank(s) 1" in said[0]
