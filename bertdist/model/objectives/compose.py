"""A pretraining model as an encoder and objectives (bertdist.model.objectives): `ComposedPretraining`, whose one
`forward` every family with composable objectives shares, and `outcome`, the one sum of parts into the output the
trainer reads (ELECTRA's and DistilBERT's forwards end in it too).

The encoder runs once per forward. With `masked_lm_positions`, its last layer runs only at the objectives' queries
concatenated in their order (the MLM predictions, each sample's [CLS] for the sentence head, both bounds of each
span), as MosaicBERT does: nothing else of that layer reaches a loss. Every batch makes the same module calls,
whatever its lengths (the ZeRO-3 rule, bertdist.model.bert.model).
"""

from __future__ import annotations

import functools
import operator

import torch
from torch import nn

from bertdist.config.objectives import SENTENCE_TASKS
from bertdist.model.layout import TokenLayout
from bertdist.model.objectives.contract import Batch, Objective, Part
from bertdist.model.outputs import PreTrainingOutput, Scored


class ComposedPretraining(nn.Module):
    """A family's pretraining model: `objectives` is the family's, `encode` its encoder's; `forward` is this."""

    ENCODER: str
    """The attribute holding the bare encoder (its Hugging Face prefix: `bert`, `albert`, `roberta`, `model`),
    whose `encode(input_ids, token_type_ids, attention_mask, at)` this calls (an encoder without segments takes the
    token types and reads none)."""

    def encode(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        at: torch.Tensor | None,
    ) -> tuple[torch.Tensor, TokenLayout]:
        """The final states, (samples, k, hidden) at `at` (positions from each sample's first token) or every
        token's in the layout's space, and the layout."""
        return getattr(self, self.ENCODER).encode(input_ids, token_type_ids, attention_mask, at)

    def objectives(self) -> list[Objective]:
        """What the model's config trains, each bound to the family's heads (made anew per call: they hold
        no state of their own). Their order is the order of the last layer's rows: a sentence task comes first, as
        [CLS] always has, so that a run repeats its results from before this package to the last bit
        (tests/train/test_reference.py)."""
        raise NotImplementedError

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        masked_lm_positions: torch.Tensor | None = None,
        masked_lm_ids: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        masked_lm_span_bounds: torch.Tensor | None = None,
    ) -> PreTrainingOutput:
        """Logits and losses for a batch (bertdist.model.protocol.PretrainingModel).

        With `masked_lm_positions` (samples, predictions), the heads run only there and `masked_lm_ids` has the
        same shape; without it, the MLM head runs on every position and `masked_lm_ids` is (batch, seq) like
        Hugging Face's `labels`. Label -100 marks slots without a prediction."""
        batch = Batch(
            input_ids,
            token_type_ids,
            attention_mask,
            masked_lm_positions,
            masked_lm_ids,
            next_sentence_label,
            masked_lm_span_bounds,
        )
        return self.losses(batch)

    def losses(self, batch: Batch) -> PreTrainingOutput:
        """The objectives' parts, composed; a family whose objective runs a second encoder (ELECTRA's
        discriminator, distillation's teacher) computes its parts here itself and ends in `outcome`."""
        return compose(self, self.objectives(), batch)


def compose(model: ComposedPretraining, objectives: list[Objective], batch: Batch) -> PreTrainingOutput:
    """Encode once, at the union of the objectives' queries when each has them, and collect their parts."""
    queries = [o.queries(batch) for o in objectives]
    inputs = batch.input_ids, batch.token_type_ids, batch.attention_mask
    if all(q is not None for q in queries):
        at = queries[0] if len(queries) == 1 else torch.cat(queries, 1)
        states, _ = model.encode(*inputs, at)
        views = states.split([q.shape[1] for q in queries], dim=1)
        parts = [o.at_queries(view, batch) for o, view in zip(objectives, views)]
    else:
        states, layout = model.encode(*inputs, None)
        parts = [o.everywhere(states, layout, batch) for o in objectives]
    return outcome([p for p in parts if p is not None])


def outcome(parts: list[Part]) -> PreTrainingOutput:
    """The output of a forward's parts: the loss is their weighted sum when every part's labels were given."""
    components = {p.name: p.loss for p in parts if p.loss is not None}
    scored = {p.name: Scored(p.logits, p.labels, p.hits) for p in parts if p.labels is not None}
    loss = None
    if parts and len(components) == len(parts):
        loss = functools.reduce(operator.add, (p.loss if p.weight == 1 else p.weight * p.loss for p in parts))
    by_name = {p.name: p for p in parts}
    sentence = next((by_name[t] for t in SENTENCE_TASKS if t in by_name), None)
    return PreTrainingOutput(
        loss,
        components.get("mlm"),
        None if sentence is None else sentence.loss,
        by_name["mlm"].logits if "mlm" in by_name else None,
        None if sentence is None else sentence.logits,
        components,
        scored,
    )
