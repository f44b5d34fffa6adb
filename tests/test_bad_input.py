"""Careless and hostile input, across every command that reads it: a clear one-line error naming the file,
field or flag (exit code 2), or the exact original data; never a traceback, a silent short read or lost work.

The matrix crosses each damaged artefact with each reader, so a new reader is one more column. The fuzz
tests flip and cut random bytes of shards, manifests, `latest`, train_state.json and configs (seeded, so a
failure reproduces) and accept only "a DataError/CheckpointError/ConfigError" or "exactly the original".
"""

from __future__ import annotations

import json
import random
import shutil
import tarfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import yaml

from bertdist import storage
from bertdist.cli import main
from bertdist.config import ConfigError, load_config
from bertdist.data import DataError, iter_samples
from bertdist.data.loader import PretrainingLoader
from bertdist.errors import USAGE_EXIT_CODE
from bertdist.train import checkpoint, consolidate, train_state
from bertdist.train.ports import free_tcp_port
from bertdist.train.train_state import CheckpointError, TrainState
from bertdist.train.trainer import train
from tests import training_runs
from tests.conftest import REPO, TEST_SEQ_LENGTH

# ---- damaged shard directories ------------------------------------------------------------------------------


def _copy(tiny_shards: str, tmp_path: Path) -> Path:
    out = tmp_path / "shards"
    shutil.copytree(tiny_shards, out)
    return out


def _first_shard(d: Path) -> Path:
    return d / json.loads((d / "manifest.json").read_text())["shards"][0]["name"]


def _second_member_offset(shard: Path) -> int:
    with tarfile.open(shard) as tar:
        return tar.getmembers()[1].offset


def flip_tar_header(d: Path) -> str:
    shard = _first_shard(d)
    data = bytearray(shard.read_bytes())
    data[_second_member_offset(shard) + 3] ^= 0x40  # inside the second member's name: its header checksum fails
    shard.write_bytes(bytes(data))
    return shard.name


def cut_at_member_boundary(d: Path) -> str:
    shard = _first_shard(d)
    shard.write_bytes(shard.read_bytes()[: _second_member_offset(shard)])
    return shard.name


def truncate_mid_block(d: Path) -> str:
    shard = _first_shard(d)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    return shard.name


def remove_shard(d: Path) -> str:
    shard = _first_shard(d)
    shard.unlink()
    return shard.name


def edit_manifest_count(d: Path) -> str:
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["shards"][0]["num_samples"] -= 1
    (d / "manifest.json").write_text(json.dumps(manifest))
    return "totals.samples"


def edit_manifest_count_consistently(d: Path) -> str:
    """The per-shard count and the total edited together: only the shard's blocks can tell."""
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["shards"][0]["num_samples"] -= 1
    manifest["totals"]["samples"] -= 1
    (d / "manifest.json").write_text(json.dumps(manifest))
    return manifest["shards"][0]["name"]


DAMAGES = [
    flip_tar_header,
    cut_at_member_boundary,
    truncate_mid_block,
    remove_shard,
    edit_manifest_count,
    edit_manifest_count_consistently,
]


def read_with_iter_samples(d: Path, capsys) -> str:
    with pytest.raises(DataError) as e:
        sum(1 for _ in iter_samples(str(d)))
    return str(e.value)


def read_with_inspect(d: Path, capsys) -> str:
    assert main(["inspect", str(d), "--examples", "0"]) == USAGE_EXIT_CODE
    return capsys.readouterr().err


def read_with_train(d: Path, capsys, vocab: str) -> str:
    config = training_runs.write_config(d.parent / "run", str(d), vocab, zero_stage=1)
    assert train(load_config(config, ["data.phases.0.eval_dir="])) == USAGE_EXIT_CODE
    return capsys.readouterr().err


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("reader", ["iter_samples", "inspect", "train"])
def test_damaged_shards_fail_every_reader_naming_the_file(damage, reader, tiny_shards, tiny_vocab, tmp_path, capsys):
    d = _copy(tiny_shards, tmp_path)
    named = damage(d)
    if reader == "iter_samples":
        message = read_with_iter_samples(d, capsys)
    elif reader == "inspect":
        message = read_with_inspect(d, capsys)
    elif damage is edit_manifest_count_consistently:
        # Not visible at start (sizes and tar headers agree): the block's own sample count tells, when the
        # loader decodes it. One epoch decodes every block.
        loader = PretrainingLoader(str(d), tiny_vocab, TEST_SEQ_LENGTH, micro_batch_size=64)
        with pytest.raises(DataError) as e:
            for _, _ in zip(range(loader.batches_per_epoch + 1), loader):
                pass
        message = str(e.value)
    else:
        message = read_with_train(d, capsys, tiny_vocab)
    assert named in message and "Traceback" not in message, message


