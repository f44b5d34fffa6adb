"""ONNX graphs of bertdist's models (bertdist.model.onnx): for a pretraining export of each architecture with an MLM
head and a fine-tuned model of every task (BERT, ModernBERT, ELECTRA, ALBERT, DistilBERT), onnxruntime computes
what PyTorch computes (1e-4) at two batch sizes and lengths (the axes are dynamic, padded rows and rows without
padding alike); the model card's program runs; an architecture bertdist does not export is refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from bertdist.cli import main
from bertdist.model.albert import hf as albert_hf
from bertdist.model.albert.model import AlbertForPreTraining
from bertdist.model.bert import hf
from bertdist.model.bert.model import BertForPreTraining
from bertdist.model.distilbert import hf as distilbert_hf
from bertdist.model.distilbert.model import DistilBertForMaskedLM
from bertdist.model.hf_heads import build_task_model, save_task_model
from bertdist.model.modernbert import hf as modernbert_hf
from bertdist.model.modernbert.model import ModernBertForMaskedLM
from bertdist.model.onnx import MODEL_CARD_FILE, ONNX_FILE, OnnxExportError, load, write_onnx
from bertdist.model.roberta import hf as roberta_hf
from bertdist.model.roberta.model import RobertaForMaskedLM
from bertdist.model.sentence import SentenceEmbedder, save_sentence_transformer
from tests.conftest import tiny_model_config

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
TOLERANCE = 1e-4
SHAPES = ((3, 11), (1, 29))
"""(batch, sequence) of the two runs: rows padded by different amounts, then one row without padding."""
CHOICES = (3, 2)


def _bert():
    return tiny_model_config()


def _modernbert():  # a window shorter than the rows, so that local layers differ from global ones
    return tiny_model_config(arch="modernbert", objective="mlm", local_attention=16)


def _electra():  # embeddings narrower than the discriminator: its projection is in the graph
    return tiny_model_config(arch="electra", objective="rtd", embedding_size=32, generator_hidden_size=32)


def _albert():  # 32-wide embeddings projected to the tiny width, one layer applied at every depth
    return tiny_model_config(arch="albert", objective="mlm+sop", embedding_size=32, share_layers="all")


def _distilbert():  # no segments: its graph takes no token_type_ids
    return tiny_model_config(arch="distilbert", objective="mlm")


def _roberta():  # RoBERTa's padding index 1: its positions start at 2, which the graph must compute
    return tiny_model_config(arch="roberta", objective="mlm", type_vocab_size=1, pad_token_id=1)


TASK_FAMILIES = {
    "bert": (_bert, "Bert"),
    "modernbert": (_modernbert, "ModernBert"),
    "electra": (_electra, "Electra"),
    "albert": (_albert, "Albert"),
    "distilbert": (_distilbert, "DistilBert"),
    "roberta": (_roberta, "Roberta"),
}


def _write(directory, case: str, vocab: str | None = None):
    """A Hugging Face directory of `case` (its model freshly initialised); returns the model."""
    torch.manual_seed(0)
    if case == "bert-pretraining":
        model = BertForPreTraining(_bert())
        hf.write_directory(model, directory, vocab, {})
    elif case == "bert-mlm":
        model = BertForPreTraining(tiny_model_config(objective="mlm"))
        hf.write_directory(model, directory, vocab, {})
    elif case == "modernbert-pretraining":
        model = ModernBertForMaskedLM(_modernbert())
        modernbert_hf.write_directory(model, directory, vocab, {})
    elif case == "albert-pretraining":
        model = AlbertForPreTraining(_albert())
        albert_hf.write_directory(model, directory, vocab, {})
    elif case == "distilbert-pretraining":
        model = DistilBertForMaskedLM(_distilbert())
        distilbert_hf.write_directory(model, directory, vocab, {})
    elif case == "roberta-pretraining":
        model = RobertaForMaskedLM(_roberta())
        roberta_hf.write_directory(model, directory, vocab, {})
    elif case.endswith("embedding"):  # finetune.task=embedding's export: a sentence-transformers directory
        cfg = {"bert": _bert, "modernbert": _modernbert, "roberta": _roberta}[case.split("-")[0]]()
        model = SentenceEmbedder(cfg, "cls" if case.startswith("modernbert") else "mean")
        save_sentence_transformer(model, directory, vocab, 128)
    else:
        arch, head = case.split("-")
        config, prefix = TASK_FAMILIES[arch]
        cfg = config()
        labels = (
            ["negative", "neutral", "positive"] if head in ("SequenceClassification", "TokenClassification") else ["x"]
        )
        model = build_task_model(f"{prefix}For{head}", cfg, labels)
        save_task_model(model, directory, labels, vocab)
    return model.eval()


CASES = [
    "bert-pretraining",
    "bert-mlm",
    "modernbert-pretraining",
    "albert-pretraining",
    "distilbert-pretraining",
    "roberta-pretraining",
    *(
        f"{arch}-{head}"
        for arch in TASK_FAMILIES
        for head in ("SequenceClassification", "TokenClassification", "QuestionAnswering", "MultipleChoice")
    ),
    "bert-embedding",
    "modernbert-embedding",
    "roberta-embedding",  # its export's class name crashed (RobertaModel has no For: after an epoch of training)
]


def _inputs(shape: tuple[int, ...], names: tuple[str, ...], seed: int) -> dict[str, torch.Tensor]:
    """Random ids, every row but the first cut short by up to a third of its length (none when there is one row)."""
    g = torch.Generator().manual_seed(seed)
    length, rows = shape[-1], int(np.prod(shape[:-1]))
    lengths = torch.randint(length - length // 3, length + 1, (rows,), generator=g)
    lengths[0] = length
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long().reshape(shape)
    tensors = {
        "input_ids": torch.randint(4, 1000, shape, generator=g) * mask,
        "attention_mask": mask,
        "token_type_ids": (torch.arange(length) >= length // 2).long().expand(shape) * mask,
    }
    return {name: tensors[name] for name in names}


def _pytorch(model, case: str, inputs: dict[str, torch.Tensor]) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(**inputs)
    logits = out.mlm_logits if "pretraining" in case or case == "bert-mlm" else out.logits
    if case.endswith("QuestionAnswering"):
        return [logits[..., 0].numpy(), logits[..., 1].numpy()]
    return [logits.numpy()]


@pytest.mark.parametrize("case", CASES)
def test_onnxruntime_computes_what_pytorch_computes_at_any_batch_size_and_length(tmp_path, case):
    model = _write(tmp_path, case)
    write_onnx(tmp_path)
    session = ort.InferenceSession(str(tmp_path / ONNX_FILE))
    names = tuple(i.name for i in session.get_inputs())
    segments = {"token_type_ids"} if case.startswith(("bert", "electra", "albert")) else set()
    assert set(names) == {"input_ids", "attention_mask"} | segments
    for seed, shape in enumerate(SHAPES):
        shape = (shape[0], CHOICES[seed], shape[1]) if case.endswith("MultipleChoice") else shape
        inputs = _inputs(shape, names, seed)
        got = session.run(None, {name: t.numpy() for name, t in inputs.items()})
        want = _pytorch(model, case, inputs)
        real = inputs["attention_mask"].bool().numpy()  # per-token outputs mean nothing at padding
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            if g.shape[:2] == real.shape:
                g, w = g[real], w[real]
            np.testing.assert_allclose(g, w, rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.usefixtures("hf_offline")
@pytest.mark.parametrize(
    "case", ["modernbert-pretraining", "bert-SequenceClassification", "bert-MultipleChoice", "bert-embedding"]
)
def test_the_model_card_says_how_to_run_model_onnx_and_its_program_runs(tmp_path, tiny_vocab, case):
    pytest.importorskip("transformers")
    _write(tmp_path, case, tiny_vocab)
    write_onnx(tmp_path)
    card = (tmp_path / MODEL_CARD_FILE).read_text()
    assert ONNX_FILE in card and "onnxruntime.InferenceSession" in card and "| `input_ids` | int64 |" in card
    program = card.split("```python\n", 1)[1].split("```", 1)[0]
    ran = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True, env=os.environ)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip()
    if case == "bert-SequenceClassification":
        assert '"negative"' in card and set(eval(ran.stdout)) <= {"negative", "neutral", "positive"}


def test_a_model_bertdist_does_not_export_is_refused_in_one_line(tmp_path, capsys):
    hf.write_directory(BertForPreTraining(_bert()), tmp_path / "bare", None, {"architectures": ["BertModel"]})
    with pytest.raises(OnnxExportError, match="ONNX export takes BertForPreTraining, .*; this is BertModel"):
        load(tmp_path / "bare")
    assert main(["export", str(tmp_path / "bare"), "--output", str(tmp_path / "out"), "--format", "onnx"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "ONNX export takes" in err, err
    assert not (tmp_path / "out").exists()  # nothing half-written is left


def test_export_of_a_hugging_face_directory_writes_it_with_model_onnx(tmp_path, capsys):
    _write(tmp_path / "classifier", "modernbert-SequenceClassification")
    assert main(["export", str(tmp_path / "classifier"), "--output", str(tmp_path / "out"), "--format", "onnx"]) == 0
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == sorted([*(p.name for p in (tmp_path / "classifier").iterdir()), ONNX_FILE, MODEL_CARD_FILE])
    assert main(["export", str(tmp_path / "classifier"), "--output", str(tmp_path / "hf")]) == 0  # the format as it is
    assert not (tmp_path / "hf" / ONNX_FILE).exists()
    assert main(["export", str(tmp_path / "classifier"), "--output", str(tmp_path / "x"), "--vocab", "v.txt"]) == 2
    assert "--vocab" in capsys.readouterr().err


def test_export_of_a_fine_tuning_output_dir_writes_its_model_and_a_pretraining_run_its_mlm_head(
    tmp_path, capsys, tiny_vocab
):
    """`bertdist export` of a fine-tuning's output_dir (or a checkpoint in it) exports the model it kept,
    output_dir/model, not the pretraining model its config's model.* would describe; without that model it says so
    in one line."""
    from tests.test_bad_input import _fake_run

    run = _fake_run(tmp_path)  # a pretraining run's checkpoint (ZeRO stage 0)
    assert main(["export", str(run), "--output", str(tmp_path / "mlm"), "--vocab", tiny_vocab, "--format", "onnx"]) == 0
    assert load(tmp_path / "mlm")[1].architecture == "BertForPreTraining" and (tmp_path / "mlm" / ONNX_FILE).is_file()

    classifier = _write(run / "model", "bert-SequenceClassification")  # as `bertdist finetune` leaves its output_dir
    checkpoint_dir = run / "checkpoints" / "step_00000004"
    for given in (run, checkpoint_dir):
        out = tmp_path / f"onnx-{given.name}"
        assert main(["export", str(given), "--output", str(out), "--format", "onnx"]) == 0
        inputs = _inputs((2, 9), ("input_ids", "token_type_ids", "attention_mask"), 0)
        (got,) = ort.InferenceSession(str(out / ONNX_FILE)).run(None, {k: v.numpy() for k, v in inputs.items()})
        np.testing.assert_allclose(
            got, _pytorch(classifier, "bert-SequenceClassification", inputs)[0], rtol=TOLERANCE, atol=TOLERANCE
        )

    (run / "model" / "config.json").unlink()  # a fine-tuning's weights, and no model: refused, not a traceback
    weights = checkpoint_dir / "mp_rank_00_model_states.pt"
    torch.save({"module": classifier.state_dict()}, weights)
    from bertdist.train import checkpoint
    from bertdist.train.integrity import describe_own_files

    state = checkpoint.read_train_state(checkpoint_dir)
    state.files = describe_own_files(checkpoint_dir, rank=0, exclude={checkpoint.TRAIN_STATE_FILENAME})
    (checkpoint_dir / checkpoint.TRAIN_STATE_FILENAME).write_text(checkpoint.state_json(state))
    capsys.readouterr()
    assert main(["export", str(run), "--output", str(tmp_path / "refused"), "--vocab", tiny_vocab]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not those of the pretraining model" in err, err
