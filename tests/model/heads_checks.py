"""What the task-head tests of the families on BERT's layers (test_albert_heads, test_distilbert_heads,
test_electra_heads) check alike against `transformers`: the same padded inputs, the same five cases with the same
labels, and the same comparisons of logits, losses, saved directories, encoder states and fine-tuning runs. Each
family's file keeps what is its own: its reference model, how ours is built from it, and its extra assertions."""

from __future__ import annotations

import csv
import dataclasses
import warnings
from pathlib import Path
from types import ModuleType

import pytest
import torch

from bertdist.model.hf_heads import build_task_model, load_task_model, save_task_model, task_model_from_pretrained
from bertdist.model.task_heads import REGRESSION, SINGLE_LABEL

transformers = pytest.importorskip("transformers")
BATCH, SEQ, CHOICES = 3, 24, 4
TOLERANCE = 1e-5

_TASKS = {  # name: (head, its transformers settings, input shape, labels)
    "classification": ("SequenceClassification", {"num_labels": 3}, (BATCH, SEQ), [0, 2, 1]),
    "regression": (
        "SequenceClassification",
        {"num_labels": 1, "problem_type": REGRESSION},
        (BATCH, SEQ),
        [0.5, 3.2, 4.9],
    ),
    "tagging": ("TokenClassification", {"num_labels": 5}, (BATCH, SEQ), None),
    "qa": ("QuestionAnswering", {}, (BATCH, SEQ), None),
    "multiple_choice": ("MultipleChoice", {}, (BATCH, CHOICES, SEQ), [3, 0, 1]),
}


def cases(family: str) -> dict[str, tuple[str, dict, tuple[int, ...]]]:
    """name: (transformers class, its settings, input shape) for the family's prefix (`Albert`, `Electra`...)."""
    return {name: (f"{family}For{head}", settings, shape) for name, (head, settings, shape, _) in _TASKS.items()}


def ours_like(theirs, hf: ModuleType, cls_name: str, settings: dict, unpad: bool):
    """Ours as bertdist.model.hf_heads builds it for transformers' `theirs` (the family's adapter `hf` reads its
    config), with its weights, loaded strictly: every weight maps."""
    cfg = dataclasses.replace(hf.config_from_hf(theirs.config.to_dict()), unpad=unpad)
    labels = [f"L{i}" for i in range(theirs.config.num_labels)]
    ours = build_task_model(cls_name, cfg, labels, settings.get("problem_type", SINGLE_LABEL))
    ours.load_state_dict(hf.from_hf_state_dict(theirs.state_dict()), strict=True)
    return ours.eval()


def inputs(vocab: int, *shape: int, segments: bool = True) -> dict[str, torch.Tensor]:
    """Random ids, [CLS] first, every row but the first padded at the end by up to 12 slots; with `segments`, token
    types as the fine-tuning runner's batches carry them (a second segment from the middle)."""
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, vocab, shape, generator=g)
    input_ids[..., 0] = 2
    lengths = torch.randint(SEQ - 12, SEQ + 1, shape[:-1], generator=g).reshape(-1)
    lengths[0] = SEQ
    mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).long().reshape(shape)
    batch = {"input_ids": input_ids * mask, "attention_mask": mask}
    return {**batch, "token_type_ids": token_types(batch)} if segments else batch


