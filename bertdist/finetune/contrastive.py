"""`finetune.task=embedding`: sentence embeddings trained contrastively on (query, positive) pairs.

Rows come from the same CSV/TSV/JSONL reader as classification: `finetune.text_column` is the query,
`finetune.text_pair_column` the passage that answers it, and `finetune.negative_columns` (optional,
comma-separated) hard negatives: passages that look relevant and are not. A row is encoded as its query, its
positive and its negatives, each `[CLS] text [SEP]` cut to max_seq_length, one sequence apiece (a group, as a
multiple-choice question's choices are).

The loss is InfoNCE with in-batch negatives (sentence-transformers' MultipleNegativesRankingLoss): each query's
cosine similarity to every passage of the step, divided by `finetune.temperature`, and the cross-entropy of
picking its own positive. With more than one rank, the passages are gathered from every rank, so a query is
scored against world_size x micro_batch_size x (1 + negatives) passages, as large-batch contrastive training
needs. The gather is differentiable (`_GatherWithGradient`): its backward sends each rank the gradients that every
rank's queries put on its passages (an all-reduce of the gathered gradient, then the rank's slice), so rank r's
parameters receive d(sum over ranks of their losses)/d(its activations), and DeepSpeed's average of the ranks'
gradients is then the gradient of the mean loss over all queries of the step: the same as one rank with the whole
batch (tests/finetune/test_contrastive.py checks it against a single process). Negatives come from the micro batch
(every rank's): gradient accumulation adds micro batches' gradients but not their passages, so to score
against the whole step's passages set micro_batch_size = batch_size / ranks, or, where that does not fit in
memory, `finetune.cache_rows` (the same loss over the whole step, encoded in chunks: bertdist.finetune.grad_cache).

`finetune.matryoshka_dims` trains nested prefixes of the vector as well: the loss is summed over each prefix
(Kusupati et al. 2022), so a vector cut to any of them still ranks.

Dev: every distinct dev query is searched among the dev file's passages (positives and negatives, each distinct
text once); the positives of its rows are the relevant passages. Or the dev set is a BEIR-format directory
(`bertdist pairs --dev-dir` writes one from held-out documents), whose judged queries search its whole corpus.
The metrics are BEIR's: nDCG@10 (the headline), MRR@10 and Recall@100 (bertdist.finetune.metrics.retrieval_scores),
on unit-length vectors ranked by dot product; with Matryoshka dimensions also nDCG@10 at each narrower one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from bertdist.finetune.data import Examples
from bertdist.finetune.features import Sequences

if TYPE_CHECKING:
    from bertdist.finetune.beir import Collection

METRICS = ("ndcg_at_10", "mrr_at_10", "recall_at_100")
"""The dev metrics, headline first."""


def checked_pairs(
    examples: Examples, negative_columns: tuple[str, ...], skip_bad: bool, normalize: Callable[[str], str]
) -> Examples:
    """`examples` without the rows that would teach nothing or the opposite of what they mean: a query equal to
    its positive, a hard negative equal to its positive (a false negative), as the model reads them (whitespace
    aside, and case and accents for an uncased one: `normalize`, finetune.data.same_text). DataError naming
    FILE:LINE, or with finetune.on_bad_input=skip skipped and counted; DataError when no row is left."""
    from bertdist.data import DataError
    from bertdist.finetune.data import bad_row, same_text

    kept = []
    for e in examples.rows:
        positive = same_text(e.pair or "", normalize)
        same = [c for c, text in zip(negative_columns, e.choices) if same_text(text, normalize) == positive]
        if same_text(e.text, normalize) == positive:
            bad_row(examples, e.where, "the query is the same text as its positive", skip_bad)
        elif same:
            bad_row(examples, e.where, f"the hard negative {same[0]!r} is the same text as the positive", skip_bad)
        else:
            kept.append(e)
    if not kept:
        raise DataError(f"{examples.path}: no usable pair ({len(examples.skipped)} skipped)")
    examples.rows = kept
    return examples


def training_rows(examples: Examples, vocab_file: str, cased: bool, length: int) -> Sequences:
    """Each row's query, positive and negatives as one group of sequences."""
    texts = [t for e in examples.rows for t in (e.text, e.pair or "", *e.choices)]
    return _sequences(texts, vocab_file, cased, length, group=2 + len(examples.rows[0].choices))


def row_texts(examples: Examples, normalize: Callable[[str], str]) -> list[frozenset[int]]:
    """Each row's query, positive and negatives as text ids, the same id for the same text as the model reads it
    (`normalize`: finetune.data.same_text)."""
    from bertdist.finetune.data import same_text

    ids: dict[str, int] = {}
    return [
        frozenset(ids.setdefault(same_text(t, normalize), len(ids)) for t in (e.text, e.pair or "", *e.choices))
        for e in examples.rows
    ]


