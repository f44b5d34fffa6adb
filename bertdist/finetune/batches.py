"""Which training rows make each step of an epoch: the epoch's seeded order cut into steps, and for a contrastive
task steps in which no text appears twice (`finetune.no_duplicates`).

In an in-batch contrastive loss every passage of the step is a negative for every query but its own. A text that
is in the step twice (a mined hard negative that is another row's positive, the same passage mined from two
documents, a query that is another row's passage) is then a negative equal to a positive: the loss pushes a query
away from its own answer, and a query whose positive is there twice cannot score better than ln 2. Steps are
therefore filled as sentence-transformers' NoDuplicatesBatchSampler fills its batches: rows in the epoch's order,
a row whose texts meet one already in the step waits for the next step (and goes first there). The order stays a
function of the seed and the epoch alone, so a resumed run rebuilds the same steps. Where the end of an epoch has
only rows that meet each other left, the last steps take them anyway and are counted, so that an epoch keeps its
len(rows) // batch_size steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def step_rows(
    order: np.ndarray, batch_size: int, steps: int, texts: Sequence[frozenset[int]] | None = None
) -> tuple[list[np.ndarray], int]:
    """The rows of each of `steps` steps of `batch_size`, from `order`; with `texts` (each row's text ids) no
    step holds a text twice while the epoch has rows enough. Returns the steps and how many of them had to."""
    if texts is None:
        return [order[s * batch_size : (s + 1) * batch_size] for s in range(steps)], 0
    out, waiting, next_row, repeated = [], [], 0, 0
    for _ in range(steps):
        rows: list[int] = []
        seen: set[int] = set()
        still_waiting = []
        for row in waiting:  # rows put off by earlier steps come first
            if len(rows) < batch_size and not texts[row] & seen:
                rows.append(row)
                seen |= texts[row]
            else:
                still_waiting.append(row)
        while len(rows) < batch_size and next_row < len(order):
            row = int(order[next_row])
            next_row += 1
            if texts[row] & seen:
                still_waiting.append(row)
            else:
                rows.append(row)
                seen |= texts[row]
        if len(rows) < batch_size:  # the epoch's last rows all meet the step: taken all the same
            repeated, need = repeated + 1, batch_size - len(rows)
            rows, still_waiting = rows + still_waiting[:need], still_waiting[need:]
        waiting = still_waiting
        out.append(np.array(rows, dtype=np.int64))
    return out, repeated
