"""`bertdist export CHECKPOINT --output DIR`: a training checkpoint as a Hugging Face directory of its
architecture (`BertForPreTraining`/`BertForMaskedLM`, `ModernBertForMaskedLM`: bertdist.model.registry).

Works from any ZeRO stage in one CPU process (no GPUs, no process group): the fp32 weights are
consolidated by bertdist.train.checkpoint, loaded into our model to prove they fit it exactly, and written by
the model's own `save_pretrained` with the vocabulary, so `transformers` loads the result offline.

A fine-tuning's output_dir (or its checkpoint) exports the model `bertdist finetune` kept, its best epoch
({output_dir}/model), and a Hugging Face directory (a fine-tuned model, an earlier export) is copied as it is:
with `onnx`, either way the directory gets model.onnx and a README.md saying how to run it (bertdist.model.onnx).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bertdist import ownership, storage
from bertdist.config import TrackingConfig
from bertdist.data.tokenizer import tokenizer_file, vocab_mismatch
from bertdist.model.hf_io import CONFIG_FILE
from bertdist.storage import PARTIAL_MARKER
from bertdist.train import checkpoint, consolidate

FINETUNE_MODEL_DIRNAME = "model"
"""Where `bertdist finetune` writes its best epoch's model, in its output_dir (bertdist.finetune.runner)."""


def find_checkpoint(path: str | os.PathLike) -> Path:
    """Accept a checkpoint directory (verified), or a run or its checkpoints/ directory: the newest intact
    checkpoint there, as `--resume auto` would take it (an older one, with a warning, if the newest is damaged)."""
    if storage.is_url(os.fspath(path)):
        from bertdist.train import remote

        return remote.fetch_for_reading(os.fspath(path))
    path = Path(path)
    if checkpoint.is_complete(path):
        checkpoint.verify_files(path)
        return path
    for root in (path, path / checkpoint.CHECKPOINTS_DIRNAME):
        found = checkpoint.latest(root)
        if found is not None:
            return checkpoint.newest_intact(found)
    raise checkpoint.CheckpointError(
        f"{path}: neither a complete checkpoint (no {checkpoint.TRAIN_STATE_FILENAME}) nor a directory with a "
        f"'{checkpoint.LATEST_FILENAME}' marker"
    )


def export(
    checkpoint_path: str | os.PathLike,
    output_dir: str | os.PathLike,
    vocab_file: str | None = None,
    overwrite: bool = False,
    onnx: bool = False,
) -> Path | str:
    """`export_directory`, to a local directory or to a URL (written locally first, then uploaded with
    config.json last: a reader that finds config.json finds the whole model)."""
    output = os.fspath(output_dir)
    if not storage.is_url(output):
        return export_directory(checkpoint_path, output, vocab_file, overwrite, onnx)
    output = output.rstrip("/")
    _refuse_url_over_input(output, os.fspath(checkpoint_path))
    existing = storage.find(output)
    if existing and not overwrite:
        raise checkpoint.CheckpointError(f"--output {output}: not empty; choose a new prefix or pass --overwrite")
    with tempfile.TemporaryDirectory() as staging:
        export_directory(checkpoint_path, Path(staging, "model"), vocab_file, onnx=onnx)
        if existing:
            model = Path(staging, "model")
            exported = {p.relative_to(model).as_posix() for p in model.rglob("*") if p.is_file()}
            # a prefix is whatever shares it, up to a whole bucket: only an earlier export's objects are replaced
            _refuse_replacing_others(output, [url[len(output) + 1 :] for url in existing], exported, "prefix")
            for url in existing:
                storage.remove(url)
        storage.upload_directory(Path(staging, "model"), output, last=CONFIG_FILE)
    return output


def _refuse_url_over_input(output: str, given: str) -> None:
    """The store's form of `_refuse_output_over_input`: an output prefix equal to the checkpoints read,
    containing them or inside them is refused whatever the flags (`--overwrite` would delete them)."""
    if not storage.is_url(given):
        return
    source = given.rstrip("/")
    if output == source or source.startswith(output + "/") or output.startswith(source + "/"):
        raise checkpoint.CheckpointError(
            f"--output {output}: holds or is inside {source}, which it would export; choose a prefix outside it"
        )


