"""`bertdist inspect`: what is in a prepared directory, in numbers and in decoded examples.

Reads every shard once (checksums verified against the manifest) and prints counts, a length histogram,
the masking and NSP statistics next to what BERT's rules imply, and a few examples decoded with the vocab.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from bertdist.config.schema import MaskingConfig
from bertdist.data.masking import prediction_cap
from bertdist.data.samples import Samples
from bertdist.data.shards import iter_directory_blocks, read_manifest
from bertdist.errors import DataError
from bertdist.storage import file_sha256


def shard_statistics(shard_dir: str) -> dict:
    """Per-directory statistics, also used by the tests; verifies every shard's checksum."""
    manifest = read_manifest(shard_dir)
    lengths, masked, not_next = [], [], []
    mask_tokens = same_tokens = 0
    mask_id = manifest.get("mask_id")
    counts: dict[str, int] = {}
    for path, block in iter_directory_blocks(shard_dir, verify_checksums=True):
        counts[path] = counts.get(path, 0) + len(block)
        lengths.append(block.lengths.astype(np.int64))
        masked.append(block.masked_counts.astype(np.int64))
        not_next.append(block.next_sentence_labels.astype(np.int64))
        at_positions = _tokens_at_masked_positions(block)
        mask_tokens += int((at_positions == mask_id).sum())
        same_tokens += int((at_positions == block.masked_lm_ids).sum())
    per_shard = list(counts.values())
    lengths_all, masked_all = np.concatenate(lengths), np.concatenate(masked)
    total_masked = max(int(masked_all.sum()), 1)
    return dict(
        samples=len(lengths_all),
        per_shard=per_shard,
        lengths=lengths_all,
        masked_per_sample=masked_all,
        masked_fraction=float(masked_all.sum() / lengths_all.sum()),
        not_next_fraction=float(np.concatenate(not_next).mean()),
        mask_token_fraction=mask_tokens / total_masked,
        unchanged_fraction=same_tokens / total_masked,
        manifest=manifest,
    )


def _tokens_at_masked_positions(block: Samples) -> np.ndarray:
    starts = block.token_offsets()[:-1]
    return block.input_ids[np.repeat(starts, block.masked_counts) + block.masked_lm_positions.astype(np.int64)]


def inspect_directory(shard_dir: str, examples: int = 3, vocab_file: str | None = None) -> str:
    stats = shard_statistics(shard_dir)
    manifest, opts, totals = stats["manifest"], stats["manifest"]["options"], stats["manifest"]["totals"]
    lengths, max_len = stats["lengths"], opts["max_seq_length"]
    # Manifests written before the fractions were recorded hold the defaults' masks.
    rules = MaskingConfig(**{f.name: opts[f.name] for f in dataclasses.fields(MaskingConfig) if f.name in opts})
    out = [
        f"{shard_dir}: {stats['samples']:,} samples in {len(stats['per_shard'])} shards "
        f"({min(stats['per_shard'])}-{max(stats['per_shard'])} per shard), checksums OK",
        "options: " + ", ".join(f"{k}={v}" for k, v in opts.items()),
        f"inputs: {len(manifest['inputs'])} files, {totals['documents']:,} documents, "
        f"{totals['duplicate_documents']:,} duplicates and {totals.get('empty_documents', 0):,} without a token "
        f"dropped, {len(manifest['skipped_inputs'])} files skipped",
    ]
    out += [f"  skipped {s['reason']}" for s in manifest["skipped_inputs"]]
    out.append(
        f"length: mean {lengths.mean():.1f}, {100 * (lengths == max_len).mean():.1f}% at max ({max_len}); histogram:"
    )
    edges = np.linspace(0, max_len, 9).astype(int)
    counts, _ = np.histogram(lengths, bins=np.append(edges[:-1], max_len + 1))
    peak = max(int(counts.max()), 1)
    for lo, hi, c in zip(edges[:-1], np.append(edges[1:-1], max_len), counts):
        out.append(f"  {lo:>5}-{hi:<5} {c:>10,} {'#' * int(40 * c / peak)}")
    if opts.get("masking") == "dynamic":  # the shards hold text; "0.00% masked" read as a broken prepare
        out.append(
            f"masking: at load time (masking dynamic): the shards hold no masks; the loader masks "
            f"{rules.masked_lm_prob:.0%} of tokens, at most {prediction_cap(rules, max_len)} per sample, afresh "
            "every epoch"
        )
    else:
        out.append(
            f"masking: {stats['masked_fraction']:.2%} of tokens (rule: {rules.masked_lm_prob:.0%}, at most "
            f"{prediction_cap(rules, max_len)} per sample; mean {stats['masked_per_sample'].mean():.2f}); "
            f"{stats['mask_token_fraction']:.1%} [MASK], {stats['unchanged_fraction']:.1%} unchanged (rule: "
            f"{rules.mask_token_fraction:.0%} / ~{1 - rules.mask_token_fraction - rules.random_token_fraction:.0%}+)"
        )
    out.append(
        {
            "nsp": f"next sentence: {stats['not_next_fraction']:.1%} NotNext (single-sentence chunks are always "
            "NotNext)",
            "sop": f"sentence order: {stats['not_next_fraction']:.1%} swapped",
            "mlm": "sentence task: none (samples mlm: contiguous text, no pairs)",
        }[opts["samples"]]
    )
    if examples:
        out.append(_examples(shard_dir, manifest, examples, vocab_file or manifest.get("vocab_file")))
    return "\n".join(out)


_EXAMPLE_LABELS = {"nsp": ("IsNext", "NotNext"), "sop": ("in order", "swapped"), "mlm": None}
"""How an example's sentence label reads, by the kind of samples: (label 0, label 1), or none."""


def _examples(shard_dir: str, manifest: dict, count: int, vocab_file: str | None) -> str:
    from bertdist.data import iter_samples
    from bertdist.data.tokenizer import open_tokenizer, tokenizer_file

    if not vocab_file or not os.path.exists(vocab_file):
        return "examples: pass --vocab to decode (the vocab recorded in the manifest is not available)"
    vocab_file = tokenizer_file(vocab_file)
    if file_sha256(vocab_file) != manifest["vocab_sha256"]:
        raise DataError(f"{vocab_file}: not the vocab these shards were made with (sha256 differs)")
    tokens = open_tokenizer(vocab_file).tokens
    dynamic = manifest["options"].get("masking") == "dynamic"
    lines = [
        "examples (tokens as stored; "
        + ("unmasked: the loader masks them)" if dynamic else "masked positions shown as [MASK]/token(original)):")
    ]
    for n, sample in zip(range(count), iter_samples(shard_dir)):
        ids = sample["input_ids"].tolist()
        words = [tokens[i] for i in ids]
        for pos, label in zip(sample["masked_lm_positions"].tolist(), sample["masked_lm_ids"].tolist()):
            words[pos] = f"{words[pos]}({tokens[label]})"
        names = _EXAMPLE_LABELS[manifest["options"]["samples"]]
        label = f"{names[int(sample['next_sentence_label'])]}, " if names else ""
        lines.append(f"  [{n}] {label}{len(ids)} tokens: {' '.join(words)}")
    return "\n".join(lines)
