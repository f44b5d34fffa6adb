"""Where the real tokens of a (rows, seq) batch are, and of which sample: padding, unpadding and packing.

A batch arrives as a grid of `rows x seq` slots with an `attention_mask`: 0 marks padding, k >= 1 the k-th sample
of its row. The usual 0/1 mask is the case of one sample per row; a packed batch (`data.packing`) has several,
each a contiguous run, with positions restarting at its `[CLS]` and attention kept inside it (block-diagonal).

The encoder runs in one of two spaces:
- **padded** (the grid, (rows, seq, hidden)): every slot is computed; attention gets a key mask, or a
  block-diagonal mask for packed rows, or none when nothing is padding;
- **unpadded** (`model.unpad`, (tokens, hidden)): the real tokens only, sample after sample, as MosaicBERT and
  ModernBERT do. Every matmul and LayerNorm then costs per real token. Attention runs per sample: through
  flash attention's variable-length kernel on CUDA (`torch.nn.attention.varlen`) when no attention dropout is
  applied (that kernel has none), otherwise on (samples, length, ...) grids of samples of similar length
  (buckets `ATTENTION_BUCKET_TOKENS` wide), each with a key mask, so that a short sample does not pay for
  attention over the longest one's length. At length 512 about half the slots of real BERT data are padding.

Heads address samples through `starts` (each sample's first token in the space in use), so the MLM head
gathers `starts + masked position` and NSP / classification pool `starts`, whatever the space; heads that need
every position (tagging, QA) get the grid back from `to_grid`. A last layer computed at a few positions per sample
only attends through `attention_at`.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from bertdist.model import attention as kernels

ATTENTION_BUCKET_TOKENS = 64
"""Samples whose lengths round up to the same multiple of this share one attention grid (unpadded, CPU path)."""


class TokenLayout:
    """The samples of one batch; built once per forward pass and shared by every layer."""

    def __init__(self, attention_mask: torch.Tensor | None, rows: int, seq: int, device: torch.device, unpad: bool):
        self.rows, self.seq = rows, seq
        self.slot_map = attention_mask
        self._block_masks: dict[int, object] = {}
        self.packed = attention_mask is not None and bool((attention_mask > 1).any())
        dense = attention_mask is None or (not self.packed and bool(attention_mask.bool().all()))
        self.unpadded = unpad and not dense
        if not (self.unpadded or self.packed):  # one sample per row, run padded: a key mask at most
            self.grid_starts = torch.arange(rows, device=device) * seq
            self.mask = None if dense else attention_mask.bool().reshape(rows, seq)[:, None, None, :]
            return
        slots = attention_mask.reshape(rows, seq)
        previous = F.pad(slots[:, :-1], (1, 0))
        first = ((slots > 0) & (slots != previous)).reshape(-1)
        self.grid_starts = first.nonzero().squeeze(1)
        self.token_index = (slots.reshape(-1) > 0).nonzero().squeeze(1)
        self.sample_of_token = sample_of_token = first[self.token_index].cumsum(0) - 1
        self.lengths = torch.bincount(sample_of_token, minlength=len(self.grid_starts))
        self.position_ids = self.token_index - self.grid_starts[sample_of_token]
        if self.unpadded:
            self.cu_seqlens = F.pad(self.lengths.cumsum(0), (1, 0)).to(torch.int32)
            late = self.grid_starts.remainder(seq).max() if not self.packed else self.lengths.new_zeros(())
            longest, first_slot = torch.stack([self.lengths.max(), late]).tolist()  # one host sync for both
            self.max_seqlen = int(longest)
            if first_slot:
                raise ValueError(
                    "attention_mask: a row's padding comes before its tokens (left padding); bertdist reads rows "
                    "right-padded, as its batches and tokenizers make them: unpadded, a left-padded row's positions "
                    "would count from its first token, padded from slot 0 (transformers')"
                )
        else:  # packed: block-diagonal; a padding query attends to its row's real keys to stay finite
            keys = slots[:, None, None, :]
            queries = slots[:, None, :, None]
            self.mask = (keys > 0) & ((queries == keys) | (queries == 0))

    @functools.cached_property
    def buckets(self) -> list[tuple[int, int, torch.Tensor | None]]:
        """The attention grids of the unpadded sdpa path, (samples, length, key mask) each; built at the first layer
        that asks (the fused kernels never do: on a GPU this costs a host sync per batch), with `sample_slots`, each
        token's slot in their concatenation, and `grid_size`."""
        keys = (self.lengths + ATTENTION_BUCKET_TOKENS - 1) // ATTENTION_BUCKET_TOKENS
        base = torch.empty_like(self.lengths)
        buckets = []
        offset = 0
        for key in torch.unique(keys).tolist():
            members = (keys == key).nonzero().squeeze(1)
            width, mask = _key_grid(self.lengths[members])
            base[members] = offset + torch.arange(len(members), device=keys.device) * width
            buckets.append((len(members), width, mask))
            offset += len(members) * width
        self.grid_size = offset
        self.sample_slots = base[self.sample_of_token] + self.position_ids
        return buckets

    @property
    def num_samples(self) -> int:
        return len(self.grid_starts)

    @property
    def starts(self) -> torch.Tensor:
        """Index of each sample's first token ([CLS]) in the flattened states of the space in use."""
        return self.cu_seqlens[:-1].long() if self.unpadded else self.grid_starts

    def inputs(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None):
        """(input_ids, token_type_ids, position_ids) as the embeddings read them in the space in use;
        position_ids None means 0..seq-1 in every row."""
        if self.unpadded:
            types = None if token_type_ids is None else token_type_ids.reshape(-1)[self.token_index]
            return input_ids.reshape(-1)[self.token_index], types, self.position_ids
        if self.packed:
            positions = torch.zeros(self.rows * self.seq, dtype=torch.long, device=input_ids.device)
            positions[self.token_index] = self.position_ids
            return input_ids, token_type_ids, positions.view(self.rows, self.seq)
        return input_ids, token_type_ids, None

    @torch.compiler.disable  # Python over this batch's lengths: out of the compiled layers (bertdist.model.compiled)
    def attention(
        self,
        qkv: torch.Tensor,
        num_heads: int,
        attend,
        dropout_p: float,
        scale: float,
        window: int = 0,
        backend: str = "auto",
    ) -> torch.Tensor:
        """Self-attention over the fused (..., 3 x hidden) projections of the space in use, on the kernel
        `backend` (`model.attention`) gives this call (bertdist.model.attention.kernel).

        `attend(q, kv, mask)` is the padded-space attention of the sdpa kernel, (batch, seq, hidden) queries and
        (batch, seq, 2 hidden) keys and values -> (batch, seq, hidden), and `dropout_p` the attention dropout it
        will apply (the fused kernels have none). `attend` runs once per length bucket, so it must call no module:
        every rank has to make the same module calls under ZeRO-3 (`bertdist.model.bert.model`). `scale`: the
        softmax scale the fused kernels apply (what `attend` applies itself). `window` > 0: the layer attends at
        most this many slots away (ModernBERT's local layers; `attend` masks it on the grids it gets)."""
        hidden = qkv.shape[-1] // 3
        chosen = kernels.kernel(backend, qkv, self.unpadded, dropout_p, bool(window))
        if chosen == "varlen":
            return kernels.varlen(qkv, self.cu_seqlens, self.max_seqlen, num_heads, scale, window)
        if chosen == "flex":
            rows = qkv.view(1, -1, qkv.shape[-1]) if self.unpadded else qkv
            return kernels.flex(rows, self.block_mask(window), num_heads, scale).view(*qkv.shape[:-1], hidden)
        # `split`, not slices: a slice's backward writes its gradient into a zeroed tensor of the whole projection's
        # size and autograd sums the two; split's is one concatenation (~5% of a BERT-mini CPU step).
        if not self.unpadded:
            return attend(*qkv.split([hidden, 2 * hidden], -1), self.mask)
        buckets = self.buckets  # first: it sets grid_size and sample_slots
        grid = qkv.new_zeros(self.grid_size, qkv.shape[-1]).index_copy(0, self.sample_slots, qkv)
        outputs, at = [], 0
        for samples, width, mask in buckets:
            bucket = grid[at : at + samples * width].view(samples, width, -1)
            outputs.append(attend(*bucket.split([hidden, 2 * hidden], -1), mask).reshape(-1, hidden))
            at += samples * width
        return (outputs[0] if len(outputs) == 1 else torch.cat(outputs))[self.sample_slots]

    def block_mask(self, window: int):
        """FlexAttention's block mask of this batch for a layer of this `window` (0: the whole sample), built at
        the first layer that asks and shared by the others: one row numbering every sample when unpadded."""
        if window not in self._block_masks:
            if self.unpadded:
                slots = (self.sample_of_token + 1)[None]
            elif self.slot_map is None:
                slots = torch.ones(self.rows, self.seq, dtype=torch.long, device=self.grid_starts.device)
            else:
                slots = self.slot_map.reshape(self.rows, self.seq)
            self._block_masks[window] = kernels.block_mask(slots, window)
        return self._block_masks[window]

    @torch.compiler.disable
    def attention_at(self, q: torch.Tensor, kv: torch.Tensor, attend) -> torch.Tensor:
        """Attention for a few queries per sample: q (samples, k, hidden) and the (..., 2 hidden) keys and
        values of every token of the space in use -> (samples, k, hidden). The keys and values are laid out as
        one (samples, longest) grid: with k queries per sample instead of its length, attention is cheap and
        needs no buckets."""
        if not (self.unpadded or self.packed):
            return attend(q, kv, self.mask)
        flat = kv.reshape(-1, kv.shape[-1])
        if not self.unpadded:
            flat = flat[self.token_index]
        width, mask = _key_grid(self.lengths)
        slots = self.sample_of_token * width + self.position_ids
        grid = flat.new_zeros(self.num_samples * width, flat.shape[-1]).index_copy(0, slots, flat)
        return attend(q, grid.view(self.num_samples, width, -1), mask)

    def to_grid(self, states: torch.Tensor) -> torch.Tensor:
        """States as (rows, seq, hidden); padding slots of an unpadded run are zeros."""
        if not self.unpadded:
            return states
        grid = states.new_zeros(self.rows * self.seq, states.shape[-1])
        return grid.index_copy(0, self.token_index, states).view(self.rows, self.seq, -1)

    def first_tokens(self, states: torch.Tensor) -> torch.Tensor:
        """(samples, hidden): each sample's [CLS] state, what the pooler reads."""
        if not self.unpadded and not self.packed:
            return states[:, 0]
        return states.reshape(-1, states.shape[-1])[self.starts]

    def gather(self, states: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(samples, k, hidden): the states at `positions` (samples, k), counted from each sample's start."""
        flat = states.reshape(-1, states.shape[-1])
        index = (positions + self.starts[:, None]).reshape(-1)
        return flat[index].view(*positions.shape, flat.shape[-1])


def _key_grid(lengths: torch.Tensor) -> tuple[int, torch.Tensor | None]:
    """The width of a (samples, width) attention grid holding samples of these lengths (the longest, rounded up
    to 8) and its (samples, 1, 1, width) key mask, None when every sample fills the grid."""
    width = -(-int(lengths.max()) // 8) * 8
    mask = torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]
    return width, None if bool(mask.all()) else mask[:, None, None, :]