def export_directory(
    checkpoint_path: str | os.PathLike,
    output_dir: str | os.PathLike,
    vocab_file: str | None = None,
    overwrite: bool = False,
    onnx: bool = False,
) -> Path:
    """Write `output_dir` (model.safetensors, config.json, vocab and tokenizer files; with `onnx` model.onnx
    and README.md too); returns it.

    The new files are written to a staging directory inside `output_dir` and moved into place only when all
    of them are written, so a failure (a full disk, Ctrl-C) leaves the directory as it was, and `--overwrite`
    replaces an older export only with a complete new one. The export is also logged as an MLflow Model of
    the run that trained the checkpoint (its id travels in the checkpoint), so the dashboard lists the model
    beside its metrics; a tracking failure only warns.
    """
    from bertdist.tracking.models import log_export

    output = Path(output_dir)
    if output.exists() and not output.is_dir():
        raise checkpoint.CheckpointError(f"--output {output}: is a file, not a directory")
    _refuse_output_over_input(output, os.fspath(checkpoint_path))
    given = None if storage.is_url(os.fspath(checkpoint_path)) else Path(checkpoint_path)
    with ownership.owned(output, remove_on_failure=True):
        old = ownership.contents(output)
        if old and not overwrite:
            raise checkpoint.CheckpointError(
                f"--output {output}: not empty; choose a new directory or pass --overwrite"
            )
        staging = output / f".export{PARTIAL_MARKER}{os.getpid()}"
        state = None
        if given is not None and (given / CONFIG_FILE).is_file():  # a Hugging Face directory
            _copy_model(given, staging, vocab_file)
        else:
            source, state, weights = read_newest(checkpoint_path)
            fine_tuned = _fine_tuned_model(source)
            if fine_tuned is not None:
                _copy_model(fine_tuned, staging, vocab_file)
            else:
                _write_pretraining_model(source, state, weights, staging, vocab_file)
        if onnx:
            from bertdist.model.onnx import write_onnx

            write_onnx(staging)
        _refuse_replacing_others(output, [p.name for p in old], {p.name for p in staging.iterdir()}, "directory")
        for path in old:
            ownership.remove(path)
        for path in sorted(
            staging.iterdir(), key=lambda p: p.name == CONFIG_FILE
        ):  # config.json last: it makes a model
            os.replace(path, output / path.name)
        staging.rmdir()
    if state is not None:
        run_dir = source.parent.parent  # {output_dir}/checkpoints/step_N: found even when exporting from elsewhere
        log_export(TrackingConfig(**state.config["tracking"]), run_dir, state.tracking_run_id, output, state.step)
    return output


EXPORT_EXTRAS = ("model.onnx", "README.md", "generator")
"""What an earlier export may hold beyond this one's files: its ONNX graph and README (`--format onnx`), an ELECTRA's
generator/."""


def _refuse_replacing_others(output: str | Path, names: list[str], export_names: set[str], kind: str) -> None:
    """`--overwrite` replaces an earlier export, nothing else: a directory or prefix holding anything an export
    does not write (checkpoints, shards, notes, another tool's output) is refused before anything is deleted.
    `names` and `export_names` are relative paths; an earlier export's ONNX files and a killed export's staging
    are an export's."""
    known = {name.split("/")[0] for name in export_names} | set(EXPORT_EXTRAS)
    others = [name for name in names if name.split("/")[0] not in known and PARTIAL_MARKER not in name]
    if others:
        raise checkpoint.CheckpointError(
            f"--output {output}: --overwrite replaces an earlier export only, and this {kind} holds {len(others)} "
            f"other file(s) ({others[0]}{', ...' if len(others) > 1 else ''}); nothing was deleted, choose a new {kind}"
        )


def _write_pretraining_model(
    source: Path, state: checkpoint.TrainState, weights: dict[str, Any], staging: Path, vocab_file: str | None
) -> None:
    """The pretraining model of a checkpoint, with its vocabulary, as a Hugging Face directory at `staging`."""
    from bertdist.config.schema import checkpoint_model_config
    from bertdist.model.registry import build_model, hf_adapter

    model = build_model(checkpoint_model_config(state.config, state.step))  # the last phase's RoPE thetas
    try:
        model.load_state_dict(weights, strict=True)  # proves that they fit our model exactly
    except RuntimeError:  # torch lists every key: a fine-tuning's checkpoint, say, whose model/ is gone
        raise checkpoint.CheckpointError(
            f"{source}: its weights are not those of the pretraining model its config describes ({model.config.arch}); "
            f"a fine-tuning's model is its output_dir/{FINETUNE_MODEL_DIRNAME}, which `bertdist finetune` writes"
        ) from None
    vocab = vocab_file or state.config["data"]["vocab_file"]
    if not Path(vocab).exists():
        raise checkpoint.CheckpointError(
            f"vocabulary {vocab} (data.vocab_file of the run) does not exist here; pass --vocab PATH"
        )
    problem = vocab_mismatch(vocab, model.config.vocab_size, state.config["data"]["vocab_file"])
    if problem:
        raise checkpoint.CheckpointError(f"--vocab: {problem}")
    # Where the weights came from travels with them: `bertdist finetune` records it on its own run.
    provenance = {"bertdist_run_id": state.tracking_run_id, "bertdist_checkpoint": str(source.resolve())}
    hf_adapter(model.config.arch).write_directory(model, staging, tokenizer_file(vocab), provenance)