def token_types(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """A second segment from the middle of each row, at its real tokens."""
    return (torch.arange(SEQ) >= SEQ // 2).long().expand_as(batch["input_ids"]) * batch["attention_mask"]


def labels(case: str, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The case's labels, tags at the real tokens of `mask` (-100 elsewhere)."""
    if case == "tagging":
        tags = torch.randint(0, 5, mask.shape, generator=torch.Generator().manual_seed(1))
        return {"labels": tags.masked_fill(mask == 0, -100)}
    if case == "qa":  # the last answer is cut off by the window: ignored
        return {"start_positions": torch.tensor([1, 5, SEQ + 3]), "end_positions": torch.tensor([2, 9, SEQ + 3])}
    return {"labels": torch.tensor(_TASKS[case][3])}


def logits(output, case: str) -> torch.Tensor:
    """transformers' output as ours has it: QA's start and end logits stacked last."""
    return torch.stack([output.start_logits, output.end_logits], -1) if case == "qa" else output.logits


def assert_logits_and_loss_equal(got, want, case: str, mask: torch.Tensor) -> None:
    """Ours (`got`) against transformers' output; tagging at the real tokens of `mask` alone."""
    got_logits, want_logits = got.logits, logits(want, case)
    if case == "tagging":  # padding slots carry no meaning (zeros here when unpadded); compare the real ones
        real = mask.bool()
        got_logits, want_logits = got_logits[real], want_logits[real]
    torch.testing.assert_close(got_logits, want_logits, atol=TOLERANCE, rtol=0)  # QA: every slot, padding included
    torch.testing.assert_close(got.loss, want.loss, atol=TOLERANCE, rtol=0)


def saved_and_loaded_in_transformers(ours, cls_name: str, case: str, out: Path, vocab: Path):
    """Ours saved to `out` and loaded by the Auto class of its head: transformers' class, with every key."""
    save_task_model(ours, out, [f"T{i}" for i in range(ours.num_labels)], vocab)
    auto = getattr(transformers, "AutoModelFor" + cls_name.split("For", 1)[1])
    loaded, info = auto.from_pretrained(out, output_loading_info=True)
    assert type(loaded).__name__ == cls_name
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    if case == "regression":
        assert loaded.config.problem_type == "regression"
    return loaded


def assert_computes_alike_and_back(theirs, ours, loaded, batch: dict, case: str, out: Path) -> None:
    """`loaded` (ours in transformers) computes ours' logits; `theirs` saved to `out` loads here and computes them
    exactly."""
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        got, want = ours(**batch).logits, logits(loaded.eval()(**batch), case)
    if case == "tagging":
        got, want = got[real], want[real]
    torch.testing.assert_close(got, want, atol=TOLERANCE, rtol=0)

    theirs.save_pretrained(out)  # and a transformers-saved model loads here
    back, _ = load_task_model(out)
    assert type(back).__name__ == type(theirs).__name__
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(**batch).logits, ours(**batch).logits, atol=0, rtol=0)


def fresh_from_export(export: Path, pretrained, architecture: str, encoder_name: str):
    """The task model started from `export` (of `pretrained`), the encoder's weights and the names started fresh:
    the encoder is the pretrained one, and what is fresh here is what transformers starts fresh. Those of the
    encoder (an MLM export's pooler, which a classifier reads) are named in a warning, as transformers names
    them; the task head is fresh by design and not named."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        model = task_model_from_pretrained(export, architecture, ["a", "b", "c"])
    encoder = {k: v for k, v in pretrained.state_dict().items() if k.startswith(f"{encoder_name}.")}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in encoder.items())
    fresh = set(model.state_dict()) - set(encoder)
    _, info = getattr(transformers, architecture).from_pretrained(export, output_loading_info=True)
    assert set(info["missing_keys"]) == fresh, info
    named = [str(w.message).split("no weights for ", 1)[1] for w in said if "no weights for " in str(w.message)]
    started = {k for k in fresh if k.startswith(f"{encoder_name}.")}
    assert {k for line in named for k in line.split("; ")[0].split(", ")} == started, named
    return model, encoder, fresh


def assert_hidden_states_equal(got, want, real: torch.Tensor, layers: int) -> None:
    """Every layer's hidden states (`layers` of them, the embeddings' included) at the real tokens."""
    assert len(got) == len(want) == layers
    for ours_layer, theirs_layer in zip(got, want):
        torch.testing.assert_close(ours_layer[real], theirs_layer[real], atol=TOLERANCE, rtol=0)


def assert_attention_probabilities_equal(got, want, real: torch.Tensor, layers: int) -> None:
    """Every layer's attention probabilities toward the real tokens (the padded keys' carry no meaning)."""
    assert len(got) == len(want) == layers
    keys = real[:, None, None, :].expand_as(want[0])
    for ours_layer, theirs_layer in zip(got, want):
        torch.testing.assert_close(ours_layer[keys], theirs_layer[keys], atol=TOLERANCE, rtol=0)


def finetuned_from_export(pretrained: Path, family: str, architecture: str, tmp_path: Path, tiny_corpus, capsys):
    """`bertdist finetune` with finetune.init_from the export `pretrained` of `family`: the model it writes is
    transformers' `architecture` and predicts as ours, which is returned."""
    from bertdist.cli import main
    from tests.finetune.test_runner import _overrides, _task

    train, dev = _task(tmp_path, tiny_corpus)
    out = tmp_path / "run"
    overrides = _overrides(train, dev, out, f"finetune.init_from={pretrained}", "tracking.enabled=false")
    assert main(["finetune", *overrides]) == 0
    printed = capsys.readouterr().out
    assert "epoch 2/2" in printed and f"from Hugging Face {family} {pretrained}" in printed, printed

    theirs, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        out / "model", output_loading_info=True
    )
    assert type(theirs).__name__ == architecture, type(theirs)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ours, labels = load_task_model(out / "model")
    assert labels == ["file0", "file1"]
    with open(dev, newline="") as f:
        sentences = [row["sentence"] for row in csv.DictReader(f)]
    batch = transformers.AutoTokenizer.from_pretrained(out / "model")(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(**batch).logits, theirs.eval()(**batch).logits, atol=1e-5, rtol=0)
    return ours