def dev_rows(
    examples: Examples, vocab_file: str, cased: bool, length: int, dims: tuple[int, ...] = ()
) -> tuple[Sequences, Callable]:
    """The distinct dev queries then the distinct dev passages, one sequence each, and the function scoring their
    vectors. A query on several rows is one query whose positives are all relevant (scored apart, each would count
    its other positives as misses); texts are the same whitespace aside (finetune.data.same_text)."""
    from bertdist.finetune.data import same_text

    passages: dict[str, int] = {}  # same text -> passage row
    passage_texts: list[str] = []  # as first seen
    queries: dict[str, dict[int, int]] = {}  # same text -> its positives' rows -> grade
    query_texts: list[str] = []
    for e in examples.rows:
        for text in (e.pair or "", *e.choices):
            if same_text(text) not in passages:
                passages[same_text(text)] = len(passage_texts)
                passage_texts.append(text)
        if same_text(e.text) not in queries:
            query_texts.append(e.text)
        queries.setdefault(same_text(e.text), {})[passages[same_text(e.pair or "")]] = 1
    relevant = list(queries.values())
    own = [passages.get(same_text(text), -1) for text in query_texts]  # a query that is also a passage ...
    own = [-1 if row in positives else row for row, positives in zip(own, relevant)]  # ... and not its positive
    sequences = _sequences(query_texts + passage_texts, vocab_file, cased, length, group=1)
    return sequences, lambda outputs: retrieval_metrics(np.stack(outputs), len(relevant), relevant, dims, own)


def collection_dev_rows(
    collection: Collection, vocab_file: str, cased: bool, length: int, dims: tuple[int, ...] = ()
) -> tuple[Sequences, Callable]:
    """A BEIR-format dev set (bertdist.finetune.beir): its judged queries then its whole corpus, one sequence
    each, and the function scoring their vectors against the judgments (graded, several relevant documents a
    query allowed)."""
    from bertdist.finetune.beir import corpus_texts

    row = {doc: r for r, doc in enumerate(collection.doc_ids)}
    judged = [{row[doc]: grade for doc, grade in collection.qrels[q].items()} for q in collection.queries]
    own = [row.get(q, -1) for q in collection.queries]  # a passage with the query's id (Quora, ArguAna)
    texts = list(collection.queries.values()) + [t for block in corpus_texts(collection, 4096) for t in block]
    sequences = _sequences(texts, vocab_file, cased, length, group=1)
    return sequences, lambda outputs: retrieval_metrics(np.stack(outputs), len(judged), judged, dims, own)


def retrieval_metrics(
    vectors: np.ndarray,
    queries: int,
    relevant: Sequence[int | dict[int, int]],
    dims: tuple[int, ...] = (),
    own: Sequence[int] = (),
) -> dict[str, float]:
    """nDCG@10, MRR@10 and Recall@100 of the first `queries` vectors searching the rest, by cosine similarity;
    query i's relevant passages are `relevant[i]`: one passage row, or passage row -> grade. `own[i]`, where
    given and not -1, is a passage row that is query i itself (its text, or its id in a BEIR collection): it is
    left out of query i's results, as BEIR and `evaluate --suite retrieval` leave it, since it would rank first
    at similarity 1 (pairs of neighbouring sentences make one row's query the next row's positive). With
    Matryoshka `dims`, nDCG@10 of the vectors cut to each dimension narrower than the whole is added as
    `ndcg_at_10_dim<D>` (each prefix normalised after the cut, as cosine similarity of truncated vectors is)."""
    from bertdist.finetune.metrics import retrieval_scores
    from bertdist.finetune.retrieval import TOP_K, top_k

    qrels = {
        str(q): {str(p): g for p, g in r.items()} if isinstance(r, dict) else {str(r): 1}
        for q, r in enumerate(relevant)
    }

    skip = list(own) or [-1] * queries

    def scores(width: int) -> dict[str, float]:
        cut = vectors[:, :width]
        unit = (cut / np.linalg.norm(cut, axis=1, keepdims=True)).astype(np.float32)
        found, rows = top_k(unit[:queries], unit[queries:], TOP_K + 1)
        run = {
            str(q): dict([(str(p), float(s)) for p, s in zip(rows[q], found[q]) if p != skip[q]][:TOP_K])
            for q in range(queries)
        }
        return retrieval_scores(run, qrels)

    whole = scores(vectors.shape[1])
    out = {name: whole[name] for name in METRICS}
    for width in (d for d in dims if d < vectors.shape[1]):
        out[f"ndcg_at_10_dim{width}"] = scores(width)["ndcg_at_10"]
    return out