def _fine_tuned_model(source: Path) -> Path | None:
    """When checkpoint `source` is a fine-tuning's, the model it kept: its best epoch, which `bertdist finetune`
    wrote to {output_dir}/model as soon as it was found (the checkpoint kept is the last epoch's). Told by that
    model's architecture, a task model's: a pretraining run may hold an export of its own there."""
    from bertdist.model.hf_heads import HEADS

    model = source.parent.parent / FINETUNE_MODEL_DIRNAME  # {output_dir}/checkpoints/step_N
    try:
        architectures = json.loads((model / CONFIG_FILE).read_text()).get("architectures") or [""]
    except (OSError, ValueError, AttributeError):
        return None
    return model if str(architectures[0]).endswith(HEADS) else None


def _copy_model(model: Path, staging: Path, vocab_file: str | None) -> None:
    """The files of the Hugging Face directory `model`, as they are (its tokenizer is the model's), with its
    subdirectories (an ELECTRA's generator/). A model bertdist does not read (a GPT-2) is refused, as fine-tuning,
    embed and attention refuse it: it was copied and said exported."""
    from bertdist.model.hf_heads import model_config

    model_config(model)
    if vocab_file:
        raise checkpoint.CheckpointError(
            f"--vocab: {model} is a Hugging Face directory, exported with its own tokenizer; "
            "--vocab applies to training checkpoints"
        )
    _refuse_links_out_of(model)
    shutil.copytree(model, staging, copy_function=shutil.copyfile)


def _refuse_links_out_of(model: Path) -> None:
    """A symbolic link in the model directory whose target lies outside it is refused, naming it: copying what it
    points at would put a file from elsewhere (a credentials file, say) into the export and its upload. A Hugging
    Face cache snapshot (`.../snapshots/<revision>/`) links every file to its repository's `blobs/`: those
    targets are the model's own."""
    root = model.resolve()
    allowed = [root]
    if model.parent.name == "snapshots":
        allowed.append((model.parent.parent / "blobs").resolve())
    for path in sorted(model.rglob("*")):
        if path.is_symlink():
            target = path.resolve()
            if not any(target == a or a in target.parents for a in allowed):
                raise checkpoint.CheckpointError(
                    f"{path}: a symbolic link to {target}, outside {model}; bertdist export copies nothing from "
                    "outside the model directory (copy the file in, or remove the link)"
                )


def _refuse_output_over_input(output: Path, given_path: str) -> None:
    """An --output that holds the checkpoints read, sits inside them, or holds checkpoints of its own is
    never written, whatever the flags: `--overwrite` there would delete the run it exports. An output beside
    the checkpoints, inside the run directory (`RUN/hf`), is fine."""
    given = Path(given_path)
    source = (
        given
        if checkpoint.is_complete(given) or given.name == checkpoint.CHECKPOINTS_DIRNAME
        else checkpoint.checkpoints_dir(given)
    )
    out, src = output.resolve(), source.resolve()
    if not storage.is_url(given_path) and (out == src or out in src.parents or src in out.parents):
        raise checkpoint.CheckpointError(
            f"--output {output}: holds or is inside {source}, which it would export; choose a "
            f"directory outside it (e.g. {given}/hf for a run)"
        )
    if output.is_dir() and (
        checkpoint.is_complete(output)
        or (output / checkpoint.LATEST_FILENAME).is_file()
        or (output / checkpoint.CHECKPOINTS_DIRNAME).is_dir()
    ):
        raise checkpoint.CheckpointError(
            f"--output {output}: holds training checkpoints; bertdist export never writes over "
            "them, choose another directory"
        )


def read_newest(
    checkpoint_path: str | os.PathLike, attempts: int = 5
) -> tuple[Path, checkpoint.TrainState, dict[str, Any]]:
    """The checkpoint `find_checkpoint` names, its train state and its consolidated fp32 weights.

    A run that is training prunes old checkpoints while we read (`bertdist export RUN`, `finetune.init_from=RUN`
    during pretraining): a checkpoint that vanishes under us was removed by its run, not damaged, so the newest
    one is taken again.
    """
    failures = 0
    while True:
        source = find_checkpoint(checkpoint_path)
        try:
            return source, checkpoint.read_train_state(source), consolidate.consolidated_state_dict(source)
        except (checkpoint.CheckpointError, OSError):
            failures += 1
            if source.is_dir() or failures == attempts:
                raise
