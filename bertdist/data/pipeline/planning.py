"""What the driver of `bertdist prepare` decides between its stages, from the read stage's results: which input
files are bad (fail, or skip them and say so), which documents are exact duplicates (the first occurrence in input
order wins), and how the rest are cut into groups of `group_bytes` of text for the instances stage.

Plain functions of the results, no Ray: the same results give the same plan, whatever ran the tasks.
"""

from __future__ import annotations

import sys

import numpy as np

from bertdist.data.pipeline.stages import load_piece
from bertdist.data.readers import InputFile, ReadUnit
from bertdist.errors import DataError


def bad_input_report(
    files: list[InputFile], units: list[ReadUnit], results: list[dict], on_bad_input: str
) -> tuple[list[dict[str, str]], list[int]]:
    """Files with any bad unit, or without text, are bad as a whole: fail, or skip them and say so."""
    problems: dict[int, str] = {}
    documents = {f.index: 0 for f in files}
    for unit, result in zip(units, results):
        if result["error"] and unit.file.index not in problems:
            problems[unit.file.index] = result["error"]
        documents[unit.file.index] += result["documents"]
    for f in files:
        if f.index not in problems and documents[f.index] == 0:
            problems[f.index] = f"{f.path}: contains no text"
    skipped = [dict(path=files[i].path, reason=problems[i]) for i in sorted(problems)]
    if skipped and on_bad_input == "fail":
        raise DataError(
            "bad input (rerun with --on-bad-input skip to leave these files out):\n"
            + "\n".join(f"  {s['reason']}" for s in skipped)
        )
    for s in skipped:
        print(f"bertdist prepare: skipped {s['reason']}", file=sys.stderr)
    return skipped, [k for k, u in enumerate(units) if u.file.index not in problems]


def plan_groups(
    work_dir: str, good_units: list[int], results: list[dict], group_bytes: int
) -> tuple[list[list[tuple[str, np.ndarray]]], dict[str, int]]:
    """Drop exact duplicates (first occurrence wins) and cut the rest into groups of `group_bytes` of text."""
    pieces = [piece for k in good_units for piece in results[k]["pieces"]]
    hashes, sizes, owner = [], [], []
    for p, piece in enumerate(pieces):
        with load_piece(work_dir, piece) as npz:
            hashes.append(npz["document_hashes"])
            sizes.append(npz["document_bytes"])
        owner.append(np.full(len(sizes[-1]), p, dtype=np.int64))
    if not pieces:
        return [], dict(documents=0, duplicate_documents=0)
    all_hashes = np.ascontiguousarray(np.concatenate(hashes)).view("V16").ravel()
    _, first = np.unique(all_hashes, return_index=True)
    keep = np.zeros(len(all_hashes), dtype=bool)
    keep[first] = True
    all_sizes, all_owner = np.concatenate(sizes), np.concatenate(owner)
    local = np.concatenate([np.arange(len(s)) for s in sizes])
    kept_sizes = all_sizes[keep]
    group_of = (np.cumsum(kept_sizes) - kept_sizes) // group_bytes
    kept_owner, kept_local = all_owner[keep], local[keep]
    groups = []
    for g in np.unique(group_of).tolist():
        in_group = group_of == g
        owners, locals_ = kept_owner[in_group], kept_local[in_group]
        groups.append([(pieces[p], locals_[owners == p]) for p in np.unique(owners).tolist()])
    stats = dict(
        documents=int(keep.sum()),
        duplicate_documents=int((~keep).sum()),
        sentences=sum(results[k]["sentences"] for k in good_units),
        tokens=sum(results[k]["tokens"] for k in good_units),
        unk_tokens=sum(results[k]["unk_tokens"] for k in good_units),
    )
    return groups, stats
