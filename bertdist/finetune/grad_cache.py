"""A gradient cache (GradCache, Gao et al. 2021): one contrastive loss over more rows than fit through the encoder
with their activations at once (`finetune.cache_rows`).

An in-batch contrastive loss couples every row of its batch: a query's gradient depends on all the passages it
was scored against, so gradient accumulation over micro batches (which adds their gradients but never scores one
micro batch's queries against another's passages) is not the loss of the bigger batch. The loss itself is cheap,
though: it only needs the vectors. So a step encodes its rows in chunks twice:

1. every chunk forward without autograd (no activations kept), recording the RNG state before each so that
   dropout can be replayed; the vectors, concatenated into one leaf tensor, go through the loss (the task's:
   InfoNCE gathered across ranks) and its backward, which leaves d loss / d vector on the leaf;
2. every chunk forward again with autograd, under its recorded RNG state (the same dropout masks, so the same
   vectors), and the backward of `(vectors * their cached gradient).sum()`: by the chain rule that puts on the
   parameters exactly the chunk's share of d loss / d parameters.

Peak activation memory is one chunk's; what grows with the batch is only the vectors and one block of the loss's
similarity matrix (a chunk's queries x every passage: the loss is backpropagated a block of queries at a time).
The price is a second forward of every row (about a third more compute).

Pass 2 goes through the DeepSpeed engine, one `backward`/`step` per chunk, with the engine's gradient
accumulation set to the number of chunks (FinetuneConfig.gradient_accumulation_steps), so the optimizer steps at
the last one. `scale_wrt_gas=False`: each chunk's surrogate already carries its part of the whole loss, which
DeepSpeed's usual division by the accumulation steps would shrink. Across ranks, the loss's gather already hands
each rank d(sum of all ranks' losses)/d(its vectors), so DeepSpeed's average of the ranks' gradients is the
gradient of the mean loss, as without the cache (tests/finetune/test_grad_cache.py checks both against the
plain loss). Not here: which rows make a step (bertdist.finetune.runner), or the loss (the task's).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from bertdist.train import deepspeed as ds


def cached_step(
    engine: Any, chunks: list[dict[str, torch.Tensor]], loss_backward: Callable[[torch.Tensor], float]
) -> float:
    """One optimizer step of a loss over the vectors of all `chunks` (each a batch for `engine`); returns the loss.

    `loss_backward(vectors)`: the loss of a leaf tensor of vectors, its gradient left in `vectors.grad` (the
    task's: bertdist.finetune.contrastive.info_nce_backward, which works through the queries in blocks so that no
    whole similarity matrix is held). `engine`: the DeepSpeed engine (called for `.logits`, then `backward(...,
    scale_wrt_gas=False)` and `step()` per chunk), its gradient accumulation being `len(chunks)`."""
    states, vectors = [], []
    with torch.no_grad():
        for batch in chunks:
            states.append(_rng_state())
            vectors.append(engine(**batch).logits)
    after = _rng_state()
    # (rows, group, hidden): a leaf outside the encoder's graph, in fp32 whatever the engine's precision: d loss /
    # d vector shrinks as 1 / rows, and under fp16 it would be held before the loss scale (pass 2's) lifts it, so
    # at thousands of rows most of it would be below fp16's normal range or zero.
    cached = torch.cat(vectors).float().requires_grad_()
    value = loss_backward(cached)
    assert cached.grad is not None
    for batch, state, grad in zip(chunks, states, cached.grad.split([len(v) for v in vectors])):
        _set_rng_state(state)
        out = engine(**batch).logits
        ds.backward(engine, (out.float() * grad.float()).sum(), scale_wrt_gas=False)
        engine.step()
    _set_rng_state(after)  # where pass 1 left it: what follows draws as if each chunk had run once
    return value


def _rng_state() -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The generators dropout draws from: torch's CPU one and, where there is CUDA, every device's."""
    return torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []


def _set_rng_state(state: tuple[torch.Tensor, list[torch.Tensor]]) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda:
        torch.cuda.set_rng_state_all(cuda)
