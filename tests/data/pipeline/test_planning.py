"""How `bertdist prepare` cuts documents into groups (bertdist.data.pipeline.planning.group_ids): consecutive
numbers, and no group of one document, whose NotNext segments would all come from the document itself."""

from __future__ import annotations

import numpy as np
import pytest

from bertdist.data.pipeline.planning import group_ids


def _cuts(sizes: list[int], group_bytes: int) -> np.ndarray:
    sizes_array = np.array(sizes)
    return (np.cumsum(sizes_array) - sizes_array) // group_bytes


@pytest.mark.parametrize(
    "sizes,expected",
    [
        ([40, 40, 40, 40, 40], [0, 0, 0, 1, 1]),  # under group_bytes each: cut by start offset, as before
        ([40, 40, 40, 40], [0, 0, 0, 0]),  # the last group would hold one: it joins the one before
        ([250, 10, 10], [0, 0, 0]),  # a large document alone, then a skipped number: it joins the next group
        ([10, 10, 250, 10, 10], [0, 0, 0, 1, 1]),  # the large one starts in group 0; group 1 is empty
        ([150, 150, 150, 150, 150], [0, 0, 1, 1, 1]),  # each alone: two by two, the last with the pair before it
        ([10, 10, 500], [0, 0, 0]),  # the last document alone joins the group before it
        ([500], [0]),  # a corpus of one document has no other
    ],
)
def test_groups_are_numbered_consecutively_and_none_holds_one_document_of_several(sizes, expected):
    got = group_ids(_cuts(sizes, 100))
    assert got.tolist() == expected
    if len(sizes) > 1:
        assert np.bincount(got).min() >= 2


def test_a_document_without_a_token_is_dropped_and_counted_and_the_sentences_add_up(tmp_path, tiny_vocab):
    """Zero-width and soft-hyphen text survives a strip and tokenizes to nothing: such a document was dropped and
    counted nowhere, and the run's sentence count included empty sentences its languages' counts did not. So was
    a JSON line whose text is empty or blank."""
    import json

    from bertdist.data.pipeline.planning import plan_groups
    from bertdist.data.pipeline.stages import read_unit
    from bertdist.data.readers import expand_inputs, plan_units
    from bertdist.data.tokenizer import open_tokenizer

    (tmp_path / "in").mkdir()
    (tmp_path / "work" / "docs").mkdir(parents=True)
    # a text of no sentence at all (empty, blank, a no-break space) was dropped by the reader, uncounted too
    documents = ["The cat sat on the mat.\n\u200b\u200b\nThe dog ran.", "\u00ad\u200b", "A bird flew.", "", " \u00a0\n"]
    (tmp_path / "in" / "a.jsonl").write_text("".join(json.dumps({"text": t, "lang": "en"}) + "\n" for t in documents))
    units = plan_units(expand_inputs([str(tmp_path / "in")]), 1 << 30)
    results = [read_unit(u, str(tmp_path / "work"), tiny_vocab, False, 1 << 20, "lang") for u in units]
    plan = plan_groups(str(tmp_path / "work"), [0], results, 1 << 20, open_tokenizer(tiny_vocab).unk_id)
    totals = plan.document_stats
    assert (totals["documents"], totals["empty_documents"], totals["sentences"]) == (2, 3, 3), totals
    assert totals["sentences"] == sum(s["sentences"] for s in plan.language_stats.values())
    assert plan.lone_documents() == []  # its two documents with text, of one language, are one group


def test_a_language_with_one_document_is_named_for_its_notnext_segments(tmp_path, tiny_vocab):
    """A group holds one language; a language with one document makes NotNext pairs from that document itself."""
    import json

    from bertdist.data.pipeline.planning import plan_groups
    from bertdist.data.pipeline.stages import read_unit
    from bertdist.data.readers import expand_inputs, plan_units
    from bertdist.data.tokenizer import open_tokenizer

    (tmp_path / "in").mkdir()
    (tmp_path / "work" / "docs").mkdir(parents=True)
    rows = [("The cat sat.", "en"), ("The dog ran.", "en"), ("Le chat dort.", "fr")]
    (tmp_path / "in" / "a.jsonl").write_text("".join(json.dumps({"text": t, "lang": g}) + "\n" for t, g in rows))
    units = plan_units(expand_inputs([str(tmp_path / "in")]), 1 << 30)
    results = [read_unit(u, str(tmp_path / "work"), tiny_vocab, False, 1 << 20, "lang") for u in units]
    plan = plan_groups(str(tmp_path / "work"), [0], results, 1 << 20, open_tokenizer(tiny_vocab).unk_id)
    assert plan.lone_documents() == ["fr"]
