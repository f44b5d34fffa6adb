"""The fast recipe end to end with 2 real DeepSpeed ranks: MLM only on shards masked at load time, LAMB, a
schedule per phase. Killed and resumed it is bit-identical to an uninterrupted run; its export is a
`BertForMaskedLM` with every key in place; `bertdist finetune` starts from it. ModernBERT the same way, under
ZeRO-3 (its tied decoder gathered where the model uses it), exported as a `ModernBertForMaskedLM`; ELECTRA under
ZeRO-3 too (one embedding module called by the generator and the discriminator), exported as the discriminator's
`ElectraForPreTraining` and the generator's `ElectraForMaskedLM`; SpanBERT under ZeRO-3 (its boundary head uses
the tied decoder too), exported as a `BertForMaskedLM` without that head, which a fine-tuning starts from; a
DistilBERT student learning from a tiny BERT teacher, exported as `DistilBertForMaskedLM` and fine-tuned; ALBERT
with shared layers on sentence-order pairs, exported as `AlbertForPreTraining` and fine-tuned."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bertdist.cli import main
from bertdist.train.consolidate import consolidated_state_dict
from tests import training_runs as runs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    return str(tmp_path_factory.getbasetemp() / "training")


def resumed_bit_identically(
    base: str, shards: str, vocab: str, zero_stage: int, recipe: str, terminate: bool = False
) -> tuple[runs.Scenario, runs.Scenario, dict]:
    """The recipe's uninterrupted run and its killed-and-resumed twin (`terminate`: also stopped by SIGTERM on the
    way), both finished, with the same final weights; returns both runs and those weights."""
    reference = runs.uninterrupted(base, shards, vocab, zero_stage, "fp32", recipe)
    resumed = runs.interrupted(base, shards, vocab, zero_stage, False, "fp32", recipe, terminate)
    assert reference.exit_codes["run"] == [0, 0], reference.notes["run"][-3000:]
    assert resumed.exit_codes["final"] == [0, 0], resumed.notes["final"][-3000:]
    final = f"step_{runs.STEPS:08d}"
    want = consolidated_state_dict(reference.out / "checkpoints" / final)
    got = consolidated_state_dict(resumed.out / "checkpoints" / final)
    assert [k for k in want if not torch.equal(want[k], got[k])] == []
    return reference, resumed, want


def test_fast_recipe_resumes_bit_identically(base, mlm_shards, tiny_vocab):
    # The one ZeRO-0 (LAMB) run: SIGTERM's save is ZeRO-0's too, and the final run resumes from it.
    reference, resumed, want = resumed_bit_identically(base, mlm_shards, tiny_vocab, 0, "fast", terminate=True)
    runs.assert_terminated_with_a_checkpoint(resumed)
    assert not any(k.startswith(("bert.pooler", "cls.seq_relationship")) for k in want)
    expected, logged = runs.read_metrics(reference.out), runs.read_metrics(resumed.out)
    assert sorted(logged) == list(range(1, runs.STEPS + 1))
    assert all("loss/train_nsp" not in record for record in expected.values())
    for step in expected:
        for key in ("loss/train", "mlm_accuracy/train", "optimizer/grad_norm", "optimizer/learning_rate"):
            assert logged[step][key] == expected[step][key], (step, key)
    losses = [expected[s]["loss/train"] for s in sorted(expected)]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2, losses


def test_fast_recipe_export_is_a_masked_lm_and_fine_tunes(base, mlm_shards, tiny_vocab, tiny_corpus, tmp_path):
    transformers = pytest.importorskip("transformers")
    run = runs.uninterrupted(base, mlm_shards, tiny_vocab, 0, "fp32", "fast")
    assert main(["export", str(run.out), "--output", str(tmp_path / "hf")]) == 0
    model, info = transformers.BertForMaskedLM.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}, info
    theirs = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf")
    assert type(theirs).__name__ == "BertForMaskedLM"

    from tests.finetune.test_runner import _overrides, _task

    train, dev = _task(tmp_path, tiny_corpus)
    assert main(["finetune", *_overrides(train, dev, tmp_path / "ft", f"finetune.init_from={tmp_path / 'hf'}")]) == 0
    classifier = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "ft" / "model")
    assert classifier.config.id2label == {0: "file0", 1: "file1"}


def test_modernbert_trains_under_zero3_resumes_bit_identically_and_exports(base, mlm_shards, tiny_vocab, tmp_path):
    transformers = pytest.importorskip("transformers")
    reference, _, want = resumed_bit_identically(base, mlm_shards, tiny_vocab, 3, "modernbert")
    assert "model.layers.1.attn.Wqkv.weight" in want
    losses = [record["loss/train"] for _, record in sorted(runs.read_metrics(reference.out).items())]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2, losses

    assert main(["export", str(reference.out), "--output", str(tmp_path / "hf")]) == 0
    model, info = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert type(model).__name__ == "ModernBertForMaskedLM" and {k: v for k, v in info.items() if v} == {}, info
    from bertdist.model.modernbert.hf import load_pretrained

    ours = load_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(5, 1000, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).mlm_logits, model.eval()(input_ids=ids).logits, atol=1e-5, rtol=0)


def test_electra_trains_under_zero3_resumes_bit_identically_and_exports_both_models(
    base, mlm_shards, tiny_vocab, tmp_path
):
    transformers = pytest.importorskip("transformers")
    reference, _, want = resumed_bit_identically(base, mlm_shards, tiny_vocab, 3, "electra")
    assert {"generator.generator_lm_head.bias", "discriminator_predictions.dense_prediction.weight"} <= set(want)
    records = [record for _, record in sorted(runs.read_metrics(reference.out).items())]
    assert all({"loss/train_mlm", "loss/train_rtd", "rtd_accuracy/train"} <= set(r) for r in records), records[0]
    for r in records:  # the loss is the generator's MLM plus 50 x the discriminator's
        assert r["loss/train"] == pytest.approx(r["loss/train_mlm"] + 50 * r["loss/train_rtd"], rel=1e-6)
    losses = [r["loss/train"] for r in records]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2, losses

    assert main(["export", str(reference.out), "--output", str(tmp_path / "hf")]) == 0
    for directory, name in (
        (tmp_path / "hf", "ElectraForPreTraining"),
        (tmp_path / "hf" / "generator", "ElectraForMaskedLM"),
    ):
        model, info = getattr(transformers, name).from_pretrained(directory, output_loading_info=True)
        assert {k: v for k, v in info.items() if v} == {}, (name, info)
    from bertdist.model.electra.hf import load_pretrained

    ours = load_pretrained(tmp_path / "hf").eval()
    theirs = transformers.ElectraForPreTraining.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(5, 1000, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours.discriminator_logits(ids), theirs(input_ids=ids).logits, atol=1e-5, rtol=0)


def test_spanbert_trains_under_zero3_resumes_bit_identically_exports_a_masked_lm_and_fine_tunes(
    base, mlm_shards, tiny_vocab, tiny_corpus, tmp_path
):
    transformers = pytest.importorskip("transformers")
    reference, _, want = resumed_bit_identically(base, mlm_shards, tiny_vocab, 3, "span")
    assert "span_boundary.dense1.weight" in want
    records = [record for _, record in sorted(runs.read_metrics(reference.out).items())]
    assert all({"loss/train_mlm", "loss/train_sbo", "sbo_accuracy/train"} <= set(r) for r in records), records[0]
    for r in records:  # MLM plus the span-boundary objective
        assert r["loss/train"] == pytest.approx(r["loss/train_mlm"] + r["loss/train_sbo"], rel=1e-6)
    losses = [r["loss/train"] for r in records]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2, losses

    assert main(["export", str(reference.out), "--output", str(tmp_path / "hf")]) == 0
    model, info = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert type(model).__name__ == "BertForMaskedLM" and {k: v for k, v in info.items() if v} == {}, info
    from tests.finetune.test_runner import _overrides, _task

    train, dev = _task(tmp_path, tiny_corpus)
    assert main(["finetune", *_overrides(train, dev, tmp_path / "ft", f"finetune.init_from={tmp_path / 'hf'}")]) == 0


def test_distilbert_learns_from_its_teacher_resumes_bit_identically_exports_and_fine_tunes(
    base, mlm_shards, tiny_vocab, tiny_corpus, tmp_path
):
    """A 1-layer student of the 2-layer tiny BERT under ZeRO-2: the teacher is loaded again on resume (it is in no
    checkpoint), so the resumed run is bit-identical only if the teacher is the same and the student continues
    from its checkpoint, not from the teacher's layers again."""
    transformers = pytest.importorskip("transformers")
    reference, _, want = resumed_bit_identically(base, mlm_shards, tiny_vocab, 2, "distill")
    assert not any("teacher" in k or "token_type" in k for k in want)
    records = [record for _, record in sorted(runs.read_metrics(reference.out).items())]
    assert all({"loss/train_kd", "loss/train_mlm", "loss/train_cos"} <= set(r) for r in records), records[0]
    for r in records:  # the paper's 5 / 2 / 1
        want_loss = 5 * r["loss/train_kd"] + 2 * r["loss/train_mlm"] + r["loss/train_cos"]
        assert r["loss/train"] == pytest.approx(want_loss, rel=1e-6)
    losses = [r["loss/train"] for r in records]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2, losses

    assert main(["export", str(reference.out), "--output", str(tmp_path / "hf")]) == 0
    model, info = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert type(model).__name__ == "DistilBertForMaskedLM" and {k: v for k, v in info.items() if v} == {}, info
    from tests.finetune.test_runner import _overrides, _task

    train, dev = _task(tmp_path, tiny_corpus)
    assert main(["finetune", *_overrides(train, dev, tmp_path / "ft", f"finetune.init_from={tmp_path / 'hf'}")]) == 0
    classifier = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "ft" / "model")
    assert type(classifier).__name__ == "DistilBertForSequenceClassification"
    _a_replaced_teacher_is_refused_on_resume(reference, tmp_path)