def info_nce(vectors: torch.Tensor, temperature: float, dims: tuple[int, ...] = ()) -> torch.Tensor:
    """The mean over this rank's queries of InfoNCE against the passages of every rank; with Matryoshka `dims`,
    the sum of that loss over the vectors cut to each dimension (sentence-transformers' MatryoshkaLoss with its
    default weights of 1), so that every prefix is trained to retrieve on its own.

    `vectors` (rows, group, hidden): per row its query, its positive, then its negatives. The passages are
    gathered once, whole, and cut after: one collective whatever the number of dimensions."""
    queries, passages, positives = _queries_and_passages(vectors)
    return _loss(queries, passages, positives, temperature, dims)


def info_nce_backward(vectors: torch.Tensor, temperature: float, dims: tuple[int, ...], query_rows: int) -> float:
    """`info_nce` of the leaf `vectors`, its gradient left in `vectors.grad`, computed `query_rows` queries at a
    time: the gradient cache's first pass (bertdist.finetune.grad_cache), where the step's whole batch scores
    against every passage and one (queries x passages) similarity matrix of it, with its softmax and gradient,
    would be the largest thing in memory. Each block's share of the loss is backpropagated onto detached copies
    of the queries and the gathered passages, whose gradients add up; the sum then goes back through the gather
    once (one all-reduce). Returns the loss."""
    queries, passages, positives = _queries_and_passages(vectors)
    query_leaf, passage_leaf = (t.detach().requires_grad_() for t in (queries, passages))
    total = 0.0
    for first in range(0, len(queries), query_rows):
        block = slice(first, first + query_rows)
        share = len(positives[block]) / len(queries)  # the loss is a mean over all the queries
        part = _loss(query_leaf[block], passage_leaf, positives[block], temperature, dims) * share
        part.backward()
        total += float(part.detach())
    torch.autograd.backward([queries, passages], [query_leaf.grad, passage_leaf.grad])
    return total


def _queries_and_passages(vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's queries, the passages of every rank (gathered, with gradient), and each query's positive's row
    among them."""
    queries = vectors[:, 0].float()
    passages = vectors[:, 1:].float().reshape(-1, vectors.shape[-1])  # (rows x passages, hidden)
    rank = 0
    if dist.is_initialized() and dist.get_world_size() > 1:
        rank = dist.get_rank()
        passages = _GatherWithGradient.apply(passages)  # every rank has the same rows per micro batch
    per_row = vectors.shape[1] - 1
    positives = rank * len(queries) * per_row + torch.arange(len(queries), device=vectors.device) * per_row
    return queries, passages, positives


def _loss(
    queries: torch.Tensor, passages: torch.Tensor, positives: torch.Tensor, temperature: float, dims: tuple[int, ...]
) -> torch.Tensor:
    """Cross-entropy of each query picking its positive among `passages` by cosine similarity / temperature,
    summed over the widths `dims` (the whole vector where empty)."""
    losses = [
        F.cross_entropy(
            F.normalize(queries[:, :width], dim=-1) @ F.normalize(passages[:, :width], dim=-1).T / temperature,
            positives,
        )
        for width in dims or (queries.shape[-1],)
    ]
    return torch.stack(losses).sum()


class _GatherWithGradient(torch.autograd.Function):
    """Every rank's rows, concatenated in rank order; the backward hands each rank the sum over all ranks of the
    gradients on its own rows (an all-reduce of the whole gradient, then this rank's slice). Written here rather
    than taken from torch.distributed.nn (deprecated in torch 2.x, and an all-to-all there) so that it runs on
    every backend, gloo included."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor) -> torch.Tensor:
        gathered = [torch.empty_like(rows) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, rows.contiguous())
        return torch.cat(gathered)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        dist.all_reduce(grad)
        mine = grad.shape[0] // dist.get_world_size()
        return grad[dist.get_rank() * mine : (dist.get_rank() + 1) * mine]


def _sequences(texts: list[str], vocab_file: str, cased: bool, length: int, group: int) -> Sequences:
    from bertdist.data.tokenizer import open_tokenizer
    from bertdist.finetune.features import Layout

    tokenizer = open_tokenizer(vocab_file, cased)
    layout = Layout.of(tokenizer)
    ids = [layout.sequence(e.ids[: length - 2])[0] for e in tokenizer.encode_batch(texts)]
    return Sequences(ids, np.asarray([len(s) for s in ids], dtype=np.int64), group=group)
