"""What `mine-negatives` and `filter-pairs` share (bertdist.finetune.pair_search): each command's flags are its
options' fields, one for one, and its defaults are theirs."""

from __future__ import annotations

import dataclasses

import pytest

from bertdist.finetune.consistency import FilterOptions
from bertdist.finetune.hard_negatives import MineOptions
from bertdist.finetune.pair_search import PairSearchOptions, named


@pytest.mark.parametrize(("command", "options"), [("mine-negatives", MineOptions), ("filter-pairs", FilterOptions)])
def test_every_option_has_a_flag_and_every_flag_an_option(command, options):
    from bertdist.cli import build_parser
    from bertdist.finetune.pair_commands import MINE_CONVERTED
    from bertdist.flags import flag_dests, from_args

    parser = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    flags = {MINE_CONVERTED.get(dest, dest) for dest in flag_dests(parser)} - {"func", "interrupted"}
    assert flags == {f.name for f in dataclasses.fields(options)}
    assert {f.name for f in dataclasses.fields(PairSearchOptions)} < flags
    args = build_parser().parse_args([command, "--model", "m", "--pairs", "p.csv", "--output", "o.jsonl"])
    assert from_args(options, args, skip_bad=False) == options(model="m", pairs="p.csv", output="o.jsonl")


def test_a_summary_names_the_first_skipped_places_and_counts_the_rest():
    assert named(["a.csv:2: empty 'query'", "a.csv:5: not UTF-8"]) == "a.csv:2, a.csv:5"
    assert named([f"a.csv:{i}" for i in range(1, 6)]) == "a.csv:1, a.csv:2, a.csv:3, ..."


@pytest.mark.parametrize("command", ["mine-negatives", "filter-pairs"])
def test_an_output_that_is_the_pairs_or_the_corpus_file_is_refused_before_anything_is_read(command, tmp_path, capsys):
    """`--output pairs.jsonl --pairs pairs.jsonl` read the file whole, then replaced it with what was kept: the
    rows left out (filtered, short) were gone, exit 0. The model named does not exist: refused before it is found."""
    import json

    from bertdist.cli import main
    from bertdist.errors import USAGE_EXIT_CODE
    from tests.finetune.conftest import pair_command

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"query": "a", "positive": "b"}) + "\n")
    before = pairs.read_bytes()
    (tmp_path / "corpus.jsonl").write_text("")
    for output, flag in ((tmp_path / "." / "pairs.jsonl", "--pairs"), (tmp_path / "corpus.jsonl", "--corpus")):
        argv = pair_command(
            command, tmp_path / "no-model", tmp_path, output, "--corpus", str(tmp_path / "corpus.jsonl")
        )
        assert main(argv) == USAGE_EXIT_CODE
        err = capsys.readouterr().err
        assert f"--output: {output} is the {flag} file; write the result to a new file" in err, err
    assert pairs.read_bytes() == before