def test_a_corrupt_block_read_in_a_loader_worker_is_one_line(tiny_shards, tiny_vocab, tmp_path):
    """Content damage passes the cheap checks at start (sizes and headers are intact) and is found when the
    block is decoded, inside a DataLoader worker; the error arrives as the worker's one line."""
    d = _copy(tiny_shards, tmp_path)
    for shard in json.loads((d / "manifest.json").read_text())["shards"]:
        path = d / shard["name"]
        with tarfile.open(path) as tar:
            member = tar.getmembers()[0]
        data = bytearray(path.read_bytes())
        data[member.offset_data + member.size // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    loader = PretrainingLoader(str(d), tiny_vocab, TEST_SEQ_LENGTH, micro_batch_size=4, num_workers=1)
    with pytest.raises(DataError) as e:
        next(iter(loader))
    assert "Original Traceback" not in str(e.value) and "DataLoader worker" not in str(e.value)
    assert "corrupt sample block" in str(e.value) and str(d) in str(e.value)


# ---- damaged checkpoints and resume state -------------------------------------------------------------------


def _fake_run(tmp_path: Path, zero_stage: int = 0) -> Path:
    """A run directory with one complete checkpoint (zero stage 0: the weights are one torch file)."""
    import torch

    from bertdist.config import load_config as load
    from bertdist.model.bert.model import BertForPreTraining
    from tests.conftest import tiny_model_config

    out = tmp_path / "run"
    target = out / "checkpoints" / checkpoint.tag_for(4)
    target.mkdir(parents=True)
    cfg = load(None, ["train.zero_stage=0", f"train.output_dir={out}", "tracking.enabled=false"]).to_dict()
    cfg["model"] = asdict(tiny_model_config())
    torch.save({"module": BertForPreTraining(tiny_model_config()).state_dict()}, target / "mp_rank_00_model_states.pt")
    from bertdist.train.integrity import describe_own_files

    files = describe_own_files(target, rank=0, exclude=set())
    (target / checkpoint.TRAIN_STATE_FILENAME).write_text(
        checkpoint.state_json(TrainState(4, 0, 0, 1, [{}], [{}], cfg, files=files))
    )
    (out / "checkpoints" / checkpoint.LATEST_FILENAME).write_text(checkpoint.tag_for(4))
    return out


def garbage_latest(run: Path) -> str:
    (run / "checkpoints" / "latest").write_bytes(b"\xff\xfe\x00garbage\x9c")
    return "latest"


def latest_names_a_missing_checkpoint(run: Path) -> str:
    (run / "checkpoints" / "latest").write_text("step_00000099")
    return "step_00000099"


def truncated_model_states(run: Path) -> str:
    states = run / "checkpoints" / "step_00000004" / "mp_rank_00_model_states.pt"
    states.write_bytes(states.read_bytes()[:1000])
    return "step_00000004"


def edited_train_state(run: Path) -> str:
    path = run / "checkpoints" / "step_00000004" / checkpoint.TRAIN_STATE_FILENAME
    raw = json.loads(path.read_text())  # with its checksum
    raw["step"] = 5  # a flipped digit
    path.write_text(json.dumps(raw))
    return "train_state.json"


CHECKPOINT_DAMAGES = [garbage_latest, latest_names_a_missing_checkpoint, truncated_model_states, edited_train_state]


@pytest.mark.parametrize("damage", CHECKPOINT_DAMAGES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("reader", ["export", "resume"])
def test_damaged_checkpoints_fail_export_and_resume_naming_the_file(damage, reader, tmp_path, capsys, tiny_vocab):
    run = _fake_run(tmp_path)
    named = damage(run)
    if reader == "export":
        code = main(["export", str(run), "--output", str(tmp_path / "hf"), "--vocab", tiny_vocab])
    else:
        cfg = load_config(
            None,
            [
                f"train.output_dir={run}",
                "checkpoint.resume=auto",
                f"data.vocab_file={tiny_vocab}",
                "model.size=tiny",
                "model.vocab_size=1024",
            ],
        )
        code = train(cfg)
    err = capsys.readouterr().err
    assert code == USAGE_EXIT_CODE and named in err and "Traceback" not in err, err
    if damage in (garbage_latest, latest_names_a_missing_checkpoint):
        assert "newest complete checkpoint there is" in err and "step_00000004" in err  # the one beside it


@pytest.mark.parametrize("damage", CHECKPOINT_DAMAGES, ids=lambda f: f.__name__)
def test_bertdist_checkpoints_names_every_damage_a_resume_would_meet(damage, tmp_path, capsys):
    """`latest` naming a checkpoint that is not there stopped every resume while the listing showed nothing wrong."""
    run = _fake_run(tmp_path)
    named = damage(run)
    assert main(["checkpoints", str(run)]) == 1
    out = capsys.readouterr().out
    assert (named if damage is not edited_train_state else "unreadable train state") in out, out
    if damage is latest_names_a_missing_checkpoint:
        assert "latest names step_00000099, and there is no such checkpoint" in out
        assert "the newest intact one is step_00000004" in out


class _Payload:
    """Unpickling this creates a file: the stand-in for the code a tampered checkpoint would run."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("reader", ["export", "resume"])
def test_a_checkpoint_carrying_a_pickled_payload_is_refused_unexecuted(
    reader, tmp_path, capsys, tiny_vocab, tiny_shards
):
    """The attacker rewrote the file *and* its record (so verification passes): only loading without
    unpickling objects stands between the file and every rank that resumes from it."""
    import torch

    from bertdist.train.integrity import describe_own_files

    run = _fake_run(tmp_path)
    target = run / "checkpoints" / "step_00000004"
    states = target / "mp_rank_00_model_states.pt"
    marker = tmp_path / "payload-ran"
    torch.save({**torch.load(states, weights_only=True), "client_state": _Payload(marker)}, states)
    raw = json.loads((target / checkpoint.TRAIN_STATE_FILENAME).read_text())
    del raw[train_state.STATE_CHECKSUM_KEY]
    raw["files"] = describe_own_files(target, rank=0, exclude={checkpoint.TRAIN_STATE_FILENAME})
    cfg = load_config(
        training_runs.write_config(tmp_path / "cfg", tiny_shards, tiny_vocab, zero_stage=0),
        [
            f"train.output_dir={run}",
            "checkpoint.resume=auto",
            *(f"model.{k}={json.dumps(v)}" for k, v in raw["config"]["model"].items()),  # None as null
        ],
    )
    raw["config"] = cfg.to_dict()  # the attacker's checkpoint claims to be this run's
    (target / checkpoint.TRAIN_STATE_FILENAME).write_text(
        json.dumps({**raw, "sha256": train_state._state_checksum(raw)})
    )

    if reader == "export":
        code = main(["export", str(run), "--output", str(tmp_path / "hf"), "--vocab", tiny_vocab])
    else:
        code = train(cfg)
    err = capsys.readouterr().err
    assert code == USAGE_EXIT_CODE and "Traceback" not in err, err
    assert f"{states}: refused to load" in err and "(io.open)" in err and "not plain data" in err, err
    assert not marker.exists()


# ---- data loss ------------------------------------------------------------------------------------------------


def test_a_fresh_run_refuses_a_directory_holding_another_runs_checkpoints(tmp_path, capsys, tiny_vocab):
    run = _fake_run(tmp_path)
    cfg = load_config(
        None,
        [
            f"train.output_dir={run}",
            "checkpoint.resume=none",
            f"data.vocab_file={tiny_vocab}",
            "model.size=tiny",
            "model.vocab_size=1024",
        ],
    )
    assert train(cfg) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert "holds another run's checkpoints" in err and "checkpoint.resume=" in err and "train.output_dir" in err
    assert checkpoint.resolve_resume(run, "auto") == run / "checkpoints" / "step_00000004"  # untouched


def test_a_fresh_finetune_refuses_an_output_holding_a_pretraining_runs_checkpoints(tmp_path, capsys, tiny_vocab):
    run = _fake_run(tmp_path)
    texts = tmp_path / "t.tsv"
    texts.write_text("sentence\tlabel\na b\t0\nc d\t1\n")
    assert (
        main(
            [
                "finetune",
                f"finetune.init_from={run}",
                f"finetune.vocab_file={tiny_vocab}",
                f"finetune.train_file={texts}",
                f"finetune.dev_file={texts}",
                f"finetune.output_dir={run}",
                "checkpoint.resume=none",
            ]
        )
        == USAGE_EXIT_CODE
    )
    err = capsys.readouterr().err
    assert f"finetune.output_dir: {run} is inside the finetune.init_from {run}" in err, err  # checked first
    assert checkpoint.resolve_resume(run, "auto") == run / "checkpoints" / "step_00000004"  # untouched


def test_export_refuses_a_non_empty_output_and_replaces_it_only_when_asked(tmp_path, capsys, tiny_vocab):
    run = _fake_run(tmp_path)
    output = tmp_path / "hf"
    output.mkdir()
    (output / "notes.txt").write_text("mine")
    assert main(["export", str(run), "--output", str(output), "--vocab", tiny_vocab]) == USAGE_EXIT_CODE
    assert "not empty" in capsys.readouterr().err and (output / "notes.txt").read_text() == "mine"
    # --overwrite replaces an earlier export, never the user's other files (it deleted notes.txt)
    assert main(["export", str(run), "--output", str(output), "--vocab", tiny_vocab, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "replaces an earlier export only" in err and "notes.txt" in err, err
    assert sorted(p.name for p in output.iterdir()) == ["notes.txt"] and (output / "notes.txt").read_text() == "mine"
    (output / "notes.txt").unlink()
    assert main(["export", str(run), "--output", str(output), "--vocab", tiny_vocab]) == 0
    (output / "model.safetensors").write_bytes(b"an older export's weights")
    (output / "model.onnx").write_bytes(b"an older export's graph")  # its --format onnx files are an export's too
    (output / ".export.partial-1-2-3").mkdir()  # and so is a killed export's staging folder
    assert main(["export", str(run), "--output", str(output), "--vocab", tiny_vocab, "--overwrite"]) == 0
    assert (output / "model.safetensors").stat().st_size > 1000
    assert sorted(p.name for p in output.iterdir()) == [
        "config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]


def test_export_of_a_directory_with_a_link_leading_out_of_it_copies_nothing(tmp_path, capsys, tiny_vocab):
    """A Hugging Face directory is copied as it is: a link to a file outside it (a credentials file) was followed,
    copied into the export and uploaded with it. Refused in one line naming the link; a link inside is fine."""

    from bertdist.model.bert.hf import save_pretrained
    from bertdist.model.bert.model import BertForPreTraining
    from tests.conftest import tiny_model_config

    model = tmp_path / "model"
    save_pretrained(BertForPreTraining(tiny_model_config()), model, tiny_vocab)
    secret = tmp_path / "credentials"
    secret.write_text("aws_secret_access_key = hunter2\n")
    (model / "vocab-copy.txt").symlink_to(model / "vocab.txt")  # inside: copied as a file
    assert main(["export", str(model), "--output", str(tmp_path / "inside")]) == 0
    assert (tmp_path / "inside" / "vocab-copy.txt").read_text() == (model / "vocab.txt").read_text()
    (model / "notes").mkdir()
    (model / "notes" / "readme.txt").symlink_to(secret)
    assert main(["export", str(model), "--output", str(tmp_path / "out")]) == USAGE_EXIT_CODE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "readme.txt: a symbolic link to" in err[0] and "outside" in err[0], err
    assert not (tmp_path / "out").exists()

    # A Hugging Face cache snapshot links every file to its repository's blobs/: those are the model's own.
    repo = tmp_path / "hub" / "models--someone--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for file in (model / "config.json", model / "model.safetensors", model / "vocab.txt"):
        (repo / "blobs" / file.name).write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", file.name))
    assert main(["export", str(snapshot), "--output", str(tmp_path / "from-cache")]) == 0
    assert (tmp_path / "from-cache" / "model.safetensors").read_bytes() == (model / "model.safetensors").read_bytes()


def _files(directory: Path) -> dict[str, int]:
    return {str(p.relative_to(directory)): p.stat().st_size for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "output", [".", "checkpoints", "checkpoints/step_00000004/hf", "../elsewhere-with-checkpoints"]
)
def test_export_never_writes_over_the_run_it_exports_whatever_the_flags(output, tmp_path, capsys, tiny_vocab):
    run = _fake_run(tmp_path)
    (tmp_path / "elsewhere-with-checkpoints" / "checkpoints").mkdir(parents=True)
    before = _files(run)
    assert (
        main(["export", str(run), "--output", str(run / output), "--vocab", tiny_vocab, "--overwrite"])
        == USAGE_EXIT_CODE
    )
    err = capsys.readouterr().err
    assert "Traceback" not in err and ("holds or is inside" in err or "holds training checkpoints" in err), err
    assert _files(run) == before and (tmp_path / "elsewhere-with-checkpoints" / "checkpoints").is_dir()
    assert (
        main(["export", str(run), "--output", str(run / "hf"), "--vocab", tiny_vocab]) == 0
    )  # beside the checkpoints: fine
    assert oct((run / "hf" / "model.safetensors").stat().st_mode & 0o777) == oct(
        (run / "hf" / "config.json").stat().st_mode & 0o777
    )


@pytest.mark.parametrize("command", ["export", "finetune"])
def test_a_run_that_prunes_while_it_is_read_is_not_called_damaged(command, tmp_path, capsys, tiny_vocab, monkeypatch):
    """The run trains on while `bertdist export RUN` (or a fine-tuning from RUN) reads its newest checkpoint, and
    its pruning removes that one: the newest is taken again, and nothing is called damaged."""
    run = _fake_run(tmp_path)
    older, newer = run / "checkpoints" / "step_00000004", run / "checkpoints" / "step_00000008"
    shutil.copytree(older, newer)
    (run / "checkpoints" / "latest").write_text("step_00000008")
    read = consolidate.consolidated_state_dict

    def pruned_while_read(path):
        if Path(path) == newer:  # the run moved on and removed step 8 the way prune() removes a checkpoint
            (run / "checkpoints" / "latest").write_text("step_00000004")
            gone = Path(str(newer) + ".partial-1")
            newer.rename(gone)
            shutil.rmtree(gone)
        return read(path)

    monkeypatch.setattr(consolidate, "consolidated_state_dict", pruned_while_read)
    if command == "export":
        assert main(["export", str(run), "--output", str(tmp_path / "hf"), "--vocab", tiny_vocab]) == 0
        assert json.loads((tmp_path / "hf" / "config.json").read_text())["bertdist_checkpoint"] == str(older.resolve())
    else:
        rows = tmp_path / "t.tsv"
        rows.write_text("sentence\tlabel\n" + "a b\t0\nc d\t1\n" * 2)
        assert (
            main(
                [
                    "finetune",
                    f"finetune.init_from={run}",
                    f"finetune.vocab_file={tiny_vocab}",
                    f"finetune.train_file={rows}",
                    f"finetune.dev_file={rows}",
                    f"finetune.output_dir={tmp_path / 'ft'}",
                    "finetune.epochs=1",
                    "finetune.batch_size=2",
                    "finetune.micro_batch_size=2",
                    "tracking.enabled=false",
                    f"launch.master_port={free_tcp_port()}",
                ]
            )
            == 0
        )
        assert f"from bertdist checkpoint {older}" in capsys.readouterr().out
    assert "damaged" not in capsys.readouterr().err

    def pruned_while_verified(path, mode):  # `bertdist checkpoints RUN` while its run prunes what it lists
        shutil.rmtree(path)
        raise CheckpointError(f"{path}: damaged checkpoint: a file is missing")

    from bertdist.train import listing

    monkeypatch.setattr(listing, "verify_files", pruned_while_verified)
    text, damaged = listing.listing(run)
    assert not damaged and "step_00000004" not in text and "DAMAGED" not in text, text


@pytest.mark.parametrize("command", ["export", "embed"])
def test_a_full_disk_is_one_line_and_leaves_no_partial_output(command, tiny_disk, tmp_path, capsys, tiny_vocab):
    from bertdist.model.bert.hf import save_pretrained
    from bertdist.model.bert.model import BertForPreTraining
    from tests.conftest import tiny_model_config

    output = tiny_disk / "out"
    if command == "export":
        args = ["export", str(_fake_run(tmp_path)), "--output", str(output), "--vocab", tiny_vocab]
    else:
        save_pretrained(BertForPreTraining(tiny_model_config()), tmp_path / "model", tiny_vocab)
        texts = tmp_path / "texts.txt"
        texts.write_text("a line of text\n" * 2000)
        args = [
            "embed",
            "--model",
            str(tmp_path / "model"),
            "--input",
            str(texts),
            "--output",
            str(output),
            "--shard-rows",
            "500",
        ]
    assert main(args) == USAGE_EXIT_CODE
    err = capsys.readouterr().err.strip()
    assert "No space left on device" in err and str(tiny_disk) in err and len(err.splitlines()) == 1, err
    assert list(tiny_disk.iterdir()) == []


def _reordered(vocab: str, tmp_path: Path) -> str:
    tokens = Path(vocab).read_text().splitlines()
    path = tmp_path / "reordered" / "vocab.txt"
    path.parent.mkdir()
    path.write_text("\n".join(tokens[:5] + tokens[6:7] + tokens[5:6] + tokens[7:]) + "\n")  # two tokens swapped
    return str(path)


def test_a_vocabulary_that_does_not_fit_the_model_is_refused_before_anything_trains(
    tmp_path, capsys, tiny_vocab, tiny_shards
):
    from bertdist.config import validate
    from bertdist.model.bert.hf import save_pretrained
    from bertdist.model.bert.model import BertForPreTraining
    from tests.conftest import tiny_model_config

    model = tmp_path / "model"
    save_pretrained(BertForPreTraining(tiny_model_config()), model, tiny_vocab)
    reordered = _reordered(tiny_vocab, tmp_path)
    texts = tmp_path / "t.tsv"
    texts.write_text("sentence\tlabel\na b\t0\nc d\t1\n")
    common = [f"finetune.train_file={texts}", f"finetune.dev_file={texts}", f"finetune.output_dir={tmp_path / 'ft'}"]
    assert (
        main(["finetune", f"finetune.init_from={model}", f"finetune.vocab_file={reordered}", *common])
        == USAGE_EXIT_CODE
    )
    assert "is not the vocabulary the weights were trained with" in capsys.readouterr().err
    small = tmp_path / "small"
    save_pretrained(BertForPreTraining(tiny_model_config(vocab_size=512)), small, tiny_vocab)  # vocab.txt: 1024 tokens
    assert main(["finetune", f"finetune.init_from={small}", *common]) == USAGE_EXIT_CODE
    assert "has 1024 tokens, more than the model's 512 token embeddings" in capsys.readouterr().err
    cfg = load_config(
        training_runs.write_config(tmp_path / "cfg", tiny_shards, reordered, zero_stage=0),
        [f"checkpoint.init_from_pretrained={model}"],
    )
    with pytest.raises(ConfigError, match="data.vocab_file: .* is not the vocabulary the weights were trained with"):
        validate(cfg)
    longer = tmp_path / "longer.txt"
    longer.write_text(Path(tiny_vocab).read_text() + "extra1\nextra2\n")
    assert (
        main(["export", str(_fake_run(tmp_path)), "--output", str(tmp_path / "hf"), "--vocab", str(longer)])
        == USAGE_EXIT_CODE
    )
    assert "has 1026 tokens, more than the model's 1024 token embeddings" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["truncated", "pickled"])
def test_a_damaged_or_pickled_model_given_to_finetune_is_one_line_without_unsafe_advice(
    damage, tmp_path, capsys, tiny_vocab
):
    import torch

    from bertdist.model.bert.hf import save_pretrained
    from bertdist.model.bert.model import BertForPreTraining
    from tests.conftest import tiny_model_config

    model = tmp_path / "model"
    save_pretrained(BertForPreTraining(tiny_model_config()), model, tiny_vocab)
    weights = model / "model.safetensors"
    marker = tmp_path / "payload-ran"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        weights.unlink()
        torch.save(
            {"bert.embeddings.word_embeddings.weight": torch.zeros(2), "x": _Payload(marker)},
            model / "pytorch_model.bin",
        )
    texts = tmp_path / "t.tsv"
    texts.write_text("sentence\tlabel\na b\t0\nc d\t1\n")
    assert (
        main(
            [
                "finetune",
                f"finetune.init_from={model}",
                f"finetune.train_file={texts}",
                f"finetune.dev_file={texts}",
                f"finetune.output_dir={tmp_path / 'ft'}",
            ]
        )
        == USAGE_EXIT_CODE
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "weights_only" not in err, err
    expected = (
        "not a readable safetensors file, truncated or damaged"
        if damage == "truncated"
        else "refused to load: the file holds a Python object (io.open)"
    )
    assert expected in err and not marker.exists(), err


# ---- validation holes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.lr=.nan", "optim.lr: must be a finite number"),
        ("optim.lr=.inf", "optim.lr: must be a finite number"),
        ("optim.weight_decay=-1.0", "optim.weight_decay: must be >= 0"),
        ("optim.eps=0.0", "optim.eps: must be positive"),
        ("data.phases.1.micro_batch_size=16", "data.phases has 1 entries"),
    ],
)
def test_out_of_range_and_non_finite_values_are_refused(override, message):
    from bertdist.config import validate

    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        validate(load_config(REPO / "configs" / "bert-tiny.yaml", [override]), check_files=False)


def test_numbers_written_the_way_people_write_them_are_numbers(tmp_path):
    (tmp_path / "c.yaml").write_text("optim:\n  lr: 1e-4\n  warmup_steps: 1e2\n")  # YAML 1.1 strings
    cfg = load_config(tmp_path / "c.yaml", ["optim.eps=1e-8"])
    assert (cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.eps) == (1e-4, 100, 1e-8)


def test_an_override_is_read_by_its_fields_type_not_as_yaml(capsys):
    """Read as YAML, `runs/x #2` lost its tail (and the "new" run resumed runs/x), `0x10` became '16', `yes`
    became 'on', and a value YAML cannot parse printed a traceback."""
    cfg = load_config(
        None,
        [
            "train.output_dir=runs/x #2",
            "tracking.run_name=0x10",
            "launch.job_name=yes",
            "optim.lr=3e-4",
            "train.seed=7",
        ],
    )
    assert (cfg.train.output_dir, cfg.tracking.run_name, cfg.launch.job_name) == ("runs/x #2", "0x10", "yes")
    assert (cfg.optim.lr, cfg.train.seed) == (3e-4, 7)
    quoted = load_config(None, ['train.output_dir="runs/y #3"', "tracking.run_name='a b'", 'launch.job_name="x'])
    assert (quoted.train.output_dir, quoted.tracking.run_name, quoted.launch.job_name) == ("runs/y #3", "a b", '"x')
    assert load_config(None, ["train.seed=12345678901234567891"]).train.seed == 12345678901234567891  # no float
    with pytest.raises(ConfigError) as err:
        load_config(None, ["train.seed=0x10", "train.deepspeed={a: ["])
    assert "train.seed: expected int, got str '0x10'" in str(err.value)
    assert "override 'train.deepspeed={a: [': the value is not valid YAML" in str(err.value)
    assert main(["train", "--config", "bert-tiny", "--dry-run", "train.deepspeed={a: ["]) == 2  # refused first
    err = capsys.readouterr().err
    assert "Traceback" not in err and "not valid YAML" in err


def test_overrides_may_follow_flags(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # bert-tiny's relative runs/demo/... must not be the user's (after `make demo`)
    assert (
        main(
            [
                "train",
                "--config",
                "bert-tiny",
                "--dry-run",
                "optim.lr=3e-3",
                "data.vocab_file=" + str(REPO / "README.md"),
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    assert "unrecognized arguments" not in out.err and "lr: 0.003" in out.out


def test_prepare_refuses_bad_values_before_starting_and_leaves_nothing(tmp_path, tiny_corpus, tiny_vocab, capsys):
    output = tmp_path / "out"
    assert (
        main(
            [
                "prepare",
                "--input",
                tiny_corpus,
                "--output",
                str(output),
                "--vocab",
                tiny_vocab,
                "--seed",
                "-1",
                "--no-progress",
            ]
        )
        == USAGE_EXIT_CODE
    )
    assert "--seed: must be in [0, 2^63)" in capsys.readouterr().err and not output.exists()
    (tmp_path / "file").write_text("x")
    assert (
        main(["prepare", "--input", tiny_corpus, "--output", str(tmp_path / "file"), "--vocab", tiny_vocab])
        == USAGE_EXIT_CODE
    )
    assert "is a file, not a directory" in capsys.readouterr().err
    # An output inside the input (its next read took the shards for text) and a Ray address with no port that
    # can be (it waited past two minutes), refused before Ray starts or anything is written
    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, corpus)
    for extra, said in (
        (["--output", str(corpus / "shards")], f"--output: {corpus / 'shards'} is inside an --input"),
        (["--output", str(output), "--ray-address", "127.0.0.1:99999"], "--ray-address: '127.0.0.1:99999' is not"),
        # Ray's traceback after it started (its resource limit); a run that never ended
        (["--output", str(output), "--workers", "99999999999999999999"], "--workers: must be in [0, 100000]"),
        (["--output", str(output), "--dupe-factor", "99999999999999999999"], "--dupe-factor: must be in [1, 1000]"),
    ):
        assert main(["prepare", "--input", str(corpus), "--vocab", tiny_vocab, *extra]) == USAGE_EXIT_CODE
        assert said in capsys.readouterr().err
    assert not output.exists() and not (corpus / "shards").exists()


def test_an_output_inside_its_input_is_refused_by_vocab_pairs_and_embed(tmp_path, tiny_corpus, capsys):
    """`vocab --output corpus/sub`, `pairs --output corpus/p.jsonl`: exit 0, and the next read of the corpus took
    the tokenizer or the pairs for text; `embed --output MODEL/emb` wrote into the model's directory."""
    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, corpus)
    (tmp_path / "model").mkdir()
    for argv, said in (
        (["vocab", "--input", str(corpus), "--output", str(corpus / "sub")], "is inside the --input"),
        (["pairs", "--input", str(corpus), "--output", str(corpus / "p.jsonl")], "is inside the --input"),
        (
            [
                "embed",
                "--model",
                str(tmp_path / "model"),
                "--input",
                str(corpus / "x.txt"),
                "--output",
                str(tmp_path / "model" / "emb"),
            ],
            "is inside the --model",
        ),
    ):
        assert main(argv) == USAGE_EXIT_CODE, argv
        assert said in capsys.readouterr().err, argv
    assert sorted(p.name for p in corpus.iterdir()) == sorted(p.name for p in Path(tiny_corpus).iterdir())
    assert list((tmp_path / "model").iterdir()) == []


def test_a_failed_prepare_leaves_no_work_behind_so_the_fixed_command_runs(tmp_path, tiny_vocab, ray_local, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    good = "The quick brown fox jumps over the lazy dog. " * 40
    (corpus / "a.txt").write_text("\n\n".join(good for _ in range(30)))
    (corpus / "b.txt").write_bytes(b"\xff\xfe broken utf-8 \x00\x00")
    output = tmp_path / "out"
    args = [
        "prepare",
        "--input",
        str(corpus),
        "--output",
        str(output),
        "--vocab",
        tiny_vocab,
        "--max-seq-length",
        str(TEST_SEQ_LENGTH),
        "--no-progress",
        "--workers",
        "2",
    ]
    assert main(args) == USAGE_EXIT_CODE
    assert "b.txt" in capsys.readouterr().err and not (output / ".work").exists()
    assert main([*args, "--on-bad-input", "skip"]) == 0
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["totals"]["input_bytes"] == (corpus / "a.txt").stat().st_size  # the skipped file is not input
    assert [s["path"] for s in manifest["skipped_inputs"]] == [str(corpus / "b.txt")]


def test_an_output_that_is_a_file_is_refused_by_train(tmp_path, tiny_vocab):
    (tmp_path / "out").write_text("x")
    with pytest.raises(ConfigError, match="train.output_dir: .* is a file"):
        from bertdist.config import validate

        validate(
            load_config(
                None, [f"train.output_dir={tmp_path / 'out'}", f"data.vocab_file={tiny_vocab}", "model.vocab_size=1024"]
            )
        )


# ---- fuzz: random flips and cuts ----------------------------------------------------------------------------


def _mutations(data: bytes, rng: random.Random, count: int):
    for _ in range(count):
        if rng.random() < 0.25:
            yield data[: rng.randrange(len(data))]
        else:
            b = bytearray(data)
            for _ in range(rng.randint(1, 3)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            yield bytes(b)


def _one_shard_dir(tiny_shards: str, tmp_path: Path) -> Path:
    d = tmp_path / "one"
    d.mkdir()
    manifest = json.loads((Path(tiny_shards) / "manifest.json").read_text())
    manifest["shards"] = manifest["shards"][:1]
    manifest["totals"]["samples"] = manifest["shards"][0]["num_samples"]
    shutil.copy(Path(tiny_shards) / manifest["shards"][0]["name"], d)
    (d / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return d


def _samples(d: Path) -> list[tuple]:
    return [tuple(np.asarray(v).tobytes() for v in s.values()) for s in iter_samples(str(d))]


@pytest.mark.parametrize("target", ["shard", "manifest"])
def test_fuzzed_shards_and_manifests_give_an_error_or_the_exact_data(target, tiny_shards, tmp_path):
    d = _one_shard_dir(tiny_shards, tmp_path)
    original = _samples(d)
    path = _first_shard(d) if target == "shard" else d / "manifest.json"
    pristine = path.read_bytes()
    outcomes = {"error": 0, "exact": 0}
    for mutated in _mutations(pristine, random.Random(f"bertdist-{target}"), 120):
        path.write_bytes(mutated)
        try:
            got = _samples(d)
        except DataError:
            outcomes["error"] += 1
            continue
        assert got == original, "damaged input read as other data without an error"
        outcomes["exact"] += 1
    assert outcomes["error"] > 0  # the mutations reached checked bytes


def _retyped(value, path=()):
    """(path, replacement) for every field of a JSON value: each replaced by values of other types and ranges."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _retyped(inner, (*path, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value[:1]):
            yield from _retyped(inner, (*path, i))
    for other in (None, "x", 5, -1, 0, 1.5, [], {}, True):
        if other != value or type(other) is not type(value):
            yield path, other


def test_every_field_of_a_manifest_retyped_is_one_line_from_inspect_not_a_traceback(tiny_shards, tmp_path, capsys):
    """A manifest edited by hand (a list for the whole file, a name that is a number, samples_per_block 0, a null
    document count) crashed `inspect` and the loader with tracebacks in 39 of 150 variants."""
    d = _one_shard_dir(tiny_shards, tmp_path)
    pristine = json.loads((d / "manifest.json").read_text())
    variants = list(_retyped(pristine))
    assert len(variants) > 100
    for path, replacement in variants:
        manifest = json.loads(json.dumps(pristine))
        if path:
            holder = manifest
            for key in path[:-1]:
                holder = holder[key]
            holder[path[-1]] = replacement
        else:
            manifest = replacement
        (d / "manifest.json").write_text(json.dumps(manifest))
        code = main(["inspect", str(d), "--examples", "0"])
        err = capsys.readouterr().err
        assert code in (0, 2) and "Traceback" not in err, (path, replacement, err[-2000:])
        assert code == 0 or len(err.strip().splitlines()) == 1, (path, replacement, err)


def test_fuzzed_resume_state_gives_an_error_or_the_original_checkpoint(tmp_path):
    run = _fake_run(tmp_path)
    marker = run / "checkpoints" / "latest"
    state_file = run / "checkpoints" / "step_00000004" / checkpoint.TRAIN_STATE_FILENAME
    original = checkpoint.read_train_state(state_file.parent)
    rng = random.Random("bertdist-resume")
    for path in (marker, state_file):
        pristine = path.read_bytes()
        for mutated in _mutations(pristine, rng, 80):
            path.write_bytes(mutated)
            try:
                resumed = checkpoint.resolve_resume(run, "auto")
                state = checkpoint.read_train_state(resumed)
            except CheckpointError:
                continue
            assert (resumed.name, state) == ("step_00000004", original)
        path.write_bytes(pristine)


def test_fuzzed_configs_give_a_config_error_or_a_config(tmp_path):
    pristine = (REPO / "configs" / "bert-base.yaml").read_bytes()
    path = tmp_path / "c.yaml"
    for mutated in _mutations(pristine, random.Random("bertdist-config"), 150):
        path.write_bytes(mutated)
        try:
            load_config(path)
        except ConfigError:
            pass
        except yaml.YAMLError as e:  # pragma: no cover - a YAML error must be wrapped
            raise AssertionError(f"unwrapped YAML error: {e}")


def test_unwritable_outputs_are_one_line(tmp_path, tiny_corpus, tiny_vocab, tiny_shards, capsys):
    """As root nothing is permission-denied, so the unwritable place is a read-only kernel filesystem."""
    assert (
        main(
            [
                "prepare",
                "--input",
                tiny_corpus,
                "--output",
                "/proc/bertdist/out",
                "--vocab",
                tiny_vocab,
                "--no-progress",
            ]
        )
        == USAGE_EXIT_CODE
    )
    err = capsys.readouterr().err
    assert "/proc/bertdist" in err and "Traceback" not in err, err
    config = training_runs.write_config(tmp_path / "run", tiny_shards, tiny_vocab, zero_stage=1)
    from bertdist.train.ports import free_tcp_port

    overrides = [
        "train.output_dir=/proc/bertdist/run",
        "tracking.enabled=false",
        f"launch.master_port={free_tcp_port()}",
    ]
    assert train(load_config(config, overrides)) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert "/proc/bertdist" in err and "Traceback" not in err, err


def test_a_taken_rendezvous_port_is_one_line(tmp_path, tiny_shards, tiny_vocab, capsys, monkeypatch):
    import socket

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = training_runs.write_config(tmp_path / "run", tiny_shards, tiny_vocab, zero_stage=1)
        cfg = load_config(
            config,
            [
                f"launch.master_port={port}",
                "launch.gpus_per_node=1",
                "tracking.enabled=false",
                "train.global_batch_size=4",
            ],
        )
        assert train(cfg) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in err and "pick a free port" in err and "Traceback" not in err, err


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_alone_at_the_rendezvous_gives_up_within_the_rendezvous_timeout(
    rank, tmp_path, tiny_shards, tiny_vocab, capsys, monkeypatch
):
    """Rank 0 without its peer, or rank 1 without rank 0 (never started, wrong MASTER_ADDR): one line naming
    the address and what is missing after train.rendezvous_timeout_s, not the 30-minute collective timeout."""
    import time

    from bertdist.train.ports import free_tcp_port

    port = free_tcp_port()
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    config = training_runs.write_config(tmp_path / "run", tiny_shards, tiny_vocab, zero_stage=1)
    started = time.monotonic()
    assert train(load_config(config, ["train.rendezvous_timeout_s=3"])) == USAGE_EXIT_CODE
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in err and "train.rendezvous_timeout_s" in err and "Traceback" not in err, err
    if rank == 0:
        assert "0 of the other 1 ranks arrived" in err, err
    else:
        assert "rank 1 could not reach the rendezvous" in err and "rank 0 did not start" in err, err


# ---- secrets -----------------------------------------------------------------------------------------------------

PLANTED_SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYPLANTEDKEY"


def test_a_url_with_credentials_is_refused_redacted_and_written_nowhere(tmp_path, capsys, tiny_vocab, tiny_shards):
    """`s3://KEY:SECRET@bucket/...` (and an MLflow URI with a password) on the command line or in a config file,
    for train, submit, prepare and export: one line with the secret redacted, exit 2, and no file that the
    commands write (run directory, job records, resolved configs, logs, a tracking store) holds it."""
    import yaml

    url = f"s3://AKIAPLANTED:{PLANTED_SECRET}@bucket/run"
    out = tmp_path / "out"
    config = training_runs.write_config(tmp_path / "cfg", tiny_shards, tiny_vocab, zero_stage=0)
    secret_yaml = tmp_path / "secret.yaml"
    planted = yaml.safe_load(config.read_text())
    planted["checkpoint"]["uri"] = url
    planted["train"]["output_dir"] = str(out)
    secret_yaml.write_text(yaml.safe_dump(planted))
    commands = [
        ["train", "--config", str(config), f"checkpoint.uri={url}", f"train.output_dir={out}"],
        ["train", "--config", str(secret_yaml)],
        [
            "train",
            "--config",
            str(config),
            f"train.output_dir={out}",
            f"tracking.tracking_uri=http://me:{PLANTED_SECRET}@127.0.0.1:5000",
        ],
        [
            "submit",
            "--backend",
            "local",
            "--cpu-only",
            "--config",
            str(secret_yaml),
            "--jobs-dir",
            str(tmp_path / "jobs"),
        ],
        ["prepare", "--input", url + "/corpus.txt", "--output", str(tmp_path / "shards"), "--vocab", tiny_vocab],
        ["export", str(out), "--output", url + "/hf"],
    ]
    for argv in commands:
        assert main(argv) == USAGE_EXIT_CODE, argv
        said = capsys.readouterr()
        assert PLANTED_SECRET not in said.out + said.err and "://***@" in said.err, (argv, said.err)
        assert "a URL with credentials in it is refused" in said.err
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != secret_yaml]
    assert [p for p in written if PLANTED_SECRET.encode() in p.read_bytes()] == []
    with pytest.raises(storage.StorageError, match=r"s3://\*\*\*@bucket/run: a URL with credentials"):
        storage.exists(url)  # any other way in


@pytest.mark.parametrize(
    "url, shown",
    [
        ("http://alice:s3cret@mlflow.example:5000/x", "http://***@mlflow.example:5000/x"),
        ("https://bob:p@ss@host/path@v1", "https://***@host/path@v1"),  # an unencoded @ in the password
        ("postgresql://u:pw@db/mlflow and s3://k:v@bucket/key", "postgresql://***@db/mlflow and s3://***@bucket/key"),
        # AWS secret keys often hold a `/`
        ("s3://AKIAX:wJalrX/K7MDENG/bPxRfi@bucket/ckpt@v2", "s3://***@bucket/ckpt@v2"),
        ("http://127.0.0.1:5000/runs@2 s3://bucket/a:b@c", "http://127.0.0.1:5000/runs@2 s3://bucket/a:b@c"),
        # a token or a presigned signature in the query: were accepted, written and echoed
        ("https://mlflow.example/?token=SECRET-1&x=1", "https://mlflow.example/?token=***&x=1"),
        (
            "https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA%2F1&X-Amz-Signature=dead&X-Amz-Expires=60",
            "https://b.s3.amazonaws.com/k?X-Amz-Credential=***&X-Amz-Signature=***&X-Amz-Expires=60",
        ),
        ("https://h/p?api_key=k1;access_token=t2", "https://h/p?api_key=***;access_token=***"),
        ("https://h/p?tokens=3&keyword=x", "https://h/p?tokens=3&keyword=x"),
    ],
)
def test_a_urls_user_and_password_are_hidden_up_to_the_host(url, shown):
    from bertdist.credentials import credentials_problem, redacted

    assert redacted(url) == shown
    assert bool(credentials_problem(url, "tracking.tracking_uri")) == (shown != url)


@pytest.mark.parametrize(
    "args, named",
    [
        ("attention --model M --text hi --output M/pics", "--output: M/pics is inside the --model M"),
        ("filter-pairs --model M --pairs p.jsonl --output M/x.jsonl", "--output: M/x.jsonl is inside the --model M"),
        ("mine-negatives --model M --pairs p.jsonl --output M/x.jsonl", "--output: M/x.jsonl is inside the --model M"),
        ("evaluate --suite retrieval --model M --data-dir D --output M/e", "--output: M/e is inside the --model M"),
        ("evaluate --model M --data-dir D --output D/out", "--output: D/out is inside the --data-dir D"),
        ("embed --model M --input p.jsonl --output M/e", "--output: M/e is inside the --model M"),
        (
            "finetune finetune.init_from=M finetune.output_dir=M/ft finetune.train_file=t.tsv finetune.dev_file=d.tsv",
            "finetune.output_dir: M/ft is inside the finetune.init_from M",
        ),
    ],
)
def test_an_output_inside_the_model_or_data_it_reads_is_refused(args, named, tmp_path, monkeypatch, capsys):
    """attention, filter-pairs, mine-negatives, evaluate and finetune wrote their files into the model (or data)
    directory they read, exit 0 (embed alone refused it): its next reader took them for its own."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "M").mkdir()
    (tmp_path / "D").mkdir()
    (tmp_path / "p.jsonl").write_text('{"query": "a", "positive": "b"}\n')
    assert main(args.split()) == USAGE_EXIT_CODE
    assert named in capsys.readouterr().err
    assert not list((tmp_path / "M").iterdir()) and not list((tmp_path / "D").iterdir())


def test_a_hostfile_that_is_not_text_is_one_line(tmp_path, capsys):
    """A binary --hostfile was UnicodeDecodeError's traceback."""
    (tmp_path / "hosts").write_bytes(b"\xff\xfe\x00garbage")
    args = [
        "submit",
        "--dry-run",
        "--backend",
        "deepspeed",
        "--hostfile",
        str(tmp_path / "hosts"),
        "--config",
        "bert-tiny",
    ]
    assert main(args) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert "--hostfile" in err and "not UTF-8 text (byte 0)" in err and "Traceback" not in err, err
