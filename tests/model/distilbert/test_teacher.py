"""Distillation (bertdist.model.distilbert.teacher, bertdist.model.distilbert.model): the student starts from the
teacher's layers (a student of every teacher layer then computes what the teacher computes: no distillation loss
left), the loss is the weighted sum of its parts, and a run whose teacher cannot teach its student is refused before
it starts, one line naming the field."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bertdist.config import Config, ConfigError, DistillConfig, validate
from bertdist.model.bert.hf import save_pretrained
from bertdist.model.bert.model import BertForPreTraining
from bertdist.model.distilbert.teacher import plan_lines, set_up
from bertdist.model.registry import build_model
from tests.conftest import tiny_model_config


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, tiny_vocab) -> str:
    """A 2-layer BERT teacher (MLM head, random weights) with the suite's vocabulary."""
    directory = tmp_path_factory.mktemp("teacher")
    torch.manual_seed(0)
    teacher = BertForPreTraining(tiny_model_config(objective="mlm"))
    with torch.no_grad():  # segment 0 away from zero, so that folding it into the positions is what makes them agree
        teacher.bert.embeddings.token_type_embeddings.weight.add_(0.5)
    save_pretrained(teacher, directory, tiny_vocab)
    return str(directory)


def student_config(teacher_dir: str, vocab: str, **model) -> Config:
    cfg = Config()
    fields = {"size": "distilbert-mini", "arch": "distilbert", "objective": "distill", **model}
    cfg.model = dataclasses.replace(tiny_model_config(), **fields)
    cfg.data.vocab_file = vocab
    cfg.distill = DistillConfig(teacher=teacher_dir)
    return cfg


def batch(vocab_size: int) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab_size, (3, 20), generator=g)
    mask = torch.ones(3, 20, dtype=torch.long)
    mask[2, 12:] = 0
    positions = torch.tensor([[1, 4, 7], [2, 3, 9], [5, 6, 0]])
    labels = torch.randint(5, vocab_size, (3, 3), generator=g)
    labels[2, 2] = -100
    return dict(
        input_ids=ids,
        token_type_ids=torch.zeros_like(ids),
        attention_mask=mask,
        masked_lm_positions=positions,
        masked_lm_ids=labels,
    )


def test_a_student_of_every_teacher_layer_computes_the_teacher_and_has_nothing_left_to_distill(teacher_dir, tiny_vocab):
    cfg = student_config(teacher_dir, tiny_vocab, num_layers=2)
    cfg.distill.student_layers = [0, 1]
    student = build_model(cfg.model)
    set_up(cfg, student, torch.device("cpu"), fresh=True)
    student.eval()  # no dropout: the two agree exactly where the student copies the teacher
    with torch.no_grad():
        out = student(**batch(cfg.model.vocab_size))
        teacher_out = student.distillation.teacher(**{k: v for k, v in batch(cfg.model.vocab_size).items()})
    assert sorted(out.components) == ["cos", "kd", "mlm"] and sorted(out.scored) == ["mlm"]
    assert out.components["kd"].item() == pytest.approx(0.0, abs=1e-6)
    assert out.components["cos"].item() == pytest.approx(0.0, abs=1e-6)
    torch.testing.assert_close(out.mlm_logits, teacher_out.mlm_logits, atol=1e-5, rtol=0)
    assert out.loss.item() == pytest.approx(2.0 * out.components["mlm"].item(), rel=1e-6)  # 5 x 0 + 2 x mlm + 0


def test_the_default_student_takes_every_other_layer_and_learns_the_weighted_sum(teacher_dir, tiny_vocab):
    cfg = student_config(teacher_dir, tiny_vocab, num_layers=1)
    cfg.distill.temperature, cfg.distill.kd_weight, cfg.distill.cos_weight = 3.0, 4.0, 0.5
    student = build_model(cfg.model)
    set_up(cfg, student, torch.device("cpu"), fresh=True)
    teacher = student.distillation.teacher
    assert not any(p.requires_grad for p in teacher.parameters()) and not teacher.training
    layer = {k: v for k, v in teacher.bert.encoder.layer[0].state_dict().items()}
    assert all(torch.equal(v, layer[k]) for k, v in student.bert.encoder.layer[0].state_dict().items())
    assert not any(k.startswith("teacher") for k in student.state_dict())  # never in a checkpoint
    out = student.train()(**batch(cfg.model.vocab_size))
    parts = out.components
    assert parts["kd"] > 0 and parts["cos"] > 0
    want = 4.0 * parts["kd"] + 2.0 * parts["mlm"] + 0.5 * parts["cos"]
    torch.testing.assert_close(out.loss, want)
    out.loss.backward()
    assert student.bert.encoder.layer[0].output.dense.weight.grad is not None

    fresh_layer = build_model(cfg.model).bert.encoder.layer[0].output.dense.weight
    resumed = build_model(cfg.model)
    with torch.no_grad():
        resumed.bert.encoder.layer[0].output.dense.weight.copy_(fresh_layer)
    set_up(cfg, resumed, torch.device("cpu"), fresh=False)  # a resumed run keeps its own weights
    assert torch.equal(resumed.bert.encoder.layer[0].output.dense.weight, fresh_layer)
    (line,) = plan_lines(cfg)
    assert "every other teacher layer; loss 4 x soft targets at temperature 3 + 2 x MLM + 0.5 x" in line


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model": {"num_layers": 3}}, "model.num_layers: the student's 3 layers are more than its teacher's 2"),
        ({"model": {"hidden_size": 128}}, "model.hidden_size: 128 differs from the teacher's 64"),
        ({"distill": {"teacher": ""}}, "distill.teacher: model.objective distill learns from a teacher"),
        ({"distill": {"student_layers": [1, 0]}}, "distill.student_layers: 2 teacher layers named for"),
        ({"distill": {"temperature": 0.0}}, "distill.temperature: must be positive"),
        ({"model": {"objective": "mlm"}}, "distill.teacher: applies only to model.objective distill"),
    ],
    ids=["deeper-student", "wider-student", "no-teacher", "layers", "temperature", "distill-without-objective"],
)
def test_a_teacher_that_cannot_teach_the_student_is_refused_naming_the_field(teacher_dir, tiny_vocab, change, message):
    cfg = student_config(teacher_dir, tiny_vocab, **{"num_layers": 1, **change.get("model", {})})
    cfg.distill = dataclasses.replace(cfg.distill, **change.get("distill", {}))
    with pytest.raises(ConfigError, match=message):
        validate(cfg, world_size=1)


def test_a_teacher_of_another_vocabulary_or_family_or_a_run_directory_is_refused(teacher_dir, tmp_path, tiny_vocab):
    other = tmp_path / "other.txt"
    words = [line for line in open(tiny_vocab).read().splitlines()]
    other.write_text("\n".join(words[:5] + list(reversed(words[5:]))))
    cfg = student_config(teacher_dir, str(other), num_layers=1)
    with pytest.raises(ConfigError, match="distill.teacher: .* is not the vocabulary the weights were trained with"):
        validate(cfg, world_size=1)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    cfg = student_config(str(run), tiny_vocab, num_layers=1)
    with pytest.raises(ConfigError, match=r"distill.teacher: .*run is a bertdist run; export it \(bertdist export"):
        validate(cfg, world_size=1)
    modern = tmp_path / "modern"
    modern.mkdir()
    (modern / "config.json").write_text('{"model_type": "modernbert"}')
    cfg = student_config(str(modern), tiny_vocab, num_layers=1)
    with pytest.raises(ConfigError, match="holds a 'modernbert' model .* learns from a BERT"):
        validate(cfg, world_size=1)
