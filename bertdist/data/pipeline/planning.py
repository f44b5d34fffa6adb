"""What the driver of `bertdist prepare` decides between its stages, from the read stage's results: which input
files are bad (fail, or skip them and say so), which documents are exact duplicates (the first occurrence in input
order wins), and how the rest are cut into groups of `group_bytes` of text for the instances stage: each group holds
one language (documents of one language keep their input order), so a NotNext segment is never in another
language and each language's instances are a contiguous range of groups.

Plain functions of the results, no Ray: the same results give the same plan, whatever ran the tasks.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

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


@dataclass
class GroupPlan:
    groups: list[list[tuple[str, np.ndarray]]]
    """Per group: (piece, the indices of its documents in that piece) for each piece it reads."""
    group_languages: list[str]
    document_stats: dict[str, int]
    """documents (kept), duplicate_documents and empty_documents (dropped); sentences (with a token), tokens and
    unk_tokens of every document read."""
    language_stats: dict[str, dict[str, int]]
    """The same per language, for a corpus whose documents have one ({} otherwise)."""

    def lone_documents(self) -> list[str]:
        """The languages ("" for a corpus without) whose group holds one document: a language with one document
        of its own. Groups hold one language each, so its NotNext segments (a random other document's) can only
        come from that document itself, labelled NotNext: said at prepare (driver)."""
        return [
            language
            for language, members in zip(self.group_languages, self.groups)
            if sum(len(kept) for _, kept in members) == 1
        ]


def _empty(results: list[dict], good_units: list[int]) -> int:
    """Documents whose sentences all tokenized to nothing (zero-width or soft-hyphen text that survives a strip):
    dropped, as Google's reference drops them, and counted (a unit read by an older bertdist counted none)."""
    return sum(results[k].get("empty_documents", 0) for k in good_units)


def plan_groups(work_dir: str, good_units: list[int], results: list[dict], group_bytes: int, unk_id: int) -> GroupPlan:
    """Drop exact duplicates (first occurrence wins) and cut the rest into groups of `group_bytes` of text, one
    language per group."""
    pieces = [piece for k in good_units for piece in results[k]["pieces"]]
    columns: dict[str, list[np.ndarray]] = {name: [] for name in _DOCUMENT_COLUMNS}
    owner = []
    for p, piece in enumerate(pieces):
        with load_piece(work_dir, piece) as npz:
            for name, column in _document_columns(npz, unk_id).items():
                columns[name].append(column)
        owner.append(np.full(len(columns["bytes"][-1]), p, dtype=np.int64))
    if not pieces:
        return GroupPlan(
            [], [], dict(documents=0, duplicate_documents=0, empty_documents=_empty(results, good_units)), {}
        )
    hashes, sizes, languages = (np.concatenate(columns[name]) for name in ("hashes", "bytes", "languages"))
    _, first = np.unique(np.ascontiguousarray(hashes).view("V16").ravel(), return_index=True)
    keep = np.zeros(len(sizes), dtype=bool)
    keep[first] = True
    local = np.concatenate([np.arange(len(s)) for s in columns["bytes"]])
    # kept documents, language by language, each language in input order
    kept = np.flatnonzero(keep)
    kept = kept[np.argsort(languages[kept], kind="stable")]
    group_of = np.zeros(len(kept), dtype=np.int64)
    group_languages: list[str] = []
    for language in np.unique(languages[kept]).tolist():
        rows = np.flatnonzero(languages[kept] == language)
        sizes_here = sizes[kept[rows]]
        within = group_ids((np.cumsum(sizes_here) - sizes_here) // group_bytes)
        group_of[rows] = len(group_languages) + within
        group_languages += [language] * (int(within[-1]) + 1)
    all_owner = np.concatenate(owner)
    groups = []
    for g in range(len(group_languages)):
        members = kept[group_of == g]
        owners, locals_ = all_owner[members], local[members]
        groups.append([(pieces[p], locals_[owners == p]) for p in np.unique(owners).tolist()])
    stats = dict(
        documents=int(keep.sum()),
        duplicate_documents=int((~keep).sum()),
        empty_documents=_empty(results, good_units),
        sentences=sum(results[k]["sentences"] for k in good_units),
        tokens=sum(results[k]["tokens"] for k in good_units),
        unk_tokens=sum(results[k]["unk_tokens"] for k in good_units),
    )
    return GroupPlan(groups, group_languages, stats, _language_stats(columns, languages, keep))


def group_ids(cuts: np.ndarray) -> np.ndarray:
    """Consecutive group numbers, from 0, of documents cut by their start offset // group_bytes (`cuts`, not
    decreasing), with no group of one document: a NotNext segment comes from another document of the group, and a
    group of one has none (every draw would take the document itself, labelled NotNext). A document of group_bytes
    or more leaves its own group alone and skips numbers; so numbers are made consecutive, and a group of one
    document joins the group after it (or, the last, the one before), which keeps groups near group_bytes."""
    numbers, dense, counts = np.unique(cuts, return_inverse=True, return_counts=True)
    merged, group, waiting = np.empty(len(numbers), dtype=np.int64), 0, False
    for g, count in enumerate(counts.tolist()):
        merged[g] = group
        if count == 1 and not waiting:
            waiting = True  # the next group joins this one
        else:
            waiting, group = False, group + 1
    if waiting and group > 0:  # the last group, of one document, alone: it joins the one before it
        merged[-1] = group - 1
    return merged[dense.ravel()]


_DOCUMENT_COLUMNS = ("hashes", "bytes", "languages", "sentences", "tokens", "unk_tokens")


def _document_columns(npz: "np.lib.npyio.NpzFile", unk_id: int) -> dict[str, np.ndarray]:
    """Per document of a piece: its hash, text bytes, language ("" in a piece of a run without languages, or of
    an earlier bertdist), sentences, tokens and unknown tokens."""
    document_offsets, sentence_offsets = npz["document_offsets"], npz["sentence_offsets"]
    token_offsets = sentence_offsets[document_offsets]
    unknown = np.concatenate([[0], np.cumsum(npz["tokens"] == unk_id)])
    sizes = npz["document_bytes"]
    languages = npz["document_languages"] if "document_languages" in npz.files else np.full(len(sizes), "")
    return dict(
        hashes=npz["document_hashes"],
        bytes=sizes,
        languages=languages,
        sentences=np.diff(document_offsets),
        tokens=np.diff(token_offsets),
        unk_tokens=np.diff(unknown[token_offsets]),
    )


def _language_stats(
    columns: dict[str, list[np.ndarray]], languages: np.ndarray, keep: np.ndarray
) -> dict[str, dict[str, int]]:
    """Per language, counted as the run's totals are: documents kept and dropped as duplicates, and the
    sentences, tokens and unknown tokens of every document read."""
    if not (languages != "").any():
        return {}
    counts = {name: np.concatenate(columns[name]) for name in ("sentences", "tokens", "unk_tokens")}
    out = {}
    for language in np.unique(languages).tolist():
        mine = languages == language
        out[language] = dict(
            documents=int((mine & keep).sum()),
            duplicate_documents=int((mine & ~keep).sum()),
            **{name: int(values[mine].sum()) for name, values in counts.items()},
        )
    return out