def _a_replaced_teacher_is_refused_on_resume(reference: runs.Scenario, tmp_path) -> None:
    """The teacher is in no checkpoint, only its path: replaced between a kill and the resume (same path, other
    weights), the resumed run would distil from another model and exit 0. Every checkpoint records the teacher's
    digest, and a resume whose teacher differs stops before anything starts, in one line naming both."""
    import shutil

    import yaml

    cfg = yaml.safe_load(reference.config.read_text())
    teacher = Path(cfg["distill"]["teacher"])
    cfg["train"]["output_dir"] = str(tmp_path / "distill-run")
    cfg["data"]["phases"][0]["steps"] = runs.STEPS + 4
    shutil.copytree(reference.out, tmp_path / "distill-run")
    config = tmp_path / "resume.yaml"
    config.write_text(yaml.safe_dump(cfg))
    weights = teacher / "model.safetensors"
    original = weights.read_bytes()
    replaced = bytearray(original)
    replaced[-1] ^= 1  # one bit of one weight
    try:
        weights.write_bytes(bytes(replaced))
        ranks = runs.start_ranks(config, "replaced-teacher", "--resume", "auto", world_size=1)
        assert ranks.wait() == [2], ranks.output(0)[-3000:]
    finally:
        weights.write_bytes(original)  # the session's teacher, as the other distillation runs read it
    lines = [line for line in ranks.output(0).splitlines() if "is not the model this run learned from" in line]
    assert len(lines) == 1 and f"distill.teacher: {teacher}" in lines[0] and "digest was" in lines[0], lines


def test_albert_trains_sentence_order_resumes_bit_identically_exports_and_fine_tunes(
    base, sop_shards, tiny_vocab, tiny_corpus, tmp_path
):
    transformers = pytest.importorskip("transformers")
    reference, _, want = resumed_bit_identically(base, sop_shards, tiny_vocab, 1, "albert")
    assert "albert.encoder.embedding_hidden_mapping_in.weight" in want
    records = [record for _, record in sorted(runs.read_metrics(reference.out).items())]
    assert all({"loss/train_mlm", "loss/train_sop", "sop_accuracy/train"} <= set(r) for r in records), records[0]
    losses = [r["loss/train"] for r in records]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2, losses

    assert main(["export", str(reference.out), "--output", str(tmp_path / "hf")]) == 0
    model, info = transformers.AlbertForPreTraining.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}, info
    from tests.finetune.test_runner import _overrides, _task

    train, dev = _task(tmp_path, tiny_corpus)
    assert main(["finetune", *_overrides(train, dev, tmp_path / "ft", f"finetune.init_from={tmp_path / 'hf'}")]) == 0
    classifier = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "ft" / "model")
    assert type(classifier).__name__ == "AlbertForSequenceClassification"
