"""`finetune.cache_rows`: the gradient cache gives the parameters the gradient of the plain contrastive loss over
the same rows (dropout replayed), on one rank and gathered across two, and a fine-tuning runs with it."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from bertdist.finetune.contrastive import info_nce, info_nce_backward
from bertdist.finetune.grad_cache import cached_step
from bertdist.model.sentence import SentenceEmbedder
from bertdist.train.ports import free_tcp_port
from tests.conftest import TEST_VOCAB_SIZE, tiny_model_config

TEMPERATURE = 0.1
ROWS = 8


class _Engine:
    """What cached_step asks of DeepSpeed's engine, on a plain module: gradients accumulate unscaled, no step."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def __call__(self, **batch: torch.Tensor) -> Any:
        return self.model(**batch)

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool) -> None:
        assert not scale_wrt_gas
        loss.backward()

    def fp16_enabled(self) -> bool:  # fp32: bertdist.train.deepspeed.backward has no loss scale to apply
        return False

    def step(self) -> None:
        pass


def _model_and_rows(dropout: float) -> tuple[SentenceEmbedder, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    cfg = tiny_model_config(hidden_dropout_prob=dropout, attention_dropout_prob=dropout)
    ids = torch.randint(5, TEST_VOCAB_SIZE, (ROWS, 3, 12))  # a query, its positive, a hard negative
    mask = torch.ones_like(ids)
    mask[::3, :, 9:] = 0  # some padding
    return SentenceEmbedder(cfg).train(), {"input_ids": ids, "attention_mask": mask}


def _chunks(rows: dict[str, torch.Tensor], rows_per_chunk: int) -> list[dict[str, torch.Tensor]]:
    split = {k: v.split(rows_per_chunk) for k, v in rows.items()}
    return [{k: parts[i] for k, parts in split.items()} for i in range(len(split["input_ids"]))]


def _gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _plain(
    rows: dict[str, torch.Tensor], rows_per_chunk: int, seed: int, dims: tuple[int, ...] = ()
) -> dict[str, torch.Tensor]:
    """The uncached loss over all the rows with the activations of every chunk kept: the reference. Chunk by chunk
    so that dropout draws its masks as the cache's first pass does."""
    model, _ = _model_and_rows(dropout=0.1)
    torch.manual_seed(seed)
    vectors = torch.cat([model(**chunk).logits for chunk in _chunks(rows, rows_per_chunk)])
    info_nce(vectors, TEMPERATURE, dims).backward()
    return _gradients(model)


@pytest.mark.parametrize("rows_per_chunk,query_rows,dims", [(2, 3, ()), (4, 4, (64, 16))])
def test_the_cached_gradient_is_the_plain_losss_with_dropout_replayed(rows_per_chunk, query_rows, dims):
    """Through the cache, the loss's backward by blocks of `query_rows` queries (3: a last block of 2), with and
    without Matryoshka widths, gives the gradient of the plain loss over all the rows."""
    model, rows = _model_and_rows(dropout=0.1)
    torch.manual_seed(7)
    loss = cached_step(
        _Engine(model), _chunks(rows, rows_per_chunk), lambda v: info_nce_backward(v, TEMPERATURE, dims, query_rows)
    )
    cached, plain = _gradients(model), _plain(rows, rows_per_chunk, seed=7, dims=dims)
    assert cached.keys() == plain.keys() and len(cached) > 10
    for name in plain:
        torch.testing.assert_close(cached[name], plain[name], atol=1e-5, rtol=1e-5, msg=name)
    torch.manual_seed(7)
    with torch.no_grad():
        reference = torch.cat([model(**c).logits for c in _chunks(rows, rows_per_chunk)])
    assert loss == pytest.approx(float(info_nce(reference, TEMPERATURE, dims)), abs=1e-5)
    other = _plain(rows, rows_per_chunk, seed=8, dims=dims)  # dropout is on: other masks, another gradient
    assert not torch.allclose(
        other["bert.embeddings.word_embeddings.weight"], plain["bert.embeddings.word_embeddings.weight"]
    )


class _HalfEngine(_Engine):
    """An engine in fp16 (DeepSpeed's fp16 mode hands back half vectors)."""

    def __call__(self, **batch: torch.Tensor) -> Any:
        out = self.model(**batch)
        out.logits = out.logits.half()
        return out


def test_the_cached_loss_and_its_gradient_are_fp32_under_an_fp16_engine():
    """d loss / d vector is about 1 / rows of the loss: held in fp16 before pass 2's loss scale, at 2,048 rows most
    of it was subnormal and some zero. The loss gets fp32 vectors, and the parameters the plain loss's gradient."""
    model, rows = _model_and_rows(dropout=0.1)
    seen: list[torch.dtype] = []

    def loss_backward(vectors: torch.Tensor) -> float:
        seen.append(vectors.dtype)
        return info_nce_backward(vectors, TEMPERATURE, (), 4)

    torch.manual_seed(7)
    cached_step(_HalfEngine(model), _chunks(rows, 4), loss_backward)
    assert seen == [torch.float32]
    cached, plain = _gradients(model), _plain(rows, 4, seed=7)
    for name in plain:
        torch.testing.assert_close(cached[name], plain[name], rtol=2e-2, atol=1e-3, msg=lambda m, n=name: f"{n}: {m}")


def _rank_gradients(rank: int, world: int, port: int, out: str) -> None:
    """One rank's share of the rows through the cache in chunks of 2 (the loss's backward in blocks of 3 queries,
    over Matryoshka widths), its gradients averaged as DeepSpeed's."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model, rows = _model_and_rows(dropout=0.0)  # one process's masks could not be split between two
    mine = {k: v.chunk(world)[rank] for k, v in rows.items()}
    cached_step(_Engine(model), _chunks(mine, 2), lambda v: info_nce_backward(v, TEMPERATURE, (64, 32), 3))
    grads = _gradients(model)
    for g in grads.values():
        dist.all_reduce(g)
        g /= world
    torch.save(grads, f"{out}/rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def test_two_ranks_through_the_cache_give_the_gradient_of_one_process_with_the_whole_batch(tmp_path):
    torch.multiprocessing.spawn(_rank_gradients, args=(2, free_tcp_port(), str(tmp_path)), nprocs=2)
    model, rows = _model_and_rows(dropout=0.0)
    info_nce(model(**rows).logits, TEMPERATURE, (64, 32)).backward()
    whole = _gradients(model)
    for rank in range(2):
        theirs = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        for name in whole:
            torch.testing.assert_close(theirs[name], whole[name], atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize(
    "extra,world_size,expected",
    [
        (["finetune.cache_rows=-4"], 1, "finetune.cache_rows: must be 0 (off) or positive, got -4"),
        (["finetune.cache_rows=12"], 2, "finetune.cache_rows: 12 does not divide each rank's rows per step"),
        (["finetune.cache_rows=4", "finetune.task=classification"], 1, "finetune.cache_rows: only for embedding"),
    ],
)
def test_bad_cache_rows_are_refused_naming_the_field(extra, world_size, expected):
    from bertdist.config import ConfigError, load_config
    from bertdist.config.validation import validate_finetune

    base = ["finetune.task=embedding", "finetune.text_pair_column=passage", "finetune.batch_size=32"]
    files = ["finetune.micro_batch_size=16", "finetune.train_file=t.jsonl", "finetune.dev_file=d.jsonl"]
    cfg = load_config(None, [*base, *files, *extra])
    with pytest.raises(ConfigError) as refused:
        validate_finetune(cfg, world_size)
    named = [p for p in refused.value.problems if p.startswith("finetune.cache_rows")]
    assert len(named) == 1 and expected in named[0], refused.value.problems
    validate_finetune(load_config(None, [*base, *files, "finetune.cache_rows=8"]), world_size=2)  # 16 rows each
    # the docs' setup: micro_batch_size sets the dev batches only, and needs not divide a rank's rows
    dev_batches = ["finetune.micro_batch_size=32", "finetune.cache_rows=8"]
    validate_finetune(load_config(None, [*base, *files[1:], *dev_batches]), world_size=2)
